"""Find a working python3.X. A candidate is trusted only after it has run and reported its own version:
pyenv shims and broken alternatives exist on PATH but fail when called ("pyenv: python3.8: command not found").
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from apexkit import paths
from apexkit.errors import InterpreterNotFoundError

_PROBE = (
    paths.PROBES / "interpreter.py"
)  # plain Python 3: it runs in every candidate, the oldest included


@dataclass(frozen=True)
class Interpreter:
    path: str  # what we call (as given or found)
    version: str  # "3.11"
    full_version: str  # "3.11.7"
    implementation: str
    machine: str  # platform.machine(): x86_64, aarch64
    prefix: str
    purelib: str
    platlib: str


def probe(path: str, timeout: float = 30.0) -> tuple[Interpreter | None, str]:
    """Run `path` and ask it who it is. Returns (interpreter, "") or (None, why it is not usable)."""
    try:
        proc = subprocess.run(
            [path, str(_PROBE)], capture_output=True, text=True, timeout=timeout, env=_clean_env()
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"{path}: {exc.__class__.__name__}: {exc}"
    if proc.returncode != 0:
        first = (proc.stderr or proc.stdout).strip().splitlines()
        return None, f"{path}: {first[0] if first else f'exit {proc.returncode}'}"
    try:
        data = json.loads(proc.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return None, f"{path}: unexpected output"
    return Interpreter(
        path=path,
        version=data["version"],
        full_version=data["full"],
        implementation=data["implementation"],
        machine=data["machine"],
        prefix=data["prefix"],
        purelib=data["purelib"],
        platlib=data["platlib"],
    ), ""


def _clean_env() -> dict[str, str]:
    env = dict(os.environ)
    # A pyenv shim obeys PYENV_VERSION; never let it redirect the probe to another version.
    env.pop("PYENV_VERSION", None)
    return env


def pyenv_root(env: Mapping[str, str]) -> Path | None:
    if env.get("PYENV_ROOT"):
        return Path(env["PYENV_ROOT"])
    exe = shutil.which("pyenv", path=env.get("PATH"))
    if exe:
        try:
            out = subprocess.run([exe, "root"], capture_output=True, text=True, timeout=10)
            if out.returncode == 0 and out.stdout.strip():
                return Path(out.stdout.strip())
        except (OSError, subprocess.TimeoutExpired):
            pass
    home = env.get("HOME")
    if home and (Path(home) / ".pyenv").is_dir():
        return Path(home) / ".pyenv"
    return None


def candidates(version: str, env: Mapping[str, str]) -> list[str]:
    """Every place a python{version} may live, in order of preference, without duplicates."""
    name = f"python{version}"
    found = [os.path.join(d, name) for d in env.get("PATH", "").split(os.pathsep) if d]
    root = pyenv_root(env)
    if root:
        found += sorted(
            glob.glob(str(root / "versions" / f"{version}.*" / "bin" / name)), reverse=True
        )
    nodot = version.replace(".", "")
    # manylinux images (the official Ascend builder is one), distro and conda locations.
    found += sorted(glob.glob(f"/opt/python/cp{nodot}-cp{nodot}*/bin/{name}"))
    found += sorted(glob.glob(f"/opt/_internal/cpython-{version}.*/bin/{name}"), reverse=True)
    found += [f"/usr/local/bin/{name}", f"/usr/bin/{name}"]
    found += sorted(
        glob.glob(os.path.join(env.get("HOME", "/nonexistent"), f"*conda*/envs/*/bin/{name}"))
    )
    return list(dict.fromkeys(p for p in found if os.path.isfile(p) and os.access(p, os.X_OK)))


def find(
    version: str, env: Mapping[str, str] | None = None, explicit: str | None = None
) -> Interpreter:
    """The first candidate that runs and reports `version`; `explicit` (--interpreter PATH) is checked, not searched."""
    env = os.environ if env is None else env
    tried: list[str] = []
    paths: Iterable[str] = [explicit] if explicit else candidates(version, env)
    for path in paths:
        interp, why = probe(path)
        if interp is None:
            tried.append(why)
            continue
        if interp.version != version:
            tried.append(f"{path}: is Python {interp.full_version}")
            continue
        if interp.implementation != "cpython":
            tried.append(f"{path}: is {interp.implementation}, not CPython")
            continue
        return interp
    detail = "; ".join(tried[:4]) + (f"; and {len(tried) - 4} more" if len(tried) > 4 else "")
    if explicit:
        raise InterpreterNotFoundError(
            f"--interpreter {explicit} is not a working Python {version} ({detail or 'not found'})",
            f"pass the path of a python{version} executable",
        )
    raise InterpreterNotFoundError(
        f"no working python{version} found"
        + (f" (tried {detail})" if detail else " on PATH, pyenv or /opt/python"),
        f"install it (pyenv install {version}, or your distro's python{version} package) "
        f"or pass --interpreter /path/to/python{version}",
    )
