from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DATA = Path(__file__).resolve().parent / "data"  # tests/data, for tests/unit and tests/e2e alike
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(ROOT))

import fixture_repos  # noqa: E402

from apexkit.errors import ApexkitError  # noqa: E402
from apexkit.wheel import sources  # noqa: E402


def pytest_configure(config) -> None:
    try:
        cache = sources.cache_dir(os.environ)
    except ApexkitError as exc:  # APEXKIT_CACHE_DIR naming a file: one line, not a traceback
        raise pytest.UsageError(exc.format()) from None
    # Tests that run `python -m virtualenv` themselves seed like apexkit does: never a periodic update in the
    # background (it once filed a pip for the host's Python under 3.8), app data apart from the user's.
    os.environ.setdefault("VIRTUALENV_NO_PERIODIC_UPDATE", "1")
    os.environ.setdefault("VIRTUALENV_APP_DATA", str(cache / "virtualenv"))


@pytest.fixture(scope="session")
def repos(tmp_path_factory) -> fixture_repos.FixtureRepos:
    """Generated Ascend apex + NVIDIA apex look-alikes, served as file:// URLs."""
    return fixture_repos.make(tmp_path_factory.mktemp("repos"))


@pytest.fixture(scope="session")
def shared_cache(tmp_path_factory) -> Path:
    """One apexkit cache for the session: the build venv (torch installed once) is reused by the build tests."""
    return tmp_path_factory.mktemp("apexkit-cache")


class Runner:
    def __init__(self, repos, cache: Path, tmp: Path) -> None:
        self.repos = repos
        self.cache = cache
        self.dist = tmp / "dist"
        self.build = tmp / "build"
        self.marker = tmp / "build-sh-ran"

    def env(self, **extra: str) -> dict[str, str]:
        env = dict(os.environ)
        env.update(self.repos.env(self.cache))
        env["APEXKIT_FIXTURE_MARKER"] = str(self.marker)
        env["APEXKIT_FETCH_BACKOFF"] = "0.05"
        env.update(extra)
        return env

    def _dirs(self) -> list[str]:
        return ["--dist", str(self.dist), "--build-dir", str(self.build)]

    def nox_argv(self, python: str, *args: str) -> list[str]:
        """`nox -s build-<python> -- --dist .. --build-dir .. ARGS` as a user runs it (python: 3.11, cuda-3.11)."""
        session = ["-s", f"build-{python}", "--"]
        return [
            sys.executable,
            "-m",
            "nox",
            "-f",
            str(ROOT / "noxfile.py"),
            *session,
            *self._dirs(),
            *args,
        ]

    def nox(self, python: str, *args: str, **env: str) -> subprocess.CompletedProcess:
        argv = self.nox_argv(python, *args)
        return subprocess.run(
            argv, cwd=ROOT, env=self.env(**env), capture_output=True, text=True, timeout=900
        )

    def cli(self, python: str, *args: str, **env: str) -> subprocess.CompletedProcess:
        argv = [sys.executable, "-m", "apexkit", "build", python, *self._dirs(), *args]
        return subprocess.run(
            argv, cwd=ROOT, env=self.env(**env), capture_output=True, text=True, timeout=900
        )


@pytest.fixture
def fsroot(tmp_path) -> Path:
    """A --root test directory standing for /, with the home of the user alice (the proxy writers' tests)."""
    root = tmp_path / "root"
    (root / "home/alice").mkdir(parents=True)
    return root


@pytest.fixture
def runner(repos, shared_cache, tmp_path) -> Runner:
    return Runner(repos, shared_cache, tmp_path)


def nox_session(
    session: str, *posargs: str, env: dict[str, str] | None = None, timeout: int = 120
) -> subprocess.CompletedProcess:
    """`nox -f noxfile.py -s SESSION [-- POSARGS]` from the checkout, as a user runs it."""
    argv = [sys.executable, "-m", "nox", "-f", str(ROOT / "noxfile.py"), "-s", session]
    argv += ["--", *posargs] if posargs else []
    return subprocess.run(
        argv, capture_output=True, text=True, timeout=timeout, cwd=str(ROOT), env=env
    )


def output(proc: subprocess.CompletedProcess) -> str:
    return proc.stdout + proc.stderr


@pytest.fixture(scope="session")
def tinyproxy(tmp_path_factory):
    """A real tinyproxy on 127.0.0.1 (Basic auth), its log readable by the tests."""
    import shutil

    import services

    from tools import testtools

    services.require(shutil.which("tinyproxy") is not None, testtools.skip_reason("tinyproxy"))
    server = services.TinyProxy(tmp_path_factory.mktemp("tinyproxy"))
    yield server
    server.stop()
