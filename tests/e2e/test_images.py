"""Builder images and container builds against a real Docker engine (a private dockerd whose data root is kept
between runs on this machine), with base images made by debootstrap + docker import (no registry here).

Traffic: image builds and build containers use --network host; apt reaches deb.debian.org and pip the package index
with the host's CA bundle (as behind a TLS-intercepting proxy). torch comes from the mounted wheelhouse.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest
import services
from conftest import ROOT

from apexkit.images import builder

HOST_CA = "/etc/ssl/certs/ca-certificates.crt"
# where this machine keeps the torch 2.13.0 CPU wheel (pip finds it through PIP_FIND_LINKS / pip.conf find-links)
WHEELHOUSE = Path((os.environ.get("PIP_FIND_LINKS") or "/opt/wheels").split()[0])
X86_TAG = "apexkit/builder:debian-bookworm-x86_64"


def evidence(pytestconfig, line: str) -> None:
    """A line for the CI log even when pytest captures output (what was built, where, how long)."""
    reporter = pytestconfig.pluginmanager.get_plugin("terminalreporter")
    capture = pytestconfig.pluginmanager.get_plugin("capturemanager")
    if reporter is None or capture is None:
        return
    with (
        capture.global_and_fixture_disabled()
    ):  # the reporter's stream is the captured fd 1 otherwise
        reporter.write_line(f"[apexkit] {line}")


def invoke(
    *args: str, env: dict[str, str] | None = None, timeout: int = 1500
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "invoke", "-r", str(ROOT), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
    )


def out(proc: subprocess.CompletedProcess) -> str:
    return proc.stdout + proc.stderr


def test_entrypoint_turns_torch_npu_autoload_off(tmp_path):
    """torch >= 2.5 imports torch_npu at `import torch`, which fails without CANN: off unless the caller says."""
    script = str(ROOT / "docker" / "entrypoint.sh")
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path)}
    seen = subprocess.run(
        ["sh", script, "sh", "-c", "echo $TORCH_DEVICE_BACKEND_AUTOLOAD"],
        env=env,
        capture_output=True,
        text=True,
    )
    assert seen.stdout.strip() == "0", seen.stderr
    kept = subprocess.run(
        ["sh", script, "sh", "-c", "echo $TORCH_DEVICE_BACKEND_AUTOLOAD"],
        env=dict(env, TORCH_DEVICE_BACKEND_AUTOLOAD="1"),
        capture_output=True,
        text=True,
    )
    assert kept.stdout.strip() == "1"
    assert (
        "TORCH_DEVICE_BACKEND_AUTOLOAD=0" in (ROOT / "docker" / "Dockerfile").read_text()
    )  # the image's own steps
    assert (
        "export TORCH_DEVICE_BACKEND_AUTOLOAD"
        in (ROOT / "docker" / "install-toolchain.sh").read_text()
    )


# --- against a real Docker engine ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def daemon():
    ok, why = services.services_available()
    services.require(ok, why)
    data = Path(
        os.environ.get("APEXKIT_TEST_DOCKER_ROOT")
        or Path.home() / ".cache" / "apexkit" / "test-dockerd"
    )
    data.mkdir(parents=True, exist_ok=True)
    with open(data.parent / "test-dockerd.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one daemon per data root: a second test run waits here
        d = services.Dockerd({}, data_root=data)
        yield d
        d.stop()


def docker_env(daemon, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
    env.update(DOCKER_HOST=daemon.host, XDG_CONFIG_HOME="/nonexistent-apexkit-test", **extra)
    return env


@pytest.fixture(scope="module")
def x86_builder(daemon, pytestconfig):
    """`invoke image.build` from a debootstrapped Debian base: toolchain via apt, tool venv, build user."""
    started = time.monotonic()
    proc = invoke(
        "image.build",
        "--arch",
        "x86_64",
        "--base",
        "debootstrap:bookworm",
        "--network",
        "host",
        "--ca-cert",
        HOST_CA,
        env=docker_env(daemon),
    )
    assert proc.returncode == 0, out(proc)[-4000:]
    info = [
        x.strip() for x in out(proc).splitlines() if x.strip().startswith(("installed", "python "))
    ]
    evidence(
        pytestconfig,
        f"image.build --arch x86_64 --base debootstrap:bookworm -> {X86_TAG} in "
        f"{time.monotonic() - started:.0f} s ({'; '.join(info)})",
    )
    return proc


def test_image_build_from_debootstrap_base(x86_builder, daemon):
    text = out(x86_builder)
    assert "[1/" in text and "✓ apexkit/builder:debian-bookworm-x86_64" in text
    assert "package manager apt-get" in text
    assert (
        "installed       gcc g++ make git patch binutils python3 python3-dev python3-venv" in text
    )
    assert (
        "/usr/bin/python3.11 3.11" in text and "dist-packages" in text
    )  # Debian's system Python layout
    inspect = json.loads(daemon.docker("image", "inspect", X86_TAG).stdout)[0]
    assert inspect["Config"]["User"] == "1000:1000"
    assert inspect["Config"]["Labels"]["org.apexkit.arch"] == "x86_64"
    assert inspect["Config"]["Labels"]["org.apexkit.recipe"] == builder.recipe_digest()
    assert (
        daemon.docker("run", "--rm", "--network", "none", X86_TAG, "id", "-u").stdout.strip()
        == "1000"
    )
    listed = invoke("image.list", "--json", env=docker_env(daemon))
    rows = {tag: row for row in json.loads(listed.stdout) for tag in row["tags"]}
    assert rows[X86_TAG]["kind"] == "builder" and not rows[X86_TAG]["stale"]
    assert rows["apexkit/base:debian-bookworm-x86_64"]["kind"] == "base"


@pytest.fixture
def fixture_sources(repos, tmp_path):
    """The fixture repos, readable by the container's build user (pytest makes its directories 0700)."""
    for path in (repos.ascend_path, repos.nvidia_path):
        subprocess.run(["chmod", "-R", "a+rX", str(path)], check=True)
    return {
        "APEXKIT_ASCEND_APEX_URL": repos.ascend_url,
        "APEXKIT_NVIDIA_APEX_URL": repos.nvidia_url,
    }


def container_build(daemon, image: str, tmp_path: Path, sources: dict, *args: str, **env: str):
    cache = tmp_path / "cache"
    return invoke(
        "build",
        "--image",
        image,
        "--",
        "--wheelhouse",
        str(WHEELHOUSE),
        "--dist",
        str(tmp_path / "dist"),
        "--build-dir",
        str(tmp_path / "build"),
        "--network",
        "host",
        "--ca-cert",
        HOST_CA,
        *args,
        env=docker_env(daemon, APEXKIT_CACHE_DIR=str(cache), **sources, **env),
    )


def test_fixture_build_inside_the_builder_lands_in_host_dist(
    x86_builder, daemon, fixture_sources, tmp_path, pytestconfig
):
    started = time.monotonic()
    proc = container_build(
        daemon, X86_TAG, tmp_path, fixture_sources, SUDO_UID="4242", SUDO_GID="4343"
    )
    assert proc.returncode == 0, out(proc)[-4000:]
    seconds = time.monotonic() - started
    text = out(proc)
    assert (
        "target          py3.11-torch2.13.0-x86_64-master" in text
    )  # the same build, from the parsed options
    workspace = tmp_path / "build" / "containers" / "builder-debian-bookworm-x86_64-py3.11"
    assert (
        workspace.is_dir() and not (workspace / "options.json").exists()
    )  # handed over, then removed
    assert "interpreter     /usr/bin/python3.11" in text  # the base's Python, not the tool venv's
    dist = tmp_path / "dist" / "py3.11-torch2.13.0-x86_64-master"
    # the image's tool venv (Python 3.11, auditwheel) computes the manylinux tag and the build retags the wheel
    wheel = dist / "apex-0.1+ascend.torch2.13.0-cp311-cp311-manylinux_2_24_x86_64.whl"
    assert sorted(p.name for p in dist.iterdir()) == [
        wheel.name,
        "manifest.json",
        "provenance.json",
        "sbom.cdx.json",
    ]
    for path in (dist, wheel, dist / "manifest.json"):
        assert (path.stat().st_uid, path.stat().st_gid) == (
            4242,
            4343,
        )  # the invoking (sudo) user's
    manifest = json.loads((dist / "manifest.json").read_text())
    assert (
        manifest["builder_image"]["image"] == X86_TAG
        and manifest["builder_image"]["user"] == "1000:1000"
    )
    assert manifest["target"]["interpreter"] == "/usr/bin/python3.11"
    assert manifest["smoke_test"]["modules"]["apex_C"]["ok"]
    with zipfile.ZipFile(wheel) as zf:
        assert (
            "Tag: cp311-cp311-manylinux_2_24_x86_64"
            in zf.read("apex-0.1+ascend.torch2.13.0.dist-info/WHEEL").decode()
        )
    evidence(
        pytestconfig,
        f"build in {X86_TAG} (user {manifest['builder_image']['user']}) -> host "
        f"{wheel.relative_to(tmp_path)} sha256 {manifest['wheel']['sha256'][:12]}, owner uid "
        f"{wheel.stat().st_uid}, {seconds:.0f} s",
    )
    # only the workspace and the cache were written: the repository is mounted read-only
    assert f"-v={ROOT}:/apexkit:ro" in text
    assert "--privileged" not in text


@pytest.fixture(scope="module")
def lib64_base(x86_builder, daemon):
    """A base whose system Python has torch under /usr/local/lib64/python3.11/site-packages (openEuler-style),
    on sys.path through a .pth file, and the toolchain already installed: as MindIE images ship."""
    tag = "apexkit-test/lib64-base:latest"
    if daemon.docker("image", "inspect", tag).returncode != 0:
        name = f"apexkit-lib64-{os.getpid()}"
        script = (
            "set -e; site=/usr/local/lib64/python3.11/site-packages; "
            "/opt/apexkit/venv/bin/pip install -q --no-compile --find-links /w --target $site "
            "torch==2.13.0 && echo $site > /usr/lib/python3/dist-packages/openeuler-lib64.pth"
        )
        run = daemon.docker(
            "run",
            "--name",
            name,
            "--user",
            "0",
            "--network",
            "host",
            "-v",
            f"{WHEELHOUSE}:/w:ro",
            "-v",
            f"{HOST_CA}:/ca.pem:ro",
            "-e",
            "PIP_CERT=/ca.pem",
            "--entrypoint",
            "sh",
            X86_TAG,
            "-c",
            script,
            timeout=900,
        )
        assert run.returncode == 0, run.stderr
        assert (
            daemon.docker(
                "commit",
                "--change",
                "USER root",
                "--change",
                "ENTRYPOINT []",
                "--change",
                'CMD ["sh"]',
                name,
                tag,
            ).returncode
            == 0
        )
        daemon.docker("rm", name)
    return tag


LIB64_TAG = "apexkit/builder:lib64-test-x86_64"


@pytest.fixture(scope="module")
def lib64_builder(lib64_base, daemon):
    built = invoke(
        "image.build",
        "--arch",
        "x86_64",
        "--base",
        lib64_base,
        "--tag",
        LIB64_TAG,
        "--network",
        "host",
        "--ca-cert",
        HOST_CA,
        "--quiet",
        env=docker_env(daemon),
    )
    assert built.returncode == 0, out(built)[-3000:]
    return built


def test_lib64_base_builds_against_its_system_torch(
    lib64_base, lib64_builder, daemon, fixture_sources, tmp_path
):
    where = daemon.docker(
        "run",
        "--rm",
        "--network",
        "none",
        "--entrypoint",
        "python3.11",
        lib64_base,
        "-c",
        "import torch; print(torch.__file__)",
    )
    assert where.stdout.strip() == "/usr/local/lib64/python3.11/site-packages/torch/__init__.py", (
        where.stderr
    )
    assert "installed       nothing (the base has the toolchain)" in out(
        lib64_builder
    )  # no package manager needed
    proc = container_build(daemon, LIB64_TAG, tmp_path, fixture_sources, "--use-system-torch")
    assert proc.returncode == 0, out(proc)[-4000:]
    dist = (
        tmp_path / "dist" / "py3.11-torch2.13.0-x86_64-master+system-torch"
    )  # its own target (issue 13 item 7)
    manifest = json.loads((dist / "manifest.json").read_text())
    assert (
        manifest["wheel"]["file"]
        == "apex-0.1+ascend.torch2.13.0-cp311-cp311-manylinux_2_24_x86_64.whl"
    )
    assert {p["id"]: p["status"] for p in manifest["patches"]}["torch-location"] == "applied"
    assert manifest["smoke_test"]["modules"]["change_data_ptr"]["ok"]
    assert "torch           2.13.0+cpu (system)" in out(proc)
    build_log = next(
        (tmp_path / "build" / "containers").glob(
            "*/build/py3.11-torch2.13.0-x86_64-master+system-torch/build.log"
        )
    )
    assert (
        "-I/usr/local/lib64/python3.11/site-packages/torch/include" in build_log.read_text()
    )  # where torch is


def doctor_in(daemon, image: str) -> dict[tuple[str, str], dict]:
    """`python -m apexkit doctor --json` inside an image, the repository mounted read-only."""
    proc = daemon.docker(
        "run",
        "--rm",
        "--network",
        "none",
        "-v",
        f"{ROOT}:/apexkit:ro",
        "-e",
        "PYTHONPATH=/apexkit",
        "--entrypoint",
        "/opt/apexkit/venv/bin/python",
        image,
        "-m",
        "apexkit",
        "doctor",
        "--json",
    )
    assert proc.stdout.strip(), proc.stderr[-2000:]
    return {(r["area"], r["name"]): r for r in json.loads(proc.stdout)}


def test_doctor_inside_images_sees_their_layouts(x86_builder, lib64_builder, daemon):
    debian = doctor_in(daemon, X86_TAG)
    assert debian[("python", "python")]["status"] == "warn"  # Debian ships python3 only
    assert debian[("python", "python3.11")]["data"]["layout"] == "dist-packages"
    assert "/usr/bin/python3.11 3.11" in debian[("python", "python3.11")]["found"]
    assert debian[("compiler", "C++17")]["status"] == "ok"
    lib64 = doctor_in(daemon, LIB64_TAG)
    torch = lib64[("torch", "torch (python3.11)")]
    assert (
        torch["status"] == "ok"
        and torch["data"]["torch_dir"] == "/usr/local/lib64/python3.11/site-packages"
    )


def test_builder_json_lists_each_python_and_where_it_came_from(x86_builder, daemon):
    info = builder.builder_json(
        daemon.client(), X86_TAG
    )  # read from the image's files: no container is started
    assert [(p["path"], p["source"]) for p in info["pythons"]] == [
        ("/usr/bin/python3.11", "distro")
    ]
    assert builder.python_versions(info) == ["3.11"] and info["arch"] == "x86_64"
    assert "/usr/bin/python3.11 3.11" in out(x86_builder) and "(distro)" in out(x86_builder)


def test_build_for_a_python_the_image_lacks_is_refused_before_a_container_starts(
    x86_builder, daemon, tmp_path
):
    proc = invoke(
        "build",
        "--python",
        "3.9",
        "--image",
        X86_TAG,
        "--",
        "--dist",
        str(tmp_path / "dist"),
        "--build-dir",
        str(tmp_path / "build"),
        env=docker_env(daemon),
        timeout=300,
    )
    assert proc.returncode == 3, out(proc)[
        -2000:
    ]  # InterpreterNotFoundError, as a build without python3.9 is
    assert one_line_error(proc) == (
        "error: apexkit/builder:debian-bookworm-x86_64 has Python 3.11 only -- next: Python 3.9 needs a base that has "
        "it: invoke image.build --arch x86_64 --base debootstrap:bullseye (then --image "
        "apexkit/builder:debian-bullseye-x86_64), or --pythons 3.9 (uv; downloads from github.com)"
    )
    assert not (
        tmp_path / "build" / "containers"
    ).exists()  # no workspace made, no container started


def test_matrix_checks_each_combination_against_its_image(x86_builder, daemon, tmp_path):
    spec = tmp_path / "matrix.toml"
    spec.write_text(
        '[[include]]\npython = "3.9"\ntorch = "2.1.0"\narch = "x86_64"\n\n'
        '[[include]]\npython = "3.13"\ntorch = "2.13.0"\narch = "aarch64"\n'
    )
    nox = [
        sys.executable,
        "-m",
        "nox",
        "-f",
        str(ROOT / "noxfile.py"),
        "-s",
        "matrix",
        "--",
        "--matrix",
        str(spec),
    ]
    env = docker_env(daemon)
    table = subprocess.run(
        [*nox, "--format", "json"], capture_output=True, text=True, env=env, timeout=300
    )
    rows = {r["id"]: r for r in json.loads(table.stdout)}
    assert (
        rows["py3.9-torch2.1.0-x86_64"]["image"],
        rows["py3.9-torch2.1.0-x86_64"]["image_state"],
    ) == ("", "host")
    assert (
        rows["py3.13-torch2.13.0-aarch64"]["image"],
        rows["py3.13-torch2.13.0-aarch64"]["image_state"],
    ) == ("apexkit/builder:debian-trixie-aarch64", "missing")
    assert rows["py3.13-torch2.13.0-aarch64"]["image_refused"].endswith(
        "next: invoke image.build --arch aarch64 --base debootstrap:trixie"
    )
    forced = subprocess.run(
        [*nox, "--image", X86_TAG], capture_output=True, text=True, env=env, timeout=300
    )
    assert "apexkit/builder:debian-bookworm-x86_64 (lacks Python 3.9)" in out(forced)
    assert "apexkit/builder:debian-bookworm-x86_64 (is x86_64)" in out(forced)
    # --run: every refusal comes before anything runs (no log, no container), one line each in the summary
    build = tmp_path / "build"
    run = subprocess.run(
        [
            *nox,
            "--run",
            "--target",
            "py3.13-torch2.13.0-aarch64",
            "--dist",
            str(tmp_path / "dist"),
            "--build-dir",
            str(build),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert run.returncode == 1
    summary = (build / "matrix" / "summary.md").read_text()
    assert (
        "| py3.13-torch2.13.0-aarch64 | REFUSED: py3.13-torch2.13.0-aarch64: apexkit/builder:debian-trixie-aarch64 "
        "is not in the Docker daemon -- next: invoke image.build --arch aarch64 --base debootstrap:trixie |"
    ) in summary
    assert not (build / "matrix" / "py3.13-torch2.13.0-aarch64.log").exists()
    run = subprocess.run(
        [
            *nox,
            "--run",
            "--image",
            X86_TAG,
            "--dist",
            str(tmp_path / "dist"),
            "--build-dir",
            str(build),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert run.returncode == 1
    summary = (build / "matrix" / "summary.md").read_text()
    assert (
        "| py3.9-torch2.1.0-x86_64 | REFUSED: py3.9-torch2.1.0-x86_64: apexkit/builder:debian-bookworm-x86_64 has "
        "Python 3.11 only -- next: Python 3.9 needs a base that has it: invoke image.build --arch x86_64 --base "
        "debootstrap:bullseye (then --image apexkit/builder:debian-bullseye-x86_64), or --pythons 3.9"
    ) in summary
    assert (
        "py3.13-torch2.13.0-aarch64: apexkit/builder:debian-bookworm-x86_64 is an x86_64 image -- next: invoke "
        "image.build --arch aarch64 --base debootstrap:trixie" in summary
    )
    assert not list((build / "matrix").glob("*.log")) and not (build / "containers").exists()


def test_more_pythons_through_uv(x86_builder, daemon):
    """--pythons: a Python the base has is kept; one it lacks comes from uv, whose downloads (GitHub's
    python-build-standalone) this machine cannot reach: then one line says so and no image is tagged."""
    tag = "apexkit/builder:uv-test-x86_64"
    daemon.docker("rmi", "-f", tag)
    proc = invoke(
        "image.build",
        "--arch",
        "x86_64",
        "--base",
        "debootstrap:bookworm",
        "--pythons",
        "3.11,3.10",
        "--tag",
        tag,
        "--network",
        "host",
        "--ca-cert",
        HOST_CA,
        env=docker_env(daemon),
        timeout=900,
    )
    text = out(proc)
    assert (
        "apexkit: Python 3.11 is in the base already (/usr/bin/python3.11): uv not needed for it"
        in text
    )
    if proc.returncode == 0:  # GitHub reachable (not here): the image has both, 3.10 from uv
        info = builder.builder_json(daemon.client(), tag)
        assert {(p["version"][:4], p["source"]) for p in info["pythons"]} == {
            ("3.10", "uv"),
            ("3.11", "distro"),
        }
        return
    assert proc.returncode == 10, text[-3000:]
    line = one_line_error(proc)
    assert line.startswith(
        "error: uv could not download Python 3.10 from github.com (python-build-standalone): "
    )
    assert (
        "next: let the build reach GitHub's python-build-standalone releases through the proxy, or use a base "
        "that has it (a manylinux image: /opt/python/cp3X-cp3X" in line
    )
    assert (
        daemon.docker("image", "inspect", tag).returncode != 0
    )  # nothing half-made under that name


BULLSEYE_TAG = "apexkit/builder:debian-bullseye-x86_64"


@pytest.fixture(scope="module")
def torch21_cp39() -> Path:
    """torch 2.1.0 for CPython 3.9 x86_64 from the package index: a CUDA build, 2.6 GB with its nvidia-* wheels
    (1 min 40 s to download here), kept in the shared cache so that it is downloaded once per machine."""
    root = Path(
        os.environ.get("APEXKIT_TEST_WHEELS") or Path.home() / ".cache" / "apexkit" / "test-wheels"
    )
    dest = root / "torch-2.1.0-cp39-x86_64"
    if not (dest / ".complete").exists():
        dest.mkdir(parents=True, exist_ok=True)
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "-q",
                "--only-binary",
                ":all:",
                "--python-version",
                "3.9",
                "--platform",
                "manylinux2014_x86_64",
                "-d",
                str(dest),
                "torch==2.1.0",
            ],
            capture_output=True,
            text=True,
            timeout=1800,
        )
        assert proc.returncode == 0, proc.stderr[-2000:]
        (dest / ".complete").touch()
    subprocess.run(["chmod", "-R", "a+rX", str(root)], check=True)
    return dest


@pytest.mark.slow
@pytest.mark.network
@pytest.mark.timeout(2400)
def test_bullseye_image_builds_a_python39_wheel(
    daemon, fixture_sources, torch21_cp39, tmp_path, pytestconfig
):
    """Debian 11's Python 3.9 (as openEuler 22.03's): the tool venv installs with requirements/runtime.in's pins for 3.9 and
    a wheel builds against torch 2.1.0 from the index."""
    started = time.monotonic()
    built = invoke(
        "image.build",
        "--arch",
        "x86_64",
        "--base",
        "debootstrap:bullseye",
        "--network",
        "host",
        "--ca-cert",
        HOST_CA,
        "--quiet",
        env=docker_env(daemon),
    )
    assert built.returncode == 0, out(built)[-4000:]
    image_seconds = time.monotonic() - started
    info = builder.builder_json(daemon.client(), BULLSEYE_TAG)
    assert [(p["path"], p["source"]) for p in info["pythons"]] == [("/usr/bin/python3.9", "distro")]
    assert info["tool_python"].startswith("3.9.")  # nox, virtualenv … run on 3.9 too
    started = time.monotonic()
    proc = invoke(
        "build",
        "--python",
        "3.9",
        "--image",
        BULLSEYE_TAG,
        "--",
        "--torch",
        "2.1.0",
        "--wheelhouse",
        str(torch21_cp39),
        "--dist",
        str(tmp_path / "dist"),
        "--build-dir",
        str(tmp_path / "build"),
        "--network",
        "host",
        "--ca-cert",
        HOST_CA,
        env=docker_env(daemon, APEXKIT_CACHE_DIR=str(tmp_path / "cache"), **fixture_sources),
        timeout=1800,
    )
    assert proc.returncode == 0, out(proc)[-4000:]
    build_seconds = time.monotonic() - started
    dist = tmp_path / "dist" / "py3.9-torch2.1.0-x86_64-master"
    # Python 3.9 runs apexkit in this image: no auditwheel >= 6.5 for it, so the wheel keeps linux_x86_64
    wheel = dist / "apex-0.1+ascend.torch2.1.0-cp39-cp39-linux_x86_64.whl"
    manifest = json.loads((dist / "manifest.json").read_text())
    assert manifest["target"]["interpreter"] == "/usr/bin/python3.9"
    assert manifest["smoke_test"]["modules"]["apex_C"]["ok"]
    with zipfile.ZipFile(wheel) as zf:
        assert (
            "Tag: cp39-cp39-linux_x86_64"
            in zf.read("apex-0.1+ascend.torch2.1.0.dist-info/WHEEL").decode()
        )
    evidence(
        pytestconfig,
        f"bullseye: image.build {image_seconds:.0f} s, container build with torch 2.1.0 cp39 "
        f"{build_seconds:.0f} s -> {wheel.name} sha256 {manifest['wheel']['sha256'][:12]}",
    )


# --- bad inputs --------------------------------------------------------------------------------------------------------


def one_line_error(proc: subprocess.CompletedProcess) -> str:
    lines = [x for x in proc.stderr.splitlines() if x.startswith("error: ")]
    assert len(lines) == 1, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    return lines[0]


def test_daemon_down_is_one_line(tmp_path):
    env = dict(os.environ, DOCKER_HOST=f"unix://{tmp_path}/no-daemon.sock")
    for args in (("image.list",), ("build", "--image", X86_TAG)):
        proc = invoke(*args, env=env, timeout=120)
        assert proc.returncode == 10
        line = one_line_error(proc)
        assert "Docker daemon is not reachable" in line and "next: start it" in line


def test_missing_image_and_unknown_arch(daemon, tmp_path):
    proc = invoke(
        "build", "--image", "apexkit/builder:does-not-exist", env=docker_env(daemon), timeout=120
    )
    assert proc.returncode == 10
    assert "is not in the Docker daemon -- next: invoke image.build" in one_line_error(proc)
    proc = invoke(
        "image.build", "--arch", "s390x", "--base", "debian", env=docker_env(daemon), timeout=120
    )
    assert proc.returncode == 2
    assert "unknown architecture 's390x'" in one_line_error(proc)


def test_emulation_missing_is_explained(daemon, tmp_path):
    env = docker_env(daemon, APEXKIT_BINFMT_DIR=str(tmp_path / "no-binfmt"))
    proc = invoke("image.build", "--arch", "aarch64", "--base", "debootstrap", env=env, timeout=120)
    assert proc.returncode == 10
    line = one_line_error(proc)
    assert "cannot build an aarch64 image on this x86_64 host: binfmt_misc is not mounted" in line
    assert "update-binfmts --enable qemu-aarch64" in line
    check = invoke("image.emulation", "--arch", "aarch64", env=env, timeout=120)
    assert check.returncode == 1 and "FAIL aarch64" in out(check)


def test_base_without_package_manager(x86_builder, daemon):
    tag = "apexkit-test/no-package-manager:latest"
    if daemon.docker("image", "inspect", tag).returncode != 0:
        name = f"apexkit-nopm-{os.getpid()}"
        run = daemon.docker(
            "run",
            "--name",
            name,
            "--network",
            "none",
            "apexkit/base:debian-bookworm-x86_64",
            "rm",
            "-f",
            "/usr/bin/apt-get",
            "/usr/bin/apt",
        )
        assert run.returncode == 0, run.stderr
        assert daemon.docker("commit", name, tag).returncode == 0
        daemon.docker("rm", name)
    proc = invoke(
        "image.build",
        "--arch",
        "x86_64",
        "--base",
        tag,
        "--network",
        "host",
        "--ca-cert",
        "none",
        env=docker_env(daemon),
        timeout=600,
    )
    assert proc.returncode == 10
    line = one_line_error(proc)
    assert "no known package manager (apt-get, dnf, yum) and lacks: gcc g++ make git patch" in line
    assert "next: use a Debian/Ubuntu/openEuler/CentOS base" in line


def test_base_of_another_arch_is_refused_by_the_first_step(x86_builder, daemon):
    state = builder.emulation("aarch64")
    services.require(state.usable, f"QEMU aarch64: {state.detail}")
    proc = invoke(
        "image.build",
        "--arch",
        "aarch64",
        "--base",
        "apexkit/base:debian-bookworm-x86_64",
        "--network",
        "host",
        "--ca-cert",
        "none",
        env=docker_env(daemon),
        timeout=600,
    )
    assert proc.returncode == 10
    assert "the base image runs as x86_64, not aarch64" in one_line_error(proc)


def test_prune_removes_stale_images_only(daemon):
    stale_tag = "apexkit/builder:stale-test-x86_64"
    ctx = Path(daemon.base) / "stale-ctx"
    ctx.mkdir(exist_ok=True)
    (ctx / "Dockerfile").write_text(
        "FROM apexkit/base:debian-bookworm-x86_64\n"
        "LABEL org.apexkit.builder=1 org.apexkit.recipe=0000 org.apexkit.arch=x86_64\n"
    )
    assert (
        daemon.docker("build", "-q", "--network", "host", "-t", stale_tag, str(ctx)).returncode == 0
    )
    dry = invoke("image.prune", "--dry-run", env=docker_env(daemon))
    assert f"would remove {stale_tag}" in out(dry) and X86_TAG not in out(dry)
    assert daemon.docker("image", "inspect", stale_tag).returncode == 0
    done = invoke("image.prune", env=docker_env(daemon))
    assert done.returncode == 0 and f"removed {stale_tag}" in out(done)
    assert daemon.docker("image", "inspect", stale_tag).returncode != 0


# --- aarch64 through QEMU (own marker and nox session: about 6-10 minutes on 2 cores) ------------------------------------


@pytest.mark.aarch64
@pytest.mark.timeout(2700)  # everything runs under QEMU: apt, pip, g++, torch import
def test_aarch64_builder_and_wheel_under_qemu(daemon, repos, tmp_path, pytestconfig):
    if shutil.which("update-binfmts") and not builder.emulation("aarch64").usable:
        subprocess.run(
            ["mount", "-t", "binfmt_misc", "binfmt_misc", "/proc/sys/fs/binfmt_misc"],
            capture_output=True,
        )
        subprocess.run(["update-binfmts", "--enable", "qemu-aarch64"], capture_output=True)
    state = builder.emulation("aarch64")
    services.require(state.usable, f"QEMU aarch64: {state.detail}")
    started = time.monotonic()
    built = invoke(
        "image.build",
        "--arch",
        "aarch64",
        "--base",
        "debootstrap:bookworm",
        "--network",
        "host",
        "--ca-cert",
        HOST_CA,
        "--quiet",
        env=docker_env(daemon),
    )
    assert built.returncode == 0, out(built)[-4000:]
    image_seconds = time.monotonic() - started
    assert "(QEMU" in out(built)
    for path in (repos.ascend_path, repos.nvidia_path):
        subprocess.run(["chmod", "-R", "a+rX", str(path)], check=True)
    sources = {
        "APEXKIT_ASCEND_APEX_URL": repos.ascend_url,
        "APEXKIT_NVIDIA_APEX_URL": repos.nvidia_url,
    }
    started = time.monotonic()
    # torch 2.5.1 auto-loads installed backends at `import torch`: with the real aarch64 torch_npu wheel and no CANN,
    # the build, its probes and the smoke test run only because apexkit turns auto-loading off (in the image too)
    proc = invoke(
        "build",
        "--image",
        "apexkit/builder:debian-bookworm-aarch64",
        "--",
        "--torch",
        "2.5.1",
        "--torch-npu",
        "2.5.1.post1",
        "--dist",
        str(tmp_path / "dist"),
        "--build-dir",
        str(tmp_path / "build"),
        "--network",
        "host",
        "--ca-cert",
        HOST_CA,
        env=docker_env(daemon, APEXKIT_CACHE_DIR=str(tmp_path / "cache"), **sources),
    )
    assert proc.returncode == 0, out(proc)[-4000:]
    build_seconds = time.monotonic() - started
    dist = (
        tmp_path / "dist" / "py3.11-torch2.5.1-aarch64-master+npu2.5.1.post1"
    )  # torch_npu: its own target
    wheels = sorted(
        dist.glob("apex-0.1+ascend.torch2.5.1.npu2.5.1.post1-cp311-cp311-*_aarch64.whl")
    )
    assert len(wheels) == 1, sorted(p.name for p in (tmp_path / "dist").rglob("*"))
    wheel = wheels[0]
    manifest = json.loads((dist / "manifest.json").read_text())
    tag = manifest["binary_checks"]["platform"].get("wheel_tag") or "linux_aarch64"
    assert wheel.name.endswith(f"-{tag}.whl") and manifest["wheel"]["file"] == wheel.name
    assert (
        manifest["target"]["arch"] == "aarch64" and manifest["builder_image"]["arch"] == "aarch64"
    )
    assert manifest["smoke_test"]["modules"]["apex_C"][
        "ok"
    ]  # imported under QEMU in a fresh aarch64 venv
    assert (
        manifest["tools"]["torch_npu"] == "2.5.1.post1"
        and manifest["smoke_test"]["autoload"] == "0"
    )
    assert manifest["smoke_test"]["torch_npu"].startswith(
        "installed; import needs the CANN runtime"
    )
    # PyPI's torch 2.5.1 uses the old C++ ABI: without the cxx11-abi patch apex_C's c10::Device(std::string) call
    # is an undefined symbol at import (seen here before the patch existed)
    build_log = next(
        (tmp_path / "build").rglob("py3.11-torch2.5.1-aarch64-master+npu2.5.1.post1/build.log")
    )
    assert "-D_GLIBCXX_USE_CXX11_ABI=0" in build_log.read_text()
    with zipfile.ZipFile(wheel) as zf:
        so = next(n for n in zf.namelist() if n.startswith("apex_C") and n.endswith(".so"))
        zf.extract(so, tmp_path)
    header = subprocess.run(
        ["readelf", "-h", str(tmp_path / so)], capture_output=True, text=True
    ).stdout
    assert "AArch64" in header
    evidence(
        pytestconfig,
        f"aarch64 under QEMU: image.build {image_seconds:.0f} s, container build with torch_npu "
        f"2.5.1.post1 {build_seconds:.0f} s -> {wheel.name} (readelf: AArch64, smoke test imported "
        "apex_C; torch_npu: needs CANN)",
    )


HOSTILE = r"""#!/bin/sh
# What a hostile or broken builder image can leave in the workspace: a wheel that is a symlink to a host secret
# (the link resolves on the host, not in here), a manifest claiming it, and terminal escapes in its output.
d=/workspace/dist/py3.11-torch2.13.0-x86_64-master
mkdir -p "$d"
ln -s /etc/shadow "$d/apex-0.1+ascend-cp311-cp311-linux_x86_64.whl"
printf '{"wheel": {"file": "apex-0.1+ascend-cp311-cp311-linux_x86_64.whl", "sha256": "%064d"}}' 0 > "$d/manifest.json"
printf '\033]52;c;aGFja2Vk\007\033[2J\033[32mOK\033[0m\n'
"""


def test_a_hostile_image_cannot_reach_host_files(x86_builder, daemon, fixture_sources, tmp_path):
    """Issue 13 items 1, 2 and 9 with a real container: an image derived from the builder whose entrypoint leaves a
    symlinked wheel: refused in one line (exit 10), nothing in dist/, the escapes shown escaped on the terminal."""
    context = tmp_path / "hostile"
    context.mkdir()
    (context / "evil.sh").write_text(HOSTILE)
    (context / "Dockerfile").write_text(
        f'FROM {X86_TAG}\nCOPY evil.sh /evil.sh\nENTRYPOINT ["/bin/sh", "/evil.sh"]\n'
    )
    built = daemon.docker(
        "build",
        "-q",
        "-t",
        "apexkit/hostile:test",
        str(context),
        env={**os.environ, "DOCKER_BUILDKIT": "0"},
    )
    assert built.returncode == 0, built.stderr
    try:
        proc = container_build(daemon, "apexkit/hostile:test", tmp_path, fixture_sources)
    finally:
        daemon.docker("image", "rm", "-f", "apexkit/hostile:test")
    text = out(proc)
    assert proc.returncode == 10, text[-3000:]
    errors = [x for x in proc.stderr.splitlines() if x.startswith("error:")]
    assert len(errors) == 1 and "refusing what the container left in" in errors[0], text[-3000:]
    assert "is a symbolic link" in errors[0] and "nothing was copied" in errors[0]
    assert not (tmp_path / "dist").exists() or not [
        p for p in (tmp_path / "dist").iterdir() if p.name != ".locks"
    ]
    assert "\x1b" not in text and "\\x1b]52;c;aGFja2Vk" in text  # shown, not acted on
