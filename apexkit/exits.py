"""Turn apexkit errors into one line and an exit code -- the one place for it: exit_code (`apexkit <command>`),
run_in_session (nox sessions), run_task (invoke tasks); each records $APEXKIT_STATUS_FILE."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from apexkit import log, statusfile, vocab
from apexkit.errors import ApexkitError

T = TypeVar("T")


STATUS_FILE = statusfile.VARIABLE
USAGE_ERROR = "invalid arguments"  # the status file's error of a usage error (exit 2: argparse's, the edge's own)
UNEXPECTED = 70  # an exception apexkit did not turn into its own error: one line, not a traceback
TRACEBACK = (
    "APEXKIT_TRACEBACK"  # =1: let such an exception through, with its traceback (for a bug report)
)


def unexpected(exc: BaseException) -> str | None:
    """One line for an exception that reached the edge without becoming an ApexkitError (an OSError from a file the
    user named, a ValueError from a value nothing checked, a RecursionError from deep input), or None to let it
    through (APEXKIT_TRACEBACK=1, or not an Exception at all)."""
    if os.environ.get(TRACEBACK) == "1" or not isinstance(exc, Exception):
        return None
    if isinstance(exc, OSError):
        where = f" ({exc.filename})" if getattr(exc, "filename", None) else ""
        cause = f"{exc.strerror or exc}{where}"
    else:
        cause = str(exc) or "(no message)"
    text = log.sanitise(log.mask(f"{type(exc).__name__}: {cause}"))
    first = (text.splitlines() or [""])[0][:300]
    return (
        f"{first} -- next: check the input it names; if it looks right, this is an apexkit bug: "
        f"rerun with {TRACEBACK}=1 and report the traceback"
    )


def record_status(code: int, error: str | None = None, result: object = None) -> None:
    """With $APEXKIT_STATUS_FILE set, write {"exit_code": N, "error": "...", "target_dir": "..."} there (apexkit.
    statusfile): nox maps every failed session to exit 1, so CI and the matrix runner read apexkit's own code
    (2 configuration, 4 sources, 7 build, ...) and the dist/<target>/ a build wrote from this file."""
    target_dir = result if isinstance(result, Path) and result.is_dir() else None
    statusfile.write(code, error, target_dir)


def settle(func: Callable[[], T], codes: bool = True) -> tuple[int, str | None, T | None]:
    """The one mapping of what `func` did onto an exit code: (code, the error's one line or None, its result), the
    same in $APEXKIT_STATUS_FILE. An ApexkitError is its own code, another Exception UNEXPECTED (or let through, see
    `unexpected`), argparse's SystemExit is recorded and raised again; with `codes`, an int result is the exit code
    (a nox session's never is: its code is nox's)."""
    statusfile.clear()
    line: str | None = None
    result: T | None = None
    try:
        result = func()
    except ApexkitError as exc:
        code, line = exc.exit_code, exc.format()
    except (
        SystemExit
    ) as exc:  # argparse: --help (0) or a usage error (2), recorded, then on its way
        failed = exc.code not in (0, None)
        record_status(2 if failed else 0, USAGE_ERROR if failed else None)
        raise
    except Exception as exc:
        line = unexpected(exc)
        if line is None:
            raise
        code = UNEXPECTED
    else:
        code = result if codes and isinstance(result, int) else 0
    record_status(code, line, result)
    return code, line, result


def run_in_session(session, func: Callable[[], T]) -> T | None:
    """Call `func` inside a nox session: an ApexkitError aborts the session with its one line, no traceback."""
    vocab.set_entry(
        vocab.NOX
    )  # its messages name nox sessions (and invoke for the tasks nox has not)
    try:
        _, line, result = settle(func, codes=False)
    except SystemExit as exc:  # argparse's, recorded by settle
        if exc.code not in (0, None):
            session.error("invalid arguments (see the usage line above; -- --help lists them)")
        return None
    if line is not None:
        session.error(line)
    return result


def run_task(func: Callable[[], object]) -> None:
    """Call `func` for an invoke task: an ApexkitError is one `error:` line and its exit code, a non-zero int result
    is the exit code (invoke.Exit either way)."""
    from invoke import Exit

    vocab.set_entry(
        vocab.INVOKE
    )  # its messages name invoke tasks (and nox for the sessions invoke has not)
    code, line, _ = settle(func)
    if line is not None:
        raise Exit(f"error: {log.mask(line)}", code=code)
    if code:
        raise Exit(code=code)


def exit_code(func: Callable[[], object]) -> int:
    """Call `func` from a plain command line: its int result is the exit code (anything else: 0), an ApexkitError is
    one `error:` line and its exit code, Ctrl-C is 130."""
    try:
        code, line, _ = settle(func)
    except KeyboardInterrupt:
        log.console.print("interrupted", style="red")
        record_status(130, "interrupted")
        return 130
    if line is not None:
        log.console.print(
            f"[red]error:[/red] {log.escape(log.mask(line))}", highlight=False, markup=True
        )
    return code
