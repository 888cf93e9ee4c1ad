"""Undo state is trusted only when it is ours (issue 13, item 5).

`proxy.remove` runs as root more often than not (`sudo -E`), and reads back a manifest that lives in the user's
home. These tests edit that manifest and its directory the way another process of that user could, then run the
real `invoke proxy.remove` / `proxy.setup` under a --root test directory: no file outside the managed set is
written, modes are clamped, state that is not ours is refused, a symlinked backup copy is not followed.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
from pathlib import Path

import pytest
from proxyroot import PASSWORD, PROXY, invoke, snapshot

STATE = "home/alice/.config/apexkit"
MANIFEST = f"{STATE}/backups/manifest.json"


def set_up(root: Path, *args: str) -> None:
    bashrc = root / "home/alice/.bashrc"
    if not bashrc.exists():
        bashrc.write_bytes(b"# mine\n")
        bashrc.chmod(0o644)
    result = invoke(
        "proxy.setup", "--http", PROXY, "--daemon-mode", "systemd", *args, "--root", str(root)
    )
    assert result.returncode == 0, result.stderr


def edit_manifest(root: Path, edit) -> None:
    path = root / MANIFEST
    manifest = json.loads(path.read_text())
    edit(manifest)
    path.write_text(json.dumps(manifest))


def one_line_error(result, code: int = 6) -> str:
    assert result.returncode == code, result.stdout + result.stderr
    text = result.stderr.strip()
    assert text.count("\n") == 0 and "Traceback" not in text and "next:" in text, text
    return text


def test_a_manifest_entry_outside_the_managed_set_is_never_written(fsroot, tmp_path):
    set_up(fsroot, "--layers", "shell")
    victim = tmp_path / "victim.conf"  # outside --root altogether
    victim.write_bytes(b"precious\n")
    victim.chmod(0o644)
    inside = fsroot / "etc/cron.d/job"  # inside --root, but no layer's file
    inside.parent.mkdir(parents=True)
    inside.write_bytes(b"* * * * * root true\n")

    def poison(manifest):
        # the old format's "path" pointed the real bashrc record at the victim, with a setuid mode ...
        manifest["/home/alice/.bashrc"].update(path=str(victim), mode=0o4755)
        # ... and whole records name files no layer manages, "written" by us, so that removal would delete them
        for display, target in ((str(victim), victim), ("/etc/cron.d/job", inside)):
            manifest[display] = {
                "path": str(target),
                "existed": False,
                "mode": 0o4777,
                "owner": "proxy",
                "written_sha256": hashlib.sha256(target.read_bytes()).hexdigest(),
            }

    edit_manifest(fsroot, poison)
    result = invoke("proxy.remove", "--root", str(fsroot))
    assert result.returncode == 0, result.stderr
    assert victim.read_bytes() == b"precious\n" and stat.S_IMODE(victim.stat().st_mode) == 0o644
    assert inside.read_bytes() == b"* * * * * root true\n"
    warnings = [line for line in result.stderr.splitlines() if "does not manage" in line]
    assert len(warnings) == 2 and all("left as it is" in line for line in warnings)
    # the real bashrc came back from its own, re-derived path, without the setuid bit the record claimed
    bashrc = fsroot / "home/alice/.bashrc"
    assert bashrc.read_bytes() == b"# mine\n"
    assert stat.S_IMODE(bashrc.stat().st_mode) == 0o755
    # the poisoned records stay where they were, untouched, for a human to look at
    kept = {
        k for k in json.loads((fsroot / MANIFEST).read_text()) if not k.startswith("@")
    }  # "@state": the store's own
    assert kept == {str(victim), "/etc/cron.d/job"}


def test_restored_modes_are_clamped_and_credential_files_stay_0600(fsroot):
    config = fsroot / "home/alice/.docker/config.json"
    config.parent.mkdir(parents=True)
    config.write_bytes(b'{"auths": {"registry.corp": {"auth": "c2VjcmV0"}}}')
    config.chmod(0o600)
    set_up(fsroot, "--layers", "shell,container")

    def widen(manifest):
        manifest["/home/alice/.bashrc"]["mode"] = 0o6755  # setuid + setgid
        manifest["/home/alice/.docker/config.json"]["mode"] = (
            0o1666  # sticky, world-writable: its auths readable
        )

    edit_manifest(fsroot, widen)
    assert invoke("proxy.remove", "--root", str(fsroot)).returncode == 0
    assert stat.S_IMODE((fsroot / "home/alice/.bashrc").stat().st_mode) == 0o755
    assert config.read_bytes() == b'{"auths": {"registry.corp": {"auth": "c2VjcmV0"}}}'
    assert stat.S_IMODE(config.stat().st_mode) == 0o600


def test_group_writable_state_is_refused_and_nothing_is_written(fsroot):
    set_up(fsroot, "--layers", "shell")
    backups = fsroot / STATE / "backups"
    backups.chmod(0o770)
    before = snapshot(fsroot)
    for args in (
        ["proxy.remove"],
        ["proxy.setup", "--http", "http://other:3128", "--layers", "shell"],
    ):
        text = one_line_error(invoke(*args, "--root", str(fsroot)))
        assert f"{backups} is writable by its group or by everyone (mode 0o770)" in text
        assert "chmod -R go-w" in text
        assert snapshot(fsroot) == before


def test_a_symlinked_state_directory_is_refused(fsroot, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    state = fsroot / STATE
    state.parent.mkdir(parents=True)
    state.symlink_to(elsewhere)
    text = one_line_error(
        invoke("proxy.setup", "--http", PROXY, "--layers", "shell", "--root", str(fsroot))
    )
    assert "is a symbolic link" in text
    assert list(elsewhere.iterdir()) == []
    assert not (fsroot / "home/alice/.bashrc").exists()


@pytest.mark.skipif(
    os.geteuid() != 0,
    reason="needs root: the test gives the state directory to another uid (chown)",
)
@pytest.mark.parametrize("which", [STATE, f"{STATE}/backups", MANIFEST])
def test_state_owned_by_another_user_is_refused_when_running_as_root(fsroot, which):
    set_up(fsroot, "--layers", "shell")
    os.chown(fsroot / which, 4321, 4321)  # as if a user's process had made it (the sudo -E case)
    before = snapshot(fsroot)
    for args in (
        ["proxy.remove"],
        ["proxy.setup", "--http", "http://other:3128", "--layers", "shell"],
    ):
        text = one_line_error(invoke(*args, "--root", str(fsroot)))
        assert (
            f"{fsroot / which} belongs to uid 4321, not to" in text
            and "nothing was changed" in text
        )
        assert "without sudo" in text
        assert snapshot(fsroot) == before
    assert (
        PASSWORD.encode() in (fsroot / "home/alice/.bashrc").read_bytes()
    )  # still set up: nothing undone


def test_a_symlinked_backup_copy_is_not_followed(fsroot, tmp_path):
    secret = tmp_path / "id_rsa"
    secret.write_bytes(b"-----BEGIN OPENSSH PRIVATE KEY-----\n")
    secret.chmod(0o600)
    set_up(fsroot, "--layers", "shell")
    copies = list((fsroot / STATE / "backups").glob("*.orig"))
    assert len(copies) == 1
    copies[0].unlink()
    copies[0].symlink_to(secret)
    # the bashrc is untouched since setup, so removal would restore the "original" bytes: the key
    before = snapshot(fsroot)
    text = one_line_error(invoke("proxy.remove", "--root", str(fsroot)))
    assert "is a symbolic link" in text and "not followed" in text
    assert snapshot(fsroot) == before
    assert b"PRIVATE KEY" not in (fsroot / "home/alice/.bashrc").read_bytes()


def test_a_lost_backup_copy_never_deletes_the_users_file(fsroot):
    set_up(fsroot, "--layers", "shell")
    for copy in (fsroot / STATE / "backups").glob("*.orig"):
        copy.unlink()
    result = invoke("proxy.remove", "--root", str(fsroot))
    assert result.returncode == 0, result.stderr
    assert "backup copy of /home/alice/.bashrc is missing" in result.stderr
    assert (fsroot / "home/alice/.bashrc").read_bytes() == b"# mine\n"  # only our block went


def test_state_is_created_closed_to_others_whatever_the_umask(fsroot):
    old = os.umask(0o002)
    try:
        set_up(fsroot, "--layers", "shell")
    finally:
        os.umask(old)
    for directory in (fsroot / STATE, fsroot / STATE / "backups"):
        assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    assert (
        invoke("proxy.remove", "--root", str(fsroot)).returncode == 0
    )  # and so it is trusted next time
