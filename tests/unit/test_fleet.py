"""Fleet validation, in-process: the plan of a stack build, option refusals, the report (from result files) and
the skip when Slurm is missing. The batch scripts and the private Slurm cluster are in tests/e2e/test_fleet.py."""

from __future__ import annotations

import json
import shutil

import fakes
import pytest

from apexkit.errors import ApexkitError
from apexkit.fleet import validate

TARGET = "py3.11-torch2.13.0-x86_64-master"
STACK_TARGET = "py3.10-torch2.7.1-aarch64-master+npu2.7.1.post2"


def test_plan_reads_the_stack_build_and_its_torch_npu(tmp_path):
    index = fakes.fake_index(tmp_path / "index", (STACK_TARGET, "2.7.1"), (TARGET, "2.13.0"))
    plan = validate.make_plan(
        results=str(tmp_path / "r"),
        index=str(index) + "/simple/",
        stack="mindspeed-llm-2.3.0",
        nodelist="a1,a2",
        bench_args="--scale 0.5",
    )
    assert (plan.target, plan.python, plan.torch, plan.torch_npu) == (
        STACK_TARGET,
        "3.10",
        "2.7.1",
        "2.7.1.post2",
    )
    assert plan.placement.count() == 2 and plan.placement.nodelist == ("a1", "a2")
    assert plan.bench[-2:] == ("--scale", "0.5")
    assert plan.node_plan()["simple_url"] == index.resolve().as_uri() + "/simple/"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"nodes": None}, "no placement"),
        (
            {"target": "py3.9-torch2.1.0-x86_64-master"},
            "the index has no target py3.9-torch2.1.0-x86_64-master",
        ),
        ({"nodelist": "a,b", "nodes": 3}, "--nodes 3 but --nodelist names 2"),
        ({"target": None}, "the index holds 2 targets"),
    ],
)
def test_bad_options_are_refused_in_one_line(tmp_path, kwargs, message):
    index = fakes.fake_index(tmp_path / "index", (STACK_TARGET, "2.7.1"), (TARGET, "2.13.0"))
    options = {
        "results": str(tmp_path / "r"),
        "index": str(index),
        "target": TARGET,
        "nodes": 2,
        **kwargs,
    }
    with pytest.raises(ApexkitError) as info:
        validate.make_plan(**options)
    assert message in info.value.format() and "-- next:" in info.value.format()


# --- pure: the report from result files ---------------------------------------------------------------------------


def _result(node: str, verdict: str, step: float | None, failure: dict | None = None) -> dict:
    return {
        "schema": "apexkit-fleet-node/1",
        "node": node,
        "job_id": "7",
        "verdict": verdict,
        "chip": "910B3",
        "driver": "24.1.0",
        "cann": "8.5.0",
        "torch": "2.7.1",
        "torch_npu": "2.7.1.post2",
        "wheel": {"sha256": "ab" * 32},
        "bench": {"step_ms": step} if step else None,
        "first_failure": failure,
    }


def test_report_flags_outliers_beyond_the_threshold_and_fails_on_a_failed_node(tmp_path):
    validate.save_state(
        tmp_path,
        {
            "format": validate.FORMAT,
            "submissions": [
                {"submission": 1, "job_id": None, "nodelist": ["n1", "n2", "n3", "n4"], "nodes": 4}
            ],
        },
    )
    for node, step in (("n1", 100.0), ("n2", 102.0), ("n3", 125.0)):
        (tmp_path / f"{node}.json").write_text(json.dumps(_result(node, "ok", step)))
    (tmp_path / "n4.json").write_text(
        json.dumps(
            _result(
                "n4",
                "fail",
                None,
                {"check": "CANN", "detail": "set_env.sh NOT sourced", "fix": "source set_env.sh"},
            )
        )
    )
    table, summary = validate.rows(tmp_path)
    by_node = {r["node"]: r for r in table}
    assert summary["median_step_ms"] == 102.0
    assert by_node["n3"]["outlier"] and not by_node["n1"]["outlier"]
    assert by_node["n3"]["deviation"] == pytest.approx(0.2255, abs=1e-3)
    assert summary["outliers"] == ["n3"] and summary["failed"] == 1
    text = validate.render(table, summary)
    assert "OUTLIER" in text and "CANN: set_env.sh NOT sourced -> source set_env.sh" in text
    assert validate.report(tmp_path) == 1
    (tmp_path / "n4.json").write_text(json.dumps(_result("n4", "ok", 101.0)))
    assert validate.report(tmp_path, threshold=0.5) == 0  # every node ok, none beyond ±50 %


def test_slurm_tests_skip_with_the_install_command_when_missing(monkeypatch):
    import services

    monkeypatch.setenv("PATH", "/nonexistent")
    ok, why = services.slurm_available()
    assert (
        not ok
        and "apt-get install -y --no-install-recommends munge slurm-client slurmctld slurmd" in why
    )
    assert shutil.which("sbatch") is None
