"""What the bench scripts know of the machine they run on, in one place: where CANN and the Ascend driver are, and the
variable that keeps torch from auto-loading torch_npu. Standard library only; never imports apexkit (the bench scripts
import it as a sibling: `python bench/<script>.py`, and the fleet ships bench/'s files together).

The host side's home for the CANN locations is apexkit/cann.py; tests/test_cann.py checks that both name the same.
CANN <= 8.3 installs under /usr/local/Ascend/ascend-toolkit/latest (set_env.sh beside latest/), 8.5+ under
/usr/local/Ascend/cann (set_env.sh inside); a sourced set_env.sh exports ASCEND_HOME_PATH / ASCEND_TOOLKIT_HOME.
"""

from __future__ import annotations

import os

# torch >= 2.5 imports every installed device backend at `import torch`; torch_npu then needs CANN's libraries
# (libhccl.so), even for a CPU run on a build host. "0": torch_npu is imported only where a script asks for it.
NO_AUTOLOAD = "TORCH_DEVICE_BACKEND_AUTOLOAD"

CANN_VARIABLES = ("ASCEND_HOME_PATH", "ASCEND_TOOLKIT_HOME")  # what a sourced set_env.sh exports
CANN_HOMES = (
    "/usr/local/Ascend/ascend-toolkit/latest",
    "/usr/local/Ascend/cann",
)  # CANN <= 8.3, 8.5+
CANN_SET_ENV = ("/usr/local/Ascend/ascend-toolkit/set_env.sh", "/usr/local/Ascend/cann/set_env.sh")
SET_ENV_HINT = f"source {CANN_SET_ENV[0]} (CANN 8.5+: {CANN_SET_ENV[1]})"
DRIVER_VERSION_INFO = "/usr/local/Ascend/driver/version.info"


def no_autoload() -> None:
    """torch_npu is not imported at `import torch` (unless the environment already says otherwise)."""
    os.environ.setdefault(NO_AUTOLOAD, "0")


def sourced_home(environ=os.environ) -> str | None:
    """The toolkit directory a sourced set_env.sh exported, else None."""
    return next((environ[key] for key in CANN_VARIABLES if environ.get(key)), None)


def cann_home(environ=os.environ) -> str | None:
    """The toolkit's directory: a sourced set_env.sh's, else the first default install (either layout) that exists."""
    for key in CANN_VARIABLES:
        if environ.get(key) and os.path.isdir(environ[key]):
            return environ[key]
    return next((d for d in CANN_HOMES if os.path.isdir(d)), None)
