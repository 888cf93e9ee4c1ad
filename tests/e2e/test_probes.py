"""The probes: the programs apexkit runs in target interpreters are files in bench/probes/ (linted, packaged, found
through apexkit.paths), each named by the host code that reads it, and each readable by the oldest Python it meets."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from conftest import ROOT

from apexkit.doctor import apexneed
from apexkit.wheel import interpreters

PROBES = sorted((ROOT / "bench" / "probes").glob("*.py"))
IMPORTED = ("torch", "torch_npu", "apex", "apex_C", "numpy", "pkg_resources", "change_data_ptr")


def pyenv_pythons() -> list[Path]:
    """pyenv's CPython 3 installs here, oldest first."""
    root = interpreters.pyenv_root(os.environ)
    found = []
    for python in (root / "versions").glob("3.*/bin/python3") if root else ():
        try:
            found.append((tuple(int(p) for p in python.parent.parent.name.split(".")[:2]), python))
        except ValueError:  # 3.13t, 3.12-dev ...
            continue
    return [python for _, python in sorted(found)]


def test_every_probe_compiles_with_the_oldest_python_here(tmp_path):
    pythons = [p for p in pyenv_pythons() if p.parent.parent.name.startswith("3.7")]
    if not pythons:
        pytest.skip("no pyenv Python 3.7 here")
    code = (
        "import py_compile, sys\n"
        "for i, f in enumerate(sys.argv[2:]):\n"
        "    py_compile.compile(f, cfile='%s/%d.pyc' % (sys.argv[1], i), doraise=True)\n"
    )
    proc = subprocess.run(
        [str(pythons[0]), "-c", code, str(tmp_path), *map(str, PROBES)],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_the_any_python_probes_run_on_every_python_3_here():
    """interpreters.probe meets every python3.X on the machine; doctor --venv any training environment (3.6 and 3.7:
    no importlib.metadata, the pkg_resources branch)."""
    pythons = pyenv_pythons()
    if not pythons:
        pytest.skip("no pyenv Pythons here")
    for python in pythons:
        version = python.parent.parent.name
        interp, why = interpreters.probe(str(python))
        assert interp is not None and version.startswith(interp.version + "."), why
        env = apexneed.read_environment(str(python))
        assert env.python == version and env.prefix == str(python.parent.parent)
