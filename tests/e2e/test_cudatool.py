"""The installed CUDA toolkit, found and read as a build will (apexkit.wheel.cudatool.find)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from apexkit.errors import ConfigError
from apexkit.wheel import cudatool

NVCC = shutil.which("nvcc")
pytestmark = pytest.mark.skipif(
    NVCC is None, reason="no nvcc on PATH (the CUDA toolkit is a machine fact here)"
)


def test_finds_the_toolkit_on_path_and_reads_its_facts():
    found = cudatool.find({"PATH": os.environ["PATH"]})
    assert found is not None
    said = subprocess.run([NVCC, "-V"], capture_output=True, text=True, check=True).stdout
    assert f"release {found.release}, V{found.version}" in said
    assert 90 in found.arches and 80 in found.arches


def test_cuda_home_comes_first_and_a_missing_toolkit_is_none(tmp_path):
    fake = tmp_path / "cuda" / "bin"
    fake.mkdir(parents=True)
    nvcc = fake / "nvcc"
    nvcc.write_text(
        "#!/bin/sh\n"
        'if [ "$1" = -V ]; then echo "Cuda compilation tools, release 12.8, V12.8.93"; else echo compute_90; fi\n'
    )
    nvcc.chmod(0o755)
    found = cudatool.find({"CUDA_HOME": str(tmp_path / "cuda"), "PATH": os.environ["PATH"]})
    assert found is not None and (found.release, found.version, found.arches) == (
        "12.8",
        "12.8.93",
        {90},
    )
    fallback = cudatool.find({"PATH": str(tmp_path / "empty")})  # no CUDA_HOME, nothing on PATH
    if os.path.exists("/usr/local/cuda/bin/nvcc"):
        assert fallback is not None and fallback.path == Path("/usr/local/cuda/bin/nvcc").resolve()
    else:
        assert fallback is None


def test_an_nvcc_that_cannot_run_is_one_line(tmp_path):
    bin_dir = tmp_path / "cuda" / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "nvcc").write_text("#!/nonexistent/interpreter\n")
    (bin_dir / "nvcc").chmod(0o755)
    with pytest.raises(ConfigError) as caught:
        cudatool.find({"CUDA_HOME": str(tmp_path / "cuda"), "PATH": ""})
    assert caught.value.cause.endswith("nvcc cannot run (No such file or directory)")
    assert "CUDA_HOME" in caught.value.hint
