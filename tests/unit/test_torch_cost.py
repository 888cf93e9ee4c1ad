"""The build plan says what its torch costs before anything is fetched (issue 41 item 6): the variant, its download
and installed size (measured from a wheelhouse's file, else matrix.toml [index.torch_builds]), and the cheaper build."""

from __future__ import annotations

import zipfile

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
