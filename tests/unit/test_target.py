"""One version check (plan/target.check_version) behind matrix.toml, the build's --torch/--torch-npu and publish: what
each of the three accepted before still passes all three; where they disagreed, all three now say the same."""

from __future__ import annotations

from pathlib import Path

import pytest

from apexkit.errors import ConfigError
from apexkit.index import publish
from apexkit.plan import matrix, target
from apexkit.wheel import options

HINT = "the hint"


def through_all_three(version: str) -> list[str]:
    """The causes each caller gives for `version` ("" where it passes): matrix entry, --torch, a manifest's torch."""
    causes = []
    for call in (
        lambda: matrix.load().combinations(
            [{"python": "3.11", "torch": version, "arch": "x86_64"}]
        ),
        lambda: options.resolve("3.11", ["--torch", version]),
        lambda: publish.torch_version(version, Path("dist/t/manifest.json"), "target.torch"),
    ):
        try:
            call()
            causes.append("")
        except ConfigError as exc:
            causes.append(exc.cause)
    return causes


@pytest.mark.parametrize(
    "version",
    ["2.1.0", "2.13", "2.7.1.post8", "2.1.0rc1", "2.1.0+cpu", "2.1.0+cu121", "2.6.0.dev20241001"],
)
def test_what_the_checks_accepted_passes_all_three(version):
    assert target.check_version(version, "--torch", HINT) == version
    matrix_cause, options_cause, publish_cause = through_all_three(version)
    assert matrix_cause == publish_cause == ""
    assert (
        "version" not in options_cause
    )  # it may go on to refuse the pairing with torch_npu, not the version
    assert publish.torch_version(version, Path("m.json"), "target.torch") == version.split("+")[0]


@pytest.mark.parametrize(
    ("version", "says"),
    [
        ("2.13.0/../../x", "is not a version (PEP 440)"),  # refused by all three before
        (" 2.1.0", "is not a version (PEP 440)"),
        (
            "2.1+cpu.",
            "is not a version (PEP 440)",
        ),  # matrix's pattern took it; it is no PEP 440 version
        (
            "2.1.0a01",
            "is not a normalised version (PEP 440: 2.1.0a1)",
        ),  # matrix's pattern took it too
        (
            "v2.13.0",
            "is not a normalised version (PEP 440: 2.13.0)",
        ),  # --torch took it; publish refused the target
        ("2.1.0.RC1", "is not a normalised version (PEP 440: 2.1.0rc1)"),
        ("2.1-post1", "is not a normalised version (PEP 440: 2.1.post1)"),
        (
            "2.13.0+CPU",
            "is not a normalised version (PEP 440: 2.13.0+cpu)",
        ),  # publish took it (local part unchecked)
        ("1!2.1.0", "has an epoch (1!)"),  # --torch and publish took it: a '!' in dist/<target>
    ],
)
def test_every_caller_refuses_the_same_versions_in_one_line(version, says):
    with pytest.raises(ConfigError) as exc:
        target.check_version(version, "--torch", HINT)
    assert (
        exc.value.cause.startswith(f"--torch {version!r} ")
        and says in exc.value.cause
        and exc.value.hint == HINT
    )
    causes = through_all_three(version)
    assert all(says in cause for cause in causes), causes
    assert causes[0].startswith("matrix entry 1: torch ") and causes[1].startswith("--torch ")
    assert causes[2].startswith("dist/t/manifest.json: target.torch ")


def test_a_version_that_is_no_string_is_refused():
    for value in (None, 2.1, ["2.1.0"]):
        with pytest.raises(ConfigError, match="is not a version"):
            target.check_version(value, "target.torch", HINT)
