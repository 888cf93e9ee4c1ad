"""Training stacks as data (matrix.toml [stacks], --stack), torch <-> torch_npu pairing, refused Pythons, and a build
with the real torch_npu wheel from the package index on a host without CANN (torch >= 2.5 auto-loads torch_npu)."""

from __future__ import annotations

import json

import pytest

from apexkit.errors import ConfigError
from apexkit.plan import matrix
from apexkit.wheel import known_failures


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
        assert combos[name].stack == name and combos[name].build_options() == {"stack": name}


def test_a_stack_whose_torch_npu_belongs_to_another_torch_is_refused(m):
    data = json.loads(json.dumps(m.data))
    data["stacks"]["field-report"]["torch_npu"] = "2.5.1.post1"
    with pytest.raises(ConfigError) as exc:
        matrix.Matrix(data).stack("field-report")
    assert (
        exc.value.cause.startswith("stack field-report: ")
        and "does not pair with torch 2.1.0" in exc.value.cause
    )
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


def test_autoload_failure_is_not_blamed_on_cann():
    text = (
        "RuntimeError: Failed to load the backend extension: torch_npu. You can disable extension auto-loading "
        "with TORCH_DEVICE_BACKEND_AUTOLOAD=0.\nImportError: libhccl.so: cannot open shared object file"
    )
    assert [f.id for f in known_failures.match(text)] == ["torch-npu-autoload"]
    assert [
        f.id
        for f in known_failures.match("ImportError: libhccl.so: cannot open shared object file")
    ] == ["torch-npu-cann"]


@pytest.mark.parametrize(
    ("name", "entry", "says"),
    [
        ("3.11", {}, "a stack name must be lower-case"),  # would take over the build-3.11 session
        (
            "py3.11-torch2.13.0-x86_64",
            {},
            "a stack name must be lower-case",
        ),  # a [[matrix.include]] id
        ("a/b", {}, "a stack name must be lower-case"),  # a session name and a log file name
        ("../escape", {}, "a stack name must be lower-case"),
        ("typo", {"torch_npuu": "2.7.1.post2"}, "[stacks.typo]: unknown keys torch_npuu"),
        ("floaty", {"python": 3.1}, "[stacks.floaty]: python must be quoted strings"),
        (
            "escape",
            {"torch": "2.7.1/../../x"},
            "[stacks.escape]: torch '2.7.1/../../x' is not a version (PEP 440)",
        ),
    ],
)
def test_malformed_stacks_are_refused(m, name, entry, says):
    data = json.loads(json.dumps(m.data))
    base = {
        "python": "3.10",
        "torch": "2.7.1",
        "arch": "aarch64",
        "source": "s",
        "read": "2026-11-30",
    }
    data["stacks"][name] = {**base, **entry}
    with pytest.raises(ConfigError) as exc:
        matrix.Matrix(data).combinations()
    assert says in exc.value.cause
    with pytest.raises(
        ConfigError, match=r"matrix entry 1: torch '2.1.0/../x' is not a version \(PEP 440\)"
    ):
        m.combinations([{"python": "3.10", "torch": "2.1.0/../x", "arch": "x86_64"}])
    data["stacks"] = {"bad": "string"}
    with pytest.raises(ConfigError, match=r"\[stacks.bad\] is not a table"):
        matrix.Matrix(data).stack_names()


def test_a_matrix_file_that_is_not_utf8_is_one_line(tmp_path):
    broken = tmp_path / "matrix.toml"
    broken.write_bytes(b"schema = 1\n# \xff\xfe not UTF-8\n")
    with pytest.raises(ConfigError, match="is not valid TOML"):
        matrix.load(broken)
