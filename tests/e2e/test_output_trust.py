"""Issue 40 item 1, review finding H1, as the review ran it: root's `apexkit build` with its build directory in a
folder another user (the real uid 65534) made, holding a build.log link to a root-only file. The build refuses
before anything is written, in one line naming the directory, why and the fix; root's file is unchanged. A dist/
another uid owns is refused the same way. The command fails at the trust check (or, trusted, at the unreachable
source URL), so nothing is compiled."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import fakes
import pytest
from conftest import ROOT, output

from apexkit import proc
from apexkit.errors import ConfigError
from apexkit.wheel.builder import Builder, BuildState
from apexkit.wheel.options import BuildOptions

pytestmark = fakes.needs_root
TARGET = "py3.11-torch2.13.0-x86_64-master"
ORIGINAL = "ROOT-SECRET-CONFIG original content\n"


def _build(tmp: Path, build: Path, dist: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, APEXKIT_BUILD_DIR=str(build), APEXKIT_DIST_DIR=str(dist))
    env.update(APEXKIT_CACHE_DIR=str(tmp / "cache"), APEXKIT_FETCH_BACKOFF="0.05")
    argv = [sys.executable, "-m", "apexkit", "build", "3.11"]
    argv += ["--ascend-apex-url", "file:///nonexistent/apex.git"]
    return subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


@pytest.fixture
def victim(tmp_path) -> Path:
    path = tmp_path / "adv-victim.conf"
    path.write_text(ORIGINAL)
    os.chmod(path, 0o600)
    return path


def _theirs(folder: Path, mode: int) -> None:
    os.chown(folder, fakes.NOBODY, fakes.NOBODY)
    os.chmod(folder, mode)


def _error_line(proc: subprocess.CompletedProcess) -> str:
    lines = [line for line in output(proc).splitlines() if line.startswith("error:")]
    assert len(lines) == 1, output(proc)[-3000:]
    return lines[0]


def test_a_build_dir_another_user_made_is_refused_and_nothing_is_written_through_its_link(
    tmp_path, victim
):
    build = tmp_path / "build"
    (build / TARGET).mkdir(parents=True)
    fakes.users_link(build / TARGET / "build.log", str(victim))
    for folder in (build / TARGET, build):
        _theirs(folder, 0o777)
    proc = _build(tmp_path, build, tmp_path / "dist")
    assert victim.read_text() == ORIGINAL and stat_mode(victim) == 0o600
    assert proc.returncode == 2, output(proc)[-3000:]
    line = _error_line(proc)
    assert f"the output directory {build} is owned by uid 65534" in line
    assert "APEXKIT_BUILD_DIR" in line and "Traceback" not in output(proc)
    assert not os.path.lexists(build / f"{TARGET}.lock")  # not even the lock file was made there


def test_a_planted_build_log_link_in_our_own_build_dir_is_refused(tmp_path, victim):
    build = tmp_path / "build"
    (build / TARGET).mkdir(parents=True)
    fakes.users_link(build / TARGET / "build.log", str(victim))
    proc = _build(tmp_path, build, tmp_path / "dist")
    assert victim.read_text() == ORIGINAL
    assert proc.returncode == 2, output(proc)[-3000:]
    assert (
        f"the output directory {build / TARGET} is holding build.log, which is a link"
        in _error_line(proc)
    )


def test_a_dist_dir_another_uid_owns_is_refused_before_the_build(tmp_path):
    dist = tmp_path / "dist"
    dist.mkdir()
    _theirs(dist, 0o755)
    proc = _build(tmp_path, tmp_path / "build", dist)
    assert proc.returncode == 2, output(proc)[-3000:]
    line = _error_line(proc)
    assert (
        f"the output directory {dist} is owned by uid 65534" in line and "APEXKIT_DIST_DIR" in line
    )
    assert os.listdir(dist) == [] and not (tmp_path / "build").exists()


def test_output_dirs_we_own_still_build_up_to_the_sources(tmp_path):
    proc = _build(tmp_path, tmp_path / "build", tmp_path / "dist")
    assert "could not fetch file:///nonexistent/apex.git" in _error_line(proc)
    log = tmp_path / "build" / TARGET / "build.log"
    assert log.is_file() and not log.is_symlink() and stat_mode(log) == 0o644
    assert log.read_text().startswith("apexkit ") and TARGET in log.read_text()


def test_a_build_dir_given_as_a_link_another_uid_controls_is_refused(tmp_path):
    """Issue 40 (F9): the link was resolved before the check, so only its target (root's own folder) was judged and
    root wrote build/<target> wherever the link's owner pointed it."""
    rootdir = tmp_path / "rootdir"
    rootdir.mkdir(mode=0o755)
    hers = tmp_path / "hers"
    hers.mkdir()
    _theirs(hers, 0o755)
    fakes.users_link(hers / "build", str(rootdir))
    proc = _build(tmp_path, hers / "build", tmp_path / "dist")
    assert proc.returncode == 2, output(proc)[-3000:]
    assert f"the output directory {hers / 'build'} is a link owned by uid 65534" in _error_line(
        proc
    )
    assert os.listdir(rootdir) == []


def test_a_build_log_swapped_for_a_link_after_it_was_opened_is_never_appended_through(tmp_path):
    """Issue 40 (F1): the build log was opened afresh by name, then appended to by name (run_logged, the binary
    checks' report ...): build/ renamed away and a new build/<target>/build.log link put in its place sent every
    later append into root's file. Every append now goes to the file first opened; a link is never written."""
    victim = tmp_path / "victim.conf"
    victim.write_text("secret\n")
    builder = Builder.__new__(Builder)  # only what writes into the log
    builder.opts = BuildOptions(python="3.11")
    builder.state = BuildState(log_path=tmp_path / "build" / "t" / "build.log")
    builder.log_path.parent.mkdir(parents=True)
    with proc.keep_log(builder.log_path):
        (tmp_path / "build").rename(tmp_path / "build.root")  # the swap a racing user did
        builder.log_path.parent.mkdir(parents=True)
        builder.log_path.symlink_to(victim)
        assert (
            proc.run_logged([sys.executable, "-c", "print('compiled')"], builder.log_path)[0] == 0
        )
        builder._checks_verdict({"failures": []})
    assert victim.read_text() == "secret\n"
    kept = (tmp_path / "build.root" / "t" / "build.log").read_text()
    assert "compiled" in kept and "binary checks:" in kept


def test_a_log_appended_to_by_name_is_never_written_through_a_link(tmp_path):
    """Issue 40 (F1): run_logged and the builder's reports appended with open(path, "a"), following a link."""
    victim = tmp_path / "victim.conf"
    victim.write_text("secret\n")
    builder = Builder.__new__(Builder)
    builder.opts = BuildOptions(python="3.11")
    builder.state = BuildState(log_path=tmp_path / "build.log")
    builder.log_path.symlink_to(victim)
    with pytest.raises(ConfigError, match="is a symbolic link"):
        proc.run_logged([sys.executable, "-c", "print('compiled')"], builder.log_path)
    with pytest.raises(ConfigError, match="is a symbolic link"):
        builder._checks_verdict({"failures": []})
    assert victim.read_text() == "secret\n"


def stat_mode(path: Path) -> int:
    return path.stat().st_mode & 0o7777
