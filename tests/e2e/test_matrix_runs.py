"""The build matrix: expansion and validation against matrix.toml's tables, the GitHub JSON, the generated nox
sessions, the workflow (every session it names exists), and a real two-combination local run with its summary."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import wheelnames
import yaml
from conftest import ROOT, output

from apexkit.plan import matrix

WORKFLOW = ROOT / ".github" / "workflows" / "build.yml"


@pytest.fixture(scope="module")
def nox_sessions() -> dict[str, dict]:
    """Every session `nox -l` lists (its --json lists only the selected ones), with its tags."""
    out = subprocess.run(
        [sys.executable, "-m", "nox", "-f", str(ROOT / "noxfile.py"), "-l"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    found = re.findall(r"^[*-] (\S+)(?: \[([^\]]*)\])? ->", out, re.M)
    return {name: {"tags": tags.split(",") if tags else []} for name, tags in found}


def test_github_matrix_json_and_sessions(nox_sessions):
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "nox",
            "-f",
            str(ROOT / "noxfile.py"),
            "-s",
            "matrix",
            "--",
            "--format",
            "github",
        ],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)  # stdout holds only the JSON (one line, for $GITHUB_OUTPUT)
    assert len(proc.stdout.strip().splitlines()) == 1
    assert data["include"][0] == {
        "id": "py3.11-torch2.13.0-x86_64",
        "python": "3.11",
        "torch": "2.13.0",
        "torch_npu": "",
        "arch": "x86_64",
        "runner": "ubuntu-24.04",
        "session": "build-py3.11-torch2.13.0-x86_64",
        "backend": "ascend",
        "torch_index": "https://download.pytorch.org/whl/cpu",
    }
    cuda = next(row for row in data["include"] if row["backend"] == "cuda")
    assert cuda["id"] == "py3.11-torch2.14.1-x86_64-cuda"
    assert cuda["torch_index"] == "https://download.pytorch.org/whl/cu130"
    assert {row["arch"]: row["runner"] for row in data["include"]} == {
        "x86_64": "ubuntu-24.04",
        "aarch64": "ubuntu-24.04-arm",
    }
    for row in data["include"]:
        assert row["session"] in nox_sessions
        stack = ["stack"] if row["id"] in matrix.load().stack_names() else []
        assert set(nox_sessions[row["session"]]["tags"]) == {
            "matrix",
            row["arch"],
            f"py{row['python']}",
            *stack,
        }


def test_workflow_names_only_real_sessions_and_runs_the_readme_command(nox_sessions):
    workflow = yaml.safe_load(WORKFLOW.read_text())
    jobs = workflow["jobs"]
    assert set(jobs) == {"matrix", "build", "tests", "index"}
    assert jobs["build"]["strategy"]["matrix"] == "${{ fromJSON(needs.matrix.outputs.matrix) }}"
    assert jobs["build"]["runs-on"] == "${{ matrix.runner }}"
    runs = [step.get("run", "") for job in jobs.values() for step in job["steps"]]
    names = [step.get("name", "") for job in jobs.values() for step in job["steps"]]
    named = set()
    for text in runs + names:
        for match in re.finditer(r"nox -s (.+?)(?: --|$)", text, re.M):
            named.update(re.findall(r"\$\{\{.*?\}\}|[\w.-]+", match.group(1)))
    assert named == {
        "matrix",
        "${{ matrix.session }}",
        "lint",
        "tests-unit",
        "tests-installed",
        "tests-e2e",
        "tests-aarch64",
    }
    assert named - {"${{ matrix.session }}"} <= set(nox_sessions)
    readme = (ROOT / "README.md").read_text()
    command2 = re.search(r"# 2\. Run the tests.*\n(.*)\n", readme).group(1)
    assert [s["name"] for s in jobs["tests"]["steps"] if "name" in s][-1] == command2
    assert command2 in (ROOT / ".ci" / "run").read_text()
    assert any("invoke publish" in r for r in runs)
    uploads = [
        s for s in jobs["build"]["steps"] if s.get("uses", "").startswith("actions/upload-artifact")
    ]
    assert (
        "dist/*/*.whl" in uploads[0]["with"]["path"]
        and "dist/*/manifest.json" in uploads[0]["with"]["path"]
    )
    cached = next(
        s for s in jobs["build"]["steps"] if s.get("uses", "").startswith("actions/cache")
    )["with"]["path"]
    assert "/git" in cached and "CCACHE_DIR" in cached


def test_actionlint_passes():
    proc = subprocess.run(["actionlint", str(WORKFLOW)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_two_combination_run_builds_one_refuses_one_and_summarises(runner, tmp_path):
    spec = tmp_path / "matrix.toml"
    spec.write_text(
        '[[include]]\npython = "3.11"\ntorch = "2.13.0"\narch = "x86_64"\n\n'
        '[[include]]\npython = "3.8"\ntorch = "2.6.0"\narch = "x86_64"\n'
    )
    argv = [
        sys.executable,
        "-m",
        "nox",
        "-f",
        str(ROOT / "noxfile.py"),
        "-s",
        "matrix",
        "--",
        "--matrix",
        str(spec),
        "--run",
        "--parallel",
        "2",
        "--dist",
        str(runner.dist),
        "--build-dir",
        str(runner.build),
        "--",
        "--no-smoke-test",
    ]
    proc = subprocess.run(
        argv, cwd=ROOT, env=runner.env(), capture_output=True, text=True, timeout=900
    )
    text = output(proc)
    assert proc.returncode == 1, text[-3000:]  # one combination refused
    assert "2 combinations, 2 at a time (1 compile jobs each)" in text
    manifest = json.loads(
        (runner.dist / "py3.11-torch2.13.0-x86_64-master" / "manifest.json").read_text()
    )
    sha = manifest["wheel"]["sha256"]
    summary = (runner.build / "matrix" / "summary.md").read_text()
    assert summary.startswith("### Matrix grid: 1 ok, 0 failed, 1 skipped of 2\n")
    assert (
        "\n### Combinations\n\n| combination | wheel | size | sha256 | build time | cache hit |\n"
        in summary
    )
    row = next(x for x in summary.splitlines() if x.startswith("| py3.11-torch2.13.0-x86_64 |"))
    assert (
        f"| {wheelnames.fixture_wheel()} | {manifest['wheel']['size'] / 1024:.0f} KiB "
        f"| {sha[:12]} |"
    ) in row
    assert row.endswith(f"| {'yes' if manifest['cache_hit'] else 'no'} |")
    refused = next(x for x in summary.splitlines() if x.startswith("| py3.8-torch2.6.0-x86_64 |"))
    assert (
        "REFUSED: torch 2.6.0 has no wheels for Python 3.8 (matrix.toml [torch_python] row 2.6"
        in refused
    )
    assert (
        runner.build / "matrix" / "py3.11-torch2.13.0-x86_64.log"
    ).is_file()  # one log per combination
    assert not (
        runner.build / "matrix" / "py3.8-torch2.6.0-x86_64.log"
    ).exists()  # refused before anything ran
    assert "1 of 2 combinations did not build (py3.8-torch2.6.0-x86_64: refused)" in text


def test_a_passthrough_option_that_changes_the_target_id_is_read_from_the_childs_status(
    runner, tmp_path
):
    """--skip-patch makes the build write dist/<id>+skip-…/: the row names that target and its wheel (the runner reads
    the child's status file; it used to re-derive the default id and call the row built with no wheel)."""
    spec = tmp_path / "matrix.toml"
    spec.write_text('[[include]]\npython = "3.11"\ntorch = "2.13.0"\narch = "x86_64"\n')
    argv = [
        sys.executable,
        "-m",
        "nox",
        "-f",
        str(ROOT / "noxfile.py"),
        "-s",
        "matrix",
        "--",
        "--matrix",
        str(spec),
        "--run",
        "--dist",
        str(runner.dist),
        "--build-dir",
        str(runner.build),
        "--",
        "--no-smoke-test",
        "--skip-patch",
        "rpath-link-flag",
    ]
    proc = subprocess.run(
        argv, cwd=ROOT, env=runner.env(), capture_output=True, text=True, timeout=900
    )
    assert proc.returncode == 0, output(proc)[-3000:]
    target = runner.dist / "py3.11-torch2.13.0-x86_64-master+skip-rpath-link-flag"
    manifest = json.loads((target / "manifest.json").read_text())
    summary = json.loads((runner.build / "matrix" / "summary.json").read_text())
    row = summary[0]
    assert (
        row["wheel"] == manifest["wheel"]["file"] and row["sha256"] == manifest["wheel"]["sha256"]
    )
    assert row["detail"] == str(target)
    assert not (runner.dist / "py3.11-torch2.13.0-x86_64-master").exists()
    status = json.loads(
        (runner.build / "matrix" / "py3.11-torch2.13.0-x86_64.status.json").read_text()
    )
    assert status == {"exit_code": 0, "error": None, "target_dir": str(target)}


REFUSED_SPEC = (
    '[[include]]\npython = "3.11"\ntorch = "2.13.0"\narch = "x86_64"\n\n'
    '[[include]]\npython = "3.8"\ntorch = "2.6.0"\narch = "x86_64"\n'
)
REFUSAL = "py3.8-torch2.6.0-x86_64: torch 2.6.0 has no wheels for Python 3.8 (matrix.toml [torch_python] row 2.6"


def _matrix(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "nox", "-f", str(ROOT / "noxfile.py"), "-s", "matrix", "--", *args],
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_github_matrix_with_a_refused_row_fails_naming_it(tmp_path):
    spec = tmp_path / "matrix.toml"
    spec.write_text(REFUSED_SPEC)
    proc = _matrix("--format", "github", "--matrix", str(spec))
    assert proc.returncode == 1 and proc.stdout == "", proc.stdout  # no matrix for $GITHUB_OUTPUT
    errors = [line for line in proc.stderr.splitlines() if "refused" in line]
    assert len(errors) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert f"1 of 2 combinations refused: {REFUSAL}" in errors[0] and "--allow-refused" in errors[0]
    allowed = _matrix("--format", "github", "--matrix", str(spec), "--allow-refused")
    assert allowed.returncode == 0, allowed.stderr
    assert [row["id"] for row in json.loads(allowed.stdout)["include"]] == [
        "py3.11-torch2.13.0-x86_64"
    ]
    summary = _matrix("--format", "markdown", "--matrix", str(spec))
    assert summary.returncode == 0, summary.stderr  # a report, not the gate
    lines = summary.stdout.splitlines()
    assert lines[0] == "### 1 of 2 combinations refused" and lines[2].startswith(
        "- `py3.8-torch2.6.0-x86_64`: torch 2.6.0"
    )
    assert (
        "| py3.8-torch2.6.0-x86_64 | 3.8 | 2.6.0 | - | x86_64 | ubuntu-24.04 | REFUSED |" in lines
    )


def _workflow_step(job: str, startswith: str) -> dict:
    steps = yaml.safe_load(WORKFLOW.read_text())["jobs"][job]["steps"]
    return next(s for s in steps if s.get("run", "").lstrip().startswith(startswith))


def _run_step(script: str, tmp_path) -> tuple[subprocess.CompletedProcess, str, str]:
    """A workflow step's script as GitHub runs it (bash -eo pipefail), `python` being this interpreter."""
    out, summary = tmp_path / "github_output", tmp_path / "step_summary"
    out.write_text("")
    summary.write_text("")
    env = dict(
        os.environ,
        GITHUB_OUTPUT=str(out),
        GITHUB_STEP_SUMMARY=str(summary),
        PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
    )
    proc = subprocess.run(
        ["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", script],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    return proc, out.read_text(), summary.read_text()


def test_workflow_matrix_step_fails_on_a_refused_row_and_the_summary_lists_it(tmp_path):
    gate = _workflow_step("matrix", "matrix=$(python -m nox -s matrix -- --format github)")["run"]
    report = _workflow_step("matrix", "python -m nox -s matrix -- --format markdown")
    assert report["if"] == "always()" and "$GITHUB_STEP_SUMMARY" in report["run"]
    # the shipped matrix.toml refuses nothing: CI stays green on it
    proc, written, _ = _run_step(gate, tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert written.startswith('matrix={"include":[') and written.count("\n") == 1
    spec = tmp_path / "matrix.toml"
    spec.write_text(REFUSED_SPEC)
    with_refused = f"--matrix {spec}"
    proc, written, _ = _run_step(
        gate.replace("--format github", f"--format github {with_refused}"), tmp_path
    )
    assert proc.returncode != 0 and written == ""  # the job fails: no combination silently missing
    assert REFUSAL in proc.stderr
    proc, _, summary = _run_step(
        report["run"].replace("--format markdown", f"--format markdown {with_refused}"), tmp_path
    )
    assert proc.returncode == 0 and summary.startswith("### 1 of 2 combinations refused"), (
        proc.stderr
    )
