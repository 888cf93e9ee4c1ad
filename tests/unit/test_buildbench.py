"""nox -s build-bench's pieces that need no build: the changed-input checkout and the ratio table."""

from __future__ import annotations

from apexkit.wheel import patches
from tools import buildbench


def test_changed_input_checkout_changes_one_patch_hash_and_nothing_it_does(tmp_path):
    copy = buildbench.changed_checkout(tmp_path)
    ours, theirs = patches.load_all(), patches.load_all(copy / "patches")
    assert [p.id for p in ours] == [p.id for p in theirs]
    assert ours[0].sha256 != theirs[0].sha256 and [p.sha256 for p in ours[1:]] == [
        p.sha256 for p in theirs[1:]
    ]
    assert (copy / "noxfile.py").is_file() and (copy / "apexkit" / "wheel" / "builder.py").is_file()
    assert not (copy / ".git").exists() and not (copy / ".venv").exists()


def test_table_gives_ratios_against_the_cold_build():
    def row(wall, compile_s):
        return {
            "wall_s": wall,
            "durations_s": {
                "sources": 1.0,
                "compile (--cpp_ext, -j2)": compile_s,
                "total": wall,
            },
        }

    text = buildbench.table(
        {"cold": row(100.0, 60.0), "no-op": row(0.8, 0.0), "changed-input": row(20.0, 9.0)}
    )
    assert (
        "| no-op | 0.8 s | 0.01× |" in text and "| changed-input | 20.0 s | 0.20× | 9.0 s |" in text
    )
    assert "cold wall ÷ its compile step: 1.67 (goal ≤ 1.3: NOT met)" in text
    assert (
        "changed-input wall ÷ cold wall: 0.2 (goal ≤ 0.25: met)" in text
        and "no-op wall (s): 0.8 (goal < 1: met)" in text
    )


def test_table_reads_the_stable_step_keys_and_ccache():
    cold = {
        "wall_s": 120.0,
        "ccache": {"hits": 0, "misses": 6, "hit_rate": 0.0},
        "durations_s": {
            "find_python": 0.1,
            "sources": 2.0,
            "venv": 1.0,
            "torch_install": 3.0,
            "tree": 0.5,
            "patches": 0.2,
            "compile": 100.0,
            "binary_checks": 1.0,
            "smoke_test": 4.0,
            "publish": 0.5,
            "total": 113.0,
        },
    }
    changed = {
        "wall_s": 25.0,
        "ccache": {"hits": 6, "misses": 0, "hit_rate": 1.0},
        "durations_s": {"compile": 10.0, "total": 20.0},
    }
    unknown = {
        "wall_s": 30.0,
        "ccache": {
            "hits": "unknown",
            "misses": "unknown",
            "hit_rate": "unknown",
            "reason": "`ccache --print-stats` failed",
        },
        "durations_s": {"compile": 10.0, "total": 20.0},
    }
    text = buildbench.table({"cold": cold, "changed-input": changed, "compile -j1": unknown})
    assert (
        "| cold | 120.0 s | 1.00× | 100.0 s | 0/6 hits (0%) | find_python 0.1, sources 2.0, venv 1.0, "
        "torch_install 3.0, tree 0.5, patches 0.2, compile 100.0, binary_checks 1.0, smoke_test 4.0, publish 0.5, "
        "other 0.7 |" in text
    )
    assert (
        "| changed-input | 25.0 s | 0.21× | 10.0 s | 6/6 hits (100%) | compile 10.0, other 10.0 |"
        in text
    )
    assert "unknown (`ccache --print-stats` failed)" in text
    assert [(g[0], g[3]) for g in buildbench.goals({"cold": cold, "changed-input": changed})] == [
        ("changed-input wall ÷ cold wall", True),
        ("cold wall ÷ its compile step", True),
    ]
