"""Real services for the tests: tinyproxy on 127.0.0.1 and a private dockerd (own socket, data and exec roots).

When APEXKIT_REQUIRE_SERVICES=1 (set by `nox -s tests-e2e` or `tests` when asked to install them, with
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
import sys
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
            f'Port {self.port}\nListen 127.0.0.1\nTimeout 60\nLogFile "{self.log}"\nLogLevel Connect\n'
            f"MaxClients 50\nAllow 127.0.0.1\nBasicAuth {self.USER} {self.PASSWORD}\nConnectPort 443\n"
        )
        self.process = subprocess.Popen(
            ["tinyproxy", "-d", "-c", str(conf)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.STDOUT,
        )
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
        argv = [
            "dockerd",
            "--host",
            self.host,
            "--data-root",
            str(self.data_root),
            "--exec-root",
            str(self.base / "exec"),
            "--pidfile",
            str(self.base / "dockerd.pid"),
            "--iptables=false",
            "--bridge=none",
            "--ip-masq=false",
        ]
        self.log_file = open(self.log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.process = subprocess.Popen(
            argv, env=env, stdout=self.log_file, stderr=subprocess.STDOUT, start_new_session=True
        )
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"dockerd exited: {self.log_path.read_text()[-2000:]}")
            if (
                subprocess.run(
                    ["docker", "-H", self.host, "version"], capture_output=True
                ).returncode
                == 0
            ):
                return
            time.sleep(0.5)
        self.stop()
        raise RuntimeError(
            f"dockerd did not answer within 90 s: {self.log_path.read_text()[-2000:]}"
        )

    def client(self):
        import docker

        return docker.DockerClient(base_url=self.host, timeout=120)

    def docker(
        self, *args: str, env: dict[str, str] | None = None, timeout: int = 300
    ) -> subprocess.CompletedProcess:
        return subprocess.run(
            ["docker", "-H", self.host, *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=env,
        )

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
        from tools import testtools

        return False, testtools.skip_reason(*absent)
    return True, ""


class SlurmCluster:
    """A private Slurm cluster on this machine: munged, slurmctld and one slurmd per node name (Debian's slurmd is
    built with multiple-slurmd: every NodeName has NodeHostname=localhost and its own port), all from a generated
    slurm.conf in a temp dir, as root, nothing under /etc. `env` points the Slurm CLI at it (SLURM_CONF).

    `node_env` gives a node its own environment through a TaskProlog (what a site's prolog or a hand-edited node
    does): {"node2": {"PYTHONPATH": "/broken"}}."""

    def __init__(
        self, nodes: int = 3, cpus: int = 1, node_env: dict[str, dict[str, str]] | None = None
    ) -> None:
        self.base = Path(tempfile.mkdtemp(prefix="apxs-", dir="/tmp"))  # short: munge's socket path
        self.names = [f"node{i}" for i in range(1, nodes + 1)]
        self.conf = self.base / "slurm.conf"
        self.munge_socket = self.base / "munge.sock"
        self.processes: list[subprocess.Popen] = []
        self.log_files = []
        for sub in ("state", "spool", "log"):
            (self.base / sub).mkdir()
        key = self.base / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        prolog = self.base / "task_prolog.sh"
        cases = "".join(
            f"  {name})\n"
            + "".join(f"    echo export {k}={v}\n" for k, v in env.items())
            + "    ;;\n"
            for name, env in (node_env or {}).items()
        )
        prolog.write_text(f'#!/bin/sh\ncase "$SLURMD_NODENAME" in\n{cases}esac\nexit 0\n')
        prolog.chmod(0o755)
        ctld, slurmd = free_port(), free_port()
        ports = [free_port() for _ in self.names]
        b = self.base
        nodes_conf = "".join(
            f"NodeName={n} NodeHostname=localhost NodeAddr=127.0.0.1 Port={p} CPUs={cpus} "
            f"RealMemory=1000 State=UNKNOWN\n"
            for n, p in zip(self.names, ports)
        )
        self.conf.write_text(
            f"ClusterName=apexkit\nSlurmctldHost=localhost\nSlurmctldPort={ctld}\nSlurmdPort={slurmd}\n"
            f"SlurmUser=root\nAuthType=auth/munge\nAuthInfo=socket={self.munge_socket}\nCredType=cred/munge\n"
            f"StateSaveLocation={b}/state\nSlurmdSpoolDir={b}/spool/%n\nSlurmctldPidFile={b}/slurmctld.pid\n"
            f"SlurmdPidFile={b}/slurmd-%n.pid\nSlurmctldLogFile={b}/log/slurmctld.log\n"
            f"SlurmdLogFile={b}/log/slurmd-%n.log\nTaskProlog={prolog}\n"
            "ProctrackType=proctrack/linuxproc\nTaskPlugin=task/none\nJobAcctGatherType=jobacct_gather/none\n"
            "AccountingStorageType=accounting_storage/none\nSwitchType=switch/none\nMpiDefault=none\n"
            "SchedulerType=sched/backfill\nSelectType=select/cons_tres\nSelectTypeParameters=CR_Core\n"
            "ReturnToService=2\nSlurmdTimeout=60\nInactiveLimit=0\nMinJobAge=3600\nKillWait=30\n"
            f"{nodes_conf}PartitionName=debug Nodes={','.join(self.names)} Default=YES MaxTime=INFINITE State=UP\n"
        )
        self.env = dict(os.environ, SLURM_CONF=str(self.conf))
        try:
            self._start(
                [
                    "munged",
                    "-F",
                    f"--socket={self.munge_socket}",
                    f"--key-file={key}",
                    f"--pid-file={b}/munged.pid",
                    f"--log-file={b}/log/munged.log",
                    f"--seed-file={b}/munged.seed",
                    "--force",
                ],
                "munged",
            )
            self._wait(lambda: self.munge_socket.exists(), "munged socket")
            self._start(["slurmctld", "-D", "-i"], "slurmctld")
            self._wait(
                lambda: (
                    self.run("scontrol", "ping").returncode == 0
                    and "UP" in self.run("scontrol", "ping").stdout
                ),
                "slurmctld",
            )
            for name in self.names:
                (b / "spool" / name).mkdir()
                self._start(["slurmd", "-D", "-N", name], f"slurmd-{name}")
            self._wait(
                lambda: (
                    self.run("sinfo", "-h", "-o", "%t").stdout.split()
                    and all(
                        s == "idle"
                        for s in self.run("sinfo", "-h", "-N", "-o", "%t").stdout.split()
                    )
                ),
                "idle nodes",
            )
        except BaseException:
            self.stop()
            raise

    def _start(self, argv: list[str], name: str) -> None:
        out = open(self.base / "log" / f"{name}.out", "wb")  # noqa: SIM115 - closed in stop()
        self.log_files.append(out)
        self.processes.append(
            subprocess.Popen(
                argv, env=self.env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        )

    def _wait(self, ready, what: str, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            dead = [p for p in self.processes if p.poll() is not None]
            if dead:
                raise RuntimeError(f"{dead[0].args[0]} exited: {self.logs()[-2000:]}")
            if ready():
                return
            time.sleep(0.3)
        raise RuntimeError(f"{what} not ready within {timeout}s: {self.logs()[-2000:]}")

    def logs(self) -> str:
        return "\n".join(
            f"== {p.name}\n{p.read_text(errors='replace')[-1500:]}"
            for p in sorted((self.base / "log").iterdir())
        )

    def run(self, *argv: str, timeout: float = 60) -> subprocess.CompletedProcess:
        return subprocess.run(
            list(argv), env=self.env, capture_output=True, text=True, timeout=timeout
        )

    def stop(self) -> None:
        """Cancel what is left, then stop the daemons (slurmd first) and remove the directory."""
        with contextlib.suppress(Exception):
            self.run("scancel", "--full", "--user", "root", timeout=20)
        for process in reversed(self.processes):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(20)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait(10)
        for handle in self.log_files:
            handle.close()
        shutil.rmtree(self.base, ignore_errors=True)


def slurm_available() -> tuple[bool, str]:
    """Root (the daemons run as root here) and Debian's munge + slurmctld + slurmd + the client."""
    absent = [
        tool for tool in ("munged", "slurmctld", "slurmd", "sbatch") if shutil.which(tool) is None
    ]
    if absent:
        from tools import testtools

        return False, testtools.skip_reason(*absent)
    if os.geteuid() != 0:
        return False, "needs root (munged, slurmctld and slurmd run as root in the test cluster)"
    return True, ""


# --- a training venv -------------------------------------------------------------------------------------------

TORCH = "2.13.0+cpu"  # the torch this machine has wheels of for Python 3.11


def make_torch_venv(path: Path) -> Path:
    """A venv with pip and torch 2.13.0+cpu, installed by uv from this machine's local wheels (pip's config)."""
    from apexkit import pipconfig
    from apexkit.wheel import uvtools

    uv = uvtools.find()
    if uv is None:
        pytest.skip("uv is not installed (pip install -r requirements/dev.txt brings it)")
    conf = pipconfig.read(os.environ)
    sources = (
        ["--no-index"] if not (conf.get("index-url") or conf.get_list("extra-index-url")) else []
    )
    sources += ["--index-url", conf["index-url"]] if conf.get("index-url") else []
    for url in conf.get_list("extra-index-url"):
        sources += ["--extra-index-url", url]
    for links in conf.get_list("find-links"):
        sources += ["--find-links", links]
    env = {**os.environ, "UV_PYTHON_DOWNLOADS": "never", "UV_OFFLINE": "1"}
    python = sys.executable if sys.version_info[:2] == (3, 11) else shutil.which("python3.11")
    if python is None:
        pytest.skip("no Python 3.11 here for the training venv")
    # the stdlib's venv seeds pip from ensurepip (uv venv --seed would fetch pip from an index: offline, it cannot)
    made = subprocess.run(
        [python, "-m", "venv", str(path)], capture_output=True, text=True, env=env
    )
    assert made.returncode == 0, made.stderr[-2000:]
    installed = subprocess.run(
        [
            uv.binary,
            "pip",
            "install",
            "-q",
            "--python",
            str(path / "bin" / "python"),
            *sources,
            f"torch=={TORCH}",
        ],
        capture_output=True,
        text=True,
        env=env,
    )
    assert installed.returncode == 0, installed.stderr[-2000:]
    return path
