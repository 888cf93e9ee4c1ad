"""Taking files back from places other code can write: a container's workspace, the shared wheel cache, an index
folder, apexkit's own state, a log path.

Such a place may hold symlinks (aimed at /root/.ssh/id_rsa or /etc/cron.d), FIFOs, `../` names or a text file called
`x.whl`. `open_regular` is apexkit's one way to open such a file: relative to an already opened directory or by
path, without following links (unless asked), and with the type checked on the open descriptor (fstat of an
O_NOFOLLOW descriptor is the lstat, without the race); `read_regular` adds a size cap. A wheel is copied and hashed in
one pass, so what was checked is what was copied.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import re
import stat
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import TextIO

from packaging.utils import parse_wheel_filename

_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_NOCTTY = getattr(os, "O_NOCTTY", 0)


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


@contextlib.contextmanager
def opened_dir(name: str | Path, dir_fd: int | None = None) -> Iterator[int]:
    """`open_dir` for the length of a `with` block: the descriptor is closed after it."""
    fd = open_dir(name, dir_fd)
    try:
        yield fd
    finally:
        os.close(fd)


class Refused(Untrusted):
    """`open_regular` / `read_regular` refused a path: `kind` says why -- "link" (a symbolic link), "type" (not a
    regular file; `mode` holds its type bits where known), "links" (hard-linked elsewhere), "size" (over `limit`), or
    "os" (the open itself failed; `error` is that OSError, whose errno tells a missing file apart). Callers turn it
    into their own one-line error."""

    def __init__(
        self, name: str, kind: str, *, mode: int = 0, limit: int = 0, error: OSError | None = None
    ) -> None:
        self.name, self.kind, self.mode, self.limit, self.error = name, kind, mode, limit, error
        self.errno = error.errno if error is not None else None
        self.strerror = (error.strerror or str(error)) if error is not None else ""
        super().__init__(f"{shown(name)} {self.why}")

    @property
    def why(self) -> str:
        if self.kind == "link":
            return "is a symbolic link"
        if self.kind == "type":
            return "is not a regular file"
        if self.kind == "links":
            return "is hard-linked elsewhere"
        if self.kind == "size":
            return (
                f"is larger than {self.limit >> 20} MiB"
                if self.limit >= 1 << 20
                else f"is larger than {self.limit} bytes"
            )
        return f"is {(self.strerror or 'unreadable').lower()}"


def file_kind(mode: int) -> str:
    """What a stat's mode says a file is, for a message: "a named pipe", "a directory", ..."""
    for test, name in (
        (stat.S_ISFIFO, "a named pipe"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISLNK, "a symbolic link"),
    ):
        if test(mode):
            return name
    return "not a regular file"


def open_regular(
    path: str | os.PathLike[str],
    dir_fd: int | None = None,
    *,
    follow: bool = False,
    write: bool = False,
    one_link: bool = False,
) -> int:
    """A descriptor of the regular file `path` (relative to `dir_fd` when given), else `Refused`.

    The one way apexkit opens a file another party may have placed: never a symbolic link at the last step unless
    `follow` (O_NOFOLLOW), never a FIFO, device, socket or directory -- looked at with a stat before the open, so a
    device is never opened, and checked again on the descriptor (O_NONBLOCK: a FIFO swapped in between does not
    block the open; the fstat is what counts). `write`: for writing, created 0644 when missing, never truncated here
    (the caller truncates once the checks passed). `one_link`: refused when hard-linked elsewhere. The descriptor is
    blocking again when returned."""
    name = os.fspath(path)
    try:
        st: os.stat_result | None = os.stat(path, dir_fd=dir_fd, follow_symlinks=follow)
    except FileNotFoundError as exc:
        if not write:
            raise Refused(name, "os", error=exc) from exc
        st = None
    except OSError as exc:
        raise Refused(name, "os", error=exc) from exc
    if st is not None and stat.S_ISLNK(st.st_mode):
        raise Refused(name, "link")
    if st is not None and not stat.S_ISREG(st.st_mode):
        raise Refused(name, "type", mode=st.st_mode)
    flags = (
        (os.O_WRONLY | os.O_CREAT if write else os.O_RDONLY) | os.O_NONBLOCK | _NOCTTY | _CLOEXEC
    )
    if not follow:
        flags |= os.O_NOFOLLOW
    try:
        fd = os.open(path, flags, 0o644, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno == errno.ELOOP and not follow:
            raise Refused(name, "link") from exc
        if exc.errno in (
            errno.EISDIR,
            errno.ENXIO,
        ):  # swapped in since the stat: a directory, a FIFO or socket
            raise Refused(
                name, "type", mode=stat.S_IFDIR if exc.errno == errno.EISDIR else 0
            ) from exc
        raise Refused(name, "os", error=exc) from exc
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise Refused(name, "type", mode=st.st_mode)
        if one_link and st.st_nlink != 1:
            raise Refused(name, "links")
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_log(path: str | os.PathLike[str]) -> TextIO:
    """`path` written afresh as a text log: only a regular file with one link (`open_regular`: a link, FIFO or hard
    link planted there is `Refused`, never written through), truncated once it passed, line-buffered."""
    fd = open_regular(path, write=True, one_link=True)
    os.ftruncate(fd, 0)
    return os.fdopen(fd, "w", buffering=1, encoding="utf-8", errors="backslashreplace")


def read_regular(
    path: str | os.PathLike[str], dir_fd: int | None, limit: int, *, follow: bool = False
) -> bytes:
    """The bytes of the regular file `path` (as `open_regular` opens it), refusing more than `limit`."""
    name = os.fspath(path)
    fd = open_regular(path, dir_fd, follow=follow)
    with os.fdopen(fd, "rb") as fh:
        if os.fstat(fd).st_size > limit:
            raise Refused(name, "size", limit=limit)
        try:
            data = fh.read(limit + 1)
        except OSError as exc:
            raise Refused(name, "os", error=exc) from exc
    if len(data) > limit:
        raise Refused(name, "size", limit=limit)
    return data


def read_json_object(
    path: str | os.PathLike[str], dir_fd: int | None, limit: int, what: str | None = None
) -> dict:
    """The JSON object in the regular file `path` (as `read_regular` reads it): Untrusted when it is not JSON or
    not an object. `what` names it in the message (default: the file's name)."""
    shown_as = what or shown(os.fspath(path))
    try:
        data = json.loads(read_regular(path, dir_fd, limit).decode("utf-8"))
    except ValueError as exc:
        raise Untrusted(f"{shown_as} is not JSON ({exc})") from None
    if not isinstance(data, dict):
        raise Untrusted(f"{shown_as} is not a JSON object")
    return data


def sha256_digest(value: object) -> str:
    """A sha256 hex digest another party gives, lower-cased, or "" (anything else it sends is not a digest)."""
    return (
        value.lower() if isinstance(value, str) and re.fullmatch(r"[0-9a-fA-F]{64}", value) else ""
    )


def wheel_name(name: object, what: str = "wheel.file") -> str:
    """A plain basename that is a valid wheel filename (`what` names it in the error), or Untrusted."""
    if not isinstance(name, str):
        raise Untrusted(f"{what} is a {shown(name)}, not a file name")
    if (
        name in ("", ".", "..")
        or "/" in name
        or "\\" in name
        or "\0" in name
        or name != name.strip()
        or not name.isprintable()
        or not name.endswith(".whl")
    ):
        raise Untrusted(f"{what} {shown(name)} is not a plain *.whl file name")
    try:
        parse_wheel_filename(name)
    except (
        ValueError
    ) as exc:  # InvalidWheelFilename, InvalidVersion, or a version over int's digit limit
        raise Untrusted(f"{what} {shown(name)} is not a valid wheel file name ({exc})") from exc
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


ZIP_TOTAL_MAX = 8 << 30  # bytes uncompressed: apex wheels are tens of MiB; torch's own, about 2 GiB
ZIP_RATIO_MAX = (
    200  # uncompressed : compressed, for a member over ZIP_RATIO_FROM (real .so files: 3-10)
)
ZIP_RATIO_FROM = 64 << 20


def _zip_bomb(infos: list, total_max: int) -> str | None:
    """Why the archive's own header sizes make it a zip bomb, before anything is decompressed; None when they don't."""
    total = 0
    for info in infos:
        total += info.file_size
        if info.file_size > ZIP_RATIO_FROM and info.file_size > ZIP_RATIO_MAX * max(
            info.compress_size, 1
        ):
            return (
                f"member {shown(info.filename)} expands {info.compress_size} bytes to {info.file_size}, "
                f"more than {ZIP_RATIO_MAX}:1 (a zip bomb, not a wheel)"
            )
    if total > total_max:
        return (
            f"its members expand to {total / 2**30:.1f} GiB, more than {total_max / 2**30:.0f} GiB "
            "(a zip bomb, not a wheel)"
        )
    return None


def check_zip(path: Path, total_max: int = ZIP_TOTAL_MAX) -> None:
    """A wheel is a zip whose members all read back with their CRC (zipfile.testzip), or Untrusted. Refused before
    any member is decompressed: a total uncompressed size over `total_max`, or a member over 64 MiB that expands more
    than 200:1 (the header sizes are checked again by zipfile while it reads: a member cannot expand past them)."""
    try:
        with zipfile.ZipFile(path) as zf:
            bomb = _zip_bomb(zf.infolist(), total_max)
            bad = None if bomb is not None else zf.testzip()
    except (
        zipfile.BadZipFile,
        OSError,
        EOFError,
        ValueError,
    ) as exc:  # ValueError: e.g. bad compression header
        raise Untrusted(f"{shown(path.name)} is not a readable zip archive ({exc})") from exc
    except (
        Exception
    ) as exc:  # zlib.error, NotImplementedError (unknown compression): still not a wheel we made
        raise Untrusted(
            f"{shown(path.name)} is not a readable zip archive ({type(exc).__name__})"
        ) from exc
    if bomb is not None:
        raise Untrusted(f"{shown(path.name)}: {bomb}")
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
