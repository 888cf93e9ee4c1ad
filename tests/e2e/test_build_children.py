"""Issue 40 (F8): a build's long children (`python setup.py bdist_wheel`, pip, uv: proc.run_logged) outlived a
killed `apexkit build` / `install` and went on compiling into build/ after it was gone. Here a real apexkit process
runs a slow fake compile through run_logged and is killed for real: by kill -9 (the kernel then kills the child:
PR_SET_PDEATHSIG), or stopped as by Ctrl-C (then what is left of the child's process group, the compilers it
started included, is killed). Each fake writes a file once its long "compile" is over: that file never appears."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import ROOT

RUNNER = """
import sys
from pathlib import Path
from apexkit.proc import run_logged
run_logged([sys.executable, sys.argv[1], sys.argv[2]], Path(sys.argv[2]) / "build.log")
"""

# the fake compile: its pid (and its own compiler's) written, then a long "compile", then a file saying it finished
COMPILE = """
import os, subprocess, sys, time
work = sys.argv[1]
late = "import sys, time; time.sleep(20); open(sys.argv[1] + '/finished-compiler', 'w').close()"
compiler = subprocess.Popen([sys.executable, "-c", late, work])
with open(work + "/pids.tmp", "w") as fh:
    fh.write(f"{os.getpid()} {compiler.pid}")
os.rename(work + "/pids.tmp", work + "/pids")
print("compiling", flush=True)
time.sleep(20)
open(work + "/finished-setup", "w").close()
compiler.wait()
"""


def dead(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def wait_for(what, seconds: float = 60.0) -> bool:
    deadline = time.monotonic() + seconds
    while not what():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


@pytest.mark.parametrize("how", ["SIGKILL", "SIGINT"])
def test_a_killed_build_leaves_no_compile_running(tmp_path, how):
    (tmp_path / "compile.py").write_text(COMPILE)
    runner = subprocess.Popen(
        [sys.executable, "-c", RUNNER, str(tmp_path / "compile.py"), str(tmp_path)],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    pids: list[int] = []
    try:
        assert wait_for(lambda: (tmp_path / "pids").exists()), "the fake compile never started"
        pids = [int(p) for p in (tmp_path / "pids").read_text().split()]
        runner.send_signal(getattr(signal, how))
        runner.wait(timeout=60)
        # kill -9: the kernel kills setup.py (its own compiler is cut off from apexkit anyway); Ctrl-C: both
        watched = pids[:1] if how == "SIGKILL" else pids
        assert wait_for(lambda: all(dead(p) for p in watched)), f"still running: {watched}"
        assert not (tmp_path / "finished-setup").exists(), "the compile went on after apexkit died"
        if how == "SIGINT":
            assert not (tmp_path / "finished-compiler").exists(), "a compiler outlived apexkit"
    finally:
        for pid in pids:
            if not dead(pid):
                os.kill(pid, signal.SIGKILL)
        if runner.poll() is None:
            runner.kill()
