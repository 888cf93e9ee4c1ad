"""Training stacks on the command line: bad --stack and pairing inputs are one line, a stack's dry run, a broken
matrix.toml for every nox command, and a build with the real torch_npu wheel from the package index on a host without
CANN (torch >= 2.5 auto-loads torch_npu). The stacks as data are in tests/unit/test_stacks.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from conftest import ROOT, output

from apexkit.wheel import known_failures

NPU_TARGET = "py3.11-torch2.13.0-x86_64-master+npu2.13.0"


def _cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "apexkit", "build", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, **(env or {})},
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["3.11", "--torch", "2.1.0", "--torch-npu", "2.5.1.post1"],
            "torch_npu 2.5.1.post1 is built for torch 2.5.1",
        ),
        (["3.11", "--torch", "2.5.0", "--npu"], "no torch_npu release is known for torch 2.5.0"),
        (["3.11", "--stack", "nosuch"], "unknown stack 'nosuch'"),
        (["3.11", "--stack", "mindspeed-llm-2.3.0"], "stack mindspeed-llm-2.3.0 is Python 3.10"),
        (["3.10", "--stack", "mindspeed-llm-2.3.0", "--torch", "2.1.0"], "--torch contradict"),
        (["3.7"], "Python 3.7 is refused"),
        (["2.7"], "Python 2.7 is refused"),
        (
            ["3.11", "--torch", "2.13.0/../../x"],
            "--torch '2.13.0/../../x' is not a version (PEP 440)",
        ),
        (
            ["3.11", "--torch", "2.1.0", "--torch-npu", "2.1.0.post10/.."],
            "--torch-npu '2.1.0.post10/..' is not a version",
        ),
    ],
)
def test_bad_stack_and_pairing_inputs_are_one_line_errors(tmp_path, args, message):
    proc = _cli(
        *args, "--dry-run", "--dist", str(tmp_path / "dist"), "--build-dir", str(tmp_path / "build")
    )
    assert proc.returncode == 2, output(proc)[-2000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and message in errors[0] and "-- next:" in errors[0], proc.stderr
    assert (
        "Traceback" not in output(proc)
        and not (tmp_path / "dist").exists()
        and not (tmp_path / "build").exists()
    )


def test_stack_dry_run_prints_the_stack_and_which_torch_build_it_downloads(tmp_path):
    proc = _cli(
        "3.10", "--stack", "mindspeed-llm-2.3.0", "--dry-run", "--dist", str(tmp_path / "d")
    )
    if proc.returncode == 3:
        pytest.skip(f"no python3.10 here: {proc.stderr.strip()}")
    assert proc.returncode == 0, output(proc)[-2000:]
    out = output(proc)
    assert "stack           mindspeed-llm-2.3.0 (CANN 8.5.0 on the NPU nodes)" in out
    assert "torch           2.7.1 + torch_npu 2.7.1.post2" in out
    if os.uname().machine == "x86_64":
        assert "torch build     CUDA build from the package index (~2.6-2.8 GB" in out
        assert "--torch-index-url https://download.pytorch.org/whl/cpu" in out
    assert "dry run: nothing fetched, built or written" in out and not (tmp_path / "d").exists()
    if (
        os.uname().machine == "x86_64"
    ):  # the stack trains on aarch64: the two commands that build for it
        assert (
            "For aarch64: python -m apexkit image.build --arch aarch64, then python -m apexkit build 3.10 "
            "--stack mindspeed-llm-2.3.0 --image IMAGE (under QEMU)"
        ) in out, out


@pytest.mark.network
def test_npu_build_with_the_real_torch_npu_wheel_and_no_cann(runner):
    """torch 2.13.0 (CPU wheel on disk) + the real torch_npu 2.13.0 from the package index, no CANN on this host:
    the build, its probes and the smoke test run with auto-loading off; the smoke test says what needs CANN."""
    assert not os.path.isdir("/usr/local/Ascend"), "this test needs a host without CANN"
    proc = runner.nox("3.11", "--torch", "2.13.0", "--torch-npu", "2.13.0")
    assert proc.returncode == 0, output(proc)[-3000:]
    out = output(proc)
    assert "torch           2.13.0 + torch_npu 2.13.0" in out
    assert "needs the CANN runtime (not checked here): import torch_npu; import apex" in out
    manifest = json.loads((runner.dist / NPU_TARGET / "manifest.json").read_text())
    assert (
        manifest["tools"]["torch_npu"] == "2.13.0" and manifest["target"]["torch_npu"] == "2.13.0"
    )
    smoke = manifest["smoke_test"]
    assert (
        smoke["autoload"] == "0"
        and smoke["modules"]["apex_C"]["ok"]
        and smoke["modules"]["change_data_ptr"]["ok"]
    )
    assert smoke["checked"][:2] == [
        "import torch (torch_npu auto-loading off)",
        "import apex_C, change_data_ptr",
    ]
    assert smoke["torch_npu"].startswith("installed; import needs the CANN runtime (")
    assert smoke["needs_cann"][:2] == ["import torch_npu", "import apex (imports torch_npu)"]
    build_log = (runner.build / NPU_TARGET / "build.log").read_text()
    assert "Failed to load the backend extension" not in build_log and "known failure" not in out

    # The trap is real: the same build venv, `import torch` with auto-loading on (torch's default), fails.
    site = next(
        runner.cache.glob("venvs/build-py3.11-*/lib/python3.11/site-packages/torch_npu")
    ).parent
    env = {k: v for k, v in os.environ.items() if k != "TORCH_DEVICE_BACKEND_AUTOLOAD"}
    trap = subprocess.run(
        [str(site.parents[2] / "bin" / "python"), "-c", "import torch"],
        capture_output=True,
        text=True,
        env=env,
    )
    assert trap.returncode != 0 and "Failed to load the backend extension: torch_npu" in trap.stderr
    assert [f.id for f in known_failures.match(trap.stderr)] == ["torch-npu-autoload"]


def test_a_broken_matrix_is_one_line_for_every_nox_command(tmp_path):
    copy = tmp_path / "repo"
    files = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    for name in files:
        if (ROOT / name).is_file():
            (copy / name).parent.mkdir(parents=True, exist_ok=True)
            (copy / name).write_bytes((ROOT / name).read_bytes())
    with open(copy / "matrix.toml", "a") as fh:
        fh.write(
            '\n[stacks."3.11"]\npython = "3.8"\ntorch = "2.1.0"\narch = "x86_64"\nsource = "s"\nread = "d"\n'
        )
    proc = subprocess.run(
        [sys.executable, "-m", "nox", "-l"], cwd=copy, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode != 0 and "Traceback" not in output(proc)
    assert "error: matrix.toml [stacks.3.11]: a stack name must be" in proc.stderr
