"""Match a failed build's log against known_failures.toml and say what it means."""

from __future__ import annotations

import collections
import functools
import io
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

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
    supersedes: tuple[
        str, ...
    ] = ()  # ids this one explains better when both match (same log, narrower cause)


@functools.lru_cache(maxsize=1)
def load() -> tuple[KnownFailure, ...]:
    with open(DATA, "rb") as fh:
        data = tomllib.load(fh)
    return tuple(
        KnownFailure(
            f["id"], re.compile(f["pattern"]), f["cause"], f["fix"], tuple(f.get("supersedes", ()))
        )
        for f in data["failure"]
    )


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
    """The first line where each known failure appears, in table order."""
    return scan(io.StringIO(text))[0]


def scan(fh: TextIO, tail: int = 10, block: int = 8 << 20) -> tuple[list[Hit], list[str]]:
    """One pass over a log of any size, `block` characters at a time (cut at line ends): the first line where each
    known failure appears, in table order, less those a narrower match explains, and the log's last `tail` lines.
    Signatures match within one line, so a block cut at a newline never splits one; memory stays at a block."""
    failures = load()
    first: dict[str, Hit] = {}
    last: collections.deque[str] = collections.deque(maxlen=tail)
    lines_before = 0
    carry = ""
    while True:
        data = fh.read(block)
        text = carry + data
        carry = ""
        if data:
            cut = text.rfind("\n") + 1 or len(
                text
            )  # a line longer than a block is cut, not held whole
            text, carry = text[:cut], text[cut:]
        if text:
            for failure in failures:
                found = None if failure.id in first else failure.pattern.search(text)
                if found:
                    start = text.rfind("\n", 0, found.start()) + 1
                    end = text.find("\n", found.start())
                    line = text[start : len(text) if end < 0 else end].strip()
                    first[failure.id] = Hit(
                        failure, lines_before + text.count("\n", 0, found.start()) + 1, line
                    )
            last.extend(text.rstrip("\n").rsplit("\n", tail)[-tail:])
            lines_before += text.count("\n")
        if not data:
            break
    superseded = {sid for hit in first.values() for sid in hit.failure.supersedes}
    return [first[f.id] for f in failures if f.id in first and f.id not in superseded], list(last)
