"""The published grid (index.html) read in a real headless chromium at 1,280 px (issue 41 item 10): every column in
view, no horizontal scrolling. Skipped with the install command where chromium is absent; CI installs it
(tools/systools.py)."""

from __future__ import annotations

import hashlib
import json
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, output

from apexkit.index import signing
from tools import testtools

WIDTH = 1280
# wheels in six columns (Python x arch) and three rows, with the long names torch_npu builds have
CELLS = [
    (py, arch, torch, npu)
    for py in ("3.9", "3.10", "3.11")
    for arch in ("x86_64", "aarch64")
    for torch, npu in (("2.7.1", "2.7.1.post11"), ("2.13.0", None))
] + [("3.10", "aarch64", "2.1.0", "2.1.0.post10")]
MEASURE = (  # the page's width, the viewport's, and the right edge of its last column, in the title
    "<script>const th=[...document.querySelectorAll('table.grid thead th')].pop();document.title=["
    "document.documentElement.scrollWidth,document.documentElement.clientWidth,"
    "Math.ceil(th.getBoundingClientRect().right)].join(' ')</script></body>"
)


def grid_dist(tmp: Path) -> Path:
    for py, arch, torch, npu in CELLS:
        target = f"py{py}-torch{torch}-{arch}-master" + (f"+npu{npu}" if npu else "")
        cp = "cp" + py.replace(".", "")
        label = f"torch{torch}" + (f".npu{npu}" if npu else "")
        name = f"apex-0.1+ascend.{label}-{cp}-{cp}-manylinux_2_28_{arch}.whl"
        folder = tmp / "dist" / target
        folder.mkdir(parents=True)
        (folder / name).write_bytes(target.encode())
        manifest = {
            "wheel": {"file": name, "sha256": hashlib.sha256(target.encode()).hexdigest()},
            "target": {"torch": torch, "python": py, "arch": arch, "torch_npu": npu},
        }
        (folder / "manifest.json").write_text(json.dumps(manifest))
    return tmp / "dist"


def chromium(tmp: Path, *args: str) -> subprocess.CompletedProcess:
    """headless chromium at WIDTH, a private profile, nothing leaving 127.0.0.1"""
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        pytest.skip(testtools.skip_reason("chromium"))
    return subprocess.run(
        [found, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
         f"--user-data-dir={tmp / 'profile'}", "--disable-background-networking", "--disable-component-update",
         "--disable-sync", "--disable-extensions", "--disable-default-apps", "--dns-prefetch-disable",
         "--proxy-server=http://127.0.0.1:9", f"--window-size={WIDTH},900", *args],
        capture_output=True, text=True, timeout=120, cwd=tmp,
    )  # fmt: skip


def test_the_grid_reads_at_1280_px_in_chromium(tmp_path):
    index = tmp_path / "index"
    dist = grid_dist(tmp_path)
    signing.generate("team", str(tmp_path))  # issue 42: each wheel names its signer
    (keyid,) = signing.public_keys([str(tmp_path / "team.pub")])
    proc = subprocess.run(
        [sys.executable, "-m", "invoke", "-r", str(ROOT), "publish", "--dist", str(dist),
         "--index", str(index), "--sign-key", str(tmp_path / "team.key")],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, output(proc)
    page = (index / "index.html").read_text()
    assert page.count("<th>Python ") >= 6 and page.count('class="wheel"') == len(CELLS)

    shot = chromium(
        tmp_path, f"--screenshot={tmp_path / 'grid.png'}", (index / "index.html").as_uri()
    )
    assert shot.returncode == 0, shot.stderr[-2000:]
    png = (tmp_path / "grid.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and struct.unpack(">I", png[16:20])[0] == WIDTH

    probe = index / "measure.html"  # a copy of the page that writes its widths into its title
    probe.write_text(page.replace("</body>", MEASURE))
    dom = chromium(tmp_path, "--dump-dom", probe.as_uri())
    assert dom.returncode == 0, dom.stderr[-2000:]
    title = dom.stdout.split("<title>", 1)[1].split("</title>", 1)[0]
    # chromium's DOM names each wheel's signer: the short key id, the full one in its title
    shown = f'signed by <code class="signer" title="{keyid}">{keyid[:16]}</code>'
    assert dom.stdout.count(shown) == len(CELLS), dom.stdout[-3000:]
    scroll, client, last_column = map(int, title.split())
    assert client > WIDTH - 40, title  # the window was WIDTH wide (less a scroll bar)
    assert scroll <= client and last_column <= client, (
        f"page {scroll} px, last column ends at {last_column} px"
    )
