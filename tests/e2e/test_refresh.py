"""`nox -s refresh` (tools/refresh.py): torch-npu releases from a real package index served on 127.0.0.1
(http.server in a thread), built from real wheel metadata (tests/data/torch-npu-metadata/), as PEP 691 JSON, PEP 503
HTML with `.metadata` files, and HTML without them (the range-request path). The command runs as a subprocess:
`python -m tools.refresh`, what the session runs, with apexkit's one-line errors and exit codes (nox maps every
failure to 1), and once through nox itself."""

from __future__ import annotations

import base64
import datetime
import hashlib
import html
import http.server
import io
import json
import os
import re
import socket
import stat
import subprocess
import sys
import threading
import urllib.error
import zipfile
from pathlib import Path

import conftest
import pytest
from conftest import ROOT

from apexkit.errors import ConfigError, SourceError
from apexkit.index import client
from apexkit.wheel import sources
from tools import refresh, wheelindex

DATA = conftest.DATA / "torch-npu-metadata"
# listed on the index but never read: a pre-release and a release older than 2.1
PRIVATE_AUTH = "Basic " + base64.b64encode(b"reader:p@ss:word").decode()  # a private mirror's login
LISTED_ONLY = [
    "torch_npu-2.13.0rc1-cp311-cp311-manylinux_2_28_x86_64.whl",
    "torch_npu-2.0.1-cp39-cp39-manylinux_2_17_aarch64.manylinux2014_aarch64.whl",
]


def fake_wheel(filename: str, metadata: bytes) -> bytes:
    """A real zip shaped like the wheel: incompressible payload, many small members, and the dist-info with METADATA
    where wheel builders put it -- first (bdist_wheel, as in torch_npu's wheels: found in the central directory's first
    block), last (in the tail of the file), or, for one wheel, in the middle of a large central directory (neither:
    zipfile walks the directory through range requests)."""
    version = filename.split("-")[1]
    where = (
        "middle"
        if "2.7.1" in filename and "aarch64" in filename
        else "first"
        if "x86_64" in filename
        else "last"
    )
    payload = b"".join(hashlib.sha256(str(i).encode()).digest() for i in range(8192))  # 256 KiB
    headers = 1200 if where == "middle" else 300
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:

        def dist_info() -> None:
            archive.writestr(f"torch_npu-{version}.dist-info/METADATA", metadata)
            archive.writestr(f"torch_npu-{version}.dist-info/RECORD", "")

        if where == "first":
            dist_info()
        archive.writestr("torch_npu/_C.so", payload)
        for i in range(
            headers
        ):  # a central directory of some size, as real wheels have thousands of members
            archive.writestr(f"torch_npu/include/header_{i:04d}.h", f"// {i}\n")
            if where == "middle" and i == headers // 2:
                dist_info()
        if where == "last":
            dist_info()
    return buffer.getvalue()


class Index:
    """The files, and every request the server saw (path, Range header, Accept header)."""

    def __init__(self) -> None:
        self.metadata = {
            p.name[: -len(".METADATA")]: p.read_bytes() for p in sorted(DATA.glob("*.METADATA"))
        }
        self.wheels = {name: fake_wheel(name, data) for name, data in self.metadata.items()}
        self.requests: list[tuple[str, str, str]] = []
        self.lock = threading.Lock()

    def page(self, mode: str, base: str) -> tuple[bytes, str]:
        names = [*self.metadata, *LISTED_ONLY]
        if mode == "json":
            files = [
                {
                    "filename": n,
                    "url": f"{base}/files/{n}",
                    "hashes": {},
                    "core-metadata": (
                        {"sha256": hashlib.sha256(self.metadata[n]).hexdigest()}
                        if n in self.metadata
                        else False
                    ),
                }
                for n in names
            ]
            return json.dumps(
                {"meta": {"api-version": "1.1"}, "name": "torch-npu", "files": files}
            ).encode(), "application/vnd.pypi.simple.v1+json"
        if mode == "garbage-json":
            return b'{"files": [{"filename": ', "application/vnd.pypi.simple.v1+json"
        if mode == "garbage-html":
            return b"\x00\x01 this is not an index \xff", "application/octet-stream"
        links = []
        for n in names:
            attr = ""
            if mode == "html" and n in self.metadata:
                attr = (
                    f' data-core-metadata="sha256={hashlib.sha256(self.metadata[n]).hexdigest()}"'
                )
            links.append(
                f'<a href="/files/{html.escape(n)}#sha256=00"{attr}>{html.escape(n)}</a><br/>'
            )
        body = (
            "<!DOCTYPE html><html><body><h1>Links for torch-npu</h1>"
            + "\n".join(links)
            + "</body></html>"
        )
        return body.encode(), "text/html"


def make_handler(index: Index):
    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args) -> None:
            pass

        def send(
            self,
            code: int,
            body: bytes,
            content_type: str = "application/octet-stream",
            headers: dict[str, str] | None = None,
        ) -> None:
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            for key, value in (headers or {}).items():
                self.send_header(key, value)
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if "://" in path:  # absolute-form through a proxy
                path = "/" + path.split("://", 1)[1].split("/", 1)[1]
            with index.lock:
                index.requests.append(
                    (path, self.headers.get("Range", ""), self.headers.get("Accept", ""))
                )
            match = re.match(r"^/(?P<mode>[a-z-]+)/simple/torch-npu/$", path)
            if (
                match
                and match["mode"] == "private"
                and self.headers.get("Authorization") != PRIVATE_AUTH
            ):
                return self.send(
                    401, b"login first", "text/plain", {"WWW-Authenticate": 'Basic realm="index"'}
                )
            if match and match["mode"] != "missing":
                body, content_type = index.page(match["mode"], f"http://{self.headers['Host']}")
                return self.send(200, body, content_type)
            name = path.rsplit("/", 1)[-1]
            if (
                path.startswith("/files/")
                and name.endswith(".metadata")
                and name[:-9] in index.metadata
            ):
                return self.send(200, index.metadata[name[:-9]], "text/plain")
            if path.startswith("/files/") and name in index.wheels:
                return self.send_range(index.wheels[name])
            return self.send(404, b"not found", "text/plain")

        def send_range(self, data: bytes) -> None:
            spec = re.match(r"bytes=(\d*)-(\d*)$", self.headers.get("Range", ""))
            if not spec:
                return self.send(200, data)
            if spec[1] == "":
                start, end = max(0, len(data) - int(spec[2])), len(data) - 1
            else:
                start, end = (
                    int(spec[1]),
                    min(len(data) - 1, int(spec[2]) if spec[2] else len(data) - 1),
                )
            self.send(
                206,
                data[start : end + 1],
                headers={"Content-Range": f"bytes {start}-{end}/{len(data)}"},
            )

    return Handler


@pytest.fixture(scope="module")
def served():
    index = Index()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), make_handler(index))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    index.url = f"http://127.0.0.1:{server.server_address[1]}"
    yield index
    server.shutdown()
    server.server_close()


def aged_matrix(tmp_path: Path, source: Path = ROOT / "matrix.toml") -> Path:
    """A copy of the repository's matrix.toml as it was before the index had torch_npu 2.13.0 / 2.14.0 and
    2.7.1.post11 (whatever a later --write put in the real file)."""
    lines = []
    for line in source.read_text().splitlines(keepends=True):
        if re.match(r'^"2\.1[3-9]\.\d+" = \{ torch_npu', line):
            continue
        line = re.sub(r", torch_local = \{[^}]*\}", "", line)
        if line.startswith('"2.7.1" = { torch_npu'):
            line = re.sub(r'torch_npu = "[^"]+"', 'torch_npu = "2.7.1.post8"', line)
        if line.startswith("source = "):  # the provenance a --write adds
            line = re.sub(r'; torch_npu releases and their torch: package index [^"]*"', '"', line)
        lines.append(line)
    path = tmp_path / "matrix.toml"
    path.write_text("".join(lines))
    return path


def clean_env(**extra: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if "proxy" not in k.lower()
        and not k.startswith("PIP_INDEX")
        and not k.startswith("PIP_EXTRA")
    }
    env.update(APEXKIT_FETCH_RETRIES="2", APEXKIT_FETCH_BACKOFF="0.05", COLUMNS="200", **extra)
    return env


def run_refresh(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "tools.refresh", *args],
        cwd=ROOT,
        env=env or clean_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )


def versions_keys(text: str) -> list[str]:
    return list(refresh.matrix.tomllib.loads(text)["torch_npu"]["versions"])


def outside_torch_npu(text: str) -> tuple[str, str]:
    """Everything before [torch_npu] and from the table after [torch_npu.versions] on."""
    start = text.index("\n[torch_npu]\n")
    rows = text.index("\n[torch_npu.versions]\n")
    end = text.index("\n[", rows + 1)
    return text[:start], text[end:]


def test_the_difference_against_a_stale_table_is_printed_and_nothing_written(served, tmp_path):
    matrix = aged_matrix(tmp_path)
    before = matrix.read_bytes()
    proc = run_refresh("--matrix", str(matrix), "--index-url", f"{served.url}/json/simple")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert '+ "2.14.0" = { torch_npu = "2.14.0", cann = [] }   new: torch==2.14.0.*' in out
    assert '+ "2.13.0" = { torch_npu = "2.13.0", cann = [] }   new: torch==2.13.0.*' in out
    assert '~ "2.7.1": torch_npu 2.7.1.post8 -> 2.7.1.post11' in out
    assert "x86_64 wheels pin torch==2.1.0+cpu; pip refuses PyPI's plain torch 2.1.0" in out
    assert (
        "2.1.0.post17     aarch64: torch ==2.1.0; x86_64: torch (==2.1.0+cpu) aarch64 x86_64" in out
    )
    assert "ignored (pre-release): 2.13.0rc1" in out and "ignored (older than 2.1): 2.0.1" in out
    assert re.search(
        r'\? "2\.12\.0": torch_npu 2\.12\.0\S*: no release for torch 2\.12\.0 on the index \(row kept\)',
        out,
    )
    assert "nothing written; run again with --write" in out
    assert matrix.read_bytes() == before
    # PEP 691 JSON asked for, metadata from the .metadata files: not one byte of a wheel
    assert any(
        p == "/json/simple/torch-npu/" and "vnd.pypi.simple.v1+json" in a
        for p, _, a in served.requests
    )
    assert not [p for p, _, _ in served.requests if p.endswith(".whl")]
    assert "no wheel downloaded" in proc.stderr


def test_the_nox_session_runs_the_same_refresh(served, tmp_path):
    matrix = aged_matrix(tmp_path)
    before = matrix.read_bytes()
    session = [sys.executable, "-m", "nox", "-f", str(ROOT / "noxfile.py"), "-s", "refresh", "--"]
    proc = subprocess.run(
        [*session, "--matrix", str(matrix), "--index-url", f"{served.url}/json/simple"],
        cwd=ROOT,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert '~ "2.7.1": torch_npu 2.7.1.post8 -> 2.7.1.post11' in proc.stdout + proc.stderr
    assert matrix.read_bytes() == before


def test_write_keeps_comments_order_and_other_tables_and_a_second_run_changes_nothing(
    served, tmp_path
):
    matrix = aged_matrix(tmp_path)
    matrix.chmod(0o640)
    old = matrix.read_text()
    mark = len(served.requests)
    # HTML without .metadata files: each METADATA comes out of its wheel through range requests
    proc = run_refresh(
        "--matrix", str(matrix), "--index-url", f"{served.url}/range/simple", "--write"
    )
    assert proc.returncode == 0, proc.stderr
    new = matrix.read_text()
    assert stat.S_IMODE(matrix.stat().st_mode) == 0o640
    assert outside_torch_npu(new) == outside_torch_npu(old)
    comments = [line for line in old.splitlines() if line.lstrip().startswith("#")]
    assert [line for line in new.splitlines() if line in comments] == comments
    keys = versions_keys(new)
    assert keys[:2] == ["2.14.0", "2.13.0"] and keys[2:] == versions_keys(old)
    data = refresh.matrix.tomllib.loads(new)["torch_npu"]
    assert data["read"] == datetime.date.today().isoformat()
    assert "package index" in data["source"] and data["source"].startswith(
        "Ascend/pytorch COMPATIBILITY.md"
    )
    rows = data["versions"]
    old_rows = refresh.matrix.tomllib.loads(old)["torch_npu"]["versions"]
    assert rows["2.14.0"] == {"torch_npu": "2.14.0", "cann": []}
    assert rows["2.7.1"] == {
        **old_rows["2.7.1"],
        "torch_npu": "2.7.1.post11",
        "torch_local": {"x86_64": "cpu"},
    }
    assert rows["2.1.0"] == {**old_rows["2.1.0"], "torch_local": {"x86_64": "cpu"}}
    assert all(rows[k] == old_rows[k] for k in old_rows if k not in ("2.7.1", "2.1.0"))
    assert (
        f'"2.13.0" = {{ torch_npu = "2.13.0", cann = [] }}  # {refresh.CANN_COMMENT}'
        in new.splitlines()
    )
    wheel_gets = [(p, r) for p, r, _ in served.requests[mark:] if p.endswith(".whl")]
    assert wheel_gets and all(r.startswith("bytes=") for _, r in wheel_gets)
    assert not [p for p, _, _ in served.requests[mark:] if p.endswith(".metadata")]

    again = run_refresh(
        "--matrix", str(matrix), "--index-url", f"{served.url}/html/simple", "--write"
    )
    assert again.returncode == 0, again.stderr
    assert f"{matrix}: up to date with the index" in again.stdout
    assert matrix.read_text() == new


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def assert_one_line_error(
    proc: subprocess.CompletedProcess, *fragments: str, code: int = SourceError.exit_code
) -> None:
    assert proc.returncode == code, proc.stdout + proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in proc.stderr, proc.stderr
    for fragment in fragments:
        assert fragment in errors[0], errors[0]


def test_no_network_is_one_line_and_nothing_is_written(tmp_path):
    matrix = aged_matrix(tmp_path)
    before = matrix.read_bytes()
    url = f"http://127.0.0.1:{closed_port()}/simple"
    proc = run_refresh("--matrix", str(matrix), "--index-url", url, "--write")
    assert_one_line_error(
        proc,
        f"cannot reach {url}: connection refused",
        "python -m apexkit proxy.check",
        "--index-url",
    )
    assert matrix.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["matrix.toml"]  # no temp file left behind


def test_a_proxy_that_is_down_is_named(tmp_path):
    proxy_port = closed_port()
    proc = run_refresh(
        "--matrix",
        str(aged_matrix(tmp_path)),
        "--index-url",
        "http://127.0.0.1:9/simple",
        env=clean_env(HTTP_PROXY=f"http://127.0.0.1:{proxy_port}"),
    )
    assert_one_line_error(
        proc,
        f"cannot reach the proxy 127.0.0.1:{proxy_port} for http://127.0.0.1:9/simple: "
        "connection refused",
    )


def test_an_index_that_never_answers_times_out_in_one_line(tmp_path):
    with socket.socket() as listener:  # accepts connections (the kernel's backlog), never answers
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        url = f"http://127.0.0.1:{listener.getsockname()[1]}/simple"
        proc = run_refresh(
            "--matrix", str(aged_matrix(tmp_path)), "--index-url", url, "--timeout", "1"
        )
    assert_one_line_error(proc, f"cannot reach {url}: no answer within 1 s")


@pytest.mark.parametrize(
    ("mode", "fragment"),
    [
        ("garbage-json", "/garbage-json/simple/torch-npu/ is not a PEP 691 simple index page"),
        ("garbage-html", "/garbage-html/simple/torch-npu/ is not a simple index page"),
        ("missing", "no torch-npu wheels on"),
    ],
)
def test_a_broken_or_wrong_index_is_one_line(served, tmp_path, mode, fragment):
    matrix = aged_matrix(tmp_path)
    before = matrix.read_bytes()
    proc = run_refresh(
        "--matrix", str(matrix), "--index-url", f"{served.url}/{mode}/simple", "--write"
    )
    assert_one_line_error(proc, fragment, "--index-url")
    assert matrix.read_bytes() == before


def test_a_private_mirror_gets_the_credentials_of_its_url_and_they_are_never_printed(
    served, tmp_path
):
    matrix = aged_matrix(tmp_path)
    url = served.url.replace("http://", "http://reader:p%40ss%3Aword@") + "/private/simple"
    proc = run_refresh("--matrix", str(matrix), "--index-url", url, "--write")
    assert proc.returncode == 0, proc.stderr
    assert "p%40ss" not in proc.stdout + proc.stderr + matrix.read_text()
    assert f"package index {served.url}/private/simple (Requires-Dist)" in matrix.read_text()
    denied = run_refresh("--matrix", str(matrix), "--index-url", f"{served.url}/private/simple")
    assert_one_line_error(denied, f"{served.url}/private/simple/torch-npu/: HTTP 401")


def test_pip_config_gives_the_index_and_a_file_index_is_read_from_disk(served, tmp_path):
    """No --index-url: pip's index-url and extra-index-url (a file:// index with one wheel, one without torch-npu)."""
    files = tmp_path / "local" / "files"
    files.mkdir(parents=True)
    name = "torch_npu-2.14.0-cp310-cp310-manylinux_2_28_aarch64.whl"
    local_name = name.replace("cp310-cp310", "cp314-cp314")
    (files / local_name).write_bytes(served.wheels[name])
    project = tmp_path / "local" / "simple" / "torch-npu"
    project.mkdir(parents=True)
    (project / "index.html").write_text(
        f'<html><body><a href="../../files/{local_name}">{local_name}</a></body></html>'
    )
    (tmp_path / "empty" / "simple").mkdir(parents=True)
    conf = tmp_path / "pip.conf"
    conf.write_text(
        f"[global]\nindex-url = {served.url}/html/simple\n"
        f"extra-index-url = {(tmp_path / 'empty' / 'simple').as_uri()} "
        f"{(tmp_path / 'local' / 'simple').as_uri()}\n"
    )
    proc = run_refresh(
        "--matrix", str(aged_matrix(tmp_path)), env=clean_env(PIP_CONFIG_FILE=str(conf))
    )
    assert proc.returncode == 0, proc.stderr
    assert "(pip config index-url + extra-index-url)" in proc.stderr
    assert f"{(tmp_path / 'empty' / 'simple').as_uri()}: no torch-npu project" in proc.stdout
    assert f"{(tmp_path / 'local' / 'simple').as_uri()}: 1 torch-npu wheels" in proc.stdout
    assert '+ "2.14.0" = { torch_npu = "2.14.0", cann = [] }' in proc.stdout


def test_through_tinyproxy_the_proxy_log_shows_the_requests(served, tinyproxy, tmp_path):
    mark = tinyproxy.log_size()
    env = clean_env(HTTP_PROXY=tinyproxy.url)
    proc = run_refresh(
        "--matrix", str(aged_matrix(tmp_path)), "--index-url", f"{served.url}/html/simple", env=env
    )
    assert proc.returncode == 0, proc.stderr
    assert f"via proxy 127.0.0.1:{tinyproxy.port}" in proc.stderr
    assert tinyproxy.PASSWORD not in proc.stdout + proc.stderr
    seen = tinyproxy.log_since(mark)
    assert f"GET {served.url}/html/simple/torch-npu/" in seen
    assert re.search(
        rf"GET {re.escape(served.url)}/files/torch_npu-2\.14\.0-[^ ]+\.whl\.metadata", seen
    )
    assert '~ "2.7.1": torch_npu 2.7.1.post8 -> 2.7.1.post11' in proc.stdout

    # the same proxy with a wrong password: one line, no traceback
    wrong = tinyproxy.url.replace(tinyproxy.PASSWORD, "wrong-password")
    bad = run_refresh(
        "--matrix",
        str(aged_matrix(tmp_path)),
        "--index-url",
        f"{served.url}/html/simple",
        env=clean_env(HTTP_PROXY=wrong),
    )
    assert_one_line_error(
        bad,
        f"the proxy 127.0.0.1:{tinyproxy.port} refused the credentials (HTTP 401)",
        "python -m apexkit proxy.check",
    )
    assert "wrong-password" not in bad.stderr


# --- what a reviewer broke: odd matrix files, odd options ---------------------------------------------------------


def rows_text(matrix: Path) -> str:
    """The [torch_npu.versions] rows of `matrix` (header and body up to the next table)."""
    text = matrix.read_text()
    start = text.index("[torch_npu.versions]\n")
    return text[start : text.index("\n[", start + 1) + 1]


@pytest.mark.parametrize("layout", ["inline", "dotted"])
def test_write_refuses_a_versions_table_that_is_not_a_table_of_its_own(served, tmp_path, layout):
    """`versions = { ... }` or `versions."X" = ...` under [torch_npu]: valid TOML, but a new row (and its comment)
    cannot go in as a line of its own; refused in one line before anything is written."""
    matrix = aged_matrix(tmp_path)
    text = matrix.read_text()
    block = rows_text(matrix)
    rows = [line.split("  #")[0] for line in block.splitlines()[1:] if line.startswith('"')]
    new = (
        "versions = { " + ", ".join(rows) + " }\n"
        if layout == "inline"
        else "".join(f"versions.{row}\n" for row in rows)
    )
    matrix.write_text(text.replace("\n" + block, new))
    assert (
        refresh.matrix.tomllib.loads(matrix.read_text())["torch_npu"]["versions"]
        == refresh.matrix.tomllib.loads(text)["torch_npu"]["versions"]
    )
    before = matrix.read_bytes()
    proc = run_refresh(
        "--matrix", str(matrix), "--index-url", f"{served.url}/json/simple", "--write"
    )
    how = "an inline table" if layout == "inline" else "dotted keys"
    assert_one_line_error(
        proc,
        f"{matrix}: [torch_npu.versions] is written as {how}",
        "by hand",
        code=ConfigError.exit_code,
    )
    assert matrix.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["matrix.toml"]


def test_write_through_a_symlink_writes_its_target_and_keeps_the_link(served, tmp_path):
    target = aged_matrix(tmp_path)
    link = tmp_path / "link.toml"
    link.symlink_to(target.name)
    proc = run_refresh("--matrix", str(link), "--index-url", f"{served.url}/json/simple", "--write")
    assert proc.returncode == 0, proc.stderr
    assert link.is_symlink() and os.readlink(link) == target.name
    assert versions_keys(target.read_text())[:2] == ["2.14.0", "2.13.0"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link.toml", "matrix.toml"]


SCHEMES_HINT = "--index-url with an http://, https:// or file://"


@pytest.mark.parametrize(
    ("url", "fragment", "hint"),
    [
        ("notaurl", "--index-url notaurl is not a URL (no scheme)", SCHEMES_HINT),
        ("http://[::1", "--index-url http://[::1 is not a URL (Invalid IPv6 URL)", SCHEMES_HINT),
        ("ftp://x/simple", "--index-url ftp://x/simple is a ftp:// URL", SCHEMES_HINT),
        ("http:///simple", "--index-url http:///simple has no host name", SCHEMES_HINT),
        # a port that is no number is most often a password's unencoded reserved character (issue 40, F2)
        ("http://127.0.0.1:port/simple", "the port is not a number", "percent-encode"),
    ],
)
def test_an_index_url_that_is_not_an_http_or_file_url_is_one_line(tmp_path, url, fragment, hint):
    matrix = aged_matrix(tmp_path)
    proc = run_refresh("--matrix", str(matrix), "--index-url", url, "--write")
    assert_one_line_error(proc, fragment, hint, code=ConfigError.exit_code)
    assert "DNS" not in proc.stderr


@pytest.mark.parametrize("timeout", ["-1", "0", "nan", "inf", "soon"])
def test_a_timeout_that_is_not_a_positive_number_is_one_line(tmp_path, timeout):
    proc = run_refresh(
        "--matrix",
        str(aged_matrix(tmp_path)),
        "--index-url",
        "http://127.0.0.1:9/simple",
        "--timeout",
        timeout,
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if "error:" in line]
    assert errors == [
        f"nox -s refresh --: error: argument --timeout: {timeout!r} is not a positive number of "
        "seconds (e.g. --timeout 20)"
    ], proc.stderr


def test_a_value_urllib_refuses_is_a_config_error_not_a_traceback():
    """Client.open: the ValueErrors of urllib and the socket (here a timeout set through the API) -> one line."""
    settings = client.IndexSettings(
        (f"http://127.0.0.1:{closed_port()}/simple",), "test", timeout=-1.0
    )
    session = client.Client(settings, sources.RetryPolicy(attempts=1, backoff=0))
    with pytest.raises(ConfigError, match="cannot ask http://127.0.0.1:.*timeout"):
        session.open(settings.urls[0] + "/torch-npu/")
    with pytest.raises(ConfigError, match="cannot ask notaurl: unknown url type"):
        session.open("notaurl")
    with pytest.raises(ConfigError, match="not a positive number of seconds"):
        client.resolve_settings("http://i/simple", {}, timeout=float("nan"), pip_config={})


@pytest.mark.parametrize(
    ("content", "fragment"),
    [
        (b"\xff\xfe[torch_npu]\n", "is not UTF-8 text (byte 0: invalid start byte)"),
        (b"[torch_npu]\nversions = 3\n", "[torch_npu.versions] is 3, not a table"),
        (
            b'[torch_npu.versions]\n"2.1.0" = "2.1.0.post17"\n"2.13.0" = { torch_npu = "2.13.0", cann = [] }\n',
            '[torch_npu.versions] row "2.1.0" = "2.1.0.post17" is not a table with torch_npu',
        ),
        (
            b'[torch_npu.versions]\n"2.13.0" = { torch_npu = "2.13.0" }\n',
            '[torch_npu.versions] row "2.13.0" = {"torch_npu": "2.13.0"} is not a table',
        ),
    ],
)
def test_a_broken_matrix_file_is_one_line_naming_the_file_and_the_row(
    served, tmp_path, content, fragment
):
    matrix = tmp_path / "matrix.toml"
    matrix.write_bytes(content)
    proc = run_refresh(
        "--matrix", str(matrix), "--index-url", f"{served.url}/json/simple", "--write"
    )
    assert_one_line_error(proc, f"{matrix}", fragment, code=ConfigError.exit_code)
    assert matrix.read_bytes() == content


def test_write_keeps_crlf_line_endings(served, tmp_path):
    matrix = aged_matrix(tmp_path)
    lf = matrix.read_bytes()
    matrix.write_bytes(lf.replace(b"\n", b"\r\n"))
    proc = run_refresh(
        "--matrix", str(matrix), "--index-url", f"{served.url}/json/simple", "--write"
    )
    assert proc.returncode == 0, proc.stderr
    assert "changed while the index was read" not in proc.stderr
    new = matrix.read_bytes()
    assert new.count(b"\n") == new.count(b"\r\n") > lf.count(b"\n")
    text = new.decode().replace("\r\n", "\n")
    assert outside_torch_npu(text) == outside_torch_npu(lf.decode())
    assert versions_keys(text)[:2] == ["2.14.0", "2.13.0"] and versions_keys(text)[
        2:
    ] == versions_keys(lf.decode())
    again = run_refresh(
        "--matrix", str(matrix), "--index-url", f"{served.url}/json/simple", "--write"
    )
    assert again.returncode == 0 and f"{matrix}: up to date with the index" in again.stdout, (
        again.stderr
    )
    assert matrix.read_bytes() == new


def test_the_ca_bundle_is_pips_cert_else_the_first_ca_variable_and_pips_proxy_wins(tmp_path):
    """The index client reads the CA variables proxy.setup exports (netenv.CA_VARIABLES, in that order) and the
    proxy variables through netenv; pip's own cert and proxy options win, as in pip."""
    git_ca, ssl_ca, pip_ca = (tmp_path / f"{name}.pem" for name in ("git", "ssl", "pip"))
    for path in (git_ca, ssl_ca, pip_ca):
        path.write_text("")
    env = {
        "GIT_SSL_CAINFO": str(git_ca),
        "https_proxy": "http://lower:3128",
        "HTTPS_PROXY": "http://upper:3128",
    }
    settings = client.resolve_settings("http://i/simple", env, pip_config={})
    assert settings.cert == str(git_ca) and settings.proxies == {"https": "http://lower:3128"}
    settings = client.resolve_settings(
        "http://i/simple", {**env, "SSL_CERT_FILE": str(ssl_ca)}, pip_config={}
    )
    assert settings.cert == str(ssl_ca)
    settings = client.resolve_settings(
        "http://i/simple", env, pip_config={"cert": str(pip_ca), "proxy": "http://p:1"}
    )
    assert settings.cert == str(pip_ca) and settings.proxies == {
        "http": "http://p:1",
        "https": "http://p:1",
    }
    with pytest.raises(ConfigError, match=r"\(CURL_CA_BUNDLE\) does not exist"):
        client.resolve_settings(
            "http://i/simple", {"CURL_CA_BUNDLE": str(tmp_path / "gone.pem")}, pip_config={}
        )


# --- a hostile index (review 2026-12-01 M1, L1, L2): in-process, against real servers on 127.0.0.1 ----------------

HOSTILE_WHEEL = "torch_npu-2.5.1-cp311-cp311-manylinux_2_28_x86_64.whl"
GOOD = "torch_npu-2.7.1.post11-cp310-cp310-manylinux_2_28_aarch64.whl"


class Hostile(http.server.BaseHTTPRequestHandler):
    """/<mode>/...: what a hostile index answers. Every request is recorded on the server (path, Range, Authorization)."""

    protocol_version = "HTTP/1.0"  # a body without Content-Length ends with the connection

    def log_message(self, *args) -> None:
        pass

    def answer(self, code: int, body: bytes, headers: dict[str, str], length: bool = True) -> None:
        self.send_response(code)
        for key, value in headers.items():
            self.send_header(key, value)
        if length:
            self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        try:
            for at in range(0, len(body), 1 << 20):
                self.wfile.write(body[at : at + (1 << 20)])
        except (BrokenPipeError, ConnectionResetError):  # the client stopped reading at its cap
            pass

    def do_GET(self) -> None:
        server = self.server
        with server.lock:  # type: ignore[attr-defined]
            server.seen.append(  # type: ignore[attr-defined]
                (self.path, self.headers.get("Range", ""), self.headers.get("Authorization", ""))
            )
        mode, _, rest = self.path.lstrip("/").partition("/")
        lie = {
            "rangelie": "bytes 0-1/1000000",
            "rangehuge": "bytes 0-99999999999/100000000000",
            "rangeneg": "bytes 500-0/1000",
        }
        if mode in lie:
            return self.answer(206, b"PK" * 8192, {"Content-Range": lie[mode]})
        if mode == "redirect":  # to the ftp:// URL after it
            return self.answer(302, b"", {"Location": "ftp://" + rest.split("/", 1)[0] + "/w.whl"})
        if mode in ("bigmeta", "bigmeta-nolength") and rest.endswith(".metadata"):
            body = b"Name: torch_npu\nVersion: 2.5.1\n" + b"X" * (2 << 20)
            return self.answer(200, body, {}, length=mode == "bigmeta")
        if mode == "bigpage":
            body = b'{"files": [' + b" " * (33 << 20) + b"]}"
            return self.answer(200, body, {"Content-Type": "application/json"}, length=False)
        if mode == "files" and rest.endswith(".metadata"):
            name = rest[: -len(".metadata")]
            if (DATA / f"{name}.METADATA").is_file():
                return self.answer(200, (DATA / f"{name}.METADATA").read_bytes(), {})
        if rest == "simple/torch-npu/" and mode in server.pages:  # type: ignore[attr-defined]
            if mode == "auth" and self.headers.get("Authorization") != PRIVATE_AUTH:
                return self.answer(401, b"login first", {"WWW-Authenticate": "Basic"})
            body = server.pages[mode].encode()  # type: ignore[attr-defined]
            return self.answer(200, body, {"Content-Type": "application/vnd.pypi.simple.v1+json"})
        return self.answer(404, b"not found", {})


@pytest.fixture(scope="module")
def hostile():
    """Two servers on 127.0.0.1 (two ports: the login must not go from one to the other)."""
    servers = []
    for _ in range(2):
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Hostile)
        server.seen, server.lock, server.pages = [], threading.Lock(), {}
        server.url = f"http://127.0.0.1:{server.server_address[1]}"
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
    yield servers
    for server in servers:
        server.shutdown()
        server.server_close()


def quick_client(url: str) -> client.Client:
    return client.Client(client.IndexSettings((url,), "test"), sources.RetryPolicy(1, 0))


@pytest.mark.parametrize("mode", ["rangelie", "rangehuge", "rangeneg"])
def test_a_content_range_that_is_not_the_range_asked_is_a_skipped_wheel_after_one_request(
    hostile, mode
):
    """M1: `bytes 0-1/1000000` to every request cost 968 requests and a RecursionError; `bytes 0-99999999999/...` a
    read of 1e11 bytes (MemoryError); `bytes 500-0/1000` a ValueError traceback."""
    server = hostile[0]
    mark = len(server.seen)
    wheel = wheelindex.WheelFile(
        HOSTILE_WHEEL, f"{server.url}/{mode}/{HOSTILE_WHEEL}", "2.5.1", "x86_64", False
    )
    session = quick_client(server.url)
    with pytest.raises(wheelindex.NoMetadata, match=r"is bytes .*, not the range asked"):
        wheelindex.read_metadata(session, wheel)
    assert [r for _, r, _ in server.seen[mark:]] == [f"bytes=-{wheelindex.TAIL_BYTES}"]
    assert session.received <= 16384


def test_a_redirect_to_ftp_is_refused_without_connecting(hostile):
    """urllib follows a redirect to ftp:// (it connected where the index said); the client follows http(s) only."""
    server = hostile[0]
    with socket.socket() as ftp:
        ftp.bind(("127.0.0.1", 0))
        ftp.listen(1)
        ftp.setblocking(False)
        where = f"127.0.0.1:{ftp.getsockname()[1]}"
        wheel = wheelindex.WheelFile(
            HOSTILE_WHEEL,
            f"{server.url}/redirect/{where}/{HOSTILE_WHEEL}",
            "2.5.1",
            "x86_64",
            False,
        )
        with pytest.raises(wheelindex.NoMetadata, match=r"HTTP 302 .*not http\(s\)"):
            wheelindex.read_metadata(quick_client(server.url), wheel)
        with pytest.raises(BlockingIOError):
            ftp.accept()  # nobody connected


@pytest.mark.parametrize("mode", ["bigmeta", "bigmeta-nolength"])
def test_a_metadata_file_over_the_cap_is_refused_and_not_read_whole(hostile, mode):
    """M1: a 300 MB .metadata reached 3.6 GB of RSS. Refused by its Content-Length, or after 1 MiB + 1 byte."""
    server = hostile[0]
    wheel = wheelindex.WheelFile(
        HOSTILE_WHEEL, f"{server.url}/{mode}/{HOSTILE_WHEEL}", "2.5.1", "x86_64", True
    )
    session = quick_client(server.url)
    with pytest.raises(wheelindex.NoMetadata, match=r"\.metadata is larger than 1 MiB"):
        wheelindex.read_metadata(session, wheel)
    assert session.received == 0


def test_a_page_over_the_cap_is_one_line(hostile):
    """M1: a 300 MB page was read whole (657 MB). Now the reading stops after 32 MiB + 1 byte."""
    server = hostile[0]
    with pytest.raises(SourceError, match=r"/bigpage/simple/torch-npu/ is larger than 32 MiB"):
        wheelindex.fetch_index(quick_client(server.url), f"{server.url}/bigpage/simple")


def test_a_hostile_page_is_skipped_rows_with_reasons_and_nothing_reaches_the_terminal_raw(
    hostile, tmp_path, capsys
):
    """M1, L1, L2 through the command (in-process): a FILE: link to a local secret, an ftp:// link to a listening
    port, a version and a file name with terminal escapes, and a wheel on another port of the same host, from an
    index with a login. Each bad wheel is a skipped row with its reason; the secret is never read; nothing connects
    to the ftp port; the login goes to the index's port only; no control character reaches stdout."""
    index, other = hostile
    secret = tmp_path / "secret.txt"
    secret.write_text("Requires-Dist: torch==2.5.1; python_version != 'SECRET-FROM-LOCAL-FILE'\n")
    secret.chmod(0o600)
    ftp = socket.socket()
    ftp.bind(("127.0.0.1", 0))
    ftp.listen(1)
    ftp.setblocking(False)
    escape = "\x1b]0;PWNED_TITLE\x07\x1b[2J"
    files = [
        {"filename": HOSTILE_WHEEL, "url": f"FILE://{secret}#", "core-metadata": True},
        {
            "filename": HOSTILE_WHEEL.replace("x86_64", "aarch64"),
            "url": f"ftp://127.0.0.1:{ftp.getsockname()[1]}/w.whl",
        },
        {"filename": f"torch_npu-2.9.9{escape}-cp311-cp311-linux_x86_64.whl", "url": "/x.whl"},
        {"filename": GOOD, "url": f"{other.url}/files/{GOOD}", "core-metadata": True},
        {
            "filename": GOOD.replace("aarch64", "x86_64"),
            "url": f"/files/{GOOD.replace('aarch64', 'x86_64')}",
            "core-metadata": True,
        },
    ]
    index.pages["auth"] = json.dumps({"meta": {"api-version": "1.1"}, "files": files})
    matrix = tmp_path / "matrix.toml"
    matrix.write_text(
        '[torch_npu]\nread = "x"\n\n[torch_npu.versions]\n'
        '"2.7.1" = { torch_npu = "2.7.1.post8", cann = [] }\n'
        '"2.5.1" = { torch_npu = "2.5.1", cann = [], torch_local = { x86_64 = "cpu" } }\n'
    )
    url = index.url.replace("http://", "http://reader:p%40ss%3Aword@") + "/auth/simple"
    mark_index, mark_other = len(index.seen), len(other.seen)
    assert refresh.main(["--matrix", str(matrix), "--index-url", url], env=clean_env()) == 0
    out = capsys.readouterr().out
    assert "SECRET" not in out and "\x1b" not in out and "\x07" not in out
    assert "ignored (not a PEP 440 version): 2.9.9\\x1b]0;PWNED_TITLE\\x07\\x1b[2J" in out
    assert re.search(
        r"2\.5\.1 +SKIPPED: torch_npu-2\.5\.1-\S+: refused: a (file|ftp): link on an http", out
    )
    assert re.search(
        r"aarch64 not read either \(torch_npu-2\.5\.1-\S+: refused: a (file|ftp): link", out
    )
    assert (
        "file: link on an http(s) index page" in out and "ftp: link on an http(s) index page" in out
    )
    assert '? "2.5.1": torch_npu 2.5.1: the metadata of 2.5.1 could not be read (row kept)' in out
    assert '~ "2.7.1": torch_npu 2.7.1.post8 -> 2.7.1.post11' in out
    with pytest.raises(BlockingIOError):
        ftp.accept()  # nobody connected
    ftp.close()
    # the login went to the index's port (its page and its .metadata) and not to the other port
    auths = {path: auth for path, _, auth in index.seen[mark_index:]}
    assert auths["/auth/simple/torch-npu/"] == PRIVATE_AUTH
    assert auths[f"/files/{GOOD.replace('aarch64', 'x86_64')}.metadata"] == PRIVATE_AUTH
    assert [(p, a) for p, _, a in other.seen[mark_other:]] == [(f"/files/{GOOD}.metadata", "")]


def test_remote_make_client_sends_each_index_login_to_that_index_only(hostile):
    """apexkit.index.remote builds its Client from index URLs with user:password@ and relies on the login going as
    Basic auth to that index (and, since L2, to its scheme, host and port only)."""
    from apexkit.index import remote

    index, other = hostile
    index.pages.setdefault("auth", json.dumps({"meta": {"api-version": "1.1"}, "files": []}))
    login = index.url.replace("http://", "http://reader:p%40ss%3Aword@") + "/auth/simple"
    session = remote.make_client([login, f"{other.url}/open/simple"], clean_env())
    with session.open(f"{index.url}/auth/simple/torch-npu/") as response:
        assert response.status == 200
    mark = len(other.seen)
    with pytest.raises(urllib.error.HTTPError):
        session.open(f"{other.url}/auth/simple/torch-npu/")
    assert [auth for _, _, auth in other.seen[mark:]] == [""]
