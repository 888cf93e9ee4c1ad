"""tools/ (the locks, the tests' system tools, the build timing, the API contracts, the torch_npu table's refresh) is
not part of an installed apexkit: the noxfile copy an installed apexkit carries stops those sessions with one line,
not an ImportError traceback."""

from __future__ import annotations

import shutil
import subprocess
import sys

from conftest import ROOT


def test_a_dev_session_without_tools_is_one_line(tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    (site / "apexkit").symlink_to(ROOT / "apexkit")  # apexkit importable, tools/ not
    shutil.copy(ROOT / "noxfile.py", tmp_path / "noxfile.py")
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(site), "HOME": str(tmp_path)}
    for session in ("lock", "build-bench", "contracts", "refresh"):
        proc = subprocess.run(
            [sys.executable, "-m", "nox", "-f", str(tmp_path / "noxfile.py"), "-s", session],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        text = proc.stdout + proc.stderr
        assert proc.returncode != 0
        assert "is part of a checkout of apexkit, not of an installed one" in text, text[-2000:]
        assert "Traceback" not in text and "ImportError" not in text
