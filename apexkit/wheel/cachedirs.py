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
import itertools
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
_VENV_USES = ("apexkit-ready.json", ".apexkit-complete")
# a folder of the cache -> the kind of its entries, the files whose mtime a use rewrites, and what an entry is for
# when nothing in it says more (uv's cache is itself one entry; a wheel entry sits in a shard: wheels/<key[:2]>/<key>)
_LAYOUT = {
    "venvs": ("venvs", _VENV_USES, "build venv (not ready)"),
    "run-venvs": ("venvs", _VENV_USES, "run venv"),
    "git": ("git", ("FETCH_HEAD", "HEAD", "packed-refs"), "git mirror"),
    "wheels": ("wheels", ("manifest.json",), "cached wheel (no manifest)"),
    "uv": ("uv", (".lock",), "uv's cache (downloads, built wheels, Pythons)"),
    "containers": ("containers", (), "container build cache"),
    "base-images": ("containers", (), "debootstrapped base image"),
}


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


def _lstat(path: Path | str) -> os.stat_result | None:
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
    try:
        names = sorted(os.listdir(folder)) if _is(folder, stat.S_ISDIR) else []
    except OSError:
        return []
    skip = (".lock", ".lock.pid", ".log", ".tmp")
    return [folder / n for n in names if not n.endswith(skip) and not n.startswith(".tmp-")]


def _walk(path: Path) -> dict:
    """(dev, ino) -> bytes on disk of `path` and everything under it, links not followed (a link counts as itself)."""
    st = _lstat(path)
    tops = os.walk(path) if st is not None and stat.S_ISDIR(st.st_mode) else ()
    found = [st, *(_lstat(os.path.join(top, n)) for top, dirs, files in tops for n in dirs + files)]
    return {(s.st_dev, s.st_ino): s.st_blocks * 512 for s in found if s is not None}


def _read(folder: Path, name: str) -> str:
    """A small file in `folder`, read as untrusted input (no link followed, size bounded); "" when not readable."""
    try:
        with untrusted.opened_dir(folder) as fd:
            return untrusted.read_regular(name, fd, MARKER_MAX).decode(errors="replace")
    except (untrusted.Untrusted, OSError):
        return ""


def _read_json(folder: Path, name: str) -> dict:
    """A small JSON object in `folder`, read as untrusted input; {} when it is not one."""
    try:
        with untrusted.opened_dir(folder) as fd:
            return untrusted.read_json_object(name, fd, MARKER_MAX)
    except (untrusted.Untrusted, OSError):
        return {}


def _text(value: object, limit: int = 60) -> str:
    return log.sanitise(str(value))[:limit] if isinstance(value, (str, int, float)) else ""


def _what(kind: str, path: Path) -> str:
    """What a directory entry's ready marker, git config or manifest says it is for; "" when it says nothing."""
    if kind == "venvs":
        packages = _read_json(path, "apexkit-ready.json").get("packages")
        if not isinstance(packages, dict):
            return ""
        python = (
            path.name[len("build-py") :].split("-")[0] if path.name.startswith("build-py") else ""
        )
        torch = [
            f"{n} {_text(packages[n])}"
            for n in ("torch", "torch-npu", "torch_npu")
            if n in packages
        ]
        return ", ".join([f"build venv python {_text(python)}" if python else "build venv", *torch])
    if kind == "git":
        lines = (line.partition("=") for line in _read(path, "config").splitlines())
        urls = [value.strip() for key, _, value in lines if key.strip() == "url"]
        return f"git mirror of {log.mask(_text(urls[0], 200))}" if urls else ""
    wheel = _read_json(path, "manifest.json").get("wheel") if kind == "wheels" else None
    name = _text(wheel.get("file"), 120) if isinstance(wheel, dict) else ""
    return f"cached wheel {name}" if name else ""


def _entries(cache: Path, kinds: tuple[str, ...]) -> Iterator[tuple[str, Path]]:
    """(folder of _LAYOUT, path) of every entry of `kinds`, in the order of KINDS."""
    for folder, (kind, _uses, _for) in _LAYOUT.items():
        if kind not in kinds:
            continue
        top = cache / folder
        found = ([top] if os.path.lexists(top) else []) if folder == "uv" else _children(top)
        for p in found:
            shard = kind == "wheels" and _is(p, stat.S_ISDIR)
            yield from ((folder, q) for q in (_children(p) if shard else [p]))


def scan(cache: Path, kinds: tuple[str, ...] = KINDS) -> list[Entry]:
    """Every entry of `kinds` in the cache at `cache`, with its size, last use and purpose. Last used: the newest
    mtime of the entry, of the files a use rewrites and of its lock file (regular files only, never through a link)."""
    out = []
    for folder, path in _entries(cache, kinds):
        kind, uses, default = _LAYOUT[folder]
        st = _lstat(path)
        if st is None:
            continue
        # a name is shown on one line whatever it holds (a newline, an escape sequence)
        name = log.sanitise(str(path.relative_to(cache)))
        link = stat.S_ISLNK(st.st_mode)
        if link:  # _walk counts the link itself
            what, last_used = "a link (not followed; prune unlinks it)", st.st_mtime
        else:
            what = (_what(kind, path) or default) if stat.S_ISDIR(st.st_mode) else "a file"
            found = (_lstat(p) for p in (*(path / n for n in uses), locks.lock_file(path)))
            times = (s.st_mtime for s in found if s is not None and stat.S_ISREG(s.st_mode))
            last_used = max([st.st_mtime, *times])
        out.append(Entry(kind, name, path, _walk(path), last_used, what, link))
    return out


def totals(entries: list[Entry]) -> dict[str, int]:
    """Bytes on disk per kind (a file hard-linked into two entries counted once), and "all"."""
    seen: dict[str, dict] = {}
    for e in entries:
        seen.setdefault(e.kind, {}).update(e.inodes)
        seen.setdefault("all", {}).update(e.inodes)
    return {k: sum(v.values()) for k, v in seen.items()}


def human(size: float) -> str:
    for unit in ("B", "KiB", "MiB"):
        if size < 1024:
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} GiB"


def _ago(when: float, now: float) -> str:
    days = (now - when) / DAY
    return f"{days:.0f} days ago" if days >= 1 else f"{(now - when) / 3600:.0f} h ago"


def _by_use(e: Entry) -> tuple[int, float]:
    """Per kind, the most recently used first."""
    return KINDS.index(e.kind), -e.last_used


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


def _fix(cache: Path) -> str:
    return f"chmod -R go-w {cache} (as its owner), or set APEXKIT_CACHE_DIR to a directory only you can write"


def list_command(as_json: bool = False, what: str | None = None) -> int:
    """apexkit cache.list: one row per entry, then the totals per kind."""
    cache, kinds = paths.cache_dir(), _kinds(what)
    reason = cachetrust.problem(cache)
    if reason:
        log.warn(
            f"the apexkit cache {cache} is {reason}: builds do not use it -- next: {_fix(cache)}"
        )
    entries = scan(cache, kinds)
    sums = totals(entries)
    compiled = _ccache_row()
    if as_json:
        rows = [e.row() for e in entries]
        sums = {k: sums.get(k, 0) for k in (*kinds, "all")}
        print(
            json.dumps(
                {
                    "cache": str(cache),
                    "trusted": reason is None,
                    "entries": rows,
                    "totals": sums,
                    "ccache": compiled,
                },
                indent=2,
            )
        )
        return 0
    now = time.time()
    log.out(f"apexkit cache {cache}")
    if not entries:
        log.out("  (empty)")
    for e in sorted(entries, key=_by_use):
        log.out(
            f"  {e.kind:<16} {human(e.size):>10}  {_ago(e.last_used, now):>12}  {e.name}  {e.what}"
        )
    for k in kinds:
        count = sum(1 for e in entries if e.kind == k)
        log.out(
            f"  total {k:<10} {human(sums.get(k, 0)):>10}  ({count} entr{'y' if count == 1 else 'ies'})"
        )
    log.out(f"  total {'all':<10} {human(sums.get('all', 0)):>10}")
    if sum(e.size for e in entries) > sums.get("all", 0):
        log.out(
            "  (the rows add up to more than the total: a file hard-linked into several entries, as uv links "
            "its cache into the venvs, counts in each row and once in the totals)"
        )
    log.out(f"ccache {compiled}")
    return 0


def _ccache_row() -> str:
    """The compile cache beside apexkit's: which ccache, its cache, the team's remote (masked) and their use so far."""
    from apexkit import config
    from apexkit.errors import ApexkitError
    from apexkit.wheel import ccachestats

    try:
        remote = config.load(os.environ).get("compile_cache", os.environ).text or None
    except ApexkitError as exc:
        return f"unknown: {exc.cause}"
    return ccachestats.describe_setup(ccachestats.find(os.environ), os.environ, remote)


def selected(
    entries: list[Entry], older_than: float | None, keep_last: int | None, now: float
) -> list[Entry]:
    """The entries to remove: per kind, not among the `keep_last` most recently used, and (when given) last used
    more than `older_than` days ago."""
    return [
        e
        for _kind, mine in itertools.groupby(sorted(entries, key=_by_use), key=lambda e: e.kind)
        for rank, e in enumerate(mine)
        if (keep_last is None or rank >= keep_last)
        and (older_than is None or now - e.last_used >= older_than * DAY)
    ]


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


def _removed(e: Entry) -> bool:
    """Remove `e` under the lock its builder takes (not waiting); False, after one warning line, when it cannot. A
    link goes, its target stays; rmtree is fd-based: it never follows a link inside (or one swapped in for the entry)."""
    hold = (
        _uv_lock
        if e.kind == "uv" and not e.link
        else lambda p: locks.hold(p, f"cache entry {e.name}", wait=False)
    )
    log_file = e.path.with_name(e.path.name + ".log")  # a run venv's
    try:
        with hold(e.path):
            (os.unlink if e.link or not _is(e.path, stat.S_ISDIR) else shutil.rmtree)(e.path)
            if e.path.parent.name == "run-venvs" and _is(log_file, stat.S_ISREG):
                os.unlink(log_file)
    except locks.Busy as exc:
        log.warn(f"{e.name}: in use, skipped ({exc.cause})")
        return False
    except (OSError, locks.LockError) as exc:
        log.warn(f"{e.name}: not removed ({getattr(exc, 'strerror', None) or exc})")
        return False
    return True


def _number(value, flag: str, kind=float):
    try:
        number = None if value is None else kind(value)
    except (TypeError, ValueError):
        number = -1
    # nan compares false with everything: it would select every entry
    if number is not None and not 0 <= number < float("inf"):
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
    days, keep = _number(older_than, "--older-than"), _number(keep_last, "--keep-last", int)
    kinds = _kinds(what)
    if days is None and keep is None:
        raise ConfigError(
            "cache prune needs a selector: it never removes everything by default",
            f"{vocab.command('cache.prune', '--older-than 30 --dry-run')} (or --keep-last 2) shows what would go",
        )
    cache = paths.cache_dir()
    reason = cachetrust.problem(cache)
    if reason:
        raise ConfigError(
            f"the apexkit cache {cache} is {reason}: not pruning a cache others can write",
            _fix(cache),
        )
    now = time.time()
    removed: list[Entry] = []
    skipped: list[Entry] = []
    for e in selected(scan(cache, kinds), days, keep, now):
        (removed if dry_run or _removed(e) else skipped).append(e)
    freed = totals(removed).get("all", 0)
    if as_json:
        rows = {"removed": [e.row() for e in removed], "skipped": [e.row() for e in skipped]}
        print(
            json.dumps({"cache": str(cache), "dry_run": dry_run, **rows, "freed": freed}, indent=2)
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


WARN_ENV = "APEXKIT_CACHE_WARN_GIB"  # the size (GiB) past which a build names the cache's size and `cache prune`


def grown_past(cache: Path, environ) -> str | None:
    """After a build: one line naming the cache's size and `cache prune` when it holds more than $APEXKIT_CACHE_WARN_GIB
    (default 30; 0: never say), else None."""
    from apexkit import envvars

    try:
        limit = envvars.number(environ, WARN_ENV, 30, high=100_000, unit="GiB")
    except ConfigError as exc:  # the wheel is built by now: a warning, never a failed build
        return f"{exc.cause} -- next: {exc.hint}"
    if not limit:
        return None
    sums = totals(scan(cache))
    if sums.get("all", 0) <= limit * (1 << 30):
        return None
    parts = ", ".join(f"{k} {human(sums[k])}" for k in KINDS if sums.get(k))
    return (
        f"the apexkit cache {cache} holds {human(sums['all'])} ({parts}), past {limit:g} GiB -- next: "
        f"{vocab.command('cache.list')} shows each entry, {vocab.command('cache.prune', '--older-than 30 --dry-run')} "
        f"what would go (set {WARN_ENV}=0 to stop this line)"
    )


def size_summary(cache: Path) -> str:
    """One line for doctor: the size on disk per kind and in all."""
    sums = totals(scan(cache))
    parts = [f"{k} {human(sums[k])}" for k in KINDS if sums.get(k)]
    return ", ".join([*parts, f"total {human(sums.get('all', 0))}"]) if parts else "empty"
