"""Taking files back from places other code can write: a container's workspace, the shared wheel cache.

Such a place may hold symlinks (aimed at /root/.ssh/id_rsa or /etc/cron.d), FIFOs, `../` names or a text file called
`x.whl`. Everything here opens relative to an already opened directory, without following links, and checks the
type on the open descriptor (fstat of an O_NOFOLLOW descriptor is the lstat, without the race); a wheel is copied and
hashed in one pass, so what was checked is what was copied.
"""

from __future__ import annotations

import errno
import hashlib
import os
import stat
import zipfile
from pathlib import Path

from packaging.utils import InvalidWheelFilename, parse_wheel_filename

_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


class Untrusted(Exception):
    """What another party left is not what it claims to be (callers turn it into their one-line error)."""


def shown(name: object) -> str:
    """A name another party chose, safe to print on one line (control characters escaped, length bounded)."""
    text = ascii(name) if isinstance(name, str) else type(name).__name__
    return text if len(text) <= 120 else text[:117] + "..."


def open_dir(name: str | Path, dir_fd: int | None = None) -> int:
    try:
        return os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | _CLOEXEC, dir_fd=dir_fd)
    except OSError as exc:
        raise Untrusted(f"{shown(str(name))} is not a directory (a symlink or other file)") from exc


def open_regular(name: str, dir_fd: int) -> int:
    """Read-only fd of the regular file `name` directly in dir_fd: no symlink, no FIFO or device."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | _CLOEXEC, dir_fd=dir_fd)
    except OSError as exc:
        what = "a symbolic link" if exc.errno == errno.ELOOP else (exc.strerror or "unreadable").lower()
        raise Untrusted(f"{shown(name)} is {what}") from exc
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise Untrusted(f"{shown(name)} is not a regular file")
    return fd


def read_regular(name: str, dir_fd: int, limit: int) -> bytes:
    """The bytes of the regular file `name` in dir_fd, refusing more than `limit`."""
    fd = open_regular(name, dir_fd)
    with os.fdopen(fd, "rb") as fh:
        data = fh.read(limit + 1)
    if len(data) > limit:
        raise Untrusted(f"{shown(name)} is larger than {limit >> 20} MiB")
    return data


def wheel_name(name: object) -> str:
    """A plain basename that is a valid wheel filename, or Untrusted."""
    if not isinstance(name, str):
        raise Untrusted(f"wheel.file is a {shown(name)}, not a file name")
    if (name in ("", ".", "..") or "/" in name or "\\" in name or "\0" in name or name != name.strip()
            or not name.endswith(".whl")):
        raise Untrusted(f"wheel.file {shown(name)} is not a plain *.whl file name")
    try:
        parse_wheel_filename(name)
    except InvalidWheelFilename as exc:
        raise Untrusted(f"wheel.file {shown(name)} is not a valid wheel file name ({exc})") from exc
    return name


def copy_fd(src: int, dest: Path, mode: int = 0o644) -> tuple[str, int]:
    """Copy the open file `src` into a new file `dest` (never an existing one), hashing what was copied."""
    digest, size = hashlib.sha256(), 0
    out = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | _CLOEXEC, mode)
    with os.fdopen(out, "wb") as fh:
        while True:
            chunk = os.read(src, 1 << 20)
            if not chunk:
                break
            digest.update(chunk)
            fh.write(chunk)
            size += len(chunk)
    os.chmod(dest, mode)
    return digest.hexdigest(), size


def check_zip(path: Path) -> None:
    """A wheel is a zip whose members all read back with their CRC (zipfile.testzip), or Untrusted."""
    try:
        with zipfile.ZipFile(path) as zf:
            bad = zf.testzip()
    except (zipfile.BadZipFile, OSError, EOFError, ValueError) as exc:  # ValueError: e.g. bad compression header
        raise Untrusted(f"{shown(path.name)} is not a readable zip archive ({exc})") from exc
    except Exception as exc:  # zlib.error, NotImplementedError (unknown compression): still not a wheel we made
        raise Untrusted(f"{shown(path.name)} is not a readable zip archive ({type(exc).__name__})") from exc
    if bad is not None:
        raise Untrusted(f"{shown(path.name)}: member {shown(bad)} fails its CRC check")


def sha256_file(path: Path) -> str:
    """sha256 of a file the host itself wrote (a wheel it built): read in 1 MiB chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def others_can_write(st: os.stat_result) -> str | None:
    """Why a directory with this stat can be changed by someone other than us (or root), else None."""
    me = os.geteuid()
    if st.st_uid not in (me, 0):
        return f"owned by uid {st.st_uid}"
    if st.st_mode & 0o002:
        return "world-writable"
    if st.st_mode & 0o020 and not _private_group(st):
        return "group-writable"
    return None


def _private_group(st: os.stat_result) -> bool:
    """The group is the owner's own (user private groups: Debian/Ubuntu's default umask 002 makes every folder
    group-writable, and nobody else is in that group)."""
    try:
        import grp
        import pwd

        group, owner = grp.getgrgid(st.st_gid), pwd.getpwuid(st.st_uid)
    except (ImportError, KeyError):
        return False
    return owner.pw_gid == st.st_gid and group.gr_name == owner.pw_name and not group.gr_mem
