"""Run a long external command with its full output in a log file and a one-line live progress.

A child runs in a process group of its own that apexkit never leaves behind (`group_child`), and a log is only ever
appended to through the descriptor it was opened as once (`keep_log`, `appending`), never by following a name
someone may have swapped meanwhile.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import os
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

from apexkit import log, untrusted
from apexkit.errors import ConfigError

HEARTBEAT_SECONDS = 30.0
GRACE = 5.0  # seconds what is left of a child's process group has after SIGINT, before SIGKILL
_kept: dict[str, int] = {}  # a log's absolute path -> the descriptor keep_log opened it as


def run_logged(
    argv: Sequence[str],
    log_path: Path,
    *,
    cwd: Path | None = None,
    env: Mapping[str, str] | None = None,
    verbose: bool = False,
    progress: Callable[[str], str | None] | None = None,
) -> tuple[int, list[str]]:
    """Run `argv`, appending stdout+stderr to `log_path`. Returns (exit code, last 60 lines).

    `progress(line)` may turn an output line into a short status ("compiling flatten_unflatten.cpp"); it is shown
    on a live status line when stderr is a terminal, and as a heartbeat every 30 s otherwise (CI logs).
    """
    log.echo_command(argv, str(cwd) if cwd else None)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    tail: deque[str] = deque(maxlen=60)
    state: dict = {"status": "", "start": time.monotonic()}
    with appending(log_path) as fh:
        fh.write(f"\n+ {log.mask(' '.join(map(str, argv)))}\n")
        fh.flush()
        with group_child(
            [str(a) for a in argv],
            death=signal.SIGKILL,
            cwd=cwd,
            env=dict(env) if env is not None else None,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
            bufsize=1,
        ) as proc:
            stop = threading.Event()
            heartbeat = None
            if not verbose and not log.is_interactive() and not log.QUIET:
                heartbeat = threading.Thread(target=_heartbeat, args=(state, stop), daemon=True)
                heartbeat.start()
            status_cm = (
                log.console.status("", spinner="dots")
                if (log.is_interactive() and not verbose and not log.QUIET)
                else None
            )
            live = status_cm.__enter__() if status_cm else None
            try:
                assert proc.stdout is not None
                for line in proc.stdout:
                    fh.write(line)
                    tail.append(line.rstrip("\n"))
                    if verbose:  # the log file keeps the raw line; the terminal gets it with control characters escaped
                        sys.stderr.write(log.sanitise(log.mask(line.rstrip("\r\n"))) + "\n")
                    if progress:
                        new = progress(line)
                        if new:
                            state["status"] = new
                            if live is not None:
                                elapsed = log.format_seconds(time.monotonic() - state["start"])
                                live.update(f"{log.escape(log.sanitise(new))}  [{elapsed}]")
                code = proc.wait()
            finally:
                stop.set()
                if status_cm:
                    status_cm.__exit__(None, None, None)
        fh.write(f"[exit {code}]\n")
    return code, list(tail)


def _heartbeat(state: dict, stop: threading.Event) -> None:
    while not stop.wait(HEARTBEAT_SECONDS):
        elapsed = log.format_seconds(time.monotonic() - state["start"])
        log.info(f"  ... {state['status'] or 'working'} ({elapsed})")


@contextlib.contextmanager
def group_child(
    argv: Sequence[str], *, death: int = signal.SIGINT, grace: float = GRACE, **popen: Any
) -> Iterator[subprocess.Popen]:
    """`subprocess.Popen(argv, **popen)` in a process group of its own, for the length of the `with`; when it ends
    (the child exited, or an exception: Ctrl-C, SIGTERM turned into one), what is left of the group gets SIGINT
    (what Ctrl-C sends), then SIGKILL after `grace` seconds. apexkit killed outright cannot do that: then the kernel
    sends the child `death` (PR_SET_PDEATHSIG; Linux)."""
    child = subprocess.Popen(
        argv, start_new_session=True, preexec_fn=dies_with(os.getpid(), death), **popen
    )
    try:
        yield child
    finally:
        _end_group(child, grace)


def dies_with(parent: int, death: int) -> Callable[[], None] | None:
    """For the child, between fork and exec: `death` when `parent` dies (Linux; elsewhere nothing)."""
    try:
        prctl = ctypes.CDLL(
            None, use_errno=True
        ).prctl  # looked up here: nothing is loaded after the fork
    except (OSError, AttributeError):
        return None

    def arm() -> None:
        prctl(1, int(death))  # PR_SET_PDEATHSIG
        if os.getppid() != parent:  # the parent died before that
            os._exit(130)

    return arm


def _end_group(child: subprocess.Popen, grace: float) -> None:
    """SIGINT to what is left of `child`'s process group, SIGKILL after `grace` seconds (or a second Ctrl-C);
    returns once nothing is left, or after 5 s more."""
    for number, wait in ((signal.SIGINT, grace), (signal.SIGKILL, 5.0)):
        deadline = time.monotonic() + wait
        try:
            os.killpg(child.pid, number)
            while time.monotonic() < deadline:
                child.poll()  # the child itself, once it exits: a zombie still counts as a member
                time.sleep(0.05)
                os.killpg(child.pid, 0)
        except OSError:  # none left (or none we may signal)
            return
        except KeyboardInterrupt:
            continue


@contextlib.contextmanager
def stops_like_ctrl_c() -> Iterator[None]:
    """SIGTERM and SIGHUP (a scheduler, a closed session, a parent stopping us) raise KeyboardInterrupt, as Ctrl-C
    does, so the caller's cleanup runs: children stopped, what was half-written taken back, the report written.
    A signal this process ignores stays ignored (`nohup apexkit install ...` outlives the session), and outside the
    main thread signals stay as they are."""

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    heard = [s for s in (signal.SIGTERM, signal.SIGHUP) if signal.getsignal(s) != signal.SIG_IGN]
    try:
        old = {s: signal.signal(s, interrupt) for s in heard}
    except ValueError:  # not the main thread
        old = {}
    try:
        yield
    finally:
        for number, handler in old.items():
            signal.signal(number, signal.SIG_DFL if handler is None else handler)


@contextlib.contextmanager
def keep_log(path: Path) -> Iterator[None]:
    """The log `path` opened once, afresh (untrusted.open_regular: never through a link, FIFO or hard link), for the
    length of the `with`: every append to it (`appending`) goes to that file, even if a folder above it is swapped
    meanwhile. ConfigError when it is not a regular file of ours."""
    fd = _open_log(path)
    os.ftruncate(fd, 0)
    _kept[os.path.abspath(path)] = fd
    try:
        yield
    finally:
        del _kept[os.path.abspath(path)]
        os.close(fd)


def last_line(text: str | None) -> str:
    """The last non-blank line of a tool's output, for a one-line error; "(no output)" when it printed none."""
    lines = [line for line in (text or "").strip().splitlines() if line.strip()]
    return lines[-1] if lines else "(no output)"


def appending(path: Path) -> TextIO:
    """The log `path`, to append to: through the descriptor `keep_log` holds for it, else opened by name without
    following a link at its end (ConfigError when it is not a regular file)."""
    kept = _kept.get(os.path.abspath(path))
    fd = os.dup(kept) if kept is not None else _open_log(path)
    fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | os.O_APPEND)
    return os.fdopen(fd, "a", encoding="utf-8", errors="replace")


def _open_log(path: Path) -> int:
    try:
        return untrusted.open_regular(path, write=True, one_link=True)
    except untrusted.Refused as exc:
        if exc.error is not None:  # not there to be made, not ours to write: as open() says it
            raise exc.error from None
        raise ConfigError(f"the log {exc}", f"remove it: rm {path}") from None
