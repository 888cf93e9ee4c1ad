"""Issue 40 item 1, review finding H1: every directory apexkit writes into or reads back from outside its cache
(build/, dist/, reports/, the <target> folders under them, the kept CUDA objects) passes the cache's trust rule
(apexkit.cachetrust.trusted_output), or apexkit refuses in one line naming it, why and the fix -- real files and a
real second uid (65534, chown); the real command is tests/e2e/test_output_trust.py."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import fakes
import pytest

from apexkit import cachetrust, paths, untrusted
from apexkit.errors import ConfigError
from apexkit.install import run
from apexkit.wheel import cudabuild


def _refused(path: Path, setting: str = paths.BUILD_SETTING, make: bool = True) -> ConfigError:
    with pytest.raises(ConfigError) as caught:
        cachetrust.trusted_output(path, setting, make=make)
    err = caught.value
    assert err.exit_code == 2 and str(path) in err.cause and setting in err.hint
    assert "\n" not in err.format()
    return err


def test_a_missing_output_directory_is_made_ours_and_private(tmp_path):
    os.chmod(tmp_path, 0o755)
    made = cachetrust.trusted_output(tmp_path / "build" / "t", paths.BUILD_SETTING)
    assert made.is_dir() and stat.S_IMODE(made.stat().st_mode) == 0o755
    assert cachetrust.trusted_output(made, paths.BUILD_SETTING) == made  # and passes again


def test_a_missing_directory_is_not_made_when_asked_not_to(tmp_path):
    assert cachetrust.trusted_output(tmp_path / "dist", paths.DIST_SETTING, make=False)
    assert not (tmp_path / "dist").exists()


@fakes.needs_root
def test_an_output_directory_another_uid_owns_is_refused(tmp_path):
    build = tmp_path / "build"
    build.mkdir(mode=0o755)
    os.chown(build, fakes.NOBODY, fakes.NOBODY)
    assert "owned by uid 65534" in _refused(build).cause


def test_a_world_writable_output_directory_is_refused(tmp_path):
    dist = tmp_path / "dist"
    dist.mkdir()
    os.chmod(dist, 0o777)
    assert "world-writable" in _refused(dist, paths.DIST_SETTING).cause


def test_a_link_inside_an_output_directory_is_refused(tmp_path):
    work = tmp_path / "build" / "t"
    work.mkdir(parents=True)
    (work / "build.log").symlink_to(tmp_path / "victim")
    assert "holding build.log, which is a link" in _refused(work).cause


@fakes.needs_root
def test_a_target_folder_another_uid_owns_refuses_its_parent(tmp_path):
    dist = tmp_path / "dist"
    (dist / "t").mkdir(parents=True)
    os.chown(dist / "t", fakes.NOBODY, fakes.NOBODY)
    assert "holding t, which is owned by uid 65534" in _refused(dist, paths.DIST_SETTING).cause


def test_an_output_directory_others_can_swap_is_refused_before_it_is_made(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)  # world-writable, not sticky: anyone there can rename build/ away
    err = _refused(shared / "build")
    assert f"inside {shared}, which is world-writable" in err.cause
    assert not (shared / "build").exists()
    os.chmod(shared, 0o1777)  # sticky (like /tmp): only the owner can rename what is in it
    assert cachetrust.trusted_output(shared / "build", paths.BUILD_SETTING).is_dir()


@fakes.needs_root
def test_install_refuses_a_built_wheel_folder_another_uid_owns(tmp_path):
    target = tmp_path / "dist" / "t"
    target.mkdir(parents=True)
    wheel = fakes.make_wheel(target)
    sha = untrusted.sha256_file(wheel)
    (target / "manifest.json").write_text(
        json.dumps({"wheel": {"file": wheel.name, "sha256": sha}})
    )
    assert run._built_wheel(target)[1] == sha
    os.chown(target, fakes.NOBODY, fakes.NOBODY)
    assert "owned by uid 65534" in _refused(target, paths.DIST_SETTING, make=False).cause
    with pytest.raises(ConfigError, match="owned by uid 65534"):
        run._built_wheel(target)


@fakes.needs_root
def test_kept_cuda_objects_another_uid_owns_are_refused_not_reused(tmp_path):
    assert not cudabuild.objects_for(tmp_path, {"nvcc": "13.0.88"})  # the stamp: kept from now on
    (tmp_path / "build" / "temp.x").mkdir()
    (tmp_path / "build" / "temp.x" / "a.o").write_text("object")
    os.chown(tmp_path / "build" / "temp.x", fakes.NOBODY, fakes.NOBODY)
    with pytest.raises(ConfigError, match="holding temp.x, which is owned by uid 65534"):
        cudabuild.objects_for(tmp_path, {"nvcc": "13.0.88"})


def test_a_log_is_written_afresh_and_never_through_a_planted_link(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("root's own\n")
    log_path = tmp_path / "image.log"
    log_path.symlink_to(victim)
    with pytest.raises(untrusted.Refused):
        untrusted.open_log(log_path)
    assert victim.read_text() == "root's own\n"
    log_path.unlink()
    log_path.write_text("an older, longer log\n")
    with untrusted.open_log(log_path) as fh:
        fh.write("new\n")
    assert log_path.read_text() == "new\n"


@fakes.needs_root
def test_publish_refuses_a_dist_another_uid_owns_before_reading_a_wheel(tmp_path, capsys):
    from apexkit import cli

    dist = tmp_path / "dist"
    (dist / "t").mkdir(parents=True)
    os.chown(dist, fakes.NOBODY, fakes.NOBODY)
    code = cli.main(["publish", "--dist", str(dist), "--index", str(tmp_path / "index")])
    err = capsys.readouterr().err
    assert code == 2 and f"the output directory {dist} is owned by uid 65534" in err
    assert not (tmp_path / "index").exists()


@fakes.needs_root
def test_a_matrix_run_refuses_a_build_dir_another_uid_owns_before_any_cell(tmp_path, capsys):
    from apexkit import cli

    build = tmp_path / "build"
    build.mkdir()
    os.chown(build, fakes.NOBODY, fakes.NOBODY)
    argv = ["matrix", "--run", "--dist", str(tmp_path / "dist"), "--build-dir", str(build)]
    code = cli.main(argv)
    err = capsys.readouterr().err
    assert code == 2 and f"the output directory {build} is owned by uid 65534" in err
    assert not (build / "matrix").exists()


@fakes.needs_root
def test_a_sticky_folder_another_uid_owns_is_no_safe_parent(tmp_path):
    """Issue 40 (F1): a sticky parent was skipped whoever owned it, but a sticky folder's owner may rename
    anything in it (build/ away and a new one with a build.log link in its place). Only root's or ours is safe."""
    proj = tmp_path / "proj"
    proj.mkdir()
    os.chown(proj, fakes.NOBODY, fakes.NOBODY)
    os.chmod(proj, 0o1755)
    assert f"inside {proj}, which is owned by uid 65534" in _refused(proj / "build").cause
    assert not (proj / "build").exists()
    assert "owned by uid 65534" in cachetrust.problem(proj / "cache")
    os.chown(proj, 0, 0)  # root's sticky folder (like /tmp): what we made in it stays ours
    assert cachetrust.trusted_output(proj / "build", paths.BUILD_SETTING).is_dir()


@fakes.needs_root
def test_a_link_another_uid_controls_is_refused_as_an_output_directory(tmp_path):
    """Issue 40 (F9): only a link's target was judged, so the user who may replace the link picked which of root's
    folders root wrote build/<target> into: a link in her own folder, or hers in a sticky one, is refused."""
    rootdir = tmp_path / "rootdir"
    rootdir.mkdir(mode=0o755)
    hers = tmp_path / "hers"
    hers.mkdir()
    os.chown(hers, fakes.NOBODY, fakes.NOBODY)
    (hers / "build").symlink_to(rootdir)  # ours, but she may replace it
    assert f"inside {hers}, which is owned by uid 65534" in _refused(hers / "build").cause
    sticky = tmp_path / "sticky"
    sticky.mkdir()
    os.chmod(sticky, 0o1777)
    fakes.users_link(sticky / "build", str(rootdir))
    assert "a link owned by uid 65534" in _refused(sticky / "build").cause
    assert "where uid 65534 owns build" in _refused(sticky / "build" / "t").cause
    os.lchown(sticky / "build", 0, 0)  # our own link (to a bigger disk) is still followed
    assert cachetrust.trusted_output(sticky / "build", paths.BUILD_SETTING) == sticky / "build"
