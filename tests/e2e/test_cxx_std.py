"""End to end, slow (torch 2.14.1, the CUDA build on this machine's disk, ~3 GB into a build venv and again into the
smoke venv): the fixture's npu.patch appends -std=c++17 like Ascend's, and its change_dataptr.cpp includes
c10/core/StorageImpl.h, which torch 2.14 compiles only as C++20. Without the cxx-std patch the compile fails with the
known-failure hint; with it, the wheel builds and passes its smoke test and CPU tier."""

import json

import pytest
from conftest import output

TARGET = "py3.11-torch2.14.1-x86_64-master"


@pytest.mark.slow
def test_fixture_builds_against_torch_2_14_1_only_with_the_cxx_std_patch(runner):
    proc = runner.nox("3.11", "--torch", "2.14.1", "--skip-patch", "cxx-std")
    text = output(proc)
    assert proc.returncode != 0, text[-3000:]
    errors = [line for line in text.splitlines() if "setup.py failed" in line]
    assert errors and "known failure 'cxx-std-too-old': keep the cxx-std patch" in errors[-1], text[
        -3000:
    ]
    assert "strong_ordering" in (runner.build / f"{TARGET}+skip-cxx-std" / "build.log").read_text()

    proc = runner.nox("3.11", "--torch", "2.14.1")
    assert proc.returncode == 0, output(proc)[-3000:]
    build_log = (runner.build / TARGET / "build.log").read_text()
    said = next(line for line in build_log.splitlines() if line.startswith("apexkit cxx-std:"))
    assert said.startswith("apexkit cxx-std: -std=c++20 (npu.patch: -std=c++17; torch 2.14.1")
    assert said.endswith("requires c++20)")  # torch.__version__ is 2.14.1+cu130 here
    assert "-std=c++20" in build_log and "'-std=c++17'" not in build_log
    manifest = json.loads((runner.dist / TARGET / "manifest.json").read_text())
    assert {p["id"]: p["status"] for p in manifest["patches"]}["cxx-std"] == "applied"
    tier = {r["name"]: r["status"] for r in manifest["smoke_test"]["cpu_tier"]["results"]}
    assert tier["change_data_ptr bound (largest valid offset, one past)"] == "ok"
