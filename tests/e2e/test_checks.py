"""The one check/report model on the command line: `invoke image.emulation` redirected puts its table in the file.
The model itself (apexkit/checks.py) is tested in-process in tests/unit/test_checks.py."""

from __future__ import annotations

import os
import re
import subprocess
import sys

from conftest import ROOT

SUMMARY = re.compile(r"^\d+ ok, \d+ warn, \d+ fail, \d+ skip$")


def test_invoke_image_emulation_redirected_puts_the_table_in_the_file(tmp_path):
    env = {**os.environ, "APEXKIT_BINFMT_DIR": str(tmp_path / "no-binfmt")}
    proc = subprocess.run(
        [sys.executable, "-m", "invoke", "-r", str(ROOT), "image.emulation"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert proc.returncode == 1
    assert proc.stdout.startswith("emulation\n") and (
        "FAIL aarch64" in proc.stdout or "FAIL x86_64" in proc.stdout
    )
    assert SUMMARY.match(proc.stdout.splitlines()[-1]) and "emulation" not in proc.stderr
