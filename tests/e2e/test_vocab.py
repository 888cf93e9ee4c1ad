"""One word per idea across the commands (apexkit/vocab.py) on the real command lines: the old spellings still work,
one line each. The vocabulary in-process is in tests/unit/test_vocab.py."""

from __future__ import annotations

import subprocess
import sys

from conftest import ROOT

DEPRECATED = "is deprecated: use"


def invoke(*args, env=None):
    return subprocess.run(
        [sys.executable, "-m", "invoke", "-r", str(ROOT), *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env=env,
    )


def test_invoke_proxy_layers_and_the_old_only(tmp_path):
    fsroot = tmp_path / "root"
    (fsroot / "home").mkdir(parents=True)
    new = invoke(
        "proxy.setup",
        "--http",
        "http://proxy.corp:3128",
        "--layers",
        "shell",
        "--root",
        str(fsroot),
        "--dry-run",
    )
    assert new.returncode == 0, new.stderr
    assert DEPRECATED not in new.stderr
    old = invoke(
        "proxy.setup",
        "--http",
        "http://proxy.corp:3128",
        "--only",
        "shell",
        "--root",
        str(fsroot),
        "--dry-run",
    )
    assert old.returncode == 0, old.stderr
    assert old.stderr.count(DEPRECATED) == 1 and "--only is deprecated: use --layers" in old.stderr
    both = invoke(
        "proxy.setup",
        "--http",
        "http://proxy.corp:3128",
        "--only",
        "shell",
        "--layers",
        "pip",
        "--root",
        str(fsroot),
        "--dry-run",
    )
    assert both.returncode == 2 and both.stderr.strip().splitlines()[-1].startswith(
        "error: --only and --layers"
    )
    assert "Traceback" not in both.stderr


def test_doctor_interpreter_and_its_old_spelling():
    args = ["-m", "apexkit", "doctor", "--json", "--venv", "/nonexistent-venv"]
    for spelling in ("--interpreter", "--python"):
        proc = subprocess.run(
            [sys.executable, *args, spelling, sys.executable],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=ROOT,
        )
        assert proc.returncode == 2, proc.stderr
        assert (DEPRECATED in proc.stderr) == (spelling == "--python")
        assert "Traceback" not in proc.stderr


def test_apexkit_commands_take_required_values_positionally_or_as_flags(tmp_path):
    base = [sys.executable, "-m", "apexkit", "image.build"]
    for argv in (
        ["x86_64", "debootstrap:bookworm"],
        ["--arch", "x86_64", "--base", "debootstrap:bookworm"],
    ):
        proc = subprocess.run(
            [*base, *argv, "--dry-run", "--ca-cert", "none"],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=ROOT,
        )
        assert proc.returncode == 0 and "dry run" in proc.stderr, proc.stderr[-1500:]
    missing = subprocess.run(
        [*base, "x86_64", "--dry-run"], capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    assert missing.returncode == 2 and "BASE is required (or --base VALUE)" in missing.stderr
    status = tmp_path / "status.json"
    import os

    subprocess.run(
        [sys.executable, "-m", "apexkit", "fleet.report", "--bogus"],
        capture_output=True,
        cwd=ROOT,
        env={**os.environ, "APEXKIT_STATUS_FILE": str(status)},
        timeout=120,
    )
    assert '"exit_code": 2' in status.read_text()  # a usage error is recorded like any other exit
