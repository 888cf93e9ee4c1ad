from __future__ import annotations

import re

import pytest

from apexkit.errors import ConfigError
from apexkit.fleet import matrixrun
from apexkit.plan import matrix
from apexkit.wheel import buildplan
from apexkit.wheel.interpreters import Interpreter
from apexkit.wheel.options import BuildOptions


@pytest.fixture(scope="module")
def m():
    return matrix.load()


def test_every_session_python_has_a_valid_default_torch(m):
    assert m.session_pythons == ["3.8", "3.9", "3.10", "3.11"]
    for python in m.session_pythons:
        m.check_torch_python(m.default_torch(python), python)  # raises if the table rules it out
    assert m.default_torch("3.8") == "2.1.0"
    assert m.default_torch("3.11") == "2.13.0"


def test_torch_without_wheels_for_the_python_is_refused_naming_the_row(m):
    with pytest.raises(ConfigError) as exc:
        m.check_torch_python("2.6.0", "3.8")
    assert "row 2.6" in exc.value.cause and "3.9, 3.10, 3.11" in exc.value.cause
    assert exc.value.hint.startswith("use --torch 2.4")


def test_unknown_python_and_torch(m):
    with pytest.raises(ConfigError, match="Python 3.5 is not supported"):
        m.default_torch("3.5")
    with pytest.raises(ConfigError, match="not in matrix.toml"):
        m.check_torch_python("9.9.0", "3.11")
    with pytest.raises(ConfigError, match="is not a torch version"):
        m.check_torch_python("latest", "3.11")


def test_refs_carry_their_flags(m):
    assert m.ref("master").flags == ("--cpp_ext",)
    assert m.ref("5.0.0").extensions == ("apex_C", "change_data_ptr")
    assert (
        m.ref("5.0.rc2").flags == ("--cpp_ext", "--npu_float_status")
        and m.ref("5.0.rc2").needs_npu_headers
    )
    assert m.ref("nosuch") is None


def test_torch_npu_pairing(m):
    rows = m.data["torch_npu"]["versions"]
    assert m.torch_npu_for("2.1.0") == rows["2.1.0"]["torch_npu"] and rows["2.1.0"][
        "torch_npu"
    ].startswith("2.1.0.post")
    assert (
        m.torch_npu_for("2.7.1+cpu") == rows["2.7.1"]["torch_npu"]
    )  # the local label does not matter
    with pytest.raises(ConfigError, match="no torch_npu release is known for torch 2.5.0"):
        m.torch_npu_for("2.5.0")


INTERP = Interpreter("/usr/bin/python3.11", "3.11", "3.11.7", "cpython", "aarch64", "/usr", "", "")


def test_plan_decides_target_before_any_work(m):
    plan = buildplan.make_plan(BuildOptions(python="3.11"), m, INTERP, None, env={})
    assert plan.target_id == "py3.11-torch2.13.0-aarch64-master"
    assert plan.flags == ("--cpp_ext",) and plan.torch_npu is None
    plan = buildplan.make_plan(
        BuildOptions(python="3.11", torch="2.7.1", npu=True, apex_ref="5.0.rc3"),
        m,
        INTERP,
        None,
        {},
    )
    assert (
        plan.torch_npu == m.torch_npu_for("2.7.1")
        and plan.target_id == f"py3.11-torch2.7.1-aarch64-5.0.rc3+npu{plan.torch_npu}"
    )


def test_plan_installs_torch_npu_when_a_cann_toolkit_is_detected(m, tmp_path):
    plan = buildplan.make_plan(
        BuildOptions(python="3.10", torch="2.1.0"),
        m,
        INTERP,
        None,
        {"ASCEND_HOME_PATH": str(tmp_path)},
    )
    assert plan.torch_npu == m.torch_npu_for("2.1.0")


def test_plan_refuses_unknown_ref_unless_flags_are_given(m):
    with pytest.raises(ConfigError, match="unknown Ascend apex ref 'feature-x'"):
        buildplan.make_plan(BuildOptions(python="3.11", apex_ref="feature-x"), m, INTERP, None, {})
    plan = buildplan.make_plan(
        BuildOptions(python="3.11", apex_ref="feature-x", setup_flags=("--cpp_ext",)),
        m,
        INTERP,
        None,
        {},
    )
    assert plan.extensions == ("apex_C", "change_data_ptr")


def test_cache_key_changes_with_every_input(m):
    plan = buildplan.make_plan(BuildOptions(python="3.11"), m, INTERP, None, {})
    opts = BuildOptions(python="3.11")
    base = buildplan.cache_key(plan, opts, "a" * 40, "b" * 40, [], m)
    assert base == buildplan.cache_key(plan, opts, "a" * 40, "b" * 40, [], m)
    assert base != buildplan.cache_key(plan, opts, "c" * 40, "b" * 40, [], m)
    other = buildplan.make_plan(BuildOptions(python="3.11", torch="2.12.0"), m, INTERP, None, {})
    assert base != buildplan.cache_key(other, opts, "a" * 40, "b" * 40, [], m)


def test_detected_toolkit_without_a_torch_npu_release_does_not_block_the_build(m, tmp_path):
    plan = buildplan.make_plan(
        BuildOptions(python="3.11", torch="2.5.0"),
        m,
        INTERP,
        None,
        {"ASCEND_HOME_PATH": str(tmp_path)},
    )
    assert plan.torch_npu is None  # torch 2.5.0 has no torch_npu in the table: warned, not refused
    with pytest.raises(ConfigError):
        buildplan.make_plan(
            BuildOptions(python="3.11", torch="2.5.0", npu=True), m, INTERP, None, {}
        )


def combo(m, **kw) -> matrix.Combination:
    return m.combinations([{"python": "3.11", "torch": "2.13.0", "arch": "x86_64", **kw}])[0]


def test_default_matrix_is_valid_and_ids_are_short(m):
    combos = m.combinations()
    assert [c.id for c in combos] == [
        "py3.11-torch2.13.0-x86_64",
        "py3.11-torch2.14.1-x86_64-cuda",
        "py3.10-torch2.1.0-x86_64",
        "py3.11-torch2.5.1-aarch64",
        *m.stack_names(),
    ]
    for c in combos:
        m.validate(c)
    cuda = next(c for c in combos if c.backend == "cuda")
    assert cuda.target_id == "py3.11-torch2.14.1-x86_64-master+cuda.sm80.sm90"
    assert cuda.build_options() == {"torch": "2.14.1", "backend": "cuda", "cuda_arch": "8.0;9.0"}
    field = next(c for c in combos if c.id == "field-report")
    assert (field.python, field.torch, field.arch, field.stack) == (
        "3.8",
        "2.1.0",
        "aarch64",
        "field-report",
    )
    assert field.build_options() == {"stack": "field-report"}
    assert combo(m, ref="5.0.rc3").id == "py3.11-torch2.13.0-x86_64-5.0.rc3"
    foreign = matrixrun.build_options(m, combos[3], host="x86_64")
    assert foreign["image"] == "apexkit/builder:debian-bookworm-aarch64"
    assert "image" not in matrixrun.build_options(m, combos[3], host="aarch64")


@pytest.mark.parametrize(
    ("entry", "says"),
    [
        (
            {"python": "3.8", "torch": "2.6.0"},
            "matrix.toml [torch_python] row 2.6: Python 3.9, 3.10, 3.11",
        ),
        (
            {"torch": "2.1.0", "python": "3.10", "torch_npu": "2.5.1.post1"},
            "torch_npu 2.5.1.post1 does not pair with torch 2.1.0 (matrix.toml [torch_npu.versions] row 2.1.0: torch_npu "
            "2.1.0.post",
        ),
        (
            {"torch": "2.6.0", "cann": "7.0.0"},
            "CANN 7.0.0 is not listed for torch 2.6.0 (matrix.toml [torch_npu.versions] "
            "row 2.6.0: CANN 8.5.0, 8.3.RC1, 8.2.RC1)",
        ),
        ({"torch": "2.5.0", "torch_npu": "2.5.0"}, "no torch_npu release pairs with torch 2.5.0"),
        ({"arch": "riscv64"}, "unknown arch 'riscv64'"),
        ({"ref": "nope"}, "unknown Ascend apex ref 'nope'"),
    ],
)
def test_invalid_combinations_name_the_row(m, entry, says):
    with pytest.raises(ConfigError) as exc:
        m.validate(combo(m, **entry))
    assert says in exc.value.cause


def test_bad_matrix_entries(m):
    with pytest.raises(ConfigError, match="needs python, torch, arch; unknown keys cuda"):
        m.combinations([{"python": "3.11", "torch": "2.13.0", "arch": "x86_64", "cuda": "12"}])


@pytest.mark.parametrize(
    ("entry", "cause"),
    [
        ({"torch_npu": "2.7.1"}, "a CUDA combination has no torch_npu or CANN"),
        ({"torch": "2.13.0"}, "does not say which CUDA torch 2.13.0 is built with"),
        ({"cuda_arch": "Hopper"}, "is not a compute capability"),
        ({"backend": "rocm"}, "unknown backend 'rocm'"),
    ],
)
def test_a_cuda_combination_the_tables_rule_out_is_refused(m, entry, cause):
    row = {"python": "3.11", "torch": "2.14.1", "arch": "x86_64", "backend": "cuda", **entry}
    (combo,) = m.combinations([row])
    with pytest.raises(ConfigError, match=re.escape(cause)):
        m.validate(combo)


def test_two_cuda_combinations_with_one_id_are_refused(m):
    row = {"python": "3.11", "torch": "2.14.1", "arch": "x86_64", "backend": "cuda"}
    (a, b) = m.combinations([row, {**row, "cuda_arch": "9.0"}])
    assert (a.id, b.id) == ("py3.11-torch2.14.1-x86_64-cuda", "py3.11-torch2.14.1-x86_64-cuda-sm90")
    with pytest.raises(ConfigError, match="two combinations named py3.11-torch2.14.1-x86_64-cuda"):
        m.combinations([row, dict(row)])
