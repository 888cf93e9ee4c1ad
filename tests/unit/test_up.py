"""Issue 25 item 6: `apexkit up` -- the stage plan, the skip logic, the report, the state file as untrusted input.
The stages' commands run for real in tests/e2e/test_up.py; here the probe and the stage runner are stand-ins."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import fakes
import pytest

from apexkit import up
from apexkit.errors import ConfigError

SHA = "a" * 64


def venv(tmp_path: Path, name: str = "train") -> Path:
    root = tmp_path / name
    (root / "bin").mkdir(parents=True)
    (root / "bin" / "python").write_text("")
    return root


def options(tmp_path: Path, **kw) -> up.Options:
    root = venv(tmp_path)
    kw.setdefault("report", str(tmp_path / "report"))
    return up.make_options(venv=str(root), environ={}, **kw)


def facts(**kw) -> up.Facts:
    base = {
        "prefix": "/v",
        "python": "3.11.7",
        "torch": "2.13.0",
        "apex": "0.1",
        "apex_record": SHA,
    }
    return up.Facts(**{**base, **kw})


# --- options and the plan ---------------------------------------------------------------------------------------


def test_plan_runs_doctor_install_validate_and_only_asked_for_proxy_and_bench(tmp_path):
    opts = options(tmp_path, index=["http://127.0.0.1:1/simple/"], no_build=True, device="cpu")
    stages = up.plan(opts)
    assert [s.name for s in stages] == list(up.STAGES)
    wanted = {s.name: s.wanted for s in stages}
    assert wanted == {
        "proxy": False,
        "doctor": True,
        "install": True,
        "validate": True,
        "bench": False,
    }
    by = {s.name: (s.command, dict(s.options)) for s in stages}
    root = str(tmp_path / "train")
    assert by["doctor"] == ("doctor", {"venv": root, "as_json": True})
    assert by["install"] == (
        "install",
        {"venv": root, "index": ["http://127.0.0.1:1/simple/"], "no_build": True, "as_json": True},
    )
    assert by["proxy"] == ("proxy.check", {"as_json": True})
    # each declared command takes these options as they are (the child builds its options dataclass from them)
    from apexkit import commands

    for stage in stages[:3]:
        commands.BY_NAME[stage.command].options(**stage.options)
    validate = up.venvrun_argv(stages[3])
    assert validate[1:] == [
        "-m", "apexkit", "validate", "--interpreter", f"{root}/bin/python", "--device", "cpu",
        "--json", str(tmp_path / "report" / "validate.json"),
    ]  # fmt: skip


def test_bench_args_imply_bench_and_reach_the_bench_command(tmp_path):
    opts = options(tmp_path, bench_args="--model mlp --scale '0.05'")
    bench = up.plan(opts)[-1]
    assert bench.wanted and bench.options["args"] == ["--model", "mlp", "--scale", "0.05"]
    assert up.venvrun_argv(bench)[-6:] == [
        "--out", str(opts.report / "bench"), "--model", "mlp", "--scale", "0.05",
    ]  # fmt: skip
    assert options(tmp_path / "b", proxy_check=True).proxy_check
    assert up.plan(options(tmp_path / "c", proxy_check=True))[0].wanted


def test_interpreter_target_and_default_report_name(tmp_path):
    root = venv(tmp_path, "my venv!")
    opts = up.make_options(interpreter=str(root / "bin" / "python"), environ={})
    assert opts.target.given == ("interpreter", str(root / "bin" / "python"))
    assert opts.target.name == "my_venv"
    assert opts.report.parts[-3:] == ("reports", "up", "my_venv")
    active = up.make_options(environ={"VIRTUAL_ENV": str(root)}, report=str(tmp_path / "r"))
    assert active.target.given == ("venv", str(root))


@pytest.mark.parametrize(
    "kw, says",
    [
        ({}, "no venv given and none active"),
        ({"venv": "/nonexistent/venv"}, "does not exist"),
        ({"interpreter": "/nonexistent/python"}, "no such file"),
        ({"venv": "V", "interpreter": "P"}, "both given"),
    ],
)
def test_a_bad_target_is_one_line(kw, says):
    with pytest.raises(ConfigError) as err:
        up.make_options(environ={}, **kw)
    assert says in err.value.cause and err.value.hint and "\n" not in err.value.format()


def test_an_index_with_a_password_never_reaches_a_command_line(tmp_path):
    with pytest.raises(ConfigError) as err:
        options(tmp_path, index=["https://user:s3cret@index.example/simple/"])
    assert "s3cret" not in err.value.format() and "APEXKIT_INDEX" in err.value.hint
    with pytest.raises(ConfigError, match="device"):
        options(tmp_path / "d", device="tpu")
    with pytest.raises(ConfigError, match="bench-args"):
        options(tmp_path / "e", bench_args="'unclosed")


# --- the probe's output and each stage's inputs -------------------------------------------------------------------


def test_probe_output_is_checked():
    got = up.parse_facts(
        {
            "prefix": "/v",
            "python": "3.11.7\x1b[2J",
            "torch": {"version": "2.13.0", "record": SHA},
            "torch_npu": "nonsense",
            "apex": {"version": "0.1", "record": "../../etc/passwd"},
        }
    )
    assert got.torch == "2.13.0" and got.torch_npu is None
    assert got.apex == "0.1" and got.apex_record is None  # not a digest: not taken
    assert "\x1b" not in got.python
    with pytest.raises(ValueError):
        up.parse_facts(["prefix"])


def test_inputs_change_with_the_venv_torch_and_wheel_but_proxy_and_doctor_ignore_the_wheel(
    tmp_path,
):
    opts = options(tmp_path)

    def key(stage, **kw):
        return up.digest(up.stage_inputs(stage, facts(**kw), opts, {}))

    for stage in ("install", "validate", "bench"):
        assert key(stage) != key(stage, apex_record="b" * 64)
        assert key(stage) != key(stage, torch="2.12.0")
        assert key(stage) != key(stage, prefix="/other")
    assert key("doctor") == key("doctor", apex_record="b" * 64)
    assert key("doctor") != key("doctor", torch="2.12.0")
    assert key("proxy") == key("proxy", torch="2.12.0")
    other = options(tmp_path / "o", device="cpu")
    assert up.digest(up.stage_inputs("validate", facts(), opts, {})) != up.digest(
        up.stage_inputs("validate", facts(), other, {})
    )
    # a proxy password changes the key without being kept in it
    inputs = up.stage_inputs("proxy", facts(), opts, {"https_proxy": "http://u:pw123@p:3128"})
    assert "pw123" not in json.dumps(inputs)


def test_install_inputs_name_the_trusted_key_ids_from_the_flag_or_the_environment(tmp_path):
    """Issue 42: install done unverified, or verified against a key since revoked, is not done once the trusted keys
    differ; the key's id counts, wherever it is given; no key: the inputs an earlier state was written with."""
    from apexkit.index import signing

    for name in ("team-a", "team-b"):
        signing.generate(name, str(tmp_path / "keys"))
    a, b = (str(tmp_path / "keys" / f"{n}.pub") for n in ("team-a", "team-b"))
    plain = options(tmp_path / "p")

    def key(stage, opts):
        return up.digest(up.stage_inputs(stage, facts(), opts, {}))

    with_a = options(tmp_path / "a", trusted_key=[a])
    assert with_a.trusted_keyids == tuple(signing.public_keys([a]))
    assert "trusted_keys" not in up.stage_inputs("install", facts(), plain, {})
    with_b = options(tmp_path / "b", trusted_key=[b])
    assert len({key("install", o) for o in (plain, with_a, with_b)}) == 3
    assert key("validate", plain) == key("validate", with_a)
    root = venv(tmp_path / "e")
    from_env = up.make_options(
        venv=str(root), report=str(tmp_path / "r"), environ={"APEXKIT_TRUSTED_KEYS": a}
    )
    assert key("install", from_env) == key("install", with_a)


def test_previous_run_counts_only_for_the_same_key_and_not_with_force():
    state = {"doctor": up.Done(SHA, "2026-12-02T07:00:00+00:00", 1.5)}
    assert up.previous_run("doctor", SHA, state, force=False) is state["doctor"]
    assert up.previous_run("doctor", "b" * 64, state, force=False) is None
    assert up.previous_run("doctor", SHA, state, force=True) is None
    assert up.previous_run("install", SHA, state, force=False) is None


# --- the state file: untrusted --------------------------------------------------------------------------------


def good_state() -> dict:
    return {
        "format": up.STATE_FORMAT,
        "stages": {
            "doctor": {"key": SHA, "finished": "2026-12-02T07:00:00+00:00", "seconds": 2.0},
            "install": {
                "key": SHA,
                "finished": "2026-12-02T07:01:00+00:00",
                "seconds": 3,
                "result": {"sha256": SHA, "wheel": "apex.whl", "Bad Key": "x", "n": 5},
            },
            "unknown-stage": {"key": 1},
        },
    }


def test_state_round_trips_and_keeps_only_plain_results():
    state = up.parse_state(good_state())
    assert set(state) == {"doctor", "install"}
    assert state["install"].result == {"sha256": SHA, "wheel": "apex.whl"}
    assert up.parse_state(json.loads(up.state_bytes(state))) == state


@pytest.mark.parametrize(
    "change",
    [
        lambda d: d.update(format="other/1"),
        lambda d: d.update(stages=[]),
        lambda d: d["stages"].update(doctor="x"),
        lambda d: d["stages"]["doctor"].update(key="../x"),
        lambda d: d["stages"]["doctor"].update(finished="yesterday"),
        lambda d: d["stages"]["doctor"].update(seconds=True),
        lambda d: d["stages"]["doctor"].update(seconds=-1),
        lambda d: d["stages"]["doctor"].update(seconds="2"),
    ],
)
def test_a_state_with_wrong_types_is_refused(change):
    data = good_state()
    change(data)
    with pytest.raises(ValueError):
        up.parse_state(data)


def test_a_corrupt_linked_or_huge_state_file_is_ignored_with_one_line(tmp_path, capsys):
    report = tmp_path / "r"
    report.mkdir()
    state = report / up.STATE_FILE
    assert up.load_state(report) == {}  # none yet: nothing said
    state.write_text(json.dumps(good_state()))
    assert set(up.load_state(report)) == {"doctor", "install"}
    for content in ("{not json", "[1, 2]", " " * (up.STATE_MAX + 1)):
        state.write_text(content)
        capsys.readouterr()
        assert up.load_state(report) == {}
        err = capsys.readouterr().err
        assert "ignoring" in err and err.count("\n") == 1
    state.unlink()
    (tmp_path / "elsewhere.json").write_text(json.dumps(good_state()))
    os.symlink(tmp_path / "elsewhere.json", state)
    assert up.load_state(report) == {}
    assert "symbolic link" in capsys.readouterr().err


# --- what a stage's output says -----------------------------------------------------------------------------------


def test_first_failure_from_rows_validate_and_the_status_line():
    rows = [
        {"area": "python", "name": "python3", "status": "ok", "detail": "fine"},
        {"area": "compiler", "name": "g++", "status": "fail", "detail": "not found\nmore", "fix": "apt-get install g++"},
        {"area": "disk", "name": "free", "status": "fail", "detail": "later", "fix": "later"},
    ]  # fmt: skip
    assert up.failure_from_rows(rows) == ("compiler g++: not found", "apt-get install g++")
    assert up.rows_summary(rows) == "2 fail, 1 ok"
    assert up.failure_from_rows({"not": "rows"}) is None
    report = {
        "ok": False,
        "checks": [
            {"check": "torch", "status": "ok", "required": True},
            {"check": "torch_npu", "status": "skip", "required": False, "detail": "-"},
            {"check": "import apex", "status": "fail", "required": True, "detail": "No module", "hint": "install it"},
        ],
    }  # fmt: skip
    assert up.failure_from_validate(report) == ("import apex: No module", "install it")
    # a child's status line: apexkit's `cause -- next: fix`, secrets masked, one bounded line
    assert up.split_error("no wheel for cp311 -- next: build it") == (
        "no wheel for cp311",
        "build it",
    )
    cause, fix = up.split_error("error: at https://u:pw@x/\x1b[2J -- next: " + "y" * 999)
    assert "pw" not in cause and "\x1b" not in cause and len(fix) == up.TEXT_MAX


def test_the_child_runs_the_declared_command_its_options_file_names(tmp_path, monkeypatch):
    """`python -m apexkit.commands FILE`, the child's side, here in-process: the command runs with the file's options;
    a file naming no declared command, or options it does not take, is one line in its status file (a usage error,
    as `apexkit <command>` records it), never a traceback or "an apexkit bug"."""
    from apexkit import commands, statusfile
    from apexkit.errors import ConfigError

    options = tmp_path / "doctor.options.json"
    options.write_text(json.dumps({"command": "doctor", "options": {"no_such_option": 1}}))
    monkeypatch.setenv(statusfile.VARIABLE, str(tmp_path / "status.json"))
    for bad in ({"command": "doctor", "options": {"no_such_option": 1}}, {"command": "nope"}, ["doctor"],
                {"command": ["doctor"], "options": {}}, {"command": "doctor", "options": "--venv x"}, "not json",
                {"command": "cache.list", "options": {"what": 5}}, {"command": "doctor", "options": {"venv": {"a": 1}}},
                {"command": "config.show", "options": {"as_json": "no"}}):  # fmt: skip
        options.write_text(bad if isinstance(bad, str) else json.dumps(bad))
        assert commands.run_options_file(str(options)) == ConfigError.exit_code
        status = statusfile.read(tmp_path / "status.json")
        assert status is not None and status.exit_code == ConfigError.exit_code
        assert "is not an apexkit options file" in (status.error or ""), status
    options.write_text(json.dumps({"command": "config.show", "options": {"as_json": True}}))
    assert commands.run_options_file(str(options)) == 0
    assert statusfile.read(tmp_path / "status.json") == statusfile.Status(0)


def test_a_failed_stage_takes_its_cause_from_the_status_file_else_its_exit_code(
    tmp_path, monkeypatch
):
    from apexkit import statusfile

    logs = tmp_path / "logs"
    logs.mkdir()
    stage = up.plan(options(tmp_path))[2]  # install

    def child(stage, fh, logs, env):
        if code == 2:  # the child's own line, as exits.exit_code records it
            statusfile.write(2, "no wheel fits -- next: build it", environ=env)
        return code, None

    monkeypatch.setattr(up, "_child", child)
    code = 2
    row = up.run_stage(stage, logs, tmp_path, {}, {})
    assert (row.status, row.exit_code, row.cause, row.fix) == (
        up.FAILED,
        2,
        "no wheel fits",
        "build it",
    )
    assert row.to_json()["command"] == "install" and row.to_json()["options"] == dict(stage.options)
    assert (logs / "install.log").read_text() == f"+ {stage.shown()}\n"
    code = 137  # killed: it recorded nothing
    row = up.run_stage(stage, logs, tmp_path, {}, {})
    assert (row.cause, row.fix) == ("exit 137", f"read {logs / 'install.log'}")


def test_install_result_is_checked_and_masked():
    got = up.install_result(
        {
            "status": "installed",
            "wheel": "apex-0.1-cp311-cp311-linux_x86_64.whl",
            "sha256": "not-a-digest",
            "source": "https://u:pw@index.example/simple/",
            "other": "dropped",
        }
    )
    assert got == {
        "status": "installed",
        "wheel": "apex-0.1-cp311-cp311-linux_x86_64.whl",
        "source": "https://u:***@index.example/simple/",
    }
    assert up.install_result([1]) == {}


WHEEL = "apex-0.1+ascend-cp311-cp311-linux_x86_64.whl"


@pytest.mark.parametrize(
    ("status", "source", "detail"),
    [
        ("built-and-installed", "wheel cache", f"{WHEEL}: wheel cache"),
        ("built-and-installed", "built", f"{WHEEL}: built"),
        ("built-and-installed", "team index https://u:***@t.example/", f"{WHEEL}: team index https://u:***@t.example/"),
        ("installed", "https://u:pw@index.example/simple/", f"{WHEEL}: team index https://u:***@index.example/simple/"),
        ("already-installed", "wheel cache", f"{WHEEL}: installed already"),
        ("already-installed", "build", f"{WHEEL}: installed already"),
    ],
)  # fmt: skip
def test_the_install_row_names_where_the_wheel_really_came_from(status, source, detail):
    """Issue 41: a wheel-cache hit read `built-and-installed ... build`, a rerun `already-installed ... build`."""
    row = up.Row("install", up.OK)
    up._install_read(row, {"status": status, "wheel": WHEEL, "source": source}, Path("/r"))
    assert row.detail == detail and "build" not in row.detail.split()


# --- a whole run, the stages stood in for -------------------------------------------------------------------------


class FakeNode:
    """probe(), the device pick and run_stage() stand-ins: the venv's facts, its device (npu), which stages fail."""

    def __init__(self, monkeypatch):
        self.facts = facts(apex=None, apex_record=None)
        self.fail: set[str] = set()
        self.ran: list[str] = []
        monkeypatch.setattr(up, "probe", lambda python: self.facts)
        monkeypatch.setattr(up, "pick_device", lambda python: "npu")
        monkeypatch.setattr(up, "run_stage", self.run_stage)

    def run_stage(self, stage, logs, report, environ, extra_env):
        self.ran.append(stage.name)
        if stage.name == "install" and stage.name not in self.fail:
            self.facts = dataclasses.replace(self.facts, apex="0.1", apex_record=SHA)  # the wheel
        failed = stage.name in self.fail
        if (
            not failed
        ):  # what the real stage leaves, looked at before it is skipped next time (up.undone)
            self.leave(stage, logs, report)
        return up.Row(
            stage.name,
            up.FAILED if failed else up.OK,
            "boom" if failed else "fine",
            seconds=0.5,
            log=str(logs / f"{stage.name}.log"),
            exit_code=1 if failed else 0,
            cause="boom" if failed else None,
            fix="do this" if failed else None,
            finished=up.now(),
            result={"sha256": SHA} if stage.name == "install" and not failed else {},
        )

    @staticmethod
    def leave(stage, logs, report):
        if stage.name in ("doctor", "proxy"):
            (logs / f"{stage.name}.json").write_text('[{"status": "ok"}]')
        if stage.name == "validate":
            said = {
                "ok": True,
                "python": stage.options["interpreter"],
                "device": stage.options["device"],
            }
            (report / "validate.json").write_text(json.dumps(said))
        if stage.name == "bench":
            (report / "bench").mkdir(exist_ok=True)


def run(opts) -> tuple[int, dict]:
    code = up.execute(opts, environ={})
    return code, json.loads((opts.report / "up.json").read_text())


def test_rerun_skips_what_is_done_and_reruns_what_changed(tmp_path, monkeypatch, capsys):
    node = FakeNode(monkeypatch)
    opts = options(tmp_path)
    code, report = run(opts)
    assert code == 0 and report["ok"]
    assert node.ran == ["doctor", "install", "validate"]
    assert [s["status"] for s in report["stages"]] == ["skipped", "ok", "ok", "ok", "skipped"]
    assert report["facts"]["apex"] == "0.1"  # probed again after install
    assert "ready" in capsys.readouterr().out

    node.ran.clear()
    code, report = run(opts)
    assert code == 0 and node.ran == []
    done = [s for s in report["stages"] if s["status"] == "done"]
    assert [s["name"] for s in done] == ["doctor", "install", "validate"]
    assert all(s["finished"] for s in done) and done[1]["result"] == {"sha256": SHA}
    assert "done (from " in (opts.report / "up.md").read_text()

    node.facts = facts(torch="2.12.0")  # someone changed the venv's torch: everything depends on it
    node.ran.clear()
    run(opts)
    assert node.ran == ["doctor", "install", "validate"]

    node.ran.clear()
    run(up.make_options(venv=opts.target.given[1], report=str(opts.report), force=True, environ={}))
    assert node.ran == ["doctor", "install", "validate"]


def test_a_failed_stage_skips_the_rest_exits_1_and_is_run_again(tmp_path, monkeypatch, capsys):
    node = FakeNode(monkeypatch)
    node.fail = {"install"}
    opts = options(tmp_path, bench=True)
    code, report = run(opts)
    assert code == 1 and not report["ok"]
    statuses = {s["name"]: (s["status"], s["detail"]) for s in report["stages"]}
    assert statuses["validate"] == ("skipped", "install failed")
    assert statuses["bench"] == ("skipped", "install failed")
    assert report["first_failure"] == {"stage": "install", "cause": "boom", "fix": "do this"}
    out = capsys.readouterr().out
    assert "failed at install" in out and "→ do this" in out
    md = (opts.report / "up.md").read_text()
    assert "| install | failed |" in md and "skipped: install failed" in md and "Fix: do this" in md
    state = json.loads((opts.report / up.STATE_FILE).read_text())
    assert set(state["stages"]) == {"doctor"}

    node.fail, node.ran = set(), []
    code, report = run(opts)
    assert code == 0 and node.ran == ["install", "validate", "bench"]  # doctor was done


def test_dry_run_prints_every_stage_and_writes_nothing(tmp_path, monkeypatch, capsys):
    node = FakeNode(monkeypatch)
    opts = options(tmp_path, dry_run=True, index=["file:///srv/index/simple/"])
    assert up.execute(opts, environ={}) == 0
    out = capsys.readouterr().out
    assert node.ran == [] and not opts.report.exists()
    for name in up.STAGES:
        assert f"  {name} " in out
    assert 'install {"venv": ' in out and '"index": ["file:///srv/index/simple/"]' in out
    assert "skipped: not asked for (--bench)" in out


def test_json_output_is_the_report(tmp_path, monkeypatch, capsys):
    FakeNode(monkeypatch)
    opts = options(tmp_path, as_json=True)
    assert up.execute(opts, environ={}) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed == json.loads((opts.report / "up.json").read_text())
    assert printed["format"] == up.FORMAT
    assert {s["status"] for s in printed["stages"]} <= {"ok", "failed", "skipped", "done"}


def test_markdown_escapes_what_children_said():
    row = up.Row("install", up.FAILED, "a|b `x`", seconds=1.0, log="/r/logs/install.log")
    row.cause, row.fix = "a|b", "run `x`\x1b[31m"
    opts_report = {
        "venv": "/v",
        "started": "t",
        "seconds": 1.0,
        "device": "cpu",
        "facts": None,
        "ok": False,
        "first_failure": {"stage": "install", "cause": "a|b", "fix": row.fix},
        "stages": [row.to_json()],
    }
    md = up.render_markdown(opts_report)
    assert "a\\|b" in md and "\x1b" not in md and "`x`" not in md


def test_ctrl_c_in_a_stage_still_writes_the_report_then_stops(tmp_path, monkeypatch):
    node = FakeNode(monkeypatch)

    def interrupted(stage, *args):
        if stage.name == "install":
            raise KeyboardInterrupt
        return FakeNode.run_stage(node, stage, *args)

    monkeypatch.setattr(up, "run_stage", interrupted)
    opts = options(tmp_path)
    with pytest.raises(KeyboardInterrupt):
        up.execute(opts, environ={})
    report = json.loads((opts.report / "up.json").read_text())
    assert report["first_failure"]["stage"] == "install"
    assert report["first_failure"]["cause"] == "interrupted (Ctrl-C)"
    assert report["stages"][3]["detail"] == "install failed"
    assert set(json.loads((opts.report / up.STATE_FILE).read_text())["stages"]) == {"doctor"}


# --- issue 40 item 3: what up believes -------------------------------------------------------------------------------


def test_a_key_holds_the_node_and_the_venv_directory_itself(tmp_path):
    opts = options(tmp_path)
    for stage in up.STAGES:
        assert up.digest(up.stage_inputs(stage, facts(node="n1"), opts, {})) != up.digest(
            up.stage_inputs(stage, facts(node="n2"), opts, {})
        )
    here = tmp_path / "v"
    here.mkdir()
    first = up.node_of(str(here))
    assert first == up.node_of(str(here)) and first.startswith(__import__("socket").gethostname())
    (tmp_path / "v").rename(tmp_path / "v.old")
    here.mkdir()  # another venv at the same path: another inode
    assert up.node_of(str(here)) != first


def test_what_a_done_stage_left_is_looked_at_before_it_is_skipped(tmp_path):
    opts = options(tmp_path)
    report = opts.report
    (report / "logs").mkdir(parents=True)
    assert up.undone("install", facts(), opts, report) is None
    assert "apex is not installed" in up.undone(
        "install", facts(apex=None, apex_record=None), opts, report
    )
    assert "doctor.json is missing" in up.undone("doctor", facts(), opts, report)
    (report / "logs" / "doctor.json").write_text('[{"status": "fail", "detail": "x"}]')
    assert "names a failure" in up.undone("doctor", facts(), opts, report)
    (report / "logs" / "doctor.json").write_text('[{"status": "ok"}]')
    assert up.undone("doctor", facts(), opts, report) is None
    said = {"ok": True, "python": str(opts.target.python), "device": opts.device}
    for wrong in ({"ok": False}, {"python": "/other/bin/python"}, {"device": "cpu"}):
        (report / "validate.json").write_text(json.dumps({**said, **wrong}))
        assert "does not say ready" in up.undone("validate", facts(), opts, report)
    (report / "validate.json").write_text(json.dumps(said))
    assert up.undone("validate", facts(), opts, report) is None
    assert "bench is gone" in up.undone("bench", facts(), opts, report)


def test_install_claimed_done_but_apex_absent_runs_again_and_says_why(
    tmp_path, monkeypatch, capsys
):
    """Review M3: a state whose install key was computed for the venv as it is, without apex (anyone can: the
    inputs are public facts), does not skip install."""
    node = FakeNode(monkeypatch)  # no apex in the venv
    opts = options(tmp_path)
    key = up.digest(up.stage_inputs("install", node.facts, opts, {}))
    (opts.report / "logs").mkdir(parents=True)
    (opts.report / up.STATE_FILE).write_bytes(
        up.state_bytes({"install": up.Done(key, "2026-12-04T00:00:00+00:00", 1.0)})
    )
    code, _ = run(opts)
    assert code == 0 and node.ran == ["doctor", "install", "validate"]
    said = (
        "install: the state says done, but apex is not installed in the venv now: running it again"
    )
    assert said in capsys.readouterr().err


@fakes.needs_root
@pytest.mark.parametrize("how", ["owner", "group-write", "parent"])
def test_a_report_directory_others_can_write_is_refused_before_its_state_is_read(
    tmp_path, monkeypatch, capsys, how
):
    """Review M3: a state planted where another user can write would have said "ready" for every stage."""
    node = FakeNode(monkeypatch)
    node.facts = facts()  # apex installed: the planted state's claims all hold
    opts = options(tmp_path / "runs", report=str(tmp_path / "shared" / "up" / "train"))
    assert run(opts)[0] == 0
    report = opts.report
    (report / "up.json").unlink()
    if how == "owner":
        os.chown(report, fakes.NOBODY, fakes.NOBODY)
    elif how == "group-write":
        os.chmod(report, 0o775)
        os.chown(report, os.getuid(), 1)  # a group that is not ours alone
    else:
        os.chown(report.parent, fakes.NOBODY, fakes.NOBODY)
    node.ran.clear()
    with pytest.raises(ConfigError) as exc:
        up.execute(opts, environ={})
    assert str(report) in exc.value.format() and "--report DIR" in exc.value.format()
    assert node.ran == [] and not (report / "up.json").exists()


def test_dry_run_names_a_project_file_that_sets_sources_and_a_report_it_would_refuse(
    tmp_path, monkeypatch, capsys
):
    """Review L2: a cloned repository's ./apexkit.toml redirects install: up says so, naming the file."""
    project = tmp_path / "clone"
    project.mkdir()
    (project / "apexkit.toml").write_text('team_indexes = ["https://idx.example/simple/"]\n')
    monkeypatch.chdir(project)
    report = tmp_path / "report"
    report.mkdir(mode=0o777)
    os.chmod(report, 0o777)
    assert up.execute(options(tmp_path, dry_run=True, report=str(report)), environ={}) == 0
    out, err = capsys.readouterr()
    assert (
        f"team_indexes from project {project / 'apexkit.toml'}: https://idx.example/simple/" in out
    )
    assert f"up would refuse: the up report directory {report} is world-writable" in err
    given = options(tmp_path / "o", dry_run=True, index=["https://mine.example/simple/"])
    up.execute(given, environ={})
    assert (
        "team_indexes from project" not in capsys.readouterr().out
    )  # --index wins: the file is not used


def test_the_bench_after_install_names_the_wheel_and_takes_only_valid_values():
    """The bench's chart names the wheel's target id (issue 41 item 5); install's --json is read back as untrusted."""
    sha = "ab" * 32
    target = "py3.11-torch2.13.0-x86_64-master"
    assert up._wheel_env({"sha256": sha, "target": target}) == {
        "APEXKIT_APEX_WHEEL_SHA256": sha,
        "APEXKIT_TARGET_ID": target,
    }
    assert up._wheel_env({"sha256": "x; rm -rf /", "target": "$(id)\n"}) == {}
    assert up._wheel_env({"sha256": 7, "target": ["py3.11"]}) == {}
