"""The probes: the programs apexkit runs in target interpreters are files in bench/probes/ (linted, packaged, found
through apexkit.paths), each named by the host code that reads it, and each readable by the oldest Python it meets."""

from __future__ import annotations

import ast
import re
import sys

from conftest import ROOT

from apexkit import paths

PROBES = sorted((ROOT / "bench" / "probes").glob("*.py"))
IMPORTED = ("torch", "torch_npu", "apex", "apex_C", "numpy", "pkg_resources", "change_data_ptr")


def test_every_probe_is_found_through_paths_and_named_by_its_reader():
    assert paths.PROBES == paths.BENCH / "probes" and PROBES
    named = set()
    for path in (ROOT / "apexkit").rglob("*.py"):
        named |= set(re.findall(r'PROBES / "([\w.]+)"', path.read_text()))
    assert named == {p.name for p in PROBES}, (
        "a probe no one runs, or a reader whose probe is missing"
    )
    for probe in PROBES:
        doc = ast.get_docstring(ast.parse(probe.read_text())) or ""
        assert "apexkit." in doc, (
            f"{probe.name}: its docstring says what it prints and who reads it"
        )
        # run as `python <file>`, its folder is sys.path[0]: no probe may shadow what it (or torch) imports
        assert probe.stem not in {*getattr(sys, "stdlib_module_names", ()), *IMPORTED}, probe.name
