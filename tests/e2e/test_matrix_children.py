"""Issue 40 (second hostile pass, reviewer's note): a cell's child `apexkit build` of `apexkit matrix --run`
(matrixrun.run_one) outlived a killed matrix run and went on building. Here a real matrix-run process runs one cell
whose child is a slow fake build (test_build_children's fake compile, which starts a compiler of its own) and is
killed for real: by kill -9 (the kernel then stops the child: PR_SET_PDEATHSIG), or stopped as by Ctrl-C (then what
is left of the child's process group, its compiler included, is ended). The fake writes a file once its long
"build" is over: that file never appears. The cell's log is written as before."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest
from conftest import ROOT

from e2e.test_build_children import COMPILE, dead, wait_for

RUNNER = """
import sys
from pathlib import Path
from apexkit.fleet import matrixrun
from apexkit.plan import matrix
work = Path(sys.argv[2])
matrixrun.dockerclient.host_arch = lambda: "x86_64"
m = matrix.load()
combo = m.combinations([{"python": "3.11", "torch": "2.13.0", "arch": "x86_64"}])[0]
run = {"dist": work / "dist", "build_dir": work / "build", "jobs": 1}
opts = matrixrun.prepare(m, combo, [], None, run, host="x86_64")
matrixrun.child_argv = lambda *_: [sys.executable, sys.argv[1], str(work)]  # the cell's slow "apexkit build"
(work / "logs").mkdir()
matrixrun.run_one(combo, opts, work / "logs")
"""


@pytest.mark.parametrize("how", ["SIGKILL", "SIGINT"])
def test_a_killed_matrix_run_leaves_no_cell_build_running(tmp_path, how):
    (tmp_path / "compile.py").write_text(COMPILE)
    runner = subprocess.Popen(
        [sys.executable, "-c", RUNNER, str(tmp_path / "compile.py"), str(tmp_path)],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    pids: list[int] = []
    try:
        assert wait_for(lambda: (tmp_path / "pids").exists()), "the cell's build never started"
        pids = [int(p) for p in (tmp_path / "pids").read_text().split()]
        runner.send_signal(getattr(signal, how))
        runner.wait(timeout=60)
        # kill -9: the kernel stops the cell's build (a real one then ends its own compilers); Ctrl-C: both
        watched = pids[:1] if how == "SIGKILL" else pids
        assert wait_for(lambda: all(dead(p) for p in watched)), f"still running: {watched}"
        assert not (tmp_path / "finished-setup").exists(), (
            "the build went on after the matrix run died"
        )
        if how == "SIGINT":
            assert not (tmp_path / "finished-compiler").exists(), (
                "a compiler outlived the matrix run"
            )
        (log,) = (tmp_path / "logs").glob("*.log")
        assert log.read_text().startswith(f"+ {sys.executable} {tmp_path / 'compile.py'}")
    finally:
        for pid in pids:
            if not dead(pid):
                os.kill(pid, signal.SIGKILL)
        if runner.poll() is None:
            runner.kill()
