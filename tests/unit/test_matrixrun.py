"""The matrix runner's collect step (apexkit.fleet.matrixrun), in-process: a wheel a job left as a symbolic link is
refused. The runs on the private Slurm cluster are in tests/e2e/test_matrix_slurm.py."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from apexkit.errors import ConfigError

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
    planned = {
        "python": "3.11",
        "torch": "2.13.0",
        "torch_npu": None,
        "arch": "x86_64",
        "target_id": target.name,
    }
    (target / "manifest.json").write_text(
        json.dumps({"target": planned, "wheel": {"file": name, "sha256": "0" * 64}})
    )
    with pytest.raises(untrusted.Untrusted, match="symbolic link"):
        matrixrun.collect(tmp_path / "stage", combo, tmp_path / "dist", {}, False)
    (target / name).unlink()
    (target / "manifest.json").write_text(
        json.dumps({"target": planned, "wheel": {"file": "../../secret.whl", "sha256": "0" * 64}})
    )
    with pytest.raises(untrusted.Untrusted, match="not a plain"):
        matrixrun.collect(tmp_path / "stage", combo, tmp_path / "dist", {}, False)
    assert not (tmp_path / "dist" / "py3.11-torch2.13.0-x86_64-master").exists()


def _options(argv: list[str]):
    """The options a child `apexkit build 3.X --options-json FILE` reads: resolved by its parent, not its argv."""
    from apexkit.wheel import options

    assert argv[-4:-2] == ["build", "3.11"] and argv[-2] == "--options-json", argv
    return options.load_json(Path(argv[-1]), "3.11")


def _cell(m, combo, dist: Path, build: Path):
    from apexkit.fleet import matrixrun

    run = {"dist": dist, "build_dir": build, "jobs": 1}
    return matrixrun.prepare(m, combo, [], None, run, host="x86_64")


def _child_is(monkeypatch, fake) -> None:
    """run_one's child build (matrixrun.build_child) is `fake(argv, env)`, returning a CompletedProcess."""
    from apexkit.fleet import matrixrun

    monkeypatch.setattr(matrixrun, "build_child", lambda argv, out, env: fake(argv, env).returncode)


def _fake_child(target_name: str, code: int, error: str | None = None, then=None):
    """A stand-in for the child `apexkit build` of run_one: it writes what a build would (dist/<target>/, its status
    file where $APEXKIT_STATUS_FILE says), then runs `then` (another matrix run starting meanwhile)."""
    from apexkit import statusfile

    def run(argv, env, **kwargs):
        dist = _options(argv).dist_dir
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
        _child_is(monkeypatch, _fake_child("", 7, "compile failed in run B"))
        other.append(
            matrixrun.run_one(combo, _cell(m, combo, tmp_path / "dist-b", tmp_path / "build"), logs)
        )

    _child_is(monkeypatch, _fake_child(combo.target_id, 0, then=second_run))
    first = matrixrun.run_one(combo, _cell(m, combo, tmp_path / "dist-a", tmp_path / "build"), logs)
    assert (other[0].status, other[0].detail) == ("failed", "compile failed in run B")
    assert first.status == "built", first.detail
    assert first.detail == str(tmp_path / "dist-a" / combo.target_id)
    assert sorted(p.name for p in logs.iterdir() if p.name.startswith(".")) == []
    kept = json.loads((logs / f"{combo.id}.status.json").read_text())  # beside its log, as before
    assert kept["exit_code"] == 0 and kept["target_dir"] == first.detail


def test_a_job_that_left_another_combinations_target_is_refused(tmp_path):
    """Which dist/<target> a job replaces is the host's to say (review 2026-12-01, M7): the ids the host computes
    from the combination and the passthrough options (+skip-…, +npu… of the node's CANN), and a manifest whose
    target python/torch/arch is that plan's. A job for py3.11-torch2.13.0 that leaves dist/py3.11-torch2.12.0-…/,
    a +part the host never asked for, or its own name over a py3.10 build, replaces nothing."""
    import hashlib
    import zipfile

    from apexkit import untrusted
    from apexkit.fleet import matrixrun
    from apexkit.plan import matrix

    m = matrix.load()
    combo = m.combinations([{"python": "3.11", "torch": "2.13.0", "arch": "x86_64"}])[0]
    passthrough = ["--skip-patch", "rpath-link-flag"]
    planned = matrixrun.planned_targets(m, combo, passthrough)
    own = combo.target_id + "+skip-rpath-link-flag"
    facts = {"python": "3.11", "torch": "2.13.0", "torch_npu": None, "arch": "x86_64"}
    for left, target, refused in [
        ("py3.11-torch2.12.0-x86_64-master", {"torch": "2.12.0"}, "not this build's target"),
        ("py3.10-torch2.13.0-x86_64-master", {"python": "3.10"}, "not this build's target"),
        (combo.target_id + "x", {}, "not this build's target"),
        (combo.target_id, {}, "not this build's target"),  # the host passed --skip-patch
        (combo.target_id + "+skip-cxx11-abi", {}, "not this build's target"),
        (own, {"python": "3.10"}, "target.python is '3.10', this build's is 3.11"),
        (own, {"arch": "aarch64"}, "target.arch is 'aarch64'"),
        (own, {"torch_npu": "2.13.0"}, "target.torch_npu is '2.13.0'"),
        (own, {"target_id": combo.target_id}, "target.target_id is"),
        (own, {}, None),
        (combo.target_id + "+npu2.13.0+skip-rpath-link-flag", {"torch_npu": "2.13.0"}, None),
    ]:
        stage = tmp_path / f"stage-{len(list(tmp_path.iterdir()))}"
        (stage / left).mkdir(parents=True)
        wheel = stage / left / WHEEL
        with zipfile.ZipFile(wheel, "w") as zf:
            zf.writestr("apex/__init__.py", "")
        manifest = {
            "target": {
                **facts,
                "target_id": left,
                "identity": {"apex_src": "/mnt/apexkit/apex-src"},  # the job's word: not taken
                **target,
            },
            "wheel": {"file": WHEEL, "sha256": hashlib.sha256(wheel.read_bytes()).hexdigest()},
        }
        (stage / left / "manifest.json").write_text(json.dumps(manifest))
        dist = tmp_path / "dist" / left
        if refused:
            with pytest.raises(untrusted.Untrusted, match=refused):
                matrixrun.collect(stage, combo, dist, {}, False, expected=left, planned=planned)
            assert not dist.exists()
        else:
            final, got = matrixrun.collect(
                stage, combo, dist, {}, False, expected=left, planned=planned
            )
            assert final == dist / left and (final / WHEEL).is_file()
            # the host's identity is recorded, not the job's
            assert "apex_src" not in got["target"]["identity"]
            assert got["target"]["identity"]["skip_patches"] == ["rpath-link-flag"]


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
        target = _options(argv).dist_dir / combo.target_id
        target.mkdir(parents=True)
        wheel = {"file": WHEEL, "sha256": "0" * 64, "size": "a lot"}
        (target / "manifest.json").write_text(json.dumps({"wheel": wheel}))
        statusfile.write(0, None, target, environ=env)
        return subprocess.CompletedProcess(argv, 0)

    _child_is(monkeypatch, child)
    result = matrixrun.run_one(combo, _cell(m, combo, tmp_path / "dist", tmp_path / "build"), logs)
    assert (result.status, result.wheel, result.size) == ("built", WHEEL, 0)


def test_a_local_run_resolves_each_cell_once_and_hands_its_child_the_options_file(
    tmp_path, monkeypatch
):
    """--parallel N: N cells at a time, each child's compile jobs (cores // N) a field of its options, which the child
    reads from its 0600 options file; a passthrough option that does not resolve refuses every cell before any
    child starts (its one line, not N children's argparse errors)."""
    import stat

    from apexkit import statusfile
    from apexkit.fleet import matrixrun
    from apexkit.plan import matrix

    m = matrix.load()
    combos = m.combinations(
        [
            {"python": "3.11", "torch": "2.13.0", "arch": "x86_64"},
            {"python": "3.11", "torch": "2.12.0", "arch": "x86_64"},
        ]
    )
    monkeypatch.setattr(matrixrun.dockerclient, "host_arch", lambda: "x86_64")
    monkeypatch.setattr(matrixrun.os, "cpu_count", lambda: 8)
    seen = []

    def child(argv, env, **kwargs):
        path = Path(argv[-1])
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        opts = _options(argv)
        seen.append((opts.torch, opts.jobs, opts.smoke_test))
        target = opts.dist_dir / f"py3.11-torch{opts.torch}-x86_64-master"
        target.mkdir(parents=True)
        (target / "manifest.json").write_text(
            json.dumps({"wheel": {"file": WHEEL, "sha256": "0" * 64}})
        )
        statusfile.write(0, None, target, environ=env)
        return subprocess.CompletedProcess(argv, 0)

    _child_is(monkeypatch, child)
    dist, build = tmp_path / "dist", tmp_path / "build"
    results = matrixrun.run_all(m, combos, ["--no-smoke-test"], dist, build, 2)
    assert [r.status for r in results] == ["built", "built"]
    assert sorted(seen) == [("2.12.0", 4, False), ("2.13.0", 4, False)]
    assert not [
        p for p in (build / "matrix").iterdir() if p.name.startswith(".")
    ]  # no options left
    seen.clear()
    missing = tmp_path / "no-such-wheelhouse"
    results = matrixrun.run_all(m, combos, ["--wheelhouse", str(missing)], dist, build, 1)
    assert [(r.status, r.detail) for r in results] == [
        ("refused", f"--wheelhouse {missing} is not a directory")
    ] * 2
    assert seen == []


def test_the_batch_script_starts_the_build_with_the_options_file_the_host_resolved(
    tmp_path, monkeypatch, capsys
):
    """A Slurm job gets no command line of build options: `apexkit build 3.X --options-json <stage>/options-<id>.json`,
    the file the host writes at submission (printed, logins masked, by --dry-run), its compile jobs the node's
    ($APEXKIT_JOBS from the job's CPUs) and its dist the job's staging folder."""
    from apexkit.fleet import matrixrun
    from apexkit.plan import matrix

    m = matrix.load()
    combos = m.combinations(
        [
            {"python": "3.11", "torch": "2.5.1", "arch": "aarch64"},
            {"python": "3.8", "torch": "2.6.0", "arch": "x86_64"},  # refused by matrix.toml
        ]
    )
    args, _ = matrixrun.parse(
        ["--run", "--slurm", "--slurm-cpus", "8", "--slurm-interpreter", "/shared/venv/bin/python"]
    )
    build = tmp_path / "build"
    index = "https://user:s3cret@mirror.example.com/simple/"
    passthrough = ["--no-smoke-test", "--index-url", index]
    assert (
        matrixrun.run_slurm(
            m, combos, passthrough, tmp_path / "dist", build, matrixrun.slurm_options(args), True
        )
        == []
    )
    out = capsys.readouterr()
    assert "py3.8-torch2.6.0-x86_64: refused, not submitted" in out.err
    assert out.out.count("# ---- ") == 1 and "s3cret" not in out.out
    script, _, shown = out.out.partition("\n# /")
    lines = script.splitlines()
    stage = Path(lines[0].split(": ", 1)[1]).parent
    assert stage.parent == build / "matrix" / "slurm"
    assert "#SBATCH --cpus-per-task=8" in lines and "#SBATCH --constraint=aarch64" in lines
    assert lines[-2:] == [
        'export APEXKIT_JOBS="${SLURM_CPUS_PER_TASK:-$(nproc)}"',
        f"exec /shared/venv/bin/python -m apexkit build 3.11 --options-json "
        f"{stage}/options-py3.11-torch2.5.1-aarch64.json",
    ]
    data = json.loads("\n".join(x[2:] for x in shown.splitlines()[1:]))
    assert data["on_host"] is True and data["jobs"] is None and data["smoke_test"] is False
    assert data["torch"] == "2.5.1" and data["image"] is None  # natively on a node of its arch
    assert data["dist_dir"] == str(stage / "dist-py3.11-torch2.5.1-aarch64")
    assert data["build_dir"] == str(build) and data["index_url"].startswith("https://user:")
    assert not build.exists()  # a dry run writes nothing


def test_matrix_refresh_names_the_maintainers_session_it_moved_to():
    from apexkit.fleet import matrixrun

    with pytest.raises(ConfigError, match="matrix --refresh moved") as refused:
        matrixrun.main(["--refresh", "--write"])
    assert "nox -s refresh" in refused.value.hint


def test_a_link_planted_as_a_cells_log_is_never_written_through(tmp_path, monkeypatch):
    """Issue 40 (second hostile pass, reviewer's note): run_one opened its cell's log with open(..., "w"), which
    follows a link planted there; it is untrusted.open_log now: the cell fails in one line, the target untouched,
    and no build starts."""
    from apexkit.fleet import matrixrun
    from apexkit.plan import matrix

    m = matrix.load()
    combo = m.combinations([{"python": "3.11", "torch": "2.13.0", "arch": "x86_64"}])[0]
    logs = tmp_path / "build" / "matrix"
    logs.mkdir(parents=True)
    victim = tmp_path / "victim.conf"
    victim.write_text("keep me\n")
    (logs / f"{combo.id}.log").symlink_to(victim)
    monkeypatch.setattr(matrixrun.dockerclient, "host_arch", lambda: "x86_64")
    started = []
    _child_is(monkeypatch, lambda argv, env: started.append(argv) or _fake_child("", 1)(argv, env))
    result = matrixrun.run_one(combo, _cell(m, combo, tmp_path / "dist", tmp_path / "build"), logs)
    assert victim.read_text() == "keep me\n" and started == []
    assert (result.status, result.detail) == (
        "failed",
        f"its log: '{logs / combo.id}.log' is a symbolic link",
    )
