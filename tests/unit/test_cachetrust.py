"""Issue 26, review items H1 and L6: one trust rule for the whole cache (apexkit.cachetrust), a build venv reused
only when it passes it, the lock's pid file never written through a link, explicit modes whatever the umask --
real files and directories (the real build under umask 000 is tests/e2e/test_cache_trust.py)."""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path

import fakes
import pytest

from apexkit import cachetrust, locks
from apexkit.errors import ConfigError
from apexkit.plan import matrix
from apexkit.wheel import builder, buildplan, distdir, sources
from apexkit.wheel.interpreters import Interpreter
from apexkit.wheel.options import BuildOptions

INTERP = Interpreter(sys.executable, "3.11", "3.11.7", "cpython", "x86_64", "/usr", "", "")
NOBODY = 65534


@pytest.fixture
def umask_000():
    old = os.umask(0)
    try:
        yield
    finally:
        os.umask(old)


def _plant_venv(venv: Path, marker: Path) -> None:
    """What another user leaves in a shared cache: a 'ready' venv whose bin/python is their program."""
    (venv / "bin").mkdir(parents=True)
    (venv / "apexkit-ready.json").write_text(json.dumps({"packages": {}, "created": 0}))
    python = venv / "bin" / "python"
    python.write_text(f"#!/bin/sh\necho PLANTED-PYTHON-RAN > {marker}\n")
    python.chmod(0o777)


def _modes(top: Path) -> dict[str, int]:
    return {
        str(p.relative_to(top)): stat.S_IMODE(p.lstat().st_mode)
        for p in [top, *top.rglob("*")]
        if not p.is_symlink()
    }


def test_a_world_writable_cache_is_replaced_whole_by_a_private_one(tmp_path, monkeypatch, capsys):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "mine"))
    chosen = cachetrust.trusted(shared)
    assert chosen == tmp_path / "mine" / "apexkit"
    assert stat.S_IMODE(chosen.stat().st_mode) == 0o700 and cachetrust.problem(chosen) is None
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "world-writable: not using any of it" in err
    assert "venvs, git mirrors" in err and "next: chmod -R go-w" in err
    assert cachetrust.trusted(shared) == chosen  # decided once: no second line
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("how", ["world", "foreign-owner", "link", "group"])
def test_one_bad_entry_under_the_root_makes_the_whole_cache_untrusted(tmp_path, how):
    root = tmp_path / "cache"
    venvs = root / "venvs"
    venvs.mkdir(parents=True)
    (root / "wheels").mkdir()
    assert cachetrust.problem(root) is None
    if how == "world":
        venvs.chmod(0o777)
    elif how == "foreign-owner":
        os.chown(venvs, NOBODY, NOBODY) if os.geteuid() == 0 else pytest.skip("needs root")
    elif how == "link":
        (root / "git").symlink_to(tmp_path)
    else:
        os.chown(venvs, -1, 4242) if os.geteuid() == 0 else pytest.skip("needs root")
        venvs.chmod(0o775)
    reason = cachetrust.problem(root)
    assert reason and reason.startswith("holding ")


def test_the_builder_never_reuses_a_venv_planted_in_a_world_writable_cache(
    tmp_path, monkeypatch, capsys
):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "mine"))
    opts = BuildOptions(python="3.11", cache_dir=shared, dist_dir=tmp_path / "dist")
    plan = buildplan.make_plan(opts, matrix.load(), INTERP, "2.13.0", env={})
    # where today's main would look: the planted venv is at the digest the build computes for these inputs
    planted = builder.Builder(
        BuildOptions(python="3.11", cache_dir=shared, dry_run=True)
    )._venv_dir(plan, INTERP)
    assert planted.parent == shared / "venvs"
    marker = tmp_path / "PWNED"
    _plant_venv(planted, marker)
    b = builder.Builder(opts)
    assert b.opts.cache_dir == tmp_path / "mine" / "apexkit"
    assert b._venv_dir(plan, INTERP).parent == tmp_path / "mine" / "apexkit" / "venvs"
    assert b.cache.root == tmp_path / "mine" / "apexkit" / "wheels" and b.cache.usable()
    assert sources.Mirror("file:///x/ascend-apex", shared).path.parent == (
        tmp_path / "mine" / "apexkit" / "git"
    )
    assert not marker.exists()


def test_a_venv_is_reused_only_when_its_directory_and_python_pass(tmp_path):
    good = tmp_path / "good"
    (good / "bin").mkdir(parents=True)
    (good / "bin" / "python").symlink_to(sys.executable)
    assert cachetrust.venv_problem(good) is None
    planted = tmp_path / "planted"
    _plant_venv(planted, tmp_path / "marker")
    assert "world-writable" in (cachetrust.venv_problem(planted) or "")
    loose = tmp_path / "loose"
    (loose / "bin").mkdir(parents=True)
    (loose / "bin" / "python").symlink_to(sys.executable)
    loose.chmod(0o777)
    assert "world-writable" in (cachetrust.venv_problem(loose) or "")
    hop = tmp_path / "hop"
    (hop / "bin").mkdir(parents=True)
    evil = tmp_path / "evil"
    evil.mkdir(mode=0o777)
    evil.chmod(0o777)
    (evil / "python3").write_text("#!/bin/sh\n")
    (hop / "bin" / "python").symlink_to(evil / "python3")
    assert "which others can write" in (cachetrust.venv_problem(hop) or "")
    assert "missing" in (cachetrust.venv_problem(tmp_path / "nothing") or "")


def test_a_foreign_git_mirror_in_a_trusted_cache_is_one_line(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("needs root to make a directory another user owns")
    cache = tmp_path / "cache"
    mirror = sources.Mirror("file:///x/ascend-apex", cache)
    mirror.path.mkdir(parents=True)
    (mirror.path / "config").write_text("[core]\n\tfsmonitor = touch /tmp/pwned\n")
    os.chown(mirror.path / "config", NOBODY, NOBODY)
    with pytest.raises(ConfigError) as exc:
        sources.Mirror("file:///x/ascend-apex", cache)
    line = exc.value.format()
    assert (
        "\n" not in line
        and "owned by uid 65534: not using it" in line
        and "-- next: remove" in line
    )


def test_the_pid_file_is_never_written_through_a_link(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    thing = tmp_path / "lk" / "thing"
    thing.parent.mkdir()
    pid_file = Path(str(locks.lock_file(thing)) + ".pid")
    pid_file.symlink_to(victim)
    with locks.hold(thing, "thing"):
        pass
    assert victim.read_text() == "precious\n"  # the release removed the link, not its target
    assert not os.path.lexists(pid_file)
    os.link(
        victim, pid_file
    )  # a hard link is not followed either: the file has another name, so it is left alone
    with locks.hold(thing, "thing"):
        assert victim.read_text() == "precious\n"
    assert victim.read_text() == "precious\n"
    os.mkfifo(
        pid_file
    )  # a FIFO with no reader: no hang, for the holder nor for a reader of its pid
    with locks.hold(thing, "thing"):
        assert locks.holder(thing) is None


def test_under_umask_000_locks_and_the_cache_get_explicit_modes(tmp_path, umask_000):
    thing = tmp_path / "cache" / "venvs" / "build-x"
    with locks.hold(thing, "venv"):
        pid_file = Path(str(locks.lock_file(thing)) + ".pid")
        assert stat.S_IMODE(pid_file.stat().st_mode) == 0o644
        assert locks.holder(thing) == os.getpid()
    modes = _modes(tmp_path / "cache")
    assert modes == {".": 0o755, "venvs": 0o755, "venvs/build-x.lock": 0o600}
    made = cachetrust.trusted(tmp_path / "fresh" / "cache")
    assert made == tmp_path / "fresh" / "cache"
    assert _modes(tmp_path / "fresh") == {".": 0o755, "cache": 0o755}


def test_under_umask_000_dist_gets_0755_and_0644(tmp_path, umask_000):
    dist = tmp_path / "dist"
    (tmp_path / "built").mkdir()
    wheel = fakes.make_wheel(tmp_path / "built")
    wheel.chmod(0o666)
    manifest = {"target": {"identity": {}}, "wheel": {"file": wheel.name}}
    files = {wheel.name: wheel, "sbom.cdx.json": b"{}", "provenance.json": b"{}"}
    distdir.replace_dir(dist, "py3.11-x", files, manifest)
    modes = _modes(dist)
    assert modes.pop(".") == 0o755 and modes.pop(".locks") == 0o755
    assert modes.pop("py3.11-x") == 0o755 and modes.pop(".locks/py3.11-x.lock") == 0o600
    assert modes == {
        f"py3.11-x/{n}": 0o644
        for n in (wheel.name, "manifest.json", "sbom.cdx.json", "provenance.json")
    }


def test_doctor_warns_about_a_cache_others_can_write(tmp_path):
    from apexkit.doctor import machine

    cache = tmp_path / "cache"
    (cache / "venvs").mkdir(parents=True)
    (cache / "venvs").chmod(0o777)
    row = machine.check_cache(cache)[0]
    assert row.status == machine.WARN and "builds use a private cache instead" in row.detail


def test_a_cache_inside_a_folder_others_can_write_is_untrusted_unless_sticky(tmp_path):
    shared = tmp_path / "shared"
    (shared / "cache").mkdir(parents=True)
    shared.chmod(0o777)  # anyone may rename cache/ away and put their own in its place
    assert "anyone there can replace it" in (cachetrust.problem(shared / "cache") or "")
    shared.chmod(0o1777)  # sticky, like /tmp: only the owner may rename it
    assert cachetrust.problem(shared / "cache") is None


def test_when_the_default_is_no_better_the_private_cache_is_a_fresh_0700_one(
    tmp_path, monkeypatch, capsys
):
    shared, mine = tmp_path / "shared", tmp_path / "mine" / "apexkit"
    for folder in (shared, mine):
        folder.mkdir(parents=True)
        folder.chmod(0o777)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "mine"))
    chosen = cachetrust.trusted(shared)
    assert chosen not in (shared, mine) and stat.S_IMODE(chosen.stat().st_mode) == 0o700
    assert "(for this run: removed at exit)" in capsys.readouterr().err
    chosen.rmdir()


def test_make_dir_sets_the_mode_of_what_it_made_never_through_a_link_swapped_in(
    tmp_path, monkeypatch
):
    """Issue 40 (F2): make_dir chmod-ed the folder it had just made by name; a link swapped in between (here the
    swap is done right after the real mkdir, as a racing user would) made it chmod root's file 0755."""
    victim = tmp_path / "victim.conf"
    victim.write_text("secret\n")
    os.chmod(victim, 0o600)
    real_mkdir = os.mkdir

    def mkdir_then_swapped(path, mode=0o777, **kwargs):
        real_mkdir(path, mode, **kwargs)
        if os.fspath(path).endswith("logs"):
            os.rmdir(path)
            os.symlink(victim, path)

    monkeypatch.setattr(os, "mkdir", mkdir_then_swapped)
    with pytest.raises(OSError):
        cachetrust.make_dir(tmp_path / "report" / "logs")
    assert stat.S_IMODE(victim.stat().st_mode) == 0o600
