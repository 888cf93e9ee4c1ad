"""The pages publish writes for people and for pip beyond PEP 503 (apexkit.index.pages): the index.html grid, the
per-torch find-links pages, PEP 658 metadata, coverage of matrix.toml, and what they make of hostile input.
In-process, on small apexkit-shaped wheels (tests/fakes.py publishable); a real pip and a real browser on them:
tests/e2e/test_index_job.py."""

from __future__ import annotations

import hashlib
import html.parser
import json
import zipfile
from pathlib import Path
from types import SimpleNamespace

import fakes
import pytest

from apexkit import untrusted
from apexkit.errors import ConfigError
from apexkit.index import pages, publish
from apexkit.plan import matrix
from tools import wheelindex


class Grid(html.parser.HTMLParser):
    """index.html's table as {(row header text, column header text): cell text}, and every tag seen."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[str] = []
        self.rows: list[list[str]] = []
        self._cell: list[str] | None = None
        self.links: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        if tag == "tr":
            self.rows.append([])
        if tag in ("td", "th") and self.rows:
            self._cell = []
        if tag == "a":
            self.links.append(dict(attrs).get("href") or "")

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self._cell is not None:
            self.rows[-1].append(" ".join("".join(self._cell).split()))
            self._cell = None

    def handle_data(self, data):
        if self._cell is not None:
            self._cell.append(data + " ")

    def cells(self) -> dict[tuple[str, str], str]:
        head, *body = self.rows
        return {(row[0], head[i]): text for row in body for i, text in enumerate(row) if i}


def grid(root: Path) -> Grid:
    parsed = Grid()
    parsed.feed((root / "index.html").read_text())
    return parsed


@pytest.fixture
def two(tmp_path) -> tuple[Path, list[Path]]:
    dist = tmp_path / "dist"
    wheels = [
        fakes.publishable(dist, torch="2.13.0"),
        fakes.publishable(dist, torch="2.12.0", requires_python=None),
    ]
    return dist, wheels


def member(wheel: Path, suffix: str) -> bytes:
    with zipfile.ZipFile(wheel) as zf:
        return zf.read(next(n for n in zf.namelist() if n.endswith(suffix)))


def test_the_grid_has_one_cell_per_wheel_with_its_links_and_install_lines(two, tmp_path, capsys):
    dist, wheels = two
    index = tmp_path / "index"
    publish.publish(dist, index, base_url="https://wheels.example.test/apex/")
    said = capsys.readouterr().err  # the log's install line is the served one, as on the page
    assert "apexkit install --index https://wheels.example.test/apex " in said
    assert f"apexkit install --index {index.resolve().as_uri()}" not in said
    cells = grid(index).cells()
    for wheel, torch in zip(wheels, ("2.13.0", "2.12.0")):
        row = next(r for r, c in cells if r.startswith(f"torch {torch} "))
        text = cells[(row, "Python 3.11 · x86_64")]
        digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
        assert wheel.name in text and digest[:12] in text
        assert "apexkit install --index https://wheels.example.test/apex" in text
        assert (
            f'pip install --no-deps "apex==0.1+ascend.torch{torch}" '
            "--index-url https://wheels.example.test/apex/simple/" in text
        )
        page = (index / "index.html").read_text()
        assert f'title="{digest}"' in page  # the full sha256 beside the short one
        links = grid(index).links
        for suffix in ("", ".cdx.json", ".provenance.json", ".metadata"):
            assert f"simple/apex/{wheel.name}{suffix}" in links
            assert (index / "simple" / "apex" / f"{wheel.name}{suffix}").is_file()
    assert "<script" not in (index / "index.html").read_text()  # no JavaScript


def test_the_grid_leaves_out_the_links_of_documents_a_wheel_has_not(tmp_path):
    dist = tmp_path / "dist"
    wheel = fakes.publishable(dist, attest=False)
    publish.publish(dist, tmp_path / "index")
    links = grid(tmp_path / "index").links
    assert f"simple/apex/{wheel.name}" in links
    assert f"simple/apex/{wheel.name}.cdx.json" not in links
    assert f"simple/apex/{wheel.name}.provenance.json" not in links
    assert (tmp_path / "index").as_uri() in (tmp_path / "index" / "index.html").read_text()


def test_torch_npu_wheels_get_their_own_row(tmp_path):
    dist = tmp_path / "dist"
    fakes.publishable(dist, python="3.10", torch="2.7.1", arch="aarch64", torch_npu="2.7.1.post2")
    fakes.publishable(dist, python="3.10", torch="2.7.1", arch="aarch64")
    publish.publish(dist, tmp_path / "index")
    cells = grid(tmp_path / "index").cells()
    npu = next(r for r, _ in cells if "torch_npu 2.7.1.post2" in r)
    plain = next(r for r, _ in cells if r.startswith("torch 2.7.1 torch_npu -"))
    assert "npu2.7.1.post2" in cells[(npu, "Python 3.10 · aarch64")]
    assert ".npu2" not in cells[(plain, "Python 3.10 · aarch64")]
    assert (
        "CANN 8.5.0" in npu
    )  # the matrix stack mindspeed-llm-2.3.0's CANN (its build recorded none)


def test_find_links_pages_one_per_torch(two, tmp_path):
    dist, wheels = two
    index = tmp_path / "index"
    publish.publish(dist, index)
    for wheel, torch in zip(wheels, ("2.13.0", "2.12.0")):
        page = (index / f"torch-{torch}.html").read_text()
        digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
        assert f'href="simple/apex/{wheel.name}#sha256={digest}"' in page
        other = wheels[1] if wheel is wheels[0] else wheels[0]
        assert other.name not in page
        assert f'href="torch-{torch}.html"' in (index / "index.html").read_text()


def test_metadata_files_and_the_simple_pages_attributes(two, tmp_path, monkeypatch):
    dist, wheels = two
    index = tmp_path / "index"
    publish.publish(dist, index)
    folder = index / "simple" / "apex"
    page = (folder / "index.html").read_text()
    data = json.loads((index / "index.json").read_text())
    for wheel in wheels:
        written = (folder / f"{wheel.name}.metadata").read_bytes()
        assert written == member(wheel, ".dist-info/METADATA")
        digest = hashlib.sha256(written).hexdigest()
        line = next(li for li in page.splitlines() if f'href="{wheel.name}#' in li)
        assert f'data-dist-info-metadata="sha256={digest}"' in line
        assert f'data-core-metadata="sha256={digest}"' in line
        assert ('data-requires-python="&gt;=3.8"' in line) == ("2.13.0" in wheel.name)
        entry = next(f for f in data["files"] if f["filename"] == wheel.name)
        assert entry["metadata"] == {"filename": f"{wheel.name}.metadata", "sha256": digest}
    # the maintainers' index reader (tools/wheelindex.py) takes the attributes (it reads torch-npu pages; the same
    # parser)
    monkeypatch.setattr(wheelindex, "PROJECT", "apex")
    read = wheelindex.parse_index_page(page.encode(), "text/html", folder.as_uri() + "/", "test")
    assert sorted(w.filename for w in read) == sorted(w.name for w in wheels)
    for w in read:
        digest = hashlib.sha256((folder / f"{w.filename}.metadata").read_bytes()).hexdigest()
        assert w.metadata == {"sha256": digest}


def test_published_wheels_get_their_metadata_again_on_the_next_publish(tmp_path):
    first, second = tmp_path / "one", tmp_path / "two"
    old = fakes.publishable(first, torch="2.12.0")
    new = fakes.publishable(second, torch="2.13.0")
    index = tmp_path / "index"
    publish.publish(first, index)
    (
        index / "simple" / "apex" / f"{old.name}.metadata"
    ).unlink()  # an index from before pages.py had none
    (index / "index.html").unlink()
    publish.publish(second, index)
    folder = index / "simple" / "apex"
    assert (folder / f"{old.name}.metadata").read_bytes() == member(old, ".dist-info/METADATA")
    assert (folder / f"{new.name}.metadata").is_file()
    assert (
        old.name in (index / "index.html").read_text()
        and new.name in (index / "index.html").read_text()
    )
    assert (index / "torch-2.12.0.html").is_file() and (index / "torch-2.13.0.html").is_file()


def test_republishing_over_the_pages_works_and_a_stray_file_is_still_refused(two, tmp_path):
    dist, _ = two
    index = tmp_path / "index"
    publish.publish(dist, index)
    before = sorted(p.relative_to(index) for p in index.rglob("*"))
    publish.publish(dist, index)  # its own index.html, torch-*.html and .metadata are its own
    assert sorted(p.relative_to(index) for p in index.rglob("*")) == before
    for stray in ("torch-9.9.9.html", "simple/apex/other.whl.metadata", "notes.html"):
        (index / stray).write_text("someone else's")
        with pytest.raises(ConfigError, match="not an apexkit index") as refused:
            publish.publish(dist, index)
        assert stray in str(refused.value)
        assert (index / stray).read_text() == "someone else's"
        (index / stray).unlink()


def test_the_dry_run_names_the_pages_it_rewrites(two, tmp_path, capsys):
    dist, _ = two
    index = tmp_path / "index"
    publish.publish(dist, index)
    publish.publish(dist, index, dry_run=True)
    said = " ".join(capsys.readouterr().err.split())
    assert "index.html" in said and "torch-2.13.0.html" in said
    assert "2 .metadata files (from the wheels)" in said


HOSTILE = '<script>alert(1)</script>"><img src=x onerror=alert(2)>'


def test_hostile_index_values_are_escaped(tmp_path):
    first, second = tmp_path / "one", tmp_path / "two"
    fakes.publishable(first, torch="2.12.0")
    fakes.publishable(second, torch="2.13.0")
    index = tmp_path / "index"
    publish.publish(first, index)
    data = json.loads((index / "index.json").read_text())
    data["files"][0]["target"] = (
        HOSTILE  # index.json is untrusted: someone else may have written it
    )
    (index / "index.json").write_text(json.dumps(data))
    publish.publish(second, index)  # the first wheel stays, read back from index.json
    page = (index / "index.html").read_text()
    assert "<script" not in page and "<img" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;&quot;&gt;&lt;img" in page


def test_a_hostile_wheel_filename_and_facts_are_escaped_everywhere(tmp_path):
    name = 'apex-0.1+ascend.torch2.13.0-cp311-cp311-linux_x86_64"><b>x.whl'
    assert untrusted.wheel_name(name) == name  # a wheel filename as far as packaging goes
    entry = SimpleNamespace(
        project="apex",
        filename=name,
        sha256="a" * 64,
        target=HOSTILE,
        torch="2.13.0",
        attestations=(),
        facts={"cann": HOSTILE, "torch_npu": '2.7.1"><i>'},
    )
    meta = pages.Metadata(name + ".metadata", "b" * 64, '>=3.8"><u>')
    page = pages.grid_page(tmp_path, [entry], {name: meta}, "https://h.example.test", [], [])
    links = pages.simple_page("t", [(name, name, meta)])
    for text in (page, links):
        assert (
            "<b>" not in text and "<script" not in text and "<i>" not in text and "<u>" not in text
        )
    assert (
        "linux_x86_64&quot;&gt;&lt;b&gt;x.whl" in page
        and 'data-requires-python="&gt;=3.8&quot;&gt;&lt;u&gt;"' in links
    )


def test_requires_python_is_taken_only_when_it_is_a_specifier_set():
    assert pages.requires_python(b"Name: apex\nRequires-Python: >=3.8, <3.14\n\n") == ">=3.8, <3.14"
    assert pages.requires_python(b'Name: apex\nRequires-Python: "><script>\n\n') is None
    assert pages.requires_python(b"Name: apex\n\n") is None
    assert pages.requires_python(b"\xff\xfe") is None


@pytest.mark.parametrize(
    "url, why",
    [
        ("https://alice:s3cret@wheels.example.test/apex", "user name or password"),
        ("https://token@wheels.example.test/apex", "user name or password"),
        ("ftp://wheels.example.test/apex", "not an http"),
        ("https://wheels.example.test/a b", "spaces"),
        ('https://wheels.example.test/"><script>', "quote"),
        ("https:///apex", "no host"),
    ],
)
def test_a_base_url_with_a_password_or_markup_is_refused(two, tmp_path, url, why):
    dist, _ = two
    with pytest.raises(ConfigError, match=why) as refused:
        publish.publish(dist, tmp_path / "index", base_url=url)
    assert "s3cret" not in str(refused.value)
    assert not (tmp_path / "index").exists()


def test_a_wheel_without_metadata_or_with_too_much_goes_without_a_metadata_file(
    tmp_path, monkeypatch, capsys
):
    """METADATA is read from an untrusted wheel: more than METADATA_MAX bytes, none, or a file that is no zip at all
    is one warning line; the wheel is published as before, its anchor without the PEP 658 attributes (pip then reads
    the wheel itself). The other wheels keep theirs."""
    dist = tmp_path / "dist"
    big = fakes.publishable(dist)  # its METADATA has a Requires-Python line more
    fine = fakes.publishable(dist, torch="2.12.0", requires_python=None)
    index = tmp_path / "index"
    monkeypatch.setattr(pages, "METADATA_MAX", len(member(big, ".dist-info/METADATA")) - 1)
    assert len(member(fine, ".dist-info/METADATA")) <= pages.METADATA_MAX
    publish.publish(dist, index)
    said = " ".join(capsys.readouterr().err.split())
    assert f"{big.name}: its METADATA is" in said and "published without PEP 658 metadata" in said
    folder = index / "simple" / "apex"
    assert not (folder / f"{big.name}.metadata").exists() and (folder / big.name).is_file()
    line = next(
        li for li in (folder / "index.html").read_text().splitlines() if f'"{big.name}#' in li
    )
    assert "data-core-metadata" not in line and "data-dist-info-metadata" not in line
    data = {f["filename"]: f for f in json.loads((index / "index.json").read_text())["files"]}
    assert "metadata" not in data[big.name]
    assert data[fine.name]["metadata"]["filename"] == f"{fine.name}.metadata"
    assert (folder / f"{fine.name}.metadata").is_file()


@pytest.mark.parametrize("content", [b"not a zip", None])
def test_a_wheel_that_is_no_zip_or_has_no_dist_info_is_published_without_metadata(
    tmp_path, capsys, content
):
    dist = tmp_path / "dist"
    wheel = fakes.publishable(dist, attest=False)
    if content is None:
        with zipfile.ZipFile(wheel, "w") as zf:  # no dist-info at all
            zf.writestr("apex/__init__.py", b"")
    else:
        wheel.write_bytes(content)
    manifest = json.loads((wheel.parent / "manifest.json").read_text())
    manifest["wheel"]["sha256"] = hashlib.sha256(wheel.read_bytes()).hexdigest()
    (wheel.parent / "manifest.json").write_text(json.dumps(manifest))
    publish.publish(dist, tmp_path / "index")
    said = " ".join(capsys.readouterr().err.split())
    assert "published without PEP 658 metadata" in said
    assert ("no *.dist-info/METADATA" in said) == (content is None)
    assert list((tmp_path / "index" / "simple" / "apex").glob("*.metadata")) == []
    assert wheel.name in (tmp_path / "index" / "index.html").read_text()


def test_coverage_lists_the_matrix_cells_without_a_wheel(tmp_path, capsys):
    cells = pages.matrix_cells(matrix.load())
    dist = tmp_path / "dist"
    have = cells[0]  # one cell of the real matrix.toml, built
    fakes.publishable(
        dist, python=have.python, torch=have.torch, arch=have.arch, torch_npu=have.torch_npu
    )
    fakes.publishable(dist, torch="2.12.0")  # a wheel for no cell
    index = tmp_path / "index"
    publish.publish(dist, index, coverage=True)
    out = capsys.readouterr().out.splitlines()
    absent = [c for c in cells if c != have]
    assert out[0].startswith(f"coverage: 1 of {len(cells)} cells of matrix.toml have a wheel")
    assert f"{len(absent)} missing" in out[0]
    assert [line.split(":")[0] for line in out[1:]] == [f"- {c.id}" for c in absent]
    assert all(f"nox -s build-{c.id}" in line for c, line in zip(absent, out[1:]))
    page = (index / "index.html").read_text()
    section = page[page.index('id="missing"') :]
    assert all(f"<code>{c.id}</code>" in section for c in absent)
    assert f"<code>{have.id}</code>" not in section


def test_coverage_is_compared_by_python_torch_arch_and_torch_npu():
    cell = matrix.Combination(
        "3.10", "2.7.1", "aarch64", "master", torch_npu="2.7.1.post2", cann="8.5.0"
    )

    def entry(filename, target):
        return SimpleNamespace(filename=filename, target=target, torch="2.7.1")

    fits = entry(
        "apex-0.1+ascend.torch2.7.1.npu2.7.1.post2-cp310-cp310-manylinux_2_28_aarch64.whl",
        "py3.10-torch2.7.1-aarch64-master+npu2.7.1.post2",
    )
    no_npu = entry(
        "apex-0.1+ascend.torch2.7.1-cp310-cp310-manylinux_2_28_aarch64.whl",
        "py3.10-torch2.7.1-aarch64-master",
    )
    other_arch = entry(
        "apex-0.1+ascend.torch2.7.1.npu2.7.1.post2-cp310-cp310-manylinux_2_28_x86_64.whl",
        "py3.10-torch2.7.1-x86_64-master+npu2.7.1.post2",
    )
    legacy = entry(  # an index.json from before target ids: the wheel's name says it all
        "apex-0.1+ascend.torch2.7.1.npu2.7.1.post2-cp310-cp310-manylinux_2_28_aarch64.whl", "?"
    )
    assert pages.missing([cell], [fits]) == []
    assert pages.missing([cell], [legacy]) == []
    assert pages.missing([cell], [no_npu, other_arch]) == [cell]


def test_a_wheel_whose_torch_is_unknown_gets_no_find_links_page(tmp_path):
    legacy = (
        SimpleNamespace(  # index.json from before torch was recorded, a name without a torch label
            project="apex",
            filename="apex-0.1+ascend-cp311-cp311-linux_x86_64.whl",
            sha256="c" * 64,
            target="?",
            torch="",
            attestations=(),
        )
    )
    dated = SimpleNamespace(**{**vars(legacy), "filename": fakes.LINUX, "torch": "2.13.0"})
    written = pages.write_pages(tmp_path, [legacy, dated], {}, "https://h.example.test")
    assert written == ["index.html", "torch-2.13.0.html"]
    assert sorted(p.name for p in tmp_path.iterdir()) == written
    assert legacy.filename in (tmp_path / "index.html").read_text()
