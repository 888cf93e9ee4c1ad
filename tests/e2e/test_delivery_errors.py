"""Issue 40 items 5 and 8 (review 2026-12-04 F1, F3, L2, L3) with real components: a real HTTPS team index on
127.0.0.1 whose certificate a self-signed CA made here signs (openssl), a real server that answers 401, real venvs
and `apexkit install` / `apexkit build` as a user runs them. Without the CA, or with credentials refused, install and
the build stop with one line saying the fix (never a quiet compile); with the CA they read the index; with
APEXKIT_TEAM_INDEX_FALLBACK=1 install goes on to build. A project ./apexkit.toml's team index is named in install's
output; a deeply nested one is one line naming the file."""

from __future__ import annotations

import functools
import http.server
import json
import os
import shutil
import ssl
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from conftest import ROOT, Runner, output

from .test_apexkit_install import make_venv, stub_wheel, tree

PASSWORD = "Wr0ngPa55"
NO_PROXY = {
    "no_proxy": "",
    "NO_PROXY": "",
    "http_proxy": "",
    "HTTP_PROXY": "",
    "https_proxy": "",
    "HTTPS_PROXY": "",
}


def _ca_and_cert(tmp: Path) -> tuple[Path, Path, Path]:
    """(ca.pem, server cert, server key): a self-signed CA, and a certificate for 127.0.0.1 it signs."""
    if shutil.which("openssl") is None:
        pytest.skip("no openssl here")

    def run(*argv: str) -> None:
        subprocess.run(["openssl", *argv], cwd=tmp, check=True, capture_output=True)

    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=apexkit test CA",
        "-keyout", "ca.key", "-out", "ca.pem")  # fmt: skip
    run("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=127.0.0.1", "-keyout", "server.key",
        "-out", "server.csr")  # fmt: skip
    (tmp / "san.ext").write_text("subjectAltName=IP:127.0.0.1\n")
    run("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
        "-days", "2", "-extfile", "san.ext", "-out", "server.pem")  # fmt: skip
    return tmp / "ca.pem", tmp / "server.pem", tmp / "server.key"


class Index:
    """An empty apexkit index (index.json with no files) served on 127.0.0.1: over HTTPS with `cert`, or answering
    401 to every request when `deny`."""

    def __init__(
        self,
        root: Path,
        cert: tuple[Path, Path] | None = None,
        deny: bool = False,
        redirect: str = "",
    ):
        root.mkdir(parents=True, exist_ok=True)
        (root / "index.json").write_text(json.dumps({"format": "apexkit-index/1", "files": []}))

        class Handler(http.server.SimpleHTTPRequestHandler):
            def do_GET(self) -> None:
                if redirect:  # every path to the same path there
                    self.send_response(302)
                    self.send_header("Location", redirect.rstrip("/") + self.path)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                if deny:
                    self.send_response(401)
                    self.send_header("WWW-Authenticate", 'Basic realm="team"')
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                super().do_GET()

            def log_message(self, *args) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(
            ("127.0.0.1", 0), functools.partial(Handler, directory=str(root))
        )
        if cert:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(*cert)
            self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
        self.port = self.server.server_address[1]
        self.scheme = "https" if cert else "http"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def url(self, userinfo: str = "") -> str:
        return f"{self.scheme}://{userinfo + '@' if userinfo else ''}127.0.0.1:{self.port}/"

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def tls(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("tls")
    ca, cert, key = _ca_and_cert(tmp)
    index = Index(tmp / "index", cert=(cert, key))
    yield index, ca
    index.stop()


@pytest.fixture(scope="module")
def denying(tmp_path_factory):
    index = Index(tmp_path_factory.mktemp("denying"), deny=True)
    yield index
    index.stop()


@pytest.fixture(scope="module")
def venv(tmp_path_factory):
    """A Python 3.11 venv with a stand-in torch 2.13.0 (what install looks up by)."""
    tmp = tmp_path_factory.mktemp("venv")
    return make_venv(tmp / "venv", "3.11", str(stub_wheel(tmp, "torch", "2.13.0")))


def install(venv: Path, *args: str, cwd: Path = ROOT, **env: str) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "APEXKIT_INDEX")}
    environ.update(
        NO_PROXY, APEXKIT_FETCH_RETRIES="1", APEXKIT_FETCH_BACKOFF="0.05", COLUMNS="300", **env
    )
    environ["PYTHONPATH"] = str(ROOT)
    return subprocess.run(
        [sys.executable, "-m", "apexkit", "install", "--venv", str(venv), "--dry-run", *args],
        cwd=cwd,
        env=environ,
        capture_output=True,
        text=True,
        timeout=600,
    )


def _errors(proc: subprocess.CompletedProcess) -> list[str]:
    return [line for line in proc.stderr.splitlines() if line.startswith("error:")]


def test_install_stops_on_an_https_index_without_its_ca_and_says_how_to_give_it(tls, venv):
    index, ca = tls
    before = tree(venv)
    proc = install(venv, "--index", index.url())
    text = output(proc)
    assert proc.returncode == 4, text
    errors = _errors(proc)
    assert len(errors) == 1 and "TLS certificate verification failed" in errors[0], text
    assert "PIP_CERT" in errors[0] and "cert" in errors[0], errors
    assert "would build" not in text and "Traceback" not in text
    assert tree(venv) == before
    # with the CA given the way the hint says: the index is read (empty: a miss, the dry run would build)
    given = install(venv, "--index", index.url(), PIP_CERT=str(ca))
    assert given.returncode == 0 and "would build" in output(given), output(given)
    # asked to fall back: one warning line with the fix, then the build it would do
    fallback = install(venv, "--index", index.url(), APEXKIT_TEAM_INDEX_FALLBACK="1")
    assert fallback.returncode == 0 and "would build" in output(fallback), output(fallback)
    assert [x for x in fallback.stderr.splitlines() if "PIP_CERT" in x and x.startswith("!")]


def test_install_says_credentials_refused_and_where_they_came_from(denying, venv):
    proc = install(venv, "--index", denying.url())
    errors = _errors(proc)
    assert proc.returncode == 4 and len(errors) == 1, output(proc)
    assert f"credentials refused by http://127.0.0.1:{denying.port}/" in errors[0]
    assert "HTTP 401" in errors[0] and "no user:password@" in errors[0], errors
    proc = install(venv, "--index", denying.url(f"team:{PASSWORD}"))
    errors = _errors(proc)
    assert proc.returncode == 4 and len(errors) == 1, output(proc)
    assert f"credentials refused by http://team:***@127.0.0.1:{denying.port}/" in errors[0], errors
    assert "user:password@ of its URL was sent" in errors[0]
    assert PASSWORD not in output(proc)


def test_a_401_after_a_redirect_names_where_it_came_from_not_the_login_sent(
    denying, venv, tmp_path
):
    """Hostile pass F10: the index redirected to another port, which answered 401; the error named the first URL
    and said its password was sent, though the login is never forwarded past a redirect."""
    moved = Index(tmp_path / "moved", redirect=denying.url())
    try:
        proc = install(venv, "--index", moved.url(f"team:{PASSWORD}"))
    finally:
        moved.stop()
    errors = _errors(proc)
    assert proc.returncode == 4 and len(errors) == 1, output(proc)
    assert f"credentials refused by http://127.0.0.1:{denying.port}/index.json" in errors[0], errors
    assert f"redirected from http://team:***@127.0.0.1:{moved.port}/" in errors[0], errors
    assert "is not sent there" in errors[0] and PASSWORD not in output(proc)


def test_an_unencoded_password_in_install_index_is_refused_naming_index(venv):
    proc = install(venv, "--index", "http://tuser:t@k:en/#%@127.0.0.1/")
    errors = _errors(proc)
    assert proc.returncode == 2 and len(errors) == 1, output(proc)
    assert (
        errors[0].startswith("error: --index http://127.0.0.1: ") and "percent-encode" in errors[0]
    )
    for leak in ("t@k", "k:en", "tuser", "--index-url"):
        assert leak not in output(proc), leak


def test_a_project_files_team_index_is_named_in_installs_output(venv, tmp_path):
    """L2: a cloned repository's ./apexkit.toml redirecting install said nothing of the file."""
    index = tmp_path / "their-index"
    index.mkdir()
    (index / "index.json").write_text(json.dumps({"format": "apexkit-index/1", "files": []}))
    project = tmp_path / "clone"
    project.mkdir()
    (project / "apexkit.toml").write_text(f'team_indexes = ["{index}"]\n')
    proc = install(venv, cwd=project)
    assert proc.returncode == 0, output(proc)
    named = [
        x for x in proc.stderr.splitlines() if f"(from project {project / 'apexkit.toml'})" in x
    ]
    assert named and str(index) in named[0], output(proc)


def test_a_deeply_nested_project_file_is_one_line_naming_it(venv, tmp_path):
    """L3: `team_indexes = [[[…30000…]]]` (60 KB) was `RecursionError … this is an apexkit bug`."""
    (tmp_path / "apexkit.toml").write_text("team_indexes = " + "[" * 30000 + "]" * 30000 + "\n")
    proc = install(venv, cwd=tmp_path)
    errors = _errors(proc)
    assert proc.returncode == 2 and len(errors) == 1, output(proc)
    assert str(tmp_path / "apexkit.toml") in errors[0] and "nested too deeply" in errors[0]
    assert "apexkit bug" not in output(proc) and "Traceback" not in output(proc)


def test_the_build_stops_on_an_https_team_index_without_its_ca(repos, shared_cache, tls, tmp_path):
    """F1: the build said `✓ ask the team index: no wheel for cache key` and compiled."""
    index, _ca = tls
    runner = Runner(repos, shared_cache / "never-hit", tmp_path)
    proc = runner.cli("3.11", "--no-smoke-test", "--team-index", index.url(), **NO_PROXY)
    text = output(proc)
    assert proc.returncode == 4, text[-3000:]
    errors = _errors(proc)
    assert len(errors) == 1 and "TLS certificate verification failed" in errors[0], text[-3000:]
    assert "PIP_CERT" in errors[0] and "--team-index-fallback" not in errors[0]
    assert "▸ compile" not in text and "no wheel for cache key" not in text
