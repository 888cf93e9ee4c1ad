"""Step logging: every phase timed with a mark, every external command echoed with secrets masked.

Quiet (`apexkit -q CMD`, or APEXKIT_QUIET=1, which nox/invoke and the processes apexkit starts inherit): the
progress -- step marks, echoed commands, info lines, spinners -- is not printed; warnings, errors, a failed step's
mark, what explains a failure (`notice`), each command's result line (`result`) and the reports on stdout are. The
log files keep everything either way."""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import sys
import time
from collections.abc import Callable, Iterator, Sequence

from rich.console import Console
from rich.markup import escape

# stderr: stdout stays free for machine-readable output (JSON, export lines).
# emoji=False: ":name:" in echoed foreign text stays text (Rich replaces emoji codes even with markup=False).
console = Console(stderr=True, highlight=False, soft_wrap=True, emoji=False)
# Reports a user redirects (`invoke doctor > report.txt`: doctor, proxy.check, the matrix table, image.list) go to
# stdout; progress, logs, warnings and errors stay on stderr.
report = Console(highlight=False, soft_wrap=True, emoji=False)
QUIET_ENV = "APEXKIT_QUIET"


def _quiet_from(environ: dict | os._Environ = os.environ) -> bool:
    """APEXKIT_QUIET holds: 1/true/yes/on (any case). Anything else (unset, 0, a typo) keeps the progress shown:
    a mistyped value must not hide it."""
    return str(environ.get(QUIET_ENV, "")).strip().lower() in ("1", "true", "yes", "on")


QUIET = _quiet_from()


def set_quiet(on: bool) -> None:
    """Quiet for this process and, through the environment, for the processes it starts (a nox session, a container's
    apexkit via the options file, a Slurm job)."""
    global QUIET
    QUIET = on
    os.environ[QUIET_ENV] = "1" if on else "0"


# The userinfo of a URL in free text (logs, diffs, commands), hidden whatever it holds. The userinfo ends at the
# LAST '@' before the host (a raw '@' in a password: user:p@ss@host), so a match runs over every character but
# whitespace and '/' (which ends the authority, and so never crosses into the next URL's "://"); a password with
# spaces (user:pa ss@host) is matched on the same line only, and only in the user:password form. A raw '/' in a
# password (user:Ab/Secret9@host) cannot be told from a path in general; it is taken for one when what follows the
# first ':' is not a port (digits up to the '/'), up to the token's last '@'. The scheme must start a word, so a
# long run of letters is scanned once, not once per position.
_HOST_START = r"(?=[\w\[%.-])"
_USERINFO_IN_URL = re.compile(
    r"(?<![A-Za-z0-9+.-])(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)"
    r"(?:(?P<suser>[^\s/:@\"'<>`]*):(?![0-9]*(?:[/\s]|$))[^\s\"'<>`]*@" + _HOST_START + "|"
    r"(?P<info>[^\s/]+)@" + _HOST_START + "|"
    r"(?P<user>[^\s/:@\"'<>`]*):[^\r\n\f\v/\"'<>`]*@" + _HOST_START + ")"
)
# A URL's ?query and #fragment may hold a token (?token=, ?private_token=, #access_token=): every value is hidden,
# the names kept (?token=***&x=***; a piece without '=' is hidden whole).
_QUERY_IN_URL = re.compile(
    r"(?<![A-Za-z0-9+.-])(?P<head>[A-Za-z][A-Za-z0-9+.-]*://[^\s?#\"'<>`]*)(?P<query>[?#][^\s\"'<>`]*)"
)
_QUERY_PIECE = re.compile(r"([?#&;])([^?#&;=]*)(=?)[^?#&;]*")


def _masked(match: re.Match) -> str:
    info = match["info"]
    if info is None:  # a password with spaces, or with a '/'
        return f"{match['scheme']}{match['user'] if match['user'] is not None else match['suser']}:***@"
    if ":" in info:
        return f"{match['scheme']}{info.split(':', 1)[0]}:***@"
    return f"{match['scheme']}***@"  # a token alone (http://TOKEN@host) is the secret


def mask(text: str) -> str:
    """Hide the secret of every URL's userinfo: http://user:secret@host -> http://user:***@host, also
    http://:pw@host -> http://:***@host, http://user:p@ss@host and http://user:pa ss@host -> http://user:***@host,
    http://TOKEN@host -> http://***@host; and every value of its query and fragment: ?token=s -> ?token=***."""
    text = _USERINFO_IN_URL.sub(_masked, text)
    return _QUERY_IN_URL.sub(
        lambda m: m["head"] + _QUERY_PIECE.sub(_hidden_piece, m["query"]), text
    )


def _hidden_piece(match: re.Match) -> str:
    sep, name, equals = match.groups()
    if equals:
        return f"{sep}{name}=***"
    return f"{sep}***" if name else sep


# Control characters other than tab: C0 (ESC included), DEL, C1. A terminal acts on them (OSC 52 clipboard writes,
# screen clears, colours that fake an "OK", \r overwriting a line), so foreign text shows them escaped instead.
_CONTROL = re.compile("[\x00-\x08\x0a-\x1f\x7f-\x9f]")
_CONTROL_BUT_NEWLINE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def sanitise(text: str, keep_newlines: bool = False) -> str:
    """`text` safe to print on a terminal: every control character but tab (and newline if asked) as `\\xNN`."""
    pattern = _CONTROL_BUT_NEWLINE if keep_newlines else _CONTROL
    return pattern.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


def foreign(line: str, indent: str = "  ") -> None:
    """Echo one line of text apexkit did not write (a log, a subprocess, a container): secrets masked, control
    characters escaped, Rich markup not interpreted. Log files keep the raw text; only the terminal gets this."""
    console.print(indent + sanitise(mask(line.rstrip("\r\n"))), markup=False)


def echo_command(argv: Sequence[str], cwd: str | None = None) -> None:
    if QUIET:
        return
    line = sanitise(mask(shlex.join(str(a) for a in argv)))
    where = f"  (in {sanitise(cwd)})" if cwd else ""
    console.print(f"[dim]+ {escape(line)}{escape(where)}[/dim]")


def info(message: str) -> None:
    """Progress: hidden under quiet."""
    if not QUIET:
        console.print(sanitise(message, keep_newlines=True), markup=False)


def notice(message: str) -> None:
    """What explains a failure or needs the user's eye (the last lines of a failed build's log): shown under quiet
    too."""
    console.print(sanitise(message, keep_newlines=True), markup=False)


def result(message: str) -> None:
    """A command's result line (the wheel it wrote, the image it tagged): shown under quiet too, on stderr like the
    rest of the log (stdout stays for machine-readable output)."""
    console.print(sanitise(message, keep_newlines=True), markup=False)


def out(message: str) -> None:
    """One line of a report, on stdout (control characters escaped, no markup)."""
    report.print(sanitise(message, keep_newlines=True), markup=False)


def warn(message: str) -> None:
    console.print(f"[yellow]! {escape(sanitise(mask(message), keep_newlines=True))}[/yellow]")


def format_seconds(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.1f}s"
    return f"{int(seconds // 60)}m{seconds % 60:04.1f}s"


def step_key(title: str) -> str:
    """The stable key a step's time is recorded under when its caller names none: the title up to its first " (",
    lower case, runs of other characters than letters and digits as "_", a trailing version dropped
    ("binary checks (identity, ...)" -> "binary_checks", "find python3.11" -> "find_python")."""
    head = re.sub(r"[0-9][0-9.]*$", "", title.split(" (", 1)[0].strip().lower())
    return re.sub(r"[^a-z0-9]+", "_", head).strip("_") or "step"


class Step:
    """A named, timed phase. Use `with step("name") as s:`; `s.note(...)` adds detail to the result line."""

    def __init__(self, name: str, key: str | None = None) -> None:
        self.name = name
        self.key = key or step_key(name)
        self.detail = ""
        self.seconds = 0.0

    def note(self, detail: str) -> None:
        self.detail = detail


_open_steps: list[str] = []  # the titles of the steps open now, outermost first
# called with the innermost open step's title (None: none open) as a step begins and ends; apexkit.statusfile adds
# the one that keeps it beside $APEXKIT_STATUS_FILE for a watching parent (it imports this module, not the reverse)
step_listeners: list[Callable[[str | None], None]] = []


def _note_step(title: str | None) -> None:
    for listener in step_listeners:
        listener(title)


@contextlib.contextmanager
def step(
    name: str, timings: dict[str, float] | None = None, key: str | None = None
) -> Iterator[Step]:
    """Print `name`, time the block, print its result line. With `timings`, a step that completes adds its seconds
    to timings[key] (`key`, else `step_key(name)`: a stable name for a manifest, while the title stays human);
    a step that raises is not recorded."""
    s = Step(name, key)
    shown = escape(sanitise(name))
    if not QUIET:
        console.print(f"[bold]▸ {shown}[/bold]")
    _open_steps.append(name)
    _note_step(name)
    start = time.monotonic()
    try:
        yield s
    except BaseException:
        s.seconds = time.monotonic() - start
        console.print(f"[red]✕ {shown}[/red] ({format_seconds(s.seconds)})")
        raise
    finally:
        _open_steps.pop()
        _note_step(_open_steps[-1] if _open_steps else None)
    s.seconds = time.monotonic() - start
    if timings is not None:
        timings[s.key] = round(timings.get(s.key, 0.0) + s.seconds, 3)
    if QUIET:
        return
    detail = f": {escape(sanitise(mask(s.detail)))}" if s.detail else ""
    console.print(f"[green]✓ {shown}[/green]{detail} ({format_seconds(s.seconds)})")


def is_interactive() -> bool:
    return sys.stderr.isatty()
