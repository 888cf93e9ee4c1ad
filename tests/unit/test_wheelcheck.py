"""apexkit.wheel.wheelcheck and the version label, in-process: what setup.py asks for, PEP 440 labels and pins, a
renamed or tampered wheel, bench/cpu_tier.py's JUnit. The checks on real ELF files compiled with gcc/g++ are in
tests/e2e/test_wheelcheck.py."""

from __future__ import annotations

import zipfile

import fakes
import fixture_repos
import pytest
from conftest import ROOT
from packaging.requirements import Requirement
from packaging.version import Version

from apexkit.plan import target
from apexkit.wheel import wheelcheck

HARDENING = ("bind_now", "nx_stack", "relro", "stack_protector", "stripped")


def test_what_setup_py_asks_for_is_read_from_it():
    setup = fixture_repos.ascend_tree(fixture_repos.nvidia_files(), False, True)["setup.py"]
    assert wheelcheck.hardening_asked(setup) == HARDENING
    assert wheelcheck.declared_libs(setup) == ("c10", "torch", "torch_cpu", "torch_python")
    assert (
        wheelcheck.hardening_asked("setup(name='apex')\n") == ()
    )  # refs that use torch's own CppExtension
    assert wheelcheck.hardening_asked(
        "secure_link_args = ['-s']\nsecure_link_args.append('-Wl,-z,now')\n"
    ) == ("bind_now", "stripped")


@pytest.mark.parametrize(
    ("torch", "npu", "label", "requires"),
    [
        ("2.13.0", None, ".torch2.13.0", ["torch==2.13.0"]),
        ("2.13.0+cpu", None, ".torch2.13.0", ["torch==2.13.0"]),
        (
            "2.7.1",
            "2.7.1.post8",
            ".torch2.7.1.npu2.7.1.post8",
            ["torch==2.7.1", "torch_npu==2.7.1.*"],
        ),
        ("2.1.0", "2.1.0rc1", ".torch2.1.0.npu2.1.0rc1", ["torch==2.1.0", "torch_npu==2.1.0.*"]),
    ],
)
def test_version_label_and_pins_are_pep440(torch, npu, label, requires):
    t = target.Target.of("3.11", torch, "x86_64", torch_npu=npu)
    assert t.label == label and t.version == target.BASE_VERSION + label
    version = Version(t.version)
    assert str(version) == target.BASE_VERSION + label and version.public == "0.1"
    assert target.read_version(version) == target.Label("ascend", Version(torch).public, npu)
    assert t.requires(links_torch_npu=False) == requires
    pins = [Requirement(r) for r in requires]
    assert pins[0].specifier.contains(
        torch.split("+")[0] + "+cpu"
    )  # any local build of that torch release
    assert not pins[0].specifier.contains("2.13.1") and not pins[0].specifier.contains("2.6.0")
    if npu:
        assert pins[1].specifier.contains(npu) and not pins[1].specifier.contains("2.8.0")
        assert t.requires(links_torch_npu=True)[1] == f"torch_npu=={Version(npu).public}"


def test_cpu_tier_junit_records_each_status(tmp_path):
    """bench/cpu_tier.py's JUnit writer (the NPU tier writes the same): one testcase per check, fail/skip marked."""
    import importlib.util
    import xml.etree.ElementTree as ET

    spec = importlib.util.spec_from_file_location("cpu_tier", ROOT / "bench" / "cpu_tier.py")
    tier = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tier)
    results = [
        {"name": "a", "status": "ok", "detail": "fine", "seconds": 0.1},
        {"name": "b", "status": "fail", "detail": "dst reads [0.0]", "seconds": 0.0},
        {"name": "c", "status": "skip", "detail": "needs torch_npu", "seconds": 0.0},
    ]
    tier.write_junit(str(tmp_path / "out.xml"), "apex-cpu-tier", results)
    root = ET.parse(tmp_path / "out.xml").getroot()
    assert (root.get("tests"), root.get("failures"), root.get("skipped")) == ("3", "1", "1")
    cases = {c.get("name"): c for c in root.iter("testcase")}
    assert cases["b"].find("failure").get("message") == "dst reads [0.0]"
    assert cases["c"].find("skipped").get("message") == "needs torch_npu" and len(cases["a"]) == 0


def test_a_renamed_or_tampered_wheel_disagrees_with_itself(tmp_path):
    renamed = fakes.make_wheel(
        tmp_path, "apex-0.1+ascend.torch2.13.0-cp311-cp311-manylinux_2_17_x86_64.whl"
    )
    assert any(
        "WHEEL says Tag cp311-cp311-linux_x86_64" in p for p in wheelcheck.wheel_problems(renamed)
    )
    good = fakes.make_wheel(tmp_path)
    tampered = tmp_path / "t" / fakes.LINUX
    tampered.parent.mkdir()
    with zipfile.ZipFile(good) as src, zipfile.ZipFile(tampered, "w") as dst:
        for info in src.infolist():
            data = src.read(info)
            dst.writestr(info, b"\x7fELF other" if info.filename.endswith(".so") else data)
    assert wheelcheck.wheel_problems(tampered) == [
        "apex_C.cpython-311-x86_64-linux-gnu.so: differs from its RECORD row"
    ]
