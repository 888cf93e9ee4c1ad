"""Training stacks as data (matrix.toml [stacks], --stack), torch <-> torch_npu pairing, refused Pythons, and a build
with the real torch_npu wheel from the package index on a host without CANN (torch >= 2.5 auto-loads torch_npu)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from conftest import ROOT, output

from apexkit.errors import ConfigError
from apexkit.plan import matrix
from apexkit.wheel import known_failures

NPU_TARGET = "py3.11-torch2.13.0-x86_64-master+npu2.13.0"


@pytest.fixture(scope="module")
def m():
    return matrix.load()


def test_every_stack_has_provenance_and_validates(m):
    names = m.stack_names()
    assert {"field-report", "mindspeed-llm-2.3.0", "newest"} <= set(names)
    for name in names:
        stack = m.stack(name)  # raises when the tables rule the stack out
        assert stack.source and stack.read.count("-") == 2
    field = m.stack("field-report")
    assert (field.python, field.torch, field.arch) == ("3.8", "2.1.0", "aarch64")
    assert field.torch_npu.startswith("2.1.0.post") and field.cann.startswith("8.0")
    qwen3 = m.stack("mindspeed-llm-2.3.0")
    assert (qwen3.python, qwen3.torch, qwen3.cann) == ("3.10", "2.7.1", "8.5.0")
    assert qwen3.torch_npu.startswith("2.7.1.post")


def test_default_matrix_builds_every_stack(m):
    combos = {c.id: c for c in m.combinations()}
    for name in m.stack_names():
        assert combos[name].stack == name and combos[name].build_args() == ["--stack", name]


def test_a_stack_whose_torch_npu_belongs_to_another_torch_is_refused(m):
    data = json.loads(json.dumps(m.data))
    data["stacks"]["field-report"]["torch_npu"] = "2.5.1.post1"
    with pytest.raises(ConfigError) as exc:
        matrix.Matrix(data).stack("field-report")
    assert exc.value.cause.startswith("stack field-report: ") and "does not pair with torch 2.1.0" in exc.value.cause
    with pytest.raises(ConfigError, match="unknown stack 'nosuch'"):
        m.stack("nosuch")
    del data["stacks"]["newest"]["source"]
    with pytest.raises(ConfigError, match=r"\[stacks.newest\] lacks source"):
        matrix.Matrix(data).stack("newest")


def test_torch_npu_pairing_and_refused_pythons(m):
    m.check_torch_npu("2.1.0", "2.1.0.post10")
    m.check_torch_npu("2.13.0+cpu", "2.13.0")
    with pytest.raises(ConfigError) as exc:
        m.check_torch_npu("2.1.0", "2.5.1.post1")
    assert "built for torch 2.5.1, not torch 2.1.0" in exc.value.cause
    assert exc.value.hint == f"use --torch-npu {m.torch_npu_for('2.1.0')}"
    with pytest.raises(ConfigError, match="Python 3.7 is refused: no torch_npu"):
        m.check_python("3.7")
    assert "3.7" not in m.supported_pythons


def _cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "apexkit", "build", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=300, env={**os.environ, **(env or {})})


@pytest.mark.parametrize(("args", "message"), [
    (["3.11", "--torch", "2.1.0", "--torch-npu", "2.5.1.post1"], "torch_npu 2.5.1.post1 is built for torch 2.5.1"),
    (["3.11", "--torch", "2.5.0", "--npu"], "no torch_npu release is known for torch 2.5.0"),
    (["3.11", "--stack", "nosuch"], "unknown stack 'nosuch'"),
    (["3.11", "--stack", "mindspeed-llm-2.3.0"], "stack mindspeed-llm-2.3.0 is Python 3.10"),
    (["3.10", "--stack", "mindspeed-llm-2.3.0", "--torch", "2.1.0"], "--torch contradict"),
    (["3.7"], "Python 3.7 is refused"),
    (["2.7"], "Python 2.7 is refused"),
    (["3.11", "--torch", "2.13.0/../../x"], "--torch '2.13.0/../../x' is not a version (PEP 440)"),
    (["3.11", "--torch", "2.1.0", "--torch-npu", "2.1.0.post10/.."], "--torch-npu '2.1.0.post10/..' is not a version"),
])
def test_bad_stack_and_pairing_inputs_are_one_line_errors(tmp_path, args, message):
    proc = _cli(*args, "--dry-run", "--dist", str(tmp_path / "dist"), "--build-dir", str(tmp_path / "build"))
    assert proc.returncode == 2, output(proc)[-2000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and message in errors[0] and "-- next:" in errors[0], proc.stderr
    assert "Traceback" not in output(proc) and not (tmp_path / "dist").exists() and not (tmp_path / "build").exists()


def test_stack_dry_run_prints_the_stack_and_which_torch_build_it_downloads(tmp_path):
    proc = _cli("3.10", "--stack", "mindspeed-llm-2.3.0", "--dry-run", "--dist", str(tmp_path / "d"))
    if proc.returncode == 3:
        pytest.skip(f"no python3.10 here: {proc.stderr.strip()}")
    assert proc.returncode == 0, output(proc)[-2000:]
    out = output(proc)
    assert "stack           mindspeed-llm-2.3.0 (CANN 8.5.0 on the NPU nodes)" in out
    assert "torch           2.7.1 + torch_npu 2.7.1.post2" in out
    if os.uname().machine == "x86_64":
        assert "torch build     CUDA build from the package index (~2.6-2.8 GB" in out
        assert "--torch-index-url https://download.pytorch.org/whl/cpu" in out
    assert "dry run: nothing fetched, built or written" in out and not (tmp_path / "d").exists()


def test_autoload_failure_is_not_blamed_on_cann():
    text = ("RuntimeError: Failed to load the backend extension: torch_npu. You can disable extension auto-loading "
            "with TORCH_DEVICE_BACKEND_AUTOLOAD=0.\nImportError: libhccl.so: cannot open shared object file")
    assert [f.id for f in known_failures.match(text)] == ["torch-npu-autoload"]
    assert [f.id for f in known_failures.match("ImportError: libhccl.so: cannot open shared object file")] == [
        "torch-npu-cann"]


@pytest.mark.network
def test_npu_build_with_the_real_torch_npu_wheel_and_no_cann(runner):
    """torch 2.13.0 (CPU wheel on disk) + the real torch_npu 2.13.0 from the package index, no CANN on this host:
    the build, its probes and the smoke test run with auto-loading off; the smoke test says what needs CANN."""
    assert not os.path.isdir("/usr/local/Ascend"), "this test needs a host without CANN"
    proc = runner.nox("3.11", "--torch", "2.13.0", "--torch-npu", "2.13.0")
    assert proc.returncode == 0, output(proc)[-3000:]
    out = output(proc)
    assert "torch           2.13.0 + torch_npu 2.13.0" in out
    assert "needs the CANN runtime (not checked here): import torch_npu; import apex" in out
    manifest = json.loads((runner.dist / NPU_TARGET / "manifest.json").read_text())
    assert manifest["tools"]["torch_npu"] == "2.13.0" and manifest["target"]["torch_npu"] == "2.13.0"
    smoke = manifest["smoke_test"]
    assert smoke["autoload"] == "0" and smoke["modules"]["apex_C"]["ok"] and smoke["modules"]["change_data_ptr"]["ok"]
    assert smoke["checked"][:2] == ["import torch (torch_npu auto-loading off)", "import apex_C, change_data_ptr"]
    assert smoke["torch_npu"].startswith("installed; import needs the CANN runtime (")
    assert smoke["needs_cann"][:2] == ["import torch_npu", "import apex (imports torch_npu)"]
    build_log = (runner.build / NPU_TARGET / "build.log").read_text()
    assert "Failed to load the backend extension" not in build_log and "known failure" not in out

    # The trap is real: the same build venv, `import torch` with auto-loading on (torch's default), fails.
    site = next(runner.cache.glob("venvs/build-py3.11-*/lib/python3.11/site-packages/torch_npu")).parent
    env = {k: v for k, v in os.environ.items() if k != "TORCH_DEVICE_BACKEND_AUTOLOAD"}
    trap = subprocess.run([str(site.parents[2] / "bin" / "python"), "-c", "import torch"], capture_output=True,
                          text=True, env=env)
    assert trap.returncode != 0 and "Failed to load the backend extension: torch_npu" in trap.stderr
    assert [f.id for f in known_failures.match(trap.stderr)] == ["torch-npu-autoload"]


@pytest.mark.parametrize(("name", "entry", "says"), [
    ("3.11", {}, "a stack name must be lower-case"),  # would take over the build-3.11 session
    ("py3.11-torch2.13.0-x86_64", {}, "a stack name must be lower-case"),  # a [[matrix.include]] id
    ("a/b", {}, "a stack name must be lower-case"),  # a session name and a log file name
    ("../escape", {}, "a stack name must be lower-case"),
    ("typo", {"torch_npuu": "2.7.1.post2"}, "[stacks.typo]: unknown keys torch_npuu"),
    ("floaty", {"python": 3.1}, "[stacks.floaty]: python must be quoted strings"),
    ("escape", {"torch": "2.7.1/../../x"}, "[stacks.escape]: torch '2.7.1/../../x' is not a release version"),
])
def test_malformed_stacks_are_refused(m, name, entry, says):
    data = json.loads(json.dumps(m.data))
    base = {"python": "3.10", "torch": "2.7.1", "arch": "aarch64", "source": "s", "read": "2026-11-30"}
    data["stacks"][name] = {**base, **entry}
    with pytest.raises(ConfigError) as exc:
        matrix.Matrix(data).combinations()
    assert says in exc.value.cause
    with pytest.raises(ConfigError, match="matrix entry 1: torch '2.1.0/../x' is not a release version"):
        m.combinations([{"python": "3.10", "torch": "2.1.0/../x", "arch": "x86_64"}])
    data["stacks"] = {"bad": "string"}
    with pytest.raises(ConfigError, match=r"\[stacks.bad\] is not a table"):
        matrix.Matrix(data).stack_names()


def test_a_broken_matrix_is_one_line_for_every_nox_command(tmp_path):
    copy = tmp_path / "repo"
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, capture_output=True,
                           text=True, check=True).stdout.split()
    for name in files:
        if (ROOT / name).is_file():
            (copy / name).parent.mkdir(parents=True, exist_ok=True)
            (copy / name).write_bytes((ROOT / name).read_bytes())
    with open(copy / "matrix.toml", "a") as fh:
        fh.write('\n[stacks."3.11"]\npython = "3.8"\ntorch = "2.1.0"\narch = "x86_64"\nsource = "s"\nread = "d"\n')
    proc = subprocess.run([sys.executable, "-m", "nox", "-l"], cwd=copy, capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and "Traceback" not in output(proc)
    assert "error: matrix.toml [stacks.3.11]: a stack name must be" in proc.stderr


def test_a_matrix_file_that_is_not_utf8_is_one_line(tmp_path):
    broken = tmp_path / "matrix.toml"
    broken.write_bytes(b"schema = 1\n# \xff\xfe not UTF-8\n")
    with pytest.raises(ConfigError, match="is not valid TOML"):
        matrix.load(broken)
