"""Run a long external command with its full output in a log file and a one-line live progress."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from apexkit import log

HEARTBEAT_SECONDS = 30.0


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
    with open(log_path, "a", encoding="utf-8", errors="replace") as fh:
        fh.write(f"\n+ {log.mask(' '.join(map(str, argv)))}\n")
        fh.flush()
        proc = subprocess.Popen(
            [str(a) for a in argv],
            cwd=cwd,
            env=dict(env) if env is not None else None,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
            bufsize=1,
        )
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
        except BaseException:
            proc.kill()
            proc.wait()
            raise
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
