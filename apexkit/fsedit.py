"""Careful edits of user and system files: plan -> diff -> preflight -> atomic write with backups -> undo.

Every writer in apexkit goes through here, so each one gets the same guarantees:
- `--dry-run` shows unified diffs (passwords masked) and writes nothing;
- a preflight checks every target is writable before the first byte is written;
- writes are atomic (temp file in the same directory + rename), with the final mode set before the rename;
- the first time apexkit touches a file, its original bytes and mode are kept in a backup store, so `remove`
  restores the file byte for byte when nobody edited it since, and undoes only our part otherwise (an edit made
  between two setups counts: the record remembers it);
- if a write fails half-way, the files already written are put back;
- write-ahead: a file's backup and manifest record are on disk before it is replaced, so a setup killed at any
  point is undone by `remove`, and a rerun never adopts a half-configured file as the original;
- a symbolic link is followed (its target edited in place, atomically; the link stays a link), except out of the
  --root, or -- as root -- a user's link (on the file or on a folder above it) into what that user does not own;
- only regular files of at most 16 MiB are read, without blocking (a named pipe or /dev/zero is one line), and JSON
  nested deeper than any config (64 levels) is refused in one line;
- text is read with surrogateescape (a GBK or Latin-1 byte comes back as it was); managed-block markers that do
  not pair up are refused, never guessed;
- as root in a user's home, what apexkit creates there belongs to that home's owner;
- `remove` undoes each file on its own (one broken file does not stop the others) and takes away the folders
  apexkit made and, once empty, its own state.
"""

from __future__ import annotations

import contextlib
import ctypes
import difflib
import errno
import hashlib
import json
import os
import re
import secrets
import shutil
import stat
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import NoReturn

from apexkit import log, untrusted
from apexkit.errors import ConfigError, EnvironmentSetupError


def read_bytes(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except (FileNotFoundError, NotADirectoryError):
        return None


def sha256(data: bytes | None) -> str | None:
    return None if data is None else hashlib.sha256(data).hexdigest()


def file_mode(path: Path) -> int | None:
    try:
        return path.stat().st_mode & 0o7777
    except (FileNotFoundError, NotADirectoryError):
        return None


def _open_parent(path: Path, nofollow: bool) -> int:
    """A descriptor of `path`'s folder. With `nofollow` it is opened one folder at a time from / with O_NOFOLLOW: a
    folder on the way that is (now) a symbolic link, or not a folder, fails with ELOOP or ENOTDIR instead of being
    followed."""
    flags = os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_CLOEXEC", 0)
    if not nofollow:
        return os.open(path.parent, flags)
    flags |= getattr(os, "O_NOFOLLOW", 0)
    fd = os.open("/", flags)
    try:
        for part in _parts(os.path.normpath(os.path.abspath(path.parent))):
            # on a failure `fd` is still the one above, closed below
            fd, above = os.open(part, flags, dir_fd=fd), fd
            os.close(above)
    except BaseException as exc:
        os.close(fd)
        if not isinstance(exc, OSError) or exc.errno not in (
            errno.ELOOP,
            errno.ENOTDIR,
            errno.ENOENT,
        ):
            raise
        raise TargetError(
            f"{path.parent} changed while apexkit was writing {path.name}: a folder on the way is now a symbolic "
            "link (or gone); it was not followed",
            "check who changed it, then run again",
        ) from None
    return fd


def atomic_write(
    path: Path,
    data: bytes,
    mode: int,
    owner: tuple[int, int] | None = None,
    nofollow: bool = False,
) -> None:
    """Write `data` to `path` atomically; the file never exists with wider permissions than `mode`. An existing
    file keeps its owner when root writes it; a new one gets `owner` (uid, gid) when given and root writes it.
    `path` is replaced, not followed: callers that edit through a symbolic link pass its target (`write_target`).
    The temporary file, its owner and the rename all work on one descriptor of the parent folder; with `nofollow`
    (a real path, as `write_target` gives) that folder is opened from / without following any link, so a folder
    swapped for a link after the plan (review M5: ~/.docker -> /root/.docker) is refused, never written through."""
    # one mkdir per missing folder: a link put in the place of one is not followed
    make_parents(path)
    directory = _open_parent(path, nofollow)
    name = path.name
    try:
        previous = None
        with contextlib.suppress(FileNotFoundError):
            previous = os.stat(name, dir_fd=directory, follow_symlinks=False)
        flags = (
            os.O_WRONLY
            | os.O_CREAT
            | os.O_EXCL
            | getattr(os, "O_NOFOLLOW", 0)
            | getattr(os, "O_CLOEXEC", 0)
        )
        tmp = f".{name}.{secrets.token_hex(8)}.apexkit-tmp"  # O_EXCL: never an existing file
        fd = os.open(tmp, flags, 0o600, dir_fd=directory)
        try:
            os.fchmod(fd, mode)
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
                handle.flush()
                # as root: keep the owner of a user's file we edit; a new file gets `owner`
                who = (previous.st_uid, previous.st_gid) if previous is not None else owner
                if os.geteuid() == 0 and who is not None:
                    os.fchown(handle.fileno(), *who)
                    # chown clears setgid-like bits; keep the mode exact
                    os.fchmod(handle.fileno(), mode)
                os.fsync(handle.fileno())
            os.replace(tmp, name, src_dir_fd=directory, dst_dir_fd=directory)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp, dir_fd=directory)
            raise
    finally:
        os.close(directory)


def _unlink_nofollow(path: Path) -> None:
    """Delete `path` itself (never what a link leads to) in its parent opened without following links."""
    try:
        directory = _open_parent(path, True)
    except TargetError:
        if not os.path.lexists(path.parent):
            return  # its folder is gone: so is the file
        raise
    try:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path.name, dir_fd=directory)
    finally:
        os.close(directory)


def missing_parents(path: Path) -> list[Path]:
    """The ancestors of `path` that do not exist yet, nearest first."""
    missing = []
    parent = path.parent
    while not os.path.lexists(parent) and parent != parent.parent:
        missing.append(parent)
        parent = parent.parent
    return missing


def make_parents(path: Path, owner: tuple[int, int] | None = None) -> int:
    """Create the missing ancestors of `path`; as root, each new one gets `owner`. Returns how many were made."""
    missing = missing_parents(path)
    for directory in reversed(missing):
        with contextlib.suppress(FileExistsError):
            os.mkdir(directory)
            if owner is not None and os.geteuid() == 0:
                os.chown(
                    directory, *owner, follow_symlinks=False
                )  # a link swapped in: not followed
    return len(missing)


def remove_made_dirs(path: Path, count: object, within: Path | None = None) -> None:
    """Take away the (at most `count`) nearest ancestors of `path` that apexkit made, while they are empty, real
    directories (never a symbolic link) inside `within`."""
    if not isinstance(count, int) or isinstance(count, bool) or count <= 0:
        return
    parent = path.parent
    limit = Path(os.path.realpath(within)) if within is not None else None
    for _ in range(min(count, 16)):
        if limit is not None and (parent == limit or limit not in parent.parents):
            return
        try:
            if not stat.S_ISDIR(os.lstat(parent).st_mode):
                return
            os.rmdir(parent)
        except OSError:
            return
        parent = parent.parent


class TargetError(EnvironmentSetupError):
    """A file a writer edits is not something it can edit (a directory, a link leading out, unreadable)."""


MAX_READ = 16 * 1024 * 1024  # the largest file a writer reads: a dotfile or a config is far smaller


def _parts(text: str) -> list[str]:
    return [part for part in text.split("/") if part not in ("", ".")]


def resolve_links(path: Path) -> tuple[Path, list[tuple[Path, int, Path]]]:
    """Resolve `path` one component at a time, as the kernel does. Returns the real path and every symbolic link
    met on the way -- in the folders above the file as well as the file itself: (the link, its owner's uid, the
    real path it leads to). A path below a missing folder is completed as written."""
    absolute = str(path) if str(path).startswith("/") else os.path.join(os.getcwd(), str(path))
    pending: list[object] = list(reversed(_parts(absolute)))
    opened: list[list] = []  # [link, uid, where it leads], in the order met
    current, exists = Path("/"), True
    while pending:
        item = pending.pop()
        if isinstance(
            item, int
        ):  # the end of a link's own target: `current` is where that link leads
            opened[item][2] = current
            continue
        name = str(item)
        if name == "..":
            current = current.parent
            continue
        candidate = current / name
        if exists:
            try:
                st = os.lstat(candidate)
            except OSError:
                exists = False
            else:
                if stat.S_ISLNK(st.st_mode):
                    if len(opened) >= 40:  # the 41st link on one path
                        raise TargetError(
                            f"{path} goes through too many symbolic links (a loop?); nothing was changed",
                            "fix the links on that path, then run again",
                        )
                    text = os.readlink(candidate)
                    opened.append([candidate, st.st_uid, None])
                    pending.append(len(opened) - 1)
                    pending.extend(reversed(_parts(text)))
                    if text.startswith("/"):
                        current = Path("/")
                    continue
        current = candidate
    return current, [
        (link, uid, where if where is not None else current) for link, uid, where in opened
    ]


def write_target(path: Path, display: str, within: Path | None = None) -> Path:
    """The file a writer really edits for `path`: itself, or -- when it (or a folder above it) is a symbolic link --
    the link's target, so that an atomic rename edits the dotfiles repository's file and leaves the link a link.
    With `within` (a --root), a target outside it is refused: following the link would leave the managed tree.
    As root, a link of a user (the file's or a folder's above it) that leads into what that user does not own is
    refused (`check_links`)."""
    target, links = resolve_links(path)
    if within is not None and str(within) != "/":
        limit = Path(os.path.realpath(within))
        written, tree = (Path(os.path.normpath(os.path.abspath(p))) for p in (path, within))
        if written != tree and tree not in written.parents:
            raise TargetError(
                f"{display} lies outside {within}: its '..' climbs out of the managed tree; nothing was "
                "changed",
                f"give a path inside {within} without '..', or run without --root",
            )
        if target != limit and limit not in target.parents:
            raise TargetError(
                f"{display} is a symbolic link to {target}, outside {within}: following it would edit a file outside "
                "the managed tree; nothing was changed",
                "replace the link with a copy of its file, or run without --root",
            )
    check_links(path, display, links)
    if os.path.islink(path) and not os.path.lexists(target):
        raise TargetError(
            f"{display} is a symbolic link to {target}, which does not exist; nothing was changed",
            f"create {target} (or remove the link), then run again",
        )
    with contextlib.suppress(OSError):
        mode = os.stat(target).st_mode
        if stat.S_ISDIR(mode):
            raise TargetError(
                f"{display} is a directory, not a file; nothing was changed",
                f"move {display} away, then run again",
            )
        if not stat.S_ISREG(mode):
            raise TargetError(
                f"{display} is {untrusted.file_kind(mode)}, not a regular file: apexkit edits only regular files; "
                "nothing was changed",
                f"replace {display} with a regular file (or move it away), then run again",
            )
    return target


def nearest_owner(path: Path) -> int | None:
    for candidate in (path, *path.parents):
        try:
            return os.stat(candidate).st_uid
        except (FileNotFoundError, NotADirectoryError):
            continue
    return None


def check_links(
    path: Path, display: str, links: list[tuple[Path, int, Path]] | None = None
) -> None:
    """Root follows a user's link only into that user's own files (as the kernel's protected_symlinks does for
    sticky folders): a ~/.bashrc linked to /etc/shadow must not get the proxy block appended as root, nor a ~/.docker
    linked to /root/.docker have root's registry logins copied into the user's backups. This holds for every link
    on the way, the folders above the file included; root's own links are followed."""
    if os.geteuid() != 0:
        return
    for link, uid, target in resolve_links(path)[1] if links is None else links:
        if uid == 0 or (owner := nearest_owner(target)) == uid:  # root's own links are followed
            continue
        whose = _user_name(owner if owner is not None else -1)
        where = (
            f"{display} is a symbolic link of {_user_name(uid)}"
            if link == Path(os.path.abspath(path))
            else f"{display} lies under {link}, a symbolic link of {_user_name(uid)}"
        )
        raise TargetError(
            f"{where} to {target}, which belongs to {whose}: root does not follow it; nothing was "
            "changed",
            f"point the link at a file or folder of {_user_name(uid)}, or run as them "
            "(without sudo)",
        )


def read_regular(
    path: Path,
    display: str,
    error: type[EnvironmentSetupError] | type[ConfigError] | None = None,
    hint: str = "run as the user who owns it (or with sudo for system files)",
) -> bytes | None:
    """The bytes of a regular file of at most MAX_READ bytes, through a link, read without blocking (a named pipe, a
    device such as /dev/zero, or a huge file is one line, never a hang or a MemoryError); None when it does not
    exist."""
    error = error or TargetError
    try:
        return untrusted.read_regular(path, None, MAX_READ, follow=True)
    except untrusted.Refused as exc:
        if exc.errno in (errno.ENOENT, errno.ENOTDIR):
            return None
        _refused(
            exc,
            error,
            {
                "size": (
                    f"{display} is larger than {MAX_READ >> 20} MiB: not a file apexkit edits; nothing was changed",
                    f"check {display} (move it away if it is not yours), then run again",
                ),
                "directory": (
                    f"{display} is a directory, not a file; nothing was changed",
                    f"move {display} away, then run again",
                ),
                "type": (
                    f"{display} is {untrusted.file_kind(exc.mode)}, not a regular file: apexkit reads only regular "
                    "files; nothing was changed",
                    f"replace {display} with a regular file (or move it away), then run again",
                ),
                "os": (f"cannot read {display} ({exc.strerror}); nothing was changed", hint),
            },
        )


def _refused(
    exc: untrusted.Refused,
    error: type[EnvironmentSetupError] | type[ConfigError],
    messages: dict[str, tuple[str, str]],
) -> NoReturn:
    """The caller's one-line error (cause, hint) for why `untrusted` refused a file; "os" for any other reason."""
    kind = exc.kind
    if (
        exc.errno == errno.ENOTDIR and "blocked" in messages
    ):  # a file where a folder of the path belongs
        kind = "blocked"
    elif exc.kind == "type" and stat.S_ISDIR(exc.mode) and "directory" in messages:
        kind = "directory"
    raise error(*messages.get(kind, messages["os"])) from None


# The bytes of a file a writer edits (through a link); None when missing; anything else is one line.
read_target = read_regular


_RENAME_EXCHANGE = 2  # linux/fs.h: swap the two names in one step
_AT_FDCWD = -100  # fcntl.h: names relative to the working directory (they are absolute here)


def _exchange(a: Path, b: Path) -> bool:
    """Swap the names `a` and `b` in one system call (Linux renameat2 RENAME_EXCHANGE). False where the kernel,
    the C library or the file system cannot (the caller falls back); any other failure is raised."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):  # a C library older than glibc 2.28 / musl 1.2.2
        return False
    renameat2.argtypes = [
        ctypes.c_int,
        ctypes.c_char_p,
        ctypes.c_int,
        ctypes.c_char_p,
        ctypes.c_uint,
    ]
    if renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    code = ctypes.get_errno()
    if code in (
        errno.ENOSYS,
        errno.EINVAL,
        errno.EOPNOTSUPP,
    ):  # old kernel, or a file system without it
        return False
    raise OSError(code, os.strerror(code), str(b))


def swap_directory(tmp: Path, final: Path) -> None:
    """Put the fully written directory `tmp` in place of `final` (which may not exist): readers see the old one or
    the new one, never a half-written one, and -- on Linux -- never none: an existing `final` is exchanged with
    `tmp` in one renameat2(RENAME_EXCHANGE), so `final` is a real directory at every moment (a web server, a
    file:// URL or an rsync mirror keeps working; no symbolic link to flip, no versioned folders to collect).
    Elsewhere (or on a file system without it) two renames, with a moment between them without `final`.
    `tmp` must be on the same file system (a sibling)."""
    if os.path.isdir(final) and not os.path.islink(final) and _exchange(tmp, final):
        shutil.rmtree(tmp, ignore_errors=True)  # tmp now holds the old directory
        return
    old = final.with_name(f".{final.name}.old-{os.getpid()}") if final.exists() else None
    if old:
        os.replace(final, old)
    os.replace(tmp, final)
    if old:
        shutil.rmtree(old, ignore_errors=True)


def _writable(path: Path) -> bool:
    if path.exists():
        return path.is_file() and os.access(path, os.W_OK) and os.access(path.parent, os.W_OK)
    parent = next(p for p in path.parents if p.exists())  # the nearest that exists: / at the latest
    return parent.is_dir() and os.access(parent, os.W_OK | os.X_OK)


# ---------------------------------------------------------------------------------------------------------------
# Content transformations (pure)
# ---------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Block:
    """A managed block in a text file, between two marker lines."""

    name: str

    @property
    def begin(self) -> str:
        return f"# >>> {self.name} >>>"

    @property
    def end(self) -> str:
        return f"# <<< {self.name} <<<"

    def render(self, lines: Iterable[str], comment: str = "") -> str:
        return (
            "\n".join([self.begin, *([f"# {comment}"] if comment else []), *lines, self.end]) + "\n"
        )

    def _span(self, text: str, display: str = "the file") -> tuple[int, int] | None:
        """Where our block is: exactly one begin line followed by one end line, or none of either. Anything else
        (an orphan marker left by a hand edit, a duplicated block) is refused: a span between markers that do not
        pair up would cover lines apexkit did not write."""
        begins = [m for m in re.finditer(rf"(?m)^{re.escape(self.begin)}[^\n]*$", text)]
        ends = [m for m in re.finditer(rf"(?m)^{re.escape(self.end)}[^\n]*(?:\n|\Z)", text)]
        if not begins and not ends:
            return None
        if len(begins) == 1 and len(ends) == 1 and begins[0].start() < ends[0].start():
            return begins[0].start(), ends[0].end()

        def line(match: re.Match) -> int:
            return text.count("\n", 0, match.start()) + 1

        where = ", ".join(
            [
                *(f"begin at line {line(m)}" for m in begins),
                *(f"end at line {line(m)}" for m in ends),
            ]
        )
        raise MarkerError(
            f"{display} holds unpaired or repeated {self.name!r} markers ({where}): apexkit will not guess "
            "which lines are its own; nothing was changed",
            f"edit {display} to keep one '{self.begin}' ... '{self.end}' pair (or delete both), "
            "then run again",
        )

    def find(self, text: str, display: str = "the file") -> str | None:
        span = self._span(text, display)
        return text[span[0] : span[1]] if span else None

    def put(self, text: str, block: str, display: str = "the file") -> tuple[str, bool]:
        """Replace our block in place, or append it. Returns (new text, whether a separating newline was added)."""
        span = self._span(text, display)
        if span:
            return text[: span[0]] + block + text[span[1] :], False
        separator = "" if not text or text.endswith("\n") else "\n"
        return text + separator + block, bool(separator)

    def strip(self, text: str, added_newline: bool = False, display: str = "the file") -> str:
        span = self._span(text, display)
        if not span:
            return text
        before, after = text[: span[0]], text[span[1] :]
        if added_newline and not after and before.endswith("\n"):
            before = before[:-1]
        return before + after


def decode(data: bytes | None) -> str:
    """Text of a user's file; bytes that are not UTF-8 (a GBK or Latin-1 comment) survive as surrogates, and
    `encode` gives back exactly the bytes read."""
    return (data or b"").decode("utf-8", "surrogateescape")


def encode(text: str) -> bytes:
    return text.encode("utf-8", "surrogateescape")


class CorruptFileError(ConfigError):
    pass


class MarkerError(ConfigError):
    """Managed-block markers that do not pair up."""


MAX_JSON_DEPTH = (
    64  # far deeper than any config apexkit edits; deep enough nesting would overflow the stack
)


def _depth(value: object) -> int:
    """How deep lists and objects nest in a JSON value (a RecursionError once past the stack's depth)."""
    children = (
        value.values() if isinstance(value, dict) else value if isinstance(value, list) else None
    )
    return 0 if children is None else 1 + max(map(_depth, children), default=0)


def load_json_object(path: Path, display: str, data: bytes | None) -> dict:
    if data is None or not data.strip():
        return {}
    try:
        value = json.loads(data.decode("utf-8"))
        deep = _depth(value) > MAX_JSON_DEPTH
    except RecursionError:
        value, deep = None, True
    except ValueError as exc:  # not UTF-8, not JSON, an integer of thousands of digits
        where = (
            f" (line {exc.lineno}, column {exc.colno})"
            if isinstance(exc, json.JSONDecodeError)
            else ""
        )
        raise CorruptFileError(
            f"{display} is not valid JSON{where}; nothing was changed",
            f"fix or move {display} away, then run again",
        ) from None
    if deep:
        raise CorruptFileError(
            f"{display} nests JSON more than {MAX_JSON_DEPTH} levels deep: not a file apexkit "
            "edits; nothing was changed",
            f"fix or move {display} away, then run again",
        )
    if not isinstance(value, dict):
        raise CorruptFileError(
            f"{display} holds a JSON {type(value).__name__}, not an object; nothing was changed",
            f"fix or move {display} away, then run again",
        )
    return value


def dump_json(value: dict, indent: str | int = 2) -> bytes:
    return (json.dumps(value, indent=indent, ensure_ascii=False) + "\n").encode()


_SECTION = re.compile(r"^\s*\[(?P<name>[^\]]+)\]\s*$")


def _ini_key(line: str) -> str | None:
    match = re.match(r"^\s*(?P<key>[A-Za-z0-9_.-]+)\s*[=:]", line)
    return match["key"].replace("_", "-").lower() if match else None


def ini_get(text: str, section: str, key: str) -> str | None:
    current = None
    for line in text.splitlines():
        head = _SECTION.match(line)
        if head:
            current = head["name"].strip()
            continue
        if current == section and _ini_key(line) == key:
            return re.split(r"[=:]", line, maxsplit=1)[1].strip()
    return None


def ini_set(text: str, section: str, key: str, value: str | None) -> str:
    """Set (or with None, delete) `key` in `[section]` of an INI text, leaving every other line as it was."""
    lines = text.splitlines(keepends=True)
    if lines and not lines[-1].endswith("\n"):
        lines[-1] += "\n"
    heads = [
        (index, head["name"].strip())
        for index, head in enumerate(map(_SECTION.match, lines))
        if head
    ]
    start = next((index for index, name in heads if name == section), None)
    if start is None:
        prefix = "" if not lines or lines[-1].strip() == "" else "\n"
        return text if value is None else "".join(lines) + f"{prefix}[{section}]\n{key} = {value}\n"
    end = next((index for index, _ in heads if index > start), len(lines))
    found = next((index for index in range(start + 1, end) if _ini_key(lines[index]) == key), None)
    if found is not None:
        del lines[found]
    if value is not None:
        lines.insert(start + 1 if found is None else found, f"{key} = {value}\n")
    return "".join(lines)


# ---------------------------------------------------------------------------------------------------------------
# Plans
# ---------------------------------------------------------------------------------------------------------------


@dataclass
class Change:
    """One file's wanted state. `new` None means: the file should not exist."""

    display: str  # the path as the user knows it (without --root)
    path: Path  # the real path (with --root)
    new: bytes | None
    mode: int = 0o644
    note: str = ""  # e.g. "holds credentials: 0600"
    extra: dict = field(
        default_factory=dict
    )  # recorded in the backup manifest (e.g. added_newline)
    summary: str = ""  # shown instead of a line diff (e.g. a CA bundle of thousands of lines)
    within: Path | None = None  # the --root: a symbolic link may not lead out of it
    new_owner: tuple[int, int] | None = (
        None  # (uid, gid) for a new file and new folders (as root, in a user's home)
    )
    old: bytes | None = field(init=False, default=None)
    old_mode: int | None = field(init=False, default=None)
    target: Path = field(
        init=False
    )  # what is really written: `path`, or its symbolic link's target

    def __post_init__(self) -> None:
        self.target = write_target(self.path, self.display, self.within)
        self.old = read_target(self.target, self.display)
        self.old_mode = file_mode(self.target)

    @property
    def changed(self) -> bool:
        return (
            self.old is not None
            if self.new is None
            else self.new != self.old or self.old_mode != self.mode
        )

    def diff(self) -> str:
        if self.summary:
            return f"{'create' if self.old is None else 'replace'} {self.display}: {self.summary}\n"
        old, new = (
            (data or b"").decode("utf-8", "replace").splitlines(True)
            for data in (self.old, self.new)
        )
        a, b = (self.display if data is not None else "/dev/null" for data in (self.old, self.new))
        text = "".join(difflib.unified_diff(old, new, a, b))
        if text and not text.endswith("\n"):
            text += "\n\\ No newline at end of file\n"
        if self.new is not None and self.old_mode != self.mode:
            text += f"mode {self.display}: {'absent' if self.old_mode is None else oct(self.old_mode)} -> {oct(self.mode)}\n"
        return log.mask(text)


def _user_name(uid: int) -> str:
    try:
        import pwd

        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except (ImportError, KeyError):
        return f"uid {uid}"


def check_private(path: Path, what: str, directory: bool, also: int | None = None) -> None:
    """Trust state apexkit reads back (and acts on as root) only when it is ours: a real directory or file, not a
    symbolic link, owned by the effective user or root, and not writable by its group or by everyone. Otherwise
    another user could make this process (under sudo: root) write any file. A missing path passes."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    kind = "directory" if directory else "file"
    if stat.S_ISLNK(st.st_mode):
        raise EnvironmentSetupError(
            f"{what} {path} is a symbolic link, not a {kind} apexkit made; nothing was changed",
            f"remove the link (rm {path}) and run again",
        )
    if (stat.S_ISDIR(st.st_mode) if directory else stat.S_ISREG(st.st_mode)) is False:
        raise EnvironmentSetupError(
            f"{what} {path} is not a {kind}; nothing was changed", f"move {path} away and run again"
        )
    me = os.geteuid()
    if st.st_uid not in (me, 0, also):
        raise EnvironmentSetupError(
            f"{what} {path} belongs to {_user_name(st.st_uid)}, not to {_user_name(me)} who runs this: "
            "undo records another user can write could make this process write any file; nothing was changed",
            f"run as {_user_name(st.st_uid)} (without sudo; under sudo drop -E so root keeps its own state), "
            f"or if you trust its content: chown -R {me} {path}",
        )
    if st.st_mode & 0o022:
        raise EnvironmentSetupError(
            f"{what} {path} is writable by its group or by everyone (mode {oct(stat.S_IMODE(st.st_mode))}); "
            "nothing was changed",
            f"chmod -R go-w {path} if you trust its content, then run again",
        )


def read_private(path: Path, what: str) -> bytes | None:
    """A file of apexkit's own state, opened without following a symbolic link; None when it does not exist."""
    try:
        return untrusted.read_regular(path, None, MAX_READ)
    except untrusted.Refused as exc:
        if exc.errno == errno.ENOENT:
            return None
        blocker = next(
            (p for p in path.parents if os.path.lexists(p) and not os.path.isdir(p)), path.parent
        )
        _refused(
            exc,
            EnvironmentSetupError,
            {
                "blocked": (
                    f"cannot read {what} {path}: {blocker} is a file where a folder belongs; nothing was changed",
                    f"move {blocker} away, then run again",
                ),
                "link": (
                    f"{what} {path} is a symbolic link, not a file apexkit made; it was not followed and nothing was "
                    "changed",
                    f"remove it (rm {path}) and run again",
                ),
                "type": (
                    f"{what} {path} is not a regular file; it was not read and nothing was changed",
                    f"move {path} away and run again",
                ),
                "size": (
                    f"{what} {path} is larger than {MAX_READ >> 20} MiB: not a file apexkit wrote; it was not used "
                    "and nothing was changed",
                    f"move {path} away and run again",
                ),
                "os": (
                    f"cannot read {what} {path} ({exc.strerror}); nothing was changed",
                    "run as the user who ran setup (or with sudo for system files)",
                ),
            },
        )


def clamp_mode(mode: object, private: bool = False, default: int = 0o644) -> int:
    """A mode read back from undo records, made safe: permission bits only (no setuid, setgid or sticky bit),
    and at most 0600 for a file that holds credentials."""
    value = (mode if isinstance(mode, int) and not isinstance(mode, bool) else default) & 0o777
    return value & 0o600 if private else value


STATE_KEY = "@state"  # the manifest's one entry about the store itself: how many folders above it apexkit made


class BackupStore:
    """Originals of the files apexkit edits, kept at the first edit, in `<state>/backups/` (0700).

    The manifest is read back later, possibly by root (`sudo -E`), so it is trusted only as far as it must be:
    its directory and itself must be ours (`check_private`); the file each record stands for is re-derived from
    its display name by `resolve` (None: no apexkit layer manages that file, the record is ignored with a warning),
    never taken from the manifest; modes are clamped; backup copies are read without following links.

    Owners (`home_owner`, `in_home`): root writing into a home that is not root's (`sudo -E` with the user's HOME)
    gives what it creates there to the home's owner, so that the user can still read the state and run remove
    without sudo. The state itself goes to the home's owner only while every record names a file inside that home:
    an undo record of a system file (/etc/...) the user could edit would let the user make root write that file,
    so such a manifest stays root's. Root in turn trusts state owned by the home's owner only under the same
    condition; state owned by anybody else is refused as before."""

    def __init__(
        self,
        directory: Path,
        resolve: Callable[[str], Path | None],
        private: Callable[[str], bool] = lambda display: False,
        home_owner: tuple[int, int] | None = None,
        in_home: Callable[[str], bool] = lambda display: False,
        within: Path | None = None,
    ) -> None:
        self.directory = directory
        self.manifest_path = directory / "manifest.json"
        self.resolve = resolve
        self.private = private
        self.home_owner = (
            home_owner if os.geteuid() == 0 and home_owner and home_owner[0] != 0 else None
        )
        self.in_home = in_home
        self.within = within
        self._made = 0  # folders this process made for the store (recorded in the manifest's STATE_KEY entry)
        self._warned: set[str] = set()
        self._state = [  # (path, what it is, whether a directory)
            (directory.parent, "the apexkit state directory", True),
            (directory, "the backups directory", True),
            (self.manifest_path, "the backups manifest", False),
        ]

    def check(self) -> None:
        check_links(
            self.manifest_path, str(self.manifest_path)
        )  # as root: no user's link into root's own state
        also = self.home_owner[0] if self.home_owner else None
        for path, what, directory in self._state:
            check_private(path, what, directory, also)

    def _prepare(self) -> int:
        """Create the state and backups directories closed to others (whatever the umask), then check them.
        Returns how many folders were made (the state folder's parents included); `save` records them."""
        self.check()
        made = make_parents(self.directory.parent, self.home_owner)
        for directory in (self.directory.parent, self.directory):
            with contextlib.suppress(FileExistsError):
                os.mkdir(directory, 0o700)
                os.chmod(directory, 0o700)
                made += 1
        self.check()
        self._made += made
        return made

    def load(self) -> dict[str, dict]:
        self.check()
        data = read_private(self.manifest_path, "the backups manifest")
        manifest = load_json_object(self.manifest_path, str(self.manifest_path), data)
        for display, record in list(manifest.items()):
            if not isinstance(record, dict):
                log.warn(f"backups manifest entry {display!r} is not an object; ignored")
                del manifest[display]
        uids = set()  # whether some of the state belongs to the home's owner (not to root): see the class docstring
        for path, _, _ in self._state:
            with contextlib.suppress(FileNotFoundError):
                uids.add(os.lstat(path).st_uid)
        if self.home_owner and self.home_owner[0] in uids:
            outside = sorted(d for d in records(manifest) if not self.in_home(d))
            if outside:
                raise EnvironmentSetupError(
                    f"the backups manifest {self.manifest_path} belongs to the home's owner but holds an undo record of "
                    f"{outside[0]}, outside that home: root does not act on it; nothing was changed",
                    f"check {self.manifest_path}, then chown -R 0:0 {self.directory.parent} if you trust it",
                )
        return manifest

    def save(self, manifest: dict[str, dict]) -> None:
        """Write the manifest (write-ahead: callers save before they replace a file). Without records, the store
        is taken away again: the manifest, the backups folder, and the folders above it that apexkit made."""
        if not records(manifest):
            self._clean_up(manifest)
            return
        self._prepare()
        if self._made and STATE_KEY not in manifest:
            manifest[STATE_KEY] = {"made_dirs": self._made}
        self._write_private(self.manifest_path, dump_json(manifest))
        if not self.home_owner:
            return
        owner = self.home_owner if all(self.in_home(d) for d in records(manifest)) else (0, 0)
        for path in [
            self.directory.parent,
            self.directory,
            self.manifest_path,
            *self.directory.glob("*.orig"),
        ]:
            with contextlib.suppress(FileNotFoundError):
                os.chown(path, *owner, follow_symlinks=False)

    def _write_private(self, path: Path, data: bytes) -> None:
        """A state file, written into the real folder the links (checked as root by `check`) lead to, that folder
        opened without following links: one swapped for a link since the check is refused (review M5)."""
        self.check()
        atomic_write(resolve_links(path)[0], data, 0o600, nofollow=True)

    def _clean_up(self, manifest: dict[str, dict]) -> None:
        self.check()
        entry = manifest.get(STATE_KEY)
        made = entry.get("made_dirs") if isinstance(entry, dict) else None
        made = made if isinstance(made, int) and not isinstance(made, bool) else self._made
        if not os.path.lexists(self.manifest_path) and not os.path.lexists(self.directory):
            return
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.manifest_path)
        with contextlib.suppress(OSError):
            os.rmdir(self.directory)
        if not os.path.lexists(self.directory):
            # the state folder and those above it that apexkit made (at least the state folder: it is apexkit's)
            remove_made_dirs(self.directory, max(1, made - 1), self.within)

    def managed(self, manifest: dict[str, dict]) -> list[tuple[str, Path, dict]]:
        """(display, real path, record) for each record of a file apexkit manages here; the others are kept in the
        manifest untouched and named once in a warning."""
        entries = []
        for display, record in sorted(records(manifest).items()):
            path = self.resolve(display)
            if path is None:
                if display not in self._warned:
                    self._warned.add(display)
                    log.warn(
                        f"backups manifest names {display!r}, which apexkit does not manage with these options; "
                        "left as it is (set up with --profile or --system? pass the same options)"
                    )
                continue
            entries.append((display, path, record))
        return entries

    def _file(self, display: str) -> Path:
        return self.directory / (hashlib.sha256(display.encode()).hexdigest()[:16] + ".orig")

    def original(self, display: str, record: dict) -> tuple[bytes | None, bool]:
        """(the original bytes, whether they are lost): lost when the file existed but its copy is gone."""
        if record.get("existed") is not True:
            return None, False
        data = read_private(self._file(display), f"the backup of {display}")
        return data, data is None

    def remember(self, manifest: dict[str, dict], change: Change) -> bool:
        """Keep the original of a file at apexkit's first edit; returns whether a record was added."""
        if change.display in manifest:
            return False  # the original is the state before apexkit's first edit
        if change.old is not None:
            self._prepare()
            self._write_private(self._file(change.display), change.old)
        manifest[change.display] = {"existed": change.old is not None, "mode": change.old_mode}
        return True

    def forget(self, manifest: dict[str, dict], display: str) -> None:
        manifest.pop(display, None)
        with contextlib.suppress(FileNotFoundError):
            self._file(display).unlink()


def records(manifest: dict[str, dict]) -> dict[str, dict]:
    """The manifest's file records (without the store's own entry)."""
    return {k: v for k, v in manifest.items() if not k.startswith("@")}


def preflight(changes: Iterable[Change], hint: str) -> None:
    for change in changes:
        if change.changed and not _writable(change.target):
            blocker = next(
                (
                    p
                    for p in reversed(change.target.parents)
                    if os.path.lexists(p) and not os.path.isdir(p)
                ),
                None,
            )
            if blocker is not None:
                raise EnvironmentSetupError(
                    f"cannot write {change.display}: {blocker} is a file where a folder "
                    "belongs; nothing was changed",
                    f"move {blocker} away and run again; or: {hint}",
                )
            raise EnvironmentSetupError(
                f"cannot write {change.display} (permission denied); nothing was changed", hint
            )


def check_again(change: Change) -> None:
    """Just before a write or a put-back: the links on the way are checked again (`write_target`, `check_links`),
    and must still lead to the file the plan read. Between the plan and the write, a user can swap a folder of their
    home for a link (review M5: ~/.docker -> /root/.docker, on inotify of ~/.bashrc)."""
    target = write_target(change.path, change.display, change.within)
    if target != change.target:
        raise TargetError(
            f"{change.display} changed while apexkit was writing: it now leads to {target}, not {change.target}; "
            "it was not written",
            "check who changed it, then run again",
        )


def _write(change: Change) -> None:
    check_again(change)
    if change.new is None:
        _unlink_nofollow(change.target)
    else:
        atomic_write(change.target, change.new, change.mode, change.new_owner, nofollow=True)


def _put_back(changes: Iterable[Change]) -> None:
    """Put back what apexkit wrote, each file on its own: one whose path changed since (checked again, as before a
    write) is left as it is, with a warning, and the others are still put back."""
    for change in changes:
        try:
            check_again(change)
            if change.old is None:
                _unlink_nofollow(change.target)
            else:
                atomic_write(
                    change.target,
                    change.old,
                    0o644 if change.old_mode is None else change.old_mode,
                    nofollow=True,
                )
        except TargetError as exc:
            cause = exc.cause.replace("; nothing was changed", "").replace(
                "; it was not written", ""
            )
            log.warn(f"not put back (left as apexkit wrote it): {cause}")


def apply(
    changes: list[Change], store: BackupStore, owner: str, check: Callable[[], None] | None = None
) -> list[Change]:
    """Write every changed file (all or nothing); returns the changes written. `check` runs after the writes (a
    read-back): when it raises, every file is put back as it was and the backups manifest is left unchanged.

    Write-ahead: before each file is replaced, its original (backup copy) and its manifest record -- with the hash
    of what is about to be written -- are on disk. A setup killed at any point (SIGKILL, a closed SSH session) is
    therefore undone by `remove`, and a rerun finds the record and keeps the true original instead of adopting the
    half-configured file."""
    todo = [c for c in changes if c.changed]
    if not todo:
        return []
    manifest = store.load()
    before = json.loads(json.dumps(manifest))
    done: list[Change] = []
    added: list[str] = []
    made: list[tuple[Change, int]] = []
    try:
        for change in todo:
            if store.remember(manifest, change):
                added.append(change.display)
            record = manifest[change.display]
            if change.display not in added and _edited_since(record, change.old):
                record["edited"] = (
                    True  # sticky: remove must keep the user's edits and take out only our part
                )
            # before_sha256: what the file holds if this write never happens
            record.update(
                {
                    "owner": owner,
                    **change.extra,
                    "written_sha256": sha256(change.new),
                    "before_sha256": sha256(change.old),
                }
            )
            new_dirs = len(missing_parents(change.target)) if change.new is not None else 0
            if new_dirs:
                record["made_dirs"] = max(
                    new_dirs,
                    record.get("made_dirs", 0) if isinstance(record.get("made_dirs"), int) else 0,
                )
            store.save(manifest)  # the record first, then the file
            if new_dirs:
                made.append((change, make_parents(change.target, change.new_owner)))
            _write(change)
            done.append(change)
        if check is not None:
            check()
    except BaseException:
        _put_back(reversed(done))  # put back what was already written
        for change, count in reversed(made):
            remove_made_dirs(change.target, count, change.within)
        for display in added:
            store.forget({}, display)
        store.save(before)
        raise
    return done


@dataclass
class Restore:
    display: str
    how: str  # "restored" | "deleted" | "undone" | "already gone" | "failed: ..."


class UndoError(EnvironmentSetupError):
    """Some files could not be undone; the others were (`results` says what happened to each)."""

    def __init__(self, cause: str, hint: str = "", results: list[Restore] | None = None) -> None:
        super().__init__(cause, hint)
        self.results = list(results or [])


def _edited_since(record: dict, current: bytes | None) -> bool:
    """Whether a file apexkit wrote was changed by somebody else since: it holds neither what apexkit wrote last
    nor -- when that write never happened (a setup killed after its write-ahead record) -- what it held before.
    Once true, it stays true (the record's "edited")."""
    known = {record.get("written_sha256"), record.get("before_sha256")} - {None}
    return record.get("edited") is True or (current is not None and sha256(current) not in known)


def undo_change(
    store: BackupStore,
    display: str,
    path: Path,
    record: dict,
    undo: Callable[[str, bytes, bytes | None, dict], bytes | None],
    within: Path | None = None,
) -> tuple[Change, str]:
    """The change that takes back what apexkit wrote to one file (`path`, derived by the caller, never read from the
    record), and how: untouched since our write (`_edited_since`) -> the original bytes and (clamped) mode exactly;
    edited since (at any time since the first setup), or its backup copy lost -> `undo(display, current, original,
    record)` removes only our part. A symbolic link is
    followed (its target gets the bytes back; the link stays a link)."""
    target = write_target(path, display, within)
    current = read_target(target, display)
    original, lost = store.original(display, record)
    private = store.private(display)
    if current is None and original is None:
        return Change(display, path, None, within=within), "already gone"
    if not lost and (current is None or not _edited_since(record, current)):
        return (
            Change(
                display,
                path,
                original,
                mode=clamp_mode(record.get("mode"), private),
                within=within,
                new_owner=store.home_owner
                if store.in_home(display)
                else None,  # a file recreated in a home is theirs
            ),
            "restored" if original is not None else "deleted",
        )
    assert current is not None
    restored = undo(display, current, original, record)
    mode = clamp_mode(file_mode(target), private)
    if lost:
        log.warn(f"the backup copy of {display} is missing; only apexkit's part is removed")
        if restored is None:  # never delete a file that existed before apexkit
            return Change(
                display, path, current, mode=mode, within=within
            ), "kept (its backup copy is missing)"
    return Change(
        display, path, restored, mode=mode, within=within
    ), "undone (file edited since; only our part removed)"


def undo_all(
    store: BackupStore,
    owner: str,
    undo: Callable[[str, bytes, bytes | None, dict], bytes | None],
    only: Callable[[str], bool] = lambda display: True,
    dry_run: bool = False,
    within: Path | None = None,
) -> tuple[list[Restore], list[Change]]:
    """Put back every file `owner` edited. Untouched since our write -> the original bytes and mode exactly;
    edited since -> `undo(display, current, original, record)` removes only our part. Each file is undone on its
    own: one that cannot be (a corrupt daemon.json, unpaired markers) is reported and kept with its record, the
    others are undone, and then `UndoError` names the first failure. The manifest is saved after each file, and
    the folders apexkit made (and the store itself, once empty) are taken away."""
    manifest = store.load()
    results: list[Restore] = []
    changes: list[Change] = []
    failed: list[tuple[str, ConfigError | TargetError]] = []
    for display, path, record in store.managed(manifest):
        if record.get("owner") != owner or not only(display):
            continue
        try:
            change, how = undo_change(store, display, path, record, undo, within)
        except (
            ConfigError,
            TargetError,
        ) as exc:  # that file's problem; trouble with the store itself stops all
            failed.append((display, exc))
            results.append(Restore(display, f"failed: {exc.cause}"))
            continue
        results.append(Restore(display, how))
        changes.append(change)
    if dry_run:
        return results, changes
    preflight(changes, "run as the user who ran setup (or with sudo for system files)")
    made: list[tuple[Path, object]] = []
    for change in changes:
        record = manifest.get(change.display, {})
        if change.new is None or change.changed:
            _write(change)
        if change.new is None:
            made.append((change.target, record.get("made_dirs")))
        store.forget(manifest, change.display)
        store.save(manifest)
    for (
        target,
        count,
    ) in made:  # after every file is gone: two files may share the folders made for the first
        remove_made_dirs(target, count, within)
    if failed:
        display, first = failed[0]
        more = f" (and {len(failed) - 1} more file(s))" if len(failed) > 1 else ""
        done = f"; the other {len(changes)} file(s) were undone" if changes else ""
        cause = first.cause.replace("; nothing was changed", "")
        error = UndoError(f"could not undo {display}{more}: {cause}{done}", first.hint, results)
        error.exit_code = first.exit_code
        raise error
    return results, changes
