"""Where the CANN toolkit is: one answer for the build (torch_npu pairing, NPU headers, binary checks), doctor and the
fleet's node script. CANN <= 8.3 installs under /usr/local/Ascend/ascend-toolkit/latest, 8.5+ under
/usr/local/Ascend/cann; its set_env.sh exports ASCEND_HOME_PATH / ASCEND_TOOLKIT_HOME, which win when set.

The scripts that run in the target venv (bench/) cannot import apexkit: bench/targetenv.py names the same locations
and the same auto-load variable for them (tests/unit/test_cann.py keeps the two equal)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

VARIABLES = ("ASCEND_HOME_PATH", "ASCEND_TOOLKIT_HOME")
HOMES = ("/usr/local/Ascend/ascend-toolkit/latest", "/usr/local/Ascend/cann")
SET_ENV_FILES = ("/usr/local/Ascend/ascend-toolkit/set_env.sh", "/usr/local/Ascend/cann/set_env.sh")
# torch >= 2.5 imports torch_npu at `import torch`, which needs the CANN runtime; "0" stops it (a build needs no CANN)
NO_AUTOLOAD = "TORCH_DEVICE_BACKEND_AUTOLOAD"


def home(environ: Mapping[str, str]) -> str | None:
    """The toolkit's directory: a sourced set_env.sh's variable, else the first default install that exists."""
    for key in VARIABLES:
        if environ.get(key) and Path(environ[key]).is_dir():
            return environ[key]
    return next((d for d in HOMES if Path(d).is_dir()), None)


def set_env_for(home: str) -> str:
    """The set_env.sh that belongs to a toolkit directory: <= 8.3 beside latest/, 8.5+ inside cann/."""
    path = Path(home)
    return str((path.parent if path.name == "latest" else path) / "set_env.sh")
