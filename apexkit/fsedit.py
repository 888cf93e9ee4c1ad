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


class BackupStore:
    """Originals of the files apexkit edits, kept at the first edit, in `<state>/backups/` (0700)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.manifest_path = directory / "manifest.json"

    def load(self) -> dict[str, dict]:
        data = read_bytes(self.manifest_path)
        return load_json_object(self.manifest_path, str(self.manifest_path), data) if data else {}

    def save(self, manifest: dict[str, dict]) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        os.chmod(self.directory, 0o700)
        atomic_write(self.manifest_path, dump_json(manifest), 0o600)

    def _file(self, display: str) -> Path:
        return self.directory / (hashlib.sha256(display.encode()).hexdigest()[:16] + ".orig")

    def original(self, display: str, record: dict) -> bytes | None:
        return read_bytes(self._file(display)) if record.get("existed") else None

    def remember(self, manifest: dict[str, dict], change: Change) -> None:
        if change.display in manifest:
            return  # the original is the state before apexkit's first edit
        record = {"path": str(change.path), "existed": change.old is not None, "mode": change.old_mode}
        if change.old is not None:
            self.directory.mkdir(parents=True, exist_ok=True)
            os.chmod(self.directory, 0o700)
            atomic_write(self._file(change.display), change.old, 0o600)
        manifest[change.display] = record

    def forget(self, manifest: dict[str, dict], display: str) -> None:
        manifest.pop(display, None)
        with contextlib.suppress(FileNotFoundError):
            self._file(display).unlink()


def preflight(changes: Iterable[Change], hint: str) -> None:
    for change in changes:
        if change.changed and not _writable(change.path):
            raise EnvironmentSetupError(f"cannot write {change.display} (permission denied); nothing was changed", hint)


def apply(changes: list[Change], store: BackupStore, owner: str) -> list[Change]:
    """Write every changed file (all or nothing); returns the changes written."""
    todo = [c for c in changes if c.changed]
    if not todo:
        return []
    manifest = store.load()
    done: list[Change] = []
    try:
        for change in todo:
            store.remember(manifest, change)
            record = manifest[change.display]
            record.update(owner=owner, **change.extra)
            if change.new is None:
                with contextlib.suppress(FileNotFoundError):
                    change.path.unlink()
            else:
                atomic_write(change.path, change.new, change.mode)
            record["written_sha256"] = sha256(change.new)
            done.append(change)
        store.save(manifest)
    except BaseException:
        for change in reversed(done):  # put back what was already written
            if change.old is None:
                with contextlib.suppress(FileNotFoundError):
                    change.path.unlink()
            else:
                atomic_write(change.path, change.old, change.old_mode or 0o644)
        raise
    return done


@dataclass
class Restore:
    display: str
    how: str  # "restored" | "deleted" | "undone" | "already gone"


def undo_change(store: BackupStore, display: str, record: dict,
                undo: Callable[[str, bytes, bytes | None, dict], bytes | None]) -> tuple[Change, str]:
    """The change that takes back what apexkit wrote to one file, and how: untouched since our write -> the original
    bytes and mode exactly; edited since -> `undo(display, current, original, record)` removes only our part."""
    path = Path(record["path"])
    current = read_bytes(path)
    original = store.original(display, record)
    if current is None and original is None:
        return Change(display, path, None), "already gone"
    if current is None or sha256(current) == record.get("written_sha256"):
        return (Change(display, path, original, mode=record.get("mode") or 0o644),
                "restored" if original is not None else "deleted")
    restored = undo(display, current, original, record)
    return Change(display, path, restored, mode=file_mode(path) or 0o644), "undone (file edited since; only our part removed)"


def undo_all(store: BackupStore, owner: str, undo: Callable[[str, bytes, bytes | None, dict], bytes | None],
             only: Callable[[str], bool] = lambda display: True, dry_run: bool = False) -> tuple[list[Restore], list[Change]]:
    """Put back every file `owner` edited. Untouched since our write -> the original bytes and mode exactly;
    edited since -> `undo(display, current, original, record)` removes only our part."""
    manifest = store.load()
    results: list[Restore] = []
    changes: list[Change] = []
    for display, record in sorted(manifest.items()):
        if record.get("owner") != owner or not only(display):
            continue
        change, how = undo_change(store, display, record, undo)
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
