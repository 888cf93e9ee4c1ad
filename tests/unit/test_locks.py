"""apexkit.locks in one process: re-entry in one thread is free while another thread waits, a lock that cannot be
created is one line, the lock file's name. Locks between real processes are in tests/e2e/test_locks.py."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from apexkit import locks
from apexkit.errors import ApexkitError


def _wait_until(condition, what: str, seconds: float = 60.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        time.sleep(0.05)


def test_reentry_in_one_thread_is_free_while_another_thread_waits(tmp_path, capsys):
    thing = tmp_path / "venv"
    order = []
    with locks.hold(thing, "the venv"):
        with locks.hold(thing, "the venv", timeout=0):  # same thread: no wait, no deadlock
            order.append("inner")

        def other() -> None:
            with locks.hold(thing, "the venv"):
                order.append("thread")

        worker = threading.Thread(target=other)
        worker.start()
        _wait_until(
            lambda: "waiting for the lock on the venv" in capsys.readouterr().err,
            "the thread to wait",
        )
        order.append("outer done")
    worker.join(30)
    assert order == ["inner", "outer done", "thread"]


def test_a_lock_that_cannot_be_created_is_one_line(tmp_path):
    blocker = tmp_path / "cache"
    blocker.write_text("a file where a directory should be")
    with pytest.raises(ApexkitError) as exc, locks.hold(
        blocker / "git" / "x.git", "git mirror x.git"
    ):
        pass
    line = exc.value.format()
    assert "\n" not in line and line.startswith("cannot take the lock on git mirror x.git:")
    assert "-- next: make that directory writable" in line


def test_lock_file_is_a_sibling_named_after_the_path():
    assert locks.lock_file(Path("/c/git/a.git")) == Path("/c/git/a.git.lock")
