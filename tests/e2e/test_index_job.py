"""The CI workflow's index job, run locally from .github/workflows/build.yml itself: a real fixture build plus a second,
hand-made build job's dist (another torch), each uploaded with the build job's own `path:` globs (as
actions/upload-artifact lays an artifact out: paths from the matched files' least common ancestor), downloaded as
actions/download-artifact's `merge-multiple` does, then the index job's publish step (its `run:` script, under the
`bash -e` GitHub runs it with). The index it writes is read by a real pip over HTTP on 127.0.0.1 (PEP 658: pip
fetches the .metadata, not the wheel, to resolve), through a find-links page, and rendered by a real headless
chromium (--dump-dom)."""

from __future__ import annotations

import hashlib
import html.parser
import http.server
import json
import os
import shutil
import subprocess
import sys
import threading
import urllib.parse
from pathlib import Path
from typing import ClassVar

import fakes
import pytest
import wheelnames
import yaml
from conftest import ROOT, Runner, output

from apexkit.index import signing
from apexkit.wheel import interpreters
from tools import testtools

WORKFLOW = ROOT / ".github" / "workflows" / "build.yml"
COMBO = "py3.11-torch2.13.0-x86_64"  # the matrix.toml cell the fixture build is
WHEEL = wheelnames.fixture_wheel()
VERSION = "0.1+ascend.torch2.13.0"


def steps(job: str) -> list[dict]:
    return yaml.safe_load(WORKFLOW.read_text())["jobs"][job]["steps"]


def search_path(workspace: Path, pattern: str) -> Path:
    """@actions/glob's search path of a pattern: its components before the first one with a glob character."""
    parts = Path(pattern).parts
    literal = next((i for i, part in enumerate(parts) if any(c in part for c in "*?[")), len(parts))
    return workspace.joinpath(*parts[:literal])


def upload(job_workspace: Path, artifact: Path) -> None:
    """actions/upload-artifact of the build job (src/shared/search.ts): its `path:` globs matched in the job's
    workspace; the artifact's root is the search path of the patterns (the least common ancestor when there are
    several; a lone file pattern stores the file alone), each file stored under its path relative to that root."""
    (step,) = [
        s for s in steps("build") if str(s.get("uses", "")).startswith("actions/upload-artifact")
    ]
    patterns = step["with"]["path"].split()
    matched = sorted(
        {p for pattern in patterns for p in job_workspace.glob(pattern) if p.is_file()}
    )
    assert matched or step["with"].get("if-no-files-found") != "error", "the upload step would fail"
    found = {search_path(job_workspace, pattern) for pattern in patterns}
    roots = [p for p in found if not any(q != p and q in p.parents for q in found)]
    if len(roots) > 1:
        root = Path(os.path.commonpath(roots))
    elif len(matched) == 1 and roots[0] == matched[0]:
        root = matched[0].parent
    else:
        root = roots[0]
    for path in matched:
        dest = artifact / path.relative_to(root)
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, dest)


class Server(http.server.SimpleHTTPRequestHandler):
    requests: ClassVar[list[str]] = []

    def log_message(self, *args) -> None:
        pass

    def do_GET(self) -> None:
        Server.requests.append(self.path)
        super().do_GET()


@pytest.fixture(scope="module")
def job(repos, shared_cache, tmp_path_factory):
    """The index job's workspace after its publish step: (workspace, base URL, summary text, publish output)."""
    tmp = tmp_path_factory.mktemp("index-job")
    built = Runner(repos, shared_cache, tmp / "build-job-1")
    proc = built.nox("3.11", "--no-smoke-test")
    assert proc.returncode == 0, output(proc)[-3000:]
    other = (
        tmp / "build-job-2"
    )  # a second build job's dist (torch 2.12.0), hand-made: one real build is enough
    fakes.publishable(other / "dist", torch="2.12.0")
    artifacts = tmp / "artifacts"
    upload(tmp / "build-job-1", artifacts / "apex-py3.11-torch2.13.0-x86_64")
    upload(other, artifacts / "apex-py3.11-torch2.12.0-x86_64")

    workspace = (
        tmp / "workspace"
    )  # the index job's checkout: tasks.py (it imports apexkit from beside itself)
    workspace.mkdir()
    (workspace / "tasks.py").symlink_to(ROOT / "tasks.py")
    index_steps = steps("index")
    (download,) = [
        s for s in index_steps if str(s.get("uses", "")).startswith("actions/download-artifact")
    ]
    assert download["with"]["merge-multiple"] is True
    into = workspace / download["with"]["path"]
    for artifact in sorted(artifacts.glob(download["with"]["pattern"])):  # merge-multiple: one tree
        shutil.copytree(artifact, into, dirs_exist_ok=True)

    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), lambda *a: Server(*a, directory=str(workspace))
    )
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}/index"

    (step,) = [s for s in index_steps if "invoke publish" in s.get("run", "")]
    summary = tmp / "summary.md"
    signing.generate("ci-test", str(tmp / "keys"))  # the repository secret's stand-in
    secrets = {"${{ secrets.APEXKIT_SIGNING_KEY }}": (tmp / "keys" / "ci-test.key").read_text()}
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("APEXKIT_") or k == "APEXKIT_CACHE_DIR"
    }
    env.update(
        {
            k: secrets.get(v, v).replace("${{ vars.APEXKIT_INDEX_URL }}", base)
            for k, v in step.get("env", {}).items()
        }
    )
    env["GITHUB_STEP_SUMMARY"] = str(summary)
    env["PATH"] = (
        f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"  # `python` is the tests' Python
    )
    published = subprocess.run(
        ["bash", "-e", "-c", step["run"]],
        cwd=workspace,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert published.returncode == 0, output(published)
    (workspace / "ci-test.pub").write_bytes((tmp / "keys" / "ci-test.pub").read_bytes())
    yield workspace, base, summary.read_text(), output(published)
    server.shutdown()


def test_the_index_job_publishes_the_build_jobs_artifacts_with_its_pages(job):
    workspace, base, summary, said = job
    index = workspace / "index"
    folder = index / "simple" / "apex"
    for name in ("index.html", "torch-2.13.0.html", "torch-2.12.0.html", "index.json"):
        assert (index / name).is_file(), said
    data = json.loads((index / "index.json").read_text())
    assert {f["torch"] for f in data["files"]} == {"2.13.0", "2.12.0"}
    for f in data["files"]:
        for record in (f["metadata"], f["manifest"], *f["attestations"].values()):
            assert (
                hashlib.sha256((folder / record["filename"]).read_bytes()).hexdigest()
                == record["sha256"]
            )
    page = (index / "index.html").read_text()
    assert f"apexkit install --index {base}" in page and f"--index-url {base}/simple/" in page
    # the job summary: the coverage report (stdout), not the publish log (stderr)
    assert summary.startswith("coverage: 1 of ") and "cells of matrix.toml have a wheel" in summary
    assert "- py3.10-torch2.1.0-x86_64:" in summary and f"- {COMBO}:" not in summary
    assert "sha256" not in summary


def test_the_index_job_signs_each_wheel_with_the_repository_secret(job):
    workspace, _, summary, said = job
    trusted = signing.public_keys([str(workspace / "ci-test.pub")])
    (keyid,) = trusted
    folder = workspace / "index" / "simple" / "apex"
    files = json.loads((workspace / "index" / "index.json").read_text())["files"]
    for f in files:
        statement, signer = signing.verify(
            (folder / (f["filename"] + signing.SUFFIX)).read_bytes(), trusted
        )
        assert signer == keyid == f["signature"]["keyid"]
        assert signing.subject_mismatch(statement, folder / f["filename"]) is None
        assert signing.signed_facts(statement)["torch"] == f["facts"]["torch"]
    assert len(files) == 2 and f"signing with key id {keyid}" in said
    assert "BEGIN" not in said + summary  # the secret is never echoed
    assert "::warning::" not in said


def test_pip_resolves_from_the_metadata_and_downloads_from_the_find_links_page(job, tmp_path):
    _, base, _, _ = job
    python = interpreters.find("3.11", os.environ).path
    pip = [str(python), "-m", "pip", "--isolated", "--disable-pip-version-check"]
    Server.requests.clear()
    report = tmp_path / "report.json"
    resolved = subprocess.run(
        [*pip, "install", "--dry-run", "--ignore-installed", "--no-deps", "--no-cache-dir", "--report",
         str(report), "--index-url", f"{base}/simple/", f"apex=={VERSION}"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert resolved.returncode == 0, output(resolved)
    (item,) = json.loads(report.read_text())["install"]
    assert urllib.parse.unquote(item["download_info"]["url"]) == f"{base}/simple/apex/{WHEEL}"
    assert item["metadata"]["version"] == VERSION
    asked = [urllib.parse.unquote(path) for path in Server.requests]
    # PEP 658: pip reads the anchor's data-core-metadata and resolves from the .metadata (pip 23 still fetches
    # the wheel afterwards for --report's download_info; newer pips do not)
    wheel, metadata = f"/index/simple/apex/{WHEEL}", f"/index/simple/apex/{WHEEL}.metadata"
    assert metadata in asked, asked
    assert asked.index(metadata) < (asked.index(wheel) if wheel in asked else len(asked))

    downloaded = subprocess.run(
        [*pip, "download", "--no-deps", "--no-cache-dir", "--no-index", "-f", f"{base}/torch-2.13.0.html",
         "-d", str(tmp_path / "got"), "apex"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert downloaded.returncode == 0, output(downloaded)
    assert [p.name for p in (tmp_path / "got").iterdir()] == [
        WHEEL
    ]  # the 2.12.0 wheel is not on that page


class Cells(html.parser.HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.cells: list[str] = []
        self._open = False

    def handle_starttag(self, tag, attrs):
        if tag == "td":
            self._open = True
            self.cells.append("")

    def handle_endtag(self, tag):
        if tag == "td":
            self._open = False

    def handle_data(self, data):
        if self._open:
            self.cells[-1] += data


def test_chromium_renders_the_grid_with_both_wheels(job, tmp_path):
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip(testtools.skip_reason("chromium"))
    workspace, _, _, _ = job
    # a private profile; every network feature off, and a dead proxy on loopback so nothing leaves 127.0.0.1
    dom = subprocess.run(
        [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
         f"--user-data-dir={tmp_path / 'profile'}", "--disable-background-networking", "--disable-component-update",
         "--disable-sync", "--disable-extensions", "--disable-default-apps", "--dns-prefetch-disable",
         "--proxy-server=http://127.0.0.1:9", "--dump-dom", (workspace / "index" / "index.html").as_uri()],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert dom.returncode == 0, dom.stderr[-2000:]
    parsed = Cells()
    parsed.feed(dom.stdout)
    wheels = [c for c in parsed.cells if ".whl" in c]
    assert len(wheels) == 2, parsed.cells
    assert any(WHEEL in c for c in wheels) and any("torch2.12.0" in c for c in wheels)
    (keyid,) = signing.public_keys([str(workspace / "ci-test.pub")])
    assert all(f"signed by {keyid[:16]}" in c for c in wheels), wheels  # issue 42: the signer
    assert any(c.startswith("missing") for c in parsed.cells)
