"""What a CUDA build (NVIDIA apex, `--backend cuda`) adds to the shared steps of apexkit.wheel.builder: the toolkit
found and checked before anything is installed, the tree kept between builds and synced by content (ninja then
recompiles only the objects that are missing or whose inputs changed: a killed build resumes, a changed .cu file is
the only one compiled again), the compile environment, and the modules the wheel holds."""

from __future__ import annotations

import filecmp
import os
import shutil
import zipfile
from dataclasses import dataclass
from pathlib import Path

from apexkit import cachetrust, paths
from apexkit.errors import ConfigError
from apexkit.wheel import cudabin, cudatool

PATCHES = "cuda"  # patches/cuda/*.toml: our edits to NVIDIA apex's setup.py (version label, Requires-Dist pins)
# what a build leaves in its tree and a sync keeps: setuptools' build/temp.* (ninja's objects, build.ninja,
# .ninja_log). Everything else is the source, made equal to the commit's: build/lib.* and the egg-info go, since
# install_lib packs all of build/lib (a module upstream deleted would stay in the wheel)
KEPT = ("build",)
BUILD = Path(KEPT[0])
STAMP = "apexkit-objects.json"  # build/<STAMP>: the inputs ninja cannot see (nvcc's version, its env flags)
# variables nvcc reads itself: they change the objects without changing a command line ninja compares, so they
# are part of the cache key and of the objects' stamp
NVCC_ENV = ("NVCC_APPEND_FLAGS", "NVCC_PREPEND_FLAGS", "NVCC_CCBIN")
MAX_MODULES = 256  # upstream master with every contrib extension has ~40


# The toolchain from the index when this machine has no toolkit of torch's CUDA release: NVIDIA's wheels, all of one
# release (nvidia-cuda-nvcc names nvidia-nvvm and nvidia-cuda-crt unpinned: left alone, pip takes the newest),
# into the build venv, where CUDA 13's wheels share one tree, nvidia/cu13/{bin,include,lib,nvvm}. cccl: cuda_fp16.h
# includes <nv/target>. The runtime (nvidia-cuda-runtime) comes with torch, pinned by it.
INDEX_WHEELS = ("nvidia-cuda-nvcc", "nvidia-nvvm", "nvidia-cuda-crt", "nvidia-cuda-cccl")
# CUDA 12's nvidia-cuda-nvcc-cu12 holds ptxas, libnvvm and libdevice but no nvcc (12.6.85 and 12.9.86, read
# 2026-12-04 off the wheels the index serves): a CUDA 12 torch needs a CUDA 12 toolkit on the machine.
INDEX_MIN_MAJOR = 13
MAX_LIBS = 512  # files in nvidia/cu13/lib: ~40 with torch 2.14.1's wheels


@dataclass(frozen=True)
class Toolkit:
    nvcc: cudatool.Nvcc | None  # None: from the index, known once the build venv holds it
    home: Path | None  # CUDA_HOME: the folder holding bin/nvcc, include/ and lib64/
    chosen: str  # why this one, in words
    wheels: tuple[str, ...] = ()  # the index's toolchain: requirements for the build venv

    @property
    def version(self) -> str:
        """nvcc's version, or the index's requirement while it is not installed (a cache key input)."""
        return self.nvcc.version if self.nvcc is not None else self.wheels[0]

    def found(self) -> tuple[cudatool.Nvcc, Path]:
        """(nvcc, CUDA_HOME) of a toolkit on this machine or assembled from the index's wheels."""
        if self.nvcc is None or self.home is None:
            raise RuntimeError("the index's CUDA toolchain is used before the build venv holds it")
        return self.nvcc, self.home


def toolkit(env, torch_cuda: str | None, torch: str, arches: tuple[cudabin.Arch, ...]) -> Toolkit:
    """The toolkit a CUDA build compiles with: $CUDA_HOME's when set (the user chose it: only its own nvcc, and a
    mismatch is refused), else the first toolkit layout among $CUDA_PATH, nvcc on PATH and /usr/local/cuda; checked
    against torch's CUDA release (upstream's check_cuda_torch_binary_vs_bare_metal, before anything is installed or
    compiled) and the arch list. CUDA_HOME is the folder as found, links not resolved: a packaged toolkit whose
    bin/nvcc links elsewhere keeps its include/ and lib64/ beside it."""
    if env.get("PYTORCH_NVCC"):
        raise ConfigError(
            "PYTORCH_NVCC is set: torch would compile with it instead of the nvcc apexkit checks against torch's CUDA",
            "unset PYTORCH_NVCC; CUDA_HOME chooses the toolkit (apexkit wraps nvcc in ccache itself)",
        )
    chosen = env.get("CUDA_HOME")
    if chosen:
        home = Path(chosen)
        nvcc_path = home / "bin" / "nvcc"
        if not cudatool.is_toolkit(home):
            raise ConfigError(
                f"CUDA_HOME={chosen} is not a CUDA toolkit (no bin/nvcc and include/cuda_runtime.h there)",
                "point CUDA_HOME at the toolkit's folder (e.g. /usr/local/cuda-13.0), or unset it",
            )
        if not os.access(nvcc_path, os.X_OK):
            raise ConfigError(
                f"CUDA_HOME={chosen}: bin/nvcc is not executable",
                "fix the toolkit's install, or point CUDA_HOME at another",
            )
        nvcc, why = cudatool.ask(nvcc_path), "$CUDA_HOME"
    else:
        on_machine = [
            c
            for c in cudatool.candidates(env)
            if cudatool.is_toolkit(c.parent.parent) and os.access(c, os.X_OK)
        ]
        asked = _first_matching(on_machine, torch_cuda)
        if asked is None:
            return _from_index(on_machine, torch_cuda, torch)
        nvcc, home, why = asked[0], asked[1].parent.parent, "found"
    if torch_cuda is not None:
        cudatool.check_matches_torch(nvcc, torch_cuda, torch)
    cudatool.check_arches(nvcc, arches)
    return Toolkit(nvcc, home, f"CUDA_HOME {home}, {why}")


def _first_matching(
    on_machine: list[Path], torch_cuda: str | None
) -> tuple[cudatool.Nvcc, Path] | None:
    """The first toolkit whose release is torch's CUDA (the first of all when torch's CUDA is not known yet)."""
    seen: set[Path] = set()
    for path in on_machine:
        if path.resolve() in seen:  # /usr/local/cuda/bin on PATH and /usr/local/cuda: asked once
            continue
        seen.add(path.resolve())
        nvcc = cudatool.ask(path)
        if torch_cuda is None or nvcc.release == cudatool.release(torch_cuda):
            return nvcc, path
    return None


def _from_index(on_machine: list[Path], torch_cuda: str | None, torch: str) -> Toolkit:
    """No toolkit of torch's CUDA release here: NVIDIA's toolchain wheels of that release, from the index."""
    seen = (
        f" (here: {', '.join(str(p.parent.parent) for p in on_machine[:3])})" if on_machine else ""
    )
    if torch_cuda is None:
        raise ConfigError(
            "no CUDA toolkit found ($CUDA_HOME, $CUDA_PATH, nvcc on PATH, /usr/local/cuda) and torch "
            f"{torch}'s CUDA release is not known before it is installed",
            "install the CUDA toolkit torch was built with (or set CUDA_HOME to it), or add the torch version to "
            "matrix.toml [cuda.torch_cuda] so apexkit can take nvcc from the index",
        )
    release = cudatool.release(torch_cuda)
    if int(release.split(".")[0]) < INDEX_MIN_MAJOR:
        raise ConfigError(
            f"no CUDA {release} toolkit found{seen}; torch {torch} was built with CUDA {torch_cuda}, and apexkit "
            f"takes nvcc from the index for CUDA {INDEX_MIN_MAJOR} and later only (CUDA 12's nvidia-cuda-nvcc-cu12 "
            "wheel holds ptxas, not nvcc)",
            f"install the CUDA {release} toolkit (or set CUDA_HOME to it), or drop --backend cuda",
        )
    wheels = tuple(f"{name}=={release}.*" for name in INDEX_WHEELS)
    return Toolkit(
        None,
        None,
        f"no CUDA {release} toolkit on this machine{seen}: {wheels[0]} (+ nvvm, crt, cccl) from the index, into "
        "the build venv",
        wheels,
    )


def check_offline(kit: Toolkit, wheelhouses: tuple[Path, ...]) -> None:
    """--offline and the index's toolchain: every wheel of it must lie in a wheelhouse, checked before anything is
    installed (pip would fail after torch, minutes in)."""
    missing = []
    for spec in kit.wheels:
        name, _, release = spec.partition("==")
        prefix = f"{name.replace('-', '_')}-{release.rstrip('*')}"
        if not any(
            f.name.startswith(prefix) and f.name.endswith(".whl")
            for w in wheelhouses
            if w.is_dir()
            for f in list(w.iterdir())[:100_000]
        ):
            missing.append(spec)
    if missing:
        raise ConfigError(
            f"no CUDA toolkit of torch's release here, and --offline: the wheelhouse holds no {', '.join(missing)}",
            f"add them to the wheelhouse (pip download --no-deps {' '.join(repr(m) for m in missing)} -d DIR), or "
            "install the CUDA toolkit and set CUDA_HOME",
        )


def from_venv(
    kit: Toolkit,
    site_dir: Path,
    home: Path,
    torch_cuda: str | None,
    torch: str,
    arches: tuple[cudabin.Arch, ...],
) -> Toolkit:
    """`kit` (from the index) once the build venv holds its wheels: `home` made a toolkit layout over the venv's
    nvidia/cuXX tree (bin, include and nvvm linked; lib64 holding a link to each library, and the unversioned
    libcudart.so the link step's -lcudart looks for, which the runtime wheel leaves out), nvcc asked and checked
    like a toolkit on the machine. `home` is made again each time: it lives in the build's own folder."""
    if kit.nvcc is not None:
        return kit
    cudatool.require_cuda_torch(torch_cuda, torch)
    tree = site_dir / "nvidia" / f"cu{cudatool.release(str(torch_cuda)).split('.')[0]}"
    nvcc_path = tree / "bin" / "nvcc"
    runtime = sorted((tree / "lib").glob("libcudart.so.[0-9]*")) if tree.is_dir() else []
    if tree.is_symlink() or not nvcc_path.is_file() or nvcc_path.is_symlink() or not runtime:
        raise ConfigError(
            f"the build venv has no CUDA toolchain in {tree} after installing {' '.join(kit.wheels)}",
            "check that the index serves NVIDIA's CUDA wheels of that release, or install the CUDA toolkit and "
            "set CUDA_HOME",
        )
    _remove(home)
    (home / "lib64").mkdir(parents=True)
    for sub in ("bin", "include", "nvvm"):
        if (tree / sub).is_dir() and not (tree / sub).is_symlink():
            (home / sub).symlink_to(tree / sub, target_is_directory=True)
    for lib in sorted((tree / "lib").iterdir())[:MAX_LIBS]:
        if lib.is_file() and not lib.is_symlink():
            (home / "lib64" / lib.name).symlink_to(lib)
    if not os.path.lexists(home / "lib64" / "libcudart.so"):
        (home / "lib64" / "libcudart.so").symlink_to(runtime[0].name)
    nvcc = cudatool.ask(home / "bin" / "nvcc")
    cudatool.check_matches_torch(nvcc, torch_cuda, torch)
    cudatool.check_arches(nvcc, arches)
    return Toolkit(nvcc, home, f"CUDA_HOME {home} over {tree}, from the index", kit.wheels)


def sync_tree(source: Path, tree: Path) -> dict[str, int]:
    """Make `tree` hold exactly the files of `source` (a fresh export with our patches applied), writing only the
    files whose bytes or mode differ: an unchanged file keeps its time, so ninja keeps its object. Of the build
    outputs only build/temp.* stays (KEPT). Links are made again as links, never followed."""
    for top in KEPT:
        if os.path.lexists(source / top):
            raise ConfigError(
                f"the NVIDIA apex tree has a {top}/ entry, where setup.py writes its objects",
                "build from a tree without it (check --nvidia-apex-url)",
            )
    tree.mkdir(parents=True, exist_ok=True)
    counts = {"written": 0, "kept": 0, "removed": 0}
    wanted: set[Path] = set()
    for src in sorted(source.rglob("*")):
        rel = src.relative_to(source)
        wanted.add(rel)
        done = _sync_one(src, tree / rel, rel)
        if done:
            counts[done] += 1
    counts["removed"] = _prune(tree, wanted)
    return counts


def _sync_one(src: Path, dest: Path, rel: Path) -> str | None:
    """`dest` made like `src`: "written", "kept" (a file or link already the same) or None (a folder)."""
    if src.is_symlink():
        target = os.readlink(src)
        if dest.is_symlink() and os.readlink(dest) == target:
            return "kept"
        _remove(dest)
        dest.symlink_to(target)
        return "written"
    if src.is_dir():
        if dest.is_symlink() or (os.path.lexists(dest) and not dest.is_dir()):
            _remove(dest)
        dest.mkdir(exist_ok=True)
        return None
    if not src.is_file():
        raise ConfigError(
            f"the NVIDIA apex tree holds {rel}, which is neither a file, a folder nor a link",
            "build from a plain git tree (check --nvidia-apex-url)",
        )
    mode = src.stat().st_mode & 0o755
    if dest.is_file() and not dest.is_symlink() and filecmp.cmp(src, dest, shallow=False):
        if dest.stat().st_mode & 0o777 != mode:
            os.chmod(dest, mode)
        return "kept"
    _remove(dest)
    tmp = dest.with_name(dest.name + ".apexkit-sync")
    _remove(tmp)
    shutil.copyfile(src, tmp)
    os.chmod(tmp, mode)
    os.replace(tmp, dest)
    return "written"


def _prune(tree: Path, wanted: set[Path]) -> int:
    """Removes from `tree` what is not `wanted`, except ninja's objects in build/temp.* (what install_lib would pack
    goes); returns how many entries went."""
    removed = 0
    for root, dirs, files in os.walk(tree, topdown=True):
        here = Path(root)
        rel_root = here.relative_to(tree)
        if rel_root == BUILD:
            gone = [d for d in dirs if not d.startswith("temp.") or (here / d).is_symlink()]
            gone += [f for f in files if f != STAMP]
        else:
            gone = [
                d
                for d in dirs
                if rel_root / d not in wanted and (rel_root / d != BUILD or (here / d).is_symlink())
            ]
            gone += [f for f in files if rel_root / f not in wanted]
        for name in gone:
            _remove(here / name)
        removed += len(gone)
        dirs[:] = [] if rel_root == BUILD else [d for d in dirs if d not in gone]
    return removed


def objects_for(tree: Path, inputs: dict) -> bool:
    """Keep build/'s objects only when they were compiled from `inputs` (what ninja cannot see: nvcc's version, the
    flag variables it reads from the environment); else remove them. True when they were kept. build/STAMP then
    records `inputs`."""
    import json

    cachetrust.trusted_output(
        tree / BUILD, paths.BUILD_SETTING, make=False
    )  # ninja trusts what it holds
    stamp = tree / BUILD / STAMP
    before = None
    if stamp.is_file() and not stamp.is_symlink():
        try:
            with open(stamp, "rb") as fh:
                before = json.loads(fh.read(1 << 16))
        except (OSError, ValueError):
            before = None
    kept = before == inputs
    if not kept:
        _remove(tree / "build")
    (tree / "build").mkdir(parents=True, exist_ok=True)
    tmp = stamp.with_name(STAMP + ".tmp")
    tmp.write_text(json.dumps(inputs, sort_keys=True))
    os.replace(tmp, stamp)
    return kept


def _remove(path: Path) -> None:
    if path.is_symlink() or (os.path.lexists(path) and not path.is_dir()):
        path.unlink()
    elif path.is_dir():
        shutil.rmtree(path)


def compile_env(
    kit: Toolkit,
    arch_list: str,
    jobs: int,
    nvcc_threads: int,
    env,
    site_dir: Path,
    ccache: str | None = None,
) -> dict[str, str]:
    """What setup.py and torch's cpp_extension read: CUDA_HOME (upstream master reads `nvcc -V` from it
    unconditionally), TORCH_CUDA_ARCH_LIST, MAX_JOBS (ninja's -j), nvcc's --threads through NVCC_APPEND_FLAGS (nvcc
    reads it itself), PYTORCH_NVCC when `ccache` (the build's, ccachestats.find) wraps nvcc (torch >= 2.6 reads
    it; the host compiler is wrapped by the masquerade directory on PATH), and CPATH: the build venv's
    CUDA wheel headers (cusparse.h, which torch's ATen/cuda headers include and a toolkit without its math
    libraries lacks), searched after every -I, so the toolkit's own headers come first. gcc reads CPATH, and nvcc
    preprocesses with gcc."""
    nvcc, home = kit.found()
    out = {
        "CUDA_HOME": str(home),
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
    if ccache and "PYTORCH_NVCC" not in env:
        out["PYTORCH_NVCC"] = f"{ccache} {nvcc.path}"
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
