"""Safe defaults: a bare `nox` runs lint only, and `nox -s tests` installs system packages and registers binfmt only
when asked (APEXKIT_INSTALL_SYSTEM_TOOLS=1 or CI=true); without it, it installs nothing, says so, and services skip."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, output

from tools import systools, testtools

NOX = [sys.executable, "-m", "nox", "-f", str(ROOT / "noxfile.py")]


def _without_opt_in(**extra: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("CI", testtools.OPT_IN, "APEXKIT_REQUIRE_SERVICES")
    }
    env.update(extra)
    return env


def test_bare_nox_selects_only_lint():
    proc = subprocess.run(
        [*NOX, "-l"], cwd=ROOT, capture_output=True, text=True, env=_without_opt_in()
    )
    assert proc.returncode == 0, proc.stderr
    selected = re.findall(
        r"^\* (\S+)", proc.stdout, re.M
    )  # nox -l marks the sessions a bare `nox` runs with '*'
    assert selected == ["lint"]
    assert re.search(r"^- tests ->", proc.stdout, re.M) and re.search(
        r"^- tests-aarch64 ->", proc.stdout, re.M
    )


@pytest.fixture
def bare_path(tmp_path) -> str:
    """A PATH with the build tools and apt-get but none of the test services (no dockerd, tinyproxy, debootstrap, QEMU):
    a machine where `nox -s tests` could install them, as root."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in (*systools.DEBIAN_PACKAGES, "apt-get", "sh", "bash", "env", "uname", "id"):
        found = shutil.which(tool)
        if found:
            (bin_dir / tool).symlink_to(found)
    return f"{bin_dir}:{Path(sys.executable).parent}"


# What the session hands to pytest: written by a one-test file that `nox -s tests` runs.
PROBE = """
import os
def test_probe():
    with open(os.environ["PROBE_OUT"], "w") as f:
        f.write(os.environ.get("APEXKIT_REQUIRE_SERVICES", "unset"))
"""


@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("apt-get") is None,
    reason="the case that matters is root + apt-get, where the session could install",
)
def test_tests_session_without_opt_in_installs_nothing(bare_path, tmp_path):
    probe, probe_test = tmp_path / "probe", tmp_path / "test_probe.py"
    probe_test.write_text(PROBE)
    env = _without_opt_in(PATH=bare_path, PROBE_OUT=str(probe))
    argv = [*NOX, "-s", "tests", "--", str(probe_test), "-q", "-p", "no:cacheprovider"]
    proc = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    text = output(proc)
    assert proc.returncode == 0, text[-3000:]
    assert probe.read_text() == "unset"  # services may skip: nothing was promised
    assert (
        "apt-get update" not in text and "update-binfmts" not in text and "installed " not in text
    )
    said = next(line for line in text.splitlines() if "not installing" in line)
    for package in ("docker.io", "tinyproxy", "debootstrap", "qemu-user-static"):
        assert package in said
    assert "apt-get install -y --no-install-recommends" in said and f"{testtools.OPT_IN}=1" in said
