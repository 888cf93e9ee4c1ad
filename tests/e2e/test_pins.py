"""`nox -s lock -- --check` passes without the network. The locks and pins themselves are read in-process in
tests/unit/test_pins.py."""

from __future__ import annotations

import subprocess
import sys

from conftest import ROOT


def test_nox_lock_check_passes_without_network():
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "nox",
            "-f",
            str(ROOT / "noxfile.py"),
            "-s",
            "lock",
            "--",
            "--check",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "requirements/dev.txt: " in proc.stderr and "pins with hashes" in proc.stderr
