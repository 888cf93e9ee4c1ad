"""What a CUDA build (NVIDIA apex, `--backend cuda`) adds to the shared steps of apexkit.wheel.builder: the toolkit
found and checked before anything is installed, the tree kept between builds and synced by content (ninja then
recompiles only the objects that are missing or whose inputs changed: a killed build resumes, a changed .cu file is
the only one compiled again), the compile environment, and the modules the wheel holds."""

from __future__ import annotations

import os
import shutil
import zipfile
from dataclasses import dataclass
from pathlib import Path

from apexkit.errors import ConfigError
from apexkit.wheel import cudabin, cudatool

PATCHES = "cuda"  # patches/cuda/*.toml: our edits to NVIDIA apex's setup.py (version label, Requires-Dist pins)
# what a build leaves in its tree and a sync keeps: setuptools' build/ (ninja's objects, build.ninja, .ninja_log)
# and the egg-info; everything else is the source, made equal to the commit's
KEPT = ("build", "dist")
MAX_MODULES = 256  # upstream master with every contrib extension has ~40


@dataclass(frozen=True)
class Toolkit:
    nvcc: cudatool.Nvcc
    home: Path  # CUDA_HOME: the folder holding bin/nvcc, include/ and lib64/
    chosen: str  # why this one, in words


def toolkit(env, torch_cuda: str | None, torch: str, arches: tuple[cudabin.Arch, ...]) -> Toolkit:
    """The nvcc a CUDA build compiles with: $CUDA_HOME's when set (the user chose it: a mismatch is refused), else
    the first of $CUDA_PATH, PATH and /usr/local/cuda; checked against torch's CUDA release (upstream's
    check_cuda_torch_binary_vs_bare_metal, before anything is installed or compiled) and the arch list."""
    home = env.get("CUDA_HOME")
    if home and not cudatool.is_toolkit(Path(home)):
        raise ConfigError(
            f"CUDA_HOME={home} is not a CUDA toolkit (no bin/nvcc and include/cuda_runtime.h there)",
            "point CUDA_HOME at the toolkit's folder (e.g. /usr/local/cuda-13.0), or unset it",
        )
    nvcc = cudatool.find(env, toolkit=True)
    if nvcc is None:
        raise ConfigError(
            "no CUDA toolkit found ($CUDA_HOME, $CUDA_PATH, nvcc on PATH, /usr/local/cuda): a CUDA build of apex "
            "compiles with the toolkit's nvcc and headers",
            f"install the CUDA {torch_cuda or 'toolkit'} release torch {torch} was built with (or set CUDA_HOME "
            "to it), or drop --backend cuda",
        )
    if torch_cuda is not None:
        cudatool.check_matches_torch(nvcc, torch_cuda, torch)
    cudatool.check_arches(nvcc, arches)
    where = "$CUDA_HOME" if home else "found"
    root = nvcc.path.parent.parent
    return Toolkit(nvcc, root, f"CUDA_HOME {root}, {where}")


def sync_tree(source: Path, tree: Path) -> dict[str, int]:
    """Make `tree` hold exactly the files of `source` (a fresh export with our patches applied), writing only the
    files whose bytes differ: an unchanged file keeps its time, so ninja keeps its object. KEPT folders and
    *.egg-info (build outputs) stay. Links are made again as links, never followed."""
    counts = {"written": 0, "kept": 0, "removed": 0}
    tree.mkdir(parents=True, exist_ok=True)
    wanted: set[Path] = set()
    for src in sorted(source.rglob("*")):
        rel = src.relative_to(source)
        wanted.add(rel)
        dest = tree / rel
        if src.is_symlink():
            target = os.readlink(src)
            if dest.is_symlink() and os.readlink(dest) == target:
                counts["kept"] += 1
                continue
            _remove(dest)
            dest.symlink_to(target)
            counts["written"] += 1
        elif src.is_dir():
            if dest.is_symlink() or (dest.exists() and not dest.is_dir()):
                _remove(dest)
            dest.mkdir(exist_ok=True)
        else:
            if dest.is_file() and not dest.is_symlink() and _same(src, dest):
                counts["kept"] += 1
                continue
            _remove(dest)
            tmp = dest.with_name(dest.name + ".apexkit-sync")
            shutil.copyfile(src, tmp)
            os.chmod(tmp, src.stat().st_mode & 0o755)
            os.replace(tmp, dest)
            counts["written"] += 1
    for path in sorted(tree.rglob("*"), reverse=True):  # children before their folders
        rel = path.relative_to(tree)
        if rel.parts[0] in KEPT or rel.parts[0].endswith(".egg-info") or rel in wanted:
            continue
        if path.is_dir() and not path.is_symlink():
            if not any(path.iterdir()):
                path.rmdir()
                counts["removed"] += 1
        else:
            path.unlink()
            counts["removed"] += 1
    return counts


def _same(a: Path, b: Path) -> bool:
    if a.stat().st_size != b.stat().st_size:
        return False
    with open(a, "rb") as fa, open(b, "rb") as fb:
        while True:
            x, y = fa.read(1 << 20), fb.read(1 << 20)
            if x != y:
                return False
            if not x:
                return True


def _remove(path: Path) -> None:
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.is_dir():
        shutil.rmtree(path)


def compile_env(
    kit: Toolkit, arch_list: str, jobs: int, nvcc_threads: int, env, site_dir: Path
) -> dict[str, str]:
    """What setup.py and torch's cpp_extension read: CUDA_HOME (upstream master reads `nvcc -V` from it
    unconditionally), TORCH_CUDA_ARCH_LIST, MAX_JOBS (ninja's -j), nvcc's --threads through NVCC_APPEND_FLAGS (nvcc
    reads it itself), PYTORCH_NVCC when ccache can wrap nvcc (torch >= 2.6 reads it), and CPATH: the build venv's
    CUDA wheel headers (cusparse.h, which torch's ATen/cuda headers include and a toolkit without its math
    libraries lacks), searched after every -I, so the toolkit's own headers come first. gcc reads CPATH, and nvcc
    preprocesses with gcc."""
    out = {
        "CUDA_HOME": str(kit.home),
        "TORCH_CUDA_ARCH_LIST": arch_list,
        "MAX_JOBS": str(jobs),
    }
    headers = [*cudatool.runtime_include_dirs(site_dir), *env.get("CPATH", "").split(os.pathsep)]
    if any(headers):
        out["CPATH"] = os.pathsep.join(h for h in headers if h)
    if nvcc_threads > 1:
        out["NVCC_APPEND_FLAGS"] = (
            f"{env.get('NVCC_APPEND_FLAGS', '')} --threads {nvcc_threads}".strip()
        )
    ccache = shutil.which("ccache")
    if ccache and "PYTORCH_NVCC" not in env:
        out["PYTORCH_NVCC"] = f"{ccache} {kit.nvcc.path}"
    return out


def compiled_modules(wheel: Path) -> list[str]:
    """The importable names of the compiled modules a wheel holds (amp_C, apex_C, apex.contrib.x._y)."""
    with zipfile.ZipFile(wheel) as zf:
        names = [
            n
            for n in zf.namelist()
            if n.endswith(".so") and ".dist-info/" not in n and ".data/" not in n
        ]
    out = []
    for name in sorted(names)[:MAX_MODULES]:
        parts = name[: -len(".so")].split("/")
        stem = parts[-1].split(".", 1)[0]
        if all(p.isidentifier() for p in [*parts[:-1], stem]):
            out.append(".".join([*parts[:-1], stem]))
    return out
