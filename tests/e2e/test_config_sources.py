"""Sources configured once (apexkit.config) and probed (apexkit.proxy.sources), against real servers on 127.0.0.1:
an http.server holding a package index, a dumb-http git repository and a /v2/ registry root; a closed port; the
tinyproxy fixture in between; and a build --dry-run whose only source settings are a project apexkit.toml."""

from __future__ import annotations

import functools
import http.server
import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from conftest import ROOT
from services import free_port

from apexkit import config
from apexkit.proxy import sources

GIT_ENV = {"GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull}


@pytest.fixture
def server(tmp_path, repos):
    """A real HTTP server on 127.0.0.1: /simple/torch/ (an index page), /ascend.git (dumb http), /v2/ (a registry
    root answering 200)."""
    site = tmp_path / "site"
    (site / "simple" / "torch").mkdir(parents=True)
    (site / "simple" / "index.html").write_text('<a href="torch/">torch</a>\n')
    (site / "simple" / "torch" / "index.html").write_text("<html></html>\n")
    (site / "v2").mkdir()
    (site / "v2" / "index.html").write_text("{}\n")
    env = dict(os.environ, **GIT_ENV)
    subprocess.run(
        ["git", "clone", "-q", "--bare", repos.ascend_url, str(site / "ascend.git")],
        check=True,
        env=env,
    )
    subprocess.run(
        ["git", "-C", str(site / "ascend.git"), "update-server-info"], check=True, env=env
    )
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(site))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def apexkit(cwd: Path, home: Path, *args: str, **extra: str) -> subprocess.CompletedProcess:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("APEXKIT_", "PIP_"))
        and k.lower() not in ("http_proxy", "https_proxy", "no_proxy")
    }
    env.update(
        HOME=str(home),
        XDG_CONFIG_HOME=str(home / ".config"),
        PYTHONPATH=str(ROOT),
        **GIT_ENV,
        **extra,
    )
    return subprocess.run(
        [sys.executable, "-m", "apexkit", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def project(tmp_path: Path, text: str) -> tuple[Path, Path]:
    cwd, home = tmp_path / "work", tmp_path / "home"
    cwd.mkdir()
    home.mkdir()
    (cwd / "apexkit.toml").write_text(text)
    os.chmod(cwd / "apexkit.toml", 0o600)
    return cwd, home


def rows(proc: subprocess.CompletedProcess) -> dict[str, dict]:
    return {r["name"]: r for r in json.loads(proc.stdout) if r["area"] == "sources"}


def test_each_configured_source_is_probed_one_row_each_with_the_fix(tmp_path, server):
    closed = f"127.0.0.1:{free_port()}"
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    cwd, home = project(
        tmp_path,
        f'ascend_apex_url = "http://{server}/ascend.git"\n'
        f'nvidia_apex_url = "http://{closed}/nvidia.git"\n'
        f'index_url = "http://{server}/simple/"\n'
        f'torch_index_url = "http://{closed}/simple/"\n'
        f'quay_registry = "{server}/quay"\n'
        f'docker_registry = "{closed}"\n'
        f'wheelhouses = ["{wheels}", "{tmp_path / "missing"}"]\n',
    )
    start = time.monotonic()
    proc = apexkit(cwd, home, "proxy.check", "--layers", "sources", "--json")
    took = time.monotonic() - start
    assert proc.returncode == 0, (
        proc.stderr
    )  # an unreachable source warns: a cached build may not need it
    found = rows(proc)
    assert {k: v["status"] for k, v in found.items()} == {
        "ascend_apex_url": "ok",
        "nvidia_apex_url": "warn",
        "index_url": "ok",
        "torch_index_url": "warn",
        "wheelhouses": "warn",
        "quay_registry": "ok",
        "docker_registry": "warn",
        "defaults": "skip",
    }, found
    assert (
        "HEAD " in found["ascend_apex_url"]["detail"] and "HTTP 200" in found["index_url"]["detail"]
    )
    assert f"GET http://{server}/v2/" in found["quay_registry"]["detail"]
    assert "APEXKIT_NVIDIA_APEX_URL" in found["nvidia_apex_url"]["fix"]
    assert f"project {cwd / 'apexkit.toml'}" in found["index_url"]["data"]["origin"]
    assert "debian_mirror" in found["defaults"]["detail"]
    assert took < 20, took  # parallel, each with a short timeout


def test_doctor_probes_through_the_proxy(tmp_path, server, tinyproxy):
    cwd, home = project(
        tmp_path,
        f'index_url = "http://{server}/simple/torch/"\nascend_apex_url = "http://{server}/ascend.git"\n',
    )
    mark = tinyproxy.log_size()
    proc = apexkit(
        cwd,
        home,
        "proxy.check",
        "--layers",
        "sources",
        "--json",
        http_proxy=tinyproxy.url,
        https_proxy=tinyproxy.url,
    )
    found = rows(proc)
    assert found["index_url"]["status"] == "ok", found
    assert f"via 127.0.0.1:{tinyproxy.port}" in found["index_url"]["detail"]
    assert found["ascend_apex_url"]["status"] == "ok", found
    seen = tinyproxy.log_since(mark)
    assert "/simple/torch/" in seen and "ascend.git" in seen, seen
    assert tinyproxy.PASSWORD not in proc.stdout + proc.stderr


def test_a_dry_run_build_takes_its_sources_from_the_project_file(tmp_path, repos, shared_cache):
    cwd, home = project(
        tmp_path,
        f'ascend_apex_url = "{repos.ascend_url}"\nnvidia_apex_url = "{repos.nvidia_url}"\n',
    )
    python = f"{sys.version_info[0]}.{sys.version_info[1]}"
    proc = apexkit(
        cwd,
        home,
        "build",
        python,
        "--dry-run",
        "--dist",
        str(tmp_path / "dist"),
        "--build-dir",
        str(tmp_path / "build"),
        APEXKIT_CACHE_DIR=str(shared_cache),
    )
    said = proc.stdout + proc.stderr
    assert proc.returncode == 0, said[-3000:]
    assert repos.ascend_url in said and repos.nvidia_url in said
    assert f"ascend_apex_url from project {cwd / 'apexkit.toml'}" in " ".join(said.split())
    assert "gitcode.com" not in said and "github.com/NVIDIA" not in said


def test_a_bad_config_file_stops_the_build_in_one_line(tmp_path):
    cwd, home = project(tmp_path, 'ascend_apex = "file:///x.git"\n')
    proc = apexkit(cwd, home, "build", "3.11", "--dry-run")
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert proc.returncode == 2 and len(errors) == 1, proc.stderr
    assert "did you mean ascend_apex_url?" in errors[0] and "Traceback" not in proc.stderr


def test_a_source_that_never_answers_is_bounded_by_the_total():
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)  # accepts, never answers
        port = listener.getsockname()[1]
        value = config.Value(
            "index_url", f"http://127.0.0.1:{port}/simple/", config.PROJECT, "/p/apexkit.toml"
        )
        start = time.monotonic()
        rows = sources.probe_all([value], None, total=0.3)
        assert time.monotonic() - start < 1.0
    assert [(r.name, r.status) for r in rows] == [("index_url", "warn")]
    assert "no answer within" in rows[0].detail
    assert "PIP_INDEX_URL" in rows[0].fix


def test_proxy_setup_write_config_records_the_pip_mirror_in_the_user_file(fsroot):
    """proxy.setup --pip-index URL --write-config: pip's mirror also lands in the user config file (0600: the URL may
    hold a password), which config.show then reports; --dry-run shows the masked diff and writes nothing."""
    home = fsroot / "home" / "alice"
    env = {k: v for k, v in os.environ.items() if k not in ("XDG_CONFIG_HOME", "PIP_INDEX_URL")}
    env["HOME"] = "/home/alice"

    def setup(*args: str) -> subprocess.CompletedProcess:
        argv = [
            sys.executable,
            "-m",
            "apexkit",
            "proxy.setup",
            "--layers",
            "pip",
            "--root",
            str(fsroot),
        ]
        return subprocess.run(
            [*argv, "--write-config", *args],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )

    done = setup("--pip-index", "http://127.0.0.1:9/simple/")
    assert done.returncode == 0, done.stderr[-2000:]
    written = home / ".config" / "apexkit" / "config.toml"
    assert (written.stat().st_mode & 0o777) == 0o600
    assert config.read_file(written, "user")["index_url"] == "http://127.0.0.1:9/simple/"
    shown = subprocess.run(
        [sys.executable, "-m", "apexkit", "config.show", "--json"],
        cwd=ROOT,
        env={**env, "XDG_CONFIG_HOME": str(home / ".config")},
        capture_output=True,
        text=True,
        timeout=60,
    )
    rows = (
        {r["key"]: r for r in json.loads(shown.stdout)["settings"]} if shown.returncode == 0 else {}
    )
    assert rows["index_url"]["value"] == "http://127.0.0.1:9/simple/", shown.stdout + shown.stderr
    assert rows["index_url"]["origin"].startswith("user ")
    before = written.read_bytes()
    dry = setup("--pip-index", "http://u:sekret@127.0.0.1:9/other/", "--dry-run")
    assert dry.returncode == 0 and "u:***@127.0.0.1:9/other/" in dry.stderr
    assert "sekret" not in dry.stdout + dry.stderr and written.read_bytes() == before
    refused = setup()  # nothing to record
    assert (
        refused.returncode != 0
        and "--pip-index" in refused.stderr
        and written.read_bytes() == before
    )
