"""The matrix runner's collect step (apexkit.fleet.matrixrun), in-process: a wheel a job left as a symbolic link is
refused. The runs on the private Slurm cluster are in tests/e2e/test_matrix_slurm.py."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

WHEEL = "apex-0.1+ascend-cp311-cp311-linux_x86_64.whl"


def test_a_symlinked_wheel_left_by_a_job_is_refused(tmp_path):
    from apexkit import untrusted
    from apexkit.fleet import matrixrun
    from apexkit.plan import matrix

    m = matrix.load()
    combo = m.combinations([{"python": "3.11", "torch": "2.13.0", "arch": "x86_64"}])[0]
    target = tmp_path / "stage" / "py3.11-torch2.13.0-x86_64-master"
    target.mkdir(parents=True)
    name = "apex-0.1+ascend-cp311-cp311-linux_x86_64.whl"
    (tmp_path / "secret").write_text("not yours")
    (target / name).symlink_to(tmp_path / "secret")
    (target / "manifest.json").write_text(json.dumps({"wheel": {"file": name, "sha256": "0" * 64}}))
    with pytest.raises(untrusted.Untrusted, match="symbolic link"):
        matrixrun.collect(tmp_path / "stage", combo, tmp_path / "dist", {}, False)
    (target / name).unlink()
    (target / "manifest.json").write_text(
        json.dumps({"wheel": {"file": "../../secret.whl", "sha256": "0" * 64}})
    )
    with pytest.raises(untrusted.Untrusted, match="not a plain"):
        matrixrun.collect(tmp_path / "stage", combo, tmp_path / "dist", {}, False)
    assert not (tmp_path / "dist" / "py3.11-torch2.13.0-x86_64-master").exists()


def _fake_child(target_name: str, code: int, error: str | None = None, then=None):
    """A stand-in for the child `apexkit build` of run_one: it writes what a build would (dist/<target>/, its status
    file where $APEXKIT_STATUS_FILE says), then runs `then` (another matrix run starting meanwhile)."""
    from apexkit import statusfile

    def run(argv, env, **kwargs):
        dist = Path(argv[argv.index("--dist") + 1])
        target = None
        if code == 0:
            target = dist / target_name
            target.mkdir(parents=True, exist_ok=True)
            (target / "manifest.json").write_text(
                json.dumps({"wheel": {"file": WHEEL, "sha256": "0" * 64}})
            )
        statusfile.write(code, error, target, environ=env)
        if then is not None:
            then()
        return subprocess.CompletedProcess(argv, code)

    return run


def test_two_matrix_runs_sharing_build_matrix_each_read_their_own_childs_status(
    tmp_path, monkeypatch
):
    """Two `matrix --run` at once with one --build-dir (two CI jobs, a user's second terminal) share build/matrix/:
    the status file a child writes there must be the one its own parent reads, not the other run's."""
    from apexkit.fleet import matrixrun
    from apexkit.plan import matrix

    m = matrix.load()
    combo = m.combinations([{"python": "3.11", "torch": "2.13.0", "arch": "x86_64"}])[0]
    logs = tmp_path / "build" / "matrix"
    logs.mkdir(parents=True)
    monkeypatch.setattr(matrixrun.dockerclient, "host_arch", lambda: "x86_64")
    other: list = []

    def second_run():  # run B: same build dir, its own dist, its child fails
        monkeypatch.setattr(
            matrixrun.subprocess, "run", _fake_child("", 7, "compile failed in run B")
        )
        other.append(
            matrixrun.run_one(m, combo, [], tmp_path / "dist-b", tmp_path / "build", 1, logs)
        )

    monkeypatch.setattr(
        matrixrun.subprocess, "run", _fake_child(combo.target_id, 0, then=second_run)
    )
    first = matrixrun.run_one(m, combo, [], tmp_path / "dist-a", tmp_path / "build", 1, logs)
    assert (other[0].status, other[0].detail) == ("failed", "compile failed in run B")
    assert first.status == "built", first.detail
    assert first.detail == str(tmp_path / "dist-a" / combo.target_id)
    assert sorted(p.name for p in logs.iterdir() if p.name.startswith(".")) == []
    kept = json.loads((logs / f"{combo.id}.status.json").read_text())  # beside its log, as before
    assert kept["exit_code"] == 0 and kept["target_dir"] == first.detail


def test_a_job_that_left_another_combinations_target_is_refused(tmp_path):
    """A node's job for py3.11-torch2.13.0 that leaves (and names in its status file) dist/py3.11-torch2.12.0-…/ must
    not put that target into dist/ as this row's wheel; passthrough parts (+skip-…, +npu…) are still its own."""
    from apexkit import untrusted
    from apexkit.fleet import matrixrun
    from apexkit.plan import matrix

    m = matrix.load()
    combo = m.combinations([{"python": "3.11", "torch": "2.13.0", "arch": "x86_64"}])[0]
    for left, refused in [
        ("py3.11-torch2.12.0-x86_64-master", True),
        ("py3.10-torch2.13.0-x86_64-master", True),
        (combo.target_id + "x", True),
        (combo.target_id + "+skip-rpath-link-flag", False),
        (combo.target_id, False),
    ]:
        stage = tmp_path / left / "stage"
        (stage / left).mkdir(
            parents=True
        )  # no manifest: a target that passes the name check fails on that
        with pytest.raises(untrusted.Untrusted) as caught:
            matrixrun.collect(stage, combo, tmp_path / "dist", {}, False, expected=left)
        assert ("not a build of" in str(caught.value)) is refused, (left, str(caught.value))
    assert not (tmp_path / "dist").exists()


def test_a_manifest_with_a_size_that_is_not_a_number_is_no_traceback(tmp_path, monkeypatch):
    from apexkit import statusfile
    from apexkit.fleet import matrixrun
    from apexkit.plan import matrix

    m = matrix.load()
    combo = m.combinations([{"python": "3.11", "torch": "2.13.0", "arch": "x86_64"}])[0]
    logs = tmp_path / "build" / "matrix"
    logs.mkdir(parents=True)
    monkeypatch.setattr(matrixrun.dockerclient, "host_arch", lambda: "x86_64")

    def child(argv, env, **kwargs):
        target = Path(argv[argv.index("--dist") + 1]) / combo.target_id
        target.mkdir(parents=True)
        wheel = {"file": WHEEL, "sha256": "0" * 64, "size": "a lot"}
        (target / "manifest.json").write_text(json.dumps({"wheel": wheel}))
        statusfile.write(0, None, target, environ=env)
        return subprocess.CompletedProcess(argv, 0)

    monkeypatch.setattr(matrixrun.subprocess, "run", child)
    result = matrixrun.run_one(m, combo, [], tmp_path / "dist", tmp_path / "build", 1, logs)
    assert (result.status, result.wheel, result.size) == ("built", WHEEL, 0)
