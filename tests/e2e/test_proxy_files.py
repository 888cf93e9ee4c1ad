"""The proxy writers on real files (issue 14): symbolic links and owners, a write-ahead record that makes an
interrupted setup undoable, managed-block markers that do not pair up, bytes that are not UTF-8, per-layer saved
settings, a broken layer that does not block the others, cleanup of what setup created, bad state files.

Everything runs the real `invoke proxy.*` command line against a --root test directory standing for /; a setup
is interrupted by really killing its process between two file writes (pause_after_write.py beside this file wraps
the one-file write of the real command line).
"""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT
from proxyroot import PASSWORD, PROXY, invoke

from apexkit.proxy import layers

STATE = "home/alice/.config/apexkit"
PAUSE_AFTER_WRITE = Path(__file__).resolve().parent / "pause_after_write.py"
OTHER = "http://bob:0ther-Pass@proxy2.corp.example:8080"


def tree(root: Path) -> dict[str, tuple]:
    """Every path under `root` (links not followed): its type, link target, owner, mode and bytes."""
    entries: dict[str, tuple] = {}
    for directory, dirs, files in os.walk(root):
        for name in [*dirs, *files]:
            path = Path(directory, name)
            st = os.lstat(path)
            relative = str(path.relative_to(root))
            if stat.S_ISLNK(st.st_mode):
                entries[relative] = ("link", os.readlink(path), st.st_uid, st.st_gid)
            elif stat.S_ISDIR(st.st_mode):
                entries[relative] = ("dir", stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid)
            else:
                entries[relative] = (
                    "file",
                    stat.S_IMODE(st.st_mode),
                    st.st_uid,
                    st.st_gid,
                    path.read_bytes(),
                )
    return entries


def one_line_error(result: subprocess.CompletedProcess, code: int) -> str:
    assert result.returncode == code, result.stdout + result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "next:" in errors[0], result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    return errors[0]


def setup_ok(
    root: Path, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    result = invoke("proxy.setup", *args, "--root", str(root), env=env)
    assert result.returncode == 0, result.stderr
    return result


# --- symbolic links ---------------------------------------------------------------------------------------------


def test_symlinked_dotfiles_and_dropin_directory_stay_links_through_setup_and_remove(fsroot):
    dotfiles = fsroot / "home/alice/dotfiles"
    dotfiles.mkdir()
    (dotfiles / "bashrc").write_bytes(b"# from my dotfiles repository\n")
    (dotfiles / "bashrc").chmod(0o644)
    (dotfiles / "docker-config.json").write_bytes(b'{"auths": {"r.corp": {"auth": "eA=="}}}\n')
    (dotfiles / "docker-config.json").chmod(0o600)
    (fsroot / "home/alice/.bashrc").symlink_to("dotfiles/bashrc")  # relative, as stow makes them
    (fsroot / "home/alice/.docker").mkdir()
    (fsroot / "home/alice/.docker/config.json").symlink_to(
        dotfiles / "docker-config.json"
    )  # absolute
    shared = fsroot / "srv/unit-dropins"
    shared.mkdir(parents=True)
    (shared / "limits.conf").write_bytes(b"[Service]\nLimitNOFILE=1048576\n")
    (fsroot / "etc/systemd/system").mkdir(parents=True)
    (fsroot / "etc/systemd/system/docker.service.d").symlink_to(
        shared
    )  # a linked drop-in directory
    before = tree(fsroot)

    setup_ok(fsroot, "--http", PROXY, "--daemon-mode", "systemd")
    after = tree(fsroot)
    for link in (
        "home/alice/.bashrc",
        "home/alice/.docker/config.json",
        "etc/systemd/system/docker.service.d",
    ):
        assert after[link] == before[link]  # still the same link
    assert (
        b"# >>> apexkit proxy >>>" in (dotfiles / "bashrc").read_bytes()
    )  # the target was edited in place
    assert (dotfiles / "bashrc").read_bytes().startswith(b"# from my dotfiles repository\n")
    assert json.loads((dotfiles / "docker-config.json").read_text())["auths"] == {
        "r.corp": {"auth": "eA=="}
    }
    assert sorted(p.name for p in shared.iterdir()) == [
        "http-proxy.conf",
        "https-proxy.conf",
        "limits.conf",
    ]
    assert (
        layers.daemon_environment(layers.Paths(root=fsroot, environ={"HOME": "/home/alice"}))[
            "HTTP_PROXY"
        ]
        == PROXY
    )
    # a second run changes nothing
    assert "nothing written" in setup_ok(fsroot, "--http", PROXY, "--daemon-mode", "systemd").stderr

    removed = invoke("proxy.remove", "--root", str(fsroot))
    assert removed.returncode == 0, removed.stderr
    assert (
        tree(fsroot) == before
    )  # same type, link, owner, mode and bytes; no state or folder left behind


def test_a_link_leading_out_of_the_root_is_refused_in_one_line(fsroot, tmp_path):
    outside = tmp_path / "outside-bashrc"
    outside.write_bytes(b"# not under --root\n")
    (fsroot / "home/alice/.bashrc").symlink_to(outside)
    before = tree(fsroot)
    text = one_line_error(
        invoke("proxy.setup", "--http", PROXY, "--layers", "shell", "--root", str(fsroot)), 6
    )
    assert (
        "/home/alice/.bashrc is a symbolic link to" in text
        and "outside" in text
        and "nothing was changed" in text
    )
    assert tree(fsroot) == before and outside.read_bytes() == b"# not under --root\n"


def test_a_dangling_link_and_a_directory_in_place_of_a_file_are_one_line(fsroot):
    (fsroot / "home/alice/.bashrc").symlink_to("dotfiles/missing")
    text = one_line_error(
        invoke("proxy.setup", "--http", PROXY, "--layers", "shell", "--root", str(fsroot)), 6
    )
    assert "which does not exist" in text
    (fsroot / "home/alice/.bashrc").unlink()
    (fsroot / "home/alice/.bashrc").mkdir()
    text = one_line_error(
        invoke("proxy.setup", "--http", PROXY, "--layers", "shell", "--root", str(fsroot)), 6
    )
    assert "/home/alice/.bashrc is a directory, not a file" in text
    assert not (fsroot / STATE).exists()


# --- owners -----------------------------------------------------------------------------------------------------

needs_root = pytest.mark.skipif(
    os.geteuid() != 0, reason="needs root: the test gives the home to another uid (chown)"
)


@needs_root
def test_files_created_in_a_users_home_belong_to_that_user_and_remove_works(fsroot):
    home = fsroot / "home/alice"
    os.chown(home, 4321, 4322)  # sudo -E: root runs with HOME=/home/alice
    (home / ".bashrc").write_bytes(b"# alice's\n")
    os.chown(home / ".bashrc", 4321, 4322)
    before = tree(fsroot)
    setup_ok(
        fsroot,
        "--http",
        PROXY,
        "--pip-index",
        "https://pypi.corp.example/simple",
        "--layers",
        "shell,container,pip",
    )
    created = [
        "home/alice/.docker",
        "home/alice/.docker/config.json",
        "home/alice/.config",
        "home/alice/.config/pip",
        "home/alice/.config/pip/pip.conf",
        STATE,
        f"{STATE}/backups",
        f"{STATE}/backups/manifest.json",
        f"{STATE}/proxy.json",
    ]
    owners = {
        name: os.lstat(fsroot / name)[stat.ST_UID : stat.ST_GID + 1]
        for name in [*created, "home/alice/.bashrc"]
    }
    assert set(owners.values()) == {(4321, 4322)}, owners
    assert all(os.lstat(p).st_uid == 4321 for p in (fsroot / STATE / "backups").glob("*.orig"))
    # root trusts the state of the home it runs with (owned by that home's owner) ...
    shown = invoke("proxy.show", "--root", str(fsroot))
    assert shown.returncode == 0 and "shell: configured" in shown.stdout
    removed = invoke("proxy.remove", "--root", str(fsroot))
    assert removed.returncode == 0, removed.stderr
    assert tree(fsroot) == before


@needs_root
def test_undo_records_of_system_files_stay_roots_and_user_owned_ones_are_refused(fsroot):
    home = fsroot / "home/alice"
    os.chown(home, 4321, 4321)
    before = tree(fsroot)
    setup_ok(
        fsroot, "--http", PROXY, "--daemon-mode", "systemd"
    )  # shell, container and /etc drop-ins
    assert (
        os.lstat(home / ".bashrc").st_uid == 4321
        and os.lstat(home / ".docker/config.json").st_uid == 4321
    )
    for name in (STATE, f"{STATE}/backups", f"{STATE}/backups/manifest.json"):
        assert os.lstat(fsroot / name).st_uid == 0, (
            name
        )  # it holds records of /etc files: the user may not edit them
    assert os.lstat(fsroot / "etc/systemd/system/docker.service.d/http-proxy.conf").st_uid == 0
    # a manifest that the user could write, naming a system file, is not acted on by root
    for name in (STATE, f"{STATE}/backups", f"{STATE}/backups/manifest.json"):
        os.chown(fsroot / name, 4321, 4321)
    text = one_line_error(invoke("proxy.remove", "--root", str(fsroot)), 6)
    assert "outside that home: root does not act on it" in text
    for name in (STATE, f"{STATE}/backups", f"{STATE}/backups/manifest.json"):
        os.chown(fsroot / name, 0, 0)
    assert invoke("proxy.remove", "--root", str(fsroot)).returncode == 0
    assert tree(fsroot) == before


@needs_root
def test_root_does_not_follow_a_users_link_to_a_file_of_someone_else(fsroot):
    home = fsroot / "home/alice"
    os.chown(home, 4321, 4321)
    shadow = fsroot / "etc/shadow"
    shadow.parent.mkdir(parents=True)
    shadow.write_bytes(b"root:*:19000:0:99999:7:::\n")
    (home / ".bashrc").symlink_to(shadow)
    os.lchown(home / ".bashrc", 4321, 4321)
    before = tree(fsroot)
    text = one_line_error(
        invoke("proxy.setup", "--http", PROXY, "--layers", "shell", "--root", str(fsroot)), 6
    )
    assert (
        "is a symbolic link of" in text and "uid 4321" in text and "root does not follow it" in text
    )
    assert tree(fsroot) == before


# --- interrupted setup ------------------------------------------------------------------------------------------


def start_setup(root: Path, pause_after: int, *args: str) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
    env.update(HOME="/home/alice")
    env.pop("XDG_CONFIG_HOME", None)
    env.pop("DOCKER_CONFIG", None)
    process = subprocess.Popen(
        [
            sys.executable,
            str(PAUSE_AFTER_WRITE),
            str(pause_after),
            "-m",
            "invoke",
            "-r",
            str(ROOT),
            "proxy.setup",
            *args,
            "--root",
            str(root),
        ],
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        env=env,
        text=True,
        # as a login shell's command has it, even when the tests run under nohup (which ignores SIGHUP for all)
        preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_DFL),
    )
    assert process.stderr is not None
    for line in process.stderr:
        if f"apexkit-test: paused after write {pause_after}" in line:
            return process
    process.wait(30)
    raise AssertionError(f"setup never paused (exit {process.returncode})")


def prepared_home(root: Path) -> None:
    home = root / "home/alice"
    (home / ".bashrc").write_bytes(b"# mine\nexport EDITOR=vi\n")
    (home / ".bashrc").chmod(0o644)
    (home / ".docker").mkdir()
    (home / ".docker/config.json").write_bytes(b'{"auths": {}}')
    (home / ".docker/config.json").chmod(0o600)


@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGTERM, signal.SIGHUP])
def test_a_setup_killed_between_two_writes_is_undone_by_remove(fsroot, signum):
    prepared_home(fsroot)
    before = tree(fsroot)
    process = start_setup(fsroot, 1, "--http", PROXY, "--layers", "shell,container")
    process.send_signal(signum)
    process.wait(30)
    assert process.returncode != 0
    assert (
        PASSWORD.encode() in (fsroot / "home/alice/.bashrc").read_bytes()
    )  # the first write happened ...
    assert (
        fsroot / "home/alice/.docker/config.json"
    ).read_bytes() == b'{"auths": {}}'  # ... the second did not
    removed = invoke("proxy.remove", "--root", str(fsroot))
    assert removed.returncode == 0, removed.stderr
    assert "nothing to remove" not in removed.stderr
    assert tree(fsroot) == before


def test_a_rerun_after_a_kill_keeps_the_true_original(fsroot):
    prepared_home(fsroot)
    before = tree(fsroot)
    process = start_setup(fsroot, 2, "--http", PROXY, "--layers", "shell,container")
    process.kill()
    process.wait(30)
    setup_ok(
        fsroot, "--http", OTHER, "--layers", "shell,container"
    )  # the rerun finishes (other settings)
    text = (fsroot / "home/alice/.bashrc").read_text()
    assert text.count("# >>> apexkit proxy >>>") == 1 and OTHER in text and PROXY not in text
    assert invoke("proxy.remove", "--root", str(fsroot)).returncode == 0
    assert tree(fsroot) == before  # not the half-configured file the killed run left


# --- markers ------------------------------------------------------------------------------------------------------

BEGIN, END = "# >>> apexkit proxy >>>", "# <<< apexkit proxy <<<"


@pytest.mark.parametrize(
    "content, where",
    [
        (
            f"# mine\n{BEGIN}\nexport http_proxy=x\nalias keep='me'\n",
            "begin at line 2",
        ),  # end marker lost
        (f"alias keep='me'\n{END}\n", "end at line 2"),
        (
            f"{BEGIN}\nexport a=1\n{END}\nalias keep='me'\n{BEGIN}\nexport a=1\n{END}\n",
            "begin at line 1, begin at line 5",
        ),
        (f"{END}\nalias keep='me'\n{BEGIN}\n", "begin at line 3, end at line 1"),
    ],
)
def test_unpaired_or_repeated_markers_are_refused_and_nothing_is_written(fsroot, content, where):
    (fsroot / "home/alice/.bashrc").write_text(content)
    before = tree(fsroot)
    text = one_line_error(invoke("proxy.setup", "--http", PROXY, "--root", str(fsroot)), 2)
    assert (
        "/home/alice/.bashrc holds unpaired or repeated 'apexkit proxy' markers" in text
        and where in text
    )
    assert tree(fsroot) == before


def test_remove_with_a_duplicated_block_undoes_the_other_layers_and_says_which_file_is_left(fsroot):
    prepared_home(fsroot)
    setup_ok(fsroot, "--http", PROXY, "--layers", "shell,container")
    bashrc = fsroot / "home/alice/.bashrc"
    text = bashrc.read_text()
    bashrc.write_text(text + text[text.index(BEGIN) :])  # a hand edit duplicated our block
    result = invoke("proxy.remove", "--root", str(fsroot))
    line = one_line_error(result, 2)
    assert "could not undo /home/alice/.bashrc" in line and "unpaired or repeated" in line
    assert (
        fsroot / "home/alice/.docker/config.json"
    ).read_bytes() == b'{"auths": {}}'  # the other layer: undone
    assert bashrc.read_text().count(BEGIN) == 2  # our lines untouched, for the user to sort out
    saved = json.loads((fsroot / STATE / "proxy.json").read_text())
    assert list(saved["layers"]) == ["shell"]  # the layer left set up is still known


# --- bytes that are not UTF-8 -------------------------------------------------------------------------------------


def test_non_utf8_bytes_survive_setup_and_remove_exactly(fsroot):
    bashrc = fsroot / "home/alice/.bashrc"
    gbk = "# 代理设置\n".encode("gbk") + b"export LANG=zh_CN.GBK\n"
    bashrc.write_bytes(gbk)
    pip_conf = fsroot / "home/alice/.config/pip/pip.conf"
    pip_conf.parent.mkdir(parents=True)
    latin1 = "# café proxy\n[global]\ntimeout = 60\n".encode("latin-1")
    pip_conf.write_bytes(latin1)
    before = tree(fsroot)
    setup_ok(
        fsroot,
        "--http",
        PROXY,
        "--pip-index",
        "https://pypi.corp.example/simple",
        "--layers",
        "shell,pip",
    )
    assert bashrc.read_bytes().startswith(gbk) and pip_conf.read_bytes().startswith(
        b"# caf\xe9 proxy\n"
    )
    assert "shell: configured" in invoke("proxy.show", "--root", str(fsroot)).stdout
    assert invoke("proxy.remove", "--root", str(fsroot)).returncode == 0
    assert tree(fsroot) == before
    # edited since setup: only our part goes, every other byte stays
    setup_ok(
        fsroot,
        "--http",
        PROXY,
        "--pip-index",
        "https://pypi.corp.example/simple",
        "--layers",
        "shell,pip",
    )
    with open(bashrc, "ab") as handle:
        handle.write("alias 列表='ls'\n".encode("gbk"))
    with open(pip_conf, "ab") as handle:
        handle.write(b"# \xe9t\xe9\n")
    assert invoke("proxy.remove", "--root", str(fsroot)).returncode == 0
    assert bashrc.read_bytes() == gbk + "alias 列表='ls'\n".encode("gbk")
    assert pip_conf.read_bytes() == latin1 + b"# \xe9t\xe9\n"


# --- per-layer settings, broken layers, cleanup ---------------------------------------------------------------------


def test_each_layer_keeps_its_own_settings(fsroot):
    before = tree(fsroot)
    setup_ok(fsroot, "--http", PROXY, "--layers", "shell")
    setup_ok(fsroot, "--http", OTHER, "--layers", "daemon", "--daemon-mode", "systemd")
    setup_ok(fsroot, "--pip-index", "https://pypi.corp.example/simple", "--layers", "pip")
    saved = json.loads((fsroot / STATE / "proxy.json").read_text())["layers"]
    assert list(saved) == ["shell", "daemon", "pip"]
    assert (
        saved["shell"]["settings"]["http"] == PROXY
        and saved["shell"]["profile"] == "/home/alice/.bashrc"
    )
    assert (
        saved["daemon"]["settings"]["http"] == OTHER and saved["daemon"]["daemon_mode"] == "systemd"
    )
    shown = invoke("proxy.show", "--root", str(fsroot)).stdout
    assert (
        "shell (/home/alice/.bashrc):" in shown and "daemon (systemd):" in shown and "pip:" in shown
    )
    assert "http://bob:***@proxy2.corp.example:8080" in shown and "0ther-Pass" not in shown
    exported = invoke("proxy.env", "--root", str(fsroot)).stdout
    assert f"export http_proxy={PROXY}\n" in exported  # the shell layer's proxy

    assert invoke("proxy.remove", "--layers", "shell", "--root", str(fsroot)).returncode == 0
    assert list(json.loads((fsroot / STATE / "proxy.json").read_text())["layers"]) == [
        "daemon",
        "pip",
    ]
    assert f"export http_proxy={OTHER}\n" in invoke("proxy.env", "--root", str(fsroot)).stdout
    assert invoke("proxy.remove", "--root", str(fsroot)).returncode == 0
    assert tree(fsroot) == before


def test_a_corrupt_daemon_json_does_not_block_removing_the_other_layers(fsroot):
    prepared_home(fsroot)
    (fsroot / "etc/docker").mkdir(parents=True)
    (fsroot / "etc/docker/daemon.json").write_bytes(b'{"data-root": "/srv/docker"}\n')
    before = tree(fsroot)
    setup_ok(fsroot, "--http", PROXY, "--daemon-mode", "daemon-json")
    daemon_json = fsroot / "etc/docker/daemon.json"
    daemon_json.write_bytes(daemon_json.read_bytes() + b"{{ broken by hand")
    line = one_line_error(invoke("proxy.remove", "--root", str(fsroot)), 2)
    assert "could not undo /etc/docker/daemon.json" in line and "is not valid JSON" in line
    home = fsroot / "home/alice"
    assert (home / ".bashrc").read_bytes() == b"# mine\nexport EDITOR=vi\n"
    assert (home / ".docker/config.json").read_bytes() == b'{"auths": {}}'
    assert list(json.loads((fsroot / STATE / "proxy.json").read_text())["layers"]) == ["daemon"]
    daemon_json.write_bytes(
        b'{"data-root": "/srv/docker", "proxies": {"http-proxy": "http://proxy:3128"}}'
    )  # repaired
    assert invoke("proxy.remove", "--root", str(fsroot)).returncode == 0
    assert json.loads(daemon_json.read_text()) == {
        "data-root": "/srv/docker"
    }  # edited since: only our key went
    after = tree(fsroot)
    assert after.pop("etc/docker/daemon.json")[1] == 0o600  # it held the password: it stays 0600
    before.pop("etc/docker/daemon.json")
    assert after == before


def test_remove_takes_away_the_folders_and_state_that_setup_created(fsroot):
    before = tree(fsroot)
    setup_ok(
        fsroot,
        "--http",
        PROXY,
        "--pip-index",
        "https://pypi.corp.example/simple",
        "--daemon-mode",
        "systemd",
    )
    for made in (
        "home/alice/.docker",
        "home/alice/.config/pip",
        STATE,
        "etc/systemd/system/docker.service.d",
    ):
        assert (fsroot / made).is_dir()
    assert invoke("proxy.remove", "--root", str(fsroot)).returncode == 0
    assert tree(fsroot) == before  # no empty manifest, no empty folder


@pytest.mark.parametrize(
    "content, where",
    [
        (
            '{"version": 2, "layers": {"shell": {"settings": {"http": 3128}}}}',
            "layers.shell.settings.http is a number",
        ),
        (
            '{"version": 2, "layers": {"shell": {"settings": {"no_proxy": "a,b"}}}}',
            "layers.shell.settings.no_proxy is a string",
        ),
        ('{"version": 2, "layers": {"shell": []}}', "layers.shell is a list"),
        ('{"version": 2, "layers": {"bogus": {}}}', "layers.bogus is not a layer"),
        ('{"version": 2, "layers": 7}', "layers is a number"),
        ('{"settings": "http://x:1", "layers": ["shell"]}', "settings is a string"),
        ('["not", "an", "object"]', "holds a JSON list"),
    ],
)
def test_a_proxy_json_with_wrong_types_is_one_line(fsroot, content, where):
    setup_ok(fsroot, "--http", PROXY, "--layers", "shell")
    (fsroot / STATE / "proxy.json").write_text(content)
    for args in (
        ["proxy.show"],
        ["proxy.env"],
        ["proxy.setup", "--http", PROXY, "--layers", "container"],
    ):
        text = one_line_error(invoke(*args, "--root", str(fsroot)), 2)
        assert where in text, text
    # remove still undoes every layer (and the state with it)
    result = invoke("proxy.remove", "--root", str(fsroot))
    assert result.returncode == 0, result.stderr
    assert not (fsroot / "home/alice/.bashrc").exists() and not (fsroot / STATE).exists()


@pytest.mark.parametrize("blocker", ["home/alice/.config", "home/alice/.docker"])
def test_a_file_where_a_folder_belongs_is_one_line(fsroot, blocker):
    (fsroot / blocker).write_bytes(b"not a folder\n")
    before = tree(fsroot)
    text = one_line_error(invoke("proxy.setup", "--http", PROXY, "--root", str(fsroot)), 6)
    assert (
        f"{fsroot / blocker} is a file where a folder belongs" in text
        and "nothing was changed" in text
    )
    assert tree(fsroot) == before
