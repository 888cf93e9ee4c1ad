"""Issue 14: two real builds on one cold cache, and a build killed with SIGKILL while it holds its locks.

Before the locks, the second build died in the git mirror's rename (`OSError: [Errno 39] Directory not empty`); now it
waits, says so, and takes what the first one made: one mirror per URL, one build venv, one wheel, the second build a
cache hit."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from conftest import ROOT

TARGET = "py3.11-torch2.13.0-x86_64-master"


def start(repos, cache: Path, tmp: Path, name: str, *args: str) -> subprocess.Popen:
    env = dict(os.environ, **repos.env(cache), APEXKIT_FETCH_BACKOFF="0.05")
    argv = [
        sys.executable,
        "-m",
        "apexkit",
        "build",
        "3.11",
        "--dist",
        str(tmp / name / "dist"),
        "--build-dir",
        str(tmp / name / "build"),
        "--no-smoke-test",
        *args,
    ]
    return subprocess.Popen(
        argv,
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def finish(proc: subprocess.Popen) -> str:
    out, _ = proc.communicate(timeout=900)
    assert proc.returncode == 0, out[-3000:]
    return out


def manifest(tmp: Path, name: str) -> dict:
    return json.loads((tmp / name / "dist" / TARGET / "manifest.json").read_text())


def entries(folder: Path) -> list[Path]:
    return (
        sorted(p for p in folder.iterdir() if p.is_dir() and not p.name.startswith("."))
        if folder.is_dir()
        else []
    )


def test_two_builds_on_one_cold_cache_then_a_killed_lock_holder(repos, tmp_path):
    cache = tmp_path / "cache"
    one, two = start(repos, cache, tmp_path, "one"), start(repos, cache, tmp_path, "two")
    outputs = [finish(one), finish(two)]
    assert any("waiting for the lock on" in out for out in outputs), outputs
    assert all("Traceback" not in out for out in outputs)
    results = [manifest(tmp_path, "one"), manifest(tmp_path, "two")]
    assert sorted(r["cache_hit"] for r in results) == [
        False,
        True,
    ]  # one compiled, the other took its wheel
    assert results[0]["wheel"]["sha256"] == results[1]["wheel"]["sha256"]
    assert len(entries(cache / "git")) == 2  # one mirror per URL (Ascend apex, NVIDIA apex)
    assert len(entries(cache / "venvs")) == 1
    assert len([e for shard in entries(cache / "wheels") for e in entries(shard)]) == 1

    # A build killed (SIGKILL: no cleanup runs) while it holds the wheel-cache entry's lock, mid-compile ...
    killed = start(repos, cache, tmp_path, "killed", "--no-cache")
    deadline = time.monotonic() + 600
    while not list((cache / "wheels").glob("*/*.lock.pid")):
        assert killed.poll() is None and time.monotonic() < deadline, (
            "the build never took the cache-entry lock"
        )
        time.sleep(0.2)
    os.killpg(killed.pid, signal.SIGKILL)
    killed.wait(timeout=60)
    # ... does not block the next build: the kernel released its lock with the process
    after = start(repos, cache, tmp_path, "after")
    out = finish(after)
    assert "wheel cache hit" in out and manifest(tmp_path, "after")["cache_hit"] is True
