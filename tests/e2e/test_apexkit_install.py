"""`apexkit install` end to end: a real fixture build (the miss path, published with --publish-to), real venvs holding
the real torch 2.13.0 CPU wheel, the real pip of each venv, an index served over HTTP on 127.0.0.1 that asks for Basic
auth, reached through the real tinyproxy (Basic auth too), and a second index serving a decoy `apex` sdist whose
setup.py would leave a marker file.

One build for the module (the first test's miss); every other test installs the wheel it published. A wheel for a
second torch release would need torch 2.14.1 (554 MB, CUDA dependencies this machine does not hold) in a build venv:
that is left to the slow tier, see the module's last test."""

from __future__ import annotations

import base64
import functools
import hashlib
import http.server
import json
import os
import shutil
import subprocess
import sys
import threading
import urllib.parse
import zipfile
from pathlib import Path

import pytest
from conftest import ROOT, Runner, output

from apexkit import locks, pipconfig
from apexkit.errors import InterpreterNotFoundError
from apexkit.wheel import interpreters, uvtools

TORCH = "2.13.0+cpu"
TEAM_USER, TEAM_PASSWORD = "team", "p@ss:w/rd"  # reserved characters, percent-encoded in the URL
TEAM_USERINFO = "team:p%40ss%3Aw%2Frd"


# --- venvs --------------------------------------------------------------------------------------------------------


def _uv() -> str:
    found = uvtools.find()
    if found is None:
        pytest.skip("uv is not installed (pip install -r requirements/dev.txt brings it)")
    return found.binary


def _wheel_sources() -> list[str]:
    """Where this machine's pip finds torch and its dependencies (pip.conf / PIP_FIND_LINKS), as uv options."""
    conf = pipconfig.read(os.environ)
    args = ["--no-index"] if not (conf.get("index-url") or conf.get_list("extra-index-url")) else []
    if conf.get("index-url"):
        args += ["--index-url", conf["index-url"]]
    for url in conf.get_list("extra-index-url"):
        args += ["--extra-index-url", url]
    for links in conf.get_list("find-links"):
        args += ["--find-links", links]
    return args


def make_venv(path: Path, python: str = "3.11", *packages: str) -> Path:
    """A venv with pip (seeded) and `packages` (default: torch 2.13.0+cpu), installed by uv from the local wheels."""
    uv = _uv()
    try:
        base = interpreters.find(
            python
        ).path  # as a build finds python3.X (PATH, pyenv, /opt/python)
    except InterpreterNotFoundError as exc:
        pytest.skip(f"no Python {python} here: {exc.cause}")
    made = subprocess.run(
        [uv, "venv", "--seed", "-q", "--python", base, str(path)],
        capture_output=True,
        text=True,
        env={**os.environ, "UV_PYTHON_DOWNLOADS": "never"},
    )
    if made.returncode != 0:
        pytest.skip(f"no Python {python} for a venv here: {made.stderr.strip()[-200:]}")
    python_path = str(path / "bin" / "python")
    wanted = list(packages or (f"torch=={TORCH}",))
    installed = subprocess.run(
        [uv, "pip", "install", "-q", "--python", python_path, *_wheel_sources(), *wanted],
        capture_output=True,
        text=True,
        env={**os.environ, "UV_OFFLINE": "1"},
    )
    assert installed.returncode == 0, installed.stderr[-2000:]
    return path


def dists(venv: Path) -> dict[str, str]:
    """Every distribution of the venv, name -> version, as its own importlib.metadata reads it."""
    code = (
        "import json, importlib.metadata as m; "
        "print(json.dumps({d.metadata['Name']: d.version for d in m.distributions()}))"
    )
    proc = subprocess.run(
        [str(venv / "bin" / "python"), "-c", code], capture_output=True, text=True, check=True
    )
    return json.loads(proc.stdout)


def tree(venv: Path) -> dict[str, tuple[int, int, int]]:
    """(size, mtime, inode) of every file of the venv: 'the venv unchanged' without hashing torch's 700 MB."""
    found = {}
    for p in sorted(venv.rglob("*")):
        if p.is_file() and not p.is_symlink() and "__pycache__" not in p.parts:
            st = p.stat()
            found[str(p.relative_to(venv))] = (st.st_size, st.st_mtime_ns, st.st_ino)
    return found


# --- servers ------------------------------------------------------------------------------------------------------


class Served:
    def __init__(self, root: Path, auth: tuple[str, str] | None = None) -> None:
        self.root, self.requests = root, []
        expected = "Basic " + base64.b64encode(":".join(auth).encode()).decode() if auth else None
        served = self

        class Handler(http.server.SimpleHTTPRequestHandler):
            def do_GET(self):
                served.requests.append(self.path)
                if expected and self.headers.get("Authorization") != expected:
                    self.send_response(401)
                    self.send_header("WWW-Authenticate", 'Basic realm="team"')
                    self.end_headers()
                    return
                super().do_GET()

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(
            ("127.0.0.1", 0), functools.partial(Handler, directory=str(root))
        )
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def url(self, userinfo: str = "") -> str:
        return f"http://{userinfo + '@' if userinfo else ''}127.0.0.1:{self.port}/"

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def decoy_index(root: Path, marker: Path) -> Path:
    """A PyPI-like simple index holding an `apex` 0.9.10.dev0 sdist whose setup.py writes `marker` when run."""
    src = root / "build" / "apex-0.9.10.dev0"
    src.mkdir(parents=True)
    (src / "setup.py").write_text(
        f"import pathlib\npathlib.Path({str(marker)!r}).write_text('decoy setup.py ran')\n"
        "from setuptools import setup\nsetup(name='apex', version='0.9.10.dev0')\n"
    )
    (src / "PKG-INFO").write_text("Metadata-Version: 2.1\nName: apex\nVersion: 0.9.10.dev0\n")
    files = root / "simple" / "apex"
    files.mkdir(parents=True)
    archive = files / "apex-0.9.10.dev0.tar.gz"
    shutil.make_archive(str(archive)[: -len(".tar.gz")], "gztar", src.parent, src.name)
    digest = hashlib.sha256(archive.read_bytes()).hexdigest()
    (files / "index.html").write_text(
        f'<a href="apex-0.9.10.dev0.tar.gz#sha256={digest}">apex-0.9.10.dev0.tar.gz</a>\n'
    )
    (root / "simple" / "index.html").write_text('<a href="apex/">apex</a>\n')
    return root


def stub_wheel(tmp: Path, name: str, version: str) -> Path:
    """A tiny pure-Python wheel (a stand-in distribution for what a test needs installed)."""
    dist_info = f"{name}-{version}.dist-info"
    files = {
        f"{name}/__init__.py": f"__version__ = {version!r}\n",
        f"{dist_info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
        f"{dist_info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = "".join(
        f"{p},sha256={base64.urlsafe_b64encode(hashlib.sha256(t.encode()).digest()).rstrip(b'=').decode()},"
        f"{len(t.encode())}\n"
        for p, t in files.items()
    )
    path = tmp / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        for p, t in files.items():
            zf.writestr(p, t)
        zf.writestr(f"{dist_info}/RECORD", record + f"{dist_info}/RECORD,,\n")
    return path


# --- the module's one build --------------------------------------------------------------------------------------


class Team:
    def __init__(self, runner: Runner, tmp: Path) -> None:
        self.runner, self.tmp = runner, tmp
        self.index = tmp / "team-index"
        self.marker = tmp / "decoy-ran"

    def env(self, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in self.runner.env().items() if "proxy" not in k.lower()}
        env.update(
            APEXKIT_DIST_DIR=str(self.runner.dist),
            APEXKIT_BUILD_DIR=str(self.runner.build),
            APEXKIT_FETCH_RETRIES="1",
            APEXKIT_FETCH_BACKOFF="0.05",
            COLUMNS="200",
        )
        env.pop("VIRTUAL_ENV", None)
        env.update(extra)
        return env

    def install(self, *args: str, **env: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "apexkit", "install", *args],
            cwd=ROOT,
            env=self.env(**env),
            capture_output=True,
            text=True,
            timeout=900,
        )


@pytest.fixture(scope="module")
def team(repos, shared_cache, tmp_path_factory):
    """The miss path, once: a venv with torch 2.13.0, no index -> built, published to team-index/, installed. (The
    smoke test is test_build.py's: skipped here for the e2e tier's time.)"""
    tmp = tmp_path_factory.mktemp("install")
    t = Team(Runner(repos, shared_cache, tmp), tmp)
    t.venv = make_venv(tmp / "built-venv")
    t.before = dists(t.venv)
    t.first = t.install(
        "--venv",
        str(t.venv),
        "--publish-to",
        str(t.index),
        "--json",
        "--build-options",
        "--jobs 2 --no-smoke-test",
    )
    return t


@pytest.fixture(scope="module")
def servers(team, tmp_path_factory):
    """The team index behind its own Basic auth, and the decoy index, both on 127.0.0.1."""
    assert team.first.returncode == 0, output(team.first)[-3000:]
    decoy = Served(decoy_index(tmp_path_factory.mktemp("decoy"), team.marker))
    served = Served(team.index, auth=(TEAM_USER, TEAM_PASSWORD))
    yield served, decoy
    served.stop()
    decoy.stop()


def test_a_miss_is_built_for_the_venvs_torch_published_and_installed(team):
    assert team.first.returncode == 0, output(team.first)[-3000:]
    result = json.loads(team.first.stdout)
    assert set(result) == {
        "status",
        "wheel",
        "sha256",
        "source",
        "venv",
        "target",
        "torch",
        "torch_npu",
        "added",
    }
    assert result["status"] == "built-and-installed"
    assert result["source"] in ("built", "wheel cache")  # the session's shared cache may hold it
    assert result["added"] == []  # Ascend apex requires torch alone
    assert result["torch"] == TORCH and result["torch_npu"] is None
    assert result["wheel"].startswith("apex-0.1+ascend.torch2.13.0-cp311-cp311-")
    after = dists(team.venv)
    assert after["apex"] == "0.1+ascend.torch2.13.0"
    assert {
        k: v for k, v in after.items() if k != "apex"
    } == team.before  # torch and the rest untouched
    listing = json.loads((team.index / "index.json").read_text())
    published = [f for f in listing["files"] if f["filename"] == result["wheel"]]
    assert published and published[0]["sha256"] == result["sha256"]
    assert "building the wheel for Python 3.11" in team.first.stderr
    frozen = subprocess.run(
        [str(team.venv / "bin" / "python"), "-m", "pip", "freeze", "--all"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    # an index install, not `apex @ file:///tmp/...` (a temporary path gone once install ended)
    assert "apex==0.1+ascend.torch2.13.0" in frozen, frozen


def test_from_the_team_index_through_tinyproxy_the_decoy_never_runs(
    team, servers, tinyproxy, tmp_path
):
    served, decoy = servers
    venv = make_venv(tmp_path / "venv")
    before, served.requests[:], decoy.requests[:] = dists(venv), [], []
    mark = tinyproxy.log_size()
    proc = team.install(
        "--venv",
        str(venv),
        "--index",
        served.url(TEAM_USERINFO),
        "--index",
        decoy.url(),
        "--no-build",
        "--json",
        HTTP_PROXY=tinyproxy.url,
        http_proxy=tinyproxy.url,
    )
    assert proc.returncode == 0, output(proc)[-3000:]
    result = json.loads(proc.stdout)
    first = json.loads(team.first.stdout)
    assert result["status"] == "installed" and result["wheel"] == first["wheel"]
    assert result["sha256"] == first["sha256"] and result["torch"] == TORCH
    assert "***" in result["source"] and f"127.0.0.1:{served.port}" in result["source"]
    assert TEAM_PASSWORD not in output(proc) and "p%40ss" not in output(proc)
    assert tinyproxy.PASSWORD not in output(proc)
    after = dists(venv)
    assert (
        after.pop("apex") == "0.1+ascend.torch2.13.0" and after == before
    )  # torch 2.13.0+cpu untouched
    assert not team.marker.exists()  # the decoy's setup.py never ran
    assert not [p for p in decoy.requests if "/simple/" in p]  # pip never asked the decoy for apex
    assert any(first["wheel"] in urllib.parse.unquote(p) for p in served.requests)
    assert f"127.0.0.1:{served.port}" in tinyproxy.log_since(mark)  # through the proxy

    again = team.install(
        "--venv",
        str(venv),
        "--index",
        served.url(TEAM_USERINFO),
        "--json",
        HTTP_PROXY=tinyproxy.url,
        http_proxy=tinyproxy.url,
    )
    assert again.returncode == 0 and json.loads(again.stdout)["status"] == "already-installed", (
        output(again)
    )


def test_no_build_for_a_python_the_index_has_no_wheel_for(team, servers, tmp_path):
    served, _ = servers
    venv = make_venv(tmp_path / "venv310", "3.10", str(stub_wheel(tmp_path, "torch", "2.13.0")))
    before = tree(venv)
    proc = team.install("--venv", str(venv), "--index", served.url(TEAM_USERINFO), "--no-build")
    assert proc.returncode != 0, output(proc)
    error = [x for x in proc.stderr.splitlines() if x.startswith("error:")]
    assert len(error) == 1 and "no wheel fits" in error[0] and "cp310" in error[0], output(proc)
    assert "Traceback" not in output(proc)
    assert tree(venv) == before

    # an index out of reach: one line saying so, then (with --no-build) the miss; nothing changed
    import services

    closed = f"http://127.0.0.1:{services.free_port()}/"
    proc = team.install("--venv", str(venv), "--index", closed, "--no-build")
    assert proc.returncode != 0 and "Traceback" not in output(proc), output(proc)
    assert [x for x in proc.stderr.splitlines() if "cannot be read" in x], output(proc)
    assert [x for x in proc.stderr.splitlines() if x.startswith("error: no wheel fits")], output(
        proc
    )
    assert tree(venv) == before


def test_a_wheel_whose_sha256_does_not_match_is_refused(team, tmp_path):
    index = tmp_path / "tampered"
    shutil.copytree(team.index, index)
    wheel = next(index.glob("simple/apex/*.whl"))
    data = bytearray(wheel.read_bytes())
    data[len(data) // 2] ^= 0xFF  # same size, other bytes
    wheel.write_bytes(bytes(data))
    venv = make_venv(tmp_path / "venv")
    before = tree(venv)
    proc = team.install("--venv", str(venv), "--index", str(index), "--no-build")
    assert proc.returncode != 0, output(proc)
    error = [x for x in proc.stderr.splitlines() if x.startswith("error:")]
    assert len(error) == 1 and "refused" in error[0] and "nothing installed" in error[0], output(
        proc
    )
    assert tree(venv) == before

    # a foreign `apex` in the venv (PyPI's is an unrelated project): refused before anything is looked up
    subprocess.run(
        [
            str(venv / "bin" / "python"),
            "-m",
            "pip",
            "install",
            "-q",
            "--no-index",
            "--no-deps",
            str(stub_wheel(tmp_path, "apex", "0.9.10.dev0")),
        ],
        check=True,
    )
    before = tree(venv)
    proc = team.install("--venv", str(venv), "--index", str(team.index))
    assert proc.returncode != 0 and "pip uninstall apex" in proc.stderr, output(proc)
    assert "not an apexkit wheel" in proc.stderr and tree(venv) == before


def test_a_second_install_into_one_venv_at_once_is_refused(team, monkeypatch):
    from apexkit.install import run

    monkeypatch.setenv("APEXKIT_CACHE_DIR", team.env()["APEXKIT_CACHE_DIR"])
    before = tree(team.venv)
    with locks.hold(run._lock_path(str(team.venv / "bin" / "python")), "a test's install"):
        proc = team.install("--venv", str(team.venv), "--index", str(team.index))
    assert proc.returncode != 0, output(proc)
    assert f"another apexkit install into --venv {team.venv} is running" in proc.stderr
    assert tree(team.venv) == before


@pytest.mark.slow
def test_two_torch_releases_in_one_index_each_venv_gets_its_own(team, servers, tmp_path):
    """torch 2.14.1 (from the local PyPI mirror, with its CUDA dependencies) next to 2.13.0: a second real build."""
    second = team.runner.nox("3.11", "--torch", "2.14.1", "--jobs", "2")
    assert second.returncode == 0, output(second)[-3000:]
    published = subprocess.run(
        [
            sys.executable,
            "-m",
            "invoke",
            "publish",
            "--dist",
            str(team.runner.dist),
            "--index",
            str(team.index),
        ],
        cwd=ROOT,
        env=team.env(),
        capture_output=True,
        text=True,
    )
    assert published.returncode == 0, output(published)
    venv = make_venv(tmp_path / "venv")
    proc = team.install("--venv", str(venv), "--index", str(team.index), "--no-build", "--json")
    assert proc.returncode == 0, output(proc)
    assert json.loads(proc.stdout)["wheel"].startswith("apex-0.1+ascend.torch2.13.0-")
    assert dists(venv)["torch"] == TORCH
