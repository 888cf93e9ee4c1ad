"""What apexkit needs to know about an interpreter's torch, read by importing it. One mode per reader; each prints one
JSON line (the last line of stdout):

    python torch_facts.py build    the build venv's torch for the binary checks (apexkit.wheel.builder
                                   Builder._torch_facts): lib (torch's lib/), site, cxx11_abi (0/1), npu_lib (torch_npu's
                                   lib/, found without importing torch_npu: that needs CANN; null without torch_npu),
                                   interpreter (the python binary, and libpython when it is shared), cuda
                                   (torch.version.cuda: null for a CPU build)
    python torch_facts.py system   --use-system-torch (Builder._system_torch): version, dir (its site folder)
    python torch_facts.py doctor   `invoke doctor` (apexkit.doctor.machine.check_torch): torch, torch_dir, cxx11_abi
                                   (true/false), torch_npu -- or torch_error / torch_npu_error, one line each, and
                                   torch null when it is not installed

build and system exit non-zero when torch does not import (the caller shows stderr's last line); doctor never does.
apexkit runs build and system with TORCH_DEVICE_BACKEND_AUTOLOAD=0 (a build needs no CANN), doctor with the
environment as the user has it.
"""

import json
import os
import sys


def _site(torch):
    return os.path.dirname(os.path.dirname(os.path.abspath(torch.__file__)))


def build():
    import importlib.util
    import sysconfig

    import torch

    spec = importlib.util.find_spec("torch_npu")
    libpy = os.path.join(
        sysconfig.get_config_var("LIBDIR") or "", sysconfig.get_config_var("LDLIBRARY") or ""
    )
    return {
        "lib": os.path.join(os.path.dirname(os.path.abspath(torch.__file__)), "lib"),
        "site": _site(torch),
        "cxx11_abi": int(getattr(torch._C, "_GLIBCXX_USE_CXX11_ABI", 1)),
        "npu_lib": os.path.join(next(iter(spec.submodule_search_locations)), "lib")
        if spec
        else None,
        "interpreter": [os.path.realpath(sys.executable)]
        + ([libpy] if sysconfig.get_config_var("Py_ENABLE_SHARED") else []),
        "cuda": torch.version.cuda,
    }


def system():
    import torch

    return {"version": torch.__version__, "dir": _site(torch)}


def _error(exc):
    return "%s: %s" % (type(exc).__name__, str(exc).splitlines()[0] if str(exc) else "")


def doctor():
    out = {}
    try:
        import torch

        out["torch"] = torch.__version__
        out["torch_dir"] = _site(torch)
        out["cxx11_abi"] = bool(getattr(torch._C, "_GLIBCXX_USE_CXX11_ABI", True))
    except ModuleNotFoundError:
        out["torch"] = None
    except Exception as exc:
        out["torch_error"] = _error(exc)
    if out.get("torch"):
        try:
            import torch_npu

            out["torch_npu"] = torch_npu.__version__
        except ModuleNotFoundError:
            out["torch_npu"] = None
        except Exception as exc:
            out["torch_npu_error"] = _error(exc)
    return out


MODES = {"build": build, "system": system, "doctor": doctor}

if __name__ == "__main__":
    if len(sys.argv) != 2 or sys.argv[1] not in MODES:
        sys.exit("usage: python torch_facts.py %s" % "|".join(MODES))
    print(json.dumps(MODES[sys.argv[1]]()))
