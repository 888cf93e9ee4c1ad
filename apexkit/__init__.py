"""apexkit: build Apex for Ascend wheels for any Python x torch x torch_npu x arch.

The host-side library. It never imports torch: it runs the target venv's interpreter instead.
"""

# This file must stay parseable by Python 2.7 and 3.6 (no f-strings, no `from __future__ import annotations`):
# `python -m apexkit`, noxfile.py and tasks.py import it first, so an old host Python gets this one line, not a
# SyntaxError or a traceback from a module further down.
import sys

HOST_PYTHON_FLOOR = (3, 8)

if sys.version_info < HOST_PYTHON_FLOOR:
    sys.stderr.write(
        "error: apexkit's tools need Python "
        + ".".join(str(n) for n in HOST_PYTHON_FLOOR)
        + " or newer on the host, "
        "this is Python "
        + sys.version.split()[0]
        + " ("
        + (sys.executable or "python")
        + ") -- next: run them with "
        "python3.8-3.13 (python3.11 -m pip install -r requirements/runtime.txt && python3.11 -m nox -l); the Python a wheel "
        "is built for is chosen separately (nox -s build-3.X)\n"
    )
    sys.exit(3)

__version__ = "0.1.0"
