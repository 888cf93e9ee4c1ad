"""The CUDA toolchain facts read off nvcc's words, the torch match, the arch list against nvcc, and the job count."""

from __future__ import annotations

from pathlib import Path

import pytest

from apexkit.errors import ConfigError
from apexkit.wheel import cudabin, cudatool

NVCC_V = """nvcc: NVIDIA (R) Cuda compiler driver
Copyright (c) 2005-2025 NVIDIA Corporation
Built on Wed_Aug_20_01:58:59_PM_PDT_2025
Cuda compilation tools, release 13.0, V13.0.88
Build cuda_13.0.r13.0/compiler.36424714_0
"""
ARCHES = "compute_75\ncompute_80\ncompute_86\ncompute_90\ncompute_90a\ncompute_100\ncompute_120\n"
NVCC = cudatool.Nvcc(
    Path("/usr/local/cuda/bin/nvcc"), "13.0", "13.0.88", cudatool.parse_arches(ARCHES)
)


def test_version_and_arches_from_nvccs_words():
    assert cudatool.parse_version(NVCC_V) == ("13.0", "13.0.88")
    assert cudatool.parse_arches(ARCHES) == frozenset({75, 80, 86, 90, 100, 120})
    with pytest.raises(ConfigError, match="no 'release X.Y"):
        cudatool.parse_version("command not found\n")


def test_nvcc_is_looked_for_in_upstreams_order():
    env = {"CUDA_HOME": "/opt/cuda-13.0", "CUDA_PATH": "/opt/other", "PATH": "/usr/bin::/opt/bin"}
    assert cudatool.candidates(env) == [
        Path("/opt/cuda-13.0/bin/nvcc"),
        Path("/opt/other/bin/nvcc"),
        Path("/usr/bin/nvcc"),
        Path("/opt/bin/nvcc"),
        Path("/usr/local/cuda/bin/nvcc"),
    ]


def test_nvcc_must_be_torchs_cuda_release():
    cudatool.check_matches_torch(NVCC, "13.0", "2.14.1")  # torch.version.cuda is "13.0"
    with pytest.raises(ConfigError) as older:
        cudatool.check_matches_torch(NVCC, "12.8", "2.9.1")
    assert "nvcc 13.0.88" in older.value.cause and "CUDA 12.8" in older.value.cause
    assert "CUDA 12.8 toolkit" in older.value.hint
    with pytest.raises(ConfigError, match="a build without CUDA"):
        cudatool.check_matches_torch(NVCC, None, "2.13.0+cpu")


def test_arch_list_must_be_known_to_nvcc():
    cudatool.check_arches(NVCC, cudabin.parse_arch_list("8.0;9.0a;10.0+PTX"))
    with pytest.raises(ConfigError) as caught:
        cudatool.check_arches(NVCC, cudabin.parse_arch_list("7.0;9.0;9.9"))
    assert caught.value.cause.startswith(
        "nvcc 13.0.88 cannot compile for 7.0, 9.9 (it knows 7.5, 8.0"
    )


@pytest.mark.parametrize(
    ("cores", "free", "asked", "expect"),
    [
        (2, 20.0, None, (2, 1)),  # this machine: cores bound
        (64, 16.0, None, (8, 4)),  # memory bound: threads use the idle cores, at most 4
        (16, 1.0, None, (1, 4)),  # too little memory still compiles, one job
        (16, 64.0, 3, (3, 1)),  # --jobs wins
    ],
)
def test_jobs_fit_cores_and_memory(cores, free, asked, expect):
    assert cudatool.jobs(cores, free, asked) == expect


def test_runtime_lib_dirs_are_the_nvidia_wheels_real_lib_folders(tmp_path):
    site = tmp_path / "site-packages"
    assert cudatool.runtime_lib_dirs(site) == ()
    for package in ("cu13", "cublas", "nccl"):
        (site / "nvidia" / package / "lib").mkdir(parents=True)
    (site / "nvidia" / "cuda_nvcc" / "bin").mkdir(parents=True)  # no lib: not a library folder
    elsewhere = tmp_path / "elsewhere" / "lib"
    elsewhere.mkdir(parents=True)
    (site / "nvidia" / "linked").symlink_to(elsewhere.parent)  # a link is not followed
    assert cudatool.runtime_lib_dirs(site) == tuple(
        str(site / "nvidia" / p / "lib") for p in ("cu13", "cublas", "nccl")
    )
