"""One word per idea across the commands (apexkit/vocab.py) on the real command lines; the 0.1 spellings are refused
like any unknown option. The vocabulary in-process is in tests/unit/test_vocab.py."""

from __future__ import annotations

import subprocess
import sys

from conftest import ROOT


def invoke(*args, env=None):
    return subprocess.run(
        [sys.executable, "-m", "invoke", "-r", str(ROOT), *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env=env,
    )


def test_invoke_proxy_layers_and_the_old_only_refused(tmp_path):
    fsroot = tmp_path / "root"
    (fsroot / "home").mkdir(parents=True)
    base = ["proxy.setup", "--http", "http://proxy.corp:3128", "--root", str(fsroot), "--dry-run"]
    new = invoke(*base, "--layers", "shell")
    assert new.returncode == 0 and "dry run" in new.stderr, new.stderr
    old = invoke(
        *base, "--only", "shell"
    )  # the 0.1 spelling: gone, refused by invoke as an unknown flag
    assert old.returncode != 0 and "--only" in old.stderr and "Traceback" not in old.stderr, (
        old.stderr
    )
    assert not any((fsroot / "home").iterdir())


def test_doctor_interpreter_and_the_old_python_refused():
    def doctor(flag: str) -> subprocess.CompletedProcess:
        argv = [
            "-m",
            "apexkit",
            "doctor",
            "--json",
            "--venv",
            "/nonexistent-venv",
            flag,
            sys.executable,
        ]
        return subprocess.run(
            [sys.executable, *argv], capture_output=True, text=True, timeout=120, cwd=ROOT
        )

    new = doctor("--interpreter")
    assert new.returncode == 2 and "unrecognized" not in new.stderr, (
        new.stderr
    )  # 2: the venv is missing
    old = doctor("--python")
    assert old.returncode == 2 and "unrecognized arguments: --python" in old.stderr, old.stderr
    assert "Traceback" not in old.stderr


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
