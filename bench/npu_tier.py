"""The NPU test tier of an installed Apex for Ascend wheel: Ascend apex's own test suites from the source tree the wheel
was built from, fused-optimizer equivalence and a dynamic-loss-scaler overflow check, on an NPU. Runs in the wheel's
venv (standard library + torch + torch_npu + apex); never imports apexkit.

    python bench/npu_tier.py --tests build/<target>/tree [--junit out.xml] [--json out.json]

Where no NPU is usable it runs nothing and says what is missing, one line: `needs an NPU: <what>` (torch_npu not
installed, the CANN environment not sourced, torch.npu.is_available() False, no source tree); every case is then
reported as skipped in the JUnit XML. Same runner and JUnit writer as the CPU tier (bench/cpu_tier.py), which is how
the wiring is tested on machines without an NPU. Not yet run on an NPU (no device where it was written).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cpu_tier
import targetenv

targetenv.no_autoload()

# Ascend apex's own suites, relative to the generated tree (NVIDIA apex + Ascend's src/ and tests/ copied over it).
SUITES = {
    "tests/L0 amp": "tests/L0/run_amp",
    "tests/L0 optimizers": "tests/L0/run_optimizers",
    "combine_tensors": "apex/contrib/test/test_combine_tensors.py",
}
CASES = [
    *SUITES,
    "fused optimizers: apex NpuFusedAdam vs torch.optim.Adam vs torch_npu.optim.NpuFusedAdam",
    "dynamic loss scaler: injected overflow skips the step and halves the scale",
]


def missing(tests_root: str | None) -> list[str]:
    """What this machine lacks for the NPU tier, in words; [] when it can run."""
    lacks = []
    if importlib.util.find_spec("torch_npu") is None:
        lacks.append("torch_npu is not installed in this venv (build with --npu)")
    elif not targetenv.sourced_home():
        lacks.append(f"the CANN environment is not sourced ({targetenv.SET_ENV_HINT})")
    else:
        try:
            import torch
            import torch_npu  # noqa: F401

            if not torch.npu.is_available():
                lacks.append("torch.npu.is_available() is False (no NPU visible: npu-smi info)")
        except Exception as exc:  # an import that needs the runtime
            lacks.append(f"import torch_npu failed: {(str(exc).splitlines() or [''])[0][:160]}")
    if not tests_root or not os.path.isdir(tests_root):
        lacks.append(
            f"the source tree the wheel was built from ({tests_root or 'pass --tests build/<target>/tree'})"
        )
    return lacks


def run_suite(root: str, rel: str):
    def check():
        path = os.path.join(root, rel)
        if not os.path.exists(path):
            return "fail", f"{rel} is not in the source tree {root}"
        xml = os.path.join(root, f".npu-tier-{rel.replace('/', '_')}.xml")
        proc = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", path, f"--junitxml={xml}"],
            cwd=root,
            capture_output=True,
            text=True,
        )
        tail = (proc.stdout.strip().splitlines() or ["no output"])[-1]
        return ("ok" if proc.returncode == 0 else "fail"), f"{rel}: {tail}"

    return check


def fused_optimizers():
    import torch
    import torch_npu
    from apex.optimizers import NpuFusedAdam

    torch.manual_seed(0)
    start = torch.randn(64, 32)
    grads = [torch.randn(64, 32) for _ in range(5)]
    finals = {}
    makers = {
        "torch.optim.Adam": lambda p: torch.optim.Adam(p, lr=1e-2),
        "apex NpuFusedAdam": lambda p: NpuFusedAdam(p, lr=1e-2),
        "torch_npu NpuFusedAdam": lambda p: torch_npu.optim.NpuFusedAdam(p, lr=1e-2),
    }
    for name, make in makers.items():
        param = torch.nn.Parameter(start.clone().npu())
        opt = make([param])
        for g in grads:
            param.grad = g.clone().npu()
            opt.step()
        finals[name] = param.detach().cpu()
    ref = finals["torch.optim.Adam"]
    worst = {k: float((v - ref).abs().max()) for k, v in finals.items()}
    bad = {k: d for k, d in worst.items() if d > 1e-4}
    return (
        "fail" if bad else "ok"
    ), "max |difference| to torch.optim.Adam after 5 steps: " + ", ".join(
        f"{k} {d:.2e}" for k, d in worst.items()
    )


def overflow_injection():
    import torch
    import torch_npu  # noqa: F401
    from apex import amp

    model = torch.nn.Linear(8, 8).npu()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, opt = amp.initialize(model, opt, opt_level="O2", loss_scale="dynamic", verbosity=0)
    before = [p.detach().clone() for p in model.parameters()]
    scale = amp._amp_state.loss_scalers[0].loss_scale()
    loss = model(torch.randn(4, 8).npu().half()).float().sum() * float(
        "inf"
    )  # an overflow, injected
    with amp.scale_loss(loss, opt) as scaled:
        scaled.backward()
    opt.step()
    after = amp._amp_state.loss_scalers[0].loss_scale()
    unchanged = all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    ok = unchanged and after == scale / 2
    return (
        "ok" if ok else "fail"
    ), f"loss scale {scale} -> {after}; parameters {'unchanged' if unchanged else 'CHANGED'}"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        description="NPU test tier of an installed Apex for Ascend wheel"
    )
    parser.add_argument(
        "--tests", help="the generated source tree the wheel was built from (build/<target>/tree)"
    )
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--junit", help="write JUnit XML here")
    args = parser.parse_args(argv)
    tier = cpu_tier.Tier()
    lacks = missing(args.tests)
    if lacks:
        line = "needs an NPU: " + "; ".join(lacks)
        print(line, file=sys.stderr)
        for case in CASES:
            tier.add(case, "skip", line)
    else:
        for name, rel in SUITES.items():
            tier.run(name, run_suite(args.tests, rel))
        tier.run(CASES[-2], fused_optimizers)
        tier.run(CASES[-1], overflow_injection)
    report = {
        "tier": "npu",
        "ran": not lacks,
        "needs": lacks,
        "results": tier.results,
        "ok": not lacks and not tier.failed(),
    }
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(report, fh, indent=1)
    if args.junit:
        cpu_tier.write_junit(args.junit, "apex-npu-tier", tier.results)
    print(json.dumps(report))
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
