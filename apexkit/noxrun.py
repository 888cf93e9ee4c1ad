"""The sessions of one nox invocation agree on the wheel and share `-- ARGS` (`nox -s build-3.8 bench`).

nox runs the sessions of an invocation one after the other in this process: a build session records here the
dist/<target>/ it wrote, or that it wrote none, and validate/bench after it run that target, or stop with one line
when it failed, instead of taking another wheel from dist/. nox gives every session of the invocation the same
`-- ARGS`: where build and validate/bench run together, each takes the options it knows and leaves, in one line,
those only the other takes (`nox -s build-3.11 validate -- --offline --device cpu`: --offline for both, --device for
validate); an option no session of the invocation knows is still refused."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any

from apexkit import declare, log, venvrun
from apexkit.errors import BenchError
from apexkit.exits import run_in_session

RUNS = ("validate", "bench")  # the sessions that run a built wheel
# build session -> the dist/<target>/ it wrote, or why it wrote none
BUILT: dict[str, Path | str] = {}


def _is_build(name: str) -> bool:
    return name.startswith("build-") and name != "build-bench"


def invocation(session) -> list[str]:
    """The sessions of this nox invocation (run, running or queued) in nox's order; [] where nox does not say."""
    manifest: Any = getattr(getattr(session, "_runner", None), "manifest", None)
    try:
        return [r.friendly_name for r, _ in manifest.list_all_sessions() if r in manifest]
    except (AttributeError, TypeError):
        return []


def _minus(argv: list[str], sub: list[str]) -> list[str]:
    """argv without the words of `sub`, a subsequence of it (each taken once, in order)."""
    out, rest = [], list(sub)
    for word in argv:
        if rest and word == rest[0]:
            rest.pop(0)
        else:
            out.append(word)
    return out


def _taken(parser: argparse.ArgumentParser, argv: list[str]) -> list[str]:
    """The words of argv that `parser` takes (its options and their values), in order."""
    return _minus(argv, parser.parse_known_args(argv)[1])


def _leave(name: str, words: list[str], others: list[str]) -> None:
    if words:
        log.info(f"{name}: leaving {' '.join(words)} to {', '.join(others)} (not {name}'s options)")


def build(session, run: Callable[[list[str]], Path | None], prog: str) -> None:
    """A build session: only its own options where validate/bench run in the same invocation; its outcome kept."""
    from apexkit.wheel import options

    name, runs = session.name, [s for s in invocation(session) if s in RUNS]

    def go() -> Path | None:
        argv = list(session.posargs)
        if runs:
            own = _taken(options.parser(prog), argv)
            _leave(name, _minus(argv, own), runs)
            argv = own
        return run(argv)

    BUILT[name] = "failed"
    done = run_in_session(session, go)
    BUILT[name] = done if isinstance(done, Path) else "built no wheel (--dry-run or --help)"


def _built(sessions: list[str], script: str) -> Path | None:
    """The dist/<target>/ the last build of this invocation wrote; None when it has no build; else BenchError."""
    builds = [s for s in sessions if _is_build(s)]
    if not builds:
        return None
    last = builds[-1]
    again = f"nox -s {last} {script}"
    outcome = BUILT.get(last)
    if outcome is None:
        raise BenchError(
            f"{last} has not run before {script} in this nox invocation (listed after it, or nox --parallel)",
            f"run {again}, in that order",
        )
    if isinstance(outcome, Path):
        return outcome
    raise BenchError(
        f"{last} {outcome} in this nox invocation: {script} takes no other wheel from dist/",
        f"fix the build (its error above) and run {again} again, or nox -s {script} -- --target ID for a "
        "wheel already built",
    )


def run(session, script: str) -> None:
    """validate/bench: the target a build of this invocation wrote (else dist/'s newest, named), without the
    options only that build takes."""
    from apexkit.wheel import options

    prog, sessions = f"nox -s {script} --", invocation(session)
    builds = [s for s in sessions if _is_build(s)]

    def go() -> int:
        argv = list(session.posargs)
        if (
            builds
        ):  # the build's options that validate/bench do not take (their own and the script's stay)
            mine = _taken(declare.parser(venvrun.COMMAND, prog), argv)
            theirs = _taken(options.parser(), _minus(argv, mine))
            _leave(script, theirs, builds)
            argv = _minus(argv, theirs)
        return venvrun.main(script, argv, prog, lambda: _built(sessions, script))

    run_in_session(session, go)
