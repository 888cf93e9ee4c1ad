"""Every test file is in a tier: a tests/test_*.py beside the helpers would be collected by neither `nox -s tests-unit`
nor `nox -s tests-e2e` nor pyproject's testpaths (tests/unit, tests/e2e), and so would never run."""

from __future__ import annotations

from conftest import ROOT


def test_every_test_file_is_in_tests_unit_or_tests_e2e():
    stray = sorted(p.name for p in (ROOT / "tests").glob("test_*.py"))
    assert stray == [], (
        f"move {stray} to tests/unit (in-process) or tests/e2e (processes, services): docs/testing.md"
    )
