import os
import stat
import subprocess

import pytest

from apexkit.errors import InterpreterNotFoundError
from apexkit.wheel import interpreters, venvs


def fake_shim(directory, name):
    """What pyenv leaves on PATH for a version that is installed but not selected."""
    path = directory / name
    path.write_text(f'#!/bin/sh\necho "pyenv: {name}: command not found" >&2\nexit 127\n')
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return path


def test_a_failing_candidate_on_path_is_run_then_skipped(tmp_path):
    shim = fake_shim(tmp_path, "python3.11")
    env = dict(os.environ, PATH=f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    assert interpreters.candidates("3.11", env)[0] == str(shim)
    found = interpreters.find("3.11", env)
    assert found.path != str(shim) and found.version == "3.11"


def test_missing_interpreter_is_one_line_with_what_was_tried(tmp_path):
    fake_shim(tmp_path, "python3.4")
    env = {"PATH": str(tmp_path), "HOME": str(tmp_path)}
    with pytest.raises(InterpreterNotFoundError) as exc:
        interpreters.find("3.4", env)
    assert "no working python3.4 found" in exc.value.cause
    assert "command not found" in exc.value.cause
    assert "pyenv install 3.4" in exc.value.hint and "--interpreter" in exc.value.hint
    assert "\n" not in exc.value.format()


def test_explicit_interpreter_of_the_wrong_version_is_refused():
    with pytest.raises(InterpreterNotFoundError, match="is not a working Python 3.8"):
        interpreters.find("3.8", explicit=interpreters.find("3.11").path)


@pytest.mark.parametrize("version", ["3.8", "3.9", "3.10", "3.11"])
def test_each_session_python_is_found_and_gets_a_lib_layout_venv(version, tmp_path):
    interp = interpreters.find(version)
    assert interp.version == version
    venv = venvs.create(interp.path, tmp_path / "venv", tmp_path / "log")
    out = subprocess.run(
        [
            str(venv.python),
            "-c",
            "import sys, sysconfig; print(sys.version_info[:2]);"
            "print(sysconfig.get_paths()['purelib'])",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    version_line, purelib = out.stdout.split("\n")[:2]
    assert version_line == str(tuple(int(p) for p in version.split(".")))
    assert purelib == str(tmp_path / "venv" / "lib" / f"python{version}" / "site-packages")
    pip = subprocess.run(
        [str(venv.python), "-m", "pip", "--version"], capture_output=True, text=True
    )
    assert pip.returncode == 0
