"""End to end: `--sanitize address,undefined` on the fixture (real gcc, real libasan/libubsan, torch 2.13.0): a
+asan diagnosis target whose smoke test and CPU tier run with the runtime preloaded; clean on our sources, and a
kernel that reads one element past its source is stopped with the finding and its stack."""

import json
import subprocess

import fixture_repos
from conftest import output

TARGET = "py3.11-torch2.13.0-x86_64-master+asan"


def test_sanitizer_build_is_its_own_target_and_runs_the_cpu_tier_under_asan(runner):
    proc = runner.nox("3.11", "--sanitize", "address,undefined")
    text = output(proc)
    assert proc.returncode == 0, text[-3000:]
    manifest = json.loads((runner.dist / TARGET / "manifest.json").read_text())
    assert manifest["identity"]["version"] == "0.1+ascend.torch2.13.0.asan"
    assert manifest["target"]["identity"]["sanitize"] == ["address", "undefined"]
    log = (runner.build / TARGET / "build.log").read_text()
    assert "-fsanitize=address,undefined" in log
    run = next(line for line in log.splitlines() if line.startswith("sanitizer run ("))
    assert "libasan.so" in run and "libubsan.so" in run
    tier = {r["name"]: r["status"] for r in manifest["smoke_test"]["cpu_tier"]["results"]}
    assert tier["edge cases (empty, offset 0, largest offset, non-contiguous, dtypes)"] == "ok"
    assert tier["change_data_ptr bound (largest valid offset, one past)"] == "ok"


def test_a_finding_stops_the_build_with_its_stack(runner, repos, tmp_path):
    checkout = tmp_path / "oob-apex"
    subprocess.run(["git", "clone", "-q", str(repos.ascend_path), str(checkout)], check=True)
    # the kernel reads the element just past src's end before moving the pointer: a heap-buffer-overflow
    source = fixture_repos.CHANGE_DATAPTR.replace(
        "  char* data_ptr =",
        "  volatile float past = static_cast<float*>(src.storage()->mutable_data())[src.numel()];\n"
        "  (void)past;\n  char* data_ptr =",
    )
    assert source != fixture_repos.CHANGE_DATAPTR
    (checkout / "src/csrc/combine_tensors/change_dataptr.cpp").write_text(source)
    git = ["git", "-C", str(checkout), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "commit", "-qam", "oob"], check=True)
    proc = runner.nox("3.11", "--apex-src", str(checkout), "--sanitize", "address,undefined")
    text = output(proc)
    assert proc.returncode != 0, text[-3000:]
    line = next(
        (x for x in text.splitlines() if "sanitizer finding in the smoke test / CPU tier" in x), ""
    )
    assert "heap-buffer-overflow; stack: #0 " in line and "change_data_ptr" in line, text[-3000:]
    assert "Traceback" not in text
    assert not any(p for p in runner.dist.glob("*") if not p.name.startswith("."))
