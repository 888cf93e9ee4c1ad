"""ccache's hits and misses for one compile: `ccache --print-stats` before and after, diffed.

Reading the counters leaves them as they were (no `--zero-stats`): the user's own statistics are not disturbed. The
diff counts every compile that used the same cache directory meanwhile, so two builds sharing one CCACHE_DIR at the
same time see each other's calls. `--print-stats` (tab-separated `counter<TAB>value` lines) is ccache >= 3.7's;
an older ccache, or stats that cannot be read or parsed, give "unknown" with the reason instead of numbers.
"""

from __future__ import annotations

import subprocess

HIT_COUNTERS = ("direct_cache_hit", "preprocessed_cache_hit")
MISS_COUNTERS = ("cache_miss",)


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


def diff(before: dict[str, int] | str, after: dict[str, int] | str) -> dict:
    """{hits, misses, hit_rate} of what happened between two snapshots; hit_rate is None when nothing was cacheable
    (no hit, no miss: CCACHE_DISABLE, or nothing compiled). "unknown" with the reason when either snapshot failed or
    the counters went down (the stats were zeroed meanwhile)."""
    if isinstance(before, str) or isinstance(after, str):
        return unknown(before if isinstance(before, str) else after)  # type: ignore[arg-type]
    hits = sum(after[c] - before[c] for c in HIT_COUNTERS)
    misses = sum(after[c] - before[c] for c in MISS_COUNTERS)
    if hits < 0 or misses < 0:
        return unknown("the ccache statistics went down during the compile (zeroed meanwhile)")
    total = hits + misses
    return {"hits": hits, "misses": misses, "hit_rate": round(hits / total, 3) if total else None}


def describe(stats: dict | None) -> str:
    """One line for the log: `ccache 40 hits, 2 misses (95% hits)`."""
    if stats is None:
        return "ccache not used"
    if stats.get("hit_rate") == "unknown":
        return f"ccache hit rate unknown: {stats.get('reason')}"
    rate = stats["hit_rate"]
    return f"ccache {stats['hits']} hits, {stats['misses']} misses" + (
        f" ({rate:.0%} hits)" if rate is not None else " (nothing cacheable)"
    )
