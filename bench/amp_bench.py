#!/usr/bin/env python3
"""FP32 vs mixed precision on one device: step time (median and spread), throughput, peak memory, loss parity.

    python bench/amp_bench.py --device auto --model all            # npu > cuda > cpu
    python bench/amp_bench.py --device cpu --modes fp32,autocast-bf16 --scale 0.25
    python bench/amp_bench.py --nproc 2 --device cpu                # torchrun + DDP (gloo/nccl/hccl)
    python bench/amp_bench.py --compare npu.json cuda.json cpu.json # side by side

Modes: fp32; apex-O1, apex-O2 (apex.amp, where apex runs on the device); autocast-fp16 (with a GradScaler),
autocast-bf16 (torch.autocast for the device type). Every mode starts from the same weights and data (fixed
seeds); speedup, memory ratio and loss parity are against the fp32 run of the same invocation.
A mode this torch or device cannot run (probed by trying: e.g. torch 2.1's CPU autocast has no float16) is
skipped with its reason; a mode that fails while running is reported as failed (exit 1), never as a traceback.
Outputs in --out: results.json, results.md, results.png; the last line printed is the headline.
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
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import device_adapter
import models
import torch

MODES = ("fp32", "apex-O1", "apex-O2", "autocast-fp16", "autocast-bf16")
SCHEMA = 1
# Relative difference of the final training loss vs fp32 that still counts as parity. Low precision changes the
# rounding of every step; after the short runs here bf16 (8-bit mantissa) stays well inside 5 %.
PARITY_TOLERANCE = 0.05


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("--device", default="auto", choices=("auto", *device_adapter.KINDS))
    p.add_argument("--model", default="all", choices=("all", *models.MODELS))
    p.add_argument("--modes", default=",".join(MODES), help="comma-separated subset of " + ",".join(MODES))
    p.add_argument("--scale", type=float, default=None, help="model/batch size factor (default: 0.25 cpu, 1 npu/cuda)")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps per mode")
    p.add_argument("--repeats", type=int, default=5, help="timed blocks per mode (median and spread over these)")
    p.add_argument("--steps", type=int, default=5, help="optimizer steps per timed block")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    p.add_argument("--tolerance", type=float, default=PARITY_TOLERANCE, help="loss parity tolerance (relative)")
    p.add_argument("--out", default="bench-results", help="directory for results.json/.md/.png")
    p.add_argument("--label", default=None, help="name of this run in --compare tables (default: the device)")
    p.add_argument("--nproc", type=int, default=1, help="processes (devices) through torchrun + DDP")
    p.add_argument("--compare", nargs="+", metavar="JSON", help="render earlier results side by side")
    p.add_argument("--no-png", action="store_true", help="skip the chart")
    args = p.parse_args(argv)
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
    if dtype is None:
        return True, ""
    if dtype == torch.bfloat16 and device.kind == "cuda" and not torch.cuda.is_bf16_supported():
        return False, "this GPU has no bf16"
    if not device.autocast_support(dtype)["ok"]:
        return False, device.unsupported_autocast(dtype)
    if dtype == torch.float16:  # fp16 trains with a loss scaler; without one the comparison would be unfair
        scaler = device.grad_scaler_support()
        if not scaler["ok"]:
            return False, scaler["reason"]
    return True, ""


def run_mode(name: str, mode: str, args, device: device_adapter.Device) -> dict:
    model, sizes, (x, y), loss_fn, tokens_per_sample = models.build(name, args.scale, args.seed)
    model = model.to(device.torch_device)
    x, y = x.to(device.torch_device), y.to(device.torch_device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    dtype = AUTOCAST_MODES.get(mode)
    scaler = device.grad_scaler(mode == "autocast-fp16")
    amp = None
    if mode.startswith("apex-"):
        from apex import amp

        model, optimizer = amp.initialize(model, optimizer, opt_level=mode.split("-")[1], verbosity=0)
    if world()[1] > 1:
        ids = None if device.kind == "cpu" else [device.index]
        model = torch.nn.parallel.DistributedDataParallel(model, device_ids=ids)

    def step() -> torch.Tensor:
        optimizer.zero_grad(set_to_none=True)
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
            optimizer.step()
        return loss

    device.reset_peak_memory()
    for _ in range(args.warmup):
        step()
    block_seconds = []
    loss = None
    for _ in range(args.repeats):
        start = device.now()  # synchronises: nothing queued before is counted
        for _ in range(args.steps):
            loss = step()
        block_seconds.append(all_max(device.now() - start, device))  # the slowest rank sets the pace
    final_loss = float(loss.detach().float().item())
    step_ms = sorted(s / args.steps * 1000 for s in block_seconds)
    median = statistics.median(step_ms)
    q = statistics.quantiles(step_ms, n=4) if len(step_ms) > 1 else [median, median, median]
    batch = sizes["batch"] * world()[1]
    return {"mode": mode, "status": "ok", "step_ms_median": round(median, 4), "step_ms_min": round(step_ms[0], 4),
            "step_ms_max": round(step_ms[-1], 4), "step_ms_iqr": round(q[2] - q[0], 4),
            "samples_per_s": round(batch / (median / 1000), 2),
            "tokens_per_s": round(batch * tokens_per_sample / (median / 1000), 1) if tokens_per_sample > 1 else None,
            "peak_memory_bytes": device.peak_memory_bytes(), "final_loss": final_loss, "sizes": sizes,
            "timed_steps": args.repeats * args.steps}


def harness_overhead(name: str, args, device: device_adapter.Device) -> dict:
    """The timing harness (a synchronised timestamp around every block) vs one bare loop of the same steps."""
    model, _, (x, y), loss_fn, _ = models.build(name, args.scale, args.seed)
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
    return {"bare_s": round(bare, 5), "harness_s": round(harnessed, 5),
            "overhead_pct": round((harnessed - bare) / bare * 100, 2), "alternations": 3}


def finish(results: list[dict], tolerance: float) -> None:
    ref = next((r for r in results if r["mode"] == "fp32" and r["status"] == "ok"), None)
    for r in results:
        if ref is None and r["status"] == "ok":  # no reference: the ratios cannot be computed
            r.update(speedup_vs_fp32=None, memory_ratio_vs_fp32=None, loss_rel_diff_vs_fp32=None, parity_ok=None)
            continue
        if r["status"] != "ok":
            continue
        r["speedup_vs_fp32"] = round(ref["step_ms_median"] / r["step_ms_median"], 3)
        ref_memory = ref["peak_memory_bytes"]
        r["memory_ratio_vs_fp32"] = round(r["peak_memory_bytes"] / ref_memory, 3) if ref_memory else None
        diff = abs(r["final_loss"] - ref["final_loss"]) / max(abs(ref["final_loss"]), 1e-12)
        r["loss_rel_diff_vs_fp32"] = round(diff, 6)
        r["parity_ok"] = diff <= tolerance


# --- reporting -----------------------------------------------------------------------------------------------------

def _mib(n) -> str:
    return "-" if n is None else f"{n / 2**20:.0f} MiB"


def headline(report: dict) -> str:
    parts = []
    for name, entry in report["models"].items():
        ok = [r for r in entry["results"] if r["status"] == "ok"]
        ref = next((r for r in ok if r["mode"] == "fp32"), None)
        amp = max((r for r in ok if r["mode"] != "fp32" and r["speedup_vs_fp32"] is not None),
                  key=lambda r: r["speedup_vs_fp32"], default=None)
        if ref and amp:
            parts.append(f"{name} on {report['device']['kind']}: fp32 {ref['step_ms_median']:.1f} ms/step, "
                         f"{amp['mode']} {amp['step_ms_median']:.1f} ms/step, {amp['speedup_vs_fp32']:.2f}×")
    return "; ".join(parts) or "no mixed-precision mode ran"


def markdown(report: dict) -> str:
    d = report["device"]
    lines = [f"**{report['label']}** — {d['kind']} ({d['name']}), torch {report['versions']['torch']}, "
             f"Python {report['versions']['python']}, "
             f"{report['config']['nproc']} process(es), {report['config']['repeats']}×{report['config']['steps']} timed "
             f"steps after {report['config']['warmup']} warm-up; memory = {d['memory']}"]
    caps = report.get("capabilities")
    if caps:
        autocast = ", ".join(f"{name} {'yes' if c['ok'] else 'no'}" for name, c in caps["autocast"].items())
        lines.append(f"this torch on {d['kind']}: autocast {autocast}; GradScaler "
                     f"{caps['grad_scaler']['via'] or 'none'}")
    lines.append("")
    lines.append("| model | mode | step (median) | spread (min–max) | samples/s | tokens/s | peak memory | speedup | "
                 "memory vs fp32 | loss Δ vs fp32 |")
    lines.append("|---|---|---|---|---|---|---|---|---|---|")
    for name, entry in report["models"].items():
        for r in entry["results"]:
            if r["status"] != "ok":
                lines.append(f"| {name} | {r['mode']} | {r['status']}: {r['reason']} | | | | | | | |")
                continue
            if r["loss_rel_diff_vs_fp32"] is None:
                parity, speedup = "-", "-"
            else:
                parity = f"{r['loss_rel_diff_vs_fp32'] * 100:.2f} %" + ("" if r["parity_ok"] else " ✗")
                speedup = f"{r['speedup_vs_fp32']:.2f}×"
            lines.append(
                f"| {name} | {r['mode']} | {r['step_ms_median']:.2f} ms | {r['step_ms_min']:.2f}–{r['step_ms_max']:.2f} ms | "
                f"{r['samples_per_s']:.1f} | {r['tokens_per_s'] or '-'} | {_mib(r['peak_memory_bytes'])} | "
                f"{speedup} | {r['memory_ratio_vs_fp32'] or '-'} | {parity} |")
    overhead = report.get("harness_overhead")
    if overhead:
        lines += ["", f"Timing harness vs bare loop ({overhead['model']}, fp32): {overhead['harness_s']:.3f} s vs "
                      f"{overhead['bare_s']:.3f} s = {overhead['overhead_pct']:+.2f} %"]
    lines += ["", report["headline"]]
    return "\n".join(lines) + "\n"


def chart(report: dict, path: Path) -> str | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception as exc:
        return f"matplotlib not importable ({exc.__class__.__name__}); pip install matplotlib for the chart"
    names = list(report["models"])
    fig, axes = plt.subplots(1, len(names), figsize=(5.5 * len(names), 4), squeeze=False)
    for ax, name in zip(axes[0], names):
        ok = [r for r in report["models"][name]["results"] if r["status"] == "ok"]
        medians = [r["step_ms_median"] for r in ok]
        errors = [[r["step_ms_median"] - r["step_ms_min"] for r in ok], [r["step_ms_max"] - r["step_ms_median"] for r in ok]]
        bars = ax.bar([r["mode"] for r in ok], medians, yerr=errors, capsize=4, color="#4c72b0")
        for bar, r in zip(bars, ok):
            if r["speedup_vs_fp32"] is None:
                continue
            ax.annotate(f"{r['speedup_vs_fp32']:.2f}×", (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                        ha="center", va="bottom", fontsize=9)
        ax.set_title(f"{name} ({report['device']['kind']})")
        ax.set_ylabel("ms per step (median, min–max)")
        ax.tick_params(axis="x", rotation=20)
    fig.suptitle(report["headline"][:140], fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None


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
            print(f"error: {path} is not an amp_bench result (schema {data.get('schema')!r})", file=sys.stderr)
            return 2
        reports.append((path, data))
    first_path, first = reports[0]
    for path, data in reports[1:]:
        for name in set(first["models"]) | set(data["models"]):
            a, b = first["models"].get(name), data["models"].get(name)
            if a and b and a["sizes"] != b["sizes"]:
                print(f"error: {name} sizes differ between {first_path} and {path} ({a['sizes']} vs {b['sizes']}); "
                      "rerun both with the same --scale", file=sys.stderr)
                return 2
        if set(first["models"]) != set(data["models"]):
            print(f"error: {first_path} and {path} ran different models; rerun with the same --model", file=sys.stderr)
            return 2
    labels = [data["label"] for _, data in reports]
    print("| model | mode | " + " | ".join(f"{label} step (speedup)" for label in labels) + " |")
    print("|---|---|" + "---|" * len(labels))
    for name in first["models"]:
        modes = [m for m in MODES if any(any(r["mode"] == m for r in d["models"][name]["results"]) for _, d in reports)]
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

def run_models(names, args, device: device_adapter.Device, rank: int) -> dict:
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
            except Exception as exc:  # a mode that should run and does not: reported, the other modes still run
                if size > 1:
                    raise  # the other ranks wait in a collective; torchrun reports the failure
                result = {"mode": mode, "status": "failed", "reason": device_adapter.first_line(exc)}
                print(f"  {name:<12} {mode:<14} failed: {result['reason']}", file=sys.stderr)
                results.append(result)
                continue
            results.append(result)
            if rank == 0:
                print(f"  {name:<12} {mode:<14} {result['step_ms_median']:9.2f} ms/step  loss {result['final_loss']:.4f}",
                      file=sys.stderr)
        finish(results, args.tolerance)
        sizes = next((r["sizes"] for r in results if r["status"] == "ok"), None) or models.sizes(name, args.scale)
        for r in results:
            r.pop("sizes", None)
        out[name] = {"sizes": sizes, "results": results}
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
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={args.nproc}",
           str(Path(__file__).resolve()), *rest]
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
    device.set_current()
    if size > 1:
        dist = device.distributed_support()
        if not dist["ok"]:
            print(f"error: --nproc {size} needs torch.distributed with {dist['backend']}: {dist['reason']}; "
                  "run with --nproc 1", file=sys.stderr)
            return 2
        init_distributed(device)
    names = models.MODELS if args.model == "all" else (args.model,)
    report = {"schema": SCHEMA, "tool": "apexkit bench/amp_bench.py", "label": args.label or kind,
              "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "device": device.describe(), "versions": versions(),
              "host": {"machine": platform.machine(), "cpu": device_adapter.cpu_name(), "cores": os.cpu_count(),
                       "torch_threads": torch.get_num_threads()},
              "config": {"warmup": args.warmup, "repeats": args.repeats, "steps": args.steps, "seed": args.seed,
                         "scale": args.scale, "nproc": size, "modes": args.modes, "tolerance": args.tolerance},
              "capabilities": device.capabilities(), "models": {}}
    report["models"] = run_models(names, args, device, rank)
    first = names[0]
    if size == 1 and any(r["mode"] == "fp32" and r["status"] == "ok" for r in report["models"][first]["results"]):
        report["harness_overhead"] = {"model": first, **harness_overhead(first, args, device)}
    report["headline"] = headline(report)
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
    (out / "results.md").write_text(markdown(report))
    print(markdown(report), file=sys.stderr)
    print(report["headline"])
    failed_parity = [(n, r["mode"]) for n, e in report["models"].items() for r in e["results"]
                     if r["status"] == "ok" and r["parity_ok"] is False]
    if failed_parity:
        print(f"warning: loss parity beyond {args.tolerance:.0%} for {failed_parity}", file=sys.stderr)
    failed = [f"{n} {r['mode']}" for n, e in report["models"].items() for r in e["results"] if r["status"] == "failed"]
    if failed:
        print(f"error: {len(failed)} mode(s) failed ({', '.join(failed)}); the reasons are in {out / 'results.md'}",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
    sys.exit(130)
