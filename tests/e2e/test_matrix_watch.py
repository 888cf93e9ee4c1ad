"""A real two-combination `matrix --run` over the fixture repos, watched: a start line per combination (i/N), a
heartbeat while one builds (interval 1 s) naming the step the child is in, an end line each, and the grid and the
timeline in summary.md and in $GITHUB_STEP_SUMMARY. No timing is asserted."""

from __future__ import annotations

import re
import subprocess
import sys

from conftest import ROOT, output

BUILT = "py3.11-torch2.13.0-x86_64"
FAILS = "py3.11-torch2.13.0-x86_64-5.0.0"  # a known ref the fixture repo lacks: it starts, then fails fetching


def test_a_watched_run_prints_start_heartbeat_and_end_lines_and_writes_the_grid(runner, tmp_path):
    spec = tmp_path / "matrix.toml"
    spec.write_text(
        '[[include]]\npython = "3.11"\ntorch = "2.13.0"\narch = "x86_64"\n\n'
        '[[include]]\npython = "3.11"\ntorch = "2.13.0"\narch = "x86_64"\nref = "5.0.0"\n'
    )
    step_summary = tmp_path / "step-summary.md"
    step_summary.write_text("earlier\n")
    argv = [sys.executable, "-m", "apexkit", "matrix", "--matrix", str(spec), "--run"]
    # --no-cache: a real build (an earlier test may have cached this wheel in the shared cache), so there is a step
    # for the heartbeat to name
    argv += [
        "--dist",
        str(runner.dist),
        "--build-dir",
        str(runner.build),
        "--",
        "--no-smoke-test",
        "--no-cache",
    ]
    proc = subprocess.run(
        argv,
        cwd=ROOT,
        env=runner.env(APEXKIT_MATRIX_HEARTBEAT="1", GITHUB_STEP_SUMMARY=str(step_summary)),
        capture_output=True,
        text=True,
        timeout=900,
    )
    text = output(proc)
    assert proc.returncode == 1, text[-3000:]  # the second combination failed
    assert "Traceback" not in text
    lines = text.splitlines()
    start = lines.index(f"▸ [1/2] {BUILT}: started (Python 3.11, torch 2.13.0, x86_64, ref master)")
    end = next(i for i, x in enumerate(lines) if x.startswith(f"✓ [1/2] {BUILT}: "))
    beats = [x for x in lines[start:end] if x.startswith(f"  … [1/2] {BUILT}: running ")]
    assert beats, text[-3000:]  # the build took more than a second: at least one heartbeat
    assert any(", step: " in x for x in beats), (
        beats
    )  # the step the child was in, from its status file
    assert re.fullmatch(rf"✓ \[1/2\] {BUILT}: (built|cached) in \S+ — apex-\S+\.whl", lines[end])
    assert f"▸ [2/2] {FAILS}: started (Python 3.11, torch 2.13.0, x86_64, ref 5.0.0)" in lines
    assert any(x.startswith(f"✕ [2/2] {FAILS}: failed in ") for x in lines), text[-3000:]

    summary = (runner.build / "matrix" / "summary.md").read_text()
    assert summary.startswith("### Matrix grid: 1 ok, 1 failed, 0 skipped of 2\n")
    assert re.search(
        r"\| torch 2\.13\.0 \| ✓ ok \(master\) `apex-\S+\.whl`( \(cached\))?<br>✕ failed \(5\.0\.0\) \|",
        summary,
    ), summary
    assert "### Build timeline" in summary and f"| {BUILT} | sources |" in summary
    assert f"| {BUILT} | **total**" in summary
    assert "Markdown only: matplotlib" in text or "timeline.png" in summary  # said once either way
    assert text.count("Markdown only: matplotlib") <= 1
    appended = step_summary.read_text()
    assert (
        appended.startswith("earlier\n\n### Matrix grid: 1 ok, 1 failed")
        and "### Build timeline" in appended
    )
