"""Issue 27: `apexkit` is the whole CLI -- bash completion for real: the script `apexkit completion bash` prints,
sourced in bash, asked for the word at the cursor the way bash asks (COMP_LINE/COMP_POINT, _ARGCOMPLETE=1)."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys

import pytest
from conftest import ROOT, nox_session

pytest.importorskip("argcomplete")


def _complete(tmp_path, line: str) -> list[str]:
    """COMPREPLY for `line` (cursor at its end), from the registered completion function of a real bash."""
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    entry = bindir / "apexkit"  # the console script a pip install writes, onto this checkout
    entry.write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} -m apexkit "$@"\n')
    entry.chmod(0o755)
    words = line.split(" ")
    script = f"""
set -u
eval "$(apexkit completion bash)"
func=$(complete -p apexkit | sed -n 's/.*-F \\([^ ]*\\) apexkit$/\\1/p')
COMP_LINE={shlex.quote(line)}
COMP_POINT={len(line)}
COMP_WORDS=({" ".join(shlex.quote(w) for w in words)})
COMP_CWORD={len(words) - 1}
COMP_TYPE=9
"$func" apexkit {shlex.quote(words[-1])} {shlex.quote(words[-2])}
printf '%s\\n' "${{COMPREPLY[@]}}"
"""
    env = dict(os.environ, PATH=f"{bindir}{os.pathsep}{os.environ['PATH']}", PYTHONPATH=str(ROOT))
    done = subprocess.run(
        ["bash", "--norc", "--noprofile", "-c", script],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        cwd=str(tmp_path),
    )
    assert done.returncode == 0, done.stderr
    return [w.strip() for w in done.stdout.splitlines() if w.strip()]


def test_bash_completes_the_proxy_commands_from_a_prefix(tmp_path):
    got = _complete(tmp_path, "apexkit pro")
    assert set(got) == {"proxy.setup", "proxy.check", "proxy.show", "proxy.env", "proxy.remove"}, (
        got
    )


def test_bash_completes_a_commands_options(tmp_path):
    got = _complete(tmp_path, "apexkit proxy.setup --ca")
    assert got == ["--ca-cert"], got
    got = _complete(tmp_path, "apexkit matrix --for")
    assert got == ["--format"], got


def _apexkit(tmp_path, *args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "apexkit", *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=str(tmp_path),
        env=dict(os.environ, PYTHONPATH=str(ROOT), **env),
    )


def test_validate_and_bench_help_with_no_wheel_and_no_dist(tmp_path):
    missing = str(tmp_path / "no-dist")  # not even the directory
    validate = _apexkit(tmp_path, "validate", "--help", APEXKIT_DIST_DIR=missing)
    assert validate.returncode == 0, validate.stderr
    assert validate.stdout.startswith("usage: apexkit validate")
    assert "options of validate_env.py (passed through):" in validate.stdout
    assert "--device {npu,cuda,cpu}" in validate.stdout  # the script's own, run by this Python
    bench = _apexkit(tmp_path, "bench", "--help", APEXKIT_DIST_DIR=missing)
    assert bench.returncode == 0, bench.stderr
    assert bench.stdout.startswith("usage: apexkit bench")
    assert (
        "apexkit bench --interpreter PATH --help" in bench.stdout
    )  # amp_bench.py needs torch to list its own
    assert not (tmp_path / "no-dist").exists() and bench.stderr == ""


def test_nox_keeps_its_own_usage_and_messages(tmp_path):
    done = nox_session("matrix", "--help")
    assert done.returncode == 0, done.stderr
    assert "usage: nox -s matrix --" in done.stdout
    empty = tmp_path / "dist"
    empty.mkdir()
    done = nox_session("validate", env=dict(os.environ, APEXKIT_DIST_DIR=str(empty)))
    assert done.returncode != 0
    assert "build one first (nox -s build-3.11)" in done.stderr
