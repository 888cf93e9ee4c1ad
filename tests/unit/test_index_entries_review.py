"""index.json entries another party wrote, read by the one reader (publish.read_entry; remote leaves a bad entry out
in one line): the review of issue 39's merge found a version past int's digit limit taking the whole lookup down
(exit 70), a non-ASCII project name accepted, and a falsy `attestations` accepted."""

from __future__ import annotations

from pathlib import Path

import pytest

from apexkit import untrusted
from apexkit.errors import ConfigError
from apexkit.index import publish
from apexkit.plan import target

GOOD = {"filename": "apex-0.1-cp311-cp311-linux_x86_64.whl", "project": "apex", "sha256": "a" * 64}
HUGE = "1" * 5000  # int() refuses more than 4,300 digits: a ValueError that is not InvalidVersion


def test_a_version_past_ints_digit_limit_is_a_refusal_not_a_crash():
    with pytest.raises(untrusted.Untrusted):
        untrusted.wheel_name(f"apex-{HUGE}-cp311-cp311-linux_x86_64.whl")
    with pytest.raises(ConfigError):
        target.check_version(HUGE, "torch", "fix")
    target.read_version(f"0.1+ascend.torch{HUGE}")  # no exception: not a label apexkit wrote
    with pytest.raises(ConfigError):
        publish.read_entry(dict(GOOD, torch=HUGE), Path("/r"), "files[0]", "fix")


@pytest.mark.parametrize(
    "entry",
    [
        {"filename": "ápex-0.1-cp311-cp311-linux_x86_64.whl", "project": "ápex"},
        {"attestations": []},
        {"attestations": 0},
        {"attestations": ""},
    ],
)
def test_an_entry_of_the_wrong_shape_is_refused(entry):
    with pytest.raises(ConfigError):
        publish.read_entry(dict(GOOD, **entry), Path("/r"), "files[0]", "fix")
