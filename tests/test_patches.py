from pathlib import Path

import fixture_repos
import pytest

from apexkit import patches
from apexkit.errors import ConfigError, PatchError


def tree_with(tmp_path: Path, setup_text: str) -> Path:
    (tmp_path / "setup.py").write_text(setup_text)
    return tmp_path


def ascend_setup(drifted=False, bare_rpath=True) -> str:
    return fixture_repos.ascend_tree(fixture_repos.nvidia_files(), drifted, bare_rpath)["setup.py"]


def test_all_patches_apply_to_master_shaped_setup_and_fix_each_trap(tmp_path):
    tree = tree_with(tmp_path, ascend_setup())
    results = patches.apply_all(tree)
    assert [(r.id, r.status) for r in results] == [
        ("torch-location", patches.APPLIED), ("pep440-version", patches.APPLIED), ("rpath-link-flag", patches.APPLIED),
        ("cxx11-abi", patches.APPLIED)]
    text = (tree / "setup.py").read_text()
    assert "secure_compile_args = ['-D_GLIBCXX_USE_CXX11_ABI=%d' % int(getattr(torch._C, " in text
    assert "sys.prefix}/lib/python" not in text and "site.getusersitepackages" not in text
    assert "os.path.dirname(os.path.dirname(os.path.abspath(torch.__file__)))" in text
    assert "version='0.1+ascend'" in text and "0.1-ascend" not in text
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
    assert status["torch-location"] == patches.SKIPPED and status["pep440-version"] == patches.APPLIED
    with pytest.raises(ConfigError, match="--skip-patch nosuch: no such patch"):
        patches.apply_all(tree, skip=["nosuch"])


def test_every_patch_has_a_readme_row():
    readme = (patches.PATCHES_DIR / "README.md").read_text()
    for patch in patches.load_all():
        assert f"| `{patch.id}` |" in readme
