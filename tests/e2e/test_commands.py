"""Issue 15: one command edge -- each invoke command declares its options once (apexkit/commands.py), tasks.py is a
one-liner onto them, and every declaration fits the function it calls."""

from __future__ import annotations

import subprocess
import sys

from conftest import ROOT

from apexkit import commands


def test_invoke_lists_every_declared_command_with_its_options():
    listed = subprocess.run(
        [sys.executable, "-m", "invoke", "-r", str(ROOT), "--list"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert listed.returncode == 0, listed.stderr
    for command in commands.COMMANDS:
        assert command.name in listed.stdout
    shown = subprocess.run(
        [sys.executable, "-m", "invoke", "-r", str(ROOT), "--help", "fleet.submit"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    for opt in commands.BY_NAME["fleet.submit"].opts:
        assert opt.flag in shown.stdout, opt.flag
    assert "--node-python" not in shown.stdout  # the 0.1 spelling is gone


def test_a_bad_value_is_one_line_and_its_exit_code(tmp_path):
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "invoke",
            "-r",
            str(ROOT),
            "image.build",
            "--arch",
            "x86_64",
            "--base",
            "debootstrap",
            "--uid",
            "abc",
            "--dry-run",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert (
        proc.stderr.strip().splitlines()[-1]
        == "error: 'abc' is not a number -- next: pass a whole number"
    )


def test_apexkit_runs_the_same_declarations_without_invoke(tmp_path):
    """`apexkit proxy.setup ...` (argparse over the same declarations: builder images have no invoke)."""
    fsroot = tmp_path / "root"
    (fsroot / "home").mkdir(parents=True)
    base = [
        sys.executable,
        "-m",
        "apexkit",
        "proxy.setup",
        "--http",
        "http://proxy.corp:3128",
        "--root",
        str(fsroot),
        "--dry-run",
        "--no-restart",
    ]
    new = subprocess.run(
        [*base, "--layers", "shell"], capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    assert new.returncode == 0 and "dry run" in new.stderr and "deprecated" not in new.stderr, (
        new.stderr
    )
    old = subprocess.run(
        [*base, "--only", "shell"], capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    assert old.returncode == 2 and "unrecognized arguments: --only" in old.stderr, old.stderr
    bad = subprocess.run(
        [*base, "--layers", "nosuch"], capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    assert bad.returncode == 2 and bad.stderr.strip().splitlines()[-1].startswith(
        "error: --layers 'nosuch' is not"
    )
    assert not any((fsroot / "home").iterdir())
