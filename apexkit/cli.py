"""Turn apexkit errors into one line and an exit code, for the CLI, nox sessions and invoke tasks."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from apexkit import fsedit, log
from apexkit.errors import ApexkitError

T = TypeVar("T")


STATUS_FILE = "APEXKIT_STATUS_FILE"


def record_status(code: int, error: str | None = None) -> None:
    """With $APEXKIT_STATUS_FILE set, write {"exit_code": N, "error": "..."} there: nox maps every failed session to
    exit 1, so CI reads apexkit's own code (2 configuration, 4 sources, 7 build, ...) from this file."""
    path = os.environ.get(STATUS_FILE)
    if not path:
        return
    data = {"exit_code": code, "error": log.mask(error) if error else None}
    try:
        fsedit.atomic_write(Path(path), (json.dumps(data) + "\n").encode(), 0o644)
    except OSError as exc:
        log.warn(f"cannot write {STATUS_FILE} {path}: {exc.strerror or exc}")


def run_in_session(session, func: Callable[[], T]) -> T | None:
    """Call `func` inside a nox session: an ApexkitError aborts the session with its one line, no traceback."""
    try:
        result = func()
    except ApexkitError as exc:
        record_status(exc.exit_code, exc.format())
        session.error(exc.format())
    except SystemExit as exc:  # argparse: --help (0) or a usage error (2)
        if exc.code not in (0, None):
            record_status(2, "invalid arguments")
            session.error("invalid arguments (see the usage line above; -- --help lists them)")
        record_status(0)
    else:
        record_status(0)
        return result
    return None


def exit_code(func: Callable[[], object]) -> int:
    """Call `func` from a plain command line: its int result is the exit code (anything else: 0), an ApexkitError is
    one `error:` line and its exit code, Ctrl-C is 130."""
    try:
        result = func()
    except ApexkitError as exc:
        log.console.print(f"[red]error:[/red] {log.escape(log.mask(exc.format()))}", highlight=False, markup=True)
        record_status(exc.exit_code, exc.format())
        return exc.exit_code
    except KeyboardInterrupt:
        log.console.print("interrupted", style="red")
        record_status(130, "interrupted")
        return 130
    code = result if isinstance(result, int) else 0
    record_status(code)
    return code


USAGE = """usage: apexkit <command> [options]      (also: python -m apexkit <command>)

  build <python> [options]     build the wheel for Python 3.X (the options of nox -s build-3.X --; --help lists them)
  doctor [--json] [--log FILE] [--venv DIR | --interpreter PATH] [--scripts DIR]
  matrix [options]             the build matrix (the options of nox -s matrix --)
  validate [options]           checks in the built wheel's venv (nox -s validate --)
  bench [options]              the FP32-vs-AMP benchmark in the built wheel's venv (nox -s bench --)
  publish, proxy.<task>, image.<task>, fleet.<task> [options]
                               the invoke tasks, same options (invoke --list; apexkit proxy.setup --help)
"""


def main(argv: list[str] | None = None) -> int:
    """`apexkit` / `python -m apexkit`: every command of the nox sessions and invoke tasks, without nox or invoke on
    the command line (inside builder images, from a pip-installed apexkit)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    command = argv[0] if argv else ""
    if command in ("", "-h", "--help", "help"):
        print(USAGE, file=sys.stdout if command else sys.stderr)
        return 0 if command else 2
    if command == "build":
        if len(argv) < 2 or argv[1].startswith("-"):
            print("usage: apexkit build <python-version> [options]  (options: apexkit build 3.11 --help)",
                  file=sys.stderr)
            return 2
        from apexkit.build import builder as build

        return exit_code(lambda: build.main(argv[1], argv[2:], prog=f"apexkit build {argv[1]}"))
    if command == "matrix":
        from apexkit.matrix import run as matrixrun

        return exit_code(lambda: matrixrun.main(argv[1:]))
    if command in ("validate", "bench"):
        from apexkit.validate import run as runbench

        return exit_code(lambda: runbench.main(command, argv[1:], prog=f"apexkit {command}"))
    from apexkit import commands

    if command in commands.NAMES:  # doctor, publish, proxy.*, image.*, fleet.*: the invoke tasks' declarations
        return commands.main(command, argv[1:], prog=f"apexkit {command}")
    print(f"apexkit: unknown command {command!r}\n\n{USAGE}", file=sys.stderr)
    return 2
