"""Locks between processes on the things builds share: a git mirror, a build venv, a wheel-cache entry,
build/<target>, dist/<target>.

    from apexkit import locks

    with locks.hold(mirror_dir, "git mirror Ascend-apex"):
        ...  # only one process (and one thread) at a time gets here for this path

- The lock is `<path>.lock` next to `path` (the directory holding it is created), taken with filelock's kernel lock
  (flock): a holder that dies, even by SIGKILL, releases it with its last file descriptor, so a stale lock never
  blocks. The file itself stays (unlinking a lock file splits later waiters across two inodes).
- The lock file is 0600: a flock needs only a read-only descriptor, so a file others could open would let them stall
  us. An older one of ours that others can open is made 0600; one owned by another uid is refused in one line
  (the cache trust rule).
- Whoever has to wait prints one line first: "waiting for the lock on <what> held by pid N (uid U, <lock file>)"
  (the kernel's /proc/locks names the holder; else the pid the holder wrote into `<path>.lock.pid`). After the wait,
  check again whether the other process already did the work (a venv with its ready marker, a wheel now in the
  cache) before doing it again.
- A holder of another uid (one who opened the file before it was made 0600) is waited on for FOREIGN_WAIT seconds
  at most, whatever `timeout` says, then LockError names it and the fix.
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


FOREIGN_WAIT = 60.0  # seconds a lock held by another uid's process is waited on before LockError
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
            lock = _registry[key] = FileLock(key, thread_local=True, mode=0o600)
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


def _flock_holder(file: Path) -> tuple[int, int | None] | None:
    """(pid, uid or None) of the process holding the kernel lock on `file`, read from /proc/locks (Linux)."""
    try:
        st = os.stat(file)
        with open("/proc/locks", encoding="ascii", errors="replace") as fh:
            rows = [line.split() for line in fh]
    except OSError:
        return None
    dev = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    for row in (
        rows
    ):  # "1: FLOCK  ADVISORY  WRITE 1234 fd:01:5678 0 EOF" (a waiter's row has "->" in row[1])
        if (
            len(row) > 5
            and row[1] == "FLOCK"
            and row[5] == dev
            and row[4].isdigit()
            and row[4] != "0"
        ):
            try:
                return int(row[4]), os.stat(f"/proc/{row[4]}").st_uid
            except OSError:
                return int(row[4]), None
    return None


def _who(path: Path, file: Path) -> tuple[str, str, int | None, bool]:
    """How the waiting and error lines name the holder: ("pid N" or "another process", "(uid U, <file>)", the pid,
    whether it is another user's)."""
    found = _flock_holder(file)
    pid, uid = found if found else (holder(path), None)
    where = f"({'' if uid is None else f'uid {uid}, '}{file})"
    return (f"pid {pid}" if pid else "another process"), where, pid, uid not in (None, os.geteuid())


def _private(file: Path, what: str) -> None:
    """An existing lock file of ours that others can open becomes 0600; one of another uid is refused."""
    try:
        st = os.lstat(file)
    except OSError:
        return  # none yet (filelock makes it 0600), or filelock's own open says why
    if st.st_uid not in (os.geteuid(), 0):
        raise LockError(
            f"the lock file for {what} is owned by uid {st.st_uid}: not using it ({file})",
            "remove that file (apexkit makes a new one only you can open), then run again",
        )
    if stat.S_ISREG(st.st_mode) and st.st_mode & 0o077 and st.st_uid == os.geteuid():
        os.chmod(file, 0o600)


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


def _wait(
    lock: FileLock, path: Path, file: Path, what: str, timeout: float | None, wait: bool
) -> None:
    """The lock is held: Busy (not `wait`), or one line, then wait up to `timeout` (FOREIGN_WAIT at most for a
    holder of another uid) or LockError."""
    who, where, pid, foreign = _who(path, file)
    if not wait:
        raise Busy(
            f"the lock on {what} is held by {who} {where}", "wait for that process to finish", pid
        )
    if foreign:
        timeout = FOREIGN_WAIT if timeout is None else min(timeout, FOREIGN_WAIT)
    log.info(
        f"waiting for the lock on {what} held by {who} {where}"
        + (f": another user's process, giving up after {timeout:g}s" if foreign else "")
    )
    try:
        lock.acquire(timeout=-1 if timeout is None else timeout)
    except Timeout:
        who, where, pid, foreign = _who(path, file)
        raise LockError(
            f"the lock on {what} is still held by {who} after {timeout:g}s {where}",
            (
                f"stop that process of another user, or remove {file} (apexkit makes a new one only you can open)"
                if foreign
                else "wait for that process to finish, or stop it (a killed holder releases the lock)"
            ),
        ) from None


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
        _private(file, what)
        try:
            lock.acquire(timeout=0)
        except Timeout:
            _wait(lock, Path(path), file, what, timeout, wait)
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
