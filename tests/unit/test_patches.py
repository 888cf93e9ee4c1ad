from __future__ import annotations

from pathlib import Path

import fixture_repos
import pytest

from apexkit.errors import ConfigError, PatchError
from apexkit.wheel import patches


def tree_with(tmp_path: Path, setup_text: str) -> Path:
    (tmp_path / "setup.py").write_text(setup_text)
    return tmp_path


def ascend_setup(drifted=False, bare_rpath=True) -> str:
    return fixture_repos.ascend_tree(fixture_repos.nvidia_files(), drifted, bare_rpath)["setup.py"]


def test_all_patches_apply_to_master_shaped_setup_and_fix_each_trap(tmp_path):
    tree = tree_with(tmp_path, ascend_setup())
    results = patches.apply_all(tree)
    assert [(r.id, r.status) for r in results] == [
        ("torch-location", patches.APPLIED),
        ("pep440-version", patches.APPLIED),
        ("rpath-link-flag", patches.APPLIED),
        ("cxx11-abi", patches.APPLIED),
        ("cxx-std", patches.APPLIED),
        (
            "change-dataptr-bound",
            patches.NOT_APPLICABLE,
        ),  # setup.py only here: no change_dataptr.cpp
    ]
    text = (tree / "setup.py").read_text()
    assert "secure_compile_args = ['-D_GLIBCXX_USE_CXX11_ABI=%d' % int(getattr(torch._C, " in text
    assert "sys.prefix}/lib/python" not in text and "site.getusersitepackages" not in text
    assert "os.path.dirname(os.path.dirname(os.path.abspath(torch.__file__)))" in text
    assert (
        "version='0.1+ascend' + os.environ.get('APEXKIT_VERSION_LABEL', '')" in text
        and "0.1-ascend" not in text
    )
    assert "install_requires=os.environ.get('APEXKIT_REQUIRES', '').split()" in text
    assert "'-Wl,--disable-new-dtags,--rpath,$ORIGIN/torch/lib'" in text
    compile(text, "setup.py", "exec")  # still valid Python
    assert all(len(r.sha256) == 64 for r in results)


def test_patches_are_idempotent(tmp_path):
    tree = tree_with(tmp_path, ascend_setup())
    patches.apply_all(tree)
    once = (tree / "setup.py").read_text()
    results = patches.apply_all(tree)
    assert {r.status for r in results if r.file == "setup.py"} == {patches.ALREADY}
    assert (tree / "setup.py").read_text() == once


def test_a_patch_whose_trap_is_absent_is_not_applicable(tmp_path):
    tree = tree_with(tmp_path, ascend_setup(bare_rpath=False))  # 5.0.rc3: no bare --rpath
    status = {r.id: r.status for r in patches.apply_all(tree)}
    assert status["rpath-link-flag"] == patches.NOT_APPLICABLE
    tree = tree_with(tmp_path, fixture_repos.NVIDIA_SETUP)
    assert {r.status for r in patches.apply_all(tree)} == {patches.NOT_APPLICABLE}


def test_drift_stops_naming_the_patch_and_the_file(tmp_path):
    tree = tree_with(tmp_path, ascend_setup(drifted=True))
    before = (tree / "setup.py").read_text()
    with pytest.raises(PatchError) as exc:
        patches.apply_all(tree)
    assert "patch torch-location no longer applies to setup.py" in exc.value.cause
    assert "--skip-patch torch-location" in exc.value.hint
    assert (tree / "setup.py").read_text() == before  # nothing half-applied


def test_skip_and_unknown_skip(tmp_path):
    tree = tree_with(tmp_path, ascend_setup())
    status = {r.id: r.status for r in patches.apply_all(tree, skip=["torch-location"])}
    assert (
        status["torch-location"] == patches.SKIPPED and status["pep440-version"] == patches.APPLIED
    )
    with pytest.raises(ConfigError, match="--skip-patch nosuch: no such patch"):
        patches.apply_all(tree, skip=["nosuch"])


def test_every_patch_has_a_readme_row():
    readme = (patches.PATCHES_DIR / "README.md").read_text()
    for patch in patches.load_all():
        assert f"| `{patch.id}` |" in readme


def test_version_patch_labels_and_pins_the_wheel_from_the_environment(tmp_path):
    """What setup() receives from the patched setup.py: the build's label and pins, or plain 0.1+ascend outside
    apexkit. Older refs that already say 0.1+ascend get the label too."""
    import ast

    for version in ("0.1-ascend", "0.1+ascend"):
        text = ascend_setup().replace("version='0.1-ascend'", f"version='{version}'")
        tree = tree_with(tmp_path, text)
        assert (
            next(r.status for r in patches.apply_all(tree) if r.id == "pep440-version")
            == patches.APPLIED
        )
        call = next(
            n
            for n in ast.walk(ast.parse((tree / "setup.py").read_text()))
            if isinstance(n, ast.Call) and getattr(n.func, "id", "") == "setup"
        )
        kwargs = {
            k.arg: compile(ast.Expression(k.value), "setup.py", "eval") for k in call.keywords
        }
        for env, version_out, requires_out in (
            (
                {
                    "APEXKIT_VERSION_LABEL": ".torch2.7.1.npu2.7.1.post8",
                    "APEXKIT_REQUIRES": "torch==2.7.1 torch_npu==2.7.1.*",
                },
                "0.1+ascend.torch2.7.1.npu2.7.1.post8",
                ["torch==2.7.1", "torch_npu==2.7.1.*"],
            ),
            ({}, "0.1+ascend", []),
        ):
            scope = {"os": type("os", (), {"environ": env})}
            assert eval(kwargs["version"], scope) == version_out
            assert eval(kwargs["install_requires"], scope) == requires_out


def cxx_std_of(tmp_path: Path, aten_h: str | None, cpp_extension: str | None) -> tuple[str, str]:
    """Run the patched setup.py's _apexkit_cxx_std against a torch package laid out in tmp_path: (standard, print)."""
    import contextlib
    import io
    import types

    tmp_path.mkdir(parents=True, exist_ok=True)
    tree = tree_with(tmp_path, ascend_setup())
    patches.apply_all(tree)
    text = (tree / "setup.py").read_text()
    start = text.index("def _apexkit_cxx_std(")
    source = text[start : text.index("\nsecure_compile_args = [", start)]
    torch_dir = tmp_path / "torch"
    (torch_dir / "include" / "ATen").mkdir(parents=True, exist_ok=True)
    (torch_dir / "utils").mkdir(parents=True, exist_ok=True)
    if aten_h is not None:
        (torch_dir / "include" / "ATen" / "ATen.h").write_text(aten_h)
    cpp_ext = torch_dir / "utils" / "cpp_extension.py"
    if cpp_extension is not None:
        cpp_ext.write_text(cpp_extension)
    torch = types.ModuleType("torch")
    torch.__file__ = str(torch_dir / "__init__.py")
    torch.__version__ = "2.14.1"
    ext = types.ModuleType("torch.utils.cpp_extension")
    ext.__file__ = str(cpp_ext)
    utils = types.ModuleType("torch.utils")
    utils.cpp_extension = ext  # type: ignore[attr-defined]
    torch.utils = utils  # type: ignore[attr-defined]
    import os
    import sys

    saved = {k: sys.modules.get(k) for k in ("torch", "torch.utils", "torch.utils.cpp_extension")}
    sys.modules.update({"torch": torch, "torch.utils": utils, "torch.utils.cpp_extension": ext})
    try:
        scope: dict = {"os": os, "torch": torch}
        exec(source, scope)
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            std = scope["_apexkit_cxx_std"]("c++17")
    finally:
        for k, v in saved.items():
            if v is None:
                sys.modules.pop(k, None)
            else:
                sys.modules[k] = v
    return std, out.getvalue()


# The guards of the real headers (torch 2.13.0 and 2.14.1 ATen/ATen.h, lines 4-6) and cpp_extension.py's flag.
ATEN_213 = (
    "#if !defined(_MSC_VER) && __cplusplus < 201703L\n"
    "#error C++17 or later compatible compiler is required to use ATen.\n#endif\n"
)
ATEN_214 = (
    "#if !defined(_MSC_VER) && __cplusplus < 202002L\n"
    "#error C++20 or later compatible compiler is required to use ATen.\n#endif\n"
)
CPP_EXT = "            cpp_flag = cpp_flag_prefix + 'c++20'\n    common_cflags += ['-std=c++20', '-fPIC']\n"


def test_cxx_std_follows_the_torch_headers_and_keeps_ascends_where_torch_needs_no_more(tmp_path):
    std, said = cxx_std_of(tmp_path / "a", ATEN_214, CPP_EXT)
    assert std == "c++20" and "apexkit cxx-std: -std=c++20 (npu.patch: -std=c++17" in said
    # torch 2.13: its headers need C++17 although its cpp_extension passes c++20: Ascend's flag stays
    assert cxx_std_of(tmp_path / "b", ATEN_213, CPP_EXT)[0] == "c++17"
    # no guard in ATen.h (moved, or a torch without it): the flag torch's own cpp_extension passes
    assert cxx_std_of(tmp_path / "c", "#pragma once\n", CPP_EXT)[0] == "c++20"
    assert cxx_std_of(tmp_path / "d", None, "['-std=c++17']\n")[0] == "c++17"
    # nothing readable: Ascend's own standard, never lower
    assert cxx_std_of(tmp_path / "e", None, None)[0] == "c++17"


def test_cxx_std_patch_replaces_only_the_hard_coded_flag(tmp_path):
    tree = tree_with(tmp_path, ascend_setup())
    patches.apply_all(tree)
    text = (tree / "setup.py").read_text()
    assert "'-std=c++17'" not in text
    assert "secure_compile_args.append('-std=' + _apexkit_cxx_std('c++17'))" in text
    assert text.index("def _apexkit_cxx_std(") < text.index("secure_compile_args = [")
    compile(text, "setup.py", "exec")


def test_change_dataptr_bound_patch_counts_the_offset_in_bytes_and_drift_stops(tmp_path):
    cpp = tmp_path / "csrc" / "combine_tensors" / "change_dataptr.cpp"
    cpp.parent.mkdir(parents=True)
    cpp.write_text(fixture_repos.CHANGE_DATAPTR)
    (patch,) = [p for p in patches.load_all() if p.id == "change-dataptr-bound"]
    assert patches.apply_one(patch, tmp_path) == patches.APPLIED
    text = cpp.read_text()
    assert (
        "if ((dst.numel() + static_cast<int64_t>(offset)) * dst.element_size() > src.numel() * src.element_size())"
        in text
    )
    assert "dst.numel() * dst.element_size() + offset" not in text
    assert patches.apply_one(patch, tmp_path) == patches.ALREADY
    # upstream reshapes the check but keeps its message: the build stops instead of shipping the old bound
    cpp.write_text(
        fixture_repos.CHANGE_DATAPTR.replace(
            "dst.numel() * dst.element_size() + offset >", "offset + dst.nbytes() >"
        )
    )
    with pytest.raises(PatchError, match="patch change-dataptr-bound no longer applies"):
        patches.apply_one(patch, tmp_path)
    # refs without the check (5.0.rc3 and older): not this patch's trap
    cpp.write_text("void change_data_ptr(at::Tensor des, at::Tensor src, int offset) {}\n")
    assert patches.apply_one(patch, tmp_path) == patches.NOT_APPLICABLE
