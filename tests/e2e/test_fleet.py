"""Fleet validation through Slurm: the batch script (pure), the report (from result files), and end to end on a
private Slurm cluster started here (munged + slurmctld + three slurmd on localhost) with a real fixture wheel."""

from __future__ import annotations

import json
import os
import shlex
import socket
import stat
import subprocess
import sys
import threading
import time
import urllib.parse
from pathlib import Path

import fakes
import pytest
from conftest import ROOT, output

from apexkit.fleet import slurm, validate

TARGET = "py3.11-torch2.13.0-x86_64-master"
STACK_TARGET = "py3.10-torch2.7.1-aarch64-master+npu2.7.1.post2"


def invoke(*args: str, env: dict | None = None, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "invoke", "-r", str(ROOT), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )


# --- pure: plan and batch script ------------------------------------------------------------------------------------


def test_dry_run_prints_the_batch_script_for_a_16_node_ascend_partition(tmp_path):
    index = fakes.fake_index(tmp_path / "index", (STACK_TARGET, "2.7.1"), (TARGET, "2.13.0"))
    results = tmp_path / "results"
    proc = invoke(
        "fleet.submit",
        "--index",
        str(index),
        "--results",
        str(results),
        "--stack",
        "mindspeed-llm-2.3.0",
        "--partition",
        "ascend",
        "--nodes",
        "16",
        "--gres",
        "npu:8",
        "--account",
        "llm",
        "--bench",
        "--dry-run",
        env=dict(os.environ, PATH=str(Path(sys.executable).parent)),
    )  # no Slurm needed
    assert proc.returncode == 0, output(proc)
    script = proc.stdout
    for line in (
        "#!/bin/bash",
        "#SBATCH --partition=ascend",
        "#SBATCH --nodes=16",
        "#SBATCH --ntasks-per-node=1",
        "#SBATCH --gres=npu:8",
        "#SBATCH --account=llm",
        "#SBATCH --no-kill",
        "NODE_PYTHON=python3.10",
        f"SET_ENV_FILES={shlex.quote(' '.join(validate.SET_ENV))}",
        'nodes=$(scontrol show hostnames "$SLURM_JOB_NODELIST")',
    ):
        assert line in script.splitlines(), line
    srun = next(line for line in script.splitlines() if line.strip().startswith("srun "))
    assert '--nodes=1 --ntasks=1 --nodelist="$node" --kill-on-bad-exit=0 --gres=npu:8' in srun
    assert '"$FLEET/bench/fleet_node.py" --plan "$PLAN"' in script
    assert '. "$f"' in script  # set_env.sh sourced when present
    assert STACK_TARGET in script
    assert not results.exists()  # a dry run writes nothing


def test_an_index_without_index_json_is_refused(tmp_path):
    proc = invoke("fleet.submit", "--index", str(tmp_path), "--nodes", "2", "--dry-run")
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"error: --index {tmp_path}: {tmp_path} holds no index.json (not an "
        f"`invoke publish` index) -- next: publish one first: invoke publish "
        f"--index {tmp_path}"
    ]


def test_no_slurm_on_path_is_one_line_with_the_check(tmp_path):
    index = fakes.fake_index(tmp_path / "index", (TARGET, "2.13.0"))
    env = dict(os.environ, PATH=str(Path(sys.executable).parent) + ":/nonexistent")
    proc = invoke(
        "fleet.submit",
        "--index",
        str(index),
        "--results",
        str(tmp_path / "r"),
        "--nodes",
        "2",
        env=env,
    )
    assert proc.returncode == validate.SchedulerError.exit_code, output(proc)
    lines = proc.stderr.strip().splitlines()
    assert (
        len(lines) == 1 and "sbatch not found on PATH" in lines[0] and slurm.CHECK_CMD in lines[0]
    )
    assert "Traceback" not in output(proc)


# --- real Slurm ----------------------------------------------------------------------------------------------------

HANG = "import sys, time\nif any('validate_env' in a for a in sys.argv):\n    time.sleep(600)\n"
BROKEN = "raise ImportError('libtorch_cpu.so: cannot open shared object file: No such file or directory')\n"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    import services

    ok, why = services.slurm_available()
    services.require(ok, why)
    faults = tmp_path_factory.mktemp("faults")
    (faults / "broken" / "torch").mkdir(parents=True)
    (faults / "broken" / "torch" / "__init__.py").write_text(
        BROKEN
    )  # node2: a hand-installed torch shadows the venv's
    (faults / "hang").mkdir()
    (faults / "hang" / "sitecustomize.py").write_text(
        HANG
    )  # node3: validation hangs (until scancel)
    started = services.SlurmCluster(
        nodes=3,
        node_env={
            "node2": {"PYTHONPATH": str(faults / "broken")},
            "node3": {"PYTHONPATH": str(faults / "hang")},
        },
    )
    started.faults = faults
    yield started
    started.stop()


def _wait_for(condition, what: str, cluster, timeout: float = 400) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(1)
    raise AssertionError(
        f"{what} after {timeout}s\n{cluster.run('squeue').stdout}\n{cluster.logs()}"
    )


def _job_done(cluster, job: str) -> bool:
    return not cluster.run("squeue", "-h", "-j", job).stdout.strip()


@pytest.mark.slurm
def test_fleet_end_to_end_with_a_failing_node_scancel_and_resume(cluster, runner, tmp_path):
    built = runner.nox("3.11", "--no-smoke-test")
    assert built.returncode == 0, output(built)[-3000:]
    index, results = tmp_path / "index", tmp_path / "results"
    published = invoke("publish", "--dist", str(runner.dist), "--index", str(index))
    assert published.returncode == 0, output(published)
    wheel_sha = json.loads((index / "index.json").read_text())["files"][0]["sha256"]

    submitted = invoke(
        "fleet.submit",
        "--index",
        str(index),
        "--results",
        str(results),
        "--nodelist",
        "node1,node2,node3",
        "--device",
        "cpu",
        "--bench",
        "--bench-args",
        "--scale 0.05",
        "--find-links",
        "/opt/wheels",
        "--node-dir",
        str(tmp_path / "scratch"),
        env=cluster.env,
    )
    assert submitted.returncode == 0, output(submitted)
    job = json.loads((results / "fleet.json").read_text())["submissions"][0]["job_id"]
    assert (
        f"submitted job {job}" in submitted.stderr and submitted.stdout == f"{job}\n"
    )  # the id alone on stdout

    # node1 and node2 report; node3 hangs in validation: cancel the job mid-run
    def node3_validating() -> bool:
        progress = results / ".fleet" / "progress" / "node3.json"
        return progress.is_file() and json.loads(progress.read_text())["stage"] == "validate"

    _wait_for(
        lambda: (
            (results / "node1.json").is_file()
            and (results / "node2.json").is_file()
            and node3_validating()
        ),
        "node1/node2 results and node3 in validation",
        cluster,
    )
    status = invoke("fleet.status", str(results), env=cluster.env)
    assert (
        status.returncode == 0 and f"job {job}" in status.stdout and "RUNNING" in status.stdout
    ), output(status)
    assert "node3 (validate)" in status.stdout
    assert cluster.run("scancel", job).returncode == 0
    _wait_for(lambda: _job_done(cluster, job), "the cancelled job to end", cluster, timeout=60)

    proc = invoke("fleet.report", str(results), "--json", env=cluster.env)
    assert proc.returncode == 1, output(proc)
    rows = {r["node"]: r for r in json.loads(proc.stdout)["nodes"]}
    assert rows["node1"]["status"] == "ok" and rows["node1"]["wheel_sha256"] == wheel_sha
    assert rows["node1"]["torch"] == "2.13.0+cpu" and rows["node1"]["step_ms"] > 0
    assert rows["node1"]["chip"].startswith("cpu: ")
    assert rows["node2"]["status"] == "fail"
    assert rows["node2"]["first_failure"]["check"] == "torch"
    assert "libtorch_cpu.so" in rows["node2"]["first_failure"]["detail"]
    assert rows["node3"]["status"] == "dead" and rows["node3"]["job_state"] == "CANCELLED"
    assert "CANCELLED during validate" in rows["node3"]["first_failure"]["detail"]
    table = invoke("fleet.report", str(results), env=cluster.env)
    assert table.returncode == 1
    lines = table.stdout.splitlines()
    assert any(line.startswith("node1 ") and " ok " in line for line in lines), table.stdout
    assert any(
        line.startswith("node2 ") and "FAIL" in line and "torch: ImportError" in line
        for line in lines
    )
    assert any(
        line.startswith("node3 ") and "DEAD" in line and "--resume" in line for line in lines
    )
    node1_before = (results / "node1.json").read_bytes()

    # node3 is fixed; --resume resubmits node3 only
    (cluster.faults / "hang" / "sitecustomize.py").write_text("")
    resumed = invoke("fleet.submit", "--results", str(results), "--resume", env=cluster.env)
    assert resumed.returncode == 0, output(resumed)
    assert "resubmitting node3" in output(resumed)
    second = json.loads((results / "fleet.json").read_text())["submissions"][1]
    assert second["nodelist"] == ["node3"] and second["job_id"] != job
    _wait_for(lambda: _job_done(cluster, second["job_id"]), "the resumed job to end", cluster)
    final = invoke("fleet.report", str(results), "--json", env=cluster.env)
    rows = {r["node"]: r for r in json.loads(final.stdout)["nodes"]}
    assert rows["node3"]["status"] == "ok" and rows["node3"]["job_id"] == second["job_id"]
    assert (
        results / "node1.json"
    ).read_bytes() == node1_before  # nothing lost from the other nodes
    assert final.returncode == 1  # node2 still fails
    again = invoke("fleet.submit", "--results", str(results), "--resume", env=cluster.env)
    assert again.returncode == 0 and "nothing to resubmit" in output(again)
    # the nodes' venvs were node-local scratch and are gone
    assert not any((tmp_path / "scratch").iterdir())


@pytest.mark.slurm
def test_an_index_the_nodes_cannot_reach_is_each_nodes_first_failure(cluster, tmp_path):
    import services

    url = f"http://127.0.0.1:{services.free_port()}/apex-index"  # nothing listens there
    results = tmp_path / "results"
    proc = invoke(
        "fleet.submit",
        "--index",
        url,
        "--target",
        TARGET,
        "--results",
        str(results),
        "--nodes",
        "2",
        "--device",
        "cpu",
        "--node-dir",
        str(tmp_path / "scratch"),
        env=cluster.env,
    )
    assert proc.returncode == 0, output(proc)
    assert "cannot read" in output(proc)  # the submit host cannot read it either: said, not fatal
    job = json.loads((results / "fleet.json").read_text())["submissions"][0]["job_id"]
    _wait_for(lambda: _job_done(cluster, job), "the job to end", cluster, timeout=120)
    report = invoke("fleet.report", str(results), "--json", env=cluster.env)
    assert report.returncode == 1
    rows = json.loads(report.stdout)["nodes"]
    assert len(rows) == 2 and {r["status"] for r in rows} == {"fail"}
    for row in rows:
        assert row["first_failure"]["check"] == "read index"
        assert "this node cannot read" in row["first_failure"]["fix"]


@pytest.mark.slurm
def test_controller_down_is_one_line(cluster, tmp_path):
    conf = tmp_path / "slurm.conf"
    import services

    port = services.free_port()
    text = cluster.conf.read_text()
    conf.write_text(
        "\n".join(
            f"SlurmctldPort={port}" if line.startswith("SlurmctldPort=") else line
            for line in text.splitlines()
        )
        + "\nMessageTimeout=2\n"
    )
    index = fakes.fake_index(tmp_path / "index", (TARGET, "2.13.0"))
    env = dict(cluster.env, SLURM_CONF=str(conf))
    proc = invoke(
        "fleet.submit",
        "--index",
        str(index),
        "--results",
        str(tmp_path / "r"),
        "--nodes",
        "2",
        env=env,
    )
    assert proc.returncode == validate.SchedulerError.exit_code, output(proc)
    lines = [
        line for line in proc.stderr.splitlines() if not line.startswith("+ ")
    ]  # the echoed commands
    assert (
        len(lines) == 1
        and "the Slurm controller does not answer (scontrol ping: Slurmctld(primary) at" in lines[0]
    )
    assert (
        "is DOWN" in lines[0]
        and "-- next: start slurmctld" in lines[0]
        and slurm.CHECK_CMD in lines[0]
    )
    assert "Traceback" not in output(proc)
    assert not (tmp_path / "r" / "fleet.json").exists()


# --- index logins and the node scratch (issue 26: review M2, M10) ------------------------------------------------

USER, PASSWORD = "alice", "IdxS3cret"


@pytest.fixture
def login_index(tmp_path):
    """http://127.0.0.1:<port>/idx: an index behind Basic auth (alice:IdxS3cret) serving index.json, the simple page
    and the fixture wheel; `requests` records (path, whether the login came with it)."""
    import base64
    import hashlib
    import http.server
    import threading

    folder = tmp_path / "served"
    folder.mkdir()
    wheel = fakes.make_wheel(folder)
    sha = hashlib.sha256(wheel.read_bytes()).hexdigest()
    entry = {"project": "apex", "filename": wheel.name, "sha256": sha, "target": TARGET}
    pages = {
        "/idx/index.json": json.dumps(
            {"format": "apexkit-index/1", "files": [dict(entry, torch="0.0.1")]}
        ).encode(),
        "/idx/simple/apex/": f'<a href="../../files/{wheel.name}#sha256={sha}">{wheel.name}</a>\n'.encode(),
        f"/idx/files/{wheel.name}": wheel.read_bytes(),
    }
    good = "Basic " + base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
    requests: list[tuple[str, bool]] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            authorised = self.headers.get("Authorization") == good
            requests.append((self.path, authorised))
            if not authorised:
                self.send_response(401)
                self.send_header("WWW-Authenticate", 'Basic realm="idx"')
                self.end_headers()
                return
            body = pages.get(urllib.parse.unquote(self.path))
            self.send_response(200 if body is not None else 404)
            self.send_header(
                "Content-Type",
                "text/html" if self.path.endswith("/") else "application/octet-stream",
            )
            self.send_header("Content-Length", str(len(body or b"")))
            self.end_headers()
            self.wfile.write(body or b"")

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    server.requests = requests  # type: ignore[attr-defined]
    server.url = f"http://{USER}:{PASSWORD}@127.0.0.1:{server.server_address[1]}/idx"  # type: ignore[attr-defined]
    yield server
    server.shutdown()


@pytest.mark.slurm
def test_index_logins_reach_the_nodes_through_a_private_file_and_nowhere_else(
    cluster, login_index, tmp_path
):
    results, submit_dir, node_tmp = tmp_path / "results", tmp_path / "submit", tmp_path / "node-tmp"
    submit_dir.mkdir()
    node_tmp.mkdir()
    env = dict(cluster.env, TMPDIR=str(node_tmp))
    for name in (
        "http_proxy",
        "https_proxy",
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "all_proxy",
        "ALL_PROXY",
    ):
        env.pop(name, None)
    args = [
        "fleet.submit",
        "--index",
        login_index.url,  # no --target: the submit host reads index.json with the login (Basic auth)
        "--torch-index-url",
        login_index.url + "/simple/",
        "--results",
        str(results),
        "--nodelist",
        "node1",
        "--device",
        "cpu",
    ]

    def run(*extra: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "invoke", "-r", str(ROOT), *args, *extra],
            capture_output=True,
            text=True,
            timeout=300,
            env=env,
            cwd=submit_dir,  # srun's working directory: the nodes must not put their scratch here
        )

    dry = run("--dry-run")
    assert dry.returncode == 0, output(dry)
    assert PASSWORD not in output(dry) and f"{USER}:***@127.0.0.1" in output(dry)
    assert f"# apexkit fleet: {TARGET} from http://{USER}:***@127.0.0.1" in dry.stdout
    assert not results.exists()

    submitted = run()
    assert submitted.returncode == 0, output(submitted)
    assert PASSWORD not in output(submitted)
    job = json.loads((results / "fleet.json").read_text())["submissions"][0]["job_id"]
    _wait_for(lambda: _job_done(cluster, job), "the job to end", cluster, timeout=300)

    row = json.loads((results / "node1.json").read_text())
    stages = {s["stage"]: s["ok"] for s in row["stages"]}
    # the node read index.json and pip downloaded the wheel through the login; torch 0.0.1 exists nowhere
    assert stages["read index"] and stages["download wheel"] and stages["wheel sha256"], row
    assert row["first_failure"]["check"] == "install torch"
    paths = {path for path, _ in login_index.requests}
    assert {"/idx/index.json", "/idx/simple/apex/", "/idx/simple/torch/"} <= paths
    assert all(ok for path, ok in login_index.requests if path == "/idx/index.json")

    private = results / ".fleet" / "private"
    secret_file = private / f"credentials-{1}.json"
    assert stat.S_IMODE(private.stat().st_mode) == 0o700
    assert stat.S_IMODE(secret_file.stat().st_mode) == 0o600
    leaked = [
        str(p.relative_to(results))
        for p in results.rglob("*")
        if p.is_file() and p != secret_file and PASSWORD.encode() in p.read_bytes()
    ]
    assert leaked == [], (
        leaked
    )  # fleet.json, plan-1.json, submit-1.sbatch, the node's log and result: clean
    assert (results / ".fleet" / "logs").glob("node1.*.log")
    # the node scratch went to the node's $TMPDIR, not into the shared submit directory
    assert list(submit_dir.iterdir()) == []
    assert (node_tmp / "apexkit-fleet").is_dir() and not any((node_tmp / "apexkit-fleet").iterdir())


@pytest.mark.slurm
def test_fleet_venv_installs_into_the_training_venv_once_and_keeps_torch(cluster, runner, tmp_path):
    """fleet.submit --venv: apexkit up's way on every node. Two nodes share one training venv (as on shared storage):
    the wheel goes in once, --no-deps, torch untouched; node2's hand-installed broken torch is its own finding; a venv
    without torch is refused before anything is installed."""
    import services

    built = runner.nox("3.11", "--no-smoke-test")
    assert built.returncode == 0, output(built)[-3000:]
    index = tmp_path / "index"
    published = invoke("publish", "--dist", str(runner.dist), "--index", str(index))
    assert published.returncode == 0, output(published)
    filename = json.loads((index / "index.json").read_text())["files"][0]["filename"]
    train = services.make_torch_venv(tmp_path / "train")
    py = str(train / "bin" / "python")

    def versions() -> dict:
        got = subprocess.run(
            [
                py,
                "-c",
                "import importlib.metadata as m, json; "
                "print(json.dumps({n: m.version(n) for n in ('torch', 'apex')}))",
            ],
            capture_output=True,
            text=True,
        )
        return json.loads(got.stdout) if got.returncode == 0 else {}

    def submit(results: Path, venv: Path, nodes: str) -> dict:
        proc = invoke(
            "fleet.submit",
            "--index",
            str(index),
            "--results",
            str(results),
            "--nodelist",
            nodes,
            "--device",
            "cpu",
            "--venv",
            str(venv),
            "--node-dir",
            str(tmp_path / "scratch"),
            env=cluster.env,
        )
        assert proc.returncode == 0, output(proc)
        job = json.loads((results / "fleet.json").read_text())["submissions"][0]["job_id"]
        _wait_for(lambda: _job_done(cluster, job), "the job to end", cluster, timeout=300)
        report = invoke("fleet.report", str(results), "--json", env=cluster.env)
        return {r["node"]: r for r in json.loads(report.stdout)["nodes"]}

    script = invoke(
        "fleet.submit",
        "--index",
        str(index),
        "--results",
        str(tmp_path / "dry"),
        "--nodes",
        "2",
        "--device",
        "cpu",
        "--venv",
        str(train),
        "--dry-run",
    )
    assert script.returncode == 0 and f"into the training venv {train}" in script.stdout, output(
        script
    )

    rows = submit(tmp_path / "results", train, "node1,node2")
    assert rows["node1"]["status"] == "ok", rows["node1"]
    assert rows["node1"]["torch"] == services.TORCH
    assert rows["node2"]["status"] == "fail" and rows["node2"]["first_failure"]["check"] == "torch"
    stages = {
        node: {
            s["stage"]: s
            for s in json.loads((tmp_path / "results" / f"{node}.json").read_text())["stages"]
        }
        for node in ("node1", "node2")
    }
    assert all(s["training venv"]["ok"] and s["install wheel"]["ok"] for s in stages.values()), (
        stages
    )
    assert (
        "venv" not in stages["node1"] and "install torch" not in stages["node1"]
    )  # no fresh venv, no torch
    once = [n for n, s in stages.items() if "already installed" in s["install wheel"]["detail"]]
    assert len(once) == 1, stages  # one node installed it, the other found that very build there
    assert versions() == {"torch": services.TORCH, "apex": filename.split("-")[1]}
    assert not (train / ".apexkit-fleet-install.lock").exists()

    bare = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True)
    rows = submit(tmp_path / "results-bare", bare, "node1")
    failure = rows["node1"]["first_failure"]
    assert rows["node1"]["status"] == "fail" and failure["check"] == "training venv", rows
    assert "torch missing, not 2.13.0" in failure["detail"] and "--venv" in failure["fix"]
    assert not list(
        (bare / "lib").glob("python3*/site-packages/apex*")
    )  # nothing installed into it


# --- the shared training venv's install lock (bench/fleet_node.py, run here as a node runs it) -----------------------

# One node's install into the training venv argv[3] (argv[4]: the wheel), with LOCK_WAIT and STALE_AFTER set from
# argv[5:7]; prints the install stage as JSON.
NODE_INSTALL = """
import json, sys
from pathlib import Path
sys.path.insert(0, sys.argv[1])
import fleet_node
fleet_node.LOCK_WAIT, fleet_node.STALE_AFTER = float(sys.argv[5]), float(sys.argv[6])
node = fleet_node.Node({"results": sys.argv[2], "target": "t", "index": "i", "device": "cpu"})
if sys.argv[3].endswith("/python"):
    node.before = fleet_node.installed(sys.argv[3])
ok = node.install_into_training_venv(sys.argv[3], Path(sys.argv[4]))
print(json.dumps({"ok": ok, "stage": node.result["stages"][0]}))
"""
LOCK = ".apexkit-fleet-install.lock"


def _node_argv(tmp_path, py: Path, wheel: Path, wait: float, stale: float) -> list[str]:
    argv = [sys.executable, "-c", NODE_INSTALL, str(ROOT / "bench"), str(tmp_path / "results")]
    return [*argv, str(py), str(wheel), str(wait), str(stale)]


def _train_venv(tmp_path) -> tuple[Path, Path]:
    train = tmp_path / "train"
    subprocess.run([sys.executable, "-m", "venv", str(train)], check=True)
    (tmp_path / "built").mkdir()
    return train, fakes.make_wheel(tmp_path / "built")


def _run_node(tmp_path, train: Path, wheel: Path, wait: float, stale: float) -> tuple[dict, str]:
    argv = _node_argv(tmp_path, train / "bin" / "python", wheel, wait, stale)
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, output(proc)
    return json.loads(proc.stdout.splitlines()[-1]), proc.stdout


def test_a_node_killed_holding_the_install_lock_is_taken_over_at_once(tmp_path):
    import socket

    train, wheel = _train_venv(tmp_path)
    hang = (
        train / "bin" / "hang"
    )  # the node's "python": holds the lock while it hangs in its first probe
    hang.write_text(f"#!/bin/sh\ntouch {tmp_path / 'probing'}\nexec sleep 600\n")
    hang.chmod(0o755)
    argv = _node_argv(tmp_path, hang, wheel, 60, 120)
    holder = subprocess.Popen(argv, stdout=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 60
    while not (tmp_path / "probing").exists():
        assert holder.poll() is None and time.monotonic() < deadline, "the node never took the lock"
        time.sleep(0.1)
    recorded = train / LOCK / "holder"
    record = json.loads(recorded.read_text()) if recorded.is_file() else {}
    os.killpg(holder.pid, 9)  # SIGKILL: no cleanup runs
    holder.wait(30)
    assert (train / LOCK).is_dir()  # left behind
    # LOCK_WAIT 20 s: without the stale check this node waits it out and fails
    result, out = _run_node(tmp_path, train, wheel, 20, 120)
    assert result["ok"] and result["stage"]["stage"] == "install wheel", (result, out)
    line = next(x for x in out.splitlines() if x.startswith("taking over"))
    assert line.startswith(
        f"taking over the stale install lock {train / LOCK}: its holder (pid {holder.pid} on "
    )
    assert line.endswith(") is gone") and socket.gethostname() in line, line
    assert list((train / "lib").glob("python3*/site-packages/apex/__init__.py"))
    assert record["pid"] == holder.pid and record["host"] == socket.gethostname(), record
    assert (
        sorted(p.name for p in train.iterdir() if p.name.startswith(LOCK)) == []
    )  # nothing left behind


def test_another_hosts_install_lock_is_stale_only_when_its_holder_stops_touching_it(tmp_path):
    train, wheel = _train_venv(tmp_path)
    (train / LOCK).mkdir()
    record = train / LOCK / "holder"
    record.write_text(
        json.dumps({"host": "node-elsewhere", "pid": 4242, "started": "2026-12-04T10:00:00+00:00"})
    )
    # alive elsewhere: its heartbeat moves the record, so the lock is never taken, however long the wait
    stop = threading.Event()

    def beat() -> None:
        while not stop.wait(0.3):
            os.utime(record)

    beating = threading.Thread(target=beat)
    beating.start()
    try:
        result, out = _run_node(tmp_path, train, wheel, 5, 2)
    finally:
        stop.set()
        beating.join()
    assert not result["ok"] and "taking over" not in out, (result, out)
    assert (
        result["stage"]["detail"] == f"pid 4242 on node-elsewhere has held {train / LOCK} for 5 s"
    )
    assert json.loads(record.read_text())["pid"] == 4242
    # its heartbeat stopped (the node died): taken over once the record sat still for STALE_AFTER by our clock
    result, out = _run_node(tmp_path, train, wheel, 20, 2)
    assert result["ok"], (result, out)
    assert (
        f"taking over the stale install lock {train / LOCK}: its holder (pid 4242 on node-elsewhere, since "
        "2026-12-04T10:00:00+00:00) has not touched it for " in out
    ), out
    assert not (train / LOCK).exists()


def test_a_holder_with_our_hostname_in_another_pid_namespace_is_judged_by_its_heartbeat(tmp_path):
    """Hostile pass F6: a node in another pid namespace (a container sharing the hostname) held the lock; its pid
    means nothing here, so `kill(pid, 0)` must not declare it gone while it still touches its record."""
    train, wheel = _train_venv(tmp_path)
    (train / LOCK).mkdir()
    record = train / LOCK / "holder"
    host = socket.gethostname()
    dead = 4194000  # no process of ours has this pid (pid_max is 4194304 at most)
    where = f"{host} another-boot pid:[4026531836]"
    record.write_text(json.dumps({"host": host, "where": where, "pid": dead, "started": "now"}))
    stop = threading.Event()

    def beat() -> None:
        while not stop.wait(0.3):
            os.utime(record)

    beating = threading.Thread(target=beat)
    beating.start()
    try:
        result, out = _run_node(tmp_path, train, wheel, 5, 2)
    finally:
        stop.set()
        beating.join()
    assert not result["ok"] and "taking over" not in out, (result, out)
    assert json.loads(record.read_text())["pid"] == dead


def test_a_holder_whose_pid_a_live_process_reuses_is_taken_over_at_once(tmp_path):
    """Second hostile pass, finding 5: a holder here (this host, boot and pid namespace) killed long ago, its pid
    since given to another live process (a daemon): kill(pid, 0) succeeds, but the start time the record keeps
    (/proc/<pid>/stat field 22) is not that process's, so the lock is taken over at once with the usual line. The
    same record with that process's own start time is a live holder, and waited for."""
    train, wheel = _train_venv(tmp_path)
    where = subprocess.run(
        [sys.executable, "-c", "import sys; sys.path.insert(0, sys.argv[1]); import fleet_node; "
         "print(fleet_node.here())", str(ROOT / "bench")],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    daemon = subprocess.Popen(["sleep", "300"])
    try:
        started = int(Path(f"/proc/{daemon.pid}/stat").read_text().rpartition(")")[2].split()[19])
        (train / LOCK).mkdir()
        record = {"host": socket.gethostname(), "where": where, "pid": daemon.pid}
        record.update(started="2026-12-01T00:00:00Z", nonce="dead")
        for start, taken in ((started, False), (started - 100, True)):
            (train / LOCK / "holder").write_text(json.dumps({**record, "pid_start": start}))
            result, out = _run_node(tmp_path, train, wheel, 3, 120)
            assert result["ok"] is taken and ("taking over" in out) is taken, (result, out)
        line = next(x for x in out.splitlines() if x.startswith("taking over"))
        assert line == (
            f"taking over the stale install lock {train / LOCK}: its holder (pid {daemon.pid} on "
            f"{socket.gethostname()}, since 2026-12-01T00:00:00Z) is gone (pid {daemon.pid} is another "
            "process now)"
        )
        assert daemon.poll() is None and not (train / LOCK).exists()
    finally:
        daemon.kill()
        daemon.wait()
