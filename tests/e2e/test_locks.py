"""apexkit.locks between real processes: a waiter names the holder's pid, a SIGKILLed holder never blocks, re-entry in
one thread is free while another thread waits, and a lock that cannot be created is one line."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, output
from fakes import NOBODY

from apexkit import locks

# Holds the lock on argv[1] ("held" on stdout once it has it), appends "holder done" to argv[2], releases when stdin
# closes.
HOLDER = """
import sys
from pathlib import Path
from apexkit import locks
with locks.hold(Path(sys.argv[1]), "the test thing"):
    print("held", flush=True)
    sys.stdin.read()
    with open(sys.argv[2], "a") as f:
        f.write("holder done\\n")
"""

# Takes the lock on argv[1] (waiting as long as it must), then appends "waiter got it" to argv[2].
WAITER = """
import sys
from pathlib import Path
from apexkit import locks
with locks.hold(Path(sys.argv[1]), "the test thing"):
    with open(sys.argv[2], "a") as f:
        f.write("waiter got it\\n")
"""


def _python(code: str, *args: str, **kw) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", code, *args], cwd=ROOT, text=True, **kw)


def _wait_for_output(proc: subprocess.Popen, expected: str) -> None:
    line = proc.stdout.readline()
    assert line.strip() == expected, line


def test_second_process_waits_naming_the_holder_then_runs_after_it(tmp_path):
    thing, journal = tmp_path / "thing", tmp_path / "journal"
    holder = _python(
        HOLDER, str(thing), str(journal), stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    _wait_for_output(holder, "held")
    waiter = _python(WAITER, str(thing), str(journal), stderr=subprocess.PIPE)
    first = waiter.stderr.readline()  # the one visible line, before it blocks
    assert first.startswith(f"waiting for the lock on the test thing held by pid {holder.pid} ("), (
        first
    )
    assert (
        waiter.poll() is None and not journal.exists()
    )  # still waiting: the holder has not let go
    holder.stdin.close()
    assert holder.wait(60) == 0
    assert waiter.wait(60) == 0, waiter.stderr.read()
    assert journal.read_text() == "holder done\nwaiter got it\n"
    assert (
        locks.lock_file(thing).is_file() and not thing.exists()
    )  # the lock sits beside the thing it guards


def test_a_sigkilled_holder_never_blocks_the_next_one(tmp_path):
    thing = tmp_path / "mirror.git"
    holder = _python(
        HOLDER,
        str(thing),
        str(tmp_path / "journal"),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        start_new_session=True,
    )
    _wait_for_output(holder, "held")
    with pytest.raises(locks.LockError) as exc, locks.hold(
        thing, "the mirror", timeout=0.2
    ):  # it really is held
        pass
    assert exc.value.format().startswith(
        f"the lock on the mirror is still held by pid {holder.pid} after 0.2s"
    )
    os.kill(holder.pid, signal.SIGKILL)
    holder.wait(30)
    assert (
        locks.holder(thing) == holder.pid
    )  # the pid file outlived its writer: only the kernel lock is trusted
    with locks.hold(
        thing, "the mirror", timeout=10
    ):  # not a second of waiting on the dead holder's file
        assert locks.holder(thing) == os.getpid()
    assert locks.holder(thing) is None


# One build's venv step as apexkit/wheel/builder.py does it: under the venv's lock, made only when its ready marker is missing.
VENV_STEP = """
import sys
from pathlib import Path
from apexkit.wheel import venvs
path = Path(sys.argv[1])
print("ready", flush=True)
with venvs.lock(path):
    if (path / "apexkit-ready.json").is_file():
        print("reused", flush=True)
    else:
        venvs.create(sys.executable, path, path.parent / (path.name + ".log"))
        (path / "apexkit-ready.json").write_text("{}")
        print("created", flush=True)
"""


def test_two_builds_share_one_venv_the_second_reuses_it(tmp_path):
    from apexkit.wheel import venvs

    path = tmp_path / "venvs" / "build-py3.11-x"
    with venvs.lock(path):  # a third build holds it: both of these must wait, then take turns
        procs = [
            _python(VENV_STEP, str(path), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            for _ in range(2)
        ]
        for proc in procs:
            assert proc.stdout.readline() == "ready\n"
            line = proc.stderr.readline()
            assert line.startswith(
                f"waiting for the lock on venv {path} held by pid {os.getpid()}"
            ), line
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err[-2000:]
        results.append(out.strip())
    assert sorted(results) == ["created", "reused"]
    probe = subprocess.run(
        [str(path / "bin" / "python"), "-c", "import sys; print(sys.prefix)"],
        capture_output=True,
        text=True,
    )
    assert probe.stdout.strip() == str(path)
    assert sorted(p.name for p in path.parent.iterdir() if p.is_dir()) == ["build-py3.11-x"]


# --- lock files others cannot hold (uid 65534, a real second user) ----------------------------------------------------

# Run as uid 65534: opens argv[1] read-only and flocks it ("held" once it has it, then holds it until stdin closes),
# or prints why it cannot.
OTHER_USER = """
import fcntl, os, sys
try:
    fd = os.open(sys.argv[1], os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
except OSError as exc:
    print(type(exc).__name__, flush=True)
    sys.exit(0)
print("held", flush=True)
sys.stdin.read()
"""

# Takes the lock on argv[1] with FOREIGN_WAIT = argv[2]: "got it", or the error line.
TAKER = """
import sys
from pathlib import Path
from apexkit import locks
locks.FOREIGN_WAIT = float(sys.argv[2])
try:
    with locks.hold(Path(sys.argv[1]), "the mirror"):
        print("got it")
except locks.LockError as exc:
    print(exc.format())
"""


@pytest.fixture
def shared_dir():
    """A folder uid 65534 can reach (pytest's own tmp_path is root's 0700)."""
    import shutil
    import tempfile

    if os.geteuid() != 0:
        pytest.skip("needs root to run a process as uid 65534")
    folder = tempfile.mkdtemp(prefix="apexkit-locks-")
    os.chmod(folder, 0o755)
    yield Path(folder)
    shutil.rmtree(folder)


def _as_nobody(path: Path, **kw) -> subprocess.Popen:
    python = next(
        (p for p in ("/usr/bin/python3", "/usr/local/bin/python3") if os.access(p, os.X_OK)), None
    )
    if python is None:
        pytest.skip("no system python3 that uid 65534 can run")
    return subprocess.Popen(
        [python, "-c", OTHER_USER, str(path)],
        user=NOBODY,
        group=NOBODY,
        extra_groups=[],
        text=True,
        stdout=subprocess.PIPE,
        **kw,
    )


def test_another_user_cannot_open_a_new_lock_file(shared_dir):
    thing = shared_dir / "git" / "mirror.git"
    with locks.hold(thing, "the mirror"):
        pass
    file = locks.lock_file(thing)
    assert stat.S_IMODE(file.stat().st_mode) == 0o600
    other = _as_nobody(file)
    assert other.communicate(timeout=60)[0] == "PermissionError\n"


def test_an_old_0644_lock_file_held_by_another_user_does_not_stall_us(shared_dir):
    thing = shared_dir / "git" / "mirror.git"
    file = locks.lock_file(thing)
    file.parent.mkdir()
    file.write_text("")
    file.chmod(0o644)  # as apexkit made them before
    other = _as_nobody(file, stdin=subprocess.PIPE)
    _wait_for_output(other, "held")
    try:
        taker = subprocess.run(
            [sys.executable, "-c", TAKER, str(thing), "2"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,  # before the fix it waited for as long as the other user liked
        )
    finally:
        other.stdin.close()
        other.wait(30)
    where = f"(uid {NOBODY}, {file})"
    assert taker.stderr.startswith(
        f"waiting for the lock on the mirror held by pid {other.pid} {where}: another user's process, "
        "giving up after 2s\n"
    ), taker.stderr
    assert taker.stdout == (
        f"the lock on the mirror is still held by pid {other.pid} after 2s {where} -- next: stop that process "
        f"of another user, or remove {file} (apexkit makes a new one only you can open)\n"
    )
    assert (
        stat.S_IMODE(file.stat().st_mode) == 0o600
    )  # made private: once let go, it cannot be opened again
    assert _as_nobody(file).communicate(timeout=60)[0] == "PermissionError\n"
    again = subprocess.run(
        [sys.executable, "-c", TAKER, str(thing), "2"], cwd=ROOT, capture_output=True, text=True
    )
    assert again.stdout == "got it\n", output(again)


def test_a_lock_file_owned_by_another_user_is_refused_in_one_line(shared_dir):
    thing = shared_dir / "venvs" / "build-x"
    file = locks.lock_file(thing)
    file.parent.mkdir()
    file.write_text("")
    os.chown(file, NOBODY, NOBODY)
    with pytest.raises(locks.LockError) as exc, locks.hold(thing, "venv build-x"):
        pass
    assert exc.value.format() == (
        f"the lock file for venv build-x is owned by uid {NOBODY}: not using it ({file}) -- next: remove that "
        "file (apexkit makes a new one only you can open), then run again"
    )
