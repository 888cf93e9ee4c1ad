"""Where apexkit's files and outputs are: one home for each of these facts.

apexkit runs from a checkout (the repository: matrix.toml, patches/, docker/, bench/, noxfile.py beside apexkit/) or
installed (`pip install .`: the same files packaged as apexkit/_data). ROOT is whichever holds them. Outputs default
to the checkout's dist/ and build/ -- or, installed, to the current directory's, where users look for the wheel --
and the cache to ~/.cache/apexkit, unless the environment says otherwise. Whoever writes into or reads back from an
output directory holds it to the cache's rule first (cachetrust.trusted_output): refused in one line, never used.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from apexkit.errors import ConfigError

PACKAGE = Path(__file__).resolve().parent
_CHECKOUT = PACKAGE.parent
INSTALLED = not ((_CHECKOUT / "matrix.toml").is_file() and (_CHECKOUT / "noxfile.py").is_file())
ROOT = PACKAGE / "_data" if INSTALLED else _CHECKOUT

MATRIX = ROOT / "matrix.toml"
RUNTIME_LOCK = (
    ROOT / "requirements" / "runtime.txt"
)  # the hashed lock of requirements/runtime.in (tools.pins)
DEV_LOCK = (
    ROOT / "requirements" / "dev.txt"
)  # the hashed lock of requirements/dev.in: runtime + tests + lint
RUNTIME_PINS = ROOT / "requirements" / "runtime.in"  # the direct runtime pins, per Python range
PATCHES = ROOT / "patches"
DOCKER = ROOT / "docker"
BENCH = ROOT / "bench"
PROBES = (
    BENCH / "probes"
)  # the programs apexkit runs in target interpreters (python PROBES/<name>.py)
NOXFILE = ROOT / "noxfile.py"


# what points each output directory elsewhere, for cachetrust.trusted_output's refusal
DIST_SETTING, BUILD_SETTING = "APEXKIT_DIST_DIR (or --dist)", "APEXKIT_BUILD_DIR (or --build-dir)"
REPORTS_SETTING = "APEXKIT_REPORTS_DIR"


def _outputs_base() -> Path:
    return Path.cwd() if INSTALLED else ROOT


def dist_dir(environ: Mapping[str, str] | None = None) -> Path:
    """$APEXKIT_DIST_DIR, else dist/ of the checkout (installed: of the current directory)."""
    environ = os.environ if environ is None else environ
    return Path(environ.get("APEXKIT_DIST_DIR") or _outputs_base() / "dist")


def build_dir(environ: Mapping[str, str] | None = None) -> Path:
    """$APEXKIT_BUILD_DIR, else build/ of the checkout (installed: of the current directory)."""
    environ = os.environ if environ is None else environ
    return Path(environ.get("APEXKIT_BUILD_DIR") or _outputs_base() / "build")


def reports_dir(environ: Mapping[str, str] | None = None) -> Path:
    """$APEXKIT_REPORTS_DIR, else reports/ of the checkout (installed: of the current directory)."""
    environ = os.environ if environ is None else environ
    return Path(environ.get("APEXKIT_REPORTS_DIR") or _outputs_base() / "reports")


def cache_dir(env: Mapping[str, str] | None = None) -> Path:
    """APEXKIT_CACHE_DIR, else $XDG_CACHE_HOME/apexkit, else ~/.cache/apexkit. A path that is (or lies under) a
    file is a ConfigError naming the variable, not a traceback at the first mkdir."""
    env = os.environ if env is None else env
    if env.get("APEXKIT_CACHE_DIR"):
        path, source = Path(env["APEXKIT_CACHE_DIR"]).expanduser(), "APEXKIT_CACHE_DIR"
    else:
        base = env.get("XDG_CACHE_HOME") or os.path.join(
            env.get("HOME") or os.path.expanduser("~"), ".cache"
        )
        path, source = (
            Path(base) / "apexkit",
            ("XDG_CACHE_HOME" if env.get("XDG_CACHE_HOME") else "HOME"),
        )
    for existing in (path, *path.parents):
        if existing.exists() or existing.is_symlink():
            if not existing.is_dir():
                where = "is" if existing == path else f"lies under {existing}, which is"
                raise ConfigError(
                    f"the apexkit cache {path} ({source}) {where} not a directory",
                    "point APEXKIT_CACHE_DIR at a directory (or unset it: ~/.cache/apexkit)",
                )
            break
    return path


OUTPUTS = (
    ".git",
    ".venv",
    ".nox",
    "build",
    "dist",
    "reports",
    "index",
    ".pytest_cache",
    ".ruff_cache",
)


def copy_ignore(top: Path, names: tuple[str, ...] = OUTPUTS):
    """A shutil.copytree `ignore` for a copy of the checkout `top`: its outputs and tool folders at the top level
    only, and __pycache__ everywhere."""
    top = Path(top).resolve()

    def ignore(folder: str, entries: list[str]) -> set[str]:
        at_top = Path(folder).resolve() == top
        return {e for e in entries if e == "__pycache__" or (at_top and e in names)}

    return ignore
