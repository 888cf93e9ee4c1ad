"""`apexkit` / `python -m apexkit`: the command edge, and the whole CLI: every invoke task (apexkit.commands.COMMANDS)
and every nox session a user runs (build, matrix, validate, bench) under one name, with --help, --version and bash
completion (argcomplete). Errors become one line and an exit code in apexkit.exits. The maintainers' tools (tools/:
nox -s lock, build-bench, contracts, refresh) are nox sessions of a checkout, not apexkit commands."""

from __future__ import annotations

import os
import sys

from apexkit import log, vocab
from apexkit.exits import (
    STATUS_FILE,
    USAGE_ERROR,
    exit_code,
    record_status,
    run_in_session,
    run_task,
)

__all__ = ["STATUS_FILE", "exit_code", "main", "record_status", "run_in_session", "run_task"]

# The commands that are not invoke tasks (apexkit.commands declares those): name, what follows it, one line.
OTHERS = (
    (
        "matrix",
        "[options]",
        "The build matrix of matrix.toml: a table, GitHub JSON, or --run to build it",
    ),
    (
        "validate",
        "[options]",
        "Environment checks in the built wheel's venv (bench/validate_env.py)",
    ),
    (
        "bench",
        "[options]",
        "The FP32-vs-AMP benchmark in the built wheel's venv (bench/amp_bench.py)",
    ),
    ("completion", "bash", 'Print the bash completion script: eval "$(apexkit completion bash)"'),
)
# the order of --help: the newcomer's commands first, then the groups
ORDER = ("doctor", "config.", "proxy.", "build", "install", "up", "matrix", "validate", "bench", "publish", "image.",
         "fleet.", "cache.", "completion")  # fmt: skip
# the maintainers' tools that were apexkit commands: nox sessions of a checkout now (tools/), never shipped
MAINTAINERS = ("lock", "build-bench", "contracts")
WIDTH = 88  # characters of one help line's description


def summary(doc: str, width: int = WIDTH) -> str:
    """A declaration's doc as one help line: its first sentence, cut at a clause (then a word) to fit `width`."""
    text = doc.split(". ")[0].rstrip(".")
    for stop in ("; ", ": ", " ("):
        if len(text) > width and stop in text[20:]:
            text = text[: 20 + text[20:].index(stop)]
    if text.count("(") > text.count(")"):  # cut inside a parenthesis: drop it
        text = text[: text.rindex(" (")]
    if len(text) > width:
        text = text[: width - 1].rsplit(" ", 1)[0] + "…"
    return text


def entries() -> list[tuple[str, str, str]]:
    """(name, usage after the name, one line) for every apexkit command, in --help's order."""
    from apexkit import commands

    found = [
        (c.name, "<python> [options]" if c.name == "build" else "[options]", summary(c.doc))
        for c in commands.COMMANDS
    ] + list(OTHERS)

    def rank(entry: tuple[str, str, str]) -> int:
        name = entry[0]
        return next(
            (
                i
                for i, key in enumerate(ORDER)
                if name == key or (key.endswith(".") and name.startswith(key))
            ),
            len(ORDER),
        )

    return sorted(found, key=rank)  # sorted() keeps the declarations' order within a group


def usage() -> str:
    rows = entries()
    left = max(len(f"{name} {args}") for name, args, _ in rows if name in ("build", "completion"))
    lines = [
        "usage: apexkit [-q] <command> [options] (also: python -m apexkit <command>)",
        "       apexkit <command> --help         the options of one command",
        "       apexkit --version",
        "  -q, --quiet  errors, warnings and each command's result only (also APEXKIT_QUIET=1; logs keep it all)",
        "",
        "commands:",
    ]
    for name, args, line in rows:
        shown = f"{name} {args}" if name in ("build", "completion") else name
        lines.append(f"  {shown:<{left}}  {line}")
    lines += [
        "",
        "start here: apexkit doctor -> apexkit build 3.11 -> apexkit validate -> apexkit publish --index DIR",
        "           (behind a proxy: apexkit proxy.setup --http URL, then apexkit proxy.check)",
        "the same commands run as nox sessions (nox -l) and invoke tasks (invoke --list) in a checkout",
    ]
    return "\n".join(lines) + "\n"


def version() -> str:
    """apexkit's version and the Python it runs on."""
    import apexkit

    return f"apexkit {apexkit.__version__} (Python {sys.version.split()[0]}, {sys.executable or 'python'})"


def full_parser():
    """Every command as one argparse tree, for completion (argcomplete walks it): the parsers the commands use."""
    import argparse

    from apexkit import commands, declare, venvrun
    from apexkit.fleet import matrixrun
    from apexkit.wheel import options

    top = argparse.ArgumentParser(
        prog="apexkit", description="apexkit: build Apex for Ascend wheels"
    )
    top.add_argument("--version", action="store_true", help="apexkit's version and its Python")
    top.add_argument(
        "-q", "--quiet", action="store_true", help="errors, warnings and each command's result only"
    )
    sub = top.add_subparsers(dest="command", metavar="COMMAND")
    declared = {**commands.BY_NAME, "validate": venvrun.COMMAND, "bench": venvrun.COMMAND,
                "matrix": matrixrun.COMMAND}  # fmt: skip
    for name, _, line in entries():
        if name == "build":
            p = sub.add_parser(
                name, parents=[options.parser("apexkit build 3.X")], add_help=False, help=line
            )
            p.add_argument("target_python", metavar="PYTHON", nargs="?", help="3.X")
            continue
        parents = [declare.parser(declared[name], f"apexkit {name}")] if name in declared else []
        p = sub.add_parser(name, parents=parents, add_help=not parents, help=line)
        if name == "completion":
            p.add_argument("shell", choices=("bash",))
    return top


def complete() -> None:
    """Under bash completion (_ARGCOMPLETE set by the script `apexkit completion bash` prints): the candidates for
    the word at the cursor, then exit. Without argcomplete, no candidates (a TAB must not print an error)."""
    try:
        import argcomplete
    except ImportError:
        sys.exit(1)
    argcomplete.autocomplete(full_parser())
    sys.exit(1)  # autocomplete exits itself when it answered


def answer(text: str, code: int = 0, error: str | None = None) -> int:
    """The edge's own answers (help, version, usage errors): `text` on stdout, or on stderr when `code` is not 0,
    `code` and `error` in the status file, and `code` returned."""
    print(text, file=sys.stderr if code else sys.stdout)
    record_status(code, error)
    return code


def completion(argv: list[str]) -> int:
    if argv in (["-h"], ["--help"]):
        return answer(
            'usage: apexkit completion bash\n\nPrint the bash completion script: eval "$(apexkit completion bash)"'
        )
    if argv != ["bash"]:
        given = " ".join(argv) or "no shell"
        line = (
            f'apexkit completion knows bash, not {given} -- next: eval "$(apexkit completion bash)"'
        )
        return answer(f"error: {line}", 2, USAGE_ERROR)
    try:
        import argcomplete
    except ImportError:
        return answer(
            "error: argcomplete is not installed in this Python -- next: python -m pip install argcomplete "
            '(requirements/runtime.txt brings it), then eval "$(apexkit completion bash)"',
            3,
            "argcomplete is not installed",
        )
    sys.stdout.write(argcomplete.shellcode(["apexkit"], shell="bash"))
    record_status(0)
    return 0


def _help(argv: list[str]) -> int:
    # bare `apexkit`: the help on stderr, exit 2 -- a script that forgot its command must not pass as a success
    if argv:
        return answer(usage().rstrip("\n"))
    return answer(usage().rstrip("\n"), 2, USAGE_ERROR)


def _build(argv: list[str]) -> int:
    if len(argv) >= 2 and argv[1] in ("-h", "--help"):
        from apexkit.wheel import options

        return answer(options.parser("apexkit build <python>").format_help().rstrip("\n"))
    if len(argv) < 2 or argv[1].startswith("-"):
        return answer(
            "usage: apexkit build <python-version> [options]  (options: apexkit build 3.11 --help)",
            2,
            USAGE_ERROR,
        )
    from apexkit import commands

    return exit_code(
        lambda: commands.build_wheel(argv[1], argv[2:], prog=f"apexkit build {argv[1]}")
    )


def _matrix(argv: list[str]) -> int:
    from apexkit.fleet import matrixrun

    return exit_code(lambda: matrixrun.main(argv[1:]))


def _venvrun(argv: list[str]) -> int:
    from apexkit import venvrun

    return exit_code(lambda: venvrun.main(argv[0], argv[1:], prog=f"apexkit {argv[0]}"))


# the commands that are not declared in apexkit.commands: name -> what runs it (given the whole argv)
DOORS = {
    **dict.fromkeys(("", "-h", "--help", "help"), _help),
    **dict.fromkeys(("--version", "-V", "version"), lambda argv: answer(version())),
    "build": _build,
    "matrix": _matrix,
    "validate": _venvrun,
    "bench": _venvrun,
    "completion": lambda argv: completion(argv[1:]),
}


def main(argv: list[str] | None = None) -> int:
    """`apexkit` / `python -m apexkit`: every command of the nox sessions and invoke tasks, without nox or invoke on
    the command line (inside builder images, from a pip-installed apexkit)."""
    # `python -m apexkit` (a checkout's venv has no `apexkit` script): its messages say so too
    typed = (
        "python -m apexkit" if argv is None and sys.argv[0].endswith("__main__.py") else "apexkit"
    )
    vocab.set_entry(vocab.APEXKIT, typed)
    if os.environ.get("_ARGCOMPLETE"):
        complete()
    argv = list(sys.argv[1:] if argv is None else argv)
    while argv and argv[0] in (
        "-q",
        "--quiet",
    ):  # before the command: the whole run, and what it starts
        log.set_quiet(True)
        argv.pop(0)
    from apexkit import commands

    if len(argv) >= 2 and f"{argv[0]}.{argv[1]}" in commands.NAMES:
        argv[:2] = [f"{argv[0]}.{argv[1]}"]  # `apexkit cache list` is `apexkit cache.list`
    command = argv[0] if argv else ""
    if command in DOORS:
        return DOORS[command](argv)
    if (
        command in commands.NAMES
    ):  # doctor, publish, proxy.*, image.*, fleet.*: the invoke tasks' declarations
        return commands.main(command, argv[1:], prog=f"apexkit {command}")
    return unknown(command)


def unknown(command: str) -> int:
    """One line for a command apexkit does not have, with the nearest one it has (a maintainer's tool: its session)."""
    import difflib

    names = [name for name, _, _ in entries()] + ["--help", "--version"]
    near = difflib.get_close_matches(command, names, n=1)
    hint = f"did you mean apexkit {near[0]}? " if near else ""
    if command in MAINTAINERS:
        hint = f"it is a maintainers' tool: nox -s {command} in a checkout of apexkit; "
    line = f"unknown command {command[:80]!r} -- next: {hint}apexkit --help lists the commands"
    return answer(f"error: {log.sanitise(line)}", 2, USAGE_ERROR)
