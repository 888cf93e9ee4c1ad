"""The bench and the validation on the OLDEST stack of matrix.toml [stacks] (today the field report's: Python 3.8,
torch 2.1.0), on this CPU: every mode and check either runs or is skipped with its reason, never a traceback.

torch 2.1.0 for x86_64 comes from the package index as a CUDA build (2.6 GB with its nvidia-* wheels; it runs on
CPU). The venv is made once per machine and kept in ~/.cache/apexkit/test-venvs/ (APEXKIT_TEST_VENVS), keyed by
the interpreter, the torch pin and the extras, so only the first run pays for the download and the install.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import services
from conftest import ROOT

from apexkit.errors import InterpreterNotFoundError
from apexkit.plan import matrix
from apexkit.wheel import interpreters

BENCH = ROOT / "bench"
SMALL = [
    "--scale",
    "0.05",
    "--warmup",
    "1",
    "--repeats",
    "2",
    "--steps",
    "2",
    "--gemm-sizes",
    "64,128",
]
# what the run venv of `nox -s bench` adds next to torch (apexkit.venvrun.RUN_EXTRAS); numpy < 2 as torch 2.1 needs
EXTRAS = ("matplotlib", "numpy<2")


def _version(text: str) -> tuple:
    return tuple(int(part) for part in text.split("+")[0].split(".")[:3] if part.isdigit())


def oldest_stack() -> dict:
    stacks = matrix.load().data.get("stacks", {})
    assert stacks, "matrix.toml has no [stacks]"
    name = min(
        stacks,
        key=lambda n: (_version(str(stacks[n]["torch"])), _version(str(stacks[n]["python"]))),
    )
    return dict(stacks[name], name=name)


@contextlib.contextmanager
def _locked(path: Path):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)  # two test runs on one machine make the venv once
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


@pytest.fixture(scope="module")
def stack() -> dict:
    return oldest_stack()


@pytest.fixture(scope="module")
def old_python(stack) -> str:
    """A venv with the oldest stack's Python and torch (+ the run venv's extras), cached across test runs."""
    try:
        interp = interpreters.find(str(stack["python"]))
    except InterpreterNotFoundError as exc:
        services.require(False, f"stack {stack['name']}: {exc.cause}")
    torch_pin = f"torch=={stack['torch']}"
    key = hashlib.sha256(
        json.dumps([interp.full_version, interp.machine, torch_pin, EXTRAS]).encode()
    ).hexdigest()[:12]
    root = Path(
        os.environ.get("APEXKIT_TEST_VENVS") or Path.home() / ".cache" / "apexkit" / "test-venvs"
    )
    venv = root / f"bench-py{stack['python']}-torch{stack['torch']}-{key}"
    python = venv / "bin" / "python"
    with _locked(root / f"{venv.name}.lock"):
        if not (venv / ".complete").is_file():
            shutil.rmtree(venv, ignore_errors=True)  # a half-made venv from an interrupted run
            subprocess.run(
                [sys.executable, "-m", "virtualenv", "-q", "-p", interp.path, str(venv)], check=True
            )
            proc = subprocess.run(
                [str(python), "-m", "pip", "install", "-q", "--no-compile", torch_pin, *EXTRAS],
                capture_output=True,
                text=True,
                timeout=2400,
            )
            assert proc.returncode == 0, proc.stderr[-3000:]
            (venv / ".complete").write_text(torch_pin + "\n")
    return str(python)


def run(python: str, script: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [python, str(BENCH / script), *args], capture_output=True, text=True, timeout=900
    )


def _torch(version: str) -> str:
    return version.split("+")[0]


@pytest.mark.network
@pytest.mark.timeout(3000)
def test_every_bench_mode_runs_or_is_skipped_with_its_reason_on_the_oldest_stack(
    old_python, stack, tmp_path
):
    out = tmp_path / "out"
    result = run(
        old_python, "amp_bench.py", "--device", "cpu", "--out", str(out), *SMALL
    )  # every mode, both models
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    report = json.loads((out / "results.json").read_text())
    assert _torch(report["versions"]["torch"]) == stack["torch"]
    assert report["versions"]["python"].startswith(f"{stack['python']}.")
    caps = report["capabilities"]
    bf16, fp16 = caps["autocast"]["bfloat16"], caps["autocast"]["float16"]
    assert bf16["ok"] and bf16["via"] == "torch.autocast('cpu')"
    markdown = (out / "results.md").read_text()
    for name, entry in report["models"].items():
        rows = {r["mode"]: r for r in entry["results"]}
        assert list(rows) == [
            "fp32",
            "apex-O1",
            "apex-O2",
            "autocast-fp16",
            "autocast-bf16",
            "bf16",
        ]
        assert rows["bf16"]["status"] == "ok" or rows["bf16"]["reason"], rows["bf16"]
        for mode in ("fp32", "autocast-bf16"):
            assert rows[mode]["status"] == "ok" and rows[mode]["samples_per_s"] > 0, rows[mode]
        assert rows["autocast-bf16"]["parity_ok"], rows["autocast-bf16"]
        for mode in ("apex-O1", "apex-O2"):
            assert rows[mode]["status"] == "skipped" and "NPU/GPU" in rows[mode]["reason"]
        fp16_row = rows["autocast-fp16"]
        if (
            fp16["ok"] and caps["grad_scaler"]["ok"]
        ):  # a torch whose CPU autocast has fp16 (2.13 does) runs it
            assert fp16_row["status"] == "ok"
        else:  # torch 2.1: "torch 2.1.0 CPU autocast supports bfloat16 only (RuntimeError: ...)"
            assert fp16_row["status"] == "skipped", fp16_row
            reason = fp16_row["reason"]
            assert reason.startswith(f"torch {stack['torch']} CPU ") and reason in markdown
            assert f"{name:<12} autocast-fp16  skipped: {reason}" in result.stderr
        optim = {r["optimizer"]: r for r in entry["optimizers"]}
        assert optim["torch-adamw"]["status"] == "ok"
        fused = optim[
            "torch-adamw-fused"
        ]  # torch's CPU fused AdamW is 2.4+: older ones skip it and say why
        assert fused["status"] == "ok" or "has no fused AdamW on cpu" in fused["reason"], fused
    if _version(stack["torch"]) < (2, 2):  # measured: torch 2.1's CPU autocast refuses float16
        assert (
            not fp16["ok"]
            and "supports bfloat16 only" in report["models"]["mlp"]["results"][3]["reason"]
        )
    assert (out / "results.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (
        result.stdout.strip() == report["headline"] and "bf16" in report["headline"]
    )  # the fastest bf16 arm, by timing

    # the compare tool reads it back on the same old Python: skipped modes stay visible as such
    table = run(
        old_python,
        "amp_bench.py",
        "--compare",
        str(out / "results.json"),
        str(out / "results.json"),
    )
    assert table.returncode == 0, table.stderr
    expected = "skipped" if not fp16["ok"] else "ms"
    fp16_line = next(
        line for line in table.stdout.splitlines() if line.startswith("| mlp | autocast-fp16 |")
    )
    assert expected in fp16_line


@pytest.mark.network
@pytest.mark.timeout(3000)
def test_ddp_with_gloo_runs_on_the_oldest_stack(old_python, tmp_path):
    out = tmp_path / "ddp"
    result = run(
        old_python,
        "amp_bench.py",
        "--device",
        "cpu",
        "--nproc",
        "2",
        "--model",
        "mlp",
        "--modes",
        "fp32,autocast-bf16,autocast-fp16",
        "--no-png",
        "--out",
        str(out),
        *SMALL,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads((out / "results.json").read_text())
    assert (
        report["config"]["nproc"] == 2
        and report["capabilities"]["distributed"]["backend"] == "gloo"
    )
    statuses = {r["mode"]: r["status"] for r in report["models"]["mlp"]["results"]}
    assert statuses["fp32"] == statuses["autocast-bf16"] == "ok"


@pytest.mark.network
@pytest.mark.timeout(3000)
def test_validate_adapts_its_autocast_step_on_the_oldest_stack(old_python, stack, tmp_path):
    result = run(
        old_python, "validate_env.py", "--device", "cpu", "--json", str(tmp_path / "v.json")
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Traceback" not in result.stdout + result.stderr
    data = json.loads((tmp_path / "v.json").read_text())
    checks = {c["check"]: c for c in data["checks"]}
    assert data["ok"] is True
    assert checks["torch"]["detail"].startswith(stack["torch"])
    assert (
        checks["torch capabilities"]["status"] == "ok"
        and "bfloat16 yes" in checks["torch capabilities"]["detail"]
    )
    assert checks["torch.autocast step"]["status"] == "ok"
    assert checks["torch.autocast step"]["detail"].startswith("bfloat16 forward, backward, step")
    assert "verdict: ready" in result.stdout


def _tiny_wheel(directory: Path) -> Path:
    """A minimal valid wheel (one empty package), standing in for the apex wheel: the run venv installs it --no-deps."""
    import zipfile

    files = {
        "tiny_pkg/__init__.py": "",
        "tiny_pkg-0.1.dist-info/METADATA": "Metadata-Version: 2.1\nName: tiny-pkg\nVersion: 0.1\n",
        "tiny_pkg-0.1.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    files["tiny_pkg-0.1.dist-info/RECORD"] = (
        "".join(f"{name},,\n" for name in files) + "tiny_pkg-0.1.dist-info/RECORD,,\n"
    )
    directory.mkdir(parents=True, exist_ok=True)
    wheel = directory / "tiny_pkg-0.1-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for name, text in files.items():
            archive.writestr(name, text)
    return wheel


@pytest.mark.slow
@pytest.mark.network
@pytest.mark.timeout(3000)
def test_run_venv_pins_numpy_1_where_the_torch_needs_it(tmp_path):
    """torch 2.1.0 on Python 3.9 (a build-3.9 default): matplotlib pulls NumPy 2, which torch 2.1 cannot use (it prints
    a traceback-shaped warning at `import torch`). The run venv finds that out by trying and installs numpy<2."""
    from apexkit import venvrun

    try:
        interp = interpreters.find("3.9")
    except InterpreterNotFoundError as exc:
        services.require(False, exc.cause)
    target = tmp_path / "dist" / "py3.9-torch2.1.0-x86_64-master"
    wheel = _tiny_wheel(target)
    manifest = {
        "wheel": {"file": wheel.name, "sha256": hashlib.sha256(wheel.read_bytes()).hexdigest()},
        "target": {
            "python": "3.9",
            "torch": "2.1.0",
            "torch_npu": None,
            "interpreter": interp.path,
        },
    }
    venv = venvrun.run_venv(target, manifest, tmp_path / "cache")
    assert venvrun.numpy_works_with_torch(venv)
    check = subprocess.run(
        [str(venv.python), "-c", "import numpy, torch; print(numpy.__version__)"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert check.returncode == 0 and check.stdout.strip().startswith("1."), check.stderr
    assert "NumPy 1.x" not in check.stderr
