"""End to end: nox build sessions against the fixture repos, with real venvs, the real torch wheel and real g++."""

import json
import subprocess
import sys
import zipfile
from pathlib import Path

import fixture_repos
import pytest
import wheelnames
from conftest import ROOT, output

WHEEL = wheelnames.fixture_wheel()  # manylinux_2_24 where auditwheel computes it
TARGET = "py3.11-torch2.13.0-x86_64-master"


def dynamic_section(wheel: Path, module: str, tmp: Path) -> str:
    with zipfile.ZipFile(wheel) as zf:
        name = next(n for n in zf.namelist() if n.startswith(module) and n.endswith(".so"))
        zf.extract(name, tmp)
    return subprocess.run(
        ["readelf", "-d", str(tmp / name)], capture_output=True, text=True, check=True
    ).stdout


def test_nox_lists_one_build_session_per_python():
    out = subprocess.run(
        [sys.executable, "-m", "nox", "-l", "-f", str(ROOT / "noxfile.py")],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    for python in ("3.8", "3.9", "3.10", "3.11"):
        assert (
            f"build-{python} [build] -> Build the Apex for Ascend wheel for Python {python}" in out
        )


def test_build_311_end_to_end_then_wheel_cache_hit(runner, repos, tmp_path):
    proc = runner.nox(
        "3.11", "--no-cache"
    )  # a compile, whatever ran before: --no-cache skips the lookup, not the store
    assert proc.returncode == 0, output(proc)[-3000:]
    dist = runner.dist / TARGET
    assert sorted(p.name for p in dist.iterdir()) == [
        WHEEL,
        "manifest.json",
        "provenance.json",
        "sbom.cdx.json",
    ]
    manifest = json.loads((dist / "manifest.json").read_text())
    assert manifest["sources"]["nvidia_apex"]["commit"] == repos.nvidia_pin
    assert (
        manifest["sources"]["ascend_apex"]["commit"]
        == subprocess.run(
            ["git", "-C", str(repos.ascend_path), "rev-parse", "master"],
            capture_output=True,
            text=True,
        ).stdout.strip()
    )
    assert {p["id"]: p["status"] for p in manifest["patches"]} == {
        "torch-location": "applied",
        "pep440-version": "applied",
        "rpath-link-flag": "applied",
        "cxx11-abi": "applied",
        "cxx-std": "applied",
        "change-dataptr-bound": "applied",
    }
    build_log = (runner.build / TARGET / "build.log").read_text()
    assert (
        "-D_GLIBCXX_USE_CXX11_ABI=1" in build_log
    )  # torch 2.13.0's ABI, passed by the cxx11-abi patch
    assert (
        manifest["wheel"]["sha256"]
        == __import__("hashlib").sha256((dist / WHEEL).read_bytes()).hexdigest()
    )
    assert manifest["tools"]["torch"].startswith("2.13.0") and manifest["tools"]["setuptools"]
    assert manifest["cache_hit"] is False and manifest["durations_s"]["total"] > 0
    smoke = manifest["smoke_test"]
    assert smoke["modules"]["apex_C"]["ok"] and smoke["modules"]["change_data_ptr"]["ok"]
    assert smoke["apex"].startswith("needs NPU runtime")  # reported, not a failure
    tier = {
        r["name"]: r for r in smoke["cpu_tier"]["results"]
    }  # bench/cpu_tier.py in the clean venv
    assert tier["every apex module byte-compiles"]["status"] == "ok"
    assert (
        tier["import apex"]["status"] == "skip"
        and "stops at apex/__init__.py:2" in tier["import apex"]["detail"]
    )
    assert "needs torch_npu + the CANN runtime" in tier["import apex"]["detail"]
    # the fixture's change_data_ptr is shaped like Ascend's (tests/fixture_repos.py): round trip and bound run
    assert tier["change_data_ptr round trip (fp32, fp16)"]["status"] == "ok"
    assert tier["change_data_ptr bound (largest valid offset, one past)"]["status"] == "ok"
    # torch 2.13's headers need C++17 only: the cxx-std patch keeps npu.patch's standard
    said = next(line for line in build_log.splitlines() if line.startswith("apexkit cxx-std:"))
    assert said.startswith("apexkit cxx-std: -std=c++17 (npu.patch: -std=c++17; torch 2.13.0")
    assert said.endswith("requires c++17)")
    assert not runner.marker.exists()  # Ascend's build.sh was never run

    # Identity: the local label carries the build tuple, METADATA pins the torch it was built against.
    assert manifest["identity"]["version"] == "0.1+ascend.torch2.13.0"
    metadata = subprocess.run(
        ["unzip", "-p", str(dist / WHEEL), "*/METADATA"], capture_output=True, text=True, check=True
    ).stdout
    assert (
        "Version: 0.1+ascend.torch2.13.0\n" in metadata
        and "Requires-Dist: torch==2.13.0\n" in metadata
    )
    # The binary checks passed and say what they saw; the glibc figures are the modules' own symbol versions.
    checks = manifest["binary_checks"]
    assert checks["failures"] == [] and len(checks["modules"]) == 2
    assert checks["expect"]["hardening"] == [
        "bind_now",
        "nx_stack",
        "relro",
        "stack_protector",
        "stripped",
    ]
    assert checks["expect"]["cxx11_abi"] == 1 and checks["expect"]["rpath"] == ["$ORIGIN/torch/lib"]
    assert manifest["identity"]["max_glibc"].startswith("GLIBC_2.")
    assert manifest["identity"]["max_glibcxx"].startswith("GLIBCXX_3.4")
    assert "binary checks" in output(proc) and "2 module(s) pass" in output(proc)

    # The rpath patch: torch's lib dir relative to the installed module, and NEEDED libstdc++ kept.
    dyn = dynamic_section(dist / WHEEL, "apex_C", tmp_path)
    assert "Library rpath: [$ORIGIN/torch/lib]" in dyn
    assert "[libstdc++.so.6]" in dyn and "[libc10.so]" in dyn

    again = runner.nox("3.11", APEXKIT_CACHE_WARN_GIB="0.00001")  # a cache past ~10 KiB is "grown"
    assert again.returncode == 0, output(again)[-3000:]
    assert "wheel cache hit" in output(again) and "▸ compile" not in output(again)
    # past the threshold the last lines name the cache's size and prune; below it (default 30 GiB) they do not
    grown = [line for line in output(again).splitlines() if line.startswith("! the apexkit cache ")]
    assert len(grown) == 1 and "cache.prune --older-than 30 --dry-run" in grown[0], grown
    assert "! the apexkit cache " not in output(proc)
    # the last lines say where the manifest is and how to install the wheel next to its torch
    assert f"  manifest: {dist / 'manifest.json'}" in output(again)
    assert "  install:  nox -s install -- --venv VENV   (the training venv" in output(again)
    assert f"            or pip install torch==2.13.0 {dist / WHEEL}" in output(again)
    manifest2 = json.loads((dist / "manifest.json").read_text())
    assert (
        manifest2["cache_hit"] is True
        and manifest2["wheel"]["sha256"] == manifest["wheel"]["sha256"]
    )


def test_bare_rpath_trap_is_real_without_our_patch(runner, tmp_path):
    good = runner.nox(
        "3.11", "--no-smoke-test"
    )  # the good wheel first (a cache hit after the end-to-end test)
    assert good.returncode == 0, output(good)[-3000:]
    good_bytes = (runner.dist / TARGET / WHEEL).read_bytes()
    proc = runner.nox("3.11", "--skip-patch", "rpath-link-flag", "--no-smoke-test")
    assert proc.returncode == 0, output(proc)[-3000:]
    # a diagnosis build has its own target: the good wheel that `invoke publish` would ship is untouched
    assert (runner.dist / TARGET / WHEEL).read_bytes() == good_bytes
    trap = runner.dist / f"{TARGET}+skip-rpath-link-flag"
    assert json.loads((trap / "manifest.json").read_text())["target"]["identity"] == {
        "skip_patches": ["rpath-link-flag"]
    }
    # the binary checks name what is wrong; a diagnosis build keeps its wheel, with the verdict in its manifest
    failures = json.loads((trap / "manifest.json").read_text())["binary_checks"]["failures"]
    assert any(": rpath: RPATH " in f and "expected (none)" in f for f in failures), failures
    assert "binary check (diagnosis build, --skip-patch)" in output(proc)
    # its wheel carries the tag its own symbols allow: without NEEDED libstdc++ that can be older than the good one's
    trap_manifest = json.loads((trap / "manifest.json").read_text())
    trap_wheel = trap / trap_manifest["wheel"]["file"]
    assert trap_wheel.is_file() and trap_wheel.name.endswith(
        f"-{trap_manifest['binary_checks']['platform'].get('wheel_tag') or 'linux_x86_64'}.whl"
    )
    dyn = dynamic_section(trap_wheel, "apex_C", tmp_path)
    assert "$ORIGIN/torch/lib" not in dyn
    assert "Library rpath: [" in dyn  # the linker swallowed the next argument as the rpath ...
    assert "[libstdc++.so.6]" not in dyn  # ... and lost NEEDED libstdc++


@pytest.fixture(scope="module")
def lib64_torch(tmp_path_factory) -> Path:
    """torch installed where openEuler keeps it: <prefix>/lib64/python3.11/site-packages, outside sys.prefix/lib."""
    site = tmp_path_factory.mktemp("system") / "lib64" / "python3.11" / "site-packages"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-compile",
            "--target",
            str(site),
            "torch==2.13.0",
        ],
        check=True,
        capture_output=True,
    )
    return site


def test_lib64_torch_fails_without_our_patch_and_builds_with_it(runner, lib64_torch):
    broken = runner.nox(
        "3.11",
        "--use-system-torch",
        "--skip-patch",
        "torch-location",
        "--no-smoke-test",
        PYTHONPATH=str(lib64_torch),
    )
    text = output(broken)
    assert broken.returncode != 0
    assert "No such file or directory" in text and (
        "c10/core/Device.h" in text or "cannot find -lc10" in text
    )
    assert "known failure 'hardcoded-site-packages'" in text  # the hint is printed
    assert not runner.dist.exists() or not any(runner.dist.iterdir())  # nothing half-written
    assert not runner.dist.exists() or not [p for p in runner.dist.iterdir() if ".tmp-" in p.name]
    assert (
        runner.build / f"{TARGET}+skip-torch-location+system-torch" / "build.log"
    ).is_file()  # the full log is kept

    fixed = runner.nox("3.11", "--use-system-torch", PYTHONPATH=str(lib64_torch))
    assert fixed.returncode == 0, output(fixed)[-3000:]
    manifest = json.loads((runner.dist / f"{TARGET}+system-torch" / "manifest.json").read_text())
    assert manifest["smoke_test"]["modules"]["apex_C"]["ok"]
    assert manifest["target"]["torch"].startswith("2.13.0")


def test_drift_stops_before_compiling(runner):
    proc = runner.nox("3.11", "--apex-ref", "drift", "--setup-flags=--cpp_ext")
    text = output(proc)
    assert proc.returncode != 0
    assert "patch torch-location no longer applies to setup.py" in text
    assert "▸ compile" not in text
    assert not runner.dist.exists() or not any(runner.dist.iterdir())


def test_apex_src_builds_the_users_checkout_with_local_fixes(runner, repos, tmp_path):
    checkout = tmp_path / "my-apex"
    subprocess.run(["git", "clone", "-q", str(repos.ascend_path), str(checkout)], check=True)
    fix = checkout / "src/apex/contrib/combine_tensors/combine_tensors.py"
    fix.write_text(fix.read_text() + "LOCAL_FIX = 'kept'\n")
    proc = runner.nox("3.11", "--apex-src", str(checkout), "--no-smoke-test")
    assert proc.returncode == 0, output(proc)[-3000:]
    wheel = runner.dist / "py3.11-torch2.13.0-x86_64-local" / WHEEL
    with zipfile.ZipFile(wheel) as zf:
        assert (
            "LOCAL_FIX = 'kept'"
            in zf.read("apex/contrib/combine_tensors/combine_tensors.py").decode()
        )
    assert not (checkout / "apex").exists()  # no build.sh-style clone inside the user's checkout
    assert "flags detected from npu.patch: --cpp_ext" in output(proc)


def broken_checkout(repos, tmp: Path, edit) -> Path:
    """A clone of the fixture Ascend repo whose src/setup.py (copied over the tree after npu.patch, as Ascend's own
    src/ is) is the fixture's setup.py with one deliberate fault."""
    checkout = tmp / "broken-apex"
    subprocess.run(["git", "clone", "-q", str(repos.ascend_path), str(checkout)], check=True)
    setup = fixture_repos.ascend_tree(fixture_repos.nvidia_files(), False, True)["setup.py"]
    broken = edit(setup)
    assert broken != setup
    (checkout / "src" / "setup.py").write_text(broken)
    subprocess.run(["git", "-C", str(checkout), "add", "-A"], check=True)
    subprocess.run(
        [
            "git",
            "-C",
            str(checkout),
            "-c",
            "user.name=t",
            "-c",
            "user.email=t@t",
            "commit",
            "-qm",
            "fault",
        ],
        check=True,
    )
    return checkout


FAULTS = {
    # a build_ext that drops a flag setup.py asks for (the .so then binds lazily)
    "hardening bind_now": lambda s: s.replace(
        "        return super(BuildExtension, self).build_extensions()",
        "        for ext in self.extensions:\n"
        "            ext.extra_link_args = [a for a in ext.extra_link_args if a != '-Wl,-z,now']\n"
        "        return super(BuildExtension, self).build_extensions()",
    ),
    # the old std::string ABI against torch 2.13 (built with the C++11 ABI): the define after ours wins
    "cxx11-abi": lambda s: s.replace(
        "secure_link_args = [",
        "secure_compile_args.append('-D_GLIBCXX_USE_CXX11_ABI=0')\nsecure_link_args = [",
        1,
    ),
    # a library outside torch's, the system's and what setup.py declares (libz: zlib1g-dev)
    "needed": lambda s: s.replace("'-Wl,-z,now',", "'-Wl,-z,now', '-Wl,--no-as-needed,-lz',", 1),
}


@pytest.mark.parametrize("check", sorted(FAULTS))
def test_each_binary_check_fails_a_deliberately_broken_build(runner, repos, tmp_path, check):
    if check == "needed" and not Path("/usr/lib/x86_64-linux-gnu/libz.so").exists():
        pytest.skip("needs libz.so to link against: apt-get install zlib1g-dev")
    checkout = broken_checkout(repos, tmp_path, FAULTS[check])
    proc = runner.nox("3.11", "--apex-src", str(checkout))
    text = output(proc)
    assert proc.returncode != 0, text[-3000:]
    errors = [line for line in text.splitlines() if "binary check failed:" in line]
    assert errors and f": {check}: " in errors[0], text[-3000:]
    assert ".so" in errors[0] and "nothing was published" in errors[0] and "Traceback" not in text
    assert "▸ smoke test" not in text  # stopped before: nothing installed anywhere
    assert not runner.dist.exists() or not any(
        p for p in runner.dist.iterdir() if not p.name.startswith(".")
    )
    assert "FAIL " in (runner.build / "py3.11-torch2.13.0-x86_64-local" / "build.log").read_text()


def test_pip_refuses_a_wheel_pinned_to_another_torch(runner, tmp_path):
    """The wheel for torch 2.13.0 resolves in a torch-2.13 venv; the same wheel pinned to torch 2.1.0 (its METADATA
    rewritten and repacked with `wheel`, as a build against 2.1.0 would write it) is refused by pip there."""
    proc = runner.nox("3.11", "--no-smoke-test")
    assert proc.returncode == 0, output(proc)[-3000:]
    good = runner.dist / TARGET / WHEEL
    venv = next(
        p
        for p in (runner.cache / "venvs").glob("build-py3.11-*")
        if (p / "apexkit-ready.json").is_file()
        and any((p / "lib" / "python3.11" / "site-packages").glob("torch-2.13.0*.dist-info"))
    )
    # ^ the build venv with torch 2.13.0 and `wheel` installed in it (not a --use-system-torch one, nor the torch
    # 2.14.1 one of a CUDA build, from another test)
    python = str(venv / "bin" / "python")
    unpacked = tmp_path / "unpacked"
    subprocess.run(
        [python, "-m", "wheel", "unpack", "-d", str(unpacked), str(good)],
        check=True,
        capture_output=True,
    )
    root = next(unpacked.iterdir())
    info = next(root.glob("*.dist-info"))
    meta = (
        (info / "METADATA")
        .read_text()
        .replace("0.1+ascend.torch2.13.0", "0.1+ascend.torch2.1.0")
        .replace("Requires-Dist: torch==2.13.0", "Requires-Dist: torch==2.1.0")
    )
    (info / "METADATA").write_text(meta)
    info.rename(info.with_name("apex-0.1+ascend.torch2.1.0.dist-info"))
    out = tmp_path / "other"
    out.mkdir()
    subprocess.run(
        [python, "-m", "wheel", "pack", "--dest-dir", str(out), str(root)],
        check=True,
        capture_output=True,
    )
    other = next(out.glob("*.whl"))
    assert other.name == wheelnames.fixture_wheel("0.1+ascend.torch2.1.0")

    def dry_run(
        wheel: Path,
    ) -> subprocess.CompletedProcess:  # --dry-run: the shared build venv is not changed
        return subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "--python",
                python,
                "install",
                "--isolated",
                "--dry-run",
                "--no-index",
                "--no-cache-dir",
                str(wheel),
            ],
            capture_output=True,
            text=True,
        )

    ok = dry_run(good)
    assert ok.returncode == 0 and "Would install apex-0.1+ascend.torch2.13.0" in ok.stdout, (
        ok.stdout + ok.stderr
    )
    refused = dry_run(other)
    assert refused.returncode != 0
    said = refused.stdout + refused.stderr
    assert "apex 0.1+ascend.torch2.1.0 depends on torch==2.1.0" in said or (
        "Cannot install apex==0.1+ascend.torch2.1.0" in said and "torch==2.1.0" in said
    ), said


@pytest.mark.parametrize(
    ("args", "env", "code", "message"),
    [
        (["--apex-ref", "nosuch"], {}, 2, "unknown Ascend apex ref 'nosuch'"),
        (["--apex-ref", "5.0.rc2"], {}, 4, "ref '5.0.rc2' not found"),
        (["--nvidia-commit", "0" * 40], {}, 4, f"pinned commit {'0' * 40} is not in"),
        ([], {"APEXKIT_ASCEND_APEX_URL": "file:///nonexistent/ascend-apex"}, 4, "after 3 attempts"),
        (
            ["--interpreter", "/nonexistent/python3.11"],
            {},
            3,
            "--interpreter /nonexistent/python3.11 is not a working Python",
        ),
        (["--torch", "2.5.0", "--npu"], {}, 2, "no torch_npu release is known for torch 2.5.0"),
        (["--jobs", "0"], {}, 2, "--jobs 0: must be at least 1"),
        (["--dist", "/etc/hostname"], {}, 2, "--dist /etc/hostname is not a directory"),
        (["--build-dir", "/etc/hostname"], {}, 2, "--build-dir /etc/hostname is not a directory"),
        (
            ["--dist", "/etc/hostname/sub"],
            {},
            2,
            "--dist /etc/hostname/sub lies under /etc/hostname, which is not a",
        ),
    ],
)
def test_bad_inputs_are_one_line_errors(runner, args, env, code, message):
    proc = runner.cli("3.11", *args, **env)
    assert proc.returncode == code, output(proc)[-2000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and message in errors[0] and "-- next:" in errors[0]
    assert "Traceback" not in output(proc)
    assert not runner.dist.exists() or not any(runner.dist.iterdir())


def test_unknown_python_is_refused(runner):
    proc = runner.cli("3.5")
    assert (
        proc.returncode == 2
        and "Python 3.5 is not supported" in proc.stderr
        and "Traceback" not in proc.stderr
    )


def test_nox_session_reports_the_error_line_and_the_real_exit_code(runner, tmp_path):
    status = tmp_path / "status.json"
    proc = runner.nox("3.11", "--apex-ref", "nosuch", APEXKIT_STATUS_FILE=str(status))
    assert proc.returncode == 1  # nox maps every failed session to 1 ...
    assert "aborted: unknown Ascend apex ref 'nosuch'" in output(
        proc
    ) and "Traceback" not in output(proc)
    recorded = json.loads(status.read_text())  # ... the status file keeps apexkit's own code
    assert recorded["exit_code"] == 2 and "unknown Ascend apex ref 'nosuch'" in recorded["error"]
    ok = runner.cli("3.11", "--dry-run", APEXKIT_STATUS_FILE=str(status))
    assert ok.returncode == 0 and json.loads(status.read_text()) == {"exit_code": 0, "error": None}


@pytest.mark.slow
@pytest.mark.network
@pytest.mark.parametrize("python", ["3.8", "3.9", "3.10"])
def test_full_build_other_pythons(runner, python):
    """torch 2.1.0 for these Pythons comes from the index as a large CUDA build on x86_64: out of default CI."""
    proc = runner.nox(python)
    assert proc.returncode == 0, output(proc)[-3000:]


@pytest.mark.parametrize(
    ("args", "env"),
    [
        (["--index-url=https://u:Tok3n/Secret@m.corp/simple"], {}),
        (["--torch-index-url=https://u:Tok3n#Secret@m.corp/whl/cpu"], {}),
        ([], {"APEXKIT_ASCEND_APEX_URL": "https://user:Tok3n/Secret@git.corp/apex.git"}),
        ([], {"APEXKIT_NVIDIA_APEX_URL": "https://Tok3n?Secret@git.corp/apex.git"}),
    ],
)
def test_a_url_whose_password_does_not_parse_is_refused_without_echoing_it(runner, args, env):
    """Issue 14: a password holding '/', '#', '?' must be percent-encoded; the one-line error quotes only scheme and
    host, and no part of the password reaches the output."""
    proc = runner.cli("3.11", "--dry-run", *args, **env)
    assert proc.returncode == 2, output(proc)[-2000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "percent-encode" in errors[0]
    assert "Tok3n" not in output(proc) and "Secret" not in output(proc)


def test_an_offline_build_without_a_wheelhouse_stops_at_its_cache_miss(runner, tmp_path):
    """Issue 41: --offline with no wheelhouse is refused only when the build has to compile (a wheel-cache hit needs
    none: tests/unit/test_commands.py, tests/e2e/test_up.py), in one line naming the cache key, before any venv."""
    for args, why in (
        ((), "the wheel cache has no wheel for these inputs (cache key "),
        (("--no-cache",), "the wheel cache is not used (--no-cache, "),
    ):
        # a cache of its own: the session's shared one may hold this wheel (a hit needs no wheelhouse); no
        # PIP_FIND_LINKS either (pip's folder counts as a wheelhouse, as in the plan: below)
        proc = runner.nox(
            "3.11", "--offline", *args, APEXKIT_CACHE_DIR=str(tmp_path / "cold"), PIP_FIND_LINKS=""
        )
        text = output(proc)
        assert proc.returncode != 0 and "Traceback" not in text, text[-3000:]
        errors = [line for line in text.splitlines() if "--offline needs --wheelhouse DIR" in line]
        assert len(errors) == 1 and "aborted: " in errors[0], text[-3000:]  # nox's one line
        assert why in errors[0] and "next: add --wheelhouse DIR" in errors[0], errors
        assert "▸ build venv" not in text, text[-3000:]
    # PIP_FIND_LINKS is the wheelhouse the plan names: the build tries it and says what it lacks, in one line
    house = tmp_path / "house"
    house.mkdir()
    proc = runner.nox(
        "3.11", "--offline", APEXKIT_CACHE_DIR=str(tmp_path / "cold"), PIP_FIND_LINKS=str(house)
    )
    text = output(proc)
    assert proc.returncode != 0 and "Traceback" not in text, text[-3000:]
    assert "--offline needs --wheelhouse" not in text, text[-3000:]
    errors = [line for line in text.splitlines() if "aborted: " in line]
    assert len(errors) == 1 and f"pip download torch==2.13.0 -d {house}" in errors[0], errors
