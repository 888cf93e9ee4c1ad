"""Match a failed build's log against known_failures.toml and say what it means."""

from __future__ import annotations

import functools
import re
import sys
from dataclasses import dataclass
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

DATA = Path(__file__).with_name("known_failures.toml")


@dataclass(frozen=True)
class KnownFailure:
    id: str
    pattern: re.Pattern
    cause: str
    fix: str
    supersedes: tuple[str, ...] = ()  # ids this one explains better when both match (same log, narrower cause)


@functools.lru_cache(maxsize=1)
def load() -> tuple[KnownFailure, ...]:
    with open(DATA, "rb") as fh:
        data = tomllib.load(fh)
    return tuple(KnownFailure(f["id"], re.compile(f["pattern"]), f["cause"], f["fix"], tuple(f.get("supersedes", ())))
                 for f in data["failure"])


def match(text: str) -> list[KnownFailure]:
    """Every known failure whose signature appears in `text`, in table order, less those a narrower match explains
    (the torch_npu auto-load failure also prints libhccl.so: it is not a reason to install CANN for a build)."""
    found = [f for f in load() if f.pattern.search(text)]
    superseded = {sid for f in found for sid in f.supersedes}
    return [f for f in found if f.id not in superseded]


def announce(text: str) -> str | None:
    """Warn once per known failure in `text`; return the first one's hint for the one-line error (or None)."""
    from apexkit import log

    found = match(text)
    for f in found:
        log.warn(f"known failure '{f.id}': {f.cause}. Fix: {f.fix}")
    return f"known failure '{found[0].id}': {found[0].fix}" if found else None


@dataclass(frozen=True)
class Hit:
    failure: KnownFailure
    line_no: int  # 1-based
    line: str


def find(text: str) -> list[Hit]:
    """The first line where each known failure appears, in table order (for `invoke doctor --log`)."""
    hits = []
    lines = text.splitlines()
    for failure in match(text):
        m = failure.pattern.search(text)
        if m is None:
            continue
        line_no = text.count("\n", 0, m.start()) + 1
        hits.append(Hit(failure, line_no, lines[line_no - 1].strip() if line_no <= len(lines) else m.group(0)))
    return hits
