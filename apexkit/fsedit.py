"""Careful edits of user and system files: plan -> diff -> preflight -> atomic write with backups -> undo.

Every writer in apexkit goes through here, so each one gets the same guarantees:
- `--dry-run` shows unified diffs (passwords masked) and writes nothing;
- a preflight checks every target is writable before the first byte is written;
- writes are atomic (temp file in the same directory + rename), with the final mode set before the rename;
- the first time apexkit touches a file, its original bytes and mode are kept in a backup store, so `remove`
  restores the file byte for byte when nobody edited it since, and undoes only our part otherwise;
- if a write fails half-way, the files already written are put back.
"""

from __future__ import annotations

import contextlib
import difflib
import hashlib
import json
import os
import re
import shutil
import stat
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from apexkit import log
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


def atomic_write(path: Path, data: bytes, mode: int) -> None:
    """Write `data` to `path` atomically; the file never exists with wider permissions than `mode`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    previous = None
    with contextlib.suppress(FileNotFoundError):
        previous = path.stat()
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".apexkit-tmp")
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        if previous is not None and os.geteuid() == 0:  # keep the owner of a user's file we edit as root
            os.chown(tmp, previous.st_uid, previous.st_gid)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def swap_directory(tmp: Path, final: Path) -> None:
    """Put the fully written directory `tmp` in place of `final` (which may not exist): readers see the old one or
    the new one, never a half-written one. `tmp` must be on the same file system (a sibling)."""
    old = None
    if final.exists():
        old = final.with_name(f".{final.name}.old-{os.getpid()}")
        os.replace(final, old)
    os.replace(tmp, final)
    if old:
        shutil.rmtree(old, ignore_errors=True)


def _writable(path: Path) -> bool:
    if path.exists():
        return path.is_file() and os.access(path, os.W_OK) and os.access(path.parent, os.W_OK)
    parent = path.parent
    while not parent.exists():
        parent = parent.parent
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
        head = [self.begin] + ([f"# {comment}"] if comment else [])
        return "\n".join([*head, *lines, self.end]) + "\n"

    def _span(self, text: str) -> tuple[int, int] | None:
        match = re.search(rf"(?m)^{re.escape(self.begin)}[^\n]*\n(?:.*\n)*?{re.escape(self.end)}[^\n]*(?:\n|\Z)", text)
        return (match.start(), match.end()) if match else None

    def find(self, text: str) -> str | None:
        span = self._span(text)
        return text[span[0]:span[1]] if span else None

    def put(self, text: str, block: str) -> tuple[str, bool]:
        """Replace our block in place, or append it. Returns (new text, whether a separating newline was added)."""
        span = self._span(text)
        if span:
            return text[:span[0]] + block + text[span[1]:], False
        separator = "" if not text or text.endswith("\n") else "\n"
        return text + separator + block, bool(separator)

    def strip(self, text: str, added_newline: bool = False) -> str:
        span = self._span(text)
        if not span:
            return text
        before, after = text[:span[0]], text[span[1]:]
        if added_newline and not after and before.endswith("\n"):
            before = before[:-1]
        return before + after


class CorruptFileError(ConfigError):
    pass


def load_json_object(path: Path, display: str, data: bytes | None) -> dict:
    if data is None or not data.strip():
        return {}
    try:
        value = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        where = f" (line {exc.lineno}, column {exc.colno})" if isinstance(exc, json.JSONDecodeError) else ""
        raise CorruptFileError(f"{display} is not valid JSON{where}; nothing was changed",
                               f"fix or move {display} away, then run again") from None
    if not isinstance(value, dict):
        raise CorruptFileError(f"{display} holds a JSON {type(value).__name__}, not an object; nothing was changed",
                               f"fix or move {display} away, then run again")
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
    start = end = None
    for index, line in enumerate(lines):
        head = _SECTION.match(line)
        if head and start is None and head["name"].strip() == section:
            start = index
        elif head and start is not None and end is None:
            end = index
    if start is None:
        if value is None:
            return text
        prefix = "" if not lines or lines[-1].strip() == "" else "\n"
        return "".join(lines) + f"{prefix}[{section}]\n{key} = {value}\n"
    end = len(lines) if end is None else end
    for index in range(start + 1, end):
        if _ini_key(lines[index]) == key:
            if value is None:
                del lines[index]
            else:
                lines[index] = f"{key} = {value}\n"
            return "".join(lines)
    if value is not None:
        lines.insert(start + 1, f"{key} = {value}\n")
    return "".join(lines)


# ---------------------------------------------------------------------------------------------------------------
# Plans
# ---------------------------------------------------------------------------------------------------------------

@dataclass
class Change:
    """One file's wanted state. `new` None means: the file should not exist."""

    display: str          # the path as the user knows it (without --root)
    path: Path            # the real path (with --root)
    new: bytes | None
    mode: int = 0o644
    note: str = ""        # e.g. "holds credentials: 0600"
    undo: Callable[[bytes, bytes | None, dict], bytes | None] | None = None  # (current, original, record) -> restored
    extra: dict = field(default_factory=dict)  # recorded in the backup manifest (e.g. added_newline)
    summary: str = ""     # shown instead of a line diff (e.g. a CA bundle of thousands of lines)
    old: bytes | None = field(init=False, default=None)
    old_mode: int | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        self.old = read_bytes(self.path)
        self.old_mode = file_mode(self.path)

    @property
    def changed(self) -> bool:
        if self.new is None:
            return self.old is not None
        return self.new != self.old or self.old_mode != self.mode

    def diff(self) -> str:
        if self.summary:
            return f"{'create' if self.old is None else 'replace'} {self.display}: {self.summary}\n"
        old = (self.old or b"").decode("utf-8", "replace").splitlines(keepends=True)
        new = (self.new or b"").decode("utf-8", "replace").splitlines(keepends=True)
        a = self.display if self.old is not None else "/dev/null"
        b = self.display if self.new is not None else "/dev/null"
        text = "".join(difflib.unified_diff(old, new, a, b))
        if text and not text.endswith("\n"):
            text += "\n\\ No newline at end of file\n"
        if self.new is not None and self.old_mode != self.mode:
            old_mode = "absent" if self.old_mode is None else oct(self.old_mode)
            text += f"mode {self.display}: {old_mode} -> {oct(self.mode)}\n"
        return log.mask(text)


def _user_name(uid: int) -> str:
    try:
        import pwd

        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except (ImportError, KeyError):
        return f"uid {uid}"


def check_private(path: Path, what: str, directory: bool) -> None:
    """Trust state apexkit reads back (and acts on as root) only when it is ours: a real directory or file, not a
    symbolic link, owned by the effective user or root, and not writable by its group or by everyone. Otherwise
    another user could make this process (under sudo: root) write any file. A missing path passes."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    kind = "directory" if directory else "file"
    if stat.S_ISLNK(st.st_mode):
        raise EnvironmentSetupError(f"{what} {path} is a symbolic link, not a {kind} apexkit made; nothing was changed",
                                    f"remove the link (rm {path}) and run again")
    if (stat.S_ISDIR(st.st_mode) if directory else stat.S_ISREG(st.st_mode)) is False:
        raise EnvironmentSetupError(f"{what} {path} is not a {kind}; nothing was changed", f"move {path} away and run again")
    me = os.geteuid()
    if st.st_uid not in (me, 0):
        raise EnvironmentSetupError(
            f"{what} {path} belongs to {_user_name(st.st_uid)}, not to {_user_name(me)} who runs this: "
            "undo records another user can write could make this process write any file; nothing was changed",
            f"run as {_user_name(st.st_uid)} (without sudo; under sudo drop -E so root keeps its own state), "
            f"or if you trust its content: chown -R {me} {path}")
    if st.st_mode & 0o022:
        raise EnvironmentSetupError(
            f"{what} {path} is writable by its group or by everyone (mode {oct(stat.S_IMODE(st.st_mode))}); "
            "nothing was changed", f"chmod -R go-w {path} if you trust its content, then run again")


def read_private(path: Path, what: str) -> bytes | None:
    """A file of apexkit's own state, opened without following a symbolic link; None when it does not exist."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    except FileNotFoundError:
        return None
    except OSError as exc:
        if os.path.islink(path):
            raise EnvironmentSetupError(f"{what} {path} is a symbolic link, not a file apexkit made; it was not "
                                        "followed and nothing was changed", f"remove it (rm {path}) and run again") from None
        raise EnvironmentSetupError(f"cannot read {what} {path} ({exc.strerror}); nothing was changed",
                                    "run as the user who ran setup (or with sudo for system files)") from None
    with os.fdopen(fd, "rb") as handle:
        st = os.fstat(handle.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise EnvironmentSetupError(f"{what} {path} is not a regular file; it was not read and nothing was changed",
                                        f"move {path} away and run again")
        return handle.read()


def clamp_mode(mode: object, private: bool = False, default: int = 0o644) -> int:
    """A mode read back from undo records, made safe: permission bits only (no setuid, setgid or sticky bit),
    and at most 0600 for a file that holds credentials."""
    value = mode if isinstance(mode, int) and not isinstance(mode, bool) else default
    value &= 0o777
    return value & 0o600 if private else value


class BackupStore:
    """Originals of the files apexkit edits, kept at the first edit, in `<state>/backups/` (0700).

    The manifest is read back later, possibly by root (`sudo -E`), so it is trusted only as far as it must be:
    its directory and itself must be ours (`check_private`); the file each record stands for is re-derived from
    its display name by `resolve` (None: no apexkit layer manages that file, the record is ignored with a warning),
    never taken from the manifest; modes are clamped; backup copies are read without following links."""

    def __init__(self, directory: Path, resolve: Callable[[str], Path | None],
                 private: Callable[[str], bool] = lambda display: False) -> None:
        self.directory = directory
        self.manifest_path = directory / "manifest.json"
        self.resolve = resolve
        self.private = private
        self._warned: set[str] = set()

    def check(self) -> None:
        check_private(self.directory.parent, "the apexkit state directory", directory=True)
        check_private(self.directory, "the backups directory", directory=True)
        check_private(self.manifest_path, "the backups manifest", directory=False)

    def _prepare(self) -> None:
        """Create the state and backups directories closed to others (whatever the umask), then check them."""
        self.check()
        self.directory.parent.parent.mkdir(parents=True, exist_ok=True)
        for directory in (self.directory.parent, self.directory):
            with contextlib.suppress(FileExistsError):
                os.mkdir(directory, 0o700)
                os.chmod(directory, 0o700)
        self.check()

    def load(self) -> dict[str, dict]:
        self.check()
        data = read_private(self.manifest_path, "the backups manifest")
        manifest = load_json_object(self.manifest_path, str(self.manifest_path), data) if data else {}
        for display, record in list(manifest.items()):
            if not isinstance(record, dict):
                log.warn(f"backups manifest entry {display!r} is not an object; ignored")
                del manifest[display]
        return manifest

    def save(self, manifest: dict[str, dict]) -> None:
        self._prepare()
        atomic_write(self.manifest_path, dump_json(manifest), 0o600)

    def managed(self, manifest: dict[str, dict]) -> list[tuple[str, Path, dict]]:
        """(display, real path, record) for each record of a file apexkit manages here; the others are kept in the
        manifest untouched and named once in a warning."""
        entries = []
        for display, record in sorted(manifest.items()):
            path = self.resolve(display)
            if path is None:
                if display not in self._warned:
                    self._warned.add(display)
                    log.warn(f"backups manifest names {display!r}, which apexkit does not manage with these options; "
                             "left as it is (set up with --profile or --system? pass the same options)")
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
        record = {"existed": change.old is not None, "mode": change.old_mode}
        if change.old is not None:
            self._prepare()
            atomic_write(self._file(change.display), change.old, 0o600)
        manifest[change.display] = record
        return True

    def forget(self, manifest: dict[str, dict], display: str) -> None:
        manifest.pop(display, None)
        with contextlib.suppress(FileNotFoundError):
            self._file(display).unlink()


def preflight(changes: Iterable[Change], hint: str) -> None:
    for change in changes:
        if change.changed and not _writable(change.path):
            raise EnvironmentSetupError(f"cannot write {change.display} (permission denied); nothing was changed", hint)


def _put_back(changes: Iterable[Change]) -> None:
    for change in changes:
        if change.old is None:
            with contextlib.suppress(FileNotFoundError):
                change.path.unlink()
        else:
            atomic_write(change.path, change.old, 0o644 if change.old_mode is None else change.old_mode)


def apply(changes: list[Change], store: BackupStore, owner: str, check: Callable[[], None] | None = None) -> list[Change]:
    """Write every changed file (all or nothing); returns the changes written. `check` runs after the writes (a
    read-back): when it raises, every file is put back as it was and the backups manifest is left unchanged."""
    todo = [c for c in changes if c.changed]
    if not todo:
        return []
    manifest = store.load()
    done: list[Change] = []
    added: list[str] = []
    try:
        for change in todo:
            if store.remember(manifest, change):
                added.append(change.display)
            record = manifest[change.display]
            record.update(owner=owner, **change.extra)
            if change.new is None:
                with contextlib.suppress(FileNotFoundError):
                    change.path.unlink()
            else:
                atomic_write(change.path, change.new, change.mode)
            record["written_sha256"] = sha256(change.new)
            done.append(change)
        if check is not None:
            check()
        store.save(manifest)
    except BaseException:
        _put_back(reversed(done))  # put back what was already written
        for display in added:
            store.forget({}, display)
        raise
    return done


@dataclass
class Restore:
    display: str
    how: str  # "restored" | "deleted" | "undone" | "already gone"


def undo_change(store: BackupStore, display: str, path: Path, record: dict,
                undo: Callable[[str, bytes, bytes | None, dict], bytes | None]) -> tuple[Change, str]:
    """The change that takes back what apexkit wrote to one file (`path`, derived by the caller, never read from the
    record), and how: untouched since our write -> the original bytes and (clamped) mode exactly; edited since, or
    its backup copy lost -> `undo(display, current, original, record)` removes only our part."""
    current = read_bytes(path)
    original, lost = store.original(display, record)
    private = store.private(display)
    if current is None and original is None:
        return Change(display, path, None), "already gone"
    if not lost and (current is None or sha256(current) == record.get("written_sha256")):
        return (Change(display, path, original, mode=clamp_mode(record.get("mode"), private)),
                "restored" if original is not None else "deleted")
    assert current is not None
    restored = undo(display, current, original, record)
    mode = clamp_mode(file_mode(path), private)
    if lost:
        log.warn(f"the backup copy of {display} is missing; only apexkit's part is removed")
        if restored is None:  # never delete a file that existed before apexkit
            return Change(display, path, current, mode=mode), "kept (its backup copy is missing)"
    return Change(display, path, restored, mode=mode), "undone (file edited since; only our part removed)"


def undo_all(store: BackupStore, owner: str, undo: Callable[[str, bytes, bytes | None, dict], bytes | None],
             only: Callable[[str], bool] = lambda display: True, dry_run: bool = False) -> tuple[list[Restore], list[Change]]:
    """Put back every file `owner` edited. Untouched since our write -> the original bytes and mode exactly;
    edited since -> `undo(display, current, original, record)` removes only our part."""
    manifest = store.load()
    results: list[Restore] = []
    changes: list[Change] = []
    for display, path, record in store.managed(manifest):
        if record.get("owner") != owner or not only(display):
            continue
        change, how = undo_change(store, display, path, record, undo)
        results.append(Restore(display, how))
        changes.append(change)
    if dry_run:
        return results, changes
    preflight(changes, "run as the user who ran setup (or with sudo for system files)")
    for change in changes:
        if change.new is None:
            with contextlib.suppress(FileNotFoundError):
                change.path.unlink()
        elif change.changed:
            atomic_write(change.path, change.new, change.mode)
        store.forget(manifest, change.display)
    store.save(manifest)
    return results, changes
