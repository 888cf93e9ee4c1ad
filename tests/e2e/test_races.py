"""Concurrent runs (review 2026-12-01, M6): two publishes into one index, and two proxy setups on one machine, as
real processes started at the same moment. The locks serialise them (the second one waits, saying so), and the
index swap leaves no moment without an index (a reader process polling it never misses it)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import ROOT, output

TORCHES = {"d1": "2.13.0", "d2": "2.7.1", "d3": "2.1.0"}
ROUNDS = 8  # in two tests of four rounds, each under 20 s


def wheel_name(torch: str) -> str:
    return f"apex-0.1+ascend.torch{torch}-cp311-cp311-linux_x86_64.whl"


def make_dist(parent: Path, name: str) -> Path:
    """dist/<target>/ with one wheel and its manifest, as tests/e2e/test_publish.py's fake_dist (publish never opens
    the wheel as a zip)."""
    torch = TORCHES[name]
    target = f"py3.11-torch{torch}-x86_64-master"
    folder = parent / name / target
    folder.mkdir(parents=True)
    data = f"wheel of {name}".encode()
    (folder / wheel_name(torch)).write_bytes(data)
    manifest = {
        "wheel": {"file": wheel_name(torch), "sha256": hashlib.sha256(data).hexdigest()},
        "target": {"torch": torch},
    }
    (folder / "manifest.json").write_text(json.dumps(manifest))
    return parent / name


def publish_cmd(dist: Path, index: Path) -> list[str]:
    return [sys.executable, "-m", "apexkit", "publish", "--dist", str(dist), "--index", str(index)]


READER = """
import os, sys, time
index, stop = sys.argv[1], sys.argv[2]
polls = missing = 0
marker = os.path.join(index, "index.json")
while not os.path.exists(stop):
    for _ in range(1000):
        polls += 1
        if not os.path.exists(marker):
            missing += 1
print(polls, missing)
"""


@pytest.mark.parametrize("half", [0, 1])
def test_two_publishes_at_once_keep_every_wheel_and_the_index_never_disappears(tmp_path, half):
    dists = {name: make_dist(tmp_path / "dists", name) for name in TORCHES}
    seed = tmp_path / "seed"
    proc = subprocess.run(
        publish_cmd(dists["d1"], seed), capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, output(proc)
    index = tmp_path / "www" / "index"
    index.parent.mkdir()
    stop = tmp_path / "stop"
    shutil.copytree(seed, index)
    reader = subprocess.Popen(
        [sys.executable, "-c", READER, str(index), str(stop)], stdout=subprocess.PIPE, text=True
    )
    waited = 0
    try:
        for round_ in range(half * ROUNDS // 2, (half + 1) * ROUNDS // 2):
            if round_ % (
                ROUNDS // 2
            ):  # the index holding d1 only, put back in place with the same one-step swap
                fresh = index.with_name(f".fresh-{round_}")
                shutil.copytree(seed, fresh)
                from apexkit import fsedit

                fsedit.swap_directory(fresh, index)
            runs = [
                subprocess.Popen(
                    publish_cmd(dists[name], index),
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                )
                for name in ("d2", "d3")
            ]
            results = [(run.wait(timeout=60), *run.communicate()) for run in runs]
            for code, out, err in results:
                assert code == 0, f"round {round_}: {out}{err}"
                assert "Traceback" not in err
            waited += sum("waiting for the lock on the index" in err for _, _, err in results)
            held = sorted(p.name for p in (index / "simple" / "apex").glob("*.whl"))
            assert held == sorted(wheel_name(t) for t in TORCHES.values()), (
                f"round {round_}: {held}"
            )
            listed = json.loads((index / "index.json").read_text())
            assert len(listed["files"]) == 3, f"round {round_}"
    finally:
        stop.write_text("")
        polls, missing = map(int, reader.communicate(timeout=30)[0].split())
    assert polls > 0 and missing == 0, f"the index was missing in {missing} of {polls} polls"
    # nothing left beside the index but its lock file (kept, as apexkit.locks says)
    assert sorted(p.name for p in index.parent.iterdir()) == ["index", "index.lock"]


def test_swap_directory_never_leaves_a_moment_without_the_directory(tmp_path):
    """The swap alone, many times, with a reader process polling: the old two renames left a gap it could see."""
    from apexkit import fsedit

    index, stop = tmp_path / "index", tmp_path / "stop"
    index.mkdir()
    (index / "index.json").write_text("{}\n")
    reader = subprocess.Popen(
        [sys.executable, "-c", READER, str(index), str(stop)], stdout=subprocess.PIPE, text=True
    )
    try:
        time.sleep(0.3)  # the reader is polling
        deadline = time.monotonic() + 3
        swaps = 0
        while time.monotonic() < deadline:
            fresh = tmp_path / f".index.tmp-{swaps}"
            fresh.mkdir()
            (fresh / "index.json").write_text(f'{{"n": {swaps}}}\n')
            fsedit.swap_directory(fresh, index)
            swaps += 1
    finally:
        stop.write_text("")
        polls, missing = map(int, reader.communicate(timeout=30)[0].split())
    assert json.loads((index / "index.json").read_text()) == {"n": swaps - 1}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["index", "stop"]  # no old copies left
    assert polls > 0 and missing == 0, (
        f"the directory was missing in {missing} of {polls} polls ({swaps} swaps)"
    )


PROXY_HOSTS = ("a.corp", "b.corp")
PROXY_FILES = (
    "home/alice/.bashrc",
    "home/alice/.config/pip/pip.conf",
    "home/alice/.docker/config.json",
)


def proxy_setup(root: Path, host: str) -> subprocess.Popen:
    # the environment tests/proxyroot.py's invoke gives: no proxy variables of the caller's, alice's HOME
    env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
    env.update(HOME="/home/alice")
    for name in ("XDG_CONFIG_HOME", "DOCKER_CONFIG"):
        env.pop(name, None)
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "invoke",
            "-r",
            str(ROOT),
            "proxy.setup",
            "--http",
            f"http://{host}:3128",
            "--pip-index",
            f"http://{host}:3141/simple/",
            "--layers",
            "shell,pip,container",
            "--root",
            str(root),
            "--no-restart",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


@pytest.mark.parametrize("half", [0, 1])
def test_two_proxy_setups_at_once_end_with_one_complete_config(tmp_path, half):
    for round_ in range(half * ROUNDS // 2, (half + 1) * ROUNDS // 2):
        root = tmp_path / f"round{round_}"
        (root / "home/alice").mkdir(parents=True)
        runs = {host: proxy_setup(root, host) for host in PROXY_HOSTS}
        results = {host: (run.wait(timeout=60), *run.communicate()) for host, run in runs.items()}
        for host, (code, out, err) in results.items():
            assert "Traceback" not in out + err
            assert code == 0, f"round {round_}, {host}: {out}{err}"
        found = {
            name: [host for host in PROXY_HOSTS if host in (root / name).read_text()]
            for name in PROXY_FILES
        }
        ends = {tuple(hosts) for hosts in found.values()}
        assert len(ends) == 1 and len(next(iter(ends))) == 1, f"round {round_}: {found}"
        (winner,) = next(iter(ends))
        waited = [h for h, (_, _, err) in results.items() if "waiting for the lock" in err]
        if waited:  # the one that waited ran second: its settings are the ones left
            assert waited == [winner], f"round {round_}: {waited} waited, {winner} left"
        saved = json.loads((root / "home/alice/.config/apexkit/proxy.json").read_text())
        assert winner in json.dumps(saved) and (
            {"a.corp", "b.corp"} - {winner}
        ).pop() not in json.dumps(saved)


# --- M5: root writing into a user's home, a link swapped in between two writes ------------------------------------

PAUSE_AFTER_WRITE = Path(__file__).resolve().parent / "pause_after_write.py"
ROOT_DOCKER = b'{"auths": {"registry.corp": {"auth": "cm9vdDpyb290LXNlY3JldA=="}}}\n'
ALICE_DOCKER = b'{"credsStore": "alice-helper", "auths": {}}\n'
ALICE = (1000, 1000)


def alice_home(root: Path) -> Path:
    """--root's /home/alice, every file of it alice's (uid 1000); root's own /root/.docker holding registry logins."""
    home = root / "home/alice"
    (home / ".docker").mkdir(parents=True)
    (home / ".docker/config.json").write_bytes(ALICE_DOCKER)
    (home / ".bashrc").write_bytes(b"# alice's bashrc\n")
    for path in (home, home / ".docker", home / ".docker/config.json", home / ".bashrc"):
        os.chown(path, *ALICE)
    (home / ".docker/config.json").chmod(0o600)
    (root / "root/.docker").mkdir(parents=True, mode=0o700)
    (root / "root/.docker/config.json").write_bytes(ROOT_DOCKER)
    (root / "root/.docker/config.json").chmod(0o600)
    return home


@pytest.mark.skipif(os.geteuid() != 0, reason="root writing into a user's home: needs root")
@pytest.mark.parametrize("after", [1, 2])
def test_a_folder_swapped_for_a_link_after_a_write_does_not_get_root_to_write_its_own_file(
    fsroot, tmp_path, after
):
    """The review's repro: after the first write (~/.bashrc), or the second (~/.docker/config.json itself, then
    the read-back and the put-back), alice does `mv ~/.docker ~/.docker-old; ln -s /root/.docker ~/.docker`."""
    home = alice_home(fsroot)
    resume = tmp_path / "resume"
    env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
    env.update(HOME="/home/alice", APEXKIT_TEST_RESUME_FILE=str(resume))
    for name in ("XDG_CONFIG_HOME", "DOCKER_CONFIG"):
        env.pop(name, None)
    run = subprocess.Popen(
        [
            sys.executable,
            str(PAUSE_AFTER_WRITE),
            str(after),
            "-m",
            "invoke",
            "-r",
            str(ROOT),
            "proxy.setup",
            "--root",
            str(fsroot),
            "--no-restart",
            "--http",
            "http://alice-proxy.evil:3128",
            "--layers",
            "shell,container",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert run.stderr is not None
        seen = []
        for line in run.stderr:
            seen.append(line)
            if line.startswith(f"apexkit-test: paused after write {after}"):
                break
        else:
            pytest.fail("".join(seen))
        os.rename(home / ".docker", home / ".docker-old")
        os.symlink(fsroot / "root/.docker", home / ".docker")
        os.lchown(home / ".docker", *ALICE)  # alice's link, as she would make it
        resume.write_text("")
        out, err = run.communicate(timeout=60)
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
    err = "".join(seen) + err
    assert (fsroot / "root/.docker/config.json").read_bytes() == ROOT_DOCKER, (
        err
    )  # root's file unchanged
    assert stat.S_IMODE((fsroot / "root/.docker/config.json").stat().st_mode) == 0o600
    assert sorted(p.name for p in (fsroot / "root/.docker").iterdir()) == [
        "config.json"
    ]  # no temp file
    assert run.returncode != 0 and "Traceback" not in out + err, out + err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and " -- next: " in errors[0], err
    assert (home / ".bashrc").read_bytes() == b"# alice's bashrc\n"  # put back
    if after == 1:  # refused before the write: alice's own file as it was
        assert (home / ".docker-old/config.json").read_bytes() == ALICE_DOCKER
