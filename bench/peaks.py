"""The device's peak FLOP/s per compute dtype: from bench/device_peaks.json (each figure with its source) for known
accelerators, else measured with a GEMM sweep on the device at the start of the run. Standard library + torch."""

from __future__ import annotations

import json
from pathlib import Path

import torch

TABLE = Path(__file__).resolve().parent / "device_peaks.json"
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
SWEEP_SIZES = (256, 512, 1024)


def table_entry(device_name: str) -> dict | None:
    for entry in json.loads(TABLE.read_text())["devices"]:
        if all(m.lower() in device_name.lower() for m in entry["match"]):
            return entry
    return None


def gemm_flops(device, dtype: torch.dtype, n: int, seconds: float = 0.2) -> float:
    """FLOP/s of n x n x n matmuls in dtype: the best of repeated timed bursts lasting about `seconds` in all."""
    a = torch.randn(n, n, device=device.torch_device).to(dtype)
    b = torch.randn(n, n, device=device.torch_device).to(dtype)
    torch.matmul(a, b)  # first call: kernel selection, allocation
    begin = device.now()
    torch.matmul(a, b)
    once = max(device.now() - begin, 1e-6)
    reps = max(1, min(50, int(seconds / 3 / once)))
    best = float("inf")
    for _ in range(3):
        start = device.now()
        for _ in range(reps):
            torch.matmul(a, b)
        best = min(best, (device.now() - start) / reps)
    return 2 * n**3 / best


def measure(device, dtypes, sizes=SWEEP_SIZES) -> dict:
    """{dtype: {"flops", "source", "sweep": {n: flops}}}, or {"flops": None, "reason"} where the matmul fails."""
    out = {}
    for name in dtypes:
        try:
            sweep = {str(n): round(gemm_flops(device, DTYPES[name], n), 1) for n in sizes}
        except Exception as exc:  # the device has no kernel for this dtype
            out[name] = {
                "flops": None,
                "source": "measured",
                "reason": f"{exc.__class__.__name__}: {str(exc)[:120]}",
            }
            continue
        out[name] = {
            "flops": max(sweep.values()),
            "source": f"measured: best of a GEMM sweep n={list(sizes)}, "
            "n x n x n torch.matmul, 2n^3 FLOPs",
            "sweep": sweep,
        }
    return out


def device_peak(device, how: str, fp32_kind: str, sizes=SWEEP_SIZES) -> dict:
    """{"device", "fp32_kind", "dtypes": {dtype: {"flops", "source"...}}}.

    how: auto (the table where it knows the device and dtype, a sweep for the rest), table (no sweep), measure.
    fp32_kind: which peak fp32 runs against here: float32, tf32 (CUDA with allow_tf32) or hf32 (NPU allow_hf32).
    """
    name = device.name()
    entry = table_entry(name) if how != "measure" else None
    dtypes = {}
    wanted = ["float32", "bfloat16", "float16"]
    for dtype in wanted:
        key = fp32_kind if dtype == "float32" else dtype
        if entry and key in entry["peaks"]:
            dtypes[dtype] = {
                "flops": entry["peaks"][key],
                "source": f"table: {entry['name']} {key}: {entry['source']}",
            }
    missing = [d for d in wanted if d not in dtypes]
    if missing and how != "table":
        dtypes.update(measure(device, missing, sizes))
    for dtype in missing:
        dtypes.setdefault(
            dtype,
            {
                "flops": None,
                "source": "none",
                "reason": f"{name} is not in {TABLE.name} for {dtype}; run with --peak auto to measure",
            },
        )
    return {
        "device": name,
        "table_entry": entry["name"] if entry else None,
        "fp32_kind": fp32_kind,
        "dtypes": {d: dtypes[d] for d in wanted},
    }
