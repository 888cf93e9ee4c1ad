"""`apexkit cache list | prune`: what the apexkit cache holds, how much disk each entry takes, when it was last used,
and the removal of whole entries.

    apexkit cache.list [--json]
    apexkit cache.prune --older-than DAYS | --keep-last N [--dry-run] [--what venvs,git,wheels,uv,containers]

An entry is what a build makes and reuses as one: a build venv (venvs/build-py*), a run venv (run-venvs/*), a git
mirror (git/*.git), a wheel-cache entry (wheels/<key[:2]>/<key>), uv's cache (uv/, one entry), a container cache
(containers/<tag>) or a debootstrapped base (base-images/*). Sizes are du's: blocks on disk (st_blocks * 512), links
never followed, a hard-linked file counted once per entry (and once per total). Nothing is hashed.

Last used is the newest mtime of the entry, of the files a use rewrites (a venv's ready marker, a mirror's
FETCH_HEAD, a wheel entry's manifest) and of its lock file `<entry>.lock`: every build that reuses an entry holds
that lock (apexkit.locks), and taking it truncates the file. Access times are not used: this listing itself reads
the directories.

Prune removes whole entries only, each under the lock its builder takes (wait=False: a held one is skipped with one
line), never through a link (a link planted in the cache is unlinked; its target stays), and only in a cache that
passes apexkit.cachetrust (else it refuses, in one line). This module lives in apexkit/wheel because the wheel
build owns most of this layout (venvs, mirrors, wheel cache, uv) and its locks; the other folders are known here by
name only (no import of images or venvrun, which the layout test forbids).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import stat
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from apexkit import cachetrust, locks, log, paths, untrusted, vocab
from apexkit.errors import ConfigError

KINDS = ("venvs", "git", "wheels", "uv", "containers")
MARKER_MAX = 4 << 20  # a ready marker or manifest larger than this is not read
DAY = 86400.0


@dataclass
class Entry:
    kind: str
    name: str  # relative to the cache root
    path: Path
    inodes: dict = field(repr=False)  # (dev, ino) -> bytes
    last_used: float
    what: str
    link: bool = False

    @property
    def size(self) -> int:
        return sum(self.inodes.values())

    def row(self) -> dict:
        return {
            "kind": self.kind,
            "name": self.name,
            "path": str(self.path),
            "size": self.size,
            "last_used": round(self.last_used, 3),
            "for": self.what,
        }


def _lstat(path: Path) -> os.stat_result | None:
    try:
        return os.lstat(path)
    except OSError:
        return None


def _is(path: Path, kind: Callable[[int], bool]) -> bool:
    """Whether `path` itself (a link not followed) exists and is of `kind` (stat.S_ISDIR, S_ISREG, S_ISLNK)."""
    st = _lstat(path)
    return st is not None and kind(st.st_mode)


def _children(folder: Path) -> list[Path]:
    """The entries of `folder` (not through a link to it), without lock, pid, log and half-made (.tmp) names."""
    if not _is(folder, stat.S_ISDIR):
        return []
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        return []
    skip = (".lock", ".lock.pid", ".log", ".tmp")
    return [folder / n for n in names if not n.endswith(skip) and not n.startswith(".tmp-")]


def _walk(path: Path) -> dict:
    """(dev, ino) -> bytes on disk of everything under `path`, links not followed (a link counts as itself)."""
    found: dict = {}
    st = _lstat(path)
    if st is None:
        return found
    found[(st.st_dev, st.st_ino)] = st.st_blocks * 512
    if not stat.S_ISDIR(st.st_mode):
        return found
    stack = [str(path)]
    while stack:
        top = stack.pop()
        try:
            with os.scandir(top) as it:
                for item in it:
                    try:
                        ist = item.stat(follow_symlinks=False)
                    except OSError:
                        continue
                    found[(ist.st_dev, ist.st_ino)] = ist.st_blocks * 512
                    if stat.S_ISDIR(ist.st_mode):
                        stack.append(item.path)
        except OSError:
            continue
    return found


def _read(folder: Path, name: str) -> bytes:
    """A small file in `folder`, read as untrusted input (no link followed, size bounded)."""
    with untrusted.opened_dir(folder) as fd:
        return untrusted.read_regular(name, fd, MARKER_MAX)


def _read_json(folder: Path, name: str) -> dict:
    """A small JSON file in `folder` (`_read`): {} when not usable."""
    try:
        value = json.loads(_read(folder, name).decode())
    except (untrusted.Untrusted, OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def _text(value: object, limit: int = 60) -> str:
    return log.sanitise(str(value))[:limit] if isinstance(value, (str, int, float)) else ""


def _venv_for(path: Path) -> str:
    marker = _read_json(path, "apexkit-ready.json")
    packages = marker.get("packages")
    if not isinstance(packages, dict):
        return "build venv (not ready)" if path.parent.name == "venvs" else "run venv"
    parts = [
        f"{n} {_text(packages[n])}" for n in ("torch", "torch-npu", "torch_npu") if n in packages
    ]
    python = path.name[len("build-py") :].split("-")[0] if path.name.startswith("build-py") else ""
    return ", ".join([f"build venv python {_text(python)}" if python else "build venv", *parts])


def _git_for(path: Path) -> str:
    try:
        config = _read(path, "config").decode(errors="replace")
    except (untrusted.Untrusted, OSError):
        return "git mirror"
    for line in config.splitlines():
        key, _, value = line.strip().partition("=")
        if key.strip() == "url":
            return f"git mirror of {log.mask(_text(value.strip(), 200))}"
    return "git mirror"


def _wheel_for(path: Path) -> str:
    wheel = _read_json(path, "manifest.json").get("wheel")
    name = _text(wheel.get("file"), 120) if isinstance(wheel, dict) else ""
    return f"cached wheel {name}" if name else "cached wheel (no manifest)"


# kind -> the folders whose children are its entries (uv's cache is one entry; a wheel entry sits in a shard)
_FOLDERS = {
    "venvs": ("venvs", "run-venvs"),
    "git": ("git",),
    "wheels": ("wheels",),
    "containers": ("containers", "base-images"),
}
# kind -> the files whose mtime a use rewrites
_USE_FILES = {
    "venvs": ("apexkit-ready.json", ".apexkit-complete"),
    "git": ("FETCH_HEAD", "HEAD", "packed-refs"),
    "wheels": ("manifest.json",),
    "uv": (".lock",),
    "containers": (),
}
# kind -> what an entry (a directory) is for
_WHAT: dict[str, Callable[[Path], str]] = {
    "venvs": _venv_for,
    "git": _git_for,
    "wheels": _wheel_for,
    "uv": lambda p: "uv's cache (downloads, built wheels, Pythons)",
    "containers": lambda p: (
        "container build cache" if p.parent.name == "containers" else "debootstrapped base image"
    ),
}


def _entries(cache: Path, kinds: tuple[str, ...]) -> Iterator[tuple[str, Path]]:
    for kind in (k for k in KINDS if k in kinds):
        if kind == "uv" and os.path.lexists(cache / "uv"):
            yield kind, cache / "uv"
        for p in (p for sub in _FOLDERS.get(kind, ()) for p in _children(cache / sub)):
            if kind == "wheels" and _is(p, stat.S_ISDIR):  # a shard
                yield from ((kind, q) for q in _children(p))
            else:
                yield kind, p


def _last_used(path: Path, kind: str, mtime: float) -> float:
    """The newest mtime of the entry, of the files a use rewrites (not links) and of its lock file."""
    uses = (_lstat(path / name) for name in _USE_FILES[kind])
    times = [
        mtime,
        *(st.st_mtime for st in uses if st is not None and not stat.S_ISLNK(st.st_mode)),
    ]
    lock = _lstat(locks.lock_file(path))
    if lock is not None and stat.S_ISREG(lock.st_mode):
        times.append(lock.st_mtime)
    return max(times)


def scan(cache: Path, kinds: tuple[str, ...] = KINDS) -> list[Entry]:
    """Every entry of `kinds` in the cache at `cache`, with its size, last use and purpose."""
    out = []
    for kind, path in _entries(cache, kinds):
        st = _lstat(path)
        if st is None:
            continue
        # a name is shown on one line whatever it holds (a newline, an escape sequence)
        name = log.sanitise(str(path.relative_to(cache)))
        if stat.S_ISLNK(st.st_mode):  # _walk counts the link itself
            what, last_used = "a link (not followed; prune unlinks it)", st.st_mtime
        else:
            what = _WHAT[kind](path) if stat.S_ISDIR(st.st_mode) else "a file"
            last_used = _last_used(path, kind, st.st_mtime)
        out.append(Entry(kind, name, path, _walk(path), last_used, what, stat.S_ISLNK(st.st_mode)))
    return out


def totals(entries: list[Entry]) -> dict[str, int]:
    """Bytes on disk per kind (a file hard-linked into two entries counted once), and "all"."""
    seen: dict[str, dict] = {}
    for e in entries:
        seen.setdefault(e.kind, {}).update(e.inodes)
        seen.setdefault("all", {}).update(e.inodes)
    return {k: sum(v.values()) for k, v in seen.items()}


def human(size: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024  # type: ignore[assignment]
    return f"{size} B"


def _ago(when: float, now: float) -> str:
    days = (now - when) / DAY
    return f"{days:.0f} days ago" if days >= 1 else f"{(now - when) / 3600:.0f} h ago"


def _kinds(what: str | None) -> tuple[str, ...]:
    if not what:
        return KINDS
    chosen = tuple(w.strip() for w in what.split(",") if w.strip())
    unknown = [w for w in chosen if w not in KINDS]
    if unknown or not chosen:
        raise ConfigError(
            f"--what {log.sanitise(what)!r}: unknown kind {', '.join(unknown) or '(none)'}",
            f"give a comma-separated subset of {','.join(KINDS)}",
        )
    return chosen


def list_command(as_json: bool = False, what: str | None = None) -> int:
    """apexkit cache.list: one row per entry, then the totals per kind."""
    cache = paths.cache_dir()
    kinds = _kinds(what)
    reason = cachetrust.problem(cache)
    if reason:
        log.warn(
            f"the apexkit cache {cache} is {reason}: builds do not use it -- next: chmod -R go-w {cache} (as "
            "its owner), or set APEXKIT_CACHE_DIR to a directory only you can write"
        )
    entries = scan(cache, kinds)
    sums = totals(entries)
    if as_json:
        print(
            json.dumps(
                {
                    "cache": str(cache),
                    "trusted": reason is None,
                    "entries": [e.row() for e in entries],
                    "totals": {k: sums.get(k, 0) for k in (*kinds, "all")},
                },
                indent=2,
            )
        )
        return 0
    now = time.time()
    log.out(f"apexkit cache {cache}")
    if not entries:
        log.out("  (empty)")
    for e in sorted(entries, key=lambda e: (KINDS.index(e.kind), -e.last_used)):
        log.out(
            f"  {e.kind:<16} {human(e.size):>10}  {_ago(e.last_used, now):>12}  {e.name}  {e.what}"
        )
    for k in kinds:
        count = sum(1 for e in entries if e.kind == k)
        log.out(
            f"  total {k:<10} {human(sums.get(k, 0)):>10}  ({count} entr{'y' if count == 1 else 'ies'})"
        )
    log.out(f"  total {'all':<10} {human(sums.get('all', 0)):>10}")
    return 0


def selected(
    entries: list[Entry], older_than: float | None, keep_last: int | None, now: float
) -> list[Entry]:
    """The entries to remove: per kind, not among the `keep_last` most recently used, and (when given) last used
    more than `older_than` days ago."""
    out = []
    for kind in KINDS:
        mine = sorted((e for e in entries if e.kind == kind), key=lambda e: -e.last_used)
        for rank, e in enumerate(mine):
            if keep_last is not None and rank < keep_last:
                continue
            if older_than is not None and now - e.last_used < older_than * DAY:
                continue
            out.append(e)
    return out


@contextlib.contextmanager
def _uv_lock(path: Path) -> Iterator[None]:
    """uv's own lock on its cache (<uv>/.lock, shared while uv runs): taken exclusively, not waiting."""
    try:
        fd = os.open(path / ".lock", os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        yield
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:  # EWOULDBLOCK/EAGAIN: another process holds it
            raise locks.Busy(
                f"uv's cache {path} is in use by a running uv", "wait for it"
            ) from None
        yield
    finally:
        os.close(fd)


def _remove(e: Entry) -> None:
    if e.link or not os.path.isdir(e.path) or os.path.islink(e.path):
        os.unlink(e.path)  # a link goes, its target stays
    else:
        shutil.rmtree(
            e.path
        )  # fd-based: never follows a link inside (or one swapped in for the entry)
    log_file = e.path.with_name(e.path.name + ".log")
    if e.path.parent.name == "run-venvs" and _is(log_file, stat.S_ISREG):
        os.unlink(log_file)


def _removed(e: Entry) -> bool:
    """Remove `e` under the lock its builder takes (not waiting); False, after one warning line, when it cannot."""
    try:
        hold = (
            _uv_lock(e.path)
            if e.kind == "uv" and not e.link
            else locks.hold(e.path, f"cache entry {e.name}", wait=False)
        )
        with hold:
            _remove(e)
    except locks.Busy as exc:
        log.warn(f"{e.name}: in use, skipped ({exc.cause})")
        return False
    except (OSError, locks.LockError) as exc:
        log.warn(f"{e.name}: not removed ({getattr(exc, 'strerror', None) or exc})")
        return False
    return True


def _number(value, flag: str, kind=float):
    if value is None:
        return None
    try:
        number = kind(value)
    except (TypeError, ValueError):
        number = -1
    if not (
        0 <= number < float("inf")
    ):  # nan compares false with everything: it would select every entry
        raise ConfigError(
            f"{flag} {log.sanitise(str(value))!r} is not a number >= 0",
            f"e.g. {flag} {30 if kind is float else 2}",
        )
    return number


def prune_command(
    older_than=None,
    keep_last=None,
    dry_run: bool = False,
    what: str | None = None,
    as_json: bool = False,
) -> int:
    """apexkit cache.prune: remove whole entries last used more than --older-than DAYS ago and/or beyond the
    --keep-last N most recent per kind; --dry-run removes nothing."""
    days = _number(older_than, "--older-than")
    keep = _number(keep_last, "--keep-last", int)
    kinds = _kinds(what)
    if days is None and keep is None:
        raise ConfigError(
            "cache prune needs a selector: it never removes everything by default",
            f"{vocab.command('cache.prune', '--older-than 30 --dry-run')} (or --keep-last 2) shows what would "
            "go",
        )
    cache = paths.cache_dir()
    reason = cachetrust.problem(cache)
    if reason:
        raise ConfigError(
            f"the apexkit cache {cache} is {reason}: not pruning a cache others can write",
            f"chmod -R go-w {cache} (as its owner), or set APEXKIT_CACHE_DIR to a directory only you can write",
        )
    now = time.time()
    chosen = selected(scan(cache, kinds), days, keep, now)
    removed: list[Entry] = []
    skipped: list[Entry] = []
    for e in chosen:
        (removed if dry_run or _removed(e) else skipped).append(e)
    freed = totals(removed).get("all", 0)
    if as_json:
        print(
            json.dumps(
                {
                    "cache": str(cache),
                    "dry_run": dry_run,
                    "removed": [e.row() for e in removed],
                    "skipped": [e.row() for e in skipped],
                    "freed": freed,
                },
                indent=2,
            )
        )
        return 0
    verb = "would remove" if dry_run else "removed"
    for e in removed:
        log.out(f"{verb} {e.kind:<10} {human(e.size):>10}  {_ago(e.last_used, now):>12}  {e.name}")
    log.out(
        f"{verb} {len(removed)} entr{'y' if len(removed) == 1 else 'ies'}, {human(freed)}"
        + (f"; {len(skipped)} skipped" if skipped else "")
        + (f" (dry run: nothing removed from {cache})" if dry_run else "")
    )
    return 0


def size_summary(cache: Path) -> str:
    """One line for doctor: the size on disk per kind and in all."""
    sums = totals(scan(cache))
    parts = [f"{k} {human(sums[k])}" for k in KINDS if sums.get(k)]
    return ", ".join([*parts, f"total {human(sums.get('all', 0))}"]) if parts else "empty"
