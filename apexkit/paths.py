"""Where apexkit's files and outputs are: one home for each of these facts.

apexkit runs from a checkout (the repository: matrix.toml, patches/, docker/, bench/, noxfile.py beside apexkit/) or
installed (`pip install .`: the same files packaged as apexkit/_data). ROOT is whichever holds them. Outputs default
to the checkout's dist/ and build/ -- or, installed, to the current directory's -- unless the environment says
otherwise.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent
_CHECKOUT = PACKAGE.parent
INSTALLED = not ((_CHECKOUT / "matrix.toml").is_file() and (_CHECKOUT / "noxfile.py").is_file())
ROOT = PACKAGE / "_data" if INSTALLED else _CHECKOUT

MATRIX = ROOT / "matrix.toml"
REQUIREMENTS = ROOT / "requirements.txt"
PATCHES = ROOT / "patches"
DOCKER = ROOT / "docker"
BENCH = ROOT / "bench"
NOXFILE = ROOT / "noxfile.py"


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
