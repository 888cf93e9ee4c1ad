"""`invoke publish`: dist/ -> a PEP 503 "simple" index directory that pip installs from (file:// or any static web
server): <index>/simple/index.html, <index>/simple/<project>/index.html with `<wheel>#sha256=<digest>` links, the
wheels beside them, and index.json (which build each file came from).

One filename is one wheel: a filename already in the index with other bytes, or two targets offering different
wheels under one name (the wheel name does not carry the torch version), is refused; --split-by-torch writes one
index per torch version instead. The index is rebuilt in a temporary directory and swapped in, so readers never see
a half-written one, and wheels published earlier stay.
"""

from __future__ import annotations

import html
import json
import os
import re
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from apexkit import fsedit, log
from apexkit.build import sha256_file
from apexkit.errors import ConfigError


@dataclass(frozen=True)
class Entry:
    project: str  # PEP 503 normalised
    filename: str
    path: Path
    sha256: str
    target: str  # the dist/<target-id> it was built as
    torch: str
    in_index: bool = False  # already published (read from index.json)


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def collect(dist: Path, targets: list[str] | None = None) -> list[Entry]:
    """Every dist/<target>/ with a manifest and its wheel (checked against the manifest's sha256)."""
    if not dist.is_dir():
        raise ConfigError(f"{dist} does not exist", "build first: nox -s build-3.11 (or pass --dist DIR)")
    entries = []
    for manifest_path in sorted(dist.glob("*/manifest.json")):
        target = manifest_path.parent.name
        if targets and target not in targets:
            continue
        manifest = json.loads(manifest_path.read_text())
        wheel = manifest_path.parent / manifest["wheel"]["file"]
        digest = sha256_file(wheel)
        if digest != manifest["wheel"]["sha256"]:
            raise ConfigError(f"{wheel} does not match the sha256 in its manifest", f"rebuild {target}")
        entries.append(Entry(normalize(wheel.name.split("-")[0]), wheel.name, wheel, digest, target,
                             str(manifest["target"]["torch"]).split("+")[0]))
    missing = sorted(set(targets or ()) - {e.target for e in entries})
    if missing:
        raise ConfigError(f"no built target {', '.join(missing)} in {dist}",
                          f"choose from {', '.join(p.parent.name for p in sorted(dist.glob('*/manifest.json')))}")
    if not entries:
        raise ConfigError(f"no built wheel in {dist} (no */manifest.json)", "build first: nox -s build-3.11")
    return entries


def _existing(root: Path) -> list[Entry]:
    """What an index already holds (from its index.json)."""
    data_file = root / "index.json"
    if not data_file.is_file():
        return []
    data = json.loads(data_file.read_text())
    return [Entry(f["project"], f["filename"], root / "simple" / f["project"] / f["filename"], f["sha256"],
                  f.get("target", "?"), f.get("torch", ""), in_index=True) for f in data["files"]]


def plan(entries: list[Entry], index: Path, split_by_torch: bool = False) -> dict[Path, list[Entry]]:
    """index root -> its files (old and new), refusing two different wheels under one filename."""
    groups: dict[Path, list[Entry]] = {}
    for entry in entries:
        root = index / f"torch{entry.torch}" if split_by_torch else index
        groups.setdefault(root, _existing(root))
        groups[root].append(entry)
    for root, files in groups.items():
        by_name: dict[str, Entry] = {}
        for entry in files:
            other = by_name.get(entry.filename)
            if other is not None and other.sha256 != entry.sha256:
                where = f"the index already holds (from {other.target})" if other.in_index else f"{other.target} has"
                raise ConfigError(
                    f"{entry.filename}: {where} another wheel under this name (sha256 {other.sha256[:12]}) than "
                    f"{entry.target} (sha256 {entry.sha256[:12]}) in {root}",
                    "publish with --split-by-torch (one index per torch), pick one with --target, or use another --index")
            by_name[entry.filename] = entry
        groups[root] = sorted(by_name.values(), key=lambda e: (e.project, e.filename))
    return groups


def _page(title: str, links: list[tuple[str, str]]) -> str:
    body = "\n".join(f'    <a href="{html.escape(href)}">{html.escape(text)}</a><br/>' for href, text in links)
    return (f'<!DOCTYPE html>\n<html>\n  <head>\n    <meta name="pypi:repository-version" content="1.0">\n'
            f"    <title>{html.escape(title)}</title>\n  </head>\n  <body>\n{body}\n  </body>\n</html>\n")


def write(root: Path, files: list[Entry]) -> None:
    """Build the index for `root` next to it, then swap it in."""
    root.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{root.name}.tmp-", dir=root.parent))
    try:
        projects = sorted({e.project for e in files})
        (tmp / "simple").mkdir()
        (tmp / "simple" / "index.html").write_text(_page("Simple index", [(f"{p}/", p) for p in projects]))
        for project in projects:
            folder = tmp / "simple" / project
            folder.mkdir()
            mine = [e for e in files if e.project == project]
            for e in mine:
                shutil.copy2(e.path, folder / e.filename)
            (folder / "index.html").write_text(_page(f"Links for {project}",
                                                     [(f"{e.filename}#sha256={e.sha256}", e.filename) for e in mine]))
        (tmp / "index.json").write_text(json.dumps({
            "generated": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "files": [{"project": e.project, "filename": e.filename, "sha256": e.sha256, "target": e.target,
                       "torch": e.torch} for e in files]}, indent=1) + "\n")
        for path in (tmp, *tmp.rglob("*")):
            os.chmod(path, 0o755 if path.is_dir() else 0o644)  # served by any web server
        fsedit.swap_directory(tmp, root)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def publish(dist: Path, index: Path, targets: list[str] | None = None, split_by_torch: bool = False,
            dry_run: bool = False) -> dict[Path, list[Entry]]:
    groups = plan(collect(dist, targets), index.resolve(), split_by_torch)
    for root, files in groups.items():
        log.info(f"{'would write' if dry_run else 'index'} {root}/simple/ ({len(files)} wheel"
                 f"{'' if len(files) == 1 else 's'})")
        for e in files:
            log.info(f"  {e.filename}  sha256 {e.sha256[:12]}  ({e.target})")
        if not dry_run:
            write(root, files)
            log.info(f"  pip install apex --index-url {root.as_uri()}/simple/  "
                     "(or serve the folder: python3 -m http.server)")
    return groups
