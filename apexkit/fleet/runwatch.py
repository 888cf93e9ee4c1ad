"""What `matrix --run` prints while it runs: one line as each combination starts ("▸ [i/N] id: started …"), one as
it ends ("✓ [i/N] id: built in 1m02.3s — apex-….whl"), and, while combinations run, a heartbeat: one line per
running combination with its elapsed time and the step its build is in (from the child's `<status file>.step`,
apexkit.statusfile), printed only when nothing else was printed for the interval ($APEXKIT_MATRIX_HEARTBEAT
seconds, default 30). Scheduling is pure (a clock passed in), so tests drive it with a fake clock."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from apexkit import envvars, log, statusfile

VARIABLE = "APEXKIT_MATRIX_HEARTBEAT"
DEFAULT_SECONDS = 30.0
LOW, HIGH = 1.0, 3600.0
STEP_SHOWN = 60  # characters of the step's title in a heartbeat


def interval(environ: Mapping[str, str]) -> float:
    """$APEXKIT_MATRIX_HEARTBEAT: seconds of quiet before a heartbeat (1 to 3600; default 30); ConfigError else."""
    return envvars.number(environ, VARIABLE, DEFAULT_SECONDS, low=LOW, high=HIGH)


@dataclass
class Running:
    index: int
    started: float  # the watch's clock
    status_file: (
        Path | None
    )  # the child's $APEXKIT_STATUS_FILE, whose ".step" names its current step


class Watch:
    """The start/end lines and the heartbeat of one matrix run. Thread-safe: workers call started()/ended(), a
    pulse thread (or a test) calls beat()."""

    def __init__(
        self,
        total: int,
        seconds: float,
        emit: Callable[[str], None] = log.info,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        read_step: Callable[[Path], statusfile.Progress | None] = statusfile.read_step,
    ) -> None:
        self.total = total
        self.seconds = seconds
        self._emit = emit
        self._clock = clock
        self._wall = wall
        self._read_step = read_step
        self._lock = threading.Lock()
        self._running: dict[str, Running] = {}
        self._last = clock()  # when the last line of any kind was printed

    def _say(self, line: str) -> None:  # with the lock held
        self._emit(line)
        self._last = self._clock()

    def say(self, line: str) -> None:
        """Any other line of the run (it counts as output: the heartbeat waits another interval)."""
        with self._lock:
            self._say(line)

    def label(self, index: int) -> str:
        return f"[{index}/{self.total}]"

    def started(
        self, combo_id: str, index: int, what: str = "", status_file: Path | None = None
    ) -> None:
        with self._lock:
            self._running[combo_id] = Running(index, self._clock(), status_file)
            self._say(f"▸ {self.label(index)} {combo_id}: started{f' ({what})' if what else ''}")

    def ended(self, combo_id: str, index: int, status: str, seconds: float, detail: str) -> None:
        """status: built | cached | failed | refused; detail: the wheel, or why it failed or was refused."""
        mark = "✓" if status in ("built", "cached") else "✕"
        took = f" in {log.format_seconds(seconds)}" if status != "refused" else ""
        with self._lock:
            self._running.pop(combo_id, None)
            self._say(
                f"{mark} {self.label(index)} {combo_id}: {status}{took}"
                + (f" — {detail}" if detail else "")
            )

    def forget(self, combo_id: str) -> None:
        """Stop watching a combination whose end the caller printed itself (a Slurm job's row)."""
        with self._lock:
            self._running.pop(combo_id, None)
            self._last = self._clock()

    def due_in(self) -> float:
        """Seconds until a heartbeat would be due (0: now; a whole interval while nothing runs)."""
        with self._lock:
            if not self._running:
                return self.seconds
            return max(0.0, self._last + self.seconds - self._clock())

    def beat(self) -> list[str]:
        """Print the heartbeat if it is due and something runs: one line per running combination, in their order;
        returns the lines printed (none when not due)."""
        with self._lock:
            now = self._clock()
            if not self._running or now - self._last < self.seconds:
                return []
            lines = []
            for combo_id, run in sorted(self._running.items(), key=lambda kv: kv[1].index):
                lines.append(
                    f"  … {self.label(run.index)} {combo_id}: running "
                    f"{log.format_seconds(now - run.started)}{self._step(run)}"
                )
            for line in lines:
                self._emit(line)
            self._last = now
            return lines

    def _step(self, run: Running) -> str:
        progress = self._read_step(run.status_file) if run.status_file is not None else None
        if progress is None:
            return ""
        ago = self._wall() - progress.since
        # the child's clock: shown only when it is plausible (not ahead of us, not before this combination began)
        plausible = 0 <= ago <= self._clock() - run.started + 5
        title = (
            progress.step
            if len(progress.step) <= STEP_SHOWN
            else progress.step[: STEP_SHOWN - 1] + "…"
        )
        return f", step: {title}" + (f" ({log.format_seconds(ago)})" if plausible else "")

    def pulse(self) -> Callable[[], None]:
        """Start a thread that beats until the returned function is called (which joins it)."""
        stop = threading.Event()

        def loop() -> None:
            while not stop.wait(max(0.05, self.due_in())):
                self.beat()

        thread = threading.Thread(target=loop, name="matrix-heartbeat", daemon=True)
        thread.start()

        def done() -> None:
            stop.set()
            thread.join()

        return done
