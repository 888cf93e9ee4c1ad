"""The NPU test tier where there is no NPU: present, selectable, one line saying what it needs, JUnit XML with every
case skipped (the runner and the JUnit writer are the CPU tier's, run for real in the build's smoke test)."""

from __future__ import annotations

import json
import subprocess
import sys
import xml.etree.ElementTree as ET

from conftest import ROOT


def test_npu_tier_says_what_it_needs_and_writes_junit(tmp_path):
    junit = tmp_path / "npu.xml"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "npu_tier.py"), "--junit", str(junit)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert proc.returncode == 1  # nothing ran: not a pass
    lines = [x for x in proc.stderr.splitlines() if x.startswith("needs an NPU: ")]
    assert len(lines) == 1 and "torch_npu is not installed" in lines[0], proc.stderr
    assert "the source tree the wheel was built from (pass --tests build/<target>/tree)" in lines[0]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["ran"] is False and report["ok"] is False and len(report["needs"]) == 2
    root = ET.parse(junit).getroot()
    assert (
        root.get("name") == "apex-npu-tier"
        and root.get("tests") == "5"
        and root.get("skipped") == "5"
    )
    names = [c.get("name") for c in root.iter("testcase")]
    assert names[:3] == ["tests/L0 amp", "tests/L0 optimizers", "combine_tensors"]
    assert all(c.find("skipped").get("message") == lines[0] for c in root.iter("testcase"))


def test_validate_device_npu_selects_the_npu_tier(tmp_path):
    """`nox -s validate -- --device npu` runs bench/validate_env.py in the wheel's venv; its NPU tier row says what it
    needs and the JUnit XML is written (this interpreter has no torch_npu, like every machine here)."""
    junit = tmp_path / "npu.xml"
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "validate_env.py"),
            "--device",
            "npu",
            "--json",
            "-",
            "--junit",
            str(junit),
            "--tests",
            str(tmp_path / "no-tree"),
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert proc.returncode == 1
    checks = {
        c["check"]: c for c in json.loads(proc.stdout)["checks"]
    }  # stdout stays the JSON report alone
    row = checks["NPU test tier (bench/npu_tier.py)"]
    assert (
        row["status"] == "fail" and row["required"] and row["detail"].startswith("needs an NPU: ")
    )
    assert f"the source tree the wheel was built from ({tmp_path / 'no-tree'})" in row["detail"]
    assert ET.parse(junit).getroot().get("skipped") == "5"
