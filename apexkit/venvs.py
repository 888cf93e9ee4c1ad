"""Virtual environments (virtualenv: always the lib/pythonX.Y/site-packages layout, whatever the base Python's
distro does with lib64/) and pip installs into them, with index options from one place."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from apexkit import known_failures, log
from apexkit.errors import EnvironmentSetupError
from apexkit.proc import run_logged


@dataclass(frozen=True)
class IndexOptions:
    index_url: str | None = None
    extra_index_urls: tuple[str, ...] = ()
    torch_index_url: str | None = None
    wheelhouses: tuple[Path, ...] = ()
    offline: bool = False

    def pip_args(self, for_torch: bool = False) -> list[str]:
        args: list[str] = []
        if self.offline:
            args.append("--no-index")
        else:
            primary = self.torch_index_url if (for_torch and self.torch_index_url) else self.index_url
            if primary:
                args += ["--index-url", primary]
            extras = list(self.extra_index_urls)
            if for_torch and self.torch_index_url and self.index_url:
                extras.insert(0, self.index_url)
            for url in extras:
                args += ["--extra-index-url", url]
        for w in self.wheelhouses:
            args += ["--find-links", str(w)]
        return args

    def key(self) -> dict:
        return {"index": self.index_url, "extra": list(self.extra_index_urls), "torch_index": self.torch_index_url,
                "wheelhouses": [str(w) for w in self.wheelhouses], "offline": self.offline}


@dataclass(frozen=True)
class Venv:
    path: Path

    @property
    def python(self) -> Path:
        return self.path / "bin" / "python"

    def run_json(self, code: str, env: dict | None = None, cwd: Path | None = None) -> dict:
        proc = subprocess.run([str(self.python), "-c", code], capture_output=True, text=True, env=env, cwd=cwd)
        if proc.returncode != 0:
            raise EnvironmentSetupError(f"{self.python} failed: {_last(proc.stderr)}", "see the message above")
        return json.loads(proc.stdout.strip().splitlines()[-1])


def _last(text: str) -> str:
    lines = [x for x in text.strip().splitlines() if x.strip()]
    return lines[-1] if lines else "(no output)"


def create(interpreter: str, path: Path, log_path: Path, system_site_packages: bool = False) -> Venv:
    if path.exists():
        shutil.rmtree(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # virtualenv runs on the host Python (pinned in requirements.txt); -p picks the target interpreter.
    argv = [sys.executable, "-m", "virtualenv", "--quiet", "--no-periodic-update", "-p", interpreter, str(path)]
    if system_site_packages:
        argv.append("--system-site-packages")
    code, tail = run_logged(argv, log_path)
    if code != 0:
        raise EnvironmentSetupError(
            f"could not create a venv with {interpreter}: {tail[-1] if tail else 'virtualenv failed'}",
            f"see {log_path}; pip install -r requirements.txt gives the virtualenv apexkit needs",
        )
    return Venv(path)


def pip_install(venv: Venv, requirements: Sequence[str], index: IndexOptions, log_path: Path, *,
                for_torch: bool = False, extra: Sequence[str] = (), verbose: bool = False) -> None:
    if not requirements:
        return
    argv = [str(venv.python), "-m", "pip", "install", "--no-compile", "--disable-pip-version-check",
            "--progress-bar", "off", *index.pip_args(for_torch=for_torch), *extra, *requirements]
    code, tail = run_logged(argv, log_path, verbose=verbose, progress=_pip_progress)
    if code != 0:
        reason = next((line for line in reversed(tail) if line.startswith("ERROR")), tail[-1] if tail else "")
        hint = (known_failures.announce("\n".join(tail))
                or "check --torch / --index-url / --wheelhouse (or the proxy: invoke proxy.check)")
        raise EnvironmentSetupError(f"pip could not install {' '.join(requirements)}: {log.mask(reason)}",
                                    f"see {log_path}; {hint}")


def _pip_progress(line: str) -> str | None:
    for word in ("Collecting", "Downloading", "Installing collected", "Processing"):
        if line.startswith(word) or line.lstrip().startswith(word):
            return line.strip()[:90]
    return None


def freeze(venv: Venv) -> dict[str, str]:
    proc = subprocess.run([str(venv.python), "-m", "pip", "list", "--format=json", "--disable-pip-version-check"],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        return {}
    return {row["name"].lower(): row["version"] for row in json.loads(proc.stdout)}
