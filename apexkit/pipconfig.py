"""pip's effective configuration, read once for what hands it on: the index client (index/client.py) and uv
(wheel/uvtools.py), which does not read pip.conf itself.

pip resolves its own files, and `python -m pip config list` prints the result: one `section.key='value'` line per
key, the files merged global < user < site < PIP_CONFIG_FILE, and the PIP_* variables as `:env:.key`. What a pip
command then uses is pip's own order (pip/_internal/cli/parser.py, `_get_ordered_configuration_items`): [global],
then the section named like the command ([install] for `pip install`; [download] or [freeze] count only for those
commands), then the environment; an empty value is ignored. `parse` applies that order to the list; where pip does
not run, the PIP_* variables alone are used, as pip would read them.
"""

from __future__ import annotations

import ast
import functools
import os
import re
import subprocess
import sys
import typing
from collections.abc import Iterator, Mapping

COMMAND = "install"  # the pip command whose view apexkit takes: it installs (uv) and reads the index as install does
# what decides which files pip reads: the variables that locate them (XDG, HOME) and pip's own
LOCATION_VARIABLES = ("HOME", "XDG_CONFIG_HOME", "XDG_CONFIG_DIRS")
_ENV_IGNORED = ("version", "help")  # pip/_internal/configuration.py ENV_NAMES_IGNORED
_LINE = re.compile(
    r"^(?P<section>:env:|[^.=\s]+)\.(?P<key>[A-Za-z0-9_.-]+)=(?P<value>(['\"]).*\4)$"
)


class PipConfig(typing.Mapping[str, str]):  # collections.abc.Mapping[...] needs Python 3.9
    """option name (as in pip.conf: index-url, extra-index-url, cert, ...) -> the value pip would use."""

    def __init__(self, values: Mapping[str, str] | None = None) -> None:
        self._values = dict(values or {})

    def __getitem__(self, key: str) -> str:
        return self._values[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __repr__(self) -> str:
        return f"PipConfig({self._values!r})"

    def get_list(self, key: str) -> list[str]:
        """A value that holds several (extra-index-url, find-links, trusted-host): split on whitespace, as pip does."""
        return self._values.get(key, "").split()


# option names pip accepts for one setting (cmdoptions: --timeout/--default-timeout share a dest), by the one used
_ALIASES = {"default-timeout": "timeout"}


def _normalize(name: str) -> str:
    """pip's `_normalize_name`: lower case, '-' for '_'."""
    name = name.lower().replace("_", "-")
    return name[2:] if name.startswith("--") else name


def parse(text: str, command: str = COMMAND) -> PipConfig:
    """`pip config list` output -> what `pip <command>` uses: [global] < [<command>] < PIP_* (`:env:`); empty values
    ignored; lines pip does not print this way are skipped."""
    order = ("global", command, ":env:")
    chosen: dict[str, tuple[int, str]] = {}
    for line in text.splitlines():
        match = _LINE.match(line.strip())
        if not match or match["section"] not in order:
            continue
        try:
            value = ast.literal_eval(
                match["value"]
            )  # pip prints repr(): a multi-line value shows as '\n'
        except (ValueError, SyntaxError):
            continue
        if not isinstance(value, str) or not value:
            continue
        key, rank = _normalize(match["key"]), order.index(match["section"])
        key = _ALIASES.get(key, key)
        if key not in chosen or rank >= chosen[key][0]:
            chosen[key] = (rank, value)
    return PipConfig({key: value for key, (_, value) in chosen.items()})


def from_environment(env: Mapping[str, str]) -> PipConfig:
    """The PIP_* variables alone, named as pip names them (PIP_INDEX_URL -> index-url); empty ones ignored."""
    return PipConfig(
        {
            _ALIASES.get(_normalize(key[4:]), _normalize(key[4:])): value
            for key, value in env.items()
            if key.startswith("PIP_") and value and key[4:].lower() not in _ENV_IGNORED
        }
    )


def read(
    env: Mapping[str, str] | None = None, python: str = sys.executable, command: str = COMMAND
) -> PipConfig:
    """What `pip <command>` run by `python` would use, with the config files and PIP_* variables of `env` (default:
    this process's environment); the PIP_* variables alone where pip does not run."""
    env = os.environ if env is None else env
    relevant = tuple(
        sorted((k, v) for k, v in env.items() if k.startswith("PIP_") or k in LOCATION_VARIABLES)
    )
    return _read(relevant, python, command)


@functools.lru_cache(maxsize=8)
def _read(relevant: tuple[tuple[str, str], ...], python: str, command: str) -> PipConfig:
    # pip's files and variables come from `env` alone; everything else (PATH, locale) from this process
    child = {
        **{
            k: v
            for k, v in os.environ.items()
            if not k.startswith("PIP_") and k not in LOCATION_VARIABLES
        },
        **dict(relevant),
    }
    try:
        proc = subprocess.run(
            [python, "-m", "pip", "config", "list"],
            capture_output=True,
            text=True,
            timeout=60,
            env=child,
        )
    except (OSError, subprocess.TimeoutExpired):
        proc = None
    if proc is not None and proc.returncode == 0:
        return parse(proc.stdout, command)
    return from_environment(dict(relevant))
