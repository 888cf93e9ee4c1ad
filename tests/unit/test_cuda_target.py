"""The version an NVIDIA apex CUDA wheel carries (apexkit.plan.target.cuda_version) and its torch pin."""

from __future__ import annotations

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

from apexkit.errors import ConfigError
from apexkit.plan import target


@pytest.mark.parametrize(
    ("torch", "cuda", "expect"),
    [
        ("2.14.1+cu130", "13.0", "0.1+cu130.torch2.14.1"),
        ("2.9.1", "12.8", "0.1+cu128.torch2.9.1"),
        ("2.10.0rc1", "12.6.3", "0.1+cu126.torch2.10.0rc1"),
    ],
)
def test_cuda_wheel_version_names_cuda_then_torch(torch, cuda, expect):
    t = target.Target.of("3.11", torch, "x86_64", backend="cuda", cuda=cuda)
    assert t.version == expect and t.label == expect[len(target.NVIDIA_BASE_VERSION) :]
    label = target.read_version(expect)  # the one reader reads back what the one writer wrote
    assert label == target.Label(
        "cuda",
        str(Version(torch).public),
        cuda=cuda[: cuda.rindex(".")] if cuda.count(".") > 1 else cuda,
    )


def test_the_torch_pin_accepts_torchs_cuda_build_and_no_other_release():
    pin = Requirement(target.Target.of("3.11", "2.14.1+cu130", "x86_64").requires(False)[0])
    assert str(pin) == "torch==2.14.1"
    assert Version("2.14.1+cu130") in pin.specifier
    assert Version("2.14.0") not in pin.specifier and Version("2.15.0") not in pin.specifier


@pytest.mark.parametrize("cuda", ["", "13", "thirteen", "13.0;rm", "1" * 40])
def test_a_cuda_release_that_is_not_one_is_refused(cuda):
    with pytest.raises(ConfigError, match="is not a CUDA release"):
        target.cuda_tag(cuda)
