"""Issue 41 item 4: `apexkit up` and `apexkit validate` without --device take the device the venv's torch finds (on
this CPU host: cpu, said with why) and validate for it; --device still forces one, and forcing npu here fails with a
hint naming --device cpu. A real venv with a real torch (2.13.0+cpu), the real probe, the real bench/validate_env.py;
up's install stage is planted as done for a stand-in apex (tests/e2e/test_up.py `plant`): no wheel is built."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import output

from .test_up import apexkit, clean_env, make_torch_venv, plant

WHY = "torch_npu is not installed and torch sees no CUDA GPU"


@pytest.fixture(scope="module")
def torch_venv(tmp_path_factory) -> Path:
    """A venv with torch 2.13.0+cpu and a stand-in apex distribution (its metadata and RECORD, no code)."""
    venv = make_torch_venv(tmp_path_factory.mktemp("device") / "train")
    info = next(venv.glob("lib/python*/site-packages")) / "apex-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: apex\nVersion: 0.1\n")
    (info / "RECORD").write_text("apex-0.1.dist-info/METADATA,,\napex-0.1.dist-info/RECORD,,\n")
    return venv


def test_up_without_device_picks_cpu_says_why_and_validates(torch_venv, tmp_path):
    report = tmp_path / "report"
    plant(torch_venv, report, stages=("install",))
    proc = apexkit(
        "up", "--venv", str(torch_venv), "--report", str(report), env=clean_env(tmp_path)
    )
    assert proc.returncode == 0, output(proc)
    said = [line for line in proc.stderr.splitlines() if line.startswith("device ")]
    assert said == [f"device cpu: {WHY} (--device npu|cuda|cpu forces one)"], output(proc)
    data = json.loads((report / "up.json").read_text())
    stages = {s["name"]: s for s in data["stages"]}
    assert data["device"] == "cpu" and data["ok"] is True
    assert stages["validate"]["status"] == "ok" and stages["validate"]["options"]["device"] == "cpu"
    validated = json.loads((report / "validate.json").read_text())
    assert validated["device"] == "cpu" and validated["ok"] is True
    assert proc.stdout.splitlines()[-1] == "ready"


def test_up_with_device_npu_is_forced_and_its_failure_names_device_cpu(torch_venv, tmp_path):
    report = tmp_path / "report"
    plant(torch_venv, report, stages=("install",), device="npu")
    argv = ("up", "--venv", str(torch_venv), "--device", "npu", "--report", str(report))
    proc = apexkit(*argv, env=clean_env(tmp_path))
    assert proc.returncode == 1, output(proc)
    assert not any(line.startswith("device cpu:") for line in proc.stderr.splitlines())
    data = json.loads((report / "up.json").read_text())
    assert data["device"] == "npu"
    failure = data["first_failure"]
    assert failure["stage"] == "validate"
    assert (
        failure["cause"]
        == "torch_npu: not importable: ModuleNotFoundError: No module named 'torch_npu'"
    )
    assert failure["fix"].startswith(
        f"this host has cpu ({WHY}): --device cpu validates for it; or "
    )
    assert "--device cpu" in proc.stdout and "Traceback" not in output(proc)


def test_validate_without_device_picks_cpu_and_with_device_npu_names_device_cpu(
    torch_venv, tmp_path
):
    python = str(torch_venv / "bin" / "python")
    env = clean_env(tmp_path)
    proc = apexkit("validate", "--interpreter", python, "--json", str(tmp_path / "v.json"), env=env)
    assert proc.returncode == 0, output(proc)
    assert proc.stdout.splitlines()[0] == f"device cpu: {WHY} (--device npu|cuda|cpu forces one)"
    assert json.loads((tmp_path / "v.json").read_text())["device"] == "cpu"
    forced = apexkit(
        "validate", "--interpreter", python, "--device", "npu", "--reports", str(tmp_path), env=env
    )
    assert forced.returncode == 9, output(forced)  # BenchError: not ready
    assert forced.stdout.splitlines()[0] == "environment for --device npu:"  # asked, not picked
    assert f"-> this host has cpu ({WHY}): --device cpu validates for it; or " in forced.stdout
    assert forced.stderr.strip().splitlines()[-1].startswith("error: the environment is not ready")
