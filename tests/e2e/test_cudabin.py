"""The fatbin reader on what the installed nvcc really writes: the architectures a shared object embeds are the
ones its -gencode flags asked for (sm_90a is architecture 90), and a C++-only object has none."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from apexkit.wheel import cudabin

KERNEL = """\
__global__ void scale(float* x, float a, int n) { int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) x[i] *= a; }
extern "C" void launch(float* x, float a, int n) { scale<<<(n + 255) / 256, 256>>>(x, a, n); }
"""

NVCC = shutil.which("nvcc")
pytestmark = pytest.mark.skipif(
    NVCC is None, reason="no nvcc on PATH (the CUDA toolkit is a machine fact here)"
)


def compile_so(tmp_path, name, *gencode):
    src = tmp_path / "k.cu"
    src.write_text(KERNEL)
    out = tmp_path / name
    flags = [f"-gencode=arch={arch},code={code}" for arch, code in gencode]
    subprocess.run(
        [NVCC, "-shared", "-Xcompiler", "-fPIC", *flags, str(src), "-o", str(out)],
        check=True,
        capture_output=True,
    )
    return out


def test_embedded_architectures_are_the_gencode_asked(tmp_path):
    so = compile_so(
        tmp_path,
        "k.so",
        ("compute_80", "sm_80"),
        ("compute_90", "sm_90"),
        ("compute_90", "compute_90"),
    )
    found = cudabin.embedded(so)
    assert found == cudabin.Embedded(frozenset({80, 90}), frozenset({90}))
    assert (
        cudabin.problems(found, cudabin.wanted(cudabin.parse_arch_list("8.0;9.0+PTX")), "k.so")
        == []
    )
    assert cudabin.problems(found, cudabin.wanted(cudabin.parse_arch_list("9.0")), "k.so") == [
        "k.so: embeds sm_80, compute_90 (PTX) that the arch list did not ask for"
    ]


def test_arch_specific_and_ptx_only_targets(tmp_path):
    so = compile_so(tmp_path, "k2.so", ("compute_90a", "sm_90a"), ("compute_75", "compute_75"))
    assert cudabin.embedded(so) == cudabin.Embedded(frozenset({90}), frozenset({75}))


def test_cxx_only_objects_have_no_gpu_code(tmp_path):
    src = tmp_path / "plain.cpp"
    src.write_text('extern "C" int one() { return 1; }\n')
    so = tmp_path / "plain.so"
    subprocess.run(["g++", "-shared", "-fPIC", str(src), "-o", str(so)], check=True)
    assert cudabin.embedded(so) is None
    (tmp_path / "text.so").write_text("not an ELF")
    with pytest.raises(cudabin.FatbinError, match="not a readable ELF file"):
        cudabin.embedded(tmp_path / "text.so")
