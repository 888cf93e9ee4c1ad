"""Issue 42 item 3 for `apexkit up` and `fleet.submit --venv`: the signed team index of test_signed_install (fixture
wheels from tests/fakes.py, published with `apexkit publish --sign-key`). `up --trusted-key` over real HTTP on
127.0.0.1 into a real venv: the verified wheel is installed, a wrong key or a tampered wheel stops `up` at install in
one line, nothing installed; trusting another key makes `up` verify again rather than call install done. The fleet on
a private one-node Slurm cluster: the node (bench/fleet_node.py, no apexkit) refuses a tampered wheel, or one no
trusted key signed, before the training venv is touched, and installs the verified one."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import ROOT, output

from apexkit.index import signing

from .test_apexkit_install import make_venv, stub_wheel, tree
from .test_signed_install import NO_PROXY, Served, hostile, keyid, serve_copy, wheels
from .test_signed_install import team as team  # the module's signed index, keys team-a and team-b

TARGET = "py3.11-torch2.13.0-x86_64-master"


def clean_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {
        k: v for k, v in os.environ.items() if not k.startswith("APEXKIT_") and k != "VIRTUAL_ENV"
    }
    env.update(NO_PROXY, COLUMNS="300", PYTHONPATH=str(ROOT), XDG_CONFIG_HOME=str(tmp_path / "xdg"))
    env.update(APEXKIT_CACHE_DIR=str(tmp_path / "cache"), **extra)
    return env


def stub_venv(tmp_path: Path) -> Path:
    """A training venv with a stand-in torch 2.13.0 (validate then fails on it: the stages before it are real)."""
    return make_venv(tmp_path / "train", "3.11", str(stub_wheel(tmp_path, "torch", "2.13.0")))


# --- apexkit up -------------------------------------------------------------------------------------------------------


def up(
    venv: Path, url: str, report: Path, *keys: Path, cwd: Path
) -> tuple[subprocess.CompletedProcess, dict]:
    """`apexkit up --trusted-key ...` at the index `url` (--no-build): the process and its up.json's stages."""
    flags = [a for k in keys for a in ("--trusted-key", str(k))]
    argv = ["up", "--venv", str(venv), "--index", url, "--no-build", "--device", "cpu"]
    proc = subprocess.run(
        [sys.executable, "-m", "apexkit", *argv, *flags, "--report", str(report)],
        capture_output=True, text=True, timeout=600, cwd=cwd, env=clean_env(cwd),
    )  # fmt: skip
    assert "Traceback" not in output(proc)
    stages = {s["name"]: s for s in json.loads((report / "up.json").read_text())["stages"]}
    return proc, stages


def test_up_installs_the_verified_wheel_and_verifies_again_when_the_keys_change(team, tmp_path):
    """up --trusted-key team-a: install verifies the envelope and installs that wheel (validate then runs, and fails
    on the stand-in torch). up again trusting only team-b (team-a revoked): install is not taken as done from the
    state, it verifies again and is refused; the venv keeps what was there."""
    _tmp, keys = team
    venv = stub_venv(tmp_path)
    root, served = serve_copy(team, tmp_path)
    report = tmp_path / "report"
    try:
        proc, stages = up(venv, served.url, report, keys / "team-a.pub", cwd=tmp_path)
        install = stages["install"]
        assert install["status"] == "ok", output(proc)
        wheel = wheels(root)["2.13.0"]
        assert install["result"]["status"] == "installed"
        assert install["result"]["wheel"] == wheel.name
        assert install["options"]["trusted_key"] == [str(keys / "team-a.pub")]
        verified = f"signature verified (key {keyid(keys, 'team-a')})"
        assert verified in Path(install["log"]).read_text()
        assert list((venv / "lib").glob("python3*/site-packages/apex/__init__.py"))
        assert stages["validate"]["status"] == "failed"  # it ran: the stand-in torch is no torch
        before = tree(venv)

        proc, stages = up(venv, served.url, report, keys / "team-b.pub", cwd=tmp_path)
    finally:
        served.stop()
    assert proc.returncode == 1, output(proc)
    assert stages["install"]["status"] == "failed", stages["install"]  # not "done": verified again
    assert "none of them a trusted key" in stages["install"]["detail"]
    assert tree(venv) == before


@pytest.mark.parametrize("attack", ["wrong-key", "tampered"])
def test_up_stops_at_install_in_one_line_and_installs_nothing(team, tmp_path, attack):
    """A wrong key (the index is signed by team-a, only team-b trusted) or a tampered wheel (replaced with its entry,
    manifest and provenance, the team's envelope kept): up exits 1, one line says install refused the wheel and
    why, validate and bench do not run, the venv is unchanged."""
    _tmp, keys = team
    venv = stub_venv(tmp_path)
    root, name = hostile(team, tmp_path, "intact" if attack == "wrong-key" else attack)
    served = Served(root)
    trusted = keys / ("team-b.pub" if attack == "wrong-key" else "team-a.pub")
    before = tree(venv)
    try:
        proc, stages = up(venv, served.url, tmp_path / "report", trusted, cwd=tmp_path)
    finally:
        served.stop()
    why = {"wrong-key": "none of them a trusted key", "tampered": "is not the file that was signed"}
    assert proc.returncode == 1, output(proc)
    failed = [line for line in proc.stderr.splitlines() if line.startswith("✕ ")]
    assert len(failed) == 1, output(proc)
    assert failed[0].startswith(f"✕ install: failed: refused {name} from {served.url.rstrip('/')}")
    assert why[attack] in failed[0] and "nothing installed" in failed[0], failed[0]
    assert stages["install"]["first_failure"]["cause"] in failed[0]
    assert {n: stages[n]["status"] for n in ("validate", "bench")} == {
        "validate": "skipped",
        "bench": "skipped",
    }
    assert "failed at install" in proc.stdout.splitlines()[-1]
    assert tree(venv) == before


# --- fleet.submit --venv on a private Slurm cluster -----------------------------------------------------------------


@pytest.fixture(scope="module")
def cluster():
    import services

    ok, why = services.slurm_available()
    services.require(ok, why)
    started = services.SlurmCluster(nodes=1)
    yield started
    started.stop()


def fleet(cluster, index: Path, venv: Path, results: Path, key: Path) -> dict:
    """fleet.submit --venv --trusted-key on node1, waited for: node1's result file."""
    argv = ["fleet.submit", "--index", str(index), "--target", TARGET, "--results", str(results)]
    argv += ["--nodelist", "node1", "--device", "cpu", "--venv", str(venv)]
    argv += ["--trusted-key", str(key), "--node-dir", str(results.parent / "scratch")]
    results.parent.mkdir(exist_ok=True)
    env = {**clean_env(results.parent), "SLURM_CONF": cluster.env["SLURM_CONF"]}
    proc = subprocess.run([sys.executable, "-m", "apexkit", *argv], capture_output=True, text=True,
                          timeout=300, env=env, cwd=results.parent)  # fmt: skip
    assert proc.returncode == 0, output(proc)
    plan = next((results / ".fleet").glob("plan-*.json"))
    assert [k["keyid"] for k in json.loads(plan.read_text())["trusted_keys"]] == [
        signing.public_keys([str(key)]).popitem()[0]
    ]  # the node gets the key itself, not a path on the submit host
    job = json.loads((results / "fleet.json").read_text())["submissions"][0]["job_id"]
    deadline = time.monotonic() + 300
    while cluster.run("squeue", "-h", "-j", job).stdout.strip():
        assert time.monotonic() < deadline, f"job {job} still queued\n{cluster.logs()}"
        time.sleep(1)
    return json.loads((results / "node1.json").read_text())


@pytest.mark.slurm
def test_fleet_nodes_verify_the_wheel_before_it_enters_the_training_venv(cluster, team, tmp_path):
    tmp, keys = team
    venv = stub_venv(tmp_path)
    before = tree(venv)

    def stages(result: dict) -> dict:
        return {s["stage"]: s for s in result["stages"]}

    # a tampered wheel (with its index.json entry, manifest and provenance) beside the team's envelope
    root, name = hostile(team, tmp_path / "t", "tampered")
    result = fleet(cluster, root, venv, tmp_path / "t" / "results", keys / "team-a.pub")
    failure = result["first_failure"]
    assert result["verdict"] == "fail" and failure["check"] == "wheel signature", result
    assert f"the signature is not for {name} with sha256" in failure["detail"]
    assert keyid(keys, "team-a") in failure["detail"] and "--trusted-key" in failure["fix"]
    # the wheel is consistent with its index.json: only the signature tells
    assert stages(result)["wheel sha256"]["ok"]
    assert "install wheel" not in stages(result) and tree(venv) == before

    # the genuine index, signed by a key the nodes are not told to trust
    result = fleet(cluster, tmp / "signed", venv, tmp_path / "u" / "results", keys / "team-b.pub")
    assert result["first_failure"]["check"] == "wheel signature", result
    assert "none of them a trusted key" in result["first_failure"]["detail"]
    assert tree(venv) == before

    # the genuine index and its key: verified, then installed into the training venv
    result = fleet(cluster, tmp / "signed", venv, tmp_path / "g" / "results", keys / "team-a.pub")
    found = stages(result)
    assert found["wheel signature"]["ok"] and found["install wheel"]["ok"], result
    assert result["wheel"]["filename"] == name
    assert list((venv / "lib").glob("python3*/site-packages/apex/__init__.py"))


# fleet.submit as a host without the cryptography package runs it (Python 3.9.0/3.9.1: no supported release installs)
NO_CRYPTOGRAPHY = (
    "import runpy, sys; sys.modules['cryptography'] = None; sys.argv[0] = 'apexkit'; "
    "runpy.run_module('apexkit', run_name='__main__')"
)


def test_fleet_submit_needs_cryptography_only_when_a_key_is_trusted(team, tmp_path):
    """No trusted key: verification is off and the submit host needs no cryptography (the batch script is made);
    a trusted key without it: one line saying what to install, nothing submitted."""
    tmp, keys = team
    argv = ["fleet.submit", "--index", str(tmp / "signed"), "--target", TARGET, "--nodes", "2"]
    argv += ["--device", "cpu", "--results", str(tmp_path / "results"), "--dry-run"]

    def submit(*extra: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-c", NO_CRYPTOGRAPHY, *argv, *extra], capture_output=True,
                              text=True, timeout=120, cwd=tmp_path, env=clean_env(tmp_path))  # fmt: skip

    plain = submit()
    assert plain.returncode == 0, output(plain)
    assert plain.stdout.startswith("#!/bin/bash") and "Traceback" not in output(plain)
    keyed = submit("--trusted-key", str(keys / "team-a.pub"))
    errors = [line for line in keyed.stderr.splitlines() if line.startswith("error:")]
    assert keyed.returncode != 0 and len(errors) == 1, output(keyed)
    assert "signing needs the cryptography package" in errors[0] and "Traceback" not in output(
        keyed
    )
