"""`nox -s matrix -- --run --slurm`: each combination one sbatch job on a node of its arch, the wheels collected into
dist/ by the rules for untrusted input, the same summary as a local run. End to end on the private Slurm cluster of
tests/services.py (munged + slurmctld + two slurmd on localhost) with the fixture sources."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import ROOT, output

from apexkit.errors import SchedulerError

SPEC = (
    '[[include]]\npython = "3.11"\ntorch = "2.13.0"\narch = "x86_64"\n\n'  # builds on node1/node2
    '[[include]]\npython = "3.11"\ntorch = "2.5.1"\narch = "aarch64"\n\n'  # no aarch64 node: sbatch refuses it
    '[[include]]\npython = "3.8"\ntorch = "2.6.0"\narch = "x86_64"\n'
)  # refused by matrix.toml: never submitted
BUILT, FOREIGN, REFUSED = (
    "py3.11-torch2.13.0-x86_64",
    "py3.11-torch2.5.1-aarch64",
    "py3.8-torch2.6.0-x86_64",
)


def _matrix(*args: str, env: dict | None = None, timeout: int = 900) -> subprocess.CompletedProcess:
    argv = [
        sys.executable,
        "-m",
        "nox",
        "-f",
        str(ROOT / "noxfile.py"),
        "-s",
        "matrix",
        "--",
        *args,
    ]
    return subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


def test_dry_run_prints_one_batch_script_per_combination_without_slurm(tmp_path):
    spec = tmp_path / "m.toml"
    spec.write_text(SPEC)
    env = dict(os.environ, PATH=str(Path(sys.executable).parent))  # no Slurm needed
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "apexkit",
            "matrix",
            "--matrix",
            str(spec),
            "--run",
            "--slurm",
            "--dry-run",
            "--slurm-partition",
            "aarch64=ascend",
            "--slurm-constraint",
            "aarch64=none",
            "--slurm-cpus",
            "8",
            "--build-dir",
            str(tmp_path / "build"),
            "--",
            "--no-smoke-test",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, output(proc)
    scripts = proc.stdout.split("# ---- ")[1:]
    assert [s.split(":")[0] for s in scripts] == [
        BUILT,
        FOREIGN,
    ]  # the refused one is not submitted
    x86, arm = (s.splitlines() for s in scripts)
    assert "#SBATCH --constraint=x86_64" in x86 and not any("--partition" in line for line in x86)
    assert "#SBATCH --partition=ascend" in arm and not any("--constraint" in line for line in arm)
    assert "#SBATCH --cpus-per-task=8" in arm and "#SBATCH --nodes=1" in arm
    assert f"#SBATCH --output={tmp_path / 'build' / 'matrix' / FOREIGN}.log" in arm
    # the build's options resolved here, as a file (printed by the dry run), not a command line parsed on the node
    build = next(line for line in arm if line.startswith("exec "))
    stage = f"{tmp_path / 'build'}/matrix/slurm/run-"
    assert f"-m apexkit build 3.11 --options-json {stage}" in build
    assert build.endswith(f"/options-{FOREIGN}.json")
    assert 'export APEXKIT_JOBS="${SLURM_CPUS_PER_TASK:-$(nproc)}"' in arm
    given = json.loads("\n".join(line[2:] for line in arm[arm.index(build) + 2 :]))
    assert (given["torch"], given["image"], given["jobs"], given["smoke_test"]) == (
        "2.5.1",
        None,
        None,
        False,
    )
    assert given["dist_dir"].startswith(stage) and given["dist_dir"].endswith(f"/dist-{FOREIGN}")
    assert f"{REFUSED}: refused, not submitted" in proc.stderr
    assert not (tmp_path / "build").exists()  # a dry run writes nothing


def test_no_slurm_is_one_line_exit_11(tmp_path):
    env = dict(os.environ, PATH=str(Path(sys.executable).parent))
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "apexkit",
            "matrix",
            "--run",
            "--slurm",
            "--target",
            BUILT,
            "--build-dir",
            str(tmp_path / "build"),
            "--dist",
            str(tmp_path / "dist"),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == SchedulerError.exit_code, output(proc)
    lines = proc.stderr.strip().splitlines()
    assert (
        len(lines) == 1
        and "sbatch not found on PATH" in lines[0]
        and "scontrol ping && sinfo" in lines[0]
    )
    assert not (tmp_path / "dist").exists() and not (tmp_path / "build").exists()


@pytest.fixture(scope="module")
def cluster():
    import services

    ok, why = services.slurm_available()
    services.require(ok, why)
    started = services.SlurmCluster(nodes=2)
    try:  # a site's nodes advertise their arch as a feature; these are all x86_64
        done = started.run(
            "scontrol",
            "update",
            "NodeName=node1,node2",
            "AvailableFeatures=x86_64",
            "ActiveFeatures=x86_64",
        )
        assert done.returncode == 0, done.stderr
        yield started
    finally:
        started.stop()


@pytest.mark.slurm
def test_matrix_on_slurm_builds_on_a_node_of_its_arch_and_collects_the_wheel(
    cluster, runner, tmp_path
):
    spec = tmp_path / "m.toml"
    spec.write_text(SPEC)
    proc = _matrix(
        "--matrix",
        str(spec),
        "--run",
        "--slurm",
        "--dist",
        str(runner.dist),
        "--build-dir",
        str(runner.build),
        "--",
        "--no-smoke-test",
        "--no-cache",  # a real build on the node (the shared cache may hold this wheel): a step to heartbeat
        env=runner.env(
            SLURM_CONF=cluster.env["SLURM_CONF"],
            APEXKIT_SLURM_POLL="1",
            APEXKIT_MATRIX_HEARTBEAT="1",
        ),
    )
    text = output(proc)
    assert proc.returncode == 1, text[-4000:] + cluster.logs()  # one refused, one not placeable
    assert "Traceback" not in text
    # watched as a local run is: a start line when its job runs, then heartbeats naming its build's step
    assert re.search(rf"▸ \[1/3\] {re.escape(BUILT)}: started \(job \d+\)", text), text[-3000:]
    assert re.search(rf"  … \[1/3\] {re.escape(BUILT)}: running \S+, step: ", text), text[-3000:]
    summary = (runner.build / "matrix" / "summary.md").read_text().splitlines()
    head = summary.index("| combination | wheel | size | sha256 | build time | cache hit |")
    table = summary[head + 2 : summary.index("", head)]  # the per-combination table, after the grid
    rows = {line.split(" | ")[0][2:]: line for line in table}
    assert list(rows) == [BUILT, FOREIGN, REFUSED]  # the matrix's order

    # the x86_64 combination: built by a job on a cluster node, copied (re-hashed) into the local dist/
    manifest = json.loads(
        (runner.dist / "py3.11-torch2.13.0-x86_64-master" / "manifest.json").read_text()
    )
    wheel = runner.dist / "py3.11-torch2.13.0-x86_64-master" / manifest["wheel"]["file"]
    assert hashlib.sha256(wheel.read_bytes()).hexdigest() == manifest["wheel"]["sha256"]
    assert manifest["slurm"]["state"] == "COMPLETED" and manifest["slurm"]["node"] in (
        "node1",
        "node2",
    )
    assert (
        f"| {manifest['wheel']['file']} | {manifest['wheel']['size'] / 1024:.0f} KiB | "
        f"{manifest['wheel']['sha256'][:12]} |" in rows[BUILT]
    )
    log = (runner.build / "matrix" / f"{BUILT}.log").read_text()
    assert (
        f"+ apexkit matrix: {BUILT} on {manifest['slurm']['node']} (x86_64), job {manifest['slurm']['job_id']}"
        in log
    )
    assert not list(
        (runner.build / "matrix" / "slurm").glob("run-*/dist-*")
    )  # staging emptied once collected

    # aarch64: no node has the feature, sbatch refuses it: a failed row with Slurm's reason; py3.8: never submitted
    assert f"| {FOREIGN} | FAILED: not submitted: sbatch: error: " in rows[FOREIGN]
    assert (
        "Invalid feature specification" in rows[FOREIGN]
        and "(asked for: constraint aarch64;" in rows[FOREIGN]
    )
    assert f"| {REFUSED} | REFUSED: torch 2.6.0 has no wheels for Python 3.8" in rows[REFUSED]
    assert not (runner.build / "matrix" / f"{REFUSED}.log").exists()
    assert not list((runner.build / "matrix" / "slurm").glob(f"run-*/{REFUSED}.sbatch"))
    assert f"2 of 3 combinations did not build ({FOREIGN}: failed, {REFUSED}: refused)" in text


HANG = (
    "import os, pathlib, time\nif os.environ.get('SLURM_JOB_ID'):\n    pathlib.Path(os.environ['HANG_MARKER']).touch()\n"
    "    time.sleep(600)\n"
)


@pytest.mark.slurm
def test_a_job_cancelled_mid_run_is_a_failed_row_with_its_cause(cluster, runner, tmp_path):
    hang = tmp_path / "hang"
    hang.mkdir()
    (hang / "sitecustomize.py").write_text(
        HANG
    )  # the job's Python hangs (the job inherits this environment)
    marker = tmp_path / "job-started"
    env = runner.env(
        SLURM_CONF=cluster.env["SLURM_CONF"],
        APEXKIT_SLURM_POLL="1",
        PYTHONPATH=str(hang),
        HANG_MARKER=str(marker),
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
        "--target",
        BUILT,
        "--run",
        "--slurm",
        "--dist",
        str(runner.dist),
        "--build-dir",
        str(runner.build),
    ]
    proc = subprocess.Popen(
        argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        deadline = time.monotonic() + 120
        while not marker.exists() and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.5)
        assert marker.exists(), (proc.poll(), cluster.run("squeue").stdout)
        job = cluster.run("squeue", "-h", "-o", "%i").stdout.split()
        assert len(job) == 1
        assert cluster.run("scancel", job[0]).returncode == 0
        text, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1, text[-3000:]
    assert "Traceback" not in text
    row = next(
        x
        for x in (runner.build / "matrix" / "summary.md").read_text().splitlines()
        if x.startswith(f"| {BUILT} ")
    )
    assert (
        f"| {BUILT} | FAILED: job {job[0]} on node" in row
        and "cancelled (scancel, or the node went away)" in row
    ), row
    assert not runner.dist.exists() or not any(runner.dist.iterdir())
    assert f"1 of 1 combinations did not build ({BUILT}: failed)" in text
