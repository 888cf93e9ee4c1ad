"""The product as users install it: apexkit's own sdist and wheel, built from a copy of the checkout the way pip and
uv build them, installed into fresh venvs of every Python 3.8-3.13 found here, and run from a foreign directory with
a fresh HOME and no checkout on any path. A module, data file or entry point the package forgets fails here (once it
was apexkit/install: `apexkit install` stopped with ModuleNotFoundError, exit 70, outside the checkout).

The wheel is installed on every Python (pip of that venv, the runtime lock first: what README command 1 installs);
the sdist is installed on the Python running the tests (pip builds it again: what `pip install apexkit-*.tar.gz`
does). Each install imports every module, runs build/install/up --dry-run, matrix and config.show, and the shipped
noxfile and tasks.py listing their sessions and tasks; the wheel on the tests' own Python runs every command's --help."""

from __future__ import annotations

import base64
import hashlib
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from conftest import ROOT

from apexkit import cli, paths
from apexkit.errors import InterpreterNotFoundError
from apexkit.wheel import interpreters, uvtools

PYTHONS = ("3.8", "3.9", "3.10", "3.11", "3.12", "3.13")
HERE = f"{sys.version_info[0]}.{sys.version_info[1]}"
INTERNAL_ERROR = 70  # exits.py: "this is an apexkit bug"


def _interpreter(python: str) -> str | None:
    """python3.X as a build finds it (PATH, pyenv, /opt/python)."""
    try:
        return interpreters.find(python).path
    except InterpreterNotFoundError:
        return None


def _shipped_modules() -> set[str]:
    """Every file the wheel must hold under apexkit/: each module and data file of the package (tests, caches and
    outputs aside), and the checkout's data apexkit/_data stands for."""
    package = ROOT / "apexkit"
    wanted = {
        str(p.relative_to(ROOT))
        for p in package.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"
    }
    data = [
        "matrix.toml",
        "noxfile.py",
        "tasks.py",
        "requirements/runtime.txt",
        "docker/Dockerfile",
    ]
    data += [
        str(p.relative_to(ROOT))
        for p in (ROOT / "bench").rglob("*.py")
        if "__pycache__" not in p.parts
    ]
    data += [str(p.relative_to(ROOT)) for p in (ROOT / "patches").rglob("*.toml")]
    return wanted | {f"apexkit/_data/{d}" for d in data}


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> dict[str, Path]:
    """apexkit's sdist, and its wheel built FROM that sdist (uv build), from a copy of the checkout."""
    uv = uvtools.find()
    if uv is None:
        pytest.skip("uv is not installed (pip install -r requirements/dev.txt brings it)")
    tmp = tmp_path_factory.mktemp("product")
    src, out = tmp / "src", tmp / "out"
    shutil.copytree(ROOT, src, ignore=paths.copy_ignore(ROOT))
    proc = subprocess.run(
        [uv.binary, "build", "-q", "--out-dir", str(out), str(src)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    (wheel,) = out.glob("apexkit-*.whl")
    (sdist,) = out.glob("apexkit-*.tar.gz")
    return {"wheel": wheel, "sdist": sdist}


def test_the_wheel_holds_every_module_and_data_file(built):
    names = set(zipfile.ZipFile(built["wheel"]).namelist())
    missing = sorted(_shipped_modules() - names)
    assert not missing, f"apexkit's wheel lacks {missing[:20]}"
    entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    assert (
        "apexkit = apexkit.cli:main" in zipfile.ZipFile(built["wheel"]).read(entry_points).decode()
    )
    assert not [n for n in names if n.startswith(("tests/", "tools/", "apexkit/_data/tests/"))]


def _stub_torch(tmp: Path) -> Path:
    """A tiny stand-in torch 2.13.0+cpu wheel: what the training venv probe reads (its version, torch/version.py's
    cuda, torch._C's C++ ABI), so that install and up get past "no torch" without 200 MB of the real one."""
    dist_info = "torch-2.13.0+cpu.dist-info"
    files = {
        "torch/__init__.py": "__version__ = '2.13.0+cpu'\nclass _C:\n    _GLIBCXX_USE_CXX11_ABI = True\n",
        "torch/version.py": "__version__ = '2.13.0+cpu'\ncuda = None\n",
        f"{dist_info}/METADATA": "Metadata-Version: 2.1\nName: torch\nVersion: 2.13.0+cpu\n",
        f"{dist_info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = "".join(
        f"{p},sha256={base64.urlsafe_b64encode(hashlib.sha256(t.encode()).digest()).rstrip(b'=').decode()},"
        f"{len(t.encode())}\n"
        for p, t in files.items()
    )
    path = tmp / "torch-2.13.0+cpu-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        for p, t in files.items():
            zf.writestr(p, t)
        zf.writestr(f"{dist_info}/RECORD", record + f"{dist_info}/RECORD,,\n")
    return path


class Installed:
    """A fresh venv of `python` holding the runtime lock and apexkit from `artifact`, run from a foreign directory."""

    def __init__(self, python: str, artifact: Path, tmp: Path) -> None:
        interpreter = _interpreter(python)
        if interpreter is None:
            pytest.skip(f"no Python {python} on this machine")
        self.venv, self.cwd, self.tmp = tmp / "venv", tmp / "elsewhere", tmp
        self.cwd.mkdir()
        (tmp / "home").mkdir()
        self.env = {
            k: v
            for k, v in os.environ.items()
            if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV") and not k.startswith("APEXKIT_")
        }
        self.env.pop("XDG_CONFIG_HOME", None)  # a fresh user: no config file but the fresh HOME's
        self.env.update(HOME=str(tmp / "home"), APEXKIT_CACHE_DIR=str(tmp / "cache"))
        made = subprocess.run(
            [interpreter, "-m", "venv", str(self.venv)], capture_output=True, text=True, timeout=300
        )
        if made.returncode != 0:
            pytest.skip(f"Python {python} has no working venv module: {made.stderr.strip()[-200:]}")
        self.pip("-r", str(ROOT / "requirements" / "runtime.txt"))  # README command 1's lock
        self.pip("--no-deps", str(artifact))  # README: pip install --no-deps .

    def pip(self, *args: str) -> None:
        proc = subprocess.run(
            [str(self.venv / "bin" / "python"), "-m", "pip", "install", "-q", *args],
            capture_output=True,
            text=True,
            cwd=self.cwd,
            timeout=600,
        )
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]

    def run(self, program: str, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [str(self.venv / "bin" / program), *args],
            cwd=self.cwd,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=300,
        )

    def ok(self, program: str, *args: str) -> str:
        """Run it; it must succeed, write no traceback and name no missing module. Returns stdout + stderr."""
        proc = self.run(program, *args)
        text = proc.stdout + proc.stderr
        assert "Traceback" not in text and "ModuleNotFoundError" not in text, (args, text[-3000:])
        assert proc.returncode == 0, (program, args, proc.returncode, text[-3000:])
        return text


IMPORT_ALL = (
    "import importlib, pkgutil, apexkit; "
    "[importlib.import_module(m.name) for m in pkgutil.walk_packages(apexkit.__path__, 'apexkit.') "
    "if not m.name.startswith(('apexkit._data', 'apexkit.__main__'))]; print('imported')"
)


def _every_help(product: Installed) -> None:
    """Each command's --help, and `apexkit --help` naming every command the checkout declares."""
    names = [
        name
        for name, _, _ in cli.entries()
        if name not in ("build-bench", "lock", "contracts", "completion")
    ]
    listing = product.ok("apexkit", "--help")
    for name in names:
        assert f"  {name}" in listing, f"apexkit --help lacks {name}"
        product.ok("apexkit", name, "--help")


def _exercise(product: Installed) -> None:
    """Every module imports on this Python; the front door's commands run from elsewhere."""
    assert "imported" in product.ok("python", "-c", IMPORT_ALL)
    assert product.ok("apexkit", "--version").startswith("apexkit ")
    plan = product.ok("apexkit", "build", "3.11", "--dry-run")
    assert f"dist            {product.cwd / 'dist'}" in plan  # outputs go to the current directory
    assert "dry run: nothing fetched, built or written" in plan
    assert '"id": "py3.11-torch2.13.0-x86_64"' in product.ok(
        "apexkit", "matrix", "--format", "json"
    )
    product.ok("apexkit", "config.show")
    doctor = product.run("apexkit", "doctor", "--json")  # rows, whatever this host lacks
    assert doctor.returncode in (0, 1) and doctor.stdout.lstrip().startswith("["), doctor.stderr[
        -2000:
    ]
    product.ok("apexkit", "proxy.show", "--json", "--root", str(product.cwd))

    train = product.tmp / "train"  # a training venv holding a torch, and an empty team index
    subprocess.run(
        [str(product.venv / "bin" / "python"), "-m", "venv", str(train)], check=True, timeout=300
    )
    done = subprocess.run(
        [str(train / "bin" / "python"), "-m", "pip", "install", "-q", "--no-deps", "--no-index",
         str(_stub_torch(product.tmp))],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    index = product.tmp / "index"
    index.mkdir()
    installs = product.run(
        "apexkit", "install", "--dry-run", "--venv", str(train), "--index", str(index)
    )
    text = installs.stdout + installs.stderr
    assert "Traceback" not in text and installs.returncode != INTERNAL_ERROR, text[-3000:]
    assert "torch 2.13.0+cpu" in text, text[
        -3000:
    ]  # it probed the venv: apexkit.install imported and ran
    up = product.ok("apexkit", "up", "--dry-run", "--venv", str(train), "--index", str(index))
    assert "nothing runs, nothing is written" in up and "install" in up
    assert not (product.cwd / "dist").exists() and not (product.cwd / "reports").exists()

    data = Path(
        product.ok("python", "-c", "import apexkit.paths as p; print(p.ROOT)")
        .strip()
        .splitlines()[-1]
    )
    assert data.name == "_data" and data.parent.parent.name == "site-packages"
    sessions = product.ok("nox", "-f", str(data / "noxfile.py"), "-l")
    for session in ("build-3.11", "matrix", "validate", "bench", "install"):
        assert f"* {session}" in sessions or f"- {session}" in sessions, sessions[-3000:]
    tasks = product.ok("invoke", "--search-root", str(data), "--list")
    for task in ("build", "proxy.setup", "doctor", "up", "config.show"):
        assert task in tasks, tasks[-3000:]


@pytest.mark.parametrize("python", PYTHONS)
def test_the_installed_wheel_runs_from_elsewhere(built, python, tmp_path):
    product = Installed(python, built["wheel"], tmp_path)
    _exercise(product)
    if python == HERE:
        _every_help(product)


def test_the_installed_sdist_runs_from_elsewhere(built, tmp_path):
    product = Installed(HERE, built["sdist"], tmp_path)
    _exercise(product)
