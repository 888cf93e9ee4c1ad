"""`nox -s build-3.11 bench -- --offline --wheelhouse DIR` with the network off: the build (a wheel cache hit) and
the bench's run venv take everything from the wheelhouse, and the manifest records the sources (passwords masked) so
that a later `nox -s validate` uses them by itself. Real nox, real uv/pip, the real torch 2.13.0 CPU wheel.

"Network off": pip's configuration files are not read (PIP_CONFIG_FILE=/dev/null drops this machine's local indexes
and find-links), and every index pip or uv could fall back to (PIP_INDEX_URL, UV_DEFAULT_INDEX) is a server on
127.0.0.1 that answers 404 and records each request: an install that reads any index fails, and the test checks that
none was read."""

from __future__ import annotations

import http.server
import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import ClassVar

import pytest
from conftest import ROOT, Runner, output

TARGET = "py3.11-torch2.13.0-x86_64-master"
SECRET = "s3cretpw"  # in a URL given to the build: never in the manifest
BENCH_ARGS = "--device cpu --model mlp --modes fp32 --scale 0.05 --warmup 1 --repeats 1 --steps 1 --gemm-sizes 64"


class Recording(http.server.BaseHTTPRequestHandler):
    seen: ClassVar[list[str]] = []

    def do_GET(self) -> None:
        self.seen.append(self.path)
        self.send_error(404)

    do_HEAD = do_GET

    def log_message(self, *args) -> None:
        pass


@pytest.fixture(scope="module")
def no_network():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Recording)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/simple/", Recording.seen
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def wheelhouse(tmp_path_factory) -> Path:
    """torch 2.13.0 (+cpu, from this machine's disk) and its dependencies, as pip's configuration here serves them;
    no matplotlib, no pip: the run venv must do without."""
    house = tmp_path_factory.mktemp("wheelhouse")
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "-q", "torch==2.13.0", "-d", str(house)],
        check=True,
        timeout=600,
        capture_output=True,
    )
    assert any(house.glob("torch-2.13.0*.whl")) and not any(house.glob("matplotlib-*"))
    return house


def offline_env(runner: Runner, index: str, **more: str) -> dict[str, str]:
    env = runner.env(**more)
    for name in list(env):
        if name.lower().endswith("_proxy") or name.startswith(("PIP_", "UV_")):
            del env[name]
    env.update(
        PIP_CONFIG_FILE=os.devnull,
        PIP_INDEX_URL=index,
        PIP_DISABLE_PIP_VERSION_CHECK="1",
        UV_DEFAULT_INDEX=index,
        UV_INDEX_URL=index,
    )
    return env


def nox(env: dict[str, str], *sessions_and_args: str) -> subprocess.CompletedProcess:
    argv = [sys.executable, "-m", "nox", "-f", str(ROOT / "noxfile.py"), "-s", *sessions_and_args]
    return subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)


def test_build_and_bench_offline_from_a_wheelhouse_then_validate_uses_the_recorded_sources(
    repos, shared_cache, tmp_path, wheelhouse, no_network
):
    index, seen = no_network
    runner = Runner(repos, shared_cache, tmp_path)
    dirs = {
        "APEXKIT_DIST_DIR": str(runner.dist),
        "APEXKIT_BUILD_DIR": str(runner.build),
        "APEXKIT_REPORTS_DIR": str(tmp_path / "reports"),
    }
    # once online (this machine's local indexes): the git mirrors and the wheel cache are warm, as on a node that
    # built before it was cut off; reused when another test of the session built the same inputs
    first = runner.nox("3.11", "--no-smoke-test")  # the smoke test is not what this test is about
    assert first.returncode == 0, output(first)[-3000:]
    online = json.loads((runner.dist / TARGET / "manifest.json").read_text())
    assert online["package_sources"]["offline"] is False

    env = offline_env(runner, index, APEXKIT_BENCH_ARGS=BENCH_ARGS, **dirs)
    masked_extra = f"http://alice:{SECRET}@127.0.0.1:9/simple/"  # given, never read (offline)
    both = nox(
        env,
        "build-3.11",
        "bench",
        "--",
        "--offline",
        "--wheelhouse",
        str(wheelhouse),
        "--extra-index-url",
        masked_extra,
    )
    said = output(both)
    assert both.returncode == 0, said[-4000:]
    assert seen == [], f"an index was read: {seen[:5]}"

    text = (runner.dist / TARGET / "manifest.json").read_text()
    manifest = json.loads(text)
    assert manifest["cache_hit"] is True  # this run's sources, not those of the build it copied
    assert manifest["package_sources"] == {
        "index_url": None,
        "extra_index_urls": ["http://alice:***@127.0.0.1:9/simple/"],
        "torch_index_url": None,
        "wheelhouses": [str(wheelhouse.resolve())],
        "offline": True,
    }
    assert SECRET not in text and SECRET not in said

    report = json.loads((tmp_path / "reports" / TARGET / "bench" / "results.json").read_text())
    assert [r["mode"] for r in report["models"]["mlp"]["results"]] == ["fp32"]
    assert (
        report["png"] is None
        and not (tmp_path / "reports" / TARGET / "bench" / "results.png").exists()
    )
    # said once as the run venv is made, and once more in the bench's last lines, where the chart would be
    chart_lines = [line for line in said.splitlines() if "chart" in line and "matplotlib" in line]
    reported = [line for line in chart_lines if "report: no chart (" in line]
    assert len(chart_lines) == 2 and len(reported) == 1, chart_lines
    assert "no matplotlib wheel in the wheelhouse" in next(
        x for x in chart_lines if x not in reported
    )
    assert f"run venv for {TARGET} (offline, wheelhouse {wheelhouse.resolve()})" in said

    # validate with no sources options: the manifest's (offline, the wheelhouse) -- the same run venv, reused
    validate = nox(offline_env(runner, index, **dirs), "validate", "--", "--device", "cpu")
    assert validate.returncode == 0, output(validate)[-3000:]
    assert seen == [], f"an index was read: {seen[:5]}"
    result = json.loads((tmp_path / "reports" / TARGET / "validate.json").read_text())
    assert result["ok"] is True
    ran_in = Path(result["python"]).parent.parent
    assert (ran_in / ".apexkit-complete").is_file() and ran_in.parent.name == "run-venvs"
    assert "run venv for" not in output(validate)  # reused, not made again
    check = subprocess.run(
        [str(ran_in / "bin" / "python"), "-c", "import torch; print(torch.__version__)"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert check.stdout.strip() == "2.13.0+cpu"  # the wheelhouse's build
    assert not any(ran_in.glob("lib*/python*/site-packages/matplotlib-*.dist-info"))
