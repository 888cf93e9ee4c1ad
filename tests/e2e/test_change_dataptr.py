"""End to end: the change-dataptr-bound patch on the fixture's change_dataptr.cpp (shaped like Ascend master's,
tests/fixture_repos.py CHANGE_DATAPTR), proven by the CPU tier's boundary check in the build's own smoke test:
without the patch the out-of-bounds offset is accepted and the build refuses to publish; with it, offset 90 works
and 91 is refused with the kernel's own error."""

import json

from conftest import output

TARGET = "py3.11-torch2.13.0-x86_64-master"
CHECK = "change_data_ptr bound (largest valid offset, one past)"


def test_unpatched_kernel_accepts_the_out_of_bounds_offset_and_nothing_is_published(runner):
    proc = runner.nox("3.11", "--skip-patch", "change-dataptr-bound")
    text = output(proc)
    assert proc.returncode != 0, text[-3000:]
    errors = [
        line for line in text.splitlines() if "the CPU test tier failed in the clean venv" in line
    ]
    assert errors, text[-3000:]
    assert (
        f"{CHECK}: float32: out-of-bounds offset 91 accepted: dst covers bytes 364..404 of a 400-byte src"
        in (errors[-1])
    )
    assert "Traceback" not in text
    skipped = runner.dist / f"{TARGET}+skip-change-dataptr-bound"
    assert not skipped.exists()


def test_patched_kernel_takes_the_largest_offset_and_refuses_one_past(runner):
    proc = runner.nox("3.11")
    assert proc.returncode == 0, output(proc)[-3000:]
    manifest = json.loads((runner.dist / TARGET / "manifest.json").read_text())
    assert {p["id"]: p["status"] for p in manifest["patches"]}["change-dataptr-bound"] == "applied"
    tier = {r["name"]: r for r in manifest["smoke_test"]["cpu_tier"]["results"]}
    assert tier[CHECK]["status"] == "ok", tier[CHECK]
    assert (
        "offset 90 (the largest valid) reads src[90:100], offset 91 refused (Offsets overflow"
        in (tier[CHECK]["detail"])
    )
    assert tier["change_data_ptr round trip (fp32, fp16)"]["status"] == "ok"
