"""matrix --run you can watch: start/end lines and a heartbeat scheduled on a fake clock (no sleeps), the grid from
a list of results, the build timeline from a manifest's step timings, the $GITHUB_STEP_SUMMARY append (a link
refused, the size cap kept), and the child's current step kept beside its status file."""

from __future__ import annotations

import json
import os

import pytest

from apexkit import log, statusfile
from apexkit.errors import ConfigError
from apexkit.fleet import matrixrun, runreport, runwatch
from apexkit.plan.matrix import Combination


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _watch(total=2, seconds=30.0, step=None):
    clock, lines = Clock(), []
    watch = runwatch.Watch(
        total,
        seconds,
        emit=lines.append,
        clock=clock,
        wall=lambda: 5000.0 + clock.now,
        read_step=lambda path: step,
    )
    return watch, clock, lines


def test_a_heartbeat_comes_only_after_an_interval_without_any_other_line():
    watch, clock, lines = _watch()
    clock.now += 60
    assert (
        watch.beat() == [] and watch.due_in() == 30.0
    )  # nothing runs: no heartbeat, a whole interval to wait
    watch.started("py3.11-a", 1, "Python 3.11", status_file=None)
    assert lines == ["▸ [1/2] py3.11-a: started (Python 3.11)"]
    clock.now += 29.9
    assert watch.beat() == [] and watch.due_in() == pytest.approx(0.1)
    clock.now += 0.1
    assert watch.beat() == ["  … [1/2] py3.11-a: running 30.0s"]
    assert watch.beat() == []  # printed just now: the next one waits a whole interval
    clock.now += 20
    watch.started("py3.11-b", 2, status_file=None)  # another line resets the wait
    clock.now += 20
    assert watch.beat() == []
    clock.now += 10
    assert watch.beat() == [
        "  … [1/2] py3.11-a: running 1m20.0s",
        "  … [2/2] py3.11-b: running 30.0s",
    ]  # one line per running combination, in the matrix's order
    watch.ended("py3.11-a", 1, "built", 75.0, "apex-0.1-x.whl")
    watch.ended("py3.11-b", 2, "failed", 31.5, "exit 2 (see b.log)")
    assert lines[-2:] == [
        "✓ [1/2] py3.11-a: built in 1m15.0s — apex-0.1-x.whl",
        "✕ [2/2] py3.11-b: failed in 31.5s — exit 2 (see b.log)",
    ]
    clock.now += 600
    assert watch.beat() == []  # nothing runs any more


def test_the_heartbeat_names_the_step_the_child_is_in(tmp_path):
    watch, clock, _ = _watch(
        step=statusfile.Progress("compile (2 extensions)", 5000.0 + 100.0 + 12)
    )
    watch.started("c", 1, status_file=tmp_path / "status.json")
    clock.now += 30
    assert watch.beat() == ["  … [1/2] c: running 30.0s, step: compile (2 extensions) (18.0s)"]
    # a child clock ahead of ours (or from before the combination began): the step without a duration
    watch._read_step = lambda path: statusfile.Progress("sources", 5000.0 + clock.now + 999)
    clock.now += 30
    assert watch.beat() == ["  … [1/2] c: running 1m00.0s, step: sources"]


def test_the_interval_is_a_checked_setting():
    assert runwatch.interval({}) == 30.0
    assert runwatch.interval({"APEXKIT_MATRIX_HEARTBEAT": "1"}) == 1.0
    for bad in ("0", "abc", "nan", "-5", "1e9"):
        with pytest.raises(ConfigError) as err:
            runwatch.interval({"APEXKIT_MATRIX_HEARTBEAT": bad})
        assert "$APEXKIT_MATRIX_HEARTBEAT=" in err.value.format()


def test_the_child_keeps_its_current_step_beside_its_status_file(tmp_path):
    status = tmp_path / "status.json"
    env = {statusfile.VARIABLE: str(status)}
    statusfile.note_step("install torch 2.13.0\x1b[2J", env)
    got = statusfile.read_step(status)
    assert (
        got is not None and got.step == "install torch 2.13.0\\x1b[2J"
    )  # control characters escaped
    statusfile.write(0, environ=env)  # the end of the command removes it
    assert statusfile.read_step(status) is None and not statusfile.step_path(status).exists()
    # nested log.step calls: the innermost open one, then the outer again, then none
    seen = []
    log.step_listeners.append(seen.append)
    try:
        with log.step("outer"), log.step("inner"):
            pass
    finally:
        log.step_listeners.remove(seen.append)
    assert seen == ["outer", "inner", "outer", None]


@pytest.mark.parametrize(
    "content",
    [
        b"[]",
        b'{"step": 3, "since": 1}',
        b'{"step": "x", "since": "soon"}',
        b'{"step": "x", "since": NaN}',
        b'{"step": "x", "since": true}',
        b"x" * 5000,
    ],
)
def test_an_odd_step_file_is_not_shown(tmp_path, content):
    status = tmp_path / "status.json"
    statusfile.step_path(status).write_bytes(content)
    assert statusfile.read_step(status) is None


def test_a_linked_step_file_is_not_followed(tmp_path):
    status = tmp_path / "status.json"
    (tmp_path / "elsewhere").write_text('{"step": "planted", "since": 1}')
    statusfile.step_path(status).symlink_to(tmp_path / "elsewhere")
    assert statusfile.read_step(status) is None


def _cells():
    c = runreport.Cell
    return [
        c(
            "a",
            "3.11",
            "2.13.0",
            "",
            "x86_64",
            "built",
            "apex-0.1+ascend.torch2.13.0-cp311-cp311-linux_x86_64.whl",
        ),
        c("b", "3.10", "2.13.0", "", "aarch64", "failed", detail="exit 1"),
        c("c", "3.11", "2.7.1", "2.7.1.post2", "aarch64", "refused", detail="no such row"),
        c("d", "3.10", "2.7.1", "2.7.1.post2", "x86_64", "cached", "apex-d.whl"),
    ]


def test_the_grid_has_a_row_per_stack_and_a_column_per_python_and_arch():
    text = runreport.grid(_cells())
    lines = text.splitlines()
    assert lines[0] == "### Matrix grid: 2 ok, 1 failed, 1 skipped of 4"
    assert lines[2] == "| stack | py3.10 aarch64 | py3.10 x86_64 | py3.11 aarch64 | py3.11 x86_64 |"
    assert lines[4] == (
        "| torch 2.13.0 | ✕ failed | · | · | ✓ ok `apex-0.1+ascend.torch2.13.0-cp311-cp311-linux_x86_64.whl` |"
    )
    assert lines[5] == (
        "| torch 2.7.1 + torch_npu 2.7.1.post2 | · | ✓ ok `apex-d.whl` (cached) | – skipped | · |"
    )
    hostile = runreport.grid(
        [runreport.Cell("e", "3.11", "2|x", "", "x86_64", "built", "a`b|c\x1b.whl")]
    )
    assert (
        "torch 2\\|x" in hostile and "`a'b\\|c\\x1b.whl`" in hostile
    )  # no table or code span broken


def test_the_grid_comes_from_the_run_results_and_their_combinations():
    combos = [
        Combination("3.11", "2.13.0", "x86_64", "master"),
        Combination("3.8", "2.6.0", "x86_64", "master"),
    ]
    results = [
        matrixrun.Result(
            combos[0].id, "built", 61.0, wheel="apex-w.whl", size=2048, sha256="ab" * 32
        ),
        matrixrun.Result(
            combos[1].id, "refused", detail="torch 2.6.0 has no wheels for Python 3.8"
        ),
    ]
    text, shown = matrixrun.report_markdown(results, combos)
    assert (
        text.startswith(shown)
        and "### Build timeline" in text
        and "### Build timeline" not in shown
    )
    assert "| torch 2.13.0 | · | ✓ ok `apex-w.whl` |" in text
    assert "| torch 2.6.0 | – skipped | · |" in text
    assert "| combination | wheel | size | sha256 | build time | cache hit |" in shown


MANIFEST = {
    "durations_s": {
        "find_python": 0.5,
        "sources": 4.5,
        "venv": 20.0,
        "compile": 30.0,
        "publish": 1.0,
        "total": 60.0,
    }
}


def test_the_timeline_is_read_from_the_manifest_timings_with_a_bar_per_step():
    steps = runreport.step_timings(MANIFEST)
    assert list(steps) == ["find_python", "sources", "venv", "compile", "publish", "total"]
    text = runreport.timeline(
        [runreport.Cell("a", "3.11", "2.13.0", "", "x86_64", "built", steps=steps)]
    )
    rows = {line.split(" | ")[1]: line for line in text.splitlines() if line.startswith("| a |")}
    assert list(rows) == [
        "find_python",
        "sources",
        "venv",
        "compile",
        "publish",
        "other",
        "**total**",
    ]
    assert rows["venv"] == "| a | venv | 20.0s | +5.0s | `··█████████·················` |".replace(
        "`··█████████·················`", "`" + "··" + "█" * 10 + "·" * 18 + "`"
    )
    assert rows["compile"].endswith("`" + "·" * 12 + "█" * 15 + "···`" + " |")
    assert rows["other"].startswith("| a | other | 4.0s | +56.0s |")  # the time no step covers
    assert rows["find_python"].count("█") == 1  # a short step still shows
    assert rows["**total**"].endswith("`" + "█" * 30 + "` |")


@pytest.mark.parametrize(
    "manifest",
    [
        {},
        {"durations_s": []},
        {"durations_s": {"Compile Step": 1}},
        {"durations_s": {"a": -1}},
        {"durations_s": {"a": float("inf")}},
        {"durations_s": {"a": "1"}},
        {"durations_s": {f"k{i}": 1 for i in range(65)}},
    ],
)
def test_timings_that_are_not_what_a_build_writes_are_not_used(manifest):
    assert runreport.step_timings(manifest) is None


def test_the_step_summary_is_appended_to_a_regular_file_only(tmp_path):
    summary = tmp_path / "summary"
    summary.write_text("earlier step\n")
    env = {"GITHUB_STEP_SUMMARY": str(summary)}
    assert runreport.append_step_summary("### grid\n| a |", env) is None
    assert summary.read_text() == "earlier step\n\n### grid\n| a |\n"
    assert runreport.append_step_summary("x", {}) is None  # unset: nothing to do, nothing said

    target = tmp_path / "victim"
    target.write_text("keep\n")
    link = tmp_path / "link"
    link.symlink_to(target)
    why = runreport.append_step_summary("### grid", {"GITHUB_STEP_SUMMARY": str(link)})
    assert why is not None and "not appending" in why and "link" in why
    assert target.read_text() == "keep\n"
    missing = runreport.append_step_summary("x", {"GITHUB_STEP_SUMMARY": str(tmp_path / "none")})
    assert missing is not None and "does not exist" in missing and not (tmp_path / "none").exists()
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    assert "not appending" in runreport.append_step_summary("x", {"GITHUB_STEP_SUMMARY": str(fifo)})


def test_the_step_summary_stays_within_its_cap(tmp_path, monkeypatch):
    monkeypatch.setattr(runreport, "STEP_SUMMARY_MAX", 200)
    summary = tmp_path / "summary"
    summary.write_text("x" * 50 + "\n")
    why = runreport.append_step_summary(
        "\n".join(f"line {i:03d}" for i in range(100)), {"GITHUB_STEP_SUMMARY": str(summary)}
    )
    text = summary.read_text()
    assert len(text.encode()) <= 200 and why is not None and "cut" in why
    assert text.rstrip().endswith("the whole report is in summary.md)")
    assert "line 000\n" in text  # cut at a line, from the end
    full = runreport.append_step_summary("more " * 20, {"GITHUB_STEP_SUMMARY": str(summary)})
    assert full is not None and summary.read_text() == text  # full: nothing more appended


def test_summary_json_round_trips_the_step_timings():
    r = matrixrun.Result("a", "built", steps=runreport.step_timings(MANIFEST))
    assert json.loads(json.dumps(r.__dict__))["steps"]["compile"] == 30.0


def test_without_matplotlib_the_timeline_is_markdown_only_and_says_why(tmp_path, monkeypatch):
    def missing(name, *args):
        raise ModuleNotFoundError(f"No module named {name!r}")

    monkeypatch.setattr(runreport.importlib, "import_module", missing)
    steps = runreport.step_timings(MANIFEST)
    cells = [runreport.Cell("a", "3.11", "2.13.0", "", "x86_64", "built", steps=steps)]
    why = runreport.draw_timeline(cells, tmp_path / "timeline.png")
    assert why == "matplotlib is not importable here (ModuleNotFoundError)"
    assert not (tmp_path / "timeline.png").exists()
    assert runreport.draw_timeline([], tmp_path / "t.png") == "no step timings recorded"


def test_with_matplotlib_the_timeline_is_drawn(tmp_path):
    pytest.importorskip("matplotlib")  # not an apexkit dependency: drawn when the host has it
    steps = runreport.step_timings(MANIFEST)
    cells = [runreport.Cell("a", "3.11", "2.13.0", "", "x86_64", "built", steps=steps)]
    assert runreport.draw_timeline(cells, tmp_path / "timeline.png") is None
    assert (tmp_path / "timeline.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
