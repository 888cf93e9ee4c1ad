"""Locks between processes on the things builds share: a git mirror, a build venv, a wheel-cache entry,
build/<target>, dist/<target>.

    from apexkit import locks

    with locks.hold(mirror_dir, "git mirror Ascend-apex"):
        ...  # only one process (and one thread) at a time gets here for this path

- The lock is `<path>.lock` next to `path` (the directory holding it is created), taken with filelock's kernel lock
  (flock): a holder that dies, even by SIGKILL, releases it with its last file descriptor, so a stale lock never
  blocks. The file itself stays (unlinking a lock file splits later waiters across two inodes).
- Whoever has to wait prints one line first: "waiting for the lock on <what> held by pid N" (the holder writes its
  pid into `<path>.lock.pid`). After the wait, check again whether the other process already did the work (a venv
  with its ready marker, a wheel now in the cache) before doing it again.
- Re-entrant in one thread (an inner `hold` on the same path is free); another thread of the same process waits
  like another process.
- `timeout` (seconds; None waits for as long as the holder lives) ends in LockError, one line naming the pid;
  so does a lock file that cannot be created. `wait=False` does not wait at all: a held lock is `Busy` at once,
  with no waiting line (the caller says what is running).
"""

from __future__ import annotations

import contextlib
import os
import stat
import threading
from collections.abc import Iterator
from pathlib import Path

from filelock import FileLock, Timeout

from apexkit import cachetrust, log
from apexkit.errors import ApexkitError


class LockError(ApexkitError):
    """A lock could not be taken: held past the timeout, or its file cannot be created."""

    exit_code = 1


class Busy(LockError):
    """`hold(..., wait=False)` found the lock held; `pid` is the holder's where known."""

    def __init__(self, cause: str, hint: str = "", pid: int | None = None) -> None:
        super().__init__(cause, hint)
        self.pid = pid


_registry: dict[str, FileLock] = {}
_registry_guard = threading.Lock()


def lock_file(path: Path) -> Path:
    """The lock file that guards `path`: `<path>.lock`, a sibling (so `path` itself may be replaced or removed)."""
    return path.with_name(path.name + ".lock")


def _lock_for(file: Path) -> FileLock:
    # One FileLock per path and process: its per-thread counter makes re-entry free, while the flock on separate
    # descriptors keeps other threads (and processes) out.
    key = os.path.abspath(str(file))
    with _registry_guard:
        lock = _registry.get(key)
        if lock is None:
            lock = _registry[key] = FileLock(key, thread_local=True, mode=0o644)
        return lock


def holder(path: Path) -> int | None:
    """The pid the last holder of `path`'s lock wrote (None: unknown). Only meaningful while the lock is held."""
    try:  # not through a link, nor waiting on a FIFO planted there
        fd = os.open(str(lock_file(path)) + ".pid", os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        try:
            text = os.read(fd, 32).decode().strip() if stat.S_ISREG(os.fstat(fd).st_mode) else ""
        finally:
            os.close(fd)
    except (OSError, UnicodeDecodeError):
        return None
    return int(text) if text.isdigit() else None


def _write_pid(pid_file: Path) -> None:
    """Our pid into `<lock>.pid`, 0644 whatever the umask, never through what someone planted there: a symlink is
    not followed (O_NOFOLLOW fails), a FIFO not waited on (O_NONBLOCK), a hard link to another file or anything
    but a plain file not truncated (checked before the truncation O_TRUNC would have done at open)."""
    fd = os.open(pid_file, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK, 0o644)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
            return
        os.ftruncate(fd, 0)
        os.fchmod(fd, 0o644)
        os.write(fd, f"{os.getpid()}\n".encode())
    finally:
        os.close(fd)


@contextlib.contextmanager
def hold(path: Path, what: str, timeout: float | None = None, wait: bool = True) -> Iterator[None]:
    """Hold the lock on `path` (a file or directory that need not exist) for the `with` block; see the module doc."""
    file = lock_file(Path(path))
    lock = _lock_for(file)
    pid_file = Path(str(file) + ".pid")
    reentered = lock.is_locked
    try:
        cachetrust.make_dir(
            file.parent
        )  # 0755 whatever the umask (filelock's own mkdir follows it)
        try:
            lock.acquire(timeout=0)
        except Timeout:
            pid = holder(Path(path))
            if not wait:
                raise Busy(
                    f"the lock on {what} is held by {f'pid {pid}' if pid else 'another process'} ({file})",
                    "wait for that process to finish",
                    pid,
                ) from None
            log.info(
                f"waiting for the lock on {what} held by {f'pid {pid}' if pid else 'another process'} ({file})"
            )
            try:
                lock.acquire(timeout=-1 if timeout is None else timeout)
            except Timeout:
                pid = holder(Path(path))
                raise LockError(
                    f"the lock on {what} is still held by {f'pid {pid}' if pid else 'another process'} after "
                    f"{timeout:g}s ({file})",
                    "wait for that process to finish, or stop it (a killed holder releases the lock)",
                ) from None
    except OSError as exc:  # the directory is not writable, or is not a directory
        raise LockError(
            f"cannot take the lock on {what}: {file}: {exc.strerror or exc}",
            "make that directory writable by you, or point APEXKIT_CACHE_DIR / --build-dir / "
            "--dist elsewhere",
        ) from None
    try:
        if not reentered:
            with contextlib.suppress(OSError):
                _write_pid(pid_file)
        yield
    finally:
        if (
            not reentered
        ):  # cleared while still held: a stale pid never names the next holder's predecessor
            with contextlib.suppress(OSError):
                pid_file.unlink()
        lock.release()
