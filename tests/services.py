"""Real services for the tests: tinyproxy on 127.0.0.1 and a private dockerd (own socket, data and exec roots).

When APEXKIT_REQUIRE_SERVICES=1 (set by `nox -s tests` when it was asked to install them, with
APEXKIT_INSTALL_SYSTEM_TOOLS=1 or CI=true, and could), a missing service fails the test instead of skipping it, so CI
never passes by skipping. Otherwise the skip reason names the command that installs what is missing.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import pytest


def require(condition: bool, why: str) -> None:
    if condition:
        return
    if os.environ.get("APEXKIT_REQUIRE_SERVICES") == "1":
        pytest.fail(f"required service missing: {why}")
    pytest.skip(why)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_port(port: int, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
            return
        time.sleep(0.1)
    raise RuntimeError(f"nothing listens on 127.0.0.1:{port} after {timeout}s")


class TinyProxy:
    """tinyproxy on 127.0.0.1 with Basic auth; `log_since(mark)` reads what it logged after `mark = log_size()`."""

    USER = "apexuser"
    PASSWORD = "s3cr3t-Pw9"  # tinyproxy's config grammar takes no '@' or ':' here

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.port = free_port()
        self.log = directory / "tinyproxy.log"
        conf = directory / "tinyproxy.conf"
        conf.write_text(
            f"Port {self.port}\nListen 127.0.0.1\nTimeout 60\nLogFile \"{self.log}\"\nLogLevel Connect\n"
            f"MaxClients 50\nAllow 127.0.0.1\nBasicAuth {self.USER} {self.PASSWORD}\nConnectPort 443\n")
        self.process = subprocess.Popen(["tinyproxy", "-d", "-c", str(conf)], stdout=subprocess.DEVNULL,
                                        stderr=subprocess.STDOUT)
        _wait_port(self.port)

    @property
    def url(self) -> str:
        return f"http://{self.USER}:{self.PASSWORD}@127.0.0.1:{self.port}"

    @property
    def url_without_credentials(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log_size(self) -> int:
        return self.log.stat().st_size if self.log.exists() else 0

    def log_since(self, mark: int) -> str:
        with open(self.log, "rb") as handle:
            handle.seek(mark)
            return handle.read().decode("utf-8", "replace")

    def stop(self) -> None:
        self.process.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(10)


class Dockerd:
    """A private dockerd started with a given environment (as systemd would start it with our drop-ins)."""

    def __init__(self, environment: dict[str, str], data_root: Path | None = None) -> None:
        """`data_root`: keep images between runs on this machine (builder images are minutes to build)."""
        # short paths: containerd's sockets live under exec-root and unix socket paths are limited to 108 bytes
        self.base = Path(tempfile.mkdtemp(prefix="apxd-", dir="/tmp"))
        self.data_root = data_root or self.base / "data"
        self.socket = self.base / "docker.sock"
        self.host = f"unix://{self.socket}"
        self.log_path = self.base / "dockerd.log"
        env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
        env.update(environment)
        argv = ["dockerd", "--host", self.host, "--data-root", str(self.data_root), "--exec-root",
                str(self.base / "exec"), "--pidfile", str(self.base / "dockerd.pid"), "--iptables=false",
                "--bridge=none", "--ip-masq=false"]
        self.log_file = open(self.log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.process = subprocess.Popen(argv, env=env, stdout=self.log_file, stderr=subprocess.STDOUT,
                                        start_new_session=True)
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"dockerd exited: {self.log_path.read_text()[-2000:]}")
            if subprocess.run(["docker", "-H", self.host, "version"], capture_output=True).returncode == 0:
                return
            time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"dockerd did not answer within 90 s: {self.log_path.read_text()[-2000:]}")

    def client(self):
        import docker

        return docker.DockerClient(base_url=self.host, timeout=120)

    def docker(self, *args: str, env: dict[str, str] | None = None, timeout: int = 300) -> subprocess.CompletedProcess:
        return subprocess.run(["docker", "-H", self.host, *args], capture_output=True, text=True, timeout=timeout,
                              env=env)

    def stop(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(10)
        self.log_file.close()
        # whatever the daemon left mounted (netns, overlays), deepest first
        prefixes = (str(self.base) + "/", str(self.data_root) + "/")
        targets = [line.split()[1] for line in Path("/proc/mounts").read_text().splitlines()]
        for target in sorted((t for t in targets if t.startswith(prefixes)), key=len, reverse=True):
            subprocess.run(["umount", "-l", target], capture_output=True)
        shutil.rmtree(self.base, ignore_errors=True)


def services_available() -> tuple[bool, str]:
    if os.geteuid() != 0:
        return False, "needs root (dockerd, debootstrap)"
    absent = [tool for tool in ("dockerd", "docker", "debootstrap") if shutil.which(tool) is None]
    if absent:
        from apexkit import testtools

        return False, testtools.skip_reason(*absent)
    return True, ""
