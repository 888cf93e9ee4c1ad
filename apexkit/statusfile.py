"""$APEXKIT_STATUS_FILE: how one apexkit command ended, for the process that started it. nox maps every failed
session to exit 1 and a log is for people, so a parent (CI, the matrix runner, a Slurm job's submitter) reads the
child's own exit code, its one-line error and the dist/<target>/ it wrote from this file instead of parsing output.

The file is written atomically by the child and read back as untrusted input (a node on shared storage may have
written it): a regular file, no link followed, at most 64 KiB, a JSON object whose fields have the right types.

While the command runs, the step it is in (`log.step`'s title) is kept beside it in `<status file>.step`
({"step": title, "since": epoch seconds}), so the parent can say what a long build is doing; the end of the command
removes it. It is progress only: read back with the same rules, and anything odd in it is simply not shown."""

from __future__ import annotations

import contextlib
import json
import math
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from apexkit import fsedit, log, untrusted

VARIABLE = "APEXKIT_STATUS_FILE"
MAX_BYTES = 64 * 1024
STEP_MAX_BYTES = 4 * 1024
STEP_TITLE_MAX = 120  # characters of a step title kept (and shown)


@dataclass(frozen=True)
class Status:
    exit_code: int
    error: str | None = None  # the one-line error (cause -- next: hint), secrets masked
    target_dir: str | None = None  # the dist/<target>/ a build wrote


def write(
    code: int,
    error: str | None = None,
    target_dir: Path | None = None,
    environ: Mapping[str, str] = os.environ,
) -> None:
    """Record the end of this command where $APEXKIT_STATUS_FILE says; nothing when it is unset."""
    path = environ.get(VARIABLE)
    if not path:
        return
    data: dict = {"exit_code": code, "error": log.mask(error) if error else None}
    if target_dir is not None:
        data["target_dir"] = str(target_dir)
    try:
        fsedit.atomic_write(Path(path), (json.dumps(data) + "\n").encode(), 0o644)
    except OSError as exc:
        log.warn(f"cannot write {VARIABLE} {path}: {exc.strerror or exc}")
    _remove_step(Path(path))


def clear(environ: Mapping[str, str] = os.environ) -> None:
    """Remove what an earlier command left at $APEXKIT_STATUS_FILE, as a command starts: one that then ends without
    recording (Ctrl-C in a nox session, a traceback, SIGKILL) leaves no status rather than an old one to be taken
    for its own."""
    path = environ.get(VARIABLE)
    if path:
        # missing, or not ours to remove: write() says so at the end
        with contextlib.suppress(OSError):
            os.unlink(path)
        _remove_step(Path(path))


def step_path(path: Path) -> Path:
    """Where the step a command is in is kept while it runs: beside its status file."""
    return path.with_name(path.name + ".step")


def _remove_step(path: Path) -> None:
    with contextlib.suppress(OSError, ValueError):
        os.unlink(step_path(path))


def note_step(title: str | None, environ: Mapping[str, str] = os.environ) -> None:
    """Record the step this command is in now (None: between steps) where $APEXKIT_STATUS_FILE says, plus ".step";
    nothing when it is unset. Progress only: a failure to write it is not worth a line."""
    path = environ.get(VARIABLE)
    if not path:
        return
    if title is None:
        _remove_step(Path(path))
        return
    data = {"step": log.sanitise(log.mask(title))[:STEP_TITLE_MAX], "since": round(time.time(), 3)}
    with contextlib.suppress(OSError, ValueError):
        fsedit.atomic_write(step_path(Path(path)), (json.dumps(data) + "\n").encode(), 0o644)


def _listen(title: str | None) -> None:
    note_step(title)


log.step_listeners.append(_listen)  # every log.step of this process, from here on


@dataclass(frozen=True)
class Progress:
    step: str  # the title of the step the child is in, control characters escaped
    since: float  # when it began (the child's clock, epoch seconds)


def read_step(path: Path) -> Progress | None:
    """The step the child writing the status file `path` is in now, or None: none recorded, or what is there is
    not a regular file of at most 4 KiB holding {"step": str, "since": finite number} (not shown, never an error)."""
    try:
        data = _read_object(step_path(path), STEP_MAX_BYTES) or {}
    except (untrusted.Untrusted, ValueError, OSError):
        return None
    step, since = data.get("step"), data.get("since")
    if not isinstance(step, str) or not step.strip():
        return None
    if isinstance(since, bool) or not isinstance(since, (int, float)) or not math.isfinite(since):
        return None
    return Progress(log.sanitise(step)[:STEP_TITLE_MAX], float(since))


def _read_object(path: Path, limit: int) -> dict | None:
    """The JSON object in the regular file `path`, read through its folder opened without following a link; None
    when there is no file there. untrusted.Untrusted when the folder or the file is not what it must be."""
    with untrusted.opened_dir(path.parent) as dir_fd:
        if not os.path.lexists(path):
            return None
        return untrusted.read_json_object(path.name, dir_fd, limit)


def read(path: Path) -> Status | None:
    """The status a child left at `path`; None when it left none. untrusted.Untrusted when the file is a link, not
    a regular file, too large, not JSON, or its fields have the wrong types."""
    try:
        data = _read_object(path, MAX_BYTES)
    except untrusted.Untrusted:
        if not os.path.lexists(path.parent):
            return None
        raise
    if data is None:
        return None
    if type(data.get("exit_code")) is not int:
        raise untrusted.Untrusted(f"{untrusted.shown(path.name)} has no integer exit_code")
    for key in ("error", "target_dir"):
        if data.get(key) is not None and not isinstance(data[key], str):
            raise untrusted.Untrusted(f"{untrusted.shown(path.name)}: {key} is not a string")
    if "\0" in (data.get("target_dir") or ""):  # no path holds one; os calls raise ValueError on it
        raise untrusted.Untrusted(f"{untrusted.shown(path.name)}: target_dir holds a NUL")
    error = data.get("error")
    return Status(
        data["exit_code"], log.sanitise(error)[:1000] if error else None, data.get("target_dir")
    )
