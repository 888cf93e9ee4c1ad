"""apexkit.locks between real processes: a waiter names the holder's pid, a SIGKILLed holder never blocks, re-entry in
one thread is free while another thread waits, and a lock that cannot be created is one line."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest
from conftest import ROOT

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
