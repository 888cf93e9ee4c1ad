"""Which device `apexkit up` and `apexkit validate` take when --device is not given: the one this interpreter's torch
finds (bench/device_adapter.py `pick`: npu where torch_npu imports and a CANN runtime answers, cuda where a CUDA torch
sees a GPU, else cpu). Prints one JSON line, {"device": "cpu", "why": "torch_npu is not installed and torch sees no
CUDA GPU"}; a torch that does not import is cpu, and says so. bench/validate_env.py imports `found` for its own
default. Runs in the target venv (Python 3.8+): standard library + torch; never imports apexkit.
"""

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # bench/


def found():
    """(device, why)."""
    try:
        import device_adapter  # imports torch, torch_npu auto-loading off (it needs CANN)
    except Exception as exc:  # no torch, or a torch that cannot load its libraries
        text = str(exc).strip().splitlines()
        return "cpu", "torch does not import (%s%s)" % (
            type(exc).__name__,
            ": " + text[0] if text else "",
        )
    return device_adapter.pick()


if __name__ == "__main__":
    device, why = found()
    print(json.dumps({"device": device, "why": why}))
