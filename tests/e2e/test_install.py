"""Issue 15: apexkit is installable (`pip install .`), with an `apexkit` command that works from any directory and
finds its data (matrix.toml, patches/, docker/, bench/) inside the installed package."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest
from conftest import ROOT

from apexkit import paths


@pytest.mark.network
def test_pip_install_dot_gives_an_apexkit_command_that_works_elsewhere(tmp_path):
    src = tmp_path / "src"
    shutil.copytree(ROOT, src, ignore=paths.copy_ignore(ROOT))
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    install = subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", str(src)],
        capture_output=True,
        text=True,
    )
    assert install.returncode == 0, install.stdout[-2000:] + install.stderr[-2000:]
    shutil.rmtree(src)  # the installed copy must not need the checkout
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("PYTHONPATH", "APEXKIT_DIST_DIR", "APEXKIT_BUILD_DIR")
    }
    apexkit = str(venv / "bin" / "apexkit")

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [apexkit, *args], cwd=elsewhere, env=env, capture_output=True, text=True, timeout=600
        )

    helped = run("--help")
    assert (
        helped.returncode == 0
        and "build <python>" in helped.stdout
        and "proxy.setup" in helped.stdout
    )
    plan = run("build", "3.11", "--dry-run")
    assert plan.returncode == 0, plan.stderr[-2000:]
    assert (
        f"dist            {elsewhere / 'dist'}" in plan.stderr
    )  # outputs go to the current directory
    matrix = run("matrix", "--format", "json")
    assert matrix.returncode == 0 and '"id": "py3.11-torch2.13.0-x86_64"' in matrix.stdout
    doctor = run("doctor", "--json")
    assert doctor.returncode in (0, 1) and doctor.stdout.lstrip().startswith(
        "["
    )  # rows, whatever this host lacks
    listed = run("proxy.show", "--json", "--root", str(elsewhere))
    assert listed.returncode == 0, listed.stderr[-2000:]
    assert (
        "Traceback"
        not in helped.stderr + plan.stderr + matrix.stderr + doctor.stderr + listed.stderr
    )
    site = next((venv / "lib").glob("python3.*/site-packages"))
    assert (site / "apexkit" / "_data" / "matrix.toml").is_file() and (
        site / "apexkit" / "_data" / "docker"
    ).is_dir()
    assert (
        site / "apexkit" / "_data" / "bench" / "probes" / "interpreter.py"
    ).is_file()  # what doctor just ran
