"""Issue 25 item 2 with real components: a fixture build published with `invoke publish`, served by a real HTTP server
on 127.0.0.1 -- through the real tinyproxy (Basic auth), and by a server that asks for Basic auth itself (a password
with reserved characters, percent-encoded in the URL) -- then a build of the same tuple with a second, empty
APEXKIT_CACHE_DIR: a cache hit from that index, no compile, the same sha256, no password anywhere. Faults: a closed
port, a wheel whose sha256 does not match, a provenance that names another wheel: one line each, then the compile,
nothing of the bad wheel published. The builder's side in-process: tests/unit/test_team_index_cache.py."""

from __future__ import annotations

import base64
import functools
import hashlib
import http.server
import json
import shutil
import subprocess
import sys
import threading
import urllib.parse
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import services
import wheelnames
from conftest import ROOT, Runner, output

TARGET = "py3.11-torch2.13.0-x86_64-master"
WHEEL = wheelnames.fixture_wheel()
USER = "builder"
PASSWORD = "p@ss/w:rd#?%1"  # every reserved character a URL parser trips on
ENCODED = "p%40ss%2Fw%3Ard%23%3F%251"
NO_PROXY = {"no_proxy": "", "NO_PROXY": "", "http_proxy": "", "HTTP_PROXY": ""}


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


class Served:
    """A directory served over HTTP on 127.0.0.1 (http.server in a thread), Basic auth asked when `auth` is given;
    `paths` lists what was requested."""

    def __init__(self, root: Path, auth: tuple[str, str] | None = None) -> None:
        self.paths: list[str] = []
        expected = (
            "Basic " + base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode() if auth else None
        )
        served = self

        class Handler(http.server.SimpleHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def do_GET(self) -> None:
                served.paths.append(self.path)
                if expected and self.headers.get("Authorization") != expected:
                    self.send_response(401)
                    self.send_header("WWW-Authenticate", 'Basic realm="team index"')
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                super().do_GET()

        self.server = http.server.ThreadingHTTPServer(
            ("127.0.0.1", 0), functools.partial(Handler, directory=str(root))
        )
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def published(repos, shared_cache, tmp_path_factory) -> Iterator[dict]:
    """One fixture build (the session's build venv), published with `invoke publish` into an index directory."""
    tmp = tmp_path_factory.mktemp("team-index")
    runner = Runner(repos, shared_cache, tmp / "first")
    built = runner.cli("3.11", "--no-smoke-test", "--no-team-index")
    assert built.returncode == 0, output(built)[-3000:]
    index = tmp / "index"
    argv = ["publish", "--dist", str(runner.dist), "--index", str(index)]
    proc = subprocess.run(
        [sys.executable, "-m", "invoke", "-r", str(ROOT), *argv],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, output(proc)
    manifest = json.loads((runner.dist / TARGET / "manifest.json").read_text())
    yield {
        "tmp": tmp,
        "index": index,
        "sha256": manifest["wheel"]["sha256"],
        "key": manifest["cache_key"],
        "entry": shared_cache / "wheels" / manifest["cache_key"][:2] / manifest["cache_key"],
    }


def _second_cache_build(repos, tmp: Path, name: str, *args: str, **env: str):
    """A build of the same tuple with a new, empty APEXKIT_CACHE_DIR: no build venv, no wheel cache."""
    runner = Runner(repos, tmp / name / "cache", tmp / name)
    return runner, runner.cli("3.11", "--no-smoke-test", *args, **env)


def _no_secret_anywhere(text: str, *folders: Path) -> None:
    for secret in (PASSWORD, ENCODED, services.TinyProxy.PASSWORD):
        assert secret not in text
        for folder in folders:
            for path in folder.rglob("*"):
                if path.is_file() and not path.is_symlink():
                    assert secret.encode() not in path.read_bytes(), path


def _hit(runner: Runner, proc, published: dict, shown: str) -> dict:
    text = output(proc)
    assert proc.returncode == 0, text[-3000:]
    assert f"✓ wheel cache hit from {shown}: {WHEEL} sha256 {published['sha256'][:12]}" in text
    assert "▸ compile" not in text and "▸ build venv" not in text
    manifest = json.loads((runner.dist / TARGET / "manifest.json").read_text())
    assert manifest["cache_hit"] is True and manifest["cache_source"] == shown
    assert "compile" not in manifest["durations_s"] and "team_index" in manifest["durations_s"]
    assert sha(runner.dist / TARGET / WHEEL) == published["sha256"]
    assert not (runner.cache / "venvs").exists()  # nothing was installed to compile with
    return manifest


def test_a_second_cache_gets_the_wheel_from_the_index_through_the_proxy(
    repos, published, tinyproxy
):
    served = Served(published["index"])
    try:
        url = f"http://127.0.0.1:{served.port}/"
        mark = tinyproxy.log_size()
        runner, proc = _second_cache_build(
            repos,
            published["tmp"],
            "proxied",
            APEXKIT_INDEX=url,
            **dict(NO_PROXY, http_proxy=tinyproxy.url, HTTP_PROXY=tinyproxy.url),
        )
        manifest = _hit(runner, proc, published, f"http://127.0.0.1:{served.port}")
        assert f"127.0.0.1:{served.port}/index.json" in tinyproxy.log_since(mark)  # via the proxy
        assert f"/simple/apex/{WHEEL}" in [urllib.parse.unquote(p) for p in served.paths]
        # kept in the second cache: the next build is a local hit, the index not asked again
        asked = len(served.paths)
        again = runner.cli("3.11", "--no-smoke-test", APEXKIT_INDEX=url, **NO_PROXY)
        assert again.returncode == 0 and "✓ wheel cache hit: " in output(again)
        assert (
            len(served.paths) == asked
            and sha(runner.dist / TARGET / WHEEL) == manifest["wheel"]["sha256"]
        )
        _no_secret_anywhere(output(proc) + output(again), runner.dist, runner.build, runner.cache)
    finally:
        served.stop()


def test_a_second_cache_gets_the_wheel_from_an_index_that_asks_for_a_login(repos, published):
    served = Served(published["index"], auth=(USER, PASSWORD))
    try:
        url = f"http://{USER}:{ENCODED}@127.0.0.1:{served.port}/"
        runner, proc = _second_cache_build(
            repos, published["tmp"], "login", "--team-index", url, **NO_PROXY
        )
        _hit(runner, proc, published, f"http://{USER}:***@127.0.0.1:{served.port}")
        _no_secret_anywhere(output(proc), runner.dist, runner.build, runner.cache)
        # the same password unencoded: refused by the URL check before anything runs, without echoing it
        bad = runner.cli(
            "3.11", "--team-index", f"http://{USER}:{PASSWORD}@127.0.0.1:{served.port}/"
        )
        assert bad.returncode == 2 and "percent-encode" in output(bad)
        assert [line for line in bad.stderr.splitlines() if line.startswith("error:")]
        _no_secret_anywhere(output(bad))
    finally:
        served.stop()


def _tampered(published: dict, name: str, how: str) -> Path:
    """A copy of the published index whose wheel (or provenance) is not what index.json says it is."""
    index = published["tmp"] / name
    shutil.copytree(published["index"], index)
    folder = index / "simple" / "apex"
    if (
        how == "wheel"
    ):  # other bytes under the wheel's name: a valid zip, not the one index.json hashes
        with zipfile.ZipFile(folder / WHEEL, "w") as zf:
            zf.writestr("apex/__init__.py", "print('not the build')\n")
    else:  # a provenance naming another wheel, its index.json record updated to match it
        prov = folder / f"{WHEEL}.provenance.json"
        doc = json.loads(prov.read_text())
        doc["subject"] = [{"name": WHEEL, "digest": {"sha256": "0" * 64}}]
        prov.write_text(json.dumps(doc))
        data = json.loads((index / "index.json").read_text())
        for entry in data["files"]:
            entry["attestations"]["provenance"]["sha256"] = sha(prov)
        (index / "index.json").write_text(json.dumps(data))
    return index


def test_an_unreachable_or_lying_index_is_one_line_each_then_the_compile(
    repos, published, shared_cache
):
    """Three indexes in turn (one build, one compile): a closed port, a wheel whose sha256 does not match, a
    provenance that names another wheel."""
    closed = services.free_port()  # nothing listens there
    indexes = [
        f"http://127.0.0.1:{closed}/",
        str(_tampered(published, "swapped", "wheel")),
        str(_tampered(published, "other-subject", "provenance")),
    ]
    shutil.rmtree(published["entry"])  # the session cache's local hit goes: a local miss again
    runner = Runner(repos, shared_cache, published["tmp"] / "faults")
    proc = runner.cli(
        "3.11",
        "--no-smoke-test",
        APEXKIT_INDEX=",".join(indexes),
        APEXKIT_FETCH_RETRIES="1",
        **NO_PROXY,
    )
    text = output(proc)
    assert proc.returncode == 0, text[-3000:]
    warnings = [line for line in text.splitlines() if line.startswith("! team index")]
    assert len(warnings) == 3, warnings
    for line, index, cause in zip(
        warnings,
        (f"http://127.0.0.1:{closed}", Path(indexes[1]).as_uri(), Path(indexes[2]).as_uri()),
        ("connection refused", "does not match the sha256", "has no subject"),
    ):
        assert f"team index {index}" in line and cause in line, line
    assert "refused" in warnings[1] and "asking the next index" in warnings[1]
    assert "refused" in warnings[2] and warnings[2].endswith("compiling")
    assert "▸ compile" in text and "wheel cache hit" not in text
    manifest = json.loads((runner.dist / TARGET / "manifest.json").read_text())
    assert manifest["cache_hit"] is False and "cache_source" not in manifest
    # what was published and cached is the wheel built here (reproducible: the good one), not an index's
    assert sha(runner.dist / TARGET / WHEEL) == published["sha256"]
    assert sha(published["entry"] / WHEEL) == published["sha256"]
    assert not list((runner.build / TARGET).glob("team-index*"))
