"""Install the apex wheel WHEEL into VENV as `apexkit install` does (apexkit.install.run._install, the real probe and
the real pip), with the venv's pip, installing apex, stopped after writing its N-th file: it writes its pid to
$APEXKIT_TEST_PIP_PAUSED and sleeps, so that a test can kill apexkit while pip writes into the venv
(tests/e2e/test_install_dependencies.py).

    python tests/e2e/pause_in_pip.py N VENV WHEEL

The library has no hook for this: the pip command line is changed here, in the process that runs apexkit.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

PIP = """
import os, runpy, shutil, sys, time
copy, written = shutil.copyfileobj, []
def paused(*args, **kwargs):
    copy(*args, **kwargs)
    written.append(1)
    if len(written) == {n}:
        with open(os.environ["APEXKIT_TEST_PIP_PAUSED"] + ".part", "w") as fh:
            fh.write(str(os.getpid()))
        os.rename(os.environ["APEXKIT_TEST_PIP_PAUSED"] + ".part", os.environ["APEXKIT_TEST_PIP_PAUSED"])
        time.sleep(120)
shutil.copyfileobj = paused
sys.argv[0] = "pip"
runpy.run_module("pip", run_name="__main__", alter_sys=True)
"""


def main(argv: list[str]) -> None:
    n, venv, wheel = int(argv[0]), Path(argv[1]), Path(argv[2])
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from apexkit import untrusted
    from apexkit.install import run
    from apexkit.install import target as targets

    real = subprocess.run

    def slow_pip(args, **kwargs):
        if args[2:5] == ["-m", "pip", "install"] and args[-1].startswith("apex=="):
            args = [*args[:2], "-c", PIP.format(n=n), *args[4:]]
        return real(args, **kwargs)

    run.subprocess.run = slow_pip  # type: ignore[assignment]
    python, named = str(venv / "bin" / "python"), f"--venv {venv}"
    before = targets.probe(python, named, os.environ)
    result = run.Result("would-install", None, None, "x", before.venv, None, None, None)
    run._install(
        before, named, wheel, untrusted.sha256_file(wheel), result, "installed", os.environ
    )


if __name__ == "__main__":
    main(sys.argv[1:])
