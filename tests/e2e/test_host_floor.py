"""The host floor: apexkit's own tools install and run on Python 3.8 and 3.9 hosts (README command 2's first half in a
fresh venv: pip install -r requirements/dev.txt, then nox, invoke and every apexkit module), and older hosts get one line.

Each venv is new (python3.X -m venv, as a user would make it); pip's cache keeps the second run quick (~30 s each).
"""

from __future__ import annotations

import os
import pkgutil
import subprocess
from pathlib import Path

import pytest
import services
from conftest import ROOT, output
from packaging.utils import canonicalize_name

import apexkit
from apexkit.wheel import interpreters
from tools import pins

REQUIREMENTS = ROOT / "requirements" / "dev.txt"
# What the quick unit tests run under the floor Python (pure code: matrix, patches, logs, interpreters).
FLOOR_UNIT_TESTS = (
    "tests/unit/test_matrix.py",
    "tests/unit/test_log_and_failures.py",
    "tests/unit/test_patches.py",
    "tests/e2e/test_interpreters.py",
)


def find_python(version: str) -> str | None:
    """The first python{version} on PATH, pyenv, /opt/python... that runs and says it is {version}.
    (interpreters.find's probe needs Python 3.3+; this one also answers on 2.7.)"""
    for path in interpreters.candidates(version, os.environ):
        try:
            proc = subprocess.run(
                [path, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                capture_output=True,
                text=True,
                timeout=30,
            )
        except (OSError, subprocess.TimeoutExpired):
            continue
        if proc.returncode == 0 and proc.stdout.strip() == version:
            return path
    return None


def clean_env() -> dict[str, str]:
    """The user's environment (pip config, proxy, cache) without this test run's venv or import path."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTHONSTARTUP")
    }
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    return env


def expected_pins(python_version: str) -> dict[str, str]:
    """requirements/dev.txt's (the lock's) pins whose environment marker holds for that Python: name -> version."""
    return pins.for_python(pins.read_lock(REQUIREMENTS), python_version)


def apexkit_modules() -> list[str]:
    """Every apexkit module (packages included), __main__ aside: it runs the CLI."""
    return sorted(
        m.name
        for m in pkgutil.walk_packages(apexkit.__path__, "apexkit.")
        if m.name != "apexkit.__main__"
    )


@pytest.fixture(scope="module", params=["3.8", "3.9"])
def floor_venv(request, tmp_path_factory) -> tuple[str, Path]:
    """A fresh venv of that Python with requirements/dev.txt installed (fails the test if pip cannot)."""
    version = request.param
    python = find_python(version)
    services.require(
        python is not None, f"no working python{version} on this host (pyenv install {version})"
    )
    venv = tmp_path_factory.mktemp(f"host{version}") / "venv"
    proc = subprocess.run(
        [python, "-m", "venv", str(venv)], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, output(proc)
    py = str(venv / "bin" / "python")
    proc = subprocess.run(
        [py, "-m", "pip", "install", "-q", "-r", str(REQUIREMENTS)],
        cwd=ROOT,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, (
        f"pip install -r requirements/dev.txt on Python {version}:\n{output(proc)[-3000:]}"
    )
    return version, venv


@pytest.mark.network
def test_requirements_install_the_pins_for_that_python(floor_venv):
    version, venv = floor_venv
    proc = subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", "list", "--format", "freeze"],
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, output(proc)
    installed = {
        canonicalize_name(n): v for n, _, v in (x.partition("==") for x in proc.stdout.split())
    }
    for name, pinned in expected_pins(version).items():
        assert installed.get(name) == pinned, (
            f"Python {version}: {name} {installed.get(name)} installed, {pinned} pinned"
        )
    check = subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", "check"],
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert check.returncode == 0, output(check)


@pytest.mark.network
def test_nox_invoke_and_every_module_run_on_that_python(floor_venv):
    version, venv = floor_venv
    py = str(venv / "bin" / "python")
    nox = subprocess.run(
        [py, "-m", "nox", "-f", str(ROOT / "noxfile.py"), "--list"],
        cwd=ROOT,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert nox.returncode == 0, output(nox)
    assert "build-3.8" in nox.stdout and "lint" in nox.stdout and "tests" in nox.stdout, nox.stdout
    inv = subprocess.run(
        [py, "-m", "invoke", "--list"],
        cwd=ROOT,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert inv.returncode == 0, output(inv)
    assert "proxy.setup" in inv.stdout and "image.build" in inv.stdout and "doctor" in inv.stdout, (
        inv.stdout
    )
    modules = apexkit_modules()
    assert len(modules) > 20, modules
    code = (
        "import importlib, sys\n"
        "names = sys.argv[1:]\n"
        "for name in names:\n"
        "    importlib.import_module(name)\n"
        "print('imported', len(names), 'on', '%d.%d' % sys.version_info[:2])\n"
    )
    imp = subprocess.run(
        [py, "-c", code, *modules],
        cwd=ROOT,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert imp.returncode == 0, output(imp)
    assert imp.stdout.split() == ["imported", str(len(modules)), "on", version], imp.stdout
    cli = subprocess.run(
        [py, "-m", "apexkit", "build", "3.11", "--help"],
        cwd=ROOT,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert cli.returncode == 0 and "--torch" in cli.stdout, output(cli)


@pytest.mark.network
@pytest.mark.parametrize(
    "floor_venv", ["3.8"], indirect=True
)  # the floor; 3.9 adds nothing for these
def test_quick_unit_tests_pass_on_the_floor_python(floor_venv):
    """The pure code's own tests, run by the floor Python's pytest: a 3.9+-only API in them or the code fails here."""
    _, venv = floor_venv
    proc = subprocess.run(
        [
            str(venv / "bin" / "python"),
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            *FLOOR_UNIT_TESTS,
        ],
        cwd=ROOT,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, output(proc)[-4000:]
    assert " passed" in proc.stdout and " failed" not in proc.stdout, proc.stdout[-2000:]


@pytest.mark.parametrize("version", ["2.7", "3.6", "3.7"])
def test_older_host_python_gets_one_line_and_exit_3(version):
    python = find_python(version)
    if (
        python is None
    ):  # not something CI can provide (setup-python dropped them); the refusal is plain code
        pytest.skip(f"no python{version} on this host")
    proc = subprocess.run(
        [python, "-m", "apexkit", "build", "3.8", "--dry-run"],
        cwd=ROOT,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 3, output(proc)
    assert proc.stdout == ""
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith(
        "error: apexkit's tools need Python 3.8 or newer on the host, this is Python " + version
    )
    assert " -- next: " in lines[0] and "Traceback" not in proc.stderr
