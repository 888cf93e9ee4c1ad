"""$APEXKIT_STATUS_FILE: how one apexkit command ended, for the process that started it. nox maps every failed
session to exit 1 and a log is for people, so a parent (CI, the matrix runner, a Slurm job's submitter) reads the
child's own exit code, its one-line error and the dist/<target>/ it wrote from this file instead of parsing output.

The file is written atomically by the child and read back as untrusted input (a node on shared storage may have
written it): a regular file, no link followed, at most 64 KiB, a JSON object whose fields have the right types."""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from apexkit import fsedit, log, untrusted

VARIABLE = "APEXKIT_STATUS_FILE"
MAX_BYTES = 64 * 1024


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


def clear(environ: Mapping[str, str] = os.environ) -> None:
    """Remove what an earlier command left at $APEXKIT_STATUS_FILE, as a command starts: one that then ends without
    recording (Ctrl-C in a nox session, a traceback, SIGKILL) leaves no status rather than an old one to be taken
    for its own."""
    path = environ.get(VARIABLE)
    if path:
        # missing, or not ours to remove: write() says so at the end
        with contextlib.suppress(OSError):
            os.unlink(path)


def read(path: Path) -> Status | None:
    """The status a child left at `path`; None when it left none. untrusted.Untrusted when the file is a link, not
    a regular file, too large, not JSON, or its fields have the wrong types."""
    try:
        dir_fd = untrusted.open_dir(path.parent)
    except untrusted.Untrusted:
        if not os.path.lexists(path.parent):
            return None
        raise
    try:
        if not os.path.lexists(path):
            return None
        data = untrusted.read_json_object(path.name, dir_fd, MAX_BYTES)
    finally:
        os.close(dir_fd)
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
