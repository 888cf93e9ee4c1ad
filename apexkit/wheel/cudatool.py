"""The CUDA toolchain of a CUDA build, found and checked before anything compiles: which nvcc, its release against
the CUDA torch was built with (the check upstream NVIDIA apex's setup.py makes only after minutes of setup), the
architectures it can compile for, and how many compile jobs fit this machine.

The facts are read off the tools' own words (`nvcc -V`, `nvcc --list-gpu-arch`); parsing is pure and separate
from running, so both are tested: the parsing on text, the running against the installed nvcc.
"""

from __future__ import annotations

import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

from apexkit.errors import ConfigError
from apexkit.wheel import cudabin

_RELEASE = re.compile(r"release (?P<major>\d+)\.(?P<minor>\d+), V(?P<full>\d+\.\d+\.\d+)")
_ARCH = re.compile(r"^compute_(?P<n>\d+)[af]?\Z")
MAX_OUTPUT = 64 * 1024  # nvcc's answers are a few lines; more is not nvcc
# Peak resident memory of one nvcc job on apex's largest kernels, in GiB (flash-attention's setup.py budgets the
# same way; upstream master's multi_tensor_scale_kernel.cu peaked at 1.3 GB here for one architecture).
GIB_PER_JOB = 2.0


@dataclass(frozen=True)
class Nvcc:
    path: Path
    release: str  # "13.0": what upstream compares with torch.version.cuda
    version: str  # "13.0.88"
    arches: frozenset[int]  # what --list-gpu-arch names: 75, 80, 86, 90, 100, ...


def parse_version(text: str) -> tuple[str, str]:
    """(release, full version) from `nvcc -V`: ("13.0", "13.0.88")."""
    m = _RELEASE.search(text[:MAX_OUTPUT])
    if m is None:
        raise ConfigError(
            "nvcc -V printed no 'release X.Y, VX.Y.Z' line",
            "point CUDA_HOME at a CUDA toolkit (its bin/nvcc)",
        )
    return f"{m['major']}.{m['minor']}", m["full"]


def parse_arches(text: str) -> frozenset[int]:
    """The virtual architectures of `nvcc --list-gpu-arch`, as numbers."""
    matches = (_ARCH.match(word) for word in text[:MAX_OUTPUT].split())
    return frozenset(int(m["n"]) for m in matches if m is not None)


def candidates(env) -> list[Path]:
    """Where nvcc is looked for, in upstream's order (torch.utils.cpp_extension's CUDA_HOME): $CUDA_HOME,
    $CUDA_PATH, nvcc on PATH, /usr/local/cuda."""
    homes = [Path(env[k]) / "bin" for k in ("CUDA_HOME", "CUDA_PATH") if env.get(k)]
    on_path = [Path(folder) for folder in env.get("PATH", "").split(os.pathsep) if folder]
    return [folder / "nvcc" for folder in (*homes, *on_path, Path("/usr/local/cuda/bin"))]


def _ask(nvcc: Path, *args: str) -> str:
    """What nvcc prints for `args` (at most MAX_OUTPUT bytes of it read: more is not nvcc)."""
    import tempfile

    try:
        with tempfile.TemporaryFile() as out:
            proc = subprocess.run(
                [str(nvcc), *args], stdout=out, stderr=subprocess.DEVNULL, timeout=60
            )
            out.seek(0)
            text = out.read(MAX_OUTPUT).decode(errors="replace")
    except (OSError, subprocess.TimeoutExpired) as exc:
        why = (
            "did not answer in 60 s"
            if isinstance(exc, subprocess.TimeoutExpired)
            else f"cannot run ({exc.strerror})"
        )
        raise ConfigError(
            f"{nvcc} {why}", "check the CUDA toolkit's install, or point CUDA_HOME at another"
        ) from None
    if proc.returncode != 0:
        raise ConfigError(
            f"{nvcc} {' '.join(args)} exited {proc.returncode}", "check the CUDA toolkit's install"
        )
    return text


def is_toolkit(home: Path) -> bool:
    """Whether `home` is laid out as a CUDA toolkit (bin/nvcc, include/cuda_runtime.h): what CUDA_HOME must be.
    A wrapper script on PATH (/usr/local/bin/nvcc exec-ing the real one) is not: its ../include has no CUDA."""
    return (home / "bin" / "nvcc").is_file() and (home / "include" / "cuda_runtime.h").is_file()


def find(env, toolkit: bool = False) -> Nvcc | None:
    """The first nvcc that answers, or None. `toolkit`: only an nvcc inside a toolkit layout (is_toolkit of its
    ../), the one a build can set CUDA_HOME to."""
    for path in candidates(env):
        if toolkit and not is_toolkit(path.parent.parent):
            continue
        if path.is_file() and os.access(path, os.X_OK):
            return ask(path)
    return None


def ask(path: Path) -> Nvcc:
    """The facts of the nvcc at `path` (its release, full version, architectures), from its own answers."""
    release, version = parse_version(_ask(path, "-V"))
    return Nvcc(path.resolve(), release, version, parse_arches(_ask(path, "--list-gpu-arch")))


def check_matches_torch(nvcc: Nvcc, torch_cuda: str | None, torch: str) -> None:
    """Upstream's check_cuda_torch_binary_vs_bare_metal, before compiling: nvcc's release equals torch's CUDA."""
    require_cuda_torch(torch_cuda, torch)
    assert torch_cuda is not None
    if release(torch_cuda) != nvcc.release:
        raise ConfigError(
            f"nvcc {nvcc.version} ({nvcc.path}) is CUDA {nvcc.release}; torch {torch} was built with CUDA {torch_cuda}",
            f"point CUDA_HOME at a CUDA {release(torch_cuda)} toolkit, or unset it to take nvcc from the index's "
            "nvidia-cuda-nvcc wheel",
        )


def require_cuda_torch(torch_cuda: str | None, torch: str) -> None:
    """A CUDA build needs a CUDA torch (torch.version.cuda set)."""
    if not torch_cuda:
        raise ConfigError(
            f"torch {torch} is a build without CUDA (torch.version.cuda is None): a CUDA build of apex needs a CUDA torch",
            "pass --torch-index-url https://download.pytorch.org/whl/cu130 (or your mirror of it), or drop --backend cuda",
        )


def release(version: str) -> str:
    """A CUDA version's release, as toolkits and torch name it: 13.0.2 -> 13.0."""
    return ".".join(version.split(".")[:2])


def check_arches(nvcc: Nvcc, arches: tuple[cudabin.Arch, ...]) -> None:
    unknown = [a.text for a in arches if a.number not in nvcc.arches]
    if unknown:
        known = ", ".join(f"{n // 10}.{n % 10}" for n in sorted(nvcc.arches)) or "none"
        raise ConfigError(
            f"nvcc {nvcc.version} cannot compile for {', '.join(unknown)} (it knows {known})",
            "choose from those, or use a toolkit that supports them",
        )


def free_gib(meminfo: Path = Path("/proc/meminfo")) -> float:
    """MemAvailable in GiB, the memory `jobs` may plan for (4.0 when /proc/meminfo cannot be read)."""
    try:
        with open(meminfo, "rb") as fh:
            text = fh.read(MAX_OUTPUT).decode("ascii", "replace")
    except OSError:
        return 4.0
    m = re.search(r"^MemAvailable:\s+(\d{1,15}) kB$", text, re.MULTILINE)
    return int(m[1]) / 2**20 if m else 4.0


def jobs(cores: int, free_gib: float, asked: int | None = None) -> tuple[int, int]:
    """(MAX_JOBS, NVCC_THREADS): as many jobs as cores and memory allow (GIB_PER_JOB each), and nvcc threads to use
    what is left when there are fewer translation units than cores; an explicit --jobs wins."""
    if asked is not None:
        return max(1, asked), 1
    by_memory = max(1, int(free_gib // GIB_PER_JOB))
    n = max(1, min(cores, by_memory))
    return n, max(1, min(4, cores // n))


MAX_LIB_DIRS = 64  # torch 2.14.1's CUDA wheels install ~20 packages under nvidia/


def runtime_lib_dirs(site_dir: Path) -> tuple[str, ...]:
    """The CUDA runtime wheels' library folders in a venv's site-packages, for the binary checks: a CUDA extension
    may link libcudart.so.13 and friends from there, as torch itself does (nvidia/cuda_runtime/lib in CUDA 12's
    wheels, nvidia/cu13/lib in CUDA 13's). Real folders only: a link could point the check at another tree."""
    return _wheel_dirs(site_dir, "lib")


def runtime_include_dirs(site_dir: Path) -> tuple[str, ...]:
    """The CUDA wheels' header folders in the build venv (nvidia/cu13/include): torch's own headers include
    cusparse.h, cublas_v2.h, ... which a CUDA toolkit installed without the math libraries lacks; the build puts these
    after the toolkit's own include folder (CPATH), so the toolkit's headers win where both have one."""
    return _wheel_dirs(site_dir, "include")


def _wheel_dirs(site_dir: Path, sub: str) -> tuple[str, ...]:
    root = site_dir / "nvidia"
    if root.is_symlink() or not root.is_dir():
        return ()
    packages = [p for p in sorted(root.iterdir())[: MAX_LIB_DIRS * 4] if not p.is_symlink()]
    found = [str(p / sub) for p in packages if not (p / sub).is_symlink() and (p / sub).is_dir()]
    return tuple(found[:MAX_LIB_DIRS])
