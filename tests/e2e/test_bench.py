"""bench/validate_env.py and bench/amp_bench.py on this CPU, in a real venv with torch (they never import apexkit),
and the nox sessions that run them in the built wheel's venv. No timing is asserted: only that numbers exist and
are computed from the same run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT

BENCH = ROOT / "bench"
SMALL = [
    "--scale",
    "0.05",
    "--warmup",
    "1",
    "--repeats",
    "3",
    "--steps",
    "2",
    "--gemm-sizes",
    "64,128",
]


@pytest.fixture(scope="session")
def bench_python(tmp_path_factory) -> str:
    """A venv with torch 2.13.0 (the wheel on disk) and matplotlib, as the run venv has them."""
    venv = tmp_path_factory.mktemp("bench-venv") / "venv"
    subprocess.run([sys.executable, "-m", "virtualenv", "-q", str(venv)], check=True)
    python = str(venv / "bin" / "python")
    subprocess.run(
        [python, "-m", "pip", "install", "-q", "--no-compile", "torch==2.13.0", "matplotlib"],
        check=True,
        timeout=900,
    )
    return python


def run(
    python: str, script: str, *args: str, cwd: Path | None = None
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [python, str(BENCH / script), *args], capture_output=True, text=True, timeout=900, cwd=cwd
    )


# --- validate_env ----------------------------------------------------------------------------------------------------


def test_validate_on_cpu_skips_the_npu_checks_with_reasons_and_passes(bench_python, tmp_path):
    result = run(
        bench_python, "validate_env.py", "--device", "cpu", "--json", str(tmp_path / "v.json")
    )
    assert result.returncode == 0, result.stdout + result.stderr
    data = json.loads((tmp_path / "v.json").read_text())
    checks = {c["check"]: c for c in data["checks"]}
    assert data["ok"] is True and checks["torch"]["status"] == "ok"
    assert checks["torch.autocast step"]["status"] == "ok"
    for name in ("torch_npu", "CANN", "import apex", "apex amp O1 step"):
        assert checks[name]["status"] == "skip" and checks[name]["required"] is False, checks[name]
        assert checks[name]["detail"]
    assert "set_env.sh" in checks["torch_npu"]["hint"]
    assert "verdict: ready" in result.stdout


def test_validate_for_npu_fails_here_with_the_reason(bench_python):
    result = run(bench_python, "validate_env.py", "--device", "npu", "--json", "-")
    assert result.returncode == 1
    data = json.loads(result.stdout)
    checks = {c["check"]: c for c in data["checks"]}
    assert data["ok"] is False
    assert (
        checks["torch_npu"]["status"] == "fail"
        and "No module named 'torch_npu'" in checks["torch_npu"]["detail"]
    )
    assert checks["device npu"]["status"] == "fail"
    assert "NOT ready: torch_npu" in result.stderr


# --- amp_bench --------------------------------------------------------------------------------------------------------


def test_bench_fp32_vs_bf16_both_models_writes_json_md_png(bench_python, tmp_path):
    out = tmp_path / "out"
    result = run(
        bench_python,
        "amp_bench.py",
        "--device",
        "cpu",
        "--modes",
        "fp32,autocast-bf16,apex-O1,apex-O2",
        "--optimizers",
        "none",
        "--out",
        str(out),
        *SMALL,
    )
    assert result.returncode == 0, result.stderr
    report = json.loads((out / "results.json").read_text())
    assert report["schema"] == 1 and report["device"]["kind"] == "cpu"
    assert set(report["models"]) == {"mlp", "qwen3-block", "qwen3-moe"}
    for _name, entry in report["models"].items():
        rows = {r["mode"]: r for r in entry["results"]}
        fp32, bf16 = rows["fp32"], rows["autocast-bf16"]
        for row in (fp32, bf16):
            assert (
                row["status"] == "ok"
                and row["step_ms_min"] <= row["step_ms_median"] <= row["step_ms_max"]
            )
            assert (
                row["samples_per_s"] > 0
                and row["peak_memory_bytes"] > 0
                and row["timed_steps"] == 6
            )
        # ratios come from this run's own fp32 row
        assert bf16["speedup_vs_fp32"] == round(fp32["step_ms_median"] / bf16["step_ms_median"], 3)
        assert bf16["memory_ratio_vs_fp32"] == round(
            bf16["peak_memory_bytes"] / fp32["peak_memory_bytes"], 3
        )
        # parity: the same weights and data, 8 steps; bf16's loss within the stated tolerance of fp32's
        assert (
            bf16["loss_rel_diff_vs_fp32"] <= report["config"]["tolerance"] == 0.05
            and bf16["parity_ok"]
        )
        assert (
            bf16["mfu"] > 0
            and fp32["mfu"] > 0
            and bf16["flops_per_step"] == fp32["flops_per_step"] > 0
        )
        for mode in ("apex-O1", "apex-O2"):
            assert rows[mode]["status"] == "skipped" and "NPU/GPU" in rows[mode]["reason"]
    assert report["models"]["qwen3-block"]["results"][0]["tokens_per_s"] > 0
    sizes = report["models"]["qwen3-block"]["sizes"]
    assert sizes["heads"] > sizes["kv_heads"]  # grouped KV heads
    assert report["harness_overhead"]["bare_s"] > 0
    markdown = (out / "results.md").read_text()
    assert (
        "| model | mode | step (median)" in markdown
        and "| qwen3-block | autocast-bf16 |" in markdown
    )
    assert (out / "results.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert report["png"] == "results.png"
    assert result.stdout.strip() == report["headline"] and "×" in report["headline"]
    # the chart keeps an empty, marked slot for each skipped mode, says so in its PNG text, and the whole headline
    text = png_text(out / "results.png")
    marked = {(x["model"], x["mode"]) for x in json.loads(text["Skipped modes"])}
    assert marked == {(m, mode) for m in report["models"] for mode in ("apex-O1", "apex-O2")}
    assert text["Description"] == report["headline"]


def png_text(path: Path) -> dict:
    """The text chunks of a PNG (tEXt, and iTXt as matplotlib writes non-Latin-1 text), read with the stdlib."""
    import struct
    import zlib

    data, found, at = path.read_bytes(), {}, 8
    while at < len(data):
        (length,) = struct.unpack(">I", data[at : at + 4])
        kind, body = data[at + 4 : at + 8], data[at + 8 : at + 8 + length]
        at += 12 + length
        if kind == b"tEXt":
            key, _, value = body.partition(b"\0")
            found[key.decode("latin-1")] = value.decode("latin-1")
        elif kind == b"iTXt":
            key, _, rest = body.partition(b"\0")
            compressed, rest = rest[0], rest[2:]
            _lang, _, rest = rest.partition(b"\0")
            _translated, _, value = rest.partition(b"\0")
            found[key.decode("latin-1")] = (
                zlib.decompress(value) if compressed else value
            ).decode()
    return found


CHART_CHECK = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
import amp_bench
from pathlib import Path

ok = lambda mode, median, lo, hi, mem: {"mode": mode, "status": "ok", "step_ms_median": median,
    "step_ms_min": lo, "step_ms_max": hi, "speedup_vs_fp32": None if mode == "fp32" else 2.0, "mfu": 0.05,
    "peak_memory_bytes": mem}
words = "mlp on cpu: fp32 826.0 ms/step, bf16 340.4 ms/step, 2.43x"
report = {"label": "cpu", "device": {"kind": "cpu", "name": "EPYC", "memory": "peak RSS (process)"},
    "headline": "; ".join([words] * 8),
    "models": {"mlp": {"results": [ok("fp32", 10, 5, 30, 2**30),
        {"mode": "apex-O1", "status": "skipped", "reason": "apex.amp runs on NPU/GPU only"},
        ok("bf16", 4, 3, 5, None),
        {"mode": "apex-O2", "status": "failed", "reason": "RuntimeError: boom"}]}}}
fig = amp_bench.figure(report)
ax, mem = fig.axes[0], fig.axes[1]
gids = sorted({a.get_gid() for a in fig.findobj() if a.get_gid()})
labels = {t.get_text(): t for t in ax.texts if t.get_gid() is None}
colours = sorted({tuple(p.get_facecolor()) for p in ax.patches if p.get_gid() is None})
print(json.dumps({
    "gids": gids,
    "skipped_text": [t.get_text().replace(chr(10), " ") for t in ax.texts if t.get_gid()],
    # each label sits on its error bar's top (the max), offset upward: never on the cap
    "label_y": {k.split(chr(10))[0]: t.xy[1] for k, t in labels.items()},
    "not_measured": [t.get_text() for t in mem.texts],
    "bar_colours": len(colours),
    "title": fig._suptitle.get_text(),
}))
print(amp_bench.chart(report, Path(sys.argv[2])))
"""


def test_the_chart_marks_skipped_modes_keeps_labels_off_the_caps_and_wraps_its_title(
    bench_python, tmp_path
):
    proc = subprocess.run(
        [bench_python, "-c", CHART_CHECK, str(BENCH), str(tmp_path / "c.png")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    seen = json.loads(proc.stdout.splitlines()[0])
    assert proc.stdout.splitlines()[1] == "None"  # drawn
    assert seen["gids"] == ["skipped:mlp:apex-O1", "skipped:mlp:apex-O2"]
    assert any("skipped: apex.amp runs on NPU/GPU only" in t for t in seen["skipped_text"])
    assert any("failed: RuntimeError: boom" in t for t in seen["skipped_text"])
    assert seen["label_y"] == {
        "reference": 30,
        "2.00×": 5,
    }  # at the caps' top (offset above it in points)
    # fp32's MiB above its bar; bf16's memory was not measured: said, not drawn as a 0 bar
    assert seen["not_measured"] == ["1024", "not measured"]
    assert seen["bar_colours"] == 2  # fp32 and bf16 in their own colours
    title = seen["title"].splitlines()
    assert title[0] == "cpu on cpu (EPYC)" and len(title) == 3
    assert title[-1].endswith("… (full text in results.md)")
    body = " ".join(title[1:]).replace(" … (full text in results.md)", "")
    assert all(
        word in report_words() for word in body.split()
    )  # whole words only: nothing cut mid-word
    text = png_text(tmp_path / "c.png")
    assert [x["mode"] for x in json.loads(text["Skipped modes"])] == ["apex-O1", "apex-O2"]


def report_words() -> set:
    return set(
        ["mlp", "on", "cpu:", "fp32", "826.0", "ms/step,", "bf16", "340.4", "ms/step,", "2.43x;"]
    ) | {"2.43x"}


def test_bench_names_the_wheel_and_machine_flags_a_loaded_host_and_ends_with_its_files(
    bench_python, tmp_path
):
    """Issue 41: the chart's title names the wheel's target id (nox -s bench passes it) and the machine; the report
    says whether the host was loaded, against a stated bound; the last lines are the report's three files."""
    import platform

    out = tmp_path / "out"
    argv = [bench_python, str(BENCH / "amp_bench.py"), "--device", "cpu", "--model", "mlp"]
    result = subprocess.run(
        [*argv, "--modes", "fp32,autocast-bf16", "--optimizers", "none", "--out", str(out), *SMALL],
        capture_output=True, text=True, timeout=900, cwd=tmp_path,
        env=dict(os.environ, APEXKIT_TARGET_ID="py3.11-torch2.13.0-x86_64-master"),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stderr.splitlines()[-3:] == [
        f"report: {out / name}" for name in ("results.json", "results.md", "results.png")
    ]
    report = json.loads((out / "results.json").read_text())
    check, host = report["loaded_host"], report["host"]
    assert report["target"] == "py3.11-torch2.13.0-x86_64-master"
    assert check["spread_bound_p90_p10"] == 1.5 and check["max_spread_p90_p10"] > 0
    assert check["loaded"] is bool(check["reasons"])
    busy = max(host["load_avg_start"][0], host["load_avg_end"][0]) > host["cores"]
    assert check["loaded"] is (busy or check["max_spread_p90_p10"] > 1.5), check
    said = [
        line for line in result.stderr.splitlines() if line.startswith("warning: loaded host (")
    ]
    markdown = (out / "results.md").read_text()
    if check["loaded"]:
        assert len(said) == 1 and "**loaded host**: " + "; ".join(check["reasons"]) in markdown
    else:
        assert not said and "quiet host: 1-minute load within the cores" in markdown
    title = png_text(out / "results.png")["Title"]
    assert title.startswith("cpu on cpu (") and (
        f"wheel py3.11-torch2.13.0-x86_64-master · host {platform.node()} ({platform.machine()}, "
        f"{host['cores']} cores)" in title
    )
    assert ("LOADED HOST" in title) is check["loaded"]


LOADED_CHECK = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
import amp_bench

row = lambda p10, p90: {"mode": "fp32", "status": "ok", "step_ms_p10": p10, "step_ms_p90": p90}
report = lambda start, end, p10, p90: {"host": {"cores": 2, "load_avg_start": [start, 1, 1], "load_avg_end": [end, 1, 1]},
    "models": {"mlp": {"results": [row(p10, p90), {"mode": "apex-O1", "status": "skipped"}]}}}
print(json.dumps([amp_bench.loaded_host(report(0.5, 1.9, 10, 14)), amp_bench.loaded_host(report(2.5, 0.1, 10, 14)),
    amp_bench.loaded_host(report(0.5, 0.5, 10, 16))]))
"""


def test_a_loaded_host_is_the_load_above_the_cores_or_a_wide_spread(bench_python):
    proc = subprocess.run(
        [bench_python, "-c", LOADED_CHECK, str(BENCH)], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr
    quiet, busy, spread = json.loads(proc.stdout)
    assert quiet == {
        "loaded": False, "reasons": [], "spread_bound_p90_p10": 1.5, "max_spread_p90_p10": 1.4,
    }  # fmt: skip
    assert busy["loaded"] and busy["reasons"] == [
        "1-minute load 2.5 above the 2 cores at the start"
    ]
    assert spread["reasons"] == ["p90/p10 step time 1.60× for mlp fp32, beyond 1.5×"]


def test_bench_runs_fp16_where_this_torchs_cpu_autocast_has_it(bench_python, tmp_path):
    """torch 2.13's CPU autocast takes float16 and torch.amp.GradScaler('cpu') exists: the mode runs (on torch 2.1
    the same mode is skipped with its reason: tests/e2e/test_bench_stacks.py)."""
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
        "--no-png",
        "--out",
        str(out),
        *SMALL,
    )
    assert result.returncode == 0, result.stderr
    report = json.loads((out / "results.json").read_text())
    caps = report["capabilities"]
    assert caps["autocast"]["float16"] == {"ok": True, "via": "torch.autocast('cpu')", "reason": ""}
    assert caps["grad_scaler"]["via"] == "torch.amp.GradScaler('cpu')"
    assert caps["distributed"] == {"ok": True, "backend": "gloo", "reason": ""}
    fp16 = report["models"]["mlp"]["results"][1]
    assert fp16["mode"] == "autocast-fp16" and fp16["status"] == "ok" and fp16["parity_ok"], fp16
    assert (
        "autocast float16 yes, bfloat16 yes; GradScaler torch.amp.GradScaler('cpu')"
        in (out / "results.md").read_text()
    )


def test_a_mode_that_fails_is_a_row_not_a_traceback(bench_python):
    """A mode that passes its probe and then fails while running is reported as failed, the other modes still run."""
    code = f"""
import sys, types
sys.path.insert(0, {str(BENCH)!r})
import amp_bench, device_adapter

class NoSuchDevice:  # torch.npu as seen on a host without the NPU: every tensor move fails
    def current_device(self):
        return 0
    def synchronize(self, index):
        pass
    def reset_peak_memory_stats(self, index):
        pass

args = amp_bench.parse_args(["--modes", "fp32", "--scale", "0.05", "--warmup", "1", "--repeats", "1", "--steps", "1"])
models = amp_bench.run_models(["mlp"], args, device_adapter.Device("npu", index=0, backend=NoSuchDevice()), rank=0)
row = models["mlp"]["results"][0]
assert row["status"] == "failed" and row["reason"], row
assert models["mlp"]["sizes"]["batch"] > 0  # the sizes come from the model even when no mode ran
print(row["reason"])
"""
    result = subprocess.run([bench_python, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert (
        "mlp          fp32           failed: " in result.stderr and "Traceback" not in result.stderr
    )
    assert "npu" in result.stdout.lower()


@pytest.fixture(scope="session")
def npu_python(tmp_path_factory) -> str:
    """torch 2.13.0 + the real torch_npu 2.13.0 from the package index, and no CANN: as on a build host."""
    venv = tmp_path_factory.mktemp("npu-venv") / "venv"
    subprocess.run([sys.executable, "-m", "virtualenv", "-q", str(venv)], check=True)
    python = str(venv / "bin" / "python")
    proc = subprocess.run(
        [
            python,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-compile",
            "torch==2.13.0",
            "torch-npu==2.13.0",
        ],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return python


@pytest.mark.network
def test_bench_and_validate_run_on_cpu_with_torch_npu_installed_and_no_cann(npu_python, tmp_path):
    plain = subprocess.run(
        [npu_python, "-c", "import torch"],
        capture_output=True,
        text=True,
        timeout=300,
        env={k: v for k, v in os.environ.items() if k != "TORCH_DEVICE_BACKEND_AUTOLOAD"},
    )
    assert (
        plain.returncode != 0 and "Failed to load the backend extension: torch_npu" in plain.stderr
    )  # the trap
    out = tmp_path / "out"
    result = run(
        npu_python,
        "amp_bench.py",
        "--device",
        "auto",
        "--model",
        "mlp",
        "--modes",
        "fp32,autocast-bf16",
        "--no-png",
        "--out",
        str(out),
        *SMALL,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads((out / "results.json").read_text())
    assert report["device"]["kind"] == "cpu" and report["versions"]["torch_npu"] == "2.13.0"
    validate = run(
        npu_python, "validate_env.py", "--device", "cpu", "--json", str(tmp_path / "v.json")
    )
    assert validate.returncode == 0, validate.stdout + validate.stderr
    checks = {c["check"]: c for c in json.loads((tmp_path / "v.json").read_text())["checks"]}
    assert checks["torch_npu"]["status"] == "skip" and "libhccl.so" in checks["torch_npu"]["detail"]
    assert "set_env.sh" in checks["torch_npu"]["hint"]
    assert checks["torch.autocast step"]["status"] == "ok"


def test_bench_reports_apex_as_skipped_when_apex_cannot_import_on_an_accelerator(bench_python):
    code = (
        f"import sys; sys.path.insert(0, {str(BENCH)!r}); import amp_bench, device_adapter;"
        "d = device_adapter.Device('cuda', index=0, backend=object());"
        "print(amp_bench.mode_status('apex-O1', d))"
    )
    result = subprocess.run([bench_python, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "apex not importable" in result.stdout and "install the apexkit wheel" in result.stdout


def test_device_adapter_synchronises_before_reading_the_clock(bench_python):
    code = f"""
import sys, time
sys.path.insert(0, {str(BENCH)!r})
import device_adapter

class Recorder:  # stands in for torch.npu / torch.cuda, which this machine does not have
    def __init__(self):
        self.calls = []
    def synchronize(self, index):
        self.calls.append(("sync", index, time.perf_counter()))
    def reset_peak_memory_stats(self, index):
        self.calls.append(("reset", index))
    def max_memory_allocated(self, index):
        return 12345
    def get_device_name(self, index):
        return "recorder"
    def device_count(self):
        return 1

rec = Recorder()
npu = device_adapter.Device("npu", index=3, backend=rec)
stamp = npu.now()
assert rec.calls[-1][:2] == ("sync", 3) and rec.calls[-1][2] <= stamp, rec.calls
npu.reset_peak_memory()
assert rec.calls[-1] == ("reset", 3) and npu.peak_memory_bytes() == 12345
assert npu.describe() == dict(kind="npu", index=3, name="recorder", count=1, memory="npu max_memory_allocated")
cpu = device_adapter.Device("cpu")
cpu.reset_peak_memory()
before = cpu.peak_memory_bytes()
block = bytearray(64 * 2**20)
block[::4096] = b"x" * len(block[::4096])
assert cpu.peak_memory_bytes() >= before + 60 * 2**20  # peak RSS follows real allocations
import torch
with cpu.autocast(torch.bfloat16):
    assert (torch.ones(4, 4) @ torch.ones(4, 4)).dtype == torch.bfloat16
assert cpu.grad_scaler(True) is not None and cpu.grad_scaler(False) is None
print("ok")
"""
    result = subprocess.run([bench_python, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr


def test_nproc_2_runs_ddp_on_cpu_with_gloo(bench_python, tmp_path):
    out = tmp_path / "ddp"
    result = run(
        bench_python,
        "amp_bench.py",
        "--device",
        "cpu",
        "--nproc",
        "2",
        "--model",
        "mlp",
        "--modes",
        "fp32,autocast-bf16,bf16",
        "--out",
        str(out),
        *SMALL,
    )
    assert result.returncode == 0, result.stderr
    assert "torch.distributed.run" in result.stderr
    report = json.loads((out / "results.json").read_text())
    assert report["config"]["nproc"] == 2
    fp32 = report["models"]["mlp"]["results"][0]
    # aggregate throughput: both ranks' batches per (slowest rank's) median step
    batch = report["models"]["mlp"]["sizes"]["batch"]
    assert fp32["samples_per_s"] == pytest.approx(
        2 * batch / (fp32["step_ms_median"] / 1000), rel=1e-4
    )
    # bf16 all-reduces its fp32 master gradients itself (not DDP's bf16 all-reduce): it runs and keeps parity
    bf16 = report["models"]["mlp"]["results"][2]
    assert bf16["status"] == "ok" and bf16["master_weights"] == "float32" and bf16["parity_ok"], (
        bf16
    )


def test_compare_renders_runs_side_by_side_and_refuses_different_sizes(bench_python, tmp_path):
    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    common = ["--device", "cpu", "--model", "mlp", "--modes", "fp32,autocast-bf16", "--no-png"]
    assert (
        run(
            bench_python, "amp_bench.py", *common, "--label", "run-a", "--out", str(a), *SMALL
        ).returncode
        == 0
    )
    assert (
        run(
            bench_python, "amp_bench.py", *common, "--label", "run-b", "--out", str(b), *SMALL
        ).returncode
        == 0
    )
    table = run(
        bench_python, "amp_bench.py", "--compare", str(a / "results.json"), str(b / "results.json")
    )
    assert table.returncode == 0, table.stderr
    assert "run-a step (speedup)" in table.stdout and "run-b step (speedup)" in table.stdout
    assert "| mlp | autocast-bf16 |" in table.stdout
    bigger = [x if x != "0.05" else "0.1" for x in SMALL]
    assert run(bench_python, "amp_bench.py", *common, "--out", str(c), *bigger).returncode == 0
    refused = run(
        bench_python, "amp_bench.py", "--compare", str(a / "results.json"), str(c / "results.json")
    )
    assert refused.returncode == 2 and "sizes differ" in refused.stderr


def test_bad_mode_is_a_usage_error(bench_python):
    result = run(bench_python, "amp_bench.py", "--modes", "fp8")
    assert result.returncode == 2 and "unknown mode 'fp8'" in result.stderr


# --- nox sessions -----------------------------------------------------------------------------------------------------


def test_build_then_bench_and_validate_in_the_wheels_venv(repos, tmp_path):
    from conftest import Runner

    runner = Runner(
        repos, tmp_path / "cache", tmp_path
    )  # its own cache: test_build expects a cold one
    reports = tmp_path / "reports"
    env = {
        "APEXKIT_DIST_DIR": str(runner.dist),
        "APEXKIT_BUILD_DIR": str(runner.build),
        "APEXKIT_REPORTS_DIR": str(reports),
        "APEXKIT_BENCH_ARGS": "--device cpu --model mlp --modes fp32,autocast-bf16 "
        + " ".join(SMALL),
    }
    argv = [
        sys.executable,
        "-m",
        "nox",
        "-f",
        str(ROOT / "noxfile.py"),
        "-s",
        "build-3.11",
        "bench",
    ]
    result = subprocess.run(
        argv, cwd=ROOT, env=runner.env(**env), capture_output=True, text=True, timeout=1500
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    target = next(
        p for p in runner.dist.iterdir() if not p.name.startswith(".")
    ).name  # not dist/.locks
    report = json.loads((reports / target / "bench" / "results.json").read_text())
    assert [r["mode"] for r in report["models"]["mlp"]["results"]] == ["fp32", "autocast-bf16"]
    assert (
        report["target"] == target
    )  # the chart's title names the wheel (nox -s bench passes its target id)

    env.pop("APEXKIT_BENCH_ARGS")
    validate = subprocess.run(
        [
            sys.executable,
            "-m",
            "nox",
            "-f",
            str(ROOT / "noxfile.py"),
            "-s",
            "validate",
            "--",
            "--device",
            "cpu",
        ],
        cwd=ROOT,
        env=runner.env(**env),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert validate.returncode == 0, validate.stdout[-3000:] + validate.stderr[-3000:]
    data = json.loads((reports / target / "validate.json").read_text())
    assert data["ok"] is True
    assert (
        "run-venvs" in data["python"]
    )  # it ran inside the wheel's venv, not in this process's environment
    failing = subprocess.run(
        [
            sys.executable,
            "-m",
            "nox",
            "-f",
            str(ROOT / "noxfile.py"),
            "-s",
            "validate",
            "--",
            "--device",
            "npu",
        ],
        cwd=ROOT,
        env=runner.env(**env),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert failing.returncode != 0 and "not ready" in failing.stdout + failing.stderr

    # one invocation, one `-- ARGS`: the build leaves --device cpu to validate, validate leaves --jobs 1 to the
    # build, and validate runs the target that build wrote
    both = subprocess.run(
        [*NOX, "-s", "build-3.11", "validate", "--", "--jobs", "1", "--device", "cpu"],
        cwd=ROOT,
        env=runner.env(**env),
        capture_output=True,
        text=True,
        timeout=900,
    )
    said = both.stdout + both.stderr
    assert both.returncode == 0, said[-3000:]
    assert "build-3.11: leaving --device cpu to validate (not build-3.11's options)" in said
    assert "validate: leaving --jobs 1 to build-3.11 (not validate's options)" in said
    assert f"validate: the wheel this nox invocation built, {runner.dist / target}" in said


NOX = [sys.executable, "-m", "nox", "-f", str(ROOT / "noxfile.py")]


def _other_build(dist: Path, python: str, torch: str) -> str:
    """A built target in dist/ (a small wheel and its manifest, as a build leaves them): its id."""
    import fakes

    folder = fakes.publishable(dist, python=python, torch=torch).parent
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["target"]["interpreter"] = sys.executable
    (folder / "manifest.json").write_text(json.dumps(manifest))
    return folder.name


def test_a_failed_build_stops_bench_in_the_same_invocation_instead_of_another_wheel(
    runner, tmp_path
):
    """Issue 41: the design card's `nox -s build-3.8 bench` with a build that fails and a py3.11 wheel in dist/."""
    other = _other_build(runner.dist, "3.11", "2.13.0")
    (tmp_path / "wheelhouse").mkdir()
    env = runner.env(
        APEXKIT_DIST_DIR=str(runner.dist),
        APEXKIT_REPORTS_DIR=str(tmp_path / "reports"),
        APEXKIT_CACHE_DIR=str(tmp_path / "cache"),
    )
    offline = ["--offline", "--wheelhouse", str(tmp_path / "wheelhouse")]  # nothing is downloaded
    argv = [*NOX, "-s", "build-3.8", "bench", "--", "--ascend-apex-url", "file:///nonexistent"]
    done = subprocess.run(
        [*argv, *offline, "--build-dir", str(runner.build), "--device", "cpu"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    said = done.stdout + done.stderr
    assert done.returncode != 0
    bench = said.split("Running session bench", 1)[1]
    assert (
        "bench: leaving --ascend-apex-url file:///nonexistent --build-dir "
        f"{runner.build} to build-3.8 (not bench's options)" in bench
    )
    assert (
        "build-3.8 failed in this nox invocation: bench takes no other wheel from dist/ -- next: fix the "
        "build (its error above) and run nox -s build-3.8 bench again" in bench
    )
    assert other not in bench and "run venv" not in bench and not (tmp_path / "reports").exists()
    assert "build-3.8: leaving --device cpu to bench" in said  # the build did not refuse it

    # a bare `nox -s bench` with two builds in dist/ says which it took and how to pick the other
    newer = _other_build(runner.dist, "3.8", "2.1.0")
    os.utime(runner.dist / newer / "manifest.json", (2e9, 2e9))
    bare = subprocess.run(
        [*NOX, "-s", "bench", "--", *offline],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert (
        f"2 builds in {runner.dist}/: taking the newest, {newer} (--target ID for another: {other})"
        in bare.stdout + bare.stderr
    )


def test_bench_without_a_build_says_what_to_do(runner, tmp_path):
    env = {"APEXKIT_DIST_DIR": str(tmp_path / "empty")}
    result = subprocess.run(
        [sys.executable, "-m", "nox", "-f", str(ROOT / "noxfile.py"), "-s", "bench"],
        cwd=ROOT,
        env=runner.env(**env),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode != 0
    assert "no built wheel" in result.stderr and "nox -s build-3.11" in result.stderr


def test_an_offline_bench_in_a_numpy_free_run_venv_says_why_there_is_no_chart(repos, tmp_path):
    """Issue 41: `nox -s build-3.11 bench -- --offline --wheelhouse W` with a wheelhouse of torch and the build deps
    alone (no NumPy, no matplotlib): torch's raw NumPy warning, the headline twice in a row and `no chart
    (--no-png)`, a flag the user never passed. Now: no warning, the headline once, the real reason and its fix."""
    from conftest import Runner

    runner = Runner(repos, tmp_path / "cache", tmp_path)
    house = tmp_path / "wheelhouse"
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "-q", "-d", str(house), "torch==2.13.0", "setuptools>=61", "wheel"],
        check=True, timeout=600, capture_output=True,
    )  # fmt: skip
    assert not list(house.glob("numpy-*")) and not list(house.glob("matplotlib-*"))
    env = runner.env(
        APEXKIT_DIST_DIR=str(runner.dist),
        APEXKIT_BUILD_DIR=str(runner.build),
        APEXKIT_REPORTS_DIR=str(tmp_path / "reports"),
        PIP_CONFIG_FILE=os.devnull,
    )
    env = {k: v for k, v in env.items() if not k.startswith(("PIP_FIND", "PIP_EXTRA", "PIP_INDEX"))}
    bench = ["--device", "cpu", "--model", "mlp", "--modes", "fp32", *SMALL]
    done = subprocess.run(
        [*NOX, "-s", "build-3.11", "bench", "--", "--offline", "--wheelhouse", str(house), *bench],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=1500,
    )  # fmt: skip
    said = done.stdout + done.stderr
    assert done.returncode == 0, said[-4000:]
    assert "Failed to initialize NumPy" not in said
    headline = "no mixed-precision mode ran"
    lines = [line.strip() for line in said.splitlines() if line.strip()]
    assert lines.count(headline) == 1, [line for line in lines if headline in line]
    assert "report: no chart (--no-png)" not in said
    assert (
        "report: no chart (no matplotlib in the run venv: offline, and the wheelhouse has none -- next: add "
        "matplotlib and its dependencies to the --wheelhouse (pip download -d DIR matplotlib)"
        in said
    )
