"""The matrix runner's collect step (apexkit.fleet.matrixrun), in-process: a wheel a job left as a symbolic link is
refused. The runs on the private Slurm cluster are in tests/e2e/test_matrix_slurm.py."""

from __future__ import annotations

import json

import pytest


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
