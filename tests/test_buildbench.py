"""nox -s build-bench's pieces that need no build: the changed-input checkout and the ratio table."""

from __future__ import annotations

from apexkit import buildbench, patches


def test_changed_input_checkout_changes_one_patch_hash_and_nothing_it_does(tmp_path):
    copy = buildbench.changed_checkout(tmp_path)
    ours, theirs = patches.load_all(), patches.load_all(copy / "patches")
    assert [p.id for p in ours] == [p.id for p in theirs]
    assert ours[0].sha256 != theirs[0].sha256 and [p.sha256 for p in ours[1:]] == [p.sha256 for p in theirs[1:]]
    assert (copy / "noxfile.py").is_file() and (copy / "apexkit" / "build.py").is_file()
    assert not (copy / ".git").exists() and not (copy / ".venv").exists()


def test_table_gives_ratios_against_the_cold_build():
    row = lambda wall, compile_s: {"wall_s": wall, "durations_s": {"sources": 1.0, "compile (--cpp_ext, -j2)": compile_s,  # noqa: E731
                                                                    "total": wall}}
    text = buildbench.table({"cold": row(100.0, 60.0), "no-op": row(0.8, 0.0), "changed-input": row(20.0, 9.0)})
    assert "| no-op | 0.8 s | 0.01× |" in text and "| changed-input | 20.0 s | 0.20× | 9.0 s |" in text
    assert "cold wall ÷ its compile step: 1.67×" in text
