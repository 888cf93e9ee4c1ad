#!/usr/bin/env python3
"""FP32 vs mixed precision on one device: step time (median and spread), throughput, peak memory, loss parity.

    python bench/amp_bench.py --device auto --model all            # npu > cuda > cpu
    python bench/amp_bench.py --device cpu --modes fp32,autocast-bf16 --scale 0.25
    python bench/amp_bench.py --nproc 2 --device cpu                # torchrun + DDP (gloo/nccl/hccl)
    python bench/amp_bench.py --compare npu.json cuda.json cpu.json # side by side

Modes: fp32 (on NPU --hf32 on|off sets torch.npu.matmul.allow_hf32); apex-O1, apex-O2 (apex.amp, where apex
runs on the device); autocast-fp16 (with a GradScaler), autocast-bf16 (torch.autocast for the device type); bf16
(the model in bfloat16, float32 master weights and optimizer state, as MindSpeed's --bf16 trains).
Optimizer arms (--optimizers): torch AdamW, torch's fused AdamW, torch_npu NpuFusedAdamW,
apex NpuFusedAdam (Ascend), apex FusedAdam (NVIDIA apex on CUDA): step time and parameter parity after the same steps.
MFU: model FLOPs per step (bench/flops.py states the convention) / step time / the device's peak for the mode's
compute dtype (bench/device_peaks.json for known accelerators, else a GEMM sweep measured at the start).
Method: the first step (compilation, warm-up) is reported on its own; each mode makes --repeats whole runs (a fresh
model and optimizer from the same seed and data, its own warm-up untimed, then --steps steps between two
device-synchronised timestamps): median, min-max, p10/p90 and the olympic mean over the runs.
Every run of every mode starts from the same weights and data (fixed seeds); speedup, memory ratio and loss parity
are against the fp32 runs of the same invocation.
A mode this torch or device cannot run (probed by trying: e.g. torch 2.1's CPU autocast has no float16) is
skipped with its reason; a mode that fails while running is reported as failed (exit 1), never as a traceback.
Outputs in --out: results.json, results.md, results.png; the headline is the last line on stdout, and stderr ends
with the paths of the three files. A loaded host (the 1-minute load above the core count at the start or the end, or
a mode's p90/p10 step time beyond SPREAD_BOUND = 1.5x) is flagged in the report and in one warning line.
Runs inside the target venv (Python 3.8+, torch 2.1+): standard library + torch (+ torch_npu, apex, matplotlib).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import importlib.metadata
import json
import os
import platform
import statistics
import subprocess
import sys
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
# torch warns at import when NumPy is not installed at all; the bench never uses NumPy, so in a run venv without it
# that warning is noise (a NumPy that is there and broken still warns)
warnings.filterwarnings("ignore", message="Failed to initialize NumPy: No module named 'numpy'")

import device_adapter  # noqa: E402 (after the warnings filter: it imports torch)
import flops  # noqa: E402
import models  # noqa: E402
import peaks  # noqa: E402
import targetenv  # noqa: E402
import torch  # noqa: E402

MODES = ("fp32", "apex-O1", "apex-O2", "autocast-fp16", "autocast-bf16", "bf16")
# The dtype a mode's matmuls run in: MFU is against the device's peak for it.
COMPUTE_DTYPE = {
    "fp32": "float32",
    "apex-O1": "float16",
    "apex-O2": "float16",
    "autocast-fp16": "float16",
    "autocast-bf16": "bfloat16",
    "bf16": "bfloat16",
}
# Without --scale on CPU: qwen3-moe at 0.05 (seq 208, vocab 7,616, 8 experts) keeps a low-precision arm near a second
# per step on a 2-core CPU; at the others' 0.25 its vocabulary (37,984) x seq (1,024) LM head alone takes minutes.
CPU_MOE_SCALE = 0.05
OPTIMIZERS = (
    "torch-adamw",
    "torch-adamw-fused",
    "npu-fused-adamw",
    "apex-npu-fused-adam",
    "apex-fused-adam",
)
# Environment variables that change NPU speed or memory: recorded in the report.
NPU_ENV = (
    "TASK_QUEUE_ENABLE",
    "PYTORCH_NPU_ALLOC_CONF",
    "CPU_AFFINITY_CONF",
    "ASCEND_LAUNCH_BLOCKING",
    "HCCL_BUFFSIZE",
    "ASCEND_RT_VISIBLE_DEVICES",
)
SCHEMA = 1
# Relative difference of the final training loss vs fp32 that still counts as parity. Low precision changes the
# rounding of every step; after the short runs here bf16 (8-bit mantissa) stays well inside 5 %.
PARITY_TOLERANCE = 0.05
# A mode's step time over its runs: p90 above this multiple of p10 means something else ran on the host meanwhile (a
# quiet host stays well inside 1.5x here: only the machine, not the code, varies between runs of the same seed).
SPREAD_BOUND = 1.5


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__.split("\n\n", 1)[1],
    )
    p.add_argument("--device", default="auto", choices=("auto", *device_adapter.KINDS))
    p.add_argument("--model", default="all", choices=("all", *models.MODELS))
    p.add_argument(
        "--modes", default=",".join(MODES), help="comma-separated subset of " + ",".join(MODES)
    )
    p.add_argument(
        "--scale",
        type=float,
        default=None,
        help="model/batch size factor (default: 1 npu/cuda; cpu 0.25, qwen3-moe 0.05)",
    )
    p.add_argument(
        "--warmup",
        type=int,
        default=3,
        help="untimed steps at the start of each run, the first timed on its own (at least 1)",
    )
    p.add_argument(
        "--repeats",
        type=int,
        default=5,
        help="whole runs per mode: a fresh model and optimizer from --seed, its own warm-up, then --steps "
        "timed steps (median and spread over the runs)",
    )
    p.add_argument("--steps", type=int, default=5, help="timed optimizer steps per run")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    p.add_argument(
        "--tolerance", type=float, default=PARITY_TOLERANCE, help="loss parity tolerance (relative)"
    )
    p.add_argument("--out", default="bench-results", help="directory for results.json/.md/.png")
    p.add_argument(
        "--label", default=None, help="name of this run in --compare tables (default: the device)"
    )
    p.add_argument(
        "--nproc", type=int, default=1, help="processes (devices) through torchrun + DDP"
    )
    p.add_argument(
        "--compare", nargs="+", metavar="JSON", help="render earlier results side by side"
    )
    p.add_argument("--no-png", action="store_true", help="skip the chart")
    p.add_argument(
        "--optimizers",
        default=",".join(OPTIMIZERS),
        help="optimizer arms (fp32, same steps), comma-separated subset of "
        + ",".join(OPTIMIZERS)
        + ", or none",
    )
    p.add_argument(
        "--peak",
        default="auto",
        choices=("auto", "table", "measure"),
        help="device peak FLOP/s: the table for known accelerators and a GEMM sweep for the rest (auto), "
        "the table only, or always measured",
    )
    p.add_argument(
        "--gemm-sizes",
        default=",".join(map(str, peaks.SWEEP_SIZES)),
        help="matrix sizes of the peak GEMM sweep",
    )
    p.add_argument(
        "--hf32",
        default="default",
        choices=("default", "on", "off"),
        help="NPU only: torch.npu.matmul.allow_hf32 for the fp32 arm (torch_npu's default: off)",
    )
    p.add_argument(
        "--combine-grad",
        action="store_true",
        help="apex-O1/O2: amp.initialize(..., combine_grad=True) (Ascend apex: one fused gradient buffer)",
    )
    p.add_argument(
        "--jit-compile",
        default="default",
        choices=("default", "on", "off"),
        help="NPU only: torch.npu.set_compile_mode(jit_compile=...)",
    )
    args = p.parse_args(argv)
    args.optimizers = (
        []
        if args.optimizers.strip() == "none"
        else [o.strip() for o in args.optimizers.split(",") if o.strip()]
    )
    bad = [o for o in args.optimizers if o not in OPTIMIZERS]
    if bad:
        p.error(f"unknown optimizer {bad[0]!r}; choose from {', '.join(OPTIMIZERS)} or none")
    try:
        args.gemm_sizes = [int(n) for n in args.gemm_sizes.split(",")]
    except ValueError:
        p.error(f"--gemm-sizes takes comma-separated integers, not {args.gemm_sizes!r}")
    if args.scale is not None and args.scale <= 0:
        p.error(f"--scale must be > 0, not {args.scale}")
    args.modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    unknown = [m for m in args.modes if m not in MODES]
    if unknown:
        p.error(f"unknown mode {unknown[0]!r}; choose from {', '.join(MODES)}")
    if "fp32" not in args.modes:
        args.modes.insert(0, "fp32")  # the reference every ratio is computed against
    if min(args.repeats, args.steps) < 1 or args.warmup < 0 or args.nproc < 1:
        p.error("--repeats and --steps must be >= 1, --warmup >= 0, --nproc >= 1")
    return args


# --- distributed ---------------------------------------------------------------------------------------------------


def world() -> tuple[int, int]:
    return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))


def init_distributed(device: device_adapter.Device) -> None:
    backend = {"cpu": "gloo", "cuda": "nccl", "npu": "hccl"}[device.kind]
    torch.distributed.init_process_group(backend=backend)


def all_max(value: float, device: device_adapter.Device) -> float:
    if world()[1] == 1:
        return value
    tensor = torch.tensor([value], dtype=torch.float64, device=device.torch_device)
    torch.distributed.all_reduce(tensor, op=torch.distributed.ReduceOp.MAX)
    return float(tensor.item())


# --- one mode ------------------------------------------------------------------------------------------------------


def apex_status(device: device_adapter.Device) -> tuple[bool, str]:
    if device.kind == "cpu":
        return False, "apex.amp runs on NPU/GPU only; use autocast-* modes on cpu"
    try:
        from apex import amp  # noqa: F401
    except Exception as exc:
        text = str(exc).splitlines()[0] if str(exc) else exc.__class__.__name__
        return False, f"apex not importable ({text}); install the apexkit wheel into this venv"
    return True, ""


AUTOCAST_MODES = {"autocast-fp16": torch.float16, "autocast-bf16": torch.bfloat16}


def mode_status(mode: str, device: device_adapter.Device) -> tuple[bool, str]:
    """Whether this torch on this device can run the mode, and why not (one line)."""
    if mode.startswith("apex-"):
        return apex_status(device)
    dtype = AUTOCAST_MODES.get(mode)
    if mode == "bf16":
        return bf16_status(device)
    if dtype is None:
        return True, ""
    if dtype == torch.bfloat16 and device.kind == "cuda" and not torch.cuda.is_bf16_supported():
        return False, "this GPU has no bf16"
    if not device.autocast_support(dtype)["ok"]:
        return False, device.unsupported_autocast(dtype)
    if (
        dtype == torch.float16
    ):  # fp16 trains with a loss scaler; without one the comparison would be unfair
        scaler = device.grad_scaler_support()
        if not scaler["ok"]:
            return False, scaler["reason"]
    return True, ""


def bf16_status(device: device_adapter.Device) -> tuple[bool, str]:
    """Whether a bfloat16 Linear runs forward and backward here (pure bf16 training: weights and activations)."""
    try:
        layer = torch.nn.Linear(8, 8).to(device.torch_device, torch.bfloat16)
        layer(
            torch.ones(2, 8, device=device.torch_device, dtype=torch.bfloat16)
        ).float().sum().backward()
    except Exception as exc:
        return (
            False,
            f"this {device.kind} has no bfloat16 Linear ({device_adapter.first_line(exc)})",
        )
    return True, ""


def _quantile(values: list, fraction: float) -> float:
    """Linear interpolation between the closest ranks (numpy's default)."""
    ordered = sorted(values)
    pos = (len(ordered) - 1) * fraction
    low = int(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def olympic_mean(values: list) -> float:
    """MLPerf's: the mean without the fastest and the slowest run (plain mean below 3 runs)."""
    ordered = sorted(values)
    if len(ordered) >= 3:
        ordered = ordered[1:-1]
    return sum(ordered) / len(ordered)


def grad_norm(optimizer) -> float:
    """L2 norm of the gradients the optimizer stepped with (unscaled: GradScaler.step and apex unscale first)."""
    total = 0.0
    for group in optimizer.param_groups:
        for param in group["params"]:
            if param.grad is not None:
                total += float(param.grad.detach().float().pow(2).sum())
    return total**0.5


def loss_scale_of(scaler, amp) -> float | None:
    if scaler is not None:
        return float(scaler.get_scale())
    if amp is not None:
        with contextlib.suppress(Exception):
            from apex.amp._amp_state import _amp_state

            return float(_amp_state.loss_scalers[0].loss_scale())
    return None


def scale_of(name: str, args) -> float:
    """--scale, or this model's own default where --scale was not given."""
    return getattr(args, "model_scales", {}).get(name, args.scale)


def timed_run(step, args, device: device_adapter.Device) -> tuple[float, float]:
    """One whole run's timing: (first step ms, ms per timed step). The first step (kernel selection, NPU operator
    compilation, allocator growth) is timed on its own; the rest of --warmup is untimed; then --steps steps between
    two device-synchronised timestamps (the slowest rank's time under DDP)."""
    start = device.now()
    step()
    first_ms = all_max(device.now() - start, device) * 1000
    for _ in range(max(0, args.warmup - 1)):
        step()
    start = device.now()  # synchronises: nothing queued before is counted
    for _ in range(args.steps):
        step()
    return first_ms, all_max(device.now() - start, device) / args.steps * 1000


def run_stats(step_ms: list) -> dict:
    """Statistics over the runs' ms per step: median (the headline), min-max, IQR, p10/p90, olympic mean."""
    ordered = sorted(step_ms)
    median = statistics.median(ordered)
    q = statistics.quantiles(ordered, n=4) if len(ordered) > 1 else [median, median, median]
    return {
        "step_ms_median": round(median, 4),
        "step_ms_min": round(ordered[0], 4),
        "step_ms_max": round(ordered[-1], 4),
        "step_ms_iqr": round(q[2] - q[0], 4),
        "step_ms_p10": round(_quantile(ordered, 0.1), 4),
        "step_ms_p90": round(_quantile(ordered, 0.9), 4),
        "step_ms_olympic_mean": round(olympic_mean(ordered), 4),
    }


def _unpatch_apex() -> None:
    """apex O1 patches torch functions at every amp.initialize; undo it so the next run starts from plain torch."""
    with contextlib.suppress(Exception):
        from apex.amp._amp_state import _amp_state

        handle = getattr(_amp_state, "handle", None)
        if handle is not None and hasattr(handle, "_deactivate"):
            handle._deactivate()


def one_run(name: str, mode: str, args, device: device_adapter.Device) -> dict:
    """One whole run of a mode: a fresh model and optimizer from --seed (the same weights and data every run and
    every mode), its own warm-up, then --steps timed steps. bf16 keeps fp32 master weights as MindSpeed's --bf16
    does: the model (forward, backward, gradients) is bfloat16, AdamW steps float32 copies of the parameters (its
    state float32 too), and the bf16 parameters are overwritten with the rounded masters after every step."""
    model, sizes, (x, y), loss_fn, tokens_per_sample = models.build(
        name, scale_of(name, args), args.seed
    )
    inner = model
    if mode == "bf16":
        model = model.to(torch.bfloat16)
        x = x.to(torch.bfloat16) if x.is_floating_point() else x
    model = model.to(device.torch_device)
    x, y = x.to(device.torch_device), y.to(device.torch_device)
    params = list(model.parameters())
    master = None
    if mode == "bf16":
        master = [torch.nn.Parameter(p.detach().to(torch.float32, copy=True)) for p in params]
        optimizer = torch.optim.AdamW(master, lr=1e-4)
    else:
        optimizer = torch.optim.AdamW(params, lr=1e-4)
    dtype = AUTOCAST_MODES.get(mode)
    scaler = device.grad_scaler(mode == "autocast-fp16")
    amp = None
    if mode.startswith("apex-"):
        from apex import amp

        extra = (
            {"combine_grad": True} if args.combine_grad else {}
        )  # Ascend apex's keyword; NVIDIA apex has none
        model, optimizer = amp.initialize(
            model, optimizer, opt_level=mode.split("-")[1], verbosity=0, **extra
        )
    if (
        world()[1] > 1 and master is None
    ):  # bf16 reduces its fp32 master gradients itself (below), as Megatron does
        ids = None if device.kind == "cpu" else [device.index]
        model = torch.nn.parallel.DistributedDataParallel(model, device_ids=ids)
    scales, losses, counts = [], [], []

    def to_master() -> None:
        """bf16 gradients -> the fp32 masters' gradients; under DDP all-reduced (averaged) in fp32, one flat buffer,
        as Megatron/MindSpeed's --bf16 (accumulate_allreduce_grads_in_fp32); torch 2.1's gloo refuses bf16 anyway."""
        for main, param in zip(master, params):
            main.grad = None if param.grad is None else param.grad.detach().float()
        if world()[1] > 1:
            grads = [
                main.grad for main in master if main.grad is not None
            ]  # every rank has the same batch
            flat = torch.cat([g.flatten() for g in grads])
            torch.distributed.all_reduce(flat)
            flat /= world()[1]
            for g, part in zip(grads, flat.split([g.numel() for g in grads])):
                g.copy_(part.view_as(g))

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        if master is not None:
            model.zero_grad(set_to_none=True)
        with device.autocast(dtype):
            loss = loss_fn(model(x), y)
        if scaler is not None:
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
        elif amp is not None:
            with amp.scale_loss(loss, optimizer) as scaled:
                scaled.backward()
            optimizer.step()
        else:
            loss.backward()
            if master is not None:
                to_master()
            optimizer.step()
            if master is not None:
                with torch.no_grad():
                    for main, param in zip(master, params):
                        param.copy_(main)
        losses.append(loss.detach())
        scale = loss_scale_of(scaler, amp)
        if scale is not None:
            scales.append(scale)
        if getattr(inner, "expert_counts", None) is not None:
            counts.append(inner.expert_counts)

    try:
        first_ms, step_ms = timed_run(step, args, device)
    finally:
        if amp is not None:
            _unpatch_apex()
    return {
        "first_step_ms": first_ms,
        "step_ms": step_ms,
        "final_loss": float(losses[-1].float().item()),
        "final_grad_norm": grad_norm(optimizer),
        "scales": scales,
        "routing": None
        if not counts
        else {"first_step": counts[0].cpu().tolist(), "last_step": counts[-1].cpu().tolist()},
        "sizes": sizes,
        "tokens_per_sample": tokens_per_sample,
    }


def run_mode(name: str, mode: str, args, device: device_adapter.Device) -> dict:
    """--repeats whole runs of the mode (one_run); step time statistics over the runs; loss, gradient norm, routing
    and loss scale from the first run (each run's own loss and gradient norm are kept in `runs`)."""
    device.reset_peak_memory()
    runs = [one_run(name, mode, args, device) for _ in range(args.repeats)]
    first = runs[0]
    stats = run_stats([r["step_ms"] for r in runs])
    median = stats["step_ms_median"]
    sizes = first["sizes"]
    batch = sizes["batch"] * world()[1]
    scales = first["scales"]
    skipped = sum(
        1 for a, b in zip(scales, scales[1:]) if b < a
    )  # a scaler halves its scale on a skipped step
    losses = [r["final_loss"] for r in runs]
    return {
        "mode": mode,
        "status": "ok",
        "compute_dtype": COMPUTE_DTYPE[mode],
        "master_weights": "float32" if mode in ("bf16", "apex-O2") else None,
        "first_step_ms": round(first["first_step_ms"], 4),
        **stats,
        "runs": [
            {
                "first_step_ms": round(r["first_step_ms"], 4),
                "step_ms": round(r["step_ms"], 4),
                "final_loss": r["final_loss"],
                "final_grad_norm": r["final_grad_norm"],
            }
            for r in runs
        ],
        "final_loss_spread_across_runs": round(
            (max(losses) - min(losses)) / max(abs(losses[0]), 1e-12), 8
        ),
        "final_grad_norm": first["final_grad_norm"],
        "peak_memory_reserved_bytes": device.peak_memory_reserved_bytes(),
        "loss_scale": None
        if not scales
        else {
            "trajectory": scales,
            "skipped_steps": skipped,
            "skipped_steps_per_run": [
                sum(1 for a, b in zip(r["scales"], r["scales"][1:]) if b < a) for r in runs
            ],
        },
        "routing": first["routing"],
        "samples_per_s": round(batch / (median / 1000), 2),
        "tokens_per_s": round(batch * first["tokens_per_sample"] / (median / 1000), 1)
        if first["tokens_per_sample"] > 1
        else None,
        "peak_memory_bytes": device.peak_memory_bytes(),
        "final_loss": first["final_loss"],
        "sizes": sizes,
        "timed_steps": args.repeats * args.steps,
        "steps_per_run": max(1, args.warmup) + args.steps,
    }


# --- optimizer arms ------------------------------------------------------------------------------------------------


def optimizer_factory(arm: str, device: device_adapter.Device):
    """(factory(params) -> optimizer, None) or (None, why not here). weight_decay 0: apex's NpuFusedAdam is Adam
    (L2 decay), the others AdamW (decoupled); without decay all four compute the same update."""
    common = {"lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.0}
    if arm == "torch-adamw":
        return (lambda params: torch.optim.AdamW(params, **common)), None
    if arm == "torch-adamw-fused":
        try:  # torch's fused AdamW: CUDA since 2.0, CPU since 2.4; the device says by trying
            param = torch.nn.Parameter(torch.ones(4, device=device.torch_device))
            param.grad = torch.ones_like(param)
            torch.optim.AdamW([param], fused=True, **common).step()
        except Exception as exc:
            return (
                None,
                f"torch {device_adapter.torch_version()} has no fused AdamW on {device.kind} "
                f"({device_adapter.first_line(exc)})",
            )
        return (lambda params: torch.optim.AdamW(params, fused=True, **common)), None
    if (
        arm == "apex-fused-adam"
    ):  # NVIDIA apex on CUDA (apexkit build --backend cuda): multi-tensor amp_C kernels
        if device.kind != "cuda":
            return None, f"apex.optimizers.FusedAdam runs on CUDA only (device is {device.kind})"
        try:  # NVIDIA apex's API, not Ascend apex's: imported by name, so `nox -s contracts` (which checks bench/
            # against Ascend apex trees and torch_npu wheels) does not hold it against them
            import importlib

            FusedAdam = importlib.import_module("apex.optimizers").FusedAdam
        except Exception as exc:
            return (
                None,
                f"not importable ({device_adapter.first_line(exc)}); install the CUDA wheel "
                "(apexkit build --backend cuda)",
            )
        return (lambda params: FusedAdam(params, adam_w_mode=True, **common)), None
    if device.kind != "npu":
        what = (
            "torch_npu.optim.NpuFusedAdamW"
            if arm == "npu-fused-adamw"
            else "apex.optimizers.NpuFusedAdam"
        )
        return None, f"{what} runs on NPU only (device is {device.kind})"
    try:
        if arm == "npu-fused-adamw":
            from torch_npu.optim import NpuFusedAdamW as fused
        else:
            from apex.optimizers import NpuFusedAdam as fused
    except Exception as exc:
        return (
            None,
            f"not importable ({device_adapter.first_line(exc)}); install torch_npu / the apexkit wheel",
        )
    return (lambda params: fused(params, **common)), None


def train_with(factory, name: str, args, device: device_adapter.Device):
    """One whole run for one optimizer (a fresh fp32 model from --seed, its warm-up, --steps timed steps):
    (first step ms, ms per timed step, parameters before, parameters after)."""
    model, _, (x, y), loss_fn, _ = models.build(name, scale_of(name, args), args.seed)
    model = model.to(device.torch_device)
    x, y = x.to(device.torch_device), y.to(device.torch_device)
    initial = torch.cat([p.detach().flatten().float().cpu() for p in model.parameters()])
    optimizer = factory(list(model.parameters()))

    def step():
        optimizer.zero_grad(set_to_none=True)
        loss_fn(model(x), y).backward()
        optimizer.step()

    first_ms, step_ms = timed_run(step, args, device)
    return (
        first_ms,
        step_ms,
        initial,
        torch.cat([p.detach().flatten().float().cpu() for p in model.parameters()]),
    )


def run_optimizers(name: str, args, device: device_adapter.Device) -> list[dict]:
    """Each arm trains the same fp32 model on the same data for the same steps, --repeats whole runs: step time over
    the runs, and the parameters after the first run vs torch AdamW's (max |difference| and the difference relative
    to AdamW's own update)."""
    rows, reference = [], None
    for arm in args.optimizers:
        factory, why = optimizer_factory(arm, device)
        if factory is None:
            rows.append({"optimizer": arm, "status": "skipped", "reason": why})
            continue
        try:
            runs = [train_with(factory, name, args, device) for _ in range(args.repeats)]
        except Exception as exc:
            rows.append(
                {"optimizer": arm, "status": "failed", "reason": device_adapter.first_line(exc)}
            )
            continue
        first_ms, _, initial, final = runs[0]
        row = {
            "optimizer": arm,
            "status": "ok",
            "first_step_ms": round(first_ms, 4),
            **run_stats([r[1] for r in runs]),
            "runs": [{"first_step_ms": round(r[0], 4), "step_ms": round(r[1], 4)} for r in runs],
            "steps": max(1, args.warmup) + args.steps,
        }
        del runs
        if arm == "torch-adamw":
            reference = (initial, final)
        if reference is not None:
            update = (reference[1] - reference[0]).norm().item()
            row["param_max_abs_diff_vs_adamw"] = float((final - reference[1]).abs().max())
            row["param_rel_diff_vs_adamw_update"] = round(
                (final - reference[1]).norm().item() / max(update, 1e-30), 8
            )
            row["parity_ok"] = row["param_rel_diff_vs_adamw_update"] <= args.tolerance
            row["speedup_vs_adamw"] = round(
                next(r for r in [*rows, row] if r["optimizer"] == "torch-adamw")["step_ms_median"]
                / row["step_ms_median"],
                3,
            )
        rows.append(row)
    return rows


def harness_overhead(name: str, args, device: device_adapter.Device) -> dict:
    """The timing harness (synchronised timestamps around each run's timed steps) vs one bare loop of the same steps."""
    model, _, (x, y), loss_fn, _ = models.build(name, scale_of(name, args), args.seed)
    model = model.to(device.torch_device)
    x, y = x.to(device.torch_device), y.to(device.torch_device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step():
        optimizer.zero_grad(set_to_none=True)
        loss_fn(model(x), y).backward()
        optimizer.step()

    for _ in range(args.warmup):
        step()
    total = args.repeats * args.steps
    bare_runs, harness_runs = [], []
    for _ in range(3):  # alternate, so drift in machine load hits both the same way
        start = device.now()
        for _ in range(total):
            step()
        bare_runs.append(device.now() - start)
        harnessed = 0.0
        for _ in range(args.repeats):
            begin = device.now()
            for _ in range(args.steps):
                step()
            harnessed += device.now() - begin
        harness_runs.append(harnessed)
    bare, harnessed = statistics.median(bare_runs), statistics.median(harness_runs)
    return {
        "bare_s": round(bare, 5),
        "harness_s": round(harnessed, 5),
        "overhead_pct": round((harnessed - bare) / bare * 100, 2),
        "alternations": 3,
    }


def routing_drift(counts: list, ref: list) -> float:
    """Fraction of top-k assignments that went to another expert than in fp32 (histograms, so a lower bound)."""
    return sum(abs(a - b) for a, b in zip(counts, ref)) / 2 / max(1, sum(ref))


def add_mfu(name: str, results: list[dict], sizes: dict, device_peak: dict) -> None:
    """flops_per_step, mfu (or None + mfu_reason) and the device's peak ratio vs fp32 for each ran mode."""
    step_flops = flops.flops_per_step(name, sizes) * world()[1]
    fp32_peak = device_peak["dtypes"]["float32"]["flops"]
    for r in results:
        if r["status"] != "ok":
            continue
        peak = device_peak["dtypes"][r["compute_dtype"]]
        r["flops_per_step"] = step_flops
        r["mfu"] = flops.mfu(
            step_flops, r["step_ms_median"] / 1000, peak["flops"] and peak["flops"] * world()[1]
        )
        r["mfu_reason"] = (
            None
            if r["mfu"] is not None
            else f"no peak for {r['compute_dtype']} on this device ({peak.get('reason', 'unknown')})"
        )
        r["mfu"] = None if r["mfu"] is None else round(r["mfu"], 6)
        r["peak_ratio_vs_fp32"] = (
            round(peak["flops"] / fp32_peak, 3) if peak["flops"] and fp32_peak else None
        )


def finish(results: list[dict], tolerance: float) -> None:
    ref = next((r for r in results if r["mode"] == "fp32" and r["status"] == "ok"), None)
    for r in results:
        if ref is None and r["status"] == "ok":  # no reference: the ratios cannot be computed
            r.update(
                speedup_vs_fp32=None,
                memory_ratio_vs_fp32=None,
                loss_rel_diff_vs_fp32=None,
                parity_ok=None,
                grad_norm_rel_diff_vs_fp32=None,
                routing_drift_vs_fp32=None,
            )
            continue
        if r["status"] != "ok":
            continue
        r["speedup_vs_fp32"] = round(ref["step_ms_median"] / r["step_ms_median"], 3)
        ref_memory = ref["peak_memory_bytes"]
        r["memory_ratio_vs_fp32"] = (
            round(r["peak_memory_bytes"] / ref_memory, 3) if ref_memory else None
        )
        diff = abs(r["final_loss"] - ref["final_loss"]) / max(abs(ref["final_loss"]), 1e-12)
        r["loss_rel_diff_vs_fp32"] = round(diff, 6)
        gdiff = abs(r["final_grad_norm"] - ref["final_grad_norm"]) / max(
            abs(ref["final_grad_norm"]), 1e-12
        )
        r["grad_norm_rel_diff_vs_fp32"] = round(gdiff, 6)
        r["parity_ok"] = diff <= tolerance
        r["grad_norm_parity_ok"] = gdiff <= tolerance
        if r.get("routing") and ref.get("routing"):
            r["routing_drift_vs_fp32"] = {
                step: round(routing_drift(r["routing"][step], ref["routing"][step]), 6)
                for step in ("first_step", "last_step")
            }


# --- reporting -----------------------------------------------------------------------------------------------------


def _mib(n) -> str:
    return "-" if n is None else f"{n / 2**20:.0f} MiB"


def headline(report: dict) -> str:
    parts = []
    for name, entry in report["models"].items():
        ok = [r for r in entry["results"] if r["status"] == "ok"]
        ref = next((r for r in ok if r["mode"] == "fp32"), None)
        amp = max(
            (r for r in ok if r["mode"] != "fp32" and r["speedup_vs_fp32"] is not None),
            key=lambda r: r["speedup_vs_fp32"],
            default=None,
        )
        if ref and amp:
            parts.append(
                f"{name} on {report['device']['kind']}: fp32 {ref['step_ms_median']:.1f} ms/step, "
                f"{amp['mode']} {amp['step_ms_median']:.1f} ms/step, {amp['speedup_vs_fp32']:.2f}×"
            )
    return "; ".join(parts) or "no mixed-precision mode ran"


def markdown(report: dict) -> str:
    d = report["device"]
    wheel = f"wheel {report['target']}, " if report.get("target") else ""
    lines = [
        f"**{report['label']}** — {wheel}{d['kind']} ({d['name']}), torch {report['versions']['torch']}, "
        f"Python {report['versions']['python']}, "
        f"{report['config']['nproc']} process(es), {report['config']['repeats']} whole runs per mode (a fresh model "
        f"from the seed, {max(1, report['config']['warmup'])} warm-up step(s), then {report['config']['steps']} "
        f"timed steps); memory = {d['memory']}"
    ]
    caps = report.get("capabilities")
    if caps:
        autocast = ", ".join(
            f"{name} {'yes' if c['ok'] else 'no'}" for name, c in caps["autocast"].items()
        )
        lines.append(
            f"this torch on {d['kind']}: autocast {autocast}; GradScaler "
            f"{caps['grad_scaler']['via'] or 'none'}"
        )
    peak = report.get("device_peak")
    if peak:
        lines.append(
            f"device peak ({peak['device']}; fp32 arm runs as {peak['fp32_kind']}): "
            + "; ".join(
                f"{dtype} "
                + (
                    f"{p['flops'] / 1e9:,.1f} GFLOP/s ({p['source'].split(':')[0]})"
                    if p["flops"]
                    else "unknown"
                )
                for dtype, p in peak["dtypes"].items()
            )
        )
        lines.append(f"FLOPs convention: {report.get('flops_convention', '-')}")
    lines.append("")
    lines.append(
        "| model | mode | step (median) | spread (min–max) | p10–p90 | olympic mean | first step | samples/s | "
        "tokens/s | peak memory | speedup | device peak ratio | MFU | memory vs fp32 | loss Δ vs fp32 | "
        "grad-norm Δ |"
    )
    lines.append("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for name, entry in report["models"].items():
        for r in entry["results"]:
            if r["status"] != "ok":
                lines.append(f"| {name} | {r['mode']} | {r['status']}: {r['reason']} |" + " |" * 13)
                continue
            if r["loss_rel_diff_vs_fp32"] is None:
                parity, speedup, gparity = "-", "-", "-"
            else:
                parity = f"{r['loss_rel_diff_vs_fp32'] * 100:.2f} %" + (
                    "" if r["parity_ok"] else " ✗"
                )
                gparity = f"{r['grad_norm_rel_diff_vs_fp32'] * 100:.2f} %" + (
                    "" if r["grad_norm_parity_ok"] else " ✗"
                )
                speedup = f"{r['speedup_vs_fp32']:.2f}×"
            mfu = "-" if r.get("mfu") is None else f"{r['mfu'] * 100:.1f} %"
            ratio = (
                "-" if r.get("peak_ratio_vs_fp32") is None else f"{r['peak_ratio_vs_fp32']:.2f}×"
            )
            lines.append(
                f"| {name} | {r['mode']} | {r['step_ms_median']:.2f} ms | {r['step_ms_min']:.2f}–{r['step_ms_max']:.2f} ms | "
                f"{r['step_ms_p10']:.2f}–{r['step_ms_p90']:.2f} ms | {r['step_ms_olympic_mean']:.2f} ms | "
                f"{r['first_step_ms']:.0f} ms | {r['samples_per_s']:.1f} | {r['tokens_per_s'] or '-'} | "
                f"{_mib(r['peak_memory_bytes'])} | {speedup} | {ratio} | {mfu} | {r['memory_ratio_vs_fp32'] or '-'} | "
                f"{parity} | {gparity} |"
            )
    lines += [
        "",
        f"speedup vs device peak ratio: the peak ratio is the device's FLOP/s in the mode's compute dtype over "
        f"its fp32 FLOP/s, the most AMP can gain on matmuls here; parity: final loss and grad norm within "
        f"{report['config']['tolerance']:.0%} (relative) of fp32's, the rule of Ascend apex's L1 tests "
        f"(tests/L1/common/compare_npu.py).",
    ]
    over = [
        f"{name} {r['mode']}"
        for name, entry in report["models"].items()
        for r in entry["results"]
        if r["status"] == "ok" and (r.get("mfu") or 0) > 1
    ]
    if over:
        lines.append(
            f"- MFU above 100 % ({', '.join(over)}): the measured peak is below what the run reached (the "
            "GEMM sweep ran under load, or its sizes were too small): rerun on a quiet machine or widen "
            "--gemm-sizes"
        )
    if any(
        r["status"] == "ok" and r["mode"] == "bf16"
        for entry in report["models"].values()
        for r in entry["results"]
    ):
        lines.append(
            "- bf16: the model (forward, backward, gradients) in bfloat16; AdamW steps float32 master copies "
            "of the parameters (its state float32), copied back after every step, as MindSpeed-LLM's --bf16"
        )
    for name, entry in report["models"].items():
        timed = [r for r in entry["results"] if r["status"] == "ok" and r.get("runs")]
        if timed:
            lines += [
                "",
                f"{name}: ms per timed step of each run (statistics above are over these runs) and each run's "
                "first step (run 1's includes compilation / kernel selection)",
                "",
                "| mode | ms/step per run | first step per run | final loss spread over runs |",
                "|---|---|---|---|",
            ]
            for r in timed:
                per_run = ", ".join(format(x["step_ms"], ".2f") for x in r["runs"])
                firsts = ", ".join(format(x["first_step_ms"], ".0f") for x in r["runs"])
                lines.append(
                    f"| {r['mode']} | {per_run} | {firsts} ms | "
                    f"{r.get('final_loss_spread_across_runs', 0) * 100:.4f} % |"
                )
        scaled = [r for r in entry["results"] if r["status"] == "ok" and r.get("loss_scale")]
        for r in scaled:
            trajectory = r["loss_scale"]["trajectory"]
            lines.append(
                f"- {name} {r['mode']} loss scale: {trajectory[0]:g} → {trajectory[-1]:g} over "
                f"{len(trajectory)} steps, {r['loss_scale']['skipped_steps']} skipped (overflow)"
            )
        routed = [r for r in entry["results"] if r["status"] == "ok" and r.get("routing")]
        if routed:
            lines += [
                "",
                f"{name}: tokens per expert (top-k slots), first and last step; drift = share of "
                "assignments that moved vs fp32",
                "",
                "| mode | first step | last step | drift first / last |",
                "|---|---|---|---|",
            ]
            for r in routed:
                drift = r.get("routing_drift_vs_fp32") or {}
                said = (
                    "-"
                    if not drift
                    else f"{drift['first_step'] * 100:.2f} % / {drift['last_step'] * 100:.2f} %"
                )
                lines.append(
                    f"| {r['mode']} | {r['routing']['first_step']} | {r['routing']['last_step']} | {said} |"
                )
        if entry.get("optimizers"):
            lines += [
                "",
                f"{name}: optimizer arms (fp32, the same steps; parity = parameter difference vs torch "
                "AdamW relative to AdamW's own update)",
                "",
                "| optimizer | step (median) | spread | first step | speedup vs AdamW | max abs Δparam | "
                "Δ / update |",
                "|---|---|---|---|---|---|---|",
            ]
            for r in entry["optimizers"]:
                if r["status"] != "ok":
                    lines.append(f"| {r['optimizer']} | {r['status']}: {r['reason']} | | | | | |")
                    continue
                rel = r.get("param_rel_diff_vs_adamw_update")
                lines.append(
                    f"| {r['optimizer']} | {r['step_ms_median']:.2f} ms | {r['step_ms_min']:.2f}–"
                    f"{r['step_ms_max']:.2f} ms | {r['first_step_ms']:.0f} ms | "
                    f"{r.get('speedup_vs_adamw', '-')}× | {r.get('param_max_abs_diff_vs_adamw', 0):.2e} | "
                    + ("-" if rel is None else f"{rel:.2e}" + ("" if r["parity_ok"] else " ✗"))
                    + " |"
                )
    env = report.get("environment")
    if env:
        lines += [
            "",
            "environment: "
            + ", ".join(f"{k} {v}" for k, v in env.items() if k != "env")
            + "; env "
            + (
                ", ".join(f"{k}={v}" for k, v in env["env"].items() if v is not None)
                or "none of " + "/".join(env["env"]) + " set"
            ),
        ]
    host = report.get("host", {})
    if host.get("load_avg_start") is not None:
        lines += [
            "",
            f"host: {host.get('cpu')}, {host.get('cores')} cores, {host.get('torch_threads')} torch threads; "
            f"load average (1/5/15 min) {host['load_avg_start']} at start, {host.get('load_avg_end')} at end",
        ]
    check = report.get("loaded_host")
    if check:
        lines.append(
            f"**loaded host**: {'; '.join(check['reasons'])}: the timings are not those of a quiet machine"
            if check["loaded"]
            else f"quiet host: 1-minute load within the cores at start and end, p90/p10 within "
            f"{check['spread_bound_p90_p10']}× for every mode"
        )
    overhead = report.get("harness_overhead")
    if overhead:
        lines += [
            "",
            f"Timing harness vs bare loop ({overhead['model']}, fp32): {overhead['harness_s']:.3f} s vs "
            f"{overhead['bare_s']:.3f} s = {overhead['overhead_pct']:+.2f} %",
        ]
    lines += ["", report["headline"]]
    return "\n".join(lines) + "\n"


# One colour per mode, the same in every panel and every chart (a colour-blind-safe set; skipped slots are grey).
MODE_COLOURS = {
    "fp32": "#4c72b0",
    "apex-O1": "#dd8452",
    "apex-O2": "#c44e52",
    "autocast-fp16": "#55a868",
    "autocast-bf16": "#8172b3",
    "bf16": "#937860",
}
TITLE_WIDTH = 95  # characters per line of the chart's headline (wrapped at words; at most 2 lines)


def chart_title(report: dict, width: int = TITLE_WIDTH) -> str:
    """The chart's title: the label and device; the wheel's target id, the machine and a loaded-host flag where the
    report has them; then the headline wrapped at words on at most two more lines of `width` characters; a longer
    headline ends with "… (full text in results.md)" at a word, never mid-word."""
    import textwrap

    d, host = report["device"], report.get("host") or {}
    first = f"{report.get('label', 'bench')} on {d['kind']} ({d.get('name', '')})".replace(
        " ()", ""
    )
    machine = [
        f"wheel {report['target']}" if report.get("target") else "",
        f"host {host['hostname']} ({host.get('machine')}, {host.get('cores')} cores)"
        if host.get("hostname")
        else "",
        "LOADED HOST (results.md)" if (report.get("loaded_host") or {}).get("loaded") else "",
    ]
    lines = textwrap.wrap(
        report["headline"],
        width,
        break_long_words=False,
        break_on_hyphens=False,
        max_lines=2,
        placeholder=" … (full text in results.md)",
    )
    second = textwrap.wrap(" · ".join(w for w in machine if w), width, break_long_words=False)
    return "\n".join([first, *second, *lines])


def _memory_mib(r: dict):
    n = r.get("peak_memory_bytes") if r.get("status") == "ok" else None
    return None if not isinstance(n, (int, float)) or isinstance(n, bool) else n / 2**20


def figure(report: dict):
    """The chart as a matplotlib figure (Agg): per model, step time per mode (median bar, min-max error bar, the
    speedup and MFU above the cap) and, under it, peak memory per mode where measured. A skipped or failed mode
    keeps its slot: hatched, with its reason. Each artist of a skipped slot has the gid "skipped:<model>:<mode>"."""
    import textwrap

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(report["models"])
    memory_kind = report["device"].get("memory", "peak memory")
    fig, axes = plt.subplots(
        2,
        len(names),
        figsize=(max(6.5, 5.5 * len(names)), 7.2),
        squeeze=False,
        gridspec_kw={"height_ratios": [3, 2]},
    )
    for col, name in enumerate(names):
        ax, mem = axes[0][col], axes[1][col]
        results = report["models"][name]["results"]
        slots = list(range(len(results)))
        modes = [r["mode"] for r in results]
        ok = [(i, r) for i, r in zip(slots, results) if r["status"] == "ok"]
        top = max((r["step_ms_max"] for _, r in ok), default=1.0) or 1.0
        ax.set_ylim(0, top * 1.35)  # room above the tallest cap for its label
        for i, r in ok:
            colour = MODE_COLOURS.get(r["mode"], "#777777")
            err = [
                [r["step_ms_median"] - r["step_ms_min"]],
                [r["step_ms_max"] - r["step_ms_median"]],
            ]
            ax.bar(
                i,
                r["step_ms_median"],
                color=colour,
                width=0.7,
                yerr=err,
                capsize=4,
                error_kw={"elinewidth": 1, "ecolor": "#333333"},
            )
            label = (
                "reference"
                if r["mode"] == "fp32"
                else ("-" if r.get("speedup_vs_fp32") is None else f"{r['speedup_vs_fp32']:.2f}×")
            )
            if r.get("mfu") is not None:
                label += f"\nMFU {r['mfu'] * 100:.1f}%"
            # above the error bar's cap (min-max), not the bar: the two never overlap
            ax.annotate(
                label,
                (i, r["step_ms_max"]),
                xytext=(0, 4),
                textcoords="offset points",
                ha="center",
                va="bottom",
                fontsize=8,
            )
        for i, r in zip(slots, results):
            if r["status"] == "ok":
                continue
            why = f"{r['status']}: {r.get('reason') or '?'}"
            for panel, height in ((ax, top * 1.35), (mem, None)):
                patch = panel.bar(
                    i,
                    height if height is not None else 1,
                    width=0.7,
                    color="none",
                    edgecolor="#999999",
                    hatch="///",
                    linewidth=0.8,
                )
                for artist in patch:
                    artist.set_gid(f"skipped:{name}:{r['mode']}")
            text = ax.text(
                i,
                top * 0.05,
                "\n".join(textwrap.wrap(why, 28)[:6]),
                rotation=90,
                ha="center",
                va="bottom",
                fontsize=7,
                color="#555555",
                bbox={"facecolor": "white", "edgecolor": "none", "alpha": 0.85, "pad": 1},
            )
            text.set_gid(f"skipped:{name}:{r['mode']}")
        ax.set_xticks(slots)
        ax.set_xticklabels(modes, rotation=20, ha="right", fontsize=8)
        ax.set_title(f"{name}: ms per step (median, min–max over runs)", fontsize=9)
        ax.set_ylabel("ms per step")
        # the memory panel: peak per mode where measured
        mibs = [_memory_mib(r) for r in results]
        measured = [m for m in mibs if m is not None]
        mtop = max(measured, default=1.0) or 1.0
        mem.set_ylim(0, mtop * 1.25)
        for patch in mem.patches:  # the skipped slots drawn above: full height of this panel
            patch.set_height(mtop * 1.25)
        for i, (r, m) in enumerate(zip(results, mibs)):
            if r["status"] != "ok":
                continue
            if m is None:
                mem.text(
                    i,
                    mtop * 0.05,
                    "not measured",
                    rotation=90,
                    ha="center",
                    va="bottom",
                    fontsize=7,
                )
                continue
            mem.bar(i, m, width=0.7, color=MODE_COLOURS.get(r["mode"], "#777777"))
            mem.annotate(
                f"{m:.0f}",
                (i, m),
                xytext=(0, 2),
                textcoords="offset points",
                ha="center",
                va="bottom",
                fontsize=7,
            )
        mem.set_xticks(slots)
        mem.set_xticklabels(modes, rotation=20, ha="right", fontsize=8)
        mem.set_ylabel("MiB")
        mem.set_title(f"peak memory ({memory_kind})", fontsize=9)
    # about 13 characters of 9-point text per inch of figure
    fig.suptitle(chart_title(report, int(fig.get_figwidth() * 13)), fontsize=9)
    fig.tight_layout()
    return fig


def chart(report: dict, path: Path) -> str | None:
    """results.png (see figure()); its PNG text says which modes have an empty slot and why ("Skipped modes", JSON),
    and holds the whole headline ("Description"). Returns why it was not drawn, or None."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception as exc:
        return f"matplotlib not importable ({exc.__class__.__name__}); pip install matplotlib for the chart"
    fig = figure(report)
    skipped = [
        {"model": name, "mode": r["mode"], "status": r["status"], "reason": r.get("reason")}
        for name, entry in report["models"].items()
        for r in entry["results"]
        if r["status"] != "ok"
    ]
    try:
        fig.savefig(
            path,
            dpi=110,
            metadata={
                "Title": " — ".join(chart_title(report).splitlines()[:2]),
                "Description": report["headline"],
                "Skipped modes": json.dumps(skipped),
            },
        )
    finally:
        plt.close(fig)
    return None


def _read_version(paths, key: str) -> str | None:
    for path in paths:
        with contextlib.suppress(OSError):
            for line in Path(path).read_text(errors="replace").splitlines():
                if line.lower().startswith(key.lower()):
                    return line.split("=", 1)[-1].strip()
    return None


def environment(device: device_adapter.Device, args) -> dict:
    """What changes speed or memory besides the code: chip, driver, CANN, versions, HF32/TF32, jit, NPU env vars."""
    env = {
        "chip": device.name(),
        "driver": None,
        "cann": None,
        "torch": torch.__version__,
        "torch_npu": versions()["torch_npu"],
        "apex": versions()["apex"],
        "apex_wheel_sha256": os.environ.get("APEXKIT_APEX_WHEEL_SHA256")
        or "unknown (set by nox -s bench from the target's manifest)",
        "env": {name: os.environ.get(name) for name in NPU_ENV},
    }
    if device.kind == "npu":
        toolkit = (
            targetenv.cann_home() or targetenv.CANN_HOMES[0]
        )  # a sourced set_env.sh, else either layout
        env["cann"] = _read_version(
            [f"{toolkit}/version.cfg", f"{toolkit}/compiler/version.info"], "version"
        )
        env["driver"] = _read_version([targetenv.DRIVER_VERSION_INFO], "version")
        npu = torch.npu
        env["hf32"] = {
            "matmul": getattr(getattr(npu, "matmul", None), "allow_hf32", None),
            "conv": getattr(getattr(npu, "conv", None), "allow_hf32", None),
            "requested": args.hf32,
        }
        jit_false = getattr(npu, "is_jit_compile_false", None)
        env["jit_compile"] = None if jit_false is None else not jit_false()
    else:
        env["hf32"] = "n/a (NPU only)"
        env["jit_compile"] = "n/a (NPU only)"
    if device.kind == "cuda":
        env["cuda"] = torch.version.cuda
        env["tf32"] = {
            "matmul": torch.backends.cuda.matmul.allow_tf32,
            "cudnn": torch.backends.cudnn.allow_tf32,
        }
        with contextlib.suppress(Exception):
            env["driver"] = (
                subprocess.run(
                    ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                    capture_output=True,
                    text=True,
                    timeout=30,
                )
                .stdout.split("\n")[0]
                .strip()
            )
    return env


def _loadavg() -> list | None:
    """1/5/15-minute load averages of the host (Unix), to tell a contended run from a quiet one."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except (AttributeError, OSError):
        return None


def loaded_host(report: dict) -> dict:
    """Whether other work on the host disturbed the timings: the 1-minute load above the core count at the start or
    the end, or a mode's p90/p10 step time over its runs beyond SPREAD_BOUND."""
    host, reasons = report["host"], []
    for when in ("start", "end"):
        load = host.get(f"load_avg_{when}")
        if load and host.get("cores") and load[0] > host["cores"]:
            reasons.append(f"1-minute load {load[0]} above the {host['cores']} cores at the {when}")
    spreads = {
        f"{name} {r['mode']}": r["step_ms_p90"] / r["step_ms_p10"]
        for name, entry in report["models"].items()
        for r in entry["results"]
        if r["status"] == "ok" and r.get("step_ms_p10")
    }
    wide = sorted((s, run) for run, s in spreads.items() if s > SPREAD_BOUND)
    if wide:
        more = f" and {len(wide) - 1} more" if len(wide) > 1 else ""
        reasons.append(
            f"p90/p10 step time {wide[-1][0]:.2f}× for {wide[-1][1]}{more}, beyond {SPREAD_BOUND}×"
        )
    return {
        "loaded": bool(reasons),
        "reasons": reasons,
        "spread_bound_p90_p10": SPREAD_BOUND,
        "max_spread_p90_p10": round(max(spreads.values()), 3) if spreads else None,
    }


def fp32_kind(device: device_adapter.Device) -> str:
    """The peak an fp32 arm runs against: HF32 on NPU with allow_hf32, TF32 on CUDA with allow_tf32, else fp32."""
    if device.kind == "npu" and getattr(getattr(torch.npu, "matmul", None), "allow_hf32", False):
        return "hf32"
    if device.kind == "cuda" and torch.backends.cuda.matmul.allow_tf32:
        return "tf32"
    return "float32"


def versions() -> dict:
    """Installed versions from the package metadata: importing torch_npu or apex would need CANN on a CPU host."""
    out = {"torch": torch.__version__, "python": platform.python_version()}
    for key, dist in (("torch_npu", "torch-npu"), ("apex", "apex")):
        try:
            out[key] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            out[key] = None
    return out


# --- compare -------------------------------------------------------------------------------------------------------


def compare(paths: list[str]) -> int:
    reports = []
    for path in paths:
        try:
            data = json.loads(Path(path).read_text())
        except (OSError, json.JSONDecodeError) as exc:
            print(f"error: cannot read {path}: {exc}", file=sys.stderr)
            return 2
        if data.get("schema") != SCHEMA:
            print(
                f"error: {path} is not an amp_bench result (schema {data.get('schema')!r})",
                file=sys.stderr,
            )
            return 2
        reports.append((path, data))
    first_path, first = reports[0]
    for path, data in reports[1:]:
        for name in set(first["models"]) | set(data["models"]):
            a, b = first["models"].get(name), data["models"].get(name)
            if a and b and a["sizes"] != b["sizes"]:
                print(
                    f"error: {name} sizes differ between {first_path} and {path} ({a['sizes']} vs {b['sizes']}); "
                    "rerun both with the same --scale",
                    file=sys.stderr,
                )
                return 2
        if set(first["models"]) != set(data["models"]):
            print(
                f"error: {first_path} and {path} ran different models; rerun with the same --model",
                file=sys.stderr,
            )
            return 2
    labels = [data["label"] for _, data in reports]
    print("| model | mode | " + " | ".join(f"{label} step (speedup)" for label in labels) + " |")
    print("|---|---|" + "---|" * len(labels))
    for name in first["models"]:
        modes = [
            m
            for m in MODES
            if any(any(r["mode"] == m for r in d["models"][name]["results"]) for _, d in reports)
        ]
        for mode in modes:
            cells = []
            for _, data in reports:
                r = next((r for r in data["models"][name]["results"] if r["mode"] == mode), None)
                if r is None or r["status"] != "ok":
                    cells.append("-" if r is None else r["status"])
                elif r.get("speedup_vs_fp32") is None:
                    cells.append(f"{r['step_ms_median']:.2f} ms")
                else:
                    cells.append(f"{r['step_ms_median']:.2f} ms ({r['speedup_vs_fp32']:.2f}×)")
            print(f"| {name} | {mode} | " + " | ".join(cells) + " |")
    return 0


# --- main ----------------------------------------------------------------------------------------------------------


def run_models(
    names, args, device: device_adapter.Device, rank: int, device_peak: dict | None = None
) -> dict:
    """{model: {"sizes", "results"}}: every mode runs, or is skipped (the probe says why), or failed (the error)."""
    size = world()[1]
    out = {}
    for name in names:
        results = []
        for mode in args.modes:
            ok, reason = mode_status(mode, device)
            if not ok:
                results.append({"mode": mode, "status": "skipped", "reason": reason})
                if rank == 0:
                    print(f"  {name:<12} {mode:<14} skipped: {reason}", file=sys.stderr)
                continue
            try:
                result = run_mode(name, mode, args, device)
            except (
                Exception
            ) as exc:  # a mode that should run and does not: reported, the other modes still run
                if size > 1:
                    raise  # the other ranks wait in a collective; torchrun reports the failure
                result = {
                    "mode": mode,
                    "status": "failed",
                    "reason": device_adapter.first_line(exc),
                }
                print(f"  {name:<12} {mode:<14} failed: {result['reason']}", file=sys.stderr)
                results.append(result)
                continue
            results.append(result)
            if rank == 0:
                print(
                    f"  {name:<12} {mode:<14} {result['step_ms_median']:9.2f} ms/step  loss {result['final_loss']:.4f}",
                    file=sys.stderr,
                )
        finish(results, args.tolerance)
        sizes = next((r["sizes"] for r in results if r["status"] == "ok"), None) or models.sizes(
            name, scale_of(name, args)
        )
        for r in results:
            r.pop("sizes", None)
        if device_peak is not None:
            add_mfu(name, results, sizes, device_peak)
        out[name] = {"sizes": sizes, "scale": scale_of(name, args), "results": results}
        if args.optimizers and size == 1:
            out[name]["optimizers"] = run_optimizers(name, args, device)
            if rank == 0:
                for r in out[name]["optimizers"]:
                    said = (
                        f"{r['step_ms_median']:9.2f} ms/step"
                        if r["status"] == "ok"
                        else f"{r['status']}: {r['reason']}"
                    )
                    print(f"  {name:<12} {r['optimizer']:<20} {said}", file=sys.stderr)
    return out


def launch_torchrun(args, argv: list[str]) -> int:
    """Re-run this script under torchrun with --nproc processes (one per device)."""
    rest = []
    skip = False
    for item in argv:
        if skip:
            skip = False
            continue
        if item == "--nproc":
            skip = True
            continue
        if item.startswith("--nproc="):
            continue
        rest.append(item)
    env = dict(os.environ, APEXKIT_BENCH_NPROC=str(args.nproc))
    if args.device in ("cpu", "auto") and args.threads is None:
        env["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // args.nproc))
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc_per_node={args.nproc}",
        str(Path(__file__).resolve()),
        *rest,
    ]
    print("+ " + " ".join(cmd), file=sys.stderr)
    return subprocess.call(cmd, env=env)


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    if args.compare:
        return compare(args.compare)
    if args.nproc > 1 and "RANK" not in os.environ:
        return launch_torchrun(args, argv)
    rank, size = world()
    kind = device_adapter.detect(args.device)
    try:
        device = device_adapter.Device(kind)
    except RuntimeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.scale is None:
        args.scale = 0.25 if kind == "cpu" else 1.0
        if (
            kind == "cpu"
        ):  # the MoE layer's vocabulary and sequence grow fastest: a 2-core CPU needs it smaller
            args.model_scales = {"qwen3-moe": CPU_MOE_SCALE}
    if kind != "npu" and (args.hf32 != "default" or args.jit_compile != "default"):
        print(
            f"error: --hf32/--jit-compile set torch_npu switches and the device is {kind}; drop them or run with "
            "--device npu",
            file=sys.stderr,
        )
        return 2
    device.set_current()
    if kind == "npu":
        if args.hf32 != "default":
            torch.npu.matmul.allow_hf32 = args.hf32 == "on"
        if args.jit_compile != "default":
            torch.npu.set_compile_mode(jit_compile=args.jit_compile == "on")
    if size > 1:
        dist = device.distributed_support()
        if not dist["ok"]:
            print(
                f"error: --nproc {size} needs torch.distributed with {dist['backend']}: {dist['reason']}; "
                "run with --nproc 1",
                file=sys.stderr,
            )
            return 2
        init_distributed(device)
    names = models.MODELS if args.model == "all" else (args.model,)
    report = {
        "schema": SCHEMA,
        "tool": "apexkit bench/amp_bench.py",
        "label": args.label or kind,
        "target": os.environ.get("APEXKIT_TARGET_ID"),  # the wheel's target id, set by nox -s bench
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "device": device.describe(),
        "versions": versions(),
        "host": {
            "machine": platform.machine(),
            "hostname": platform.node(),
            "cpu": device_adapter.cpu_name(),
            "cores": os.cpu_count(),
            "torch_threads": torch.get_num_threads(),
            "load_avg_start": _loadavg(),
        },
        "config": {
            "warmup": args.warmup,
            "repeats": args.repeats,
            "steps": args.steps,
            "seed": args.seed,
            "scale": args.scale,
            "model_scales": getattr(args, "model_scales", {}),
            "nproc": size,
            "modes": args.modes,
            "tolerance": args.tolerance,
            "optimizers": args.optimizers,
            "peak": args.peak,
            "hf32": args.hf32,
            "jit_compile": args.jit_compile,
            "combine_grad": args.combine_grad,
        },
        "capabilities": device.capabilities(),
        "environment": environment(device, args),
        "flops_convention": flops.CONVENTION,
        "models": {},
    }
    report["device_peak"] = peaks.device_peak(device, args.peak, fp32_kind(device), args.gemm_sizes)
    if rank == 0:
        for dtype, peak in report["device_peak"]["dtypes"].items():
            said = (
                f"{peak['flops'] / 1e9:,.1f} GFLOP/s"
                if peak["flops"]
                else f"none ({peak.get('reason')})"
            )
            print(f"  peak {dtype:<9} {said}  [{peak['source'][:90]}]", file=sys.stderr)
    report["models"] = run_models(names, args, device, rank, report["device_peak"])
    first = names[0]
    if size == 1 and any(
        r["mode"] == "fp32" and r["status"] == "ok" for r in report["models"][first]["results"]
    ):
        report["harness_overhead"] = {"model": first, **harness_overhead(first, args, device)}
    report["host"]["load_avg_end"] = (
        _loadavg()
    )  # other work on a shared host shows in every number above
    report["headline"] = headline(report)
    report["loaded_host"] = loaded_host(report)
    if size > 1:
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()
    if rank != 0:
        return 0
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    png_problem = None if args.no_png else chart(report, out / "results.png")
    report["png"] = None if (args.no_png or png_problem) else "results.png"
    if png_problem:
        report["png_skipped"] = png_problem
        print(f"  chart skipped: {png_problem}", file=sys.stderr)
    (out / "results.json").write_text(json.dumps(report, indent=2) + "\n")
    text = markdown(report)
    (out / "results.md").write_text(text)
    # results.md ends with the headline; on screen it is stdout's last line alone, not printed twice in a row
    shown = text.rstrip("\n")
    if shown.endswith("\n" + report["headline"]):
        shown = shown[: -len(report["headline"])].rstrip("\n")
    print(shown + "\n", file=sys.stderr)
    print(report["headline"], flush=True)
    return finish_lines(report, args, out, png_problem)


def finish_lines(report: dict, args, out: Path, png_problem: str | None) -> int:
    """The last lines: parity and loaded-host warnings, failed modes, then the report's files; the exit code."""
    failed_parity = [
        (n, r["mode"])
        for n, e in report["models"].items()
        for r in e["results"]
        if r["status"] == "ok" and r["parity_ok"] is False
    ]
    if failed_parity:
        print(
            f"warning: loss parity beyond {args.tolerance:.0%} for {failed_parity}", file=sys.stderr
        )
    if report["loaded_host"]["loaded"]:
        print(
            f"warning: loaded host ({'; '.join(report['loaded_host']['reasons'])}): the timings are not those "
            "of a quiet machine -- next: rerun when the host is idle (results.md says so too)",
            file=sys.stderr,
        )
    failed = [
        f"{n} {r['mode']}"
        for n, e in report["models"].items()
        for r in e["results"]
        if r["status"] == "failed"
    ]
    failed += [
        f"{n} {r['optimizer']}"
        for n, e in report["models"].items()
        for r in e.get("optimizers", [])
        if r["status"] == "failed"
    ]
    if failed:
        print(
            f"error: {len(failed)} mode(s) failed ({', '.join(failed)}); the reasons are in {out / 'results.md'}",
            file=sys.stderr,
        )
    # --no-png that apexkit added (no matplotlib in the run venv) comes with its reason; the user's own says so
    why = png_problem or os.environ.get("APEXKIT_NO_CHART") or "--no-png"
    chart_line = out / "results.png" if report["png"] else f"no chart ({why})"
    for line in (out / "results.json", out / "results.md", chart_line):
        print(f"report: {line.resolve() if isinstance(line, Path) else line}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
    sys.exit(130)
