"""One word per idea across every command, and the door a message names.

    --python VERSION      a Python version (3.11): which target to build, validate, benchmark
    --interpreter PATH    an interpreter's path: build with it, inspect it (doctor), run with it (validate/bench)
    --jobs N / -j N       compile jobs of one build
    --parallel N          builds at the same time (matrix --run)
    --target ID           select targets by id (dist/<target>, matrix combinations, the index)
    --layers LIST         select proxy layers (shell, daemon, container, pip)
    --ca-cert FILE|none   CA certificates to trust besides the system's (a TLS-intercepting proxy's CA)

The 0.1 spellings (--in-env, --python PATH, --ca-bundle, --only, matrix --jobs, --slurm-python, --node-python)
are gone: nothing was released with them, so they are refused like any unknown option.
"""

from __future__ import annotations

# --- the entry point in use: a message names the command in the form the user can type ---------------------------
#
# Three doors run the same commands: `apexkit X` (the installed CLI), `invoke X` (tasks.py) and `nox -s X --`
# (noxfile.py). The edge that starts a command says which door it is (apexkit.cli.main, apexkit.exits.run_task,
# apexkit.exits.run_in_session); a message asks `command("proxy.setup", "--ca-cert FILE")` and gets that door's form.

APEXKIT, INVOKE, NOX = "apexkit", "invoke", "nox"
# the door in use, and how apexkit itself is typed ("python -m apexkit" when run so: a checkout's venv has no
# `apexkit` script); a library caller (tests, a script) is told the apexkit form
ENTRY = {"name": APEXKIT, "apexkit": "apexkit"}
# commands that only one of invoke / nox has (a message in the other door names the one that has it)
NOX_ONLY = ("matrix", "validate", "bench", "lock", "build-bench")


def set_entry(name: str, typed: str = "apexkit") -> None:
    """Called by the edge: apexkit, invoke or nox; `typed`: how apexkit itself was typed."""
    ENTRY["name"] = name if name in (APEXKIT, INVOKE, NOX) else APEXKIT
    ENTRY["apexkit"] = typed


def entry() -> str:
    return ENTRY["name"]


def command(name: str, args: str = "") -> str:
    """`name` (apexkit's vocabulary: "proxy.setup", "matrix", "doctor") with `args`, as the door in use types it:
    apexkit proxy.setup ARGS, invoke proxy.setup ARGS, nox -s matrix -- ARGS. A command the door lacks is given in
    the door that has it (under nox, proxy.setup is `invoke proxy.setup`; under invoke, matrix is `nox -s matrix`)."""
    door = entry()
    if door == APEXKIT:
        line = f"{ENTRY['apexkit']} {name}"
    elif name in NOX_ONLY or (door == NOX and name == "install"):
        line = f"nox -s {name}" + (" --" if args else "")
    else:
        line = f"invoke {name}"
    return f"{line} {args}" if args else line


def build(python: str = "3.X", args: str = "") -> str:
    """The build of one Python (or a session name such as a stack's) with `args`, as the door in use types it:
    apexkit build 3.11 ARGS, nox -s build-3.11 -- ARGS, invoke build --python 3.11 -- ARGS."""
    door = entry()
    if door == NOX:
        line = f"nox -s build-{python}" + (" --" if args else "")
    elif door == INVOKE:
        line = f"invoke build --python {python}" + (" --" if args else "")
    else:
        line = f"{ENTRY['apexkit']} build {python}"
    return f"{line} {args}" if args else line


def prog(name: str) -> str:
    """An argparse prog for a command's own options, in the door in use: `apexkit matrix`, `nox -s matrix --`."""
    if entry() == APEXKIT:
        return f"apexkit {name}"
    return (build("3.X", "-") if name == "build" else command(name, "-"))[:-2]
