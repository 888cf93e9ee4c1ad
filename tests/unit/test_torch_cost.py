"""The build plan says what its torch costs before anything is fetched (issue 41 item 6): the variant, its download
and installed size (measured from a wheelhouse's file, else matrix.toml [index.torch_builds]), and the cheaper build."""

from __future__ import annotations

import zipfile

from apexkit import pipconfig
from apexkit.plan import matrix
from apexkit.wheel import buildplan
from apexkit.wheel.options import BuildOptions


def test_the_default_index_names_the_cuda_variant_its_sizes_and_the_cheaper_cpu_build():
    line = buildplan.torch_build(matrix.load(), "2.7.1", "x86_64", BuildOptions("3.10"), {})
    assert line.startswith("CUDA build from the package index (~2.6-2.8 GB"), line
    assert (
        "to download, ~5 GiB installed)" in line
        and "--torch-index-url https://download.pytorch.org/whl/cpu" in line
    )


def test_a_cpu_torch_index_gives_the_cpu_sizes():
    opts = BuildOptions("3.11", torch_index_url="https://download.pytorch.org/whl/cpu")
    line = buildplan.torch_build(matrix.load(), "2.13.0", "x86_64", opts, {})
    assert line.endswith("(~200 MB to download, ~670 MB installed)"), line


def test_a_wheelhouse_torch_is_measured_from_its_file(tmp_path):
    wheel = tmp_path / "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl"
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr(
            "torch/lib/libtorch_cpu.so", b"\0" * (3 << 20)
        )  # 3 MiB that compress to almost nothing
    line = buildplan.torch_build(
        matrix.load(), "2.13.0", "x86_64", BuildOptions("3.11", wheelhouses=(tmp_path,)), {}
    )
    assert (
        line == f"{wheel.name} from --wheelhouse {tmp_path} (~0 MiB to download, ~3 MiB installed)"
    ), line


def _torch_wheel(directory, name: str) -> None:
    with zipfile.ZipFile(directory / name, "w") as zf:
        zf.writestr("torch/__init__.py", b"")


def test_offline_the_plan_says_the_wheelhouse_lacks_this_targets_torch_and_its_download(
    tmp_path, monkeypatch
):
    """issue 41 E: under --offline the plan still promised a CUDA torch from the package index; a torch for another
    Python in W does not count."""
    monkeypatch.setattr(pipconfig, "read", lambda env: pipconfig.PipConfig())
    _torch_wheel(tmp_path, "torch-2.1.0-cp311-cp311-manylinux1_x86_64.whl")
    opts = BuildOptions("3.8", wheelhouses=(tmp_path,), offline=True)
    line = buildplan.torch_build(matrix.load(), "2.1.0", "x86_64", opts, {})
    assert line == (
        f"torch 2.1.0 cp38 x86_64 is not in --wheelhouse {tmp_path}: this build will fail -- next: pip download "
        f"torch==2.1.0 --python-version 3.8 --only-binary :all: -d {tmp_path} on a host with network"
    ), line


def test_offline_the_plan_checks_torch_npu_too(tmp_path, monkeypatch):
    house = tmp_path / "pip-conf-house"  # pip.conf's find-links count too
    house.mkdir()
    monkeypatch.setattr(
        pipconfig, "read", lambda env: pipconfig.PipConfig({"find-links": str(house)})
    )
    _torch_wheel(tmp_path, "torch-2.1.0+cpu-cp38-cp38-linux_x86_64.whl")
    opts = BuildOptions("3.8", wheelhouses=(tmp_path,), offline=True)
    line = buildplan.torch_build(
        matrix.load(), "2.1.0", "x86_64", opts, {}, torch_npu="2.1.0.post10"
    )
    assert line.startswith(
        f"torch_npu 2.1.0.post10 cp38 x86_64 is not in --wheelhouse {tmp_path}, pip's find-links {house}:"
    ), line
    _torch_wheel(house, "torch_npu-2.1.0.post10-cp38-cp38-manylinux_2_17_x86_64.whl")
    line = buildplan.torch_build(
        matrix.load(), "2.1.0", "x86_64", opts, {}, torch_npu="2.1.0.post10"
    )
    assert (
        line.startswith(
            f"torch-2.1.0+cpu-cp38-cp38-linux_x86_64.whl from --wheelhouse {tmp_path} (~0 MiB"
        )
        and f"; torch_npu-2.1.0.post10-cp38-cp38-manylinux_2_17_x86_64.whl from pip's find-links {house}"
        in line
    ), line


def test_a_wheelhouse_from_pip_find_links_is_named_as_such(tmp_path):
    _torch_wheel(tmp_path, "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl")
    line = buildplan.torch_build(
        matrix.load(), "2.13.0", "x86_64", BuildOptions("3.11"), {"PIP_FIND_LINKS": str(tmp_path)}
    )
    assert line.startswith(
        f"torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl from PIP_FIND_LINKS {tmp_path} "
    ), line
