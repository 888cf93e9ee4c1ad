"""A CUDA build's decisions before anything runs (issue 29): --backend cuda and its options, refused together with
the Ascend-only ones; the plan, target id and cache key; the build tree synced by content (what makes ninja resume
and recompile only what changed); our setup.py edits on upstream-shaped sources; the toolkit refusals that need no
nvcc to run."""

from __future__ import annotations

import os
import re
import time
import zipfile
from pathlib import Path

import pytest

from apexkit import paths
from apexkit.errors import ConfigError
from apexkit.plan import matrix
from apexkit.wheel import buildplan, cudabuild, cudatool, options, patches
from apexkit.wheel.interpreters import Interpreter
from apexkit.wheel.options import BuildOptions

INTERP = Interpreter("/usr/bin/python3.11", "3.11", "3.11.2", "cpython", "x86_64", "/usr", "", "")


def resolve(*argv: str, env: dict | None = None) -> BuildOptions:
    return options.resolve("3.11", list(argv), env=env or {})


# --- options ---------------------------------------------------------------------------------------------------


def test_a_cuda_build_takes_the_default_arch_list_and_core():
    opts = resolve("--backend", "cuda", "--jobs", "3")
    assert (opts.backend, opts.cuda_arch, opts.cuda_ext) == ("cuda", "8.0;9.0", ("core",))
    assert opts.jobs == 3  # an explicit --jobs wins over the memory rule
    assert (
        resolve("--backend", "cuda", env={"TORCH_CUDA_ARCH_LIST": "9.0 10.0"}).cuda_arch
        == "9.0;10.0"
    )
    assert resolve("--backend", "cuda", "--cuda-arch", "9.0+PTX").cuda_arch == "9.0+PTX"


def test_without_jobs_a_cuda_build_plans_jobs_from_cores_and_memory():
    opts = resolve("--backend", "cuda")
    assert opts.jobs == cudatool.jobs(os.cpu_count() or 1, cudatool.free_gib())[0]


@pytest.mark.parametrize(
    ("argv", "cause"),
    [
        (["--backend", "cuda", "--npu"], "--npu is for the Ascend build only"),
        (["--backend", "cuda", "--torch-npu", "2.7.1"], "--torch-npu is for the Ascend build only"),
        (["--backend", "cuda", "--stack", "newest"], "--stack is for the Ascend build only"),
        (
            ["--backend", "cuda", "--skip-patch", "x", "--sanitize", "address"],
            "--skip-patch, --sanitize are",
        ),
        (["--cuda-arch", "9.0"], "--cuda-arch apply to NVIDIA apex on CUDA only"),
        (["--cuda-ext", "core"], "--cuda-ext apply to NVIDIA apex on CUDA only"),
        (["--backend", "cuda", "--cuda-arch", "Hopper"], "is not a compute capability"),
        (["--backend", "cuda", "--cuda-arch", ";"], "the CUDA arch list is empty"),
        (["--backend", "cuda", "--cuda-ext", "xentropy"], "leaves out core"),
        (["--backend", "cuda", "--cuda-ext", "core,../x"], "is not an extension name"),
    ],
)
def test_contradicting_or_malformed_cuda_options_are_one_line(argv, cause):
    with pytest.raises(ConfigError) as err:
        resolve(*argv)
    assert cause in err.value.cause and "\n" not in err.value.cause and err.value.hint


def test_a_python_without_a_cuda_torch_default_is_refused_with_the_way_out():
    with pytest.raises(ConfigError, match=r"names no torch for Python 3\.8") as err:
        options.resolve("3.8", ["--backend", "cuda"], env={})
    assert "--torch" in err.value.hint
    assert (
        options.resolve("3.8", ["--backend", "cuda", "--torch", "2.4.1"], env={}).torch == "2.4.1"
    )


def test_a_cuda_options_file_for_a_builder_image_is_refused():
    data = options.to_json(resolve("--backend", "cuda", "--cuda-ext", "core,xentropy"))
    with pytest.raises(ConfigError, match="does not run in a builder image yet"):
        options.from_json(data, "3.11")
    data = options.to_json(resolve())
    data["cuda_arch"] = "8.0"  # an Ascend file carrying CUDA fields: not from our host
    with pytest.raises(ConfigError, match="does not run in a builder image yet"):
        options.from_json(data, "3.11")


@pytest.mark.parametrize(
    ("text", "cause"),
    [
        (
            "\u0668.\u0660",
            "is not a compute capability",
        ),  # Arabic-Indic digits: int() reads them, torch does not
        ("\uff19.\uff10", "is not a compute capability"),
        ("9.0;9.0", "9.0 is listed twice"),
        (";".join(f"{m}.{n}" for m in range(5, 12) for n in range(8)), "more than 32 entries"),
    ],
)
def test_arch_lists_torch_would_refuse_or_that_name_one_build_twice_are_refused(text, cause):
    with pytest.raises(ConfigError, match=re.escape(cause)):
        resolve("--backend", "cuda", "--cuda-arch", text)


def test_an_arch_is_written_one_way_so_one_build_has_one_target():
    assert resolve("--backend", "cuda", "--cuda-arch", "08.0;9.0a+PTX").cuda_arch == "8.0;9.0a+PTX"


def test_a_long_cuda_part_of_the_target_id_is_hashed():
    from apexkit.plan import target

    names = [f"contrib_{i}" for i in range(40)]
    tid = target.Target.of(
        "3.11",
        "2.14.1",
        "x86_64",
        "master",
        backend="cuda",
        identity={"backend": "cuda", "cuda_arch": "9.0", "cuda_ext": names},
    ).id
    assert len(tid) < 120 and tid.startswith("py3.11-torch2.14.1-x86_64-master+cuda.sm90+ext-")


# --- plan, target id, cache key --------------------------------------------------------------------------------


def plan(**kw) -> buildplan.Plan:
    opts = BuildOptions(python="3.11", backend="cuda", cuda_arch="8.0;9.0", **kw)
    return buildplan.make_plan(opts, matrix.load(), INTERP, None, env={})


def test_the_plan_of_a_cuda_build_names_nvidia_apex_its_arches_and_torchs_cuda():
    p = plan()
    assert p.target_id == "py3.11-torch2.14.1-x86_64-master+cuda.sm80.sm90"
    assert (p.backend, p.torch, p.torch_cuda, p.torch_npu) == ("cuda", "2.14.1", "13.0", None)
    assert p.flags == ("--cpp_ext", "--cuda_ext")
    assert plan(cuda_ext=("core", "xentropy")).flags == ("--cpp_ext", "--cuda_ext", "--xentropy")
    assert plan(cuda_ext=("core", "xentropy")).target_id.endswith(
        "+cuda.sm80.sm90+ext-core.xentropy"
    )
    ascend = buildplan.make_plan(
        BuildOptions(python="3.11", torch="2.14.1"), matrix.load(), INTERP, None, {}
    )
    assert ascend.target_id != p.target_id and ascend.backend == "ascend"


def test_the_cache_key_changes_with_the_arch_list_and_the_toolkit_and_not_for_ascend():
    m = matrix.load()
    opts = BuildOptions(python="3.11", backend="cuda", cuda_arch="8.0;9.0")
    p = plan()

    def key(pl, nvcc="13.0.88"):
        return buildplan.cache_key(pl, opts, "", "a" * 40, [], m, extra={"nvcc": nvcc})

    assert key(p) != key(p, nvcc="13.0.48")
    other = buildplan.make_plan(
        BuildOptions(python="3.11", backend="cuda", cuda_arch="9.0"), m, INTERP, None, env={}
    )
    assert key(p) != key(other)
    ascend = buildplan.make_plan(BuildOptions(python="3.11"), m, INTERP, None, env={})
    assert "backend" not in ascend.identity


# --- the build tree --------------------------------------------------------------------------------------------


def write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)


def test_the_tree_sync_rewrites_only_changed_files_and_keeps_the_objects(tmp_path):
    src, tree = tmp_path / "src", tmp_path / "tree"
    write(
        src,
        {"setup.py": "v1", "csrc/a.cu": "a", "csrc/b.cu": "b", "old.py": "x", "apex/gone.py": "x"},
    )
    assert cudabuild.sync_tree(src, tree) == {"written": 5, "kept": 0, "removed": 0}
    write(
        tree,
        {
            "build/temp.linux-x86_64-cpython-311/csrc/a.o": "object",
            "build/lib.linux-x86_64-cpython-311/apex/gone.py": "x",  # install_lib would pack it
            "apex.egg-info/PKG-INFO": "x",
        },
    )
    past = time.time() - 3600
    for rel in ("csrc/a.cu", "csrc/b.cu", "setup.py"):
        os.utime(tree / rel, (past, past))
    (src / "old.py").unlink()
    (src / "apex/gone.py").unlink()
    write(src, {"csrc/b.cu": "b changed"})
    (src / "setup.py").chmod(0o755)
    counts = cudabuild.sync_tree(src, tree)
    assert counts == {"written": 1, "kept": 2, "removed": 4}
    assert (tree / "csrc/b.cu").read_text() == "b changed" and (
        tree / "csrc/b.cu"
    ).stat().st_mtime > past + 60
    assert (tree / "csrc/a.cu").stat().st_mtime == pytest.approx(past)  # ninja keeps a.o
    assert (tree / "setup.py").stat().st_mode & 0o777 == 0o755
    assert (tree / "setup.py").stat().st_mtime == pytest.approx(past)
    assert not (tree / "old.py").exists() and not (tree / "apex" / "gone.py").exists()
    assert (tree / "build/temp.linux-x86_64-cpython-311/csrc/a.o").read_text() == "object"
    assert not (tree / "build/lib.linux-x86_64-cpython-311").exists()
    assert not (tree / "apex.egg-info").exists()


def test_a_source_tree_with_a_build_entry_or_a_fifo_is_refused(tmp_path):
    src, tree = tmp_path / "src", tmp_path / "tree"
    write(src, {"setup.py": "v1", "build/x": "planted"})
    with pytest.raises(ConfigError, match="has a build/ entry"):
        cudabuild.sync_tree(src, tree)
    src2 = tmp_path / "src2"
    write(src2, {"setup.py": "v1"})
    os.mkfifo(src2 / "pipe")
    with pytest.raises(ConfigError, match="neither a file, a folder nor a link"):
        cudabuild.sync_tree(src2, tree)


def test_objects_made_by_another_nvcc_are_not_kept(tmp_path):
    write(tmp_path, {"build/temp.x/a.o": "object"})
    assert not cudabuild.objects_for(
        tmp_path, {"nvcc": "13.0.88"}
    )  # no stamp yet: nothing known about a.o
    write(tmp_path, {"build/temp.x/a.o": "object"})
    assert cudabuild.objects_for(tmp_path, {"nvcc": "13.0.88"})
    assert (tmp_path / "build/temp.x/a.o").exists()
    assert not cudabuild.objects_for(tmp_path, {"nvcc": "13.0.96"})
    assert not (tmp_path / "build/temp.x").exists()
    (tmp_path / "build" / cudabuild.STAMP).write_text("not json")
    assert not cudabuild.objects_for(tmp_path, {"nvcc": "13.0.96"})


def test_the_tree_sync_replaces_a_planted_link_instead_of_writing_through_it(tmp_path):
    src, tree, outside = tmp_path / "src", tmp_path / "tree", tmp_path / "outside.txt"
    write(src, {"setup.py": "mine"})
    outside.write_text("theirs")
    tree.mkdir()
    (tree / "setup.py").symlink_to(outside)
    cudabuild.sync_tree(src, tree)
    assert outside.read_text() == "theirs"
    assert not (tree / "setup.py").is_symlink() and (tree / "setup.py").read_text() == "mine"


def test_the_compiled_modules_are_read_off_the_wheel(tmp_path):
    wheel = tmp_path / "apex-0.1-cp311-cp311-linux_x86_64.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        for name in (
            "amp_C.cpython-311-x86_64-linux-gnu.so",
            "apex_C.cpython-311-x86_64-linux-gnu.so",
            "apex/contrib/xentropy/_x.cpython-311-x86_64-linux-gnu.so",
            "apex-0.1.dist-info/odd.so",
            "bad-name/x.so",
            "apex/__init__.py",
        ):
            zf.writestr(name, b"")
    assert cudabuild.compiled_modules(wheel) == ["amp_C", "apex.contrib.xentropy._x", "apex_C"]


# --- our setup.py edits ----------------------------------------------------------------------------------------

MASTER_SHAPED = """import os
setup(
    name="apex",
    version="0.1",
    packages=find_packages(),
    install_requires=["packaging>20.6"],
    ext_modules=ext_modules,
)
"""
OLD_SHAPED = """import os
setup(
    name='apex',
    version='0.1',
    packages=find_packages(),
    ext_modules=ext_modules,
)
"""


@pytest.mark.parametrize("text", [MASTER_SHAPED, OLD_SHAPED])
def test_the_cuda_patches_label_the_version_and_pin_torch_in_both_setup_py_shapes(tmp_path, text):
    (tmp_path / "setup.py").write_text(text)
    cuda = patches.load_all(paths.PATCHES / cudabuild.PATCHES)
    results = {r.id: r.status for r in patches.apply_all(tmp_path, (), cuda)}
    assert results["cuda-version"] == patches.APPLIED
    patched = (tmp_path / "setup.py").read_text()
    ns: dict = {}

    def setup(**kw):
        ns.update(kw)

    env = {"APEXKIT_VERSION_LABEL": "+cu130.torch2.14.1", "APEXKIT_REQUIRES": "torch==2.14.1"}
    old = dict(os.environ)
    os.environ.update(env)
    try:
        exec(
            compile(patched, "setup.py", "exec"),
            {"setup": setup, "find_packages": list, "ext_modules": []},
        )
    finally:
        os.environ.clear()
        os.environ.update(old)
    assert ns["version"] == "0.1+cu130.torch2.14.1"
    assert ns["install_requires"][0] == "torch==2.14.1"
    assert ("packaging>20.6" in ns["install_requires"]) == (text is MASTER_SHAPED)
    again = {r.id: r.status for r in patches.apply_all(tmp_path, (), cuda)}
    assert set(again.values()) <= {patches.ALREADY, patches.NOT_APPLICABLE}  # idempotent
    assert (tmp_path / "setup.py").read_text() == patched


# --- the toolkit, without running nvcc -------------------------------------------------------------------------


def test_no_toolkit_anywhere_takes_the_toolchain_of_torchs_cuda_from_the_index(
    tmp_path, monkeypatch
):
    monkeypatch.setattr(cudatool, "candidates", lambda env: [tmp_path / "none" / "bin" / "nvcc"])
    kit = cudabuild.toolkit({"PATH": str(tmp_path)}, "13.0", "2.14.1", ())
    assert kit.nvcc is None and kit.home is None
    # every wheel of the toolchain pinned to torch's release: nvcc's own requirements are unpinned
    assert kit.wheels == (
        "nvidia-cuda-nvcc==13.0.*",
        "nvidia-nvvm==13.0.*",
        "nvidia-cuda-crt==13.0.*",
        "nvidia-cuda-cccl==13.0.*",
    )
    assert kit.version == "nvidia-cuda-nvcc==13.0.*"  # the cache key's nvcc until it is installed
    assert "no CUDA 13.0 toolkit on this machine" in kit.chosen
    with pytest.raises(RuntimeError):
        kit.found()


def test_no_toolkit_and_no_known_torch_cuda_or_an_old_cuda_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setattr(cudatool, "candidates", lambda env: [tmp_path / "none" / "bin" / "nvcc"])
    with pytest.raises(ConfigError, match=r"^no CUDA toolkit found \(\$CUDA_HOME") as err:
        cudabuild.toolkit({"PATH": str(tmp_path)}, None, "2.99.0", ())
    assert "[cuda.torch_cuda]" in err.value.hint
    no_nvcc = (
        "for CUDA 13 and later only .CUDA 12.s nvidia-cuda-nvcc-cu12 wheel holds ptxas, not nvcc."
    )
    with pytest.raises(ConfigError, match=no_nvcc) as err:
        cudabuild.toolkit({"PATH": str(tmp_path)}, "12.8", "2.7.1", ())
    assert "install the CUDA 12.8 toolkit" in err.value.hint


def fake_toolkit(root: Path, release: str) -> tuple[Path, cudatool.Nvcc]:
    (root / "bin").mkdir(parents=True)
    (root / "include").mkdir()
    (root / "include" / "cuda_runtime.h").write_text("")
    (root / "bin" / "nvcc").write_text("#!/bin/sh\n")
    (root / "bin" / "nvcc").chmod(0o755)
    nvcc = cudatool.Nvcc(root / "bin" / "nvcc", release, f"{release}.1", frozenset({80, 90}))
    return root / "bin" / "nvcc", nvcc


def test_a_toolkit_of_another_cuda_is_passed_over_for_one_that_matches_or_the_index(
    tmp_path, monkeypatch
):
    old, old_nvcc = fake_toolkit(tmp_path / "cuda-12.8", "12.8")
    new, new_nvcc = fake_toolkit(tmp_path / "cuda-13.0", "13.0")
    monkeypatch.setattr(cudatool, "ask", lambda path: {old: old_nvcc, new: new_nvcc}[path])
    monkeypatch.setattr(cudatool, "candidates", lambda env: [old, new])
    kit = cudabuild.toolkit({}, "13.0", "2.14.1", ())
    assert kit.found() == (new_nvcc, tmp_path / "cuda-13.0")
    monkeypatch.setattr(cudatool, "candidates", lambda env: [old])
    kit = cudabuild.toolkit({}, "13.0", "2.14.1", ())
    assert kit.nvcc is None and f"(here: {tmp_path / 'cuda-12.8'})" in kit.chosen
    # CUDA_HOME is the user's choice: a mismatch there is refused, never replaced by the index
    with pytest.raises(ConfigError, match="is CUDA 12.8; torch 2.14.1 was built with CUDA 13.0"):
        cudabuild.toolkit({"CUDA_HOME": str(tmp_path / "cuda-12.8")}, "13.0", "2.14.1", ())


def venv_toolchain(site: Path) -> Path:
    """A build venv's site-packages holding CUDA 13's wheels: nvidia/cu13/{bin,include,lib,nvvm}."""
    tree = site / "nvidia" / "cu13"
    for sub in ("bin", "include", "lib/cmake", "nvvm/bin"):
        (tree / sub).mkdir(parents=True)
    (tree / "bin" / "nvcc").write_text("#!/bin/sh\n")
    (tree / "include" / "cuda_runtime.h").write_text("")
    for lib in ("libcudart.so.13", "libcublas.so.13", "libcudart_static.a"):
        (tree / "lib" / lib).write_text("")
    return tree


def test_the_index_toolchain_becomes_a_toolkit_layout_with_the_runtime_to_link(
    tmp_path, monkeypatch
):
    tree = venv_toolchain(tmp_path / "site")
    home = tmp_path / "work" / "cuda-home"
    asked = []

    def ask(path):
        asked.append(path)
        return cudatool.Nvcc(tree / "bin" / "nvcc", "13.0", "13.0.88", frozenset({80, 90}))

    monkeypatch.setattr(cudatool, "ask", ask)
    index = cudabuild.Toolkit(None, None, "from the index", ("nvidia-cuda-nvcc==13.0.*",))
    arches = cudabin_arches("9.0")
    kit = cudabuild.from_venv(index, tmp_path / "site", home, "13.0", "2.14.1", arches)
    assert asked == [home / "bin" / "nvcc"] and kit.found()[1] == home
    assert cudatool.is_toolkit(home)  # what torch's cpp_extension reads CUDA_HOME as
    assert os.readlink(home / "lib64" / "libcudart.so") == "libcudart.so.13"  # -lcudart finds it
    assert (home / "lib64" / "libcublas.so.13").resolve() == tree / "lib" / "libcublas.so.13"
    assert not os.path.lexists(home / "lib64" / "cmake")  # folders are not libraries
    assert (home / "nvvm").resolve() == tree / "nvvm"
    (home / "stale").write_text("")  # made again each time
    cudabuild.from_venv(index, tmp_path / "site", home, "13.0", "2.14.1", arches)
    assert not (home / "stale").exists()
    env = cudabuild.compile_env(kit, "9.0", 2, 1, {}, tmp_path / "site")
    assert env["CUDA_HOME"] == str(home)
    with pytest.raises(ConfigError, match="cannot compile for 10.0"):
        cudabuild.from_venv(
            index, tmp_path / "site", home, "13.0", "2.14.1", cudabin_arches("10.0")
        )
    with pytest.raises(ConfigError, match="is CUDA 13.0; torch 2.14.1 was built with CUDA 13.1"):
        cudabuild.from_venv(index, tmp_path / "site", home, "13.1", "2.14.1", arches)


def test_an_index_toolchain_missing_from_the_venv_is_one_line(tmp_path):
    index = cudabuild.Toolkit(None, None, "from the index", ("nvidia-cuda-nvcc==13.0.*",))
    with pytest.raises(
        ConfigError, match=r"^the build venv has no CUDA toolchain in .*nvidia/cu13 after"
    ):
        cudabuild.from_venv(index, tmp_path, tmp_path / "home", "13.0", "2.14.1", ())
    # the CPU wheel installed
    with pytest.raises(ConfigError, match="torch 2.13.0 is a build without CUDA"):
        cudabuild.from_venv(index, tmp_path, tmp_path / "home", None, "2.13.0", ())
    tree = venv_toolchain(tmp_path / "site")
    (tree / "lib" / "libcudart.so.13").unlink()  # no runtime to link against
    with pytest.raises(ConfigError, match="has no CUDA toolchain"):
        cudabuild.from_venv(index, tmp_path / "site", tmp_path / "home", "13.0", "2.14.1", ())


def cudabin_arches(text: str):
    from apexkit.wheel import cudabin

    return cudabin.parse_arch_list(text)


def test_a_cuda_home_that_is_not_a_toolkit_is_refused_before_asking_it(tmp_path):
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "nvcc").write_text("#!/bin/sh\necho hostile\n")
    with pytest.raises(ConfigError, match="is not a CUDA toolkit"):
        cudabuild.toolkit({"CUDA_HOME": str(tmp_path)}, "13.0", "2.14.1", ())


def test_a_cuda_home_whose_nvcc_cannot_run_is_refused_not_replaced_by_another(tmp_path):
    (tmp_path / "bin").mkdir()
    (tmp_path / "include").mkdir()
    (tmp_path / "include" / "cuda_runtime.h").write_text("")
    (tmp_path / "bin" / "nvcc").write_text("")  # not executable
    with pytest.raises(ConfigError, match="bin/nvcc is not executable"):
        cudabuild.toolkit({"CUDA_HOME": str(tmp_path)}, "13.0", "2.14.1", ())


def test_pytorch_nvcc_set_by_the_user_is_refused():
    with pytest.raises(ConfigError, match="PYTORCH_NVCC is set"):
        cudabuild.toolkit({"PYTORCH_NVCC": "/opt/cuda-12.8/bin/nvcc"}, "13.0", "2.14.1", ())


def test_offline_the_index_toolchain_must_lie_in_the_wheelhouse_before_anything_runs(tmp_path):
    kit = cudabuild.Toolkit(
        None, None, "from the index", tuple(f"{n}==13.0.*" for n in cudabuild.INDEX_WHEELS)
    )
    house = tmp_path / "wheelhouse"
    house.mkdir()
    (house / "nvidia_cuda_nvcc-13.0.88-py3-none-manylinux_2_17_x86_64.whl").write_bytes(b"")
    (house / "nvidia_nvvm-13.1.80-py3-none-manylinux_2_17_x86_64.whl").write_bytes(
        b""
    )  # another release
    with pytest.raises(
        ConfigError, match="--offline: the wheelhouse holds no nvidia-nvvm==13.0.*"
    ) as err:
        cudabuild.check_offline(kit, (house, tmp_path / "nowhere"))
    assert "nvidia-cuda-nvcc" not in err.value.cause and "pip download --no-deps" in err.value.hint
    for name in ("nvidia_nvvm-13.0.88", "nvidia_cuda_crt-13.0.88", "nvidia_cuda_cccl-13.0.85"):
        (house / f"{name}-py3-none-manylinux_2_17_x86_64.whl").write_bytes(b"")
    cudabuild.check_offline(kit, (house,))
