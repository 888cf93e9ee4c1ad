"""One word per idea across every command, and the old spellings kept for one release.

    --python VERSION      a Python version (3.11): which target to build, validate, benchmark
    --interpreter PATH    an interpreter's path: build with it, inspect it (doctor), run with it (validate/bench)
    --jobs N / -j N       compile jobs of one build
    --parallel N          builds at the same time (matrix --run)
    --target ID           select targets by id (dist/<target>, matrix combinations, the index)
    --layers LIST         select proxy layers (shell, daemon, container, pip)
    --ca-cert FILE|none   CA certificates to trust besides the system's (a TLS-intercepting proxy's CA)

An old spelling still works until apexkit REMOVED_IN and says once, on stderr, which one replaces it.
"""

from __future__ import annotations

import argparse

from apexkit import log

REMOVED_IN = "0.2"


def deprecated(old: str, new: str) -> None:
    """The one line an old spelling prints."""
    log.warn(f"{old} is deprecated: use {new} (the old spelling goes in apexkit {REMOVED_IN})")


def pick(new_value, old_value, old: str, new: str):
    """For keyword interfaces (invoke tasks): the new option's value, else the old one's with the deprecation line."""
    if old_value in (None, "", [], ()):
        return new_value
    deprecated(old, new)
    if new_value not in (None, "", [], ()) and new_value != old_value:
        from apexkit.errors import ConfigError

        raise ConfigError(f"{old} and {new} both given, with different values", f"keep only {new}")
    return old_value


class _Alias(argparse.Action):
    def __init__(self, option_strings, dest, new: str = "", **kwargs) -> None:
        self.new = new
        super().__init__(option_strings, dest, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        used = namespace.__dict__.setdefault(USED, {})
        if self.dest not in used:  # one deprecation line per option, however often it is given
            deprecated(option_string or self.option_strings[0], self.new)
        value = self.const if self.nargs == 0 else values
        current = getattr(namespace, self.dest, None)
        if isinstance(current, list) or isinstance(
            self.default, list
        ):  # an `append` option: a new list
            setattr(namespace, self.dest, [*(current or []), value])
            used[self.dest] = None  # several values are the point: no conflict to find
        else:
            if used.get(self.dest) and used[self.dest][0] == option_string and current != value:
                parser.error(
                    f"{option_string} given twice ({used[self.dest][1]}, {value}): give {self.new} once"
                    + (", comma separated" if self.new == "--layers" else "")
                )
            if current not in (None, parser.get_default(self.dest), value):
                parser.error(
                    f"{option_string} and {self.new} both given, with different values: keep only {self.new}"
                )
            setattr(namespace, self.dest, value)
            used[self.dest] = (option_string, value)


USED = "_renamed_options_used"


def finish(args) -> None:
    """After parsing: an old spelling given, then the new one with another value (argparse keeps the last) is the
    same one-line error as the other order. Takes the parsed Namespace or its vars()."""
    values = args if isinstance(args, dict) else vars(args)
    for dest, seen in (values.pop(USED, None) or {}).items():
        if seen is not None and values.get(dest) != seen[1]:
            from apexkit.errors import ConfigError

            raise ConfigError(
                f"{seen[0]} and its new spelling both given, with different values",
                "keep only the new spelling (docs/commands.md)",
            )


def alias(parser, old: str, new: str, dest: str, **kwargs) -> None:
    """Register `old` as a hidden spelling of the option `new` (same dest, same type)."""
    parser.add_argument(old, dest=dest, action=_Alias, new=new, help=argparse.SUPPRESS, **kwargs)


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
