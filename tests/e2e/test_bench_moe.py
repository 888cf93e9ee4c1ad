"""The Qwen3-30B-A3B-shaped MoE benchmark: the FLOPs convention against a hand computation, a real CPU run with MFU
against a measured peak, routing histograms per arm, optimizer parity, and one-line errors for bad input.
No timing is asserted: only that the numbers exist and follow from each other."""

from __future__ import annotations

import importlib.util
import json
import subprocess

import pytest

from . import test_bench
from .test_bench import BENCH, run

bench_python = (
    test_bench.bench_python
)  # the session's venv with torch 2.13.0 (shared with tests/e2e/test_bench.py)

TINY = [
    "--scale",
    "0.02",
    "--warmup",
    "1",
    "--repeats",
    "3",
    "--steps",
    "2",
    "--gemm-sizes",
    "64,128",
]


def load_flops():
    spec = importlib.util.spec_from_file_location("bench_flops", BENCH / "flops.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_moe_model_at_scale_1_is_qwen3_30b_a3b_and_its_weights_match_the_convention(bench_python):
    code = f"""
import sys
sys.path.insert(0, {str(BENCH)!r})
import models, flops
s = models.moe_sizes(1.0)
assert (s["hidden"], s["heads"], s["kv_heads"], s["head_dim"], s["experts"], s["top_k"], s["expert_width"],
        s["vocab"], s["seq"]) == (2048, 32, 4, 128, 128, 8, 768, 151936, 4096), s
model, sizes, _, _, _ = models.build("qwen3-moe", 0.05, 1)
linear = sum(m.weight.numel() for m in model.modules() if m.__class__.__name__ == "Linear")
expert = 3 * sizes["hidden"] * sizes["expert_width"]
# all Linear weights = activated ones + the experts a token does not visit
assert linear == flops.activated_params("qwen3-moe", sizes) + (sizes["experts"] - sizes["top_k"]) * expert
print("ok")
"""
    result = subprocess.run([bench_python, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr


def test_qwen3_moe_on_cpu_reports_mfu_against_a_measured_peak_routing_and_optimizer_parity(
    bench_python, tmp_path
):
    out = tmp_path / "moe"
    result = run(
        bench_python,
        "amp_bench.py",
        "--device",
        "cpu",
        "--model",
        "qwen3-moe",
        "--modes",
        "fp32,autocast-bf16,bf16",
        "--out",
        str(out),
        *TINY,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads((out / "results.json").read_text())
    flops = load_flops()
    peak = report["device_peak"]
    assert peak["table_entry"] is None and peak["fp32_kind"] == "float32"
    for dtype in ("float32", "bfloat16", "float16"):
        assert peak["dtypes"][dtype]["flops"] > 0 and peak["dtypes"][dtype]["source"].startswith(
            "measured"
        )
        assert set(peak["dtypes"][dtype]["sweep"]) == {"64", "128"}
    entry = report["models"]["qwen3-moe"]
    sizes = entry["sizes"]
    rows = {r["mode"]: r for r in entry["results"]}
    assert set(rows) == {"fp32", "autocast-bf16", "bf16"}
    for r in rows.values():
        assert r["status"] == "ok", r
        assert r["flops_per_step"] == flops.flops_per_step("qwen3-moe", sizes)
        expected = (
            r["flops_per_step"]
            / (r["step_ms_median"] / 1000)
            / peak["dtypes"][r["compute_dtype"]]["flops"]
        )
        assert (
            r["mfu"] == pytest.approx(expected, rel=1e-3)
            and r["mfu"] > 0
            and r["mfu_reason"] is None
        )
        assert r["peak_ratio_vs_fp32"] == round(
            peak["dtypes"][r["compute_dtype"]]["flops"] / peak["dtypes"]["float32"]["flops"], 3
        )
        assert (
            r["first_step_ms"] > 0 and r["step_ms_p10"] <= r["step_ms_median"] <= r["step_ms_p90"]
        )
        assert r["step_ms_min"] <= r["step_ms_olympic_mean"] <= r["step_ms_max"]
        assert r["final_grad_norm"] > 0 and r["grad_norm_rel_diff_vs_fp32"] is not None
        # every token fills top_k expert slots, in every arm
        for step in ("first_step", "last_step"):
            assert len(r["routing"][step]) == sizes["experts"]
            assert sum(r["routing"][step]) == sizes["batch"] * sizes["seq"] * sizes["top_k"]
            moved = (
                sum(abs(a - b) for a, b in zip(r["routing"][step], rows["fp32"]["routing"][step]))
                / 2
            )
            assert r["routing_drift_vs_fp32"][step] == pytest.approx(
                moved / sum(rows["fp32"]["routing"][step]), abs=1e-6
            )
    for r in (
        rows.values()
    ):  # --repeats 3 whole runs, each its own warm-up (1 step) + --steps 2 timed steps
        per_run = [run["step_ms"] for run in r["runs"]]
        assert len(per_run) == 3 and r["timed_steps"] == 6 and r["steps_per_run"] == 3
        assert r["step_ms_median"] == pytest.approx(sorted(per_run)[1], abs=1e-3)
        assert r["step_ms_min"] == pytest.approx(min(per_run), abs=1e-3)
        assert r["step_ms_max"] == pytest.approx(max(per_run), abs=1e-3)
        assert r["step_ms_olympic_mean"] == pytest.approx(
            sorted(per_run)[1], abs=1e-3
        )  # 3 runs: the middle one
        assert r["first_step_ms"] == r["runs"][0]["first_step_ms"] and all(
            x["first_step_ms"] > 0 for x in r["runs"]
        )
        # every run starts from the same seed, weights and data: the same training, run after run
        assert r["final_loss"] == r["runs"][0]["final_loss"]
        assert r["final_loss_spread_across_runs"] < 1e-4, r["runs"]
    assert (
        rows["fp32"]["compute_dtype"] == "float32" and rows["bf16"]["compute_dtype"] == "bfloat16"
    )
    # bf16 as MindSpeed's --bf16: bf16 model, fp32 master weights + AdamW state; within the 5 % loss rule
    assert rows["bf16"]["master_weights"] == "float32" and rows["fp32"]["master_weights"] is None
    assert rows["bf16"]["parity_ok"] and rows["bf16"]["grad_norm_parity_ok"], rows["bf16"]
    assert rows["fp32"]["routing_drift_vs_fp32"] == {"first_step": 0.0, "last_step": 0.0}
    assert rows["fp32"]["loss_scale"] is None  # no scaler in fp32/bf16: no trajectory
    assert 0 < sizes["top_k"] < sizes["experts"]
    optim = {r["optimizer"]: r for r in entry["optimizers"]}
    assert optim["torch-adamw"]["param_rel_diff_vs_adamw_update"] == 0.0
    fused = optim["torch-adamw-fused"]  # torch 2.13 has a fused AdamW for CPU
    assert (
        fused["status"] == "ok"
        and fused["parity_ok"]
        and fused["param_rel_diff_vs_adamw_update"] < 1e-3
    )
    assert len(fused["runs"]) == 3 and fused["steps"] == 3
    for arm in ("npu-fused-adamw", "apex-npu-fused-adam"):
        assert (
            optim[arm]["status"] == "skipped"
            and "runs on NPU only (device is cpu)" in optim[arm]["reason"]
        )
    env = report["environment"]
    assert env["hf32"] == "n/a (NPU only)" and set(env["env"]) >= {
        "TASK_QUEUE_ENABLE",
        "PYTORCH_NPU_ALLOC_CONF",
        "CPU_AFFINITY_CONF",
    }
    markdown = (out / "results.md").read_text()
    assert (
        "| MFU |" in markdown
        and "device peak ratio" in markdown
        and "tokens per expert" in markdown
    )
    assert "| torch-adamw-fused |" in markdown and "measured" in markdown
    assert "ms per timed step of each run" in markdown and "float32 master copies" in markdown
    assert (out / "results.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_fp16_run_records_the_loss_scale_trajectory(bench_python, tmp_path):
    out = tmp_path / "fp16"
    result = run(
        bench_python,
        "amp_bench.py",
        "--device",
        "cpu",
        "--model",
        "mlp",
        "--modes",
        "fp32,autocast-fp16",
        "--optimizers",
        "none",
        "--no-png",
        "--out",
        str(out),
        *TINY,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads((out / "results.json").read_text())
    fp16 = report["models"]["mlp"]["results"][1]
    scale = fp16["loss_scale"]
    assert (
        len(scale["trajectory"]) == 1 + 2
    )  # the first run: its first step (warm-up 1) + its 2 timed steps
    halvings = sum(1 for a, b in zip(scale["trajectory"], scale["trajectory"][1:]) if b < a)
    assert scale["skipped_steps"] == halvings == scale["skipped_steps_per_run"][0]
    assert len(scale["skipped_steps_per_run"]) == 3  # one count per whole run
    assert (
        "optimizers" not in report["models"]["mlp"]
        and "routing" in fp16
        and fp16["routing"] is None
    )


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["--optimizers", "sgd"], "unknown optimizer 'sgd'"),
        (["--scale", "0"], "--scale must be > 0"),
        (["--gemm-sizes", "big"], "--gemm-sizes takes comma-separated integers"),
        (
            ["--device", "cpu", "--hf32", "on"],
            "error: --hf32/--jit-compile set torch_npu switches and the device is cpu",
        ),
        (["--device", "npu"], "error: torch_npu not importable"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(bench_python, argv, said):
    result = run(bench_python, "amp_bench.py", "--model", "qwen3-moe", *argv)
    assert result.returncode == 2, result.stderr
    assert said in result.stderr and "Traceback" not in result.stderr
    assert len([line for line in result.stderr.splitlines() if "error" in line]) == 1


def test_npu_optimizer_arms_say_what_is_missing_off_npu(bench_python):
    code = f"""
import sys
sys.path.insert(0, {str(BENCH)!r})
import amp_bench, device_adapter, peaks

class FakeNpu:  # torch.npu as an NPU host would have it; this host has no torch_npu
    def current_device(self):
        return 0

npu = device_adapter.Device("npu", index=0, backend=FakeNpu())
for arm in ("npu-fused-adamw", "apex-npu-fused-adam"):
    factory, why = amp_bench.optimizer_factory(arm, npu)
    assert factory is None and "not importable (ModuleNotFoundError" in why, why
    print(why)
assert peaks.table_entry("Ascend910B3")["name"] == "Ascend 910B"
assert peaks.table_entry("NVIDIA H100 PCIe")["name"] == "NVIDIA H100 PCIe"
assert peaks.table_entry("NVIDIA H100 80GB HBM3")["name"] == "NVIDIA H100 SXM"
assert peaks.table_entry("NVIDIA H200")["peaks"]["bfloat16"] == 989.5e12
assert peaks.table_entry("NVIDIA A100-SXM4-80GB")["peaks"]["float32"] == 19.5e12
assert peaks.table_entry("AMD EPYC") is None
"""
    result = subprocess.run([bench_python, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "torch_npu" in result.stdout and "apex" in result.stdout
