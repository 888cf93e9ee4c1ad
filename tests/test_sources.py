import subprocess

import pytest

from apexkit import sources
from apexkit.errors import SourceError

FAST = sources.RetryPolicy(attempts=3, backoff=0.01)


def test_mirror_resolves_refs_and_fetches_only_what_is_missing(repos, tmp_path):
    mirror = sources.Mirror(repos.nvidia_url, tmp_path, FAST)
    assert not mirror.has_commit(repos.nvidia_pin)
    assert mirror.ensure_commit(repos.nvidia_pin, offline=False) == repos.nvidia_pin
    # Present now: offline works, and no fetch is needed (the URL may even be gone).
    gone = sources.Mirror(repos.nvidia_url, tmp_path, FAST)
    gone.url = "file:///nonexistent/repo"
    assert gone.ensure_commit(repos.nvidia_pin, offline=True) == repos.nvidia_pin
    ascend = sources.Mirror(repos.ascend_url, tmp_path, FAST)
    master = ascend.resolve("master", offline=False)
    assert master == subprocess.run(["git", "-C", str(repos.ascend_path), "rev-parse", "master"],
                                    capture_output=True, text=True).stdout.strip()
    assert ascend.resolve("5.0.rc3", offline=True) != master


def test_pinned_sha_that_is_not_in_the_repository_is_refused(repos, tmp_path):
    # The "NVIDIA" URL points at the wrong repository: the pin cannot be verified.
    wrong = sources.Mirror(repos.ascend_url, tmp_path, FAST)
    with pytest.raises(SourceError, match=f"pinned commit {repos.nvidia_pin} is not in"):
        wrong.ensure_commit(repos.nvidia_pin, offline=False)
    with pytest.raises(SourceError, match="not a full 40-hex commit SHA"):
        wrong.ensure_commit(repos.nvidia_pin[:12], offline=False)


def test_unknown_ref_lists_branches(repos, tmp_path):
    with pytest.raises(SourceError) as exc:
        sources.Mirror(repos.ascend_url, tmp_path, FAST).resolve("5.0.rc2", offline=False)
    assert "ref '5.0.rc2' not found" in exc.value.cause and "5.0.rc3" in exc.value.cause


def test_unreachable_url_is_retried_then_a_clear_error(tmp_path, capsys):
    mirror = sources.Mirror("file:///nonexistent/ascend-apex.git", tmp_path, FAST)
    with pytest.raises(SourceError) as exc:
        mirror.resolve("master", offline=False)
    assert "after 3 attempts" in exc.value.cause and "APEXKIT_ASCEND_APEX_URL" in exc.value.hint
    err = capsys.readouterr().err
    assert "attempt 1/3" in err and "attempt 2/3" in err


def test_generated_tree_reproduces_build_sh_without_running_it(repos, tmp_path, monkeypatch):
    marker = tmp_path / "ran"
    monkeypatch.setenv("APEXKIT_FIXTURE_MARKER", str(marker))
    ascend_mirror = sources.Mirror(repos.ascend_url, tmp_path / "cache", FAST)
    sha = ascend_mirror.resolve("master", offline=False)
    ascend = sources.checkout_ascend(ascend_mirror, sha, tmp_path / "ascend")
    assert ascend.pinned_nvidia_commit() == repos.nvidia_pin  # read from scripts/build.sh
    assert ascend.detect_flags() == ("--cpp_ext",)
    nvidia = sources.Mirror(repos.nvidia_url, tmp_path / "cache", FAST)
    nvidia.ensure_commit(repos.nvidia_pin, offline=False)
    tree = tmp_path / "tree"
    (tree / "stale").mkdir(parents=True)
    sources.generate_tree(ascend, nvidia, repos.nvidia_pin, tree)
    assert not (tree / "stale").exists()  # a fresh tree every time
    setup = (tree / "setup.py").read_text()
    assert "def get_package_dir():" in setup and "version='0.1-ascend'" in setup  # npu.patch applied to the pin
    assert (tree / "csrc/combine_tensors/change_dataptr.cpp").is_file()  # src/ copied over the root
    assert (tree / "apex/contrib/combine_tensors/combine_tensors.py").is_file()
    assert (tree / "tests/L0/device.py").is_file() and (tree / "tests/L0/run_test.py").is_file()
    assert not (tree / ".git").exists() and not (tree / "README.md").exists()  # the pin, not the branch head
    assert not marker.exists()


def test_apex_src_is_copied_never_modified(repos, tmp_path):
    checkout = tmp_path / "my-apex"
    subprocess.run(["git", "clone", "-q", str(repos.ascend_path), str(checkout)], check=True)
    (checkout / "src/apex/contrib/combine_tensors/combine_tensors.py").write_text("LOCAL_FIX = True\n")
    before = {p: p.read_bytes() for p in checkout.rglob("*") if p.is_file() and ".git" not in p.parts}
    copy = sources.copy_ascend(checkout, tmp_path / "copy")
    assert copy.dirty and copy.commit.startswith("local:")
    (copy.root / "patch" / "npu.patch").write_text("changed in the copy")
    after = {p: p.read_bytes() for p in checkout.rglob("*") if p.is_file() and ".git" not in p.parts}
    assert before == after
