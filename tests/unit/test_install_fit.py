"""apexkit install: whether a wheel file fits the venv, from the wheel's own bytes (an index.json may lie)."""

from __future__ import annotations

import dataclasses
import re
import zipfile
from pathlib import Path

import pytest

from apexkit.install import fit, target
from apexkit.plan import target as plan_target

from .test_install_target import parsed

TORCH_PIN = "torch==2.13.0"


def make_wheel(
    folder: Path,
    version: str = "0.1+ascend.torch2.13.0",
    tags: str = "cp311-cp311-manylinux_2_28_x86_64",
    requires: tuple[str, ...] = (TORCH_PIN,),
    name: str = "apex",
) -> Path:
    dist_info = f"apex-{version}.dist-info"
    metadata = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n" + "".join(
        f"Requires-Dist: {r}\n" for r in requires
    )
    path = folder / f"apex-{version}-{tags}.whl"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("apex/__init__.py", "")
        zf.writestr(f"{dist_info}/METADATA", metadata)
        zf.writestr(
            f"{dist_info}/RECORD",
            f"apex/__init__.py,sha256=47DEQpj8HBSa-_TImW-5JCeuQeRkm5NMpJWZG3hSuFU,0\n"
            f"{dist_info}/METADATA,sha256=abc,10\n{dist_info}/RECORD,,\n",
        )
    return path


def test_a_wheel_for_the_venv_fits(tmp_path):
    facts = fit.read_wheel(make_wheel(tmp_path, requires=(TORCH_PIN, "numpy>=1.20")))
    assert facts.version == "0.1+ascend.torch2.13.0" and facts.requires_dist == (
        TORCH_PIN,
        "numpy>=1.20",
    )
    assert (
        "apex/__init__.py",
        "sha256=47DEQpj8HBSa-_TImW-5JCeuQeRkm5NMpJWZG3hSuFU",
    ) in facts.record
    assert not any(p.endswith("RECORD") for p, _ in facts.record)
    assert fit.check_wheel(facts, parsed()) == []  # torch==2.13.0 accepts the venv's 2.13.0+cpu


@pytest.mark.parametrize(
    ("kwargs", "why"),
    [
        ({"tags": "cp310-cp310-manylinux_2_28_x86_64"}, "installs none of those"),
        ({"tags": "cp311-cp311-manylinux_2_28_aarch64"}, "installs none of those"),
        ({"requires": ("torch==2.12.0",)}, "the venv has torch 2.13.0+cpu"),
        ({"requires": (TORCH_PIN, "torch_npu==2.13.0.*")}, "torch_npu==2.13.0.* (not installed)"),
        ({"requires": ("numpy>=1",)}, "pins no torch"),
        ({"requires": (TORCH_PIN, "numpy>=3")}, "the venv has numpy 2.1.0"),
    ],
)
def test_an_index_that_lies_about_the_tuple_is_caught_on_the_wheel(tmp_path, kwargs, why):
    with pytest.raises(fit.Misfit) as err:
        fit.check_wheel(fit.read_wheel(make_wheel(tmp_path, **kwargs)), parsed())
    assert why in str(err.value)


def test_what_the_venv_lacks_is_added_but_nothing_it_has_is_changed(tmp_path):
    """NVIDIA apex requires packaging>20.6, which a venv holding only torch lacks: added, by name and range (the
    marker already evaluated). An installed package at another version, torch_npu, a URL or an extra: a misfit."""
    requires = (TORCH_PIN, 'packaging>20.6; python_version >= "3"', "einops")
    wheel = fit.read_wheel(make_wheel(tmp_path, requires=requires))
    assert fit.check_wheel(wheel, parsed()) == ["packaging>20.6", "einops"]
    for bad, why in [
        ("numpy>=3", "the venv has numpy 2.1.0"),  # upgrading numpy under torch: never
        ("torch_npu==2.13.0.*", "torch_npu==2.13.0.* (not installed)"),
        ("evil @ https://127.0.0.1/evil.whl", "(not installed)"),
        ("requests[socks]>=2", "(not installed)"),
        ("x===/tmp/e.whl", "only a name and =="),  # === takes any string, a path included
    ]:
        folder = tmp_path / str(len(bad))
        folder.mkdir()
        with pytest.raises(fit.Misfit, match=re.escape(why)):
            fit.check_wheel(fit.read_wheel(make_wheel(folder, requires=(TORCH_PIN, bad))), parsed())
    many = (TORCH_PIN, *(f"dep{i}" for i in range(fit.MAX_ADDED + 1)))
    (tmp_path / "many").mkdir()
    with pytest.raises(fit.Misfit, match="at most"):
        fit.check_wheel(fit.read_wheel(make_wheel(tmp_path / "many", requires=many)), parsed())


def test_anything_installed_that_changed_is_named_apex_aside():
    before = parsed()
    after = dataclasses.replace(
        before, dists={**{k: v for k, v in before.dists.items() if k != "numpy"}, "apex": "0.1"}
    )
    assert fit.moved(before, after) == ["numpy 2.1.0 -> none"]
    assert fit.moved(before, before) == []


def test_a_requirement_for_another_platform_is_not_asked_of_the_venv(tmp_path):
    requires = (TORCH_PIN, 'pywin32>=300; sys_platform == "win32"')
    fit.check_wheel(fit.read_wheel(make_wheel(tmp_path, requires=requires)), parsed())


@pytest.mark.parametrize(
    ("kwargs", "why"),
    [
        ({"version": "0.9.10.dev0"}, "not an apexkit wheel"),
        ({"version": "0.1+cuda.torch2.13.0"}, "not an apexkit wheel"),
        ({"name": "apex-decoy"}, "not apex"),
    ],
)
def test_only_apexkit_wheels_are_installed(tmp_path, kwargs, why):
    with pytest.raises(fit.Misfit, match=why):
        fit.read_wheel(make_wheel(tmp_path, **kwargs))


def test_a_file_that_is_no_wheel_is_a_misfit_not_a_traceback(tmp_path):
    bad = tmp_path / "apex-0.1+ascend.torch2.13.0-cp311-cp311-manylinux_2_28_x86_64.whl"
    bad.write_bytes(b"not a zip")
    with pytest.raises(fit.Misfit, match="not a readable wheel"):
        fit.read_wheel(bad)
    with pytest.raises(fit.Misfit, match="is not a wheel file name"):
        fit.read_wheel(tmp_path / "apex.whl")


def test_the_same_wheel_installed_is_told_by_its_files(tmp_path):
    facts = fit.read_wheel(make_wheel(tmp_path))
    installed = target.Apex(
        "0.1+ascend.torch2.13.0", True, facts.record, ("cp311-cp311-manylinux_2_28_x86_64",)
    )
    assert fit.same_files(facts, dataclasses.replace(parsed(), apex=installed))
    changed = dataclasses.replace(installed, record=(("apex/__init__.py", "sha256=other"),))
    assert not fit.same_files(facts, dataclasses.replace(parsed(), apex=changed))
    older = dataclasses.replace(installed, version="0.1+ascend.torch2.12.0")
    assert not fit.same_files(facts, dataclasses.replace(parsed(), apex=older))
    assert not fit.same_files(facts, parsed())


def test_torch_and_torch_npu_changes_are_named():
    before = parsed()
    after = dataclasses.replace(
        before, dists={**before.dists, "torch": "2.14.1", "torch-npu": "2.14.0"}
    )
    assert fit.moved(before, after) == ["torch 2.13.0+cpu -> 2.14.1", "torch-npu none -> 2.14.0"]
    assert fit.moved(before, before) == []


CUDA = "0.1+cu130.torch2.13.0"


def test_nvidia_apex_on_cuda_fits_a_venv_whose_torch_is_that_cuda_only(tmp_path):
    def cuda_of(version: str) -> str | None:
        label = plan_target.read_version(version)
        return label.cuda if label else None

    assert cuda_of(CUDA) == "13.0" and cuda_of("0.1+cu128.torch2.7.1") == "12.8"
    assert cuda_of("0.1+ascend.torch2.13.0") is None and cuda_of("0.1+cuda.torch2") is None
    facts = fit.read_wheel(make_wheel(tmp_path, version=CUDA))
    fit.check_wheel(facts, dataclasses.replace(parsed(), torch_cuda="13.0"))
    for venv, why in [
        (parsed(), "is NVIDIA apex for CUDA 13.0; the venv's torch is a build without CUDA"),
        (dataclasses.replace(parsed(), torch_cuda="12.8"), "the venv's torch is CUDA 12.8"),
        (
            dataclasses.replace(parsed(), torch_cuda="13.0", torch_npu="2.13.0"),
            "the venv has torch_npu 2.13.0",
        ),
    ]:
        with pytest.raises(fit.Misfit, match=why):
            fit.check_wheel(facts, venv)
