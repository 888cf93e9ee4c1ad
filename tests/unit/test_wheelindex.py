"""The maintainers' index reader (tools/wheelindex.py) and the refresh on top of it against what a hostile or broken
index serves, on parsed bytes and local files (no network: the unit guard refuses sockets). The library's client
itself is tests/unit/test_client.py; Content-Range, size caps and the login's origin against real servers on
127.0.0.1 are in tests/e2e/test_refresh.py."""

from __future__ import annotations

import io
import json
import os
import threading
import zipfile
from pathlib import Path

import conftest
import pytest

from apexkit.errors import ConfigError, SourceError
from apexkit.index import client
from tools import refresh, wheelindex

DATA = conftest.DATA / "torch-npu-metadata"
X86 = "torch_npu-2.5.1-cp311-cp311-manylinux_2_28_x86_64.whl"
ARM = "torch_npu-2.5.1-cp311-cp311-manylinux_2_28_aarch64.whl"
REMOTE = "http://127.0.0.1:9/simple"


def json_page(*files: dict) -> bytes:
    return json.dumps({"meta": {"api-version": "1.1"}, "files": list(files)}).encode()


def no_network() -> client.Client:
    return client.Client(client.IndexSettings((REMOTE,), "test"), client.RetryPolicy(1, 0))


@pytest.mark.parametrize(
    "url",
    ["FILE://{secret}#", "file://{secret}", "File:{secret}", "ftp://127.0.0.1:1/w.whl", "data:,x"],
)
def test_a_remote_page_links_only_http_wheels(tmp_path, url):
    """M1: a FILE:/file: URL on an http page read a local file as .metadata; an ftp:// one connected where the page
    said. Now such a wheel is listed as refused, with its reason, and reading it touches nothing."""
    secret = tmp_path / "secret.txt"
    secret.write_text("Requires-Dist: torch==SECRET-FROM-LOCAL-FILE\n")
    link = url.format(secret=secret)
    body = json_page(
        {"filename": X86, "url": link, "core-metadata": True},
        {"filename": ARM, "url": "/files/" + ARM, "core-metadata": True},
    )
    wheels = wheelindex.parse_index_page(
        body, "application/vnd.pypi.simple.v1+json", REMOTE + "/torch-npu/", REMOTE
    )
    refused = {w.filename: w.refused for w in wheels}
    assert refused[ARM] == ""
    assert (
        refused[X86].startswith("refused: a ") and "only http(s) links are followed" in refused[X86]
    )
    with pytest.raises(wheelindex.NoMetadata, match="^refused: a "):
        wheelindex.read_metadata(no_network(), wheels[0])
    # the same URL in a WheelFile built by hand (not through the page) is refused as well
    bare = wheelindex.WheelFile(X86, link, "2.5.1", "x86_64", True, index=REMOTE)
    with pytest.raises(wheelindex.NoMetadata, match="^refused: "):
        wheelindex.read_metadata(no_network(), bare)


def test_the_html_page_refuses_the_same_links_and_skips_an_href_urllib_cannot_split():
    page = (
        f'<a href="FILE:///etc/passwd#{X86}">x</a><a href="http://[::1/{ARM}">y</a>'
        f'<a href="https://cdn.example/f/{ARM}" data-core-metadata="true">z</a>'
    ).encode()
    wheels = wheelindex.parse_index_page(page, "text/html", REMOTE + "/torch-npu/", REMOTE)
    assert [(w.url, bool(w.refused)) for w in wheels] == [(f"https://cdn.example/f/{ARM}", False)]


def local_index(tmp_path: Path, wheels: dict[str, bytes], href: str = "../../files/{name}") -> str:
    """A file:// index: <tmp>/idx/simple/torch-npu/index.html linking <tmp>/idx/files/<name>."""
    files = tmp_path / "idx" / "files"
    files.mkdir(parents=True)
    for name, data in wheels.items():
        (files / name).write_bytes(data)
    project = tmp_path / "idx" / "simple" / "torch-npu"
    project.mkdir(parents=True)
    links = "".join(f'<a href="{href.format(name=n)}">{n}</a>' for n in wheels)
    (project / "index.html").write_text(f"<html><body>{links}</body></html>")
    return (tmp_path / "idx" / "simple").as_uri()


def wheel_bytes(metadata: bytes, version: str = "2.5.1") -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr(f"torch_npu-{version}.dist-info/METADATA", metadata)
    return buffer.getvalue()


def test_a_file_index_links_files_inside_its_own_directory_only(tmp_path):
    metadata = b"Name: torch_npu\nVersion: 2.5.1\nRequires-Dist: torch==2.5.1\n"
    index = local_index(tmp_path, {ARM: wheel_bytes(metadata)})
    (tmp_path / "elsewhere").mkdir()
    outside = tmp_path / "elsewhere" / X86
    outside.write_bytes(wheel_bytes(b"Name: torch_npu\nVersion: 2.5.1\nRequires-Dist: torch==9\n"))
    (tmp_path / "idx" / "files" / X86).symlink_to(outside)  # a link out of the index
    page = tmp_path / "idx" / "simple" / "torch-npu" / "index.html"
    page.write_text(
        page.read_text().replace(
            "</body>", f'<a href="../../files/{X86}">l</a><a href="{outside.as_uri()}">o</a></body>'
        )
    )
    session = no_network()
    wheels = wheelindex.fetch_index(session, index)
    assert wheels is not None
    inside = [w for w in wheels if w.filename == ARM]
    assert [w.refused for w in inside] == [""]
    assert wheelindex.read_metadata(session, inside[0]) == (metadata, "local file")
    out = [w for w in wheels if w.filename == X86]
    assert [w.refused.startswith("refused: a file:// link out of the index") for w in out] == [
        True,
        True,
    ]
    for wheel in out:
        with pytest.raises(wheelindex.NoMetadata, match="out of the index"):
            wheelindex.read_metadata(session, wheel)


def test_a_file_index_page_that_is_a_named_pipe_is_one_line_not_a_hang(tmp_path):
    index = local_index(tmp_path, {})
    page = tmp_path / "idx" / "simple" / "torch-npu" / "index.html"
    page.unlink()
    os.mkfifo(page)
    with pytest.raises(SourceError, match="cannot read the index page .* is not a regular file"):
        wheelindex.fetch_index(no_network(), index)


def test_deep_json_is_one_line_not_a_recursion_error():
    body = b'{"files": ' + b"[" * 200_000
    with pytest.raises(SourceError, match="is not a PEP 691 simple index page"):
        wheelindex.parse_index_page(body, "application/json", REMOTE + "/torch-npu/", REMOTE)


def test_a_metadata_member_over_the_cap_is_refused_without_inflating_it(tmp_path):
    huge = b"Name: torch_npu\nVersion: 2.5.1\n" + b"X" * (wheelindex.METADATA_MAX + 10)
    index = local_index(tmp_path, {ARM: wheel_bytes(huge)})
    session = no_network()
    wheels = wheelindex.fetch_index(session, index) or []
    with pytest.raises(wheelindex.NoMetadata, match="METADATA member is larger than 1 MiB"):
        wheelindex.read_metadata(session, wheels[0])


# --- the refresh on top of it: M9, L1, L5 -------------------------------------------------------------------------


def test_torch_local_is_merged_per_arch():
    """M9: an index serving a release for aarch64 only (or an x86_64 wheel whose metadata failed) dropped the
    row's torch_local = { x86_64 = "cpu" }."""
    rows = {"2.5.1": {"torch_npu": "2.5.1", "cann": [], "torch_local": {"x86_64": "cpu"}}}
    aarch64_only = refresh.Release("2.5.1", ["aarch64"], {"aarch64": "torch==2.5.1"}, "2.5.1")
    [change] = refresh.plan(rows, [aarch64_only])
    assert (change.kind, change.local) == ("same", (("x86_64", "cpu"),))
    x86_failed = refresh.Release(
        "2.5.1.post1",
        ["aarch64", "x86_64"],
        {"aarch64": "torch==2.5.1"},
        "2.5.1",
        unread={"x86_64": f"{X86}: HTTP 500 for a range of the wheel"},
    )
    [change] = refresh.plan(rows, [x86_failed])
    assert (change.kind, change.new, change.local) == (
        "update",
        "2.5.1.post1",
        (("x86_64", "cpu"),),
    )
    # an arch that was read without a local pin loses its label
    read_plain = refresh.Release("2.5.1", ["x86_64"], {"x86_64": "torch==2.5.1"}, "2.5.1")
    [change] = refresh.plan(rows, [read_plain])
    assert (change.kind, change.local) == ("update", ())
    assert refresh.describe(change) == '~ "2.5.1": torch_local removed'


def test_metadata_that_names_another_project_or_version_is_a_skipped_wheel(tmp_path):
    """M9: a .metadata file's Name and Version were never compared with the wheel's."""
    wheels = {
        ARM: wheel_bytes(b"Name: torch_npu\nVersion: 2.5.1\nRequires-Dist: torch==2.5.1\n"),
        X86: wheel_bytes(b"Name: torch_npu\nVersion: 2.9.0\nRequires-Dist: torch==2.9.0+cpu\n"),
        "torch_npu-2.6.0-cp311-cp311-manylinux_2_28_x86_64.whl": wheel_bytes(
            b"Name: evil\nVersion: 2.6.0\nRequires-Dist: torch==2.6.0\n"
        ),
    }
    session = no_network()
    found = {
        w.filename: w for w in wheelindex.fetch_index(session, local_index(tmp_path, wheels)) or []
    }
    got = {name: refresh._read_one(session, wheel) for name, wheel in found.items()}
    assert got[X86] == "its metadata has Version '2.9.0', its file name 2.5.1"
    assert got["torch_npu-2.6.0-cp311-cp311-manylinux_2_28_x86_64.whl"] == (
        "its metadata names 'evil', not torch-npu"
    )
    meta, how = got[ARM]
    assert (meta.torch_version, how) == ("2.5.1", "local file")


def test_a_page_listing_thousands_of_releases_costs_at_most_max_releases_reads(tmp_path):
    """A page may list any number of versions: only the newest MAX_RELEASES are read, the rest are listed."""
    newest = "torch_npu-9.0.0-cp311-cp311-manylinux_2_28_aarch64.whl"
    metadata = b"Name: torch_npu\nVersion: 9.0.0\nRequires-Dist: torch==9.0.0\n"
    index = local_index(tmp_path, {newest: wheel_bytes(metadata, "9.0.0")})
    page = tmp_path / "idx" / "simple" / "torch-npu" / "index.html"
    missing = [f"torch_npu-3.{i}.0-cp311-cp311-manylinux_2_28_aarch64.whl" for i in range(250)]
    page.write_text(
        page.read_text().replace("</body>", "".join(f'<a href="{n}">n</a>' for n in missing))
    )
    settings = client.IndexSettings((index,), "test")
    result = refresh.survey(client.Client(settings), settings, workers=2)
    assert len(result.releases) == refresh.MAX_RELEASES
    beyond = result.ignored[f"beyond the newest {refresh.MAX_RELEASES}"]
    assert len(beyond) == 251 - refresh.MAX_RELEASES and "3.0.0" in beyond
    assert [r.version for r in result.releases if not r.skipped] == ["9.0.0"]
    assert "and 31 more" in refresh.report(result, [], Path("m.toml"))


def test_the_report_escapes_terminal_control_characters_from_the_index():
    """L1: versions, file names and Requires-Dist lines from the index were printed raw (a title change, a screen
    clear, a fake green "OK", an OSC 52 clipboard write)."""
    osc52 = "\x1b]52;c;ZWNobyBQV05FRA==\x07"
    releases = [
        refresh.Release(
            "2.5.1", ["x86_64"], {"x86_64": f"torch==2.5.1; python_version != '{osc52}'"}
        ),
        refresh.Release(
            "2.6.0", ["aarch64"], skipped="torch_npu-2.6.0-cp311-\x1b[32mOK_FAKE\x1b[0m-x.whl: no"
        ),
        refresh.Release(
            "2.7.1",
            ["aarch64", "x86_64"],
            {"aarch64": "torch==2.7.1"},
            "2.7.1",
            unread={"x86_64": "w.whl: its metadata names '\x1b[2J'"},
        ),
    ]
    survey = refresh.Survey(
        releases,
        {"not a PEP 440 version": ["2.9.9\x1b]0;PWNED_TITLE\x07\x1b[2J"]},
        {"http://i/simple": "3 torch-npu wheels\r"},
    )
    text = refresh.report(survey, refresh.plan({}, releases), Path("m.toml"))
    assert not [c for c in text if (ord(c) < 32 and c != "\n") or 0x7F <= ord(c) <= 0x9F], text
    assert "\\x1b]52;c;ZWNobyBQV05FRA==\\x07" in text and "OK_FAKE" in text
    assert "x86_64 not read (w.whl: its metadata names '\\x1b[2J'): its torch_local kept" in text


def test_refresh_of_a_matrix_that_is_a_named_pipe_is_one_line_not_a_hang(tmp_path):
    """L5: `refresh --matrix FIFO` blocked for ever in read_bytes."""
    fifo = tmp_path / "matrix.toml"
    os.mkfifo(fifo)
    outcome: list[BaseException | int] = []

    def run() -> None:
        try:
            outcome.append(refresh.main(["--matrix", str(fifo), "--index-url", REMOTE], env={}))
        except BaseException as exc:  # the test reads it below
            outcome.append(exc)

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(30)
    hung = worker.is_alive()
    if hung:  # free the reader, so the test ends either way
        with open(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK), "wb"):
            pass
        worker.join(5)
    assert not hung, "refresh --matrix FIFO blocked"
    [error] = outcome
    assert isinstance(error, ConfigError), error
    assert error.cause == f"cannot read {fifo}: it is a named pipe, not a regular file"


def test_the_index_sha256_of_a_wheel_is_kept_from_html_and_json_and_nothing_else_is():
    good = "ab" * 32
    name = "torch_npu-2.7.1-cp310-cp310-manylinux_2_28_aarch64.whl"
    page = (
        f'<a href="/files/{name}#sha256={good.upper()}">a</a>'
        f'<a href="/files/x/{name}#md5=abc">b</a><a href="/files/y/{name}#sha256=zz">c</a>'
    ).encode()
    wheels = wheelindex.parse_index_page(page, "text/html", REMOTE + "/torch-npu/", REMOTE)
    assert [w.sha256 for w in wheels] == [good, "", ""]
    assert all("#" not in w.url for w in wheels)
    body = json.dumps(
        {
            "files": [
                {"filename": name, "url": f"/f/{name}", "hashes": {"sha256": good}},
                {"filename": name, "url": f"/g/{name}", "hashes": ["not", "a", "dict"]},
            ]
        }
    ).encode()
    wheels = wheelindex.parse_index_page(body, "application/json", REMOTE + "/torch-npu/", REMOTE)
    assert [w.sha256 for w in wheels] == [good, ""]
