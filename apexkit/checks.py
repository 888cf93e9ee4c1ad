"""One check/report model for `invoke doctor`, `invoke proxy.check` and `invoke image.emulation`: rows with a status,
what was found and the fix; one table (or `--json`) on stdout, so `invoke doctor > report.txt` keeps it; progress and
logs stay on stderr; exit code 1 when any row fails.

    python
      ok   python3                  /usr/bin/python3: Python 3.11.2
      warn python                   no working `python` (python: command not found)
                                    → call python3 / python3.X explicitly (apexkit does; many images ship no `python`)
    12 ok, 1 warn, 0 fail, 2 skip
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from dataclasses import dataclass, field

from rich.markup import escape

from apexkit import log

OK, WARN, FAIL, SKIP = "ok", "warn", "fail", "skip"
STATUSES = (OK, WARN, FAIL, SKIP)
MARK = {
    OK: "[green]ok  [/green]",
    WARN: "[yellow]warn[/yellow]",
    FAIL: "[red]FAIL[/red]",
    SKIP: "[dim]skip[/dim]",
}
NAME_WIDTH = 24
INDENT = " " * (
    2 + 4 + 1 + NAME_WIDTH + 1
)  # continuation lines and the fix line start under the detail


@dataclass
class Row:
    area: str  # the heading the row is listed under (doctor: python, torch, …; proxy.check: proxy layers)
    name: str
    status: str  # ok | warn | fail | skip
    detail: str  # what was found
    fix: str = ""  # the next step, when there is one
    data: dict = field(default_factory=dict)  # machine-readable facts: in the JSON only

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"check status {self.status!r} is not one of {', '.join(STATUSES)}")


def render(rows: list[Row]) -> None:
    """The table on stdout: a heading per area, a line per row (mark, name, detail), the fix under it, the counts."""
    area = None
    for row in rows:
        if row.area != area:
            area = row.area
            log.report.print(f"[bold]{escape(area)}[/bold]")
        first, *more = escape(
            log.sanitise(log.mask(row.detail), keep_newlines=True)
        ).splitlines() or [""]
        log.report.print(f"  {MARK[row.status]} {escape(row.name):<{NAME_WIDTH}} {first}")
        for line in more:
            log.report.print(INDENT + line)
        if row.fix:
            log.report.print(f"{INDENT}[dim]→ {escape(log.sanitise(log.mask(row.fix)))}[/dim]")
    counts = {s: sum(r.status == s for r in rows) for s in STATUSES}
    log.report.print(", ".join(f"{counts[s]} {s}" for s in STATUSES))


def _masked(value):
    return log.mask(value) if isinstance(value, str) else value


def to_json(rows: list[Row], legacy: Callable[[Row], dict] | None = None) -> list[dict]:
    """One dict per row: area, name, status, detail, fix, data (secrets in URLs masked), then the command's own keys
    from before this model (`legacy`), kept so scripts that read them go on working."""
    out = []
    for row in rows:
        item = {
            "area": row.area,
            "name": row.name,
            "status": row.status,
            "detail": row.detail,
            "fix": row.fix,
            "data": {k: _masked(v) for k, v in row.data.items()},
        }
        item.update(legacy(row) if legacy else {})
        out.append({k: _masked(v) for k, v in item.items()})
    return out


def exit_code(rows: list[Row]) -> int:
    return 1 if any(row.status == FAIL for row in rows) else 0


def report(
    rows: list[Row], as_json: bool = False, legacy: Callable[[Row], dict] | None = None
) -> int:
    """Print the rows (the table, or JSON with --json) on stdout; return the exit code."""
    if as_json:
        sys.stdout.write(json.dumps(to_json(rows, legacy), indent=1) + "\n")
    else:
        render(rows)
    return exit_code(rows)
