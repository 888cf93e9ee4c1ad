"""`apexkit` / `python -m apexkit`: the command edge. Errors become one line and an exit code in apexkit.exits."""

from __future__ import annotations

import sys

from apexkit.exits import STATUS_FILE, exit_code, record_status, run_in_session, run_task

__all__ = ["STATUS_FILE", "exit_code", "main", "record_status", "run_in_session", "run_task"]


USAGE = """usage: apexkit <command> [options]      (also: python -m apexkit <command>)

  install [--venv DIR] [--index URL]...
                               the one wheel that fits a venv (from the team index, else built), torch untouched
  up [--venv DIR] [--index URL]...
                               one node from bare to validated: doctor, install, validate (, bench); one report
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
        code = 0 if command else 2
        record_status(code, "invalid arguments" if code else None)
        return code
    if command == "build":
        if len(argv) < 2 or argv[1].startswith("-"):
            print(
                "usage: apexkit build <python-version> [options]  (options: apexkit build 3.11 --help)",
                file=sys.stderr,
            )
            record_status(2, "invalid arguments")
            return 2
        from apexkit import commands

        return exit_code(
            lambda: commands.build_wheel(argv[1], argv[2:], prog=f"apexkit build {argv[1]}")
        )
    if command == "matrix":
        from apexkit.fleet import matrixrun

        return exit_code(lambda: matrixrun.main(argv[1:]))
    if command in ("validate", "bench"):
        from apexkit import venvrun

        return exit_code(lambda: venvrun.main(command, argv[1:], prog=f"apexkit {command}"))
    from apexkit import commands

    if (
        command in commands.NAMES
    ):  # doctor, publish, proxy.*, image.*, fleet.*: the invoke tasks' declarations
        return commands.main(command, argv[1:], prog=f"apexkit {command}")
    print(f"apexkit: unknown command {command!r}\n\n{USAGE}", file=sys.stderr)
    record_status(2, "invalid arguments")
    return 2
