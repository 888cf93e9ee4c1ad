"""Fleet trust (issue 26, review 2026-12-01 M2, M3, M4, M10): index logins kept out of every shared file, the batch
script built from checked and quoted values only, node result files read as untrusted input, the node scratch
expanded on the node. In-process; the real Slurm cluster and a real HTTP index are in tests/e2e/test_fleet.py."""

from __future__ import annotations

import json
import math
import os
import signal
import stat
import sys
from pathlib import Path

import fakes
import pytest
from conftest import ROOT

from apexkit.errors import ApexkitError
from apexkit.fleet import inputs, slurm, validate

TARGET = "py3.11-torch2.13.0-x86_64-master"
SECRET = "ghp_TOKEN123"


def _plan(tmp_path: Path, **options) -> validate.Plan:
    index = fakes.fake_index(tmp_path / "index", (TARGET, "2.13.0"))
    return validate.make_plan(results=str(tmp_path / "r"), index=str(index), nodes=2, **options)


# --- M2: logins ------------------------------------------------------------------------------------------------------


def test_logins_never_reach_the_plan_the_script_or_the_dry_run(tmp_path, capsys):
    plan = _plan(
        tmp_path,
        find_links=[f"https://wh:{SECRET}@127.0.0.1:9/wheels/"],
        torch_index_url=f"https://bob:{SECRET}@127.0.0.1:9/torch/simple",
        extra_index_url=[f"http://{SECRET}@127.0.0.1:9/extra/simple/"],
    )
    node_plan = json.dumps(plan.node_plan())
    script = validate.render_script(plan)
    assert SECRET not in node_plan and SECRET not in script
    assert plan.node_plan()["torch_index_url"] == "https://127.0.0.1:9/torch/simple"
    assert plan.node_plan()["credentials"] == str(
        tmp_path / "r" / ".fleet" / "private" / "credentials-1.json"
    )
    assert plan.logins["https://127.0.0.1:9/torch/simple"] == (
        f"https://bob:{SECRET}@127.0.0.1:9/torch/simple"
    )
    validate.submit(plan, dry_run=True)
    out = capsys.readouterr()
    assert SECRET not in out.out + out.err
    assert (
        "https://bob:***@127.0.0.1:9/torch/simple" in out.err
    )  # masked, so the user sees a login is used
    assert "0600" in out.err and not (tmp_path / "r").exists()


def test_the_logins_file_is_0600_in_a_0700_directory_whatever_the_umask(tmp_path):
    plan = _plan(tmp_path, torch_index_url=f"https://bob:{SECRET}@127.0.0.1:9/simple")
    old = os.umask(0)
    try:
        inputs.write_logins(plan.credentials_file, plan.logins)
    finally:
        os.umask(old)
    assert stat.S_IMODE(plan.credentials_file.stat().st_mode) == 0o600
    assert stat.S_IMODE(plan.credentials_file.parent.stat().st_mode) == 0o700
    assert inputs.read_logins(plan.credentials_file) == plan.logins
    plan.credentials_file.chmod(0o644)  # somebody widened it: --resume refuses to use it
    with pytest.raises(ApexkitError, match="not a private file of yours"):
        inputs.read_logins(plan.credentials_file)


def test_a_login_outside_an_http_url_is_refused(tmp_path):
    with pytest.raises(ApexkitError) as info:
        _plan(tmp_path, find_links=[f"file://u:{SECRET}@/wheels"])
    assert "only accepted in an http(s) URL" in info.value.format()
    assert SECRET not in info.value.format()


# --- M3: every value in the script checked and quoted -----------------------------------------------------------


@pytest.mark.parametrize(
    ("option", "key", "value", "noun"),
    [
        ("--partition", "partition", "a\nb", "a Slurm partition name"),
        ("--partition", "partition", "ascend\necho PARTITION-INJECTED", "a Slurm partition name"),
        ("--time-limit", "time_limit", "01:00:00\nid", "a Slurm time limit"),
        ("--gres", "gres", "npu:8 $(id>/tmp/GRES)", "a Slurm gres specification"),
        ("--account", "account", "llm;id", "a Slurm account name"),
        ("--nodelist", "nodelist", "n1,$(id)", "a Slurm node name"),
        ("--node-interpreter", "node_python", "python3 -c 'import os'", "a plain path"),
        ("--node-dir", "node_dir", "/tmp/$(id)", "a node-local path"),
        ("--set-env", "set_env", "/x/set_env.sh;id", "a plain path"),
        ("--bench-args", "bench_args", "--scale '$(id)'", "a plain amp_bench.py argument"),
        ("--target", "target", TARGET + "\nid", "an apexkit target name"),
    ],
)
def test_a_value_that_is_not_its_kind_is_one_line_and_nothing_is_submitted(
    tmp_path, option, key, value, noun
):
    options = {key: value}
    if key == "nodelist":
        options["nodes"] = None
    with pytest.raises(ApexkitError) as info:
        validate.submit_command(
            results=str(tmp_path / "r"),
            index=str(fakes.fake_index(tmp_path / "index", (TARGET, "2.13.0"))),
            dry_run=True,
            **{"nodes": 2, **options},
        )
    text = info.value.format()
    shown = {"nodelist": "'$(id)'", "bench_args": "'$(id)'"}.get(key, ascii(value))
    assert text.startswith(f"{option} {shown} is not {noun}"), text
    assert "\n" not in text and "-- next: " in text and "nothing was submitted" in text
    assert not (tmp_path / "r").exists()


def test_a_target_in_index_json_that_is_a_command_is_refused(tmp_path):
    index = tmp_path / "index"
    fakes.fake_index(index, (TARGET, "2.13.0"))
    data = json.loads((index / "index.json").read_text())
    data["files"][0]["target"] = "x\ntouch /tmp/INJECTED-FROM-INDEX-JSON #"
    (index / "index.json").write_text(json.dumps(data))
    with pytest.raises(ApexkitError) as info:
        validate.make_plan(results=str(tmp_path / "r"), index=str(index), nodes=1)
    assert info.value.format().startswith(
        "the index's target 'x\\ntouch /tmp/INJECTED-FROM-INDEX-JSON #' is not an apexkit target name"
    )


def test_every_placement_value_is_quoted_and_a_bad_one_never_renders(tmp_path):
    plan = _plan(tmp_path, partition="ascend", gres="npu:8", account="llm", time_limit="1-00:00:00")
    script = validate.render_script(plan)
    assert "#SBATCH --partition=ascend" in script.splitlines()
    assert "#SBATCH --time=1-00:00:00" in script.splitlines()
    assert " --gres=npu:8 " in script
    forged = validate.dataclasses.replace(
        plan, placement=validate.Placement(nodes=1, exclude=("n1\ntouch /tmp/INJECTED #",))
    )
    with pytest.raises(ApexkitError, match="is not a Slurm node name"):
        validate.render_script(forged)


def test_the_one_sbatch_writer_quotes_every_value_and_refuses_a_line_break():
    """fleet.submit and the matrix run on Slurm write their #SBATCH lines through slurm.batch_header only."""
    header = [("account", "llm; touch /tmp/X"), ("nodelist", ("n1", "n 2")), ("no-kill", True)]
    header += [("gres", None), ("cpus-per-task", 8)]
    assert slurm.batch_header(header, ["--comment=a b"]) == [
        "#SBATCH --account='llm; touch /tmp/X'",
        "#SBATCH --nodelist=n1,'n 2'",
        "#SBATCH --no-kill",
        "#SBATCH --cpus-per-task=8",
        "#SBATCH '--comment=a b'",
    ]
    with pytest.raises(ApexkitError, match=r"#SBATCH --account 'llm\\ntouch /tmp/X': not one line"):
        slurm.batch_header([("account", "llm\ntouch /tmp/X")])
    with pytest.raises(ApexkitError, match="the extra sbatch option"):
        slurm.batch_header([], ["--mem=4G\r#SBATCH --x"])


def test_resume_never_takes_a_node_name_from_a_result_file_into_the_script(tmp_path):
    results = tmp_path / "r"
    results.mkdir()
    validate.save_state(
        results,
        {
            "format": validate.FORMAT,
            "submissions": [{"submission": 1, "job_id": None, "nodes": 3, "nodelist": []}],
        },
    )
    (results / "n1.json").write_text(json.dumps(_result("n1")))
    evil = "n1\ntouch INJECTED-BY-NODE #"
    (results / f"{evil}.json").write_text(json.dumps(_result(evil)))
    plan = _plan(tmp_path)
    plan = validate.dataclasses.replace(plan, results=results)
    resumed = validate.resume_plan(plan, validate.load_state(results))
    assert resumed is not None and resumed.placement.exclude == ("n1",)
    script = validate.render_script(resumed)
    assert "#SBATCH --exclude=n1" in script.splitlines()
    assert not any(line.startswith("touch") for line in script.splitlines())


def test_a_jobs_node_list_with_a_command_line_is_filtered(tmp_path):
    (tmp_path / ".fleet" / "jobs").mkdir(parents=True)
    (tmp_path / ".fleet" / "jobs" / "7.nodes").write_text("node1\n$(id)\nnode2\n")
    assert validate._allocated(tmp_path, {"job_id": "7"}) == ["node1", "node2"]
    assert validate._allocated(tmp_path, {"job_id": "../../etc/passwd"}) is None


# --- M4: the node files ----------------------------------------------------------------------------------------------


def _result(node: str, verdict: str = "ok", step: object = 100.0, **extra) -> dict:
    return {
        "schema": "apexkit-fleet-node/1",
        "node": node,
        "job_id": "7",
        "verdict": verdict,
        "chip": "910B3",
        "torch": "2.7.1",
        "wheel": {"sha256": "ab" * 32},
        "bench": {"step_ms": step},
        "first_failure": None,
        **extra,
    }


@pytest.fixture
def fleet_results(tmp_path):
    validate.save_state(
        tmp_path,
        {
            "format": validate.FORMAT,
            "submissions": [
                {"submission": 1, "job_id": None, "nodelist": ["n1", "n2", "n3"], "nodes": 3}
            ],
        },
    )
    for node, step in (("n1", 100.0), ("n2", 102.0), ("n3", 104.0)):
        (tmp_path / f"{node}.json").write_text(json.dumps(_result(node, step=step)))
    return tmp_path


def _hang_guard():
    def timeout(signum, frame):
        raise AssertionError("fleet.report blocked (a FIFO read as a result)")

    signal.signal(signal.SIGALRM, timeout)
    signal.alarm(10)


@pytest.mark.parametrize(
    ("name", "make", "why"),
    [
        ("evil", lambda p: os.mkfifo(p), "is not a regular file"),
        # a link is never followed (to /dev/zero it was a MemoryError; a link to a real file here keeps a
        # regression from filling this machine's memory)
        ("link", lambda p: os.symlink(p.parent / "n1.json", p), "is a symbolic link"),
        ("big", lambda p: p.write_bytes(b" " * (inputs.RESULT_MAX + 1)), "is larger than 1 MiB"),
        ("n4", lambda p: p.write_text('{"schema": 5}'), "not an apexkit fleet node result"),
        (
            "n4",
            lambda p: p.write_text(json.dumps(_result("n4", first_failure="boom"))),
            "first_failure",
        ),
        (
            "n4",
            lambda p: p.write_text(json.dumps(_result("n4", wheel=[1]))),
            "wheel is not an object",
        ),
        ("n4", lambda p: p.write_text(json.dumps(dict(_result("n4"), bench="x"))), "bench is not"),
        (
            "n4",
            lambda p: p.write_text(json.dumps(_result("n4", chip=["x"]))),
            "chip is not a short text",
        ),
        (
            "n4",
            lambda p: p.write_text(json.dumps(_result("n4", step=math.nan))),
            "not a finite number",
        ),
        (
            "n4",
            lambda p: p.write_text(
                '{"schema": "apexkit-fleet-node/1", "node": "n4", "bench": {"step_ms": 1e999}}'
            ),
            "not a finite number",
        ),
        ("n4", lambda p: p.write_text("[" * 100000), "not JSON"),
        (
            "zz",
            lambda p: p.write_text(json.dumps(_result("n1", chip="forged"))),
            "claims to be node 'n1'",
        ),
    ],
)
def test_a_bad_result_file_is_one_unreadable_row_and_the_others_report(
    fleet_results, capsys, name, make, why
):
    make(fleet_results / f"{name}.json")
    _hang_guard()
    try:
        table, summary = validate.rows(fleet_results)
        assert validate.report(fleet_results, as_json=True) == 1
    finally:
        signal.alarm(0)
    by_node = {r["node"]: r for r in table}
    assert by_node[name]["status"] == "unreadable", table
    assert by_node[name]["first_failure"]["detail"].startswith("unreadable result: ")
    assert why in by_node[name]["first_failure"]["detail"]
    assert [by_node[n]["status"] for n in ("n1", "n2", "n3")] == ["ok"] * 3
    assert by_node["n1"]["chip"] == "910B3"  # the forged zz.json replaced nothing
    assert summary["median_step_ms"] == 102.0 and summary["unreadable"] == 1
    doc = json.loads(
        capsys.readouterr().out, parse_constant=lambda c: pytest.fail(f"--json has {c}")
    )
    assert doc["summary"]["unreadable"] == 1
    assert "UNREADABLE" in validate.render(table, summary)


def test_a_negative_threshold_is_refused(fleet_results):
    with pytest.raises(ApexkitError, match="--threshold -1 is not a fraction >= 0"):
        validate.report(fleet_results, threshold=-1)


def test_a_hand_edited_fleet_json_is_one_line(tmp_path):
    (tmp_path / "fleet.json").write_text(
        json.dumps({"format": validate.FORMAT, "submissions": [5]})
    )
    with pytest.raises(ApexkitError, match="is not an apexkit fleet record"):
        validate.report(tmp_path)
    (tmp_path / "fleet.json").write_text(
        json.dumps({"format": validate.FORMAT, "submissions": [{"job_id": "1"}]})
    )
    with pytest.raises(ApexkitError, match="the last submission's plan is not readable"):
        validate.stored_plan(str(tmp_path))


def test_an_index_json_with_odd_files_and_unbalanced_bench_args_are_one_line(tmp_path):
    index = tmp_path / "index"
    index.mkdir()
    (index / "index.json").write_text(json.dumps({"files": 5}))
    with pytest.raises(ApexkitError, match="the index holds 0 targets"):
        validate.make_plan(results=str(tmp_path / "r"), index=str(index), nodes=1)
    with pytest.raises(ApexkitError, match="--bench-args .*: No closing quotation"):
        _plan(tmp_path, bench_args="--scale '0.5")


# --- M10: the node scratch ---------------------------------------------------------------------------------------


def test_the_node_scratch_default_is_expanded_on_the_node(tmp_path):
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        import fleet_node
    finally:
        sys.path.remove(str(ROOT / "bench"))
    assert _plan(tmp_path).node_plan()["node_dir"] is None  # nothing for the submit host to expand
    assert fleet_node.expand_dir(None, {"TMPDIR": "/local/t"}) == Path("/local/t/apexkit-fleet")
    assert fleet_node.expand_dir(None, {}) == Path("/tmp/apexkit-fleet")
    old_default = "${TMPDIR:-/tmp}/apexkit-fleet"  # what earlier plans stored, never expanded then
    assert fleet_node.expand_dir(old_default, {}) == Path("/tmp/apexkit-fleet")
    assert fleet_node.expand_dir(old_default, {"TMPDIR": "/l"}) == Path("/l/apexkit-fleet")
    assert fleet_node.expand_dir("$SCRATCH/x", {"SCRATCH": "/s"}) == Path("/s/x")
    for bad in ("$UNSET/x", "relative/dir"):
        with pytest.raises(ValueError):
            fleet_node.expand_dir(bad, {})


def test_the_training_venv_is_a_checked_absolute_path_kept_in_the_plan_and_resume(tmp_path):
    plan = _plan(tmp_path, venv="$HOME/venvs/train")
    assert plan.node_plan()["venv"] == "$HOME/venvs/train"  # expanded on the node, like --node-dir
    assert "into the training venv $HOME/venvs/train" in validate.render_script(plan)
    assert (
        "$HOME/venvs/train" not in validate.render_script(plan).split("EOF")[1]
    )  # never in a command
    for bad in ("venvs/train", "/v/$(id)", "/v/a b", "/v/x\nrm"):
        with pytest.raises(ApexkitError) as err:
            _plan(tmp_path, venv=bad)
        assert "--venv" in str(err.value) and "\n" not in str(err.value)
    validate.submit(
        plan, dry_run=False
    ) if False else None  # (submitting needs Slurm: tests/e2e/test_fleet.py)
    state = {
        "format": validate.FORMAT,
        "submissions": [{"submission": 1, "plan": plan.node_plan()}],
    }
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / validate.STATE_FILE).write_text(json.dumps(state))
    assert validate.stored_plan(str(tmp_path / "r")).venv == "$HOME/venvs/train"


def test_same_build_compares_the_wheels_record_with_the_installed_one(tmp_path):
    import zipfile

    sys.path.insert(0, str(ROOT / "bench"))
    try:
        import fleet_node
    finally:
        sys.path.remove(str(ROOT / "bench"))
    record = "apex/__init__.py,sha256=AAA,10\napex-0.1.dist-info/METADATA,sha256=BBB,20\napex-0.1.dist-info/RECORD,,\n"
    wheel = tmp_path / "apex-0.1-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("apex-0.1.dist-info/RECORD", record)
    installed = record + "apex-0.1.dist-info/INSTALLER,sha256=CCC,4\n"  # pip adds its own lines
    assert fleet_node.same_build(wheel, installed)
    assert not fleet_node.same_build(wheel, installed.replace("AAA", "ZZZ"))  # another build
    assert not fleet_node.same_build(wheel, None) and not fleet_node.same_build(wheel, "")
    (tmp_path / "bad.whl").write_bytes(b"not a zip")
    assert not fleet_node.same_build(tmp_path / "bad.whl", installed)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("planted", ["fifo", "huge", "directory"])
def test_a_planted_fleet_record_is_one_line_never_a_hang(tmp_path, planted):
    results = tmp_path / "r"
    results.mkdir()
    record = results / validate.STATE_FILE
    if planted == "fifo":  # a read of a named pipe with no writer would block for ever
        os.mkfifo(record)
    elif planted == "huge":
        with open(record, "wb") as fh:
            fh.truncate(64 << 20)
    else:
        record.mkdir()
    with pytest.raises(ApexkitError) as caught:
        validate.load_state(results)
    assert "fleet.json" in caught.value.cause and "\n" not in str(caught.value)
