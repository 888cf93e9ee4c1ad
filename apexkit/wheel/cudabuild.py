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
# what a build leaves in its tree and a sync keeps: setuptools' build/temp.* (ninja's objects, build.ninja,
# .ninja_log). Everything else is the source, made equal to the commit's: build/lib.* and the egg-info go, since
# install_lib packs all of build/lib (a module upstream deleted would stay in the wheel)
KEPT = ("build",)
STAMP = "apexkit-objects.json"  # build/<STAMP>: the inputs ninja cannot see (nvcc's version, its env flags)
# variables nvcc reads itself: they change the objects without changing a command line ninja compares, so they
# are part of the cache key and of the objects' stamp
NVCC_ENV = ("NVCC_APPEND_FLAGS", "NVCC_PREPEND_FLAGS", "NVCC_CCBIN")
MAX_MODULES = 256  # upstream master with every contrib extension has ~40


@dataclass(frozen=True)
class Toolkit:
    nvcc: cudatool.Nvcc
    home: Path  # CUDA_HOME: the folder holding bin/nvcc, include/ and lib64/
    chosen: str  # why this one, in words


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
        found = next(
            (
                c
                for c in cudatool.candidates(env)
                if cudatool.is_toolkit(c.parent.parent) and os.access(c, os.X_OK)
            ),
            None,
        )
        if found is None:
            raise ConfigError(
                "no CUDA toolkit found ($CUDA_HOME, $CUDA_PATH, nvcc on PATH, /usr/local/cuda): a CUDA build of "
                "apex compiles with the toolkit's nvcc and headers",
                f"install the CUDA {torch_cuda or 'toolkit'} release torch {torch} was built with (or set CUDA_HOME "
                "to it), or drop --backend cuda",
            )
        home, nvcc, why = found.parent.parent, cudatool.ask(found), "found"
    if torch_cuda is not None:
        cudatool.check_matches_torch(nvcc, torch_cuda, torch)
    cudatool.check_arches(nvcc, arches)
    return Toolkit(nvcc, home, f"CUDA_HOME {home}, {why}")


def sync_tree(source: Path, tree: Path) -> dict[str, int]:
    """Make `tree` hold exactly the files of `source` (a fresh export with our patches applied), writing only the
    files whose bytes or mode differ: an unchanged file keeps its time, so ninja keeps its object. Of the build
    outputs only build/temp.* stays (KEPT). Links are made again as links, never followed."""
    counts = {"written": 0, "kept": 0, "removed": 0}
    for top in KEPT:
        if os.path.lexists(source / top):
            raise ConfigError(
                f"the NVIDIA apex tree has a {top}/ entry, where setup.py writes its objects",
                "build from a tree without it (check --nvidia-apex-url)",
            )
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
            if dest.is_symlink() or (os.path.lexists(dest) and not dest.is_dir()):
                _remove(dest)
            dest.mkdir(exist_ok=True)
        elif src.is_file():
            mode = src.stat().st_mode & 0o755
            if dest.is_file() and not dest.is_symlink() and _same(src, dest):
                if dest.stat().st_mode & 0o777 != mode:
                    os.chmod(dest, mode)
                counts["kept"] += 1
                continue
            _remove(dest)
            tmp = dest.with_name(dest.name + ".apexkit-sync")
            _remove(tmp)
            shutil.copyfile(src, tmp)
            os.chmod(tmp, mode)
            os.replace(tmp, dest)
            counts["written"] += 1
        else:
            raise ConfigError(
                f"the NVIDIA apex tree holds {rel}, which is neither a file, a folder nor a link",
                "build from a plain git tree (check --nvidia-apex-url)",
            )
    for root, dirs, files in os.walk(tree, topdown=True):
        here = Path(root)
        rel_root = here.relative_to(tree)
        if rel_root == Path("build"):  # ninja's objects stay; what install_lib would pack goes
            keep = [d for d in dirs if d.startswith("temp.") and not (here / d).is_symlink()]
            for name in [d for d in dirs if d not in keep] + [f for f in files if f != STAMP]:
                _remove(here / name)
                counts["removed"] += 1
            dirs[:] = []
            continue
        for name in list(dirs):
            rel = rel_root / name
            if rel == Path("build") and not (here / name).is_symlink():
                continue
            if rel not in wanted:
                _remove(here / name)
                counts["removed"] += 1
                dirs.remove(name)
        for name in files:
            if rel_root / name not in wanted:
                _remove(here / name)
                counts["removed"] += 1
    return counts


def objects_for(tree: Path, inputs: dict) -> bool:
    """Keep build/'s objects only when they were compiled from `inputs` (what ninja cannot see: nvcc's version, the
    flag variables it reads from the environment); else remove them. True when they were kept. build/STAMP then
    records `inputs`."""
    import json

    stamp = tree / "build" / STAMP
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
    if path.is_symlink() or (os.path.lexists(path) and not path.is_dir()):
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
