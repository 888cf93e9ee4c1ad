"""The three proxy layers against real components: tinyproxy on 127.0.0.1 (its log read back), a private dockerd
started with the environment of our systemd drop-ins, and containers from a debootstrapped base image.

Traffic: the test processes and containers (--network host) talk to tinyproxy on loopback; tinyproxy forwards to
the package index, as a corporate proxy would.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import services
from conftest import ROOT
from proxyroot import invoke

from apexkit import netenv
from apexkit.images import bases
from apexkit.proxy import layers


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without any proxy or pip configuration of the machine."""
    env = {
        k: v for k, v in os.environ.items() if "proxy" not in k.lower() and not k.startswith("PIP_")
    }
    env.update(
        PIP_CONFIG_FILE=os.devnull,
        PIP_CERT=os.environ.get("PIP_CERT", "/etc/ssl/certs/ca-certificates.crt"),
        PIP_DISABLE_PIP_VERSION_CHECK="1",
    )
    env.update(extra)
    return env


def setup_root(tmp_path: Path, *args: str) -> Path:
    root = tmp_path / "root"
    (root / "root").mkdir(parents=True, exist_ok=True)
    result = invoke("proxy.setup", *args, "--root", str(root), env={"HOME": "/root"})
    assert result.returncode == 0, result.stderr
    return root


# --- shell layer --------------------------------------------------------------------------------------------------


@pytest.mark.network
def test_pip_download_with_the_proxy_env_goes_through_the_proxy(tinyproxy, tmp_path):
    root = setup_root(tmp_path, "--http", tinyproxy.url, "--layers", "shell")
    downloads = tmp_path / "downloads"
    mark = tinyproxy.log_size()
    script = (
        f'eval "$("{sys.executable}" -m invoke -r "{ROOT}" proxy.env --root "{root}")" && '
        f'"{sys.executable}" -m pip download --no-deps --no-cache-dir --index-url https://pypi.org/simple/ '
        f'-d "{downloads}" six==1.16.0'
    )
    result = subprocess.run(
        ["bash", "-c", script],
        capture_output=True,
        text=True,
        env=clean_env(HOME="/root"),
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert [p.name for p in downloads.iterdir()] == ["six-1.16.0-py2.py3-none-any.whl"]
    log = tinyproxy.log_since(mark)
    assert "CONNECT pypi.org:443" in log
    assert "CONNECT files.pythonhosted.org:443" in log

    # the profile block itself gives a new shell the same variables
    sourced = subprocess.run(
        ["bash", "-c", f'. "{root}/root/.bashrc"; printf "%s|%s" "$https_proxy" "$NO_PROXY"'],
        capture_output=True,
        text=True,
        env=clean_env(),
    )
    assert sourced.stdout == f"{tinyproxy.url}|localhost,127.0.0.0/8,::1"


@pytest.mark.network
def test_check_probes_the_index_through_the_proxy(tinyproxy, tmp_path):
    root = setup_root(tmp_path, "--http", tinyproxy.url, "--layers", "shell")
    mark = tinyproxy.log_size()
    result = invoke(
        "proxy.check", "--layers", "shell", "--json", "--root", str(root), env={"HOME": "/root"}
    )
    rows = json.loads(result.stdout)
    assert rows[0]["layer"] == "shell"
    assert "HTTP 200" in rows[0]["probe"], rows
    # the probe worked, but this test's own environment has no proxy variables: a warning, not a failure
    assert rows[0]["status"] == "warn" and "proxy.env" in rows[0]["hint"]
    assert result.returncode == 0
    assert "CONNECT pypi.org:443" in tinyproxy.log_since(mark)
    assert services.TinyProxy.PASSWORD not in result.stdout + result.stderr


def test_check_fails_with_the_cause_when_the_proxy_is_down_or_refuses(tinyproxy, tmp_path):
    dead = f"http://127.0.0.1:{services.free_port()}"
    root = setup_root(tmp_path, "--http", dead, "--layers", "shell")
    result = invoke(
        "proxy.check", "--layers", "shell", "--json", "--root", str(root), env={"HOME": "/root"}
    )
    assert result.returncode == 1
    row = json.loads(result.stdout)[0]
    assert (
        row["status"] == "fail"
        and "refused" in row["probe"]
        and "is the proxy running" in row["hint"]
    )

    wrong = tinyproxy.url.replace(services.TinyProxy.PASSWORD, "wrong-password")
    root = setup_root(tmp_path / "wrong", "--http", wrong, "--layers", "shell")
    result = invoke(
        "proxy.check", "--layers", "shell", "--json", "--root", str(root), env={"HOME": "/root"}
    )
    row = json.loads(result.stdout)[0]
    assert (
        result.returncode == 1
        and row["status"] == "fail"
        and "refused the credentials" in row["probe"]
    )
    assert "wrong-password" not in result.stdout


# --- daemon and container layers ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def docker_env(tinyproxy, tmp_path_factory):
    ok, why = services.services_available()
    services.require(ok, why)
    root = setup_root(
        tmp_path_factory.mktemp("docker"),
        "--http",
        tinyproxy.url,
        "--layers",
        "daemon,container",
        "--daemon-mode",
        "systemd",
    )
    paths = layers.Paths(root=root, environ={"HOME": "/root"})
    environment = layers.daemon_environment(
        paths
    )  # what systemd would give dockerd from our drop-ins
    daemon = services.Dockerd(environment)
    try:
        image = bases.import_image(daemon.client(), bases.rootfs_tarball(), "apexkit/test-base")
        yield SimpleNamespace(
            root=root,
            paths=paths,
            daemon=daemon,
            image=image,
            environment=environment,
            config_dir=root / "root/.docker",
        )
    finally:
        daemon.stop()


def test_dockerd_started_with_the_dropin_environment_uses_the_proxy(docker_env, tinyproxy):
    assert docker_env.environment == {
        "HTTP_PROXY": tinyproxy.url,
        "HTTPS_PROXY": tinyproxy.url,
        "NO_PROXY": "localhost,127.0.0.0/8,::1",
    }
    info = docker_env.daemon.docker("info")
    assert info.returncode == 0, info.stderr
    assert f"HTTP Proxy: http://xxxxx:xxxxx@127.0.0.1:{tinyproxy.port}" in info.stdout
    assert f"HTTPS Proxy: http://xxxxx:xxxxx@127.0.0.1:{tinyproxy.port}" in info.stdout
    assert "No Proxy: localhost,127.0.0.0/8,::1" in info.stdout

    result = invoke(
        "proxy.check",
        "--layers",
        "daemon",
        "--json",
        "--root",
        str(docker_env.root),
        env={"HOME": "/root", "DOCKER_HOST": docker_env.daemon.host},
    )
    row = json.loads(result.stdout)[0]
    assert result.returncode == 0 and row["status"] == "ok", row


def test_check_catches_a_daemon_started_without_the_proxy(docker_env):
    bare = services.Dockerd(
        {}
    )  # the seed's trap: the proxy is in the shell, the daemon never sees it
    try:
        result = invoke(
            "proxy.check",
            "--layers",
            "daemon",
            "--json",
            "--root",
            str(docker_env.root),
            env={"HOME": "/root", "DOCKER_HOST": bare.host},
        )
    finally:
        bare.stop()
    row = json.loads(result.stdout)[0]
    assert result.returncode == 1 and row["status"] == "fail"
    assert "restart the daemon" in row["hint"]


def test_containers_get_the_variables_and_reach_the_proxy(docker_env, tinyproxy):
    run = docker_env.daemon.docker(
        "--config",
        str(docker_env.config_dir),
        "run",
        "--rm",
        "--network",
        "host",
        docker_env.image,
        "env",
    )
    assert run.returncode == 0, run.stderr
    for name in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY"):
        assert f"{name}={tinyproxy.url}\n" in run.stdout
    assert "NO_PROXY=localhost,127.0.0.0/8,::1\n" in run.stdout

    mark = tinyproxy.log_size()
    result = invoke(
        "proxy.check",
        "--layers",
        "container",
        "--json",
        "--root",
        str(docker_env.root),
        env={"HOME": "/root", "DOCKER_HOST": docker_env.daemon.host},
    )
    row = json.loads(result.stdout)[0]
    assert row["status"] == "ok", row
    assert "200" in row["probe"] and "HTTPS_PROXY" in row["effective"]
    assert result.returncode == 0
    log = tinyproxy.log_since(mark)
    assert (
        "CONNECT pypi.org:443" in log
    )  # sent from inside the container, through the proxy it was given
    assert services.TinyProxy.PASSWORD not in result.stdout + result.stderr


def test_containers_get_the_ca_bundle(docker_env):
    """The CA bundle mounted at CONTAINER_CA_PATH with CA_VARIABLES naming it, as images/container.py gives it."""
    bundle = "/etc/ssl/certs/ca-certificates.crt"
    variables = (f"{name}={layers.CONTAINER_CA_PATH}" for name in netenv.CA_VARIABLES)
    run = docker_env.daemon.docker(
        "run",
        "--rm",
        "--network",
        "host",
        "-v",
        f"{bundle}:{layers.CONTAINER_CA_PATH}:ro",
        *(arg for variable in variables for arg in ("-e", variable)),
        docker_env.image,
        "sh",
        "-c",
        'test -s "$SSL_CERT_FILE" && echo "$PIP_CERT $GIT_SSL_CAINFO"',
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == [layers.CONTAINER_CA_PATH] * 2


def test_image_builds_get_the_proxy_as_build_args_kept_out_of_history(
    docker_env, tinyproxy, tmp_path
):
    context = tmp_path / "context"
    context.mkdir()
    (context / "Dockerfile").write_text(
        f'FROM {docker_env.image}\nRUN echo "seen $HTTPS_PROXY" > /seen\n'
    )
    env = dict(os.environ, DOCKER_BUILDKIT="0")
    build = docker_env.daemon.docker(
        "--config",
        str(docker_env.config_dir),
        "build",
        "--network",
        "host",
        "-q",
        "-t",
        "apexkit/proxy-build-test",
        str(context),
        env=env,
    )
    assert build.returncode == 0, build.stderr
    seen = docker_env.daemon.docker("run", "--rm", "apexkit/proxy-build-test", "cat", "/seen")
    assert seen.stdout.strip() == f"seen {tinyproxy.url}"  # the RUN step had the proxy
    history = docker_env.daemon.docker("history", "--no-trunc", "apexkit/proxy-build-test")
    inspect = docker_env.daemon.docker("image", "inspect", "apexkit/proxy-build-test")
    assert history.returncode == 0 and inspect.returncode == 0
    assert services.TinyProxy.PASSWORD not in history.stdout + inspect.stdout


# --- registry mirrors: what setup accepts, dockerd accepts; what dockerd refuses, setup refuses first ---------------


def _dockerd_with_config(config: dict, tmp_path: Path) -> tuple[bool, str]:
    """Start a private dockerd on `config` (as daemon.json). (started, log tail); stopped and unmounted again."""
    import shutil
    import signal
    import tempfile
    import time

    base = Path(
        tempfile.mkdtemp(prefix="apxm-", dir="/tmp")
    )  # short: unix socket paths are limited
    (base / "daemon.json").write_text(json.dumps(config))
    host = f"unix://{base}/d.sock"
    log_path = base / "log"
    with open(log_path, "wb") as log_file:
        process = subprocess.Popen(
            [
                "dockerd",
                "--config-file",
                str(base / "daemon.json"),
                "--host",
                host,
                "--data-root",
                str(base / "data"),
                "--exec-root",
                str(base / "exec"),
                "--pidfile",
                str(base / "pid"),
                "--iptables=false",
                "--bridge=none",
                "--ip-masq=false",
            ],
            stdout=log_file,
            stderr=subprocess.STDOUT,
            env=clean_env(),
            start_new_session=True,
        )
        started = False
        try:
            deadline = time.monotonic() + 90
            while time.monotonic() < deadline and process.poll() is None:
                if (
                    subprocess.run(
                        ["docker", "-H", host, "version"], capture_output=True
                    ).returncode
                    == 0
                ):
                    started = True
                    break
                time.sleep(0.5)
            info = (
                subprocess.run(
                    ["docker", "-H", host, "info", "--format", "{{json .RegistryConfig.Mirrors}}"],
                    capture_output=True,
                    text=True,
                )
                if started
                else None
            )
        finally:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
                process.wait(30)
            targets = [line.split()[1] for line in Path("/proc/mounts").read_text().splitlines()]
            for target in sorted(
                (t for t in targets if t.startswith(str(base) + "/")), key=len, reverse=True
            ):
                subprocess.run(["umount", "-l", target], capture_output=True)
    text = log_path.read_text(errors="replace")[-2000:] + (info.stdout if info else "")
    shutil.rmtree(base, ignore_errors=True)
    return started, text


def test_registry_mirrors_match_what_dockerd_accepts(tmp_path):
    ok, why = services.services_available()
    services.require(ok, why)
    refused = [
        "https://u:pw@mirror.example",
        "https://mirror.example/?x=1",
        "http://10.0.0.5:5000/mirror",
        "https://mirror.example x",
    ]
    for mirror in refused:
        result = invoke(
            "proxy.setup",
            "--registry-mirror",
            mirror,
            "--layers",
            "daemon",
            "--root",
            str(tmp_path),
        )
        assert result.returncode == 2, result.stderr
        started, text = _dockerd_with_config({"registry-mirrors": [mirror]}, tmp_path)
        assert not started and "invalid mirror" in text, text
    # what setup writes for an accepted form, dockerd starts with (and setup restarts it)
    root = setup_root(tmp_path, "--registry-mirror", "HTTP://10.0.0.5:5000/", "--layers", "daemon")
    written = json.loads((root / "etc/docker/daemon.json").read_text())
    assert written == {"registry-mirrors": ["http://10.0.0.5:5000"]}
    started, text = _dockerd_with_config(written, tmp_path)
    assert started and '"http://10.0.0.5:5000/"' in text, text
