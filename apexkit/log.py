"""Step logging: every phase timed with a mark, every external command echoed with secrets masked."""

from __future__ import annotations

import contextlib
import re
import shlex
import sys
import time
from collections.abc import Iterator, Sequence

from rich.console import Console
from rich.markup import escape

# stderr: stdout stays free for machine-readable output (JSON, export lines).
console = Console(stderr=True, highlight=False, soft_wrap=True)

_CRED_IN_URL = re.compile(r"(?P<scheme>[a-zA-Z][a-zA-Z0-9+.-]*://)(?P<user>[^:/@\s]+):(?P<pw>[^@/\s]+)@")


def mask(text: str) -> str:
    """Hide passwords in URLs: http://user:secret@host -> http://user:***@host."""
    return _CRED_IN_URL.sub(lambda m: f"{m['scheme']}{m['user']}:***@", text)


def echo_command(argv: Sequence[str], cwd: str | None = None) -> None:
    line = mask(shlex.join(str(a) for a in argv))
    where = f"  (in {cwd})" if cwd else ""
    console.print(f"[dim]+ {escape(line)}{escape(where)}[/dim]")


def info(message: str) -> None:
    console.print(message, markup=False)


def warn(message: str) -> None:
    console.print(f"[yellow]! {escape(mask(message))}[/yellow]")


def format_seconds(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.1f}s"
    return f"{int(seconds // 60)}m{seconds % 60:04.1f}s"


class Step:
    """A named, timed phase. Use `with step("name") as s:`; `s.note(...)` adds detail to the result line."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.detail = ""
        self.seconds = 0.0

    def note(self, detail: str) -> None:
        self.detail = detail


@contextlib.contextmanager
def step(name: str, timings: dict[str, float] | None = None) -> Iterator[Step]:
    s = Step(name)
    console.print(f"[bold]▸ {escape(name)}[/bold]")
    start = time.monotonic()
    try:
        yield s
    except BaseException:
        s.seconds = time.monotonic() - start
        console.print(f"[red]✕ {escape(name)}[/red] ({format_seconds(s.seconds)})")
        raise
    s.seconds = time.monotonic() - start
    if timings is not None:
        timings[name] = round(timings.get(name, 0.0) + s.seconds, 3)
    detail = f": {escape(mask(s.detail))}" if s.detail else ""
    console.print(f"[green]✓ {escape(name)}[/green]{detail} ({format_seconds(s.seconds)})")


def is_interactive() -> bool:
    return sys.stderr.isatty()
