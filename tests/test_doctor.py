"""`invoke doctor`: each check compared with what independent commands say about this machine, and every known
failure signature against a real log (tests/data/failure-logs, plus live reproductions where they are cheap)."""

from __future__ import annotations

import json
import os
import re
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, output

from apexkit import known_failures

LOGS = Path(__file__).parent / "data" / "failure-logs"
VERBATIM_ELSEWHERE = {"cxx11-abi-mismatch"}  # tests/test_log_and_failures.py


def invoke(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "invoke", "-r", str(ROOT), *args], capture_output=True, text=True,
                          env=env, timeout=600)


def doctor_json(env: dict[str, str] | None = None) -> tuple[int, dict[tuple[str, str], dict]]:
    proc = invoke("doctor", "--json", env=env)
    rows = json.loads(proc.stdout)
    return proc.returncode, {(r["area"], r["name"]): r for r in rows}


# --- known failures against real logs ------------------------------------------------------------------------------------

def test_every_signature_has_a_real_log_that_matches_only_it():
    ids = [f.id for f in known_failures.load()]
    assert len(ids) == len(set(ids))
    for failure_id in ids:
        if failure_id in VERBATIM_ELSEWHERE:
            continue
        log = LOGS / f"{failure_id}.log"
        assert log.is_file(), f"no real log for {failure_id}"
        assert [h.failure.id for h in known_failures.find(log.read_text())] == [failure_id], failure_id
    assert sorted(p.stem for p in LOGS.glob("*.log")) == sorted(set(ids) - VERBATIM_ELSEWHERE)


def test_doctor_log_names_cause_fix_and_line():
    proc = invoke("doctor", "--log", str(LOGS / "hardcoded-site-packages.log"))
    assert proc.returncode == 0, output(proc)
    text = output(proc)
    lines = (LOGS / "hardcoded-site-packages.log").read_text().splitlines()
    m = re.search(r"hardcoded-site-packages\s+line (\d+): (.*)", text)
    assert m and "No such file or directory" in lines[int(m.group(1)) - 1]
    assert "cause: setup.py looked for torch under sys.prefix/lib" in text and "fix:   build without --skip-patch" in text
    as_json = json.loads(invoke("doctor", "--log", str(LOGS / "daemon-proxy.log"), "--json").stdout)
    assert [h["id"] for h in as_json] == ["daemon-proxy"] and "proxyconnect tcp" in as_json[0]["text"]


def test_doctor_log_without_a_known_failure_and_missing_file(tmp_path):
    plain = tmp_path / "ok.log"
    plain.write_text("compiling\nall good\n")
    proc = invoke("doctor", "--log", str(plain))
    assert proc.returncode == 1 and "no known failure in" in output(proc) and "all good" in output(proc)
    missing = invoke("doctor", "--log", str(tmp_path / "nope.log"))
    assert missing.returncode == 2
    assert [x for x in missing.stderr.splitlines() if x.startswith("error: ")] == [
        f"error: --log {tmp_path / 'nope.log'}: no such file -- next: pass a build log, e.g. build/<target-id>/build.log"]


def test_live_reproductions_match(tmp_path):
    """The cheap ones again, for real, on this machine."""
    found = {}
    bash = subprocess.run(["env", "-i", "PATH=/usr/bin:/bin", "bash", "-c", "python setup.py --cpp_ext"],
                          capture_output=True, text=True)
    found["python-not-found"] = bash.stderr
    src = tmp_path / "npu_float_status.cpp"
    src.write_text('#include "acl/acl.h"\nint main() { return 0; }\n')
    gxx = subprocess.run(["g++", "-std=c++17", "-c", str(src), "-o", str(tmp_path / "x.o")], capture_output=True,
                         text=True)
    found["acl-headers-missing"] = gxx.stderr
    found["exec-format-error"] = run_foreign_elf(tmp_path)
    for failure_id, text in found.items():
        assert [f.id for f in known_failures.match(text)] == [failure_id], text


def run_foreign_elf(tmp_path: Path) -> str:
    """Execute a minimal aarch64 ELF on an x86_64 host with no binfmt handler: the kernel says ENOEXEC."""
    if os.uname().machine != "x86_64":
        pytest.skip("needs an x86_64 host")
    header = b"\x7fELF" + bytes([2, 1, 1, 0]) + bytes(8) + struct.pack(
        "<HHIQQQIHHHHHH", 2, 0xB7, 1, 0x400078, 64, 0, 0, 64, 56, 1, 0, 0, 0)
    program = struct.pack("<IIQQQQQQ", 1, 5, 0, 0x400000, 0x400000, 0x80, 0x80, 0x1000)
    binary = tmp_path / "apex-build-aarch64"
    binary.write_bytes(header + program + bytes(8))
    binary.chmod(0o755)
    entry = Path("/proc/sys/fs/binfmt_misc/qemu-aarch64")
    was_enabled = entry.is_file() and entry.read_text().startswith("enabled")
    if was_enabled:
        if os.geteuid() != 0:
            pytest.skip("QEMU aarch64 is registered and only root can switch it off for this test")
        entry.write_text("0")  # off for the duration of one exec, on again below
    try:
        return subprocess.run(["bash", "-c", str(binary)], capture_output=True, text=True).stderr
    finally:
        if was_enabled:
            entry.write_text("1")


def test_failed_fixture_build_prints_the_hint_and_doctor_agrees(runner):
    proc = runner.nox("3.11", "--skip-patch", "pep440-version", "--no-smoke-test")
    assert proc.returncode != 0
    text = output(proc)
    assert "! known failure 'invalid-version': setuptools >= 66 refuses the version string '0.1-ascend'" in text
    assert "known failure 'invalid-version': keep the pep440-version patch" in text  # in the one-line error too
    build_log = runner.build / "py3.11-torch2.13.0-x86_64-master" / "build.log"
    explained = invoke("doctor", "--log", str(build_log))
    assert explained.returncode == 0 and "invalid-version" in output(explained)


# --- doctor on this machine ----------------------------------------------------------------------------------------------

def first_line(argv: list[str]) -> str:
    return subprocess.run(argv, capture_output=True, text=True).stdout.strip().splitlines()[0]


def test_doctor_matches_independent_commands():
    code, rows = doctor_json()
    assert code in (0, 1)
    assert rows[("compiler", "gcc")]["data"]["version"] == first_line(["gcc", "-dumpfullversion"])
    assert rows[("compiler", "g++")]["data"]["version"] == first_line(["g++", "-dumpfullversion"])
    assert rows[("compiler", "C++17")]["status"] == "ok"
    assert first_line(["python3", "--version"]) in rows[("python", "python3")]["found"]
    py311 = rows[("python", "python3.11")]
    version = first_line([py311["data"]["path"], "-c", "import platform; print(platform.python_version())"])
    assert f" {version} " in py311["found"] and py311["data"]["layout"] == "lib"
    if shutil.which("docker"):
        assert first_line(["docker", "--version"]) in rows[("docker", "client")]["found"]
    for key, row in rows.items():
        if key[0] == "disk":
            anchor = row["found"].rsplit(" at ", 1)[1]
            avail = int(subprocess.run(["df", "-B1", "--output=avail", anchor], capture_output=True, text=True
                                       ).stdout.split()[-1]) / 2**30
            assert abs(row["data"]["free_gib"] - avail) < 1.0
    binfmt = Path("/proc/sys/fs/binfmt_misc/qemu-aarch64")
    usable = binfmt.is_file() and binfmt.read_text().startswith("enabled") and "F" in re.search(
        r"flags: (\S*)", binfmt.read_text()).group(1)
    assert (rows[("docker", "aarch64 containers")]["status"] == "ok") == usable
    assert (("ascend", "CANN toolkit") in rows) and (
        rows[("ascend", "CANN toolkit")]["status"] == "skip") == (not Path("/usr/local/Ascend").exists()
                                                                  and not os.environ.get("ASCEND_HOME_PATH"))


def test_doctor_sees_environment_problems(tmp_path):
    toolkit = tmp_path / "Ascend" / "ascend-toolkit" / "latest"
    (toolkit / "x86_64-linux").mkdir(parents=True)
    (toolkit / "x86_64-linux" / "ascend_toolkit_install.info").write_text("package_name=Ascend-cann-toolkit\n"
                                                                          "version=8.0.RC1\narch=x86_64\n")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3").symlink_to(sys.executable)  # python3 but no python, as on Debian/openEuler images
    for tool in ("gcc", "g++", "git", "patch", "readelf", "du", "df", "bash", "env"):
        if shutil.which(tool):
            (bin_dir / tool).symlink_to(shutil.which(tool))
    env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
    env.update(PATH=str(bin_dir), ASCEND_HOME_PATH=str(toolkit), LD_LIBRARY_PATH="/usr/lib",
               http_proxy="http://127.0.0.1:3128", HTTP_PROXY="http://127.0.0.1:8080", https_proxy="http://127.0.0.1:3128",
               SSL_CERT_FILE=str(tmp_path / "missing.pem"), APEXKIT_CACHE_DIR=str(tmp_path / "cache"))
    code, rows = doctor_json(env)
    assert code == 1  # a failing check
    assert rows[("python", "python")]["status"] == "warn" and "call python3" in rows[("python", "python")]["fix"]
    assert rows[("ascend", "CANN toolkit")]["found"] == f"{toolkit} (version 8.0.RC1)"
    assert rows[("ascend", "set_env.sh sourced")]["status"] == "fail"
    assert rows[("proxy", "http_proxy")]["status"] == "warn" and "HTTP_PROXY=" in rows[("proxy", "http_proxy")]["found"]
    assert "only https_proxy is set" in rows[("proxy", "https_proxy")]["found"]
    assert rows[("proxy", "no_proxy localhost")]["status"] == "warn"
    assert rows[("ca", "SSL_CERT_FILE")]["status"] == "fail"
    env["LD_LIBRARY_PATH"] = f"{toolkit}/lib64"
    _, rows = doctor_json(env)
    assert rows[("ascend", "set_env.sh sourced")]["status"] == "ok"


def test_doctor_human_output_lists_every_area():
    proc = invoke("doctor")
    text = output(proc)
    for area in ("python", "torch", "compiler", "build", "ascend", "docker", "disk", "cache", "proxy", "ca"):
        assert re.search(rf"^{area}$", text, re.M), area
    assert re.search(r"\d+ ok, \d+ warn, \d+ fail, \d+ skip", text)
