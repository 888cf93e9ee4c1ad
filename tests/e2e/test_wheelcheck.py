"""apexkit.wheel.wheelcheck on real ELF files: small shared objects compiled here with gcc/g++, each deliberately broken
in one way (the way a build can go wrong), and the good one that passes every check."""

from __future__ import annotations

import platform
import shutil
import subprocess
import zipfile
from pathlib import Path

import pytest

from apexkit.wheel import wheelcheck

pytestmark = pytest.mark.skipif(
    shutil.which("gcc") is None or shutil.which("g++") is None, reason="needs gcc/g++"
)

ARCH = platform.machine()
HARDENING = ("bind_now", "nx_stack", "relro", "stack_protector", "stripped")
C_SOURCE = """\
#include <string.h>
int apex_len(const char *s) { char local[64]; strncpy(local, s, 63); local[63] = 0; return (int)strlen(local); }
"""
GOOD_FLAGS = [
    "-fstack-protector-all",
    "-Wl,-z,now",
    "-Wl,-z,relro",
    "-Wl,-z,noexecstack",
    "-s",
    "-Wl,--disable-new-dtags,--rpath,$ORIGIN/torch/lib",
]


def compile_so(
    tmp: Path, name: str, flags: list[str], source: str = C_SOURCE, cxx: bool = False
) -> Path:
    src = tmp / (f"{name}.cpp" if cxx else f"{name}.c")
    src.write_text(source)
    out = tmp / f"{name}.so"
    subprocess.run(
        ["g++" if cxx else "gcc", "-shared", "-fPIC", "-O1", str(src), "-o", str(out), *flags],
        check=True,
        capture_output=True,
        text=True,
    )
    return out


def expect(**changes) -> wheelcheck.Expect:
    base = dict(arch=ARCH, rpath=("$ORIGIN/torch/lib",), hardening=HARDENING)
    base.update(changes)
    return wheelcheck.Expect(**base)


def failures(path: Path, exp: wheelcheck.Expect) -> list[str]:
    return wheelcheck.check_module(path, exp).failures


def test_the_good_build_passes_every_check(tmp_path):
    report = wheelcheck.check_module(compile_so(tmp_path, "good", GOOD_FLAGS), expect())
    assert report.failures == [] and report.notes == []
    assert report.needed == ["libc.so.6"] and report.rpath == ["$ORIGIN/torch/lib"]
    assert report.undefined > 0  # strlen, __stack_chk_fail: resolved statically from libc
    assert report.glibc and report.glibc.startswith("GLIBC_2.")


@pytest.mark.parametrize(
    ("check", "flags"),
    [
        ("hardening bind_now", ["-Wl,-z,lazy"]),
        ("hardening relro", ["-Wl,-z,norelro"]),
        ("hardening nx_stack", ["-Wl,-z,execstack"]),
        ("hardening stack_protector", ["-fno-stack-protector"]),
        ("rpath", ["-Wl,--rpath,/home/build/venv/torch/lib"]),
    ],
)
def test_each_broken_flag_fails_its_own_check(tmp_path, check, flags):
    good = [
        f
        for f in GOOD_FLAGS
        if not (check == "rpath" and "rpath" in f)
        and not (check == "hardening stack_protector" and f.startswith("-fstack"))
    ]
    path = compile_so(tmp_path, "broken", good + flags)  # the later flag wins, as in a link line
    found = failures(path, expect())
    assert len(found) == 1 and found[0].startswith(f"broken.so: {check}: "), found


def test_not_stripped_is_a_failure_only_when_setup_py_asks_for_it(tmp_path):
    path = compile_so(tmp_path, "unstripped", [f for f in GOOD_FLAGS if f != "-s"])
    assert failures(path, expect()) == [
        "unstripped.so: hardening stripped: not stripped (.symtab present), though "
        "setup.py asks for it"
    ]
    assert failures(path, expect(hardening=("relro", "bind_now"))) == []


def test_a_library_outside_the_allowed_set_fails_needed(tmp_path):
    evil = compile_so(tmp_path, "libevil", [], source="int evil(void) { return 1; }\n")
    path = compile_so(
        tmp_path,
        "linked",
        [*GOOD_FLAGS, f"-L{tmp_path}", "-Wl,--no-as-needed", "-levil"],
        source=C_SOURCE + "int evil(void);\nint use(void) { return evil(); }\n",
    )
    found = failures(path, expect(extra_lib_dirs=()))
    assert any(
        f.startswith("linked.so: needed: links libevil.so, outside torch's libraries")
        for f in found
    ), found
    # the same library declared by setup.py (libraries.append('evil')) and found: allowed, and its symbols resolve
    assert (
        failures(
            path,
            expect(
                declared_libs=("evil",),
                system_dirs=(str(evil.parent), *wheelcheck.system_dirs(ARCH)),
            ),
        )
        == []
    )


def test_an_undefined_symbol_no_needed_library_defines_fails(tmp_path):
    path = compile_so(
        tmp_path,
        "undef",
        GOOD_FLAGS,
        source=C_SOURCE
        + "int apex_missing_symbol(int);\nint call(int x) { return apex_missing_symbol(x); }\n",
    )
    found = failures(path, expect())
    assert (
        len(found) == 1
        and "symbols: 1 undefined symbol(s)" in found[0]
        and "apex_missing_symbol" in found[0]
    )


def test_the_elf_machine_must_be_the_target_arch(tmp_path):
    other = "aarch64" if ARCH == "x86_64" else "x86_64"
    found = failures(compile_so(tmp_path, "native", GOOD_FLAGS), expect(arch=other))
    assert found == [
        f"native.so: machine: ELF machine {wheelcheck.MACHINES[ARCH]}, the target is {other} "
        f"({wheelcheck.MACHINES[other]})"
    ]
    garbage = tmp_path / "garbage.so"
    garbage.write_bytes(b"not an elf at all")
    assert failures(garbage, expect())[0].startswith("garbage.so: elf: not an ELF file")


CXX_SOURCE = """\
#include <string>
std::string apex_name(const std::string& s) { return s + "-apex"; }
"""


@pytest.mark.parametrize(
    ("built", "torch_abi", "fails"), [(1, 1, False), (0, 0, False), (0, 1, True), (1, 0, True)]
)
def test_cxx11_abi_must_match_torch(tmp_path, built, torch_abi, fails):
    path = compile_so(
        tmp_path,
        f"abi{built}",
        [*GOOD_FLAGS, f"-D_GLIBCXX_USE_CXX11_ABI={built}"],
        CXX_SOURCE,
        cxx=True,
    )
    found = failures(path, expect(cxx11_abi=torch_abi))
    if fails:
        assert len(found) == 1 and f"abi{built}.so: cxx11-abi: " in found[0]
        assert f"_GLIBCXX_USE_CXX11_ABI={torch_abi}" in found[0] and "apex_name" in found[0], found
    else:
        assert found == []
    report = wheelcheck.check_module(path, expect(cxx11_abi=torch_abi))
    assert "libstdc++.so.6" in report.needed and report.glibcxx.startswith("GLIBCXX_3.4")


def test_check_wheel_reads_the_identity_from_metadata(tmp_path):
    wheel = tmp_path / "apex-0.1+ascend.torch2.13.0-cp311-cp311-linux_x86_64.whl"
    so = compile_so(tmp_path, "apex_C", GOOD_FLAGS)
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr(
            "apex-0.1+ascend.torch2.13.0.dist-info/METADATA",
            "Metadata-Version: 2.1\nName: apex\nVersion: 0.1+ascend.torch2.13.0\nRequires-Dist: torch==2.13.0\n",
        )
        zf.write(so, "apex_C.cpython-311-x86_64-linux-gnu.so")
    ok = wheelcheck.check_wheel(wheel, expect(), "0.1+ascend.torch2.13.0", ["torch==2.13.0"])
    assert ok["failures"] == [] and ok["requires_dist"] == ["torch==2.13.0"] and ok["max_glibc"]
    bad = wheelcheck.check_wheel(wheel, expect(), "0.1+ascend.torch2.7.1", ["torch==2.7.1"])
    assert [f.split(": ")[1] for f in bad["failures"]] == ["identity", "identity"]
    assert (
        "METADATA Version 0.1+ascend.torch2.13.0, expected 0.1+ascend.torch2.7.1"
        in bad["failures"][0]
    )
