"""Findings of an adversarial review of the proxy writers, each run through the real `invoke proxy.*` command line
against a --root test directory standing for /:

- as root (sudo -E, HOME of a user), a user's link on a FOLDER above a managed file (~/.docker, ~/.config) that
  leads into root's files is refused: root's registry logins are neither edited nor copied into the user's backups,
  and no folder of root's is given to the user;
- edits made to a managed file between two setups survive `remove` (only apexkit's part goes);
- only regular files of a sane size are read: a named pipe, /dev/zero or a huge file is one line, not a hang or a
  MemoryError;
- JSON nested deeply enough to overflow the parser's stack is one line, not a RecursionError traceback;
- a path that leaves --root through '..' says so (no link is involved).
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import fakes
import pytest
from conftest import ROOT
from proxyroot import PROXY, invoke

from .test_proxy_files import one_line_error, setup_ok, tree

STATE = "home/alice/.config/apexkit"
AUTHS = {"auths": {"registry.corp": {"auth": "cm9vdDpzM2NyZXQ="}}}


def roots_docker_config(root: Path) -> Path:
    config = root / "root/.docker/config.json"
    config.parent.mkdir(parents=True)
    config.parent.chmod(0o700)
    config.write_text(json.dumps(AUTHS))
    config.chmod(0o600)
    return config


# --- 1: a user's folder link into root's files ------------------------------------------------------------------------


@fakes.needs_root
def test_root_does_not_follow_a_users_folder_link_into_roots_docker_config(fsroot):
    home = fakes.users_home(fsroot)
    config = roots_docker_config(fsroot)
    fakes.users_link(home / ".docker", "../../root/.docker")
    before = tree(fsroot)
    for args in (
        ["proxy.setup", "--http", "http://a:b@p.corp:3128", "--layers", "shell,container"],
        ["proxy.setup", "--http", "http://a:b@p.corp:3128", "--layers", "container", "--dry-run"],
    ):
        text = one_line_error(invoke(*args, "--root", str(fsroot)), 6)
        assert "/home/alice/.docker/config.json lies under" in text and "a symbolic link of" in text
        assert (
            f"uid {fakes.NOBODY}" in text
            and "root does not follow it" in text
            and "nothing was changed" in text
        )
        assert (
            tree(fsroot) == before
        )  # root's logins untouched, no backup copy of them, no state made
    assert json.loads(config.read_text()) == AUTHS
    # the same link pointed at a folder of the user's own is followed, and remove puts everything back
    mine = home / "dotfiles/docker"
    mine.mkdir(parents=True)
    for folder in (home / "dotfiles", mine):
        os.chown(folder, fakes.NOBODY, fakes.NOBODY)
    (home / ".docker").unlink()
    fakes.users_link(home / ".docker", "dotfiles/docker")
    before = tree(fsroot)
    setup_ok(fsroot, "--http", PROXY, "--layers", "container")
    assert os.lstat(mine / "config.json").st_uid == fakes.NOBODY
    assert os.lstat(fsroot / STATE).st_uid == fakes.NOBODY
    assert invoke("proxy.remove", "--root", str(fsroot)).returncode == 0
    assert tree(fsroot) == before


@fakes.needs_root
def test_root_does_not_follow_a_users_config_link_nor_give_roots_state_away(fsroot):
    home = fakes.users_home(fsroot)
    roots_state = fsroot / "root/.config/apexkit"
    roots_state.mkdir(parents=True)
    roots_state.chmod(0o700)
    fakes.users_link(home / ".config", "../../root/.config")
    before = tree(fsroot)
    for args in (
        ["proxy.setup", "--pip-index", "https://mirror.corp/simple", "--layers", "pip"],
        ["proxy.remove"],
        ["proxy.show"],
    ):
        text = one_line_error(invoke(*args, "--root", str(fsroot)), 6)
        assert (
            "lies under" in text
            and f"{fsroot}/home/alice/.config" in text
            and "root does not follow it" in text
        )
        assert tree(fsroot) == before
    assert os.lstat(roots_state).st_uid == 0
    assert not (fsroot / "root/.config/pip").exists()


# --- 2: edits between two setups --------------------------------------------------------------------------------------


def test_edits_made_between_two_setups_survive_remove(fsroot):
    home = fsroot / "home/alice"
    (home / ".bashrc").write_bytes(b"# mine\n")
    (home / ".bashrc").chmod(0o644)
    setup_ok(fsroot, "--http", "http://alice:old@p.corp:3128", "--layers", "shell,container")
    config = home / ".docker/config.json"
    config.write_text(
        json.dumps({**json.loads(config.read_text()), **AUTHS})
    )  # what `docker login` does
    with open(home / ".bashrc", "a") as handle:
        handle.write("alias ll='ls -l'\n")
    setup_ok(fsroot, "--http", "http://alice:new@p.corp:3128", "--layers", "shell,container")
    assert "alice:new@" in config.read_text() and "alias ll" in (home / ".bashrc").read_text()
    removed = invoke("proxy.remove", "--root", str(fsroot))
    assert removed.returncode == 0, removed.stderr
    assert "deleted: /home/alice/.docker/config.json" not in removed.stderr
    assert json.loads(config.read_text()) == AUTHS  # the login stays, only the proxies went
    assert (home / ".bashrc").read_bytes() == b"# mine\nalias ll='ls -l'\n"
    assert not (fsroot / STATE).exists()


def test_two_setups_without_edits_still_restore_the_original_exactly(fsroot):
    home = fsroot / "home/alice"
    (home / ".bashrc").write_bytes(b"# mine, without a final newline")
    (home / ".bashrc").chmod(0o644)
    before = tree(fsroot)
    setup_ok(fsroot, "--http", "http://alice:old@p.corp:3128", "--layers", "shell,container")
    setup_ok(fsroot, "--http", "http://alice:new@p.corp:3128", "--layers", "shell,container")
    assert invoke("proxy.remove", "--root", str(fsroot)).returncode == 0
    assert tree(fsroot) == before


# --- 5: only regular files are read ------------------------------------------------------------------------------------


def run(*args: str, timeout: int = 60) -> subprocess.CompletedProcess:
    env = {
        k: v
        for k, v in os.environ.items()
        if "proxy" not in k.lower() and k not in ("XDG_CONFIG_HOME", "DOCKER_CONFIG")
    }
    env["HOME"] = "/home/alice"
    return subprocess.run(
        [sys.executable, "-m", "invoke", "-r", str(ROOT), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
    )  # a hang fails here, after `timeout` seconds


def test_a_named_pipe_is_one_line_not_a_hang(fsroot):
    os.mkfifo(fsroot / "home/alice/.bashrc")
    text = one_line_error(
        run("proxy.setup", "--http", PROXY, "--layers", "shell", "--root", str(fsroot)), 6
    )
    assert (
        "/home/alice/.bashrc is a named pipe, not a regular file" in text
        and "nothing was changed" in text
    )
    shown = run("proxy.show", "--root", str(fsroot))
    assert shown.returncode == 0 and "shell: not configured" in shown.stdout, shown.stderr
    assert not (fsroot / STATE).exists()


def test_a_device_or_a_huge_file_is_one_line_not_a_memory_error(fsroot, tmp_path):
    bashrc = fsroot / "home/alice/.bashrc"
    bashrc.symlink_to("/dev/zero")  # out of --root: refused before anything is read
    text = one_line_error(
        run("proxy.setup", "--http", PROXY, "--layers", "shell", "--root", str(fsroot)), 6
    )
    assert "outside" in text
    bashrc.unlink()
    with open(bashrc, "wb") as handle:  # sparse: 17 MiB that take no room
        handle.truncate(17 * 1024 * 1024)
    text = one_line_error(
        run("proxy.setup", "--http", PROXY, "--layers", "shell", "--root", str(fsroot)), 6
    )
    assert "/home/alice/.bashrc is larger than 16 MiB" in text
    from apexkit import fsedit

    with pytest.raises(fsedit.TargetError, match="a character device, not a regular file"):
        fsedit.read_target(Path("/dev/zero"), "/dev/zero")
    assert not (fsroot / STATE).exists()


# --- 6: deeply nested JSON -----------------------------------------------------------------------------------------


def test_deeply_nested_json_is_one_line(fsroot):
    config = fsroot / "home/alice/.docker/config.json"
    config.parent.mkdir()
    config.write_text("[" * 100000)
    text = one_line_error(
        invoke("proxy.setup", "--http", PROXY, "--layers", "container", "--root", str(fsroot)), 2
    )
    assert "nests JSON more than" in text
    config.write_text('{"a": ' * 70 + "1" + "}" * 70)  # valid, but deeper than any docker config
    text = one_line_error(
        invoke("proxy.setup", "--http", PROXY, "--layers", "container", "--root", str(fsroot)), 2
    )
    assert "nests JSON more than" in text
    config.unlink()
    setup_ok(fsroot, "--http", PROXY, "--layers", "shell,container")
    config.write_text("[" * 100000)
    (fsroot / STATE / "proxy.json").write_text('{"a":' * 100000)
    for args in (
        ["proxy.show"],
        ["proxy.env"],
        ["proxy.setup", "--http", PROXY, "--layers", "shell"],
    ):
        text = one_line_error(invoke(*args, "--root", str(fsroot)), 2)
        assert "proxy.json nests JSON more than" in text, text
    text = one_line_error(invoke("proxy.remove", "--root", str(fsroot)), 2)
    assert "could not undo /home/alice/.docker/config.json" in text and "nests JSON" in text
    assert not (
        fsroot / "home/alice/.bashrc"
    ).exists()  # the other layer was undone (setup had made the file)


# --- 9b: '..' out of --root ------------------------------------------------------------------------------------------


def test_a_profile_climbing_out_of_the_root_says_so(fsroot):
    before = tree(fsroot)
    text = one_line_error(
        invoke(
            "proxy.setup",
            "--http",
            PROXY,
            "--layers",
            "shell",
            "--profile",
            "/../../../x",
            "--root",
            str(fsroot),
        ),
        6,
    )
    assert "/../../../x lies outside" in text and "'..'" in text and "symbolic link" not in text
    assert tree(fsroot) == before
    assert stat.S_ISDIR(os.lstat(fsroot).st_mode)
