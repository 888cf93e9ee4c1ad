"""End to end (issue 29): NVIDIA apex on CUDA from a fixture repository shaped like upstream master (one small .cu
kernel per extension), compiled for real by this machine's nvcc 13.0 against torch 2.14.1 (the CUDA 13.0 build on
its disk): the wheel's name and pins, the GPU code embedded, the binary checks and smoke test, the cache hit, a
changed .cu recompiled alone, a killed build resumed; and the bad inputs, each one line with nothing written."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import fixture_repos
import pytest
from conftest import ROOT, output

from apexkit.wheel import ccachestats

from .test_apexkit_install import dists

TARGET = "py3.11-torch2.14.1-x86_64-master+cuda.sm80.sm90_PTX"
ARCH = ["--cuda-arch", "8.0;9.0+PTX"]

pytestmark = pytest.mark.skipif(
    not Path("/usr/local/cuda/bin/nvcc").is_file(), reason="needs the CUDA toolkit (nvcc)"
)


@pytest.fixture(scope="module")
def cuda_repo(tmp_path_factory) -> Path:
    return fixture_repos.make_cuda(tmp_path_factory.mktemp("cuda-repo"))


def build(runner, repo: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    return runner.nox("cuda-3.11", "--nvidia-apex-url", f"file://{repo}", *args, **env)


def ninja_lines(log: str) -> list[str]:
    return [line for line in log.splitlines() if re.match(r"^\[\d+/\d+\] ", line)]


def one_error_line(proc: subprocess.CompletedProcess) -> str:
    text = output(proc)
    assert proc.returncode != 0, text[-2000:]
    assert "Traceback" not in text, text[-3000:]
    errors = [line for line in text.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, text[-3000:]
    return errors[0]


def test_a_cuda_wheel_is_built_checked_cached_and_rebuilt_incrementally(runner, cuda_repo):
    plan = build(runner, cuda_repo, *ARCH, "--dry-run")
    text = output(plan)
    assert plan.returncode == 0, text[-3000:]
    for row in (
        f"target          {TARGET}",
        "backend         cuda: upstream NVIDIA apex for CUDA GPUs",
        "CUDA toolkit    nvcc 13.0.",
        "matches torch 2.14.1's CUDA 13.0",
        "arch list       TORCH_CUDA_ARCH_LIST=8.0;9.0+PTX -> sm_80, sm_90, compute_90 (PTX)",
        "extensions      core (setup.py --cpp_ext --cuda_ext",
        "checked against the ref's setup.py once fetched: a dry run fetches nothing)",
        "jobs            MAX_JOBS=",
    ):
        assert row in text, text
    assert not runner.build.exists() and not runner.dist.exists()

    proc = build(runner, cuda_repo, *ARCH)
    text = output(proc)
    assert proc.returncode == 0, text[-4000:]
    dist = runner.dist / TARGET
    manifest = json.loads((dist / "manifest.json").read_text())
    wheel = manifest["wheel"]["file"]
    assert (
        wheel.startswith("apex-0.1+cu130.torch2.14.1-cp311-cp311-manylinux_")
        and (dist / wheel).is_file()
    )
    assert manifest["identity"]["version"] == "0.1+cu130.torch2.14.1"
    assert manifest["identity"]["requires_dist"][0] == "torch==2.14.1"
    modules = {Path(m["file"]).name.split(".")[0]: m for m in manifest["binary_checks"]["modules"]}
    assert modules["amp_C"]["cuda"] == "sm_80, sm_90, compute_90 (PTX)"
    assert "libcudart.so.13" in modules["amp_C"]["needed"]
    assert modules["apex_C"]["cuda"] is None  # C++ only: no GPU code, none asked of it
    assert manifest["binary_checks"]["failures"] == []
    smoke = manifest["smoke_test"]
    assert set(smoke["modules"]) == {"amp_C", "apex_C"} and all(
        m["ok"] for m in smoke["modules"].values()
    )
    assert smoke["apex"] == "imported"
    assert manifest["tools"]["nvcc"]["version"].startswith("13.0.")
    assert manifest["tools"]["nvcc"]["arch_list"] == "8.0;9.0+PTX"
    assert list(manifest["sources"]) == ["nvidia_apex"]
    provenance = json.loads((dist / "provenance.json").read_text())
    deps = provenance["predicate"]["buildDefinition"]["resolvedDependencies"]
    assert any(d["name"] == "nvcc" and d["digest"].get("sha256") for d in deps)
    assert not any(d["name"] == "ascend-apex" for d in deps)
    if ccachestats.find(
        os.environ
    ):  # the lock's ccache wraps nvcc and (masquerading) g++: torch's check passes
        stats = manifest["ccache"]
        assert stats["hits"] + stats["misses"] >= 2, stats  # amp_C's .cu and apex_C's .cpp at least

    again = build(runner, cuda_repo, *ARCH)
    assert again.returncode == 0 and "wheel cache hit" in output(again), output(again)[-2000:]

    # one .cu changed upstream: only that object is compiled again (the tree keeps the others' objects)
    kernel = cuda_repo / "csrc" / "multi_tensor_scale_kernel.cu"
    kernel.write_text(kernel.read_text().replace("x[i] * s;", "x[i] * s + 0.0f;"))
    fixture_repos.git(cuda_repo, "commit", "-qam", "change one kernel")
    changed = build(runner, cuda_repo, *ARCH, "--no-smoke-test")
    text = output(changed)
    assert changed.returncode == 0, text[-3000:]
    assert "1 written, " in text  # the tree sync rewrote one file
    log = (runner.build / TARGET / "build.log").read_text()
    compiled = ninja_lines(log)
    assert len(compiled) == 1 and "multi_tensor_scale_kernel.cu" in compiled[0], compiled
    assert log.count("ninja: no work to do.") == 1  # apex_C


def test_a_killed_cuda_build_resumes_from_its_objects(runner, cuda_repo):
    argv = runner.nox_argv(
        "cuda-3.11", "--nvidia-apex-url", f"file://{cuda_repo}", "--cuda-arch", "9.0", "--jobs", "1"
    )
    log = runner.build / "py3.11-torch2.14.1-x86_64-master+cuda.sm90" / "build.log"
    first = subprocess.Popen(
        argv,
        cwd=ROOT,
        env=runner.env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline and first.poll() is None:  # apex_C done, amp_C under way
            if log.is_file() and "amp_C_frontend" in "".join(ninja_lines(log.read_text())):
                break
            time.sleep(0.2)
        assert first.poll() is None, "the build ended before it could be interrupted"
        os.killpg(first.pid, signal.SIGKILL)
    finally:
        first.wait(timeout=60)
    assert not (
        runner.dist / "py3.11-torch2.14.1-x86_64-master+cuda.sm90"
    ).exists()  # nothing half-written

    resumed = subprocess.run(
        argv, cwd=ROOT, env=runner.env(), capture_output=True, text=True, timeout=900
    )
    assert resumed.returncode == 0, output(resumed)[-3000:]
    text = log.read_text()
    assert "ninja: no work to do." in text  # apex_C's object and module were kept
    # apex_C is not compiled again; of amp_C at most what the kill cut short (its log lines come when a step ends)
    assert not any("flatten_unflatten.cpp" in line for line in ninja_lines(text))
    assert len(ninja_lines(text)) <= 2
    assert (runner.dist / "py3.11-torch2.14.1-x86_64-master+cuda.sm90" / "manifest.json").is_file()


def test_bad_cuda_inputs_are_one_line_and_write_nothing(runner, cuda_repo, tmp_path):
    def refused(*args: str, **env: str) -> str:
        proc = runner.cli(
            "3.11", "--backend", "cuda", "--nvidia-apex-url", f"file://{cuda_repo}", *args, **env
        )
        line = one_error_line(proc)
        assert not runner.dist.exists() or not any(runner.dist.iterdir()), list(
            runner.dist.iterdir()
        )
        return line

    line = refused("--cuda-arch", "3.5")
    assert "cannot compile for 3.5 (it knows 7.5, 8.0" in line and "next:" in line
    line = refused("--npu")
    assert "--npu is for the Ascend build only" in line
    line = refused("--cuda-ext", "core,transducer")
    assert "NVIDIA apex master has no extension 'transducer'" in line and "xentropy" in line

    # a toolkit of another CUDA release, chosen with CUDA_HOME: refused before torch is installed (the nvcc is a
    # script answering like nvcc 12.8 does: this machine has one toolkit)
    other = tmp_path / "cuda-12.8"
    (other / "bin").mkdir(parents=True)
    (other / "include").mkdir()
    (other / "include" / "cuda_runtime.h").write_text("")
    nvcc = other / "bin" / "nvcc"
    nvcc.write_text(
        "#!/bin/sh\n"
        'if [ "$1" = -V ]; then echo "Cuda compilation tools, release 12.8, V12.8.93"; '
        "else echo compute_80; echo compute_90; fi\n"
    )
    nvcc.chmod(0o755)
    line = refused(CUDA_HOME=str(other))
    assert "nvcc 12.8.93" in line and "is CUDA 12.8; torch 2.14.1 was built with CUDA 13.0" in line
    line = refused(CUDA_HOME=str(tmp_path / "nowhere"))
    assert "is not a CUDA toolkit" in line

    # a torch without CUDA (the CPU wheel this index serves for 2.13.0): refused once it is installed, before compiling
    line = refused("--torch", "2.13.0")
    assert "torch 2.13.0 is a build without CUDA" in line
    assert not list(runner.build.glob("*/tree/build"))  # nothing compiled


CUDA_ROOT = Path("/usr/local/cuda").resolve()


@pytest.mark.skipif(
    os.geteuid() != 0 or not Path("/usr/bin/unshare").is_file(),
    reason="hides the toolkit in a mount namespace: needs root and unshare",
)
def test_without_a_toolkit_nvcc_comes_from_the_index_and_builds_the_same_wheel(
    runner, cuda_repo, tmp_path
):
    # a machine without the CUDA toolkit: an empty folder mounted over it, in a mount namespace of this build only
    empty = tmp_path / "no-cuda"
    empty.mkdir()
    hide = [
        "/usr/bin/unshare", "--mount", "--propagation", "private", "sh", "-c",
        'mount --bind "$0" "$1" && shift && exec "$@"', str(empty), str(CUDA_ROOT),
    ]  # fmt: skip
    argv = [*hide, *runner.nox_argv("cuda-3.11", "--nvidia-apex-url", f"file://{cuda_repo}")]

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [*argv, "--cuda-arch", "9.0", *args],
            cwd=ROOT,
            env=runner.env(),
            capture_output=True,
            text=True,
            timeout=900,
        )

    plan = run("--dry-run")
    text = output(plan)
    assert plan.returncode == 0, text[-3000:]
    assert "no CUDA 13.0 toolkit on this machine" in text and "nvidia-cuda-nvcc==13.0.*" in text, (
        text
    )
    proc = run()
    text = output(proc)
    assert proc.returncode == 0, text[-4000:]
    assert "CUDA toolchain from the index" in text
    target = "py3.11-torch2.14.1-x86_64-master+cuda.sm90"
    manifest = json.loads((runner.dist / target / "manifest.json").read_text())
    nvcc = manifest["tools"]["nvcc"]
    assert nvcc["version"].startswith("13.0.") and nvcc["wheels"][0] == "nvidia-cuda-nvcc==13.0.*"
    assert nvcc["path"].endswith("site-packages/nvidia/cu13/bin/nvcc"), nvcc
    assert not nvcc["path"].startswith(str(CUDA_ROOT))
    modules = {Path(m["file"]).name.split(".")[0]: m for m in manifest["binary_checks"]["modules"]}
    assert modules["amp_C"]["cuda"] == "sm_90"
    assert "libcudart.so.13" in modules["amp_C"]["needed"]  # linked to the runtime torch loads
    assert manifest["binary_checks"]["failures"] == []
    assert all(m["ok"] for m in manifest["smoke_test"]["modules"].values())


def test_apexkit_install_builds_nvidia_apex_for_a_cuda_venv_and_serves_it_from_the_index(
    runner, cuda_repo, tmp_path
):
    venv = (
        tmp_path / "gpu-venv"
    )  # a user's GPU venv: pip takes torch 2.14.1 (CUDA 13.0) off this disk
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    made = subprocess.run(
        [str(venv / "bin" / "pip"), "install", "-q", "torch==2.14.1"],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert made.returncode == 0, made.stderr[-2000:]
    before, index = dists(venv), tmp_path / "team-index"
    assert "packaging" not in before  # torch does not need it; NVIDIA apex does (packaging>20.6)

    def install(*args: str, **env: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "apexkit", "install", "--venv", str(venv), "--json", *args],
            cwd=ROOT,
            env={**runner.env(), **env},
            capture_output=True,
            text=True,
            timeout=900,
        )

    options = f"--backend cuda --cuda-arch 9.0 --nvidia-apex-url file://{cuda_repo} --no-smoke-test"
    first = install("--publish-to", str(index), "--build-options", options)
    assert first.returncode == 0, output(first)[-3000:]
    result = json.loads(first.stdout)
    assert result["status"] == "built-and-installed", result
    assert result["wheel"].startswith("apex-0.1+cu130.torch2.14.1-cp311-cp311-manylinux_")
    after = dists(venv)
    # from the venv pip's own index, torch held: what pip chose, with its own dependencies (none)
    assert result["added"] == [f"packaging=={after['packaging']}"]
    assert after.pop("apex") == "0.1+cu130.torch2.14.1" and after.pop("packaging")
    assert after == before  # torch and everything else untouched
    facts = json.loads((index / "index.json").read_text())["files"][0]["facts"]
    assert facts["backend"] == "cuda" and facts["cuda"] == "13.0"

    # the next venv of that cell takes it from the index: here, this venv emptied of apex and packaging again
    pip = [str(venv / "bin" / "pip"), "uninstall", "-q", "-y", "apex", "packaging"]
    subprocess.run(pip, check=True, capture_output=True, timeout=300)
    assert dists(venv) == before
    # its pip reaches no index that holds packaging: one line saying what to install, nothing installed
    nowhere = tmp_path / "no-wheels"
    nowhere.mkdir()
    offline = {"PIP_CONFIG_FILE": os.devnull, "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(nowhere)}
    refused = install("--index", str(index), "--no-build", **offline)
    assert refused.returncode != 0, output(refused)
    errors = [x for x in refused.stderr.splitlines() if x.startswith("error:")]
    assert len(errors) == 1 and "packaging>20.6" in errors[0], output(refused)
    assert (
        "nothing installed" in errors[0] and "install 'packaging>20.6' torch==2.14.1" in errors[0]
    )
    assert "Traceback" not in output(refused) and dists(venv) == before
    again = install("--index", str(index), "--no-build")
    assert again.returncode == 0, output(again)[-3000:]
    result = json.loads(again.stdout)
    assert result["status"] == "installed", result
    assert result["added"] == [f"packaging=={dists(venv)['packaging']}"], result
    assert dists(venv).get("apex") == "0.1+cu130.torch2.14.1"


@pytest.mark.skipif(
    ccachestats.find(os.environ) is None, reason="needs ccache (requirements/dev.txt)"
)
def test_cuda_objects_are_shared_across_build_directories_and_the_wheel_is_reproducible(
    runner, cuda_repo, tmp_path
):
    """Paths that differ between build directories neither split ccache (CCACHE_BASEDIR on the tree: ninja's
    absolute source paths hash relative; CCACHE_NOHASHDIR) nor reach the objects (prefix maps, nvcc's host side
    too): --verify-reproducible's second build hits the first's objects, so its wheel has the same bytes, and a
    deeper build directory compiles nothing either."""
    shared = {"CCACHE_DIR": str(tmp_path / "ccache")}
    verified = build(runner, cuda_repo, *ARCH, "--no-cache", "--verify-reproducible", **shared)
    assert verified.returncode == 0, output(verified)[-3000:]
    manifest = json.loads((runner.dist / TARGET / "manifest.json").read_text())
    assert manifest["reproducible"]["verified"] is True
    wheel = runner.dist / TARGET / manifest["wheel"]["file"]
    first = wheel.read_bytes()
    deeper = tmp_path / "a/deeper/build/dir"
    again = build(runner, cuda_repo, *ARCH, "--no-cache", "--build-dir", str(deeper), **shared)
    assert again.returncode == 0, output(again)[-3000:]
    stats = json.loads((runner.dist / TARGET / "manifest.json").read_text())["ccache"]
    assert stats["misses"] == 0 and stats["hits"] >= 2, stats
    assert wheel.read_bytes() == first
