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
    assert {r.status for r in results} == {patches.ALREADY}
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
