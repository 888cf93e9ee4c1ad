"""The files `apexkit install` writes into a venv, read before pip writes them: where each wheel's files would land
(its zip members and RECORD, read statically), who owns what is there (every installed distribution's RECORD), the
stat of torch's own files (one changed: torch changed, whatever its version says), and the journal an interrupted
install leaves for the next run to repair."""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import io
import json
import os
import zipfile
from collections.abc import Iterable
from pathlib import Path

from packaging.utils import canonicalize_name

from apexkit import cachetrust, fsedit, untrusted
from apexkit.install.fit import Misfit
from apexkit.install.target import Target

RECORD_LIMIT = 64 << 20  # bytes of one installed RECORD (torch's: ~2 MB)
STARTUP = (
    "sitecustomize.py",
    "usercustomize.py",
)  # code every start of the interpreter runs, as a .pth


def _rows(data: bytes) -> list[str]:
    return [row[0] for row in csv.reader(io.StringIO(data.decode(errors="replace"))) if row]


def owners(t: Target) -> dict[str, set[str]]:
    """{absolute path: the distributions whose RECORD lists it} over every site directory of the venv."""
    found: dict[str, set[str]] = {}
    for site in t.site_dirs:
        with contextlib.suppress(OSError):
            for entry in os.scandir(site):
                if not entry.name.endswith(".dist-info") or not entry.is_dir(follow_symlinks=False):
                    continue
                dist = canonicalize_name(entry.name.split("-", 1)[0])
                try:
                    rows = _rows(
                        untrusted.read_regular(Path(entry.path, "RECORD"), None, RECORD_LIMIT)
                    )
                except untrusted.Untrusted:
                    continue
                for row in rows:
                    found.setdefault(os.path.normpath(os.path.join(site, row)), set()).add(dist)
    return found


def _destinations(member: str, own: tuple[str, str], t: Target) -> list[str] | str:
    """Where pip writes the wheel member `member` (each site directory it could shadow one in), or why it must not:
    outside its own .dist-info and .data, a path with `..`, a .pth or sitecustomize at the top, another's metadata."""
    parts = member.split("/")
    if member.startswith("/") or any(p in ("", ".", "..") for p in parts):
        return f"a path outside the venv ({untrusted.shown(member)})"
    if parts[0] == own[0]:
        return []
    if parts[0] == own[1]:
        if len(parts) > 2 and parts[1] == "scripts" and t.scripts:
            return [os.path.join(t.scripts, *parts[2:])]
        if parts[1] == "headers":
            return []
        if len(parts) < 3 or parts[1] not in ("purelib", "platlib"):
            return f"a file for the venv's prefix ({untrusted.shown(member)})"
        parts = parts[2:]
    top = parts[0]
    if len(parts) == 1 and (top.endswith(".pth") or top in STARTUP):
        return f"{untrusted.shown(top)}, which every start of the venv's python runs"
    if top.endswith((".dist-info", ".egg-info", ".egg-link", ".data")):
        return f"another distribution's metadata ({untrusted.shown(member)})"
    return [os.path.join(site, *parts) for site in t.site_dirs]


def check_wheel(wheel: Path, t: Target, owned: dict[str, set[str]]) -> list[str]:
    """Every file of the wheel file `wheel` where pip would write it in the venv, or Misfit: one that would land
    outside its own names -- over a file another distribution lists (or none does), inside a package another
    installed, a .pth. Its zip members and its RECORD both: pip writes the members."""
    stem = wheel.name.split("-", 2)
    dist = canonicalize_name(stem[0])
    own = (f"{stem[0]}-{stem[1]}.dist-info", f"{stem[0]}-{stem[1]}.data")
    try:
        with zipfile.ZipFile(wheel) as archive:
            members = {i.filename for i in archive.infolist() if not i.is_dir()}
            if f"{own[0]}/RECORD" in members:
                members |= set(_rows(archive.read(f"{own[0]}/RECORD")[:RECORD_LIMIT]))
    except (OSError, zipfile.BadZipFile) as exc:
        raise Misfit(f"{untrusted.shown(wheel.name)} is not a readable wheel ({exc})") from None
    found = []
    for member in sorted(members):
        where = _destinations(member, own, t)
        if isinstance(where, str):
            raise Misfit(f"{untrusted.shown(wheel.name)} brings {where}")
        for dest in where:
            problem = _overwrites(dest, dist, owned, t)
            if problem:
                raise Misfit(
                    f"{untrusted.shown(wheel.name)} would write "
                    f"{untrusted.shown(os.path.relpath(dest, os.path.realpath(t.venv)))}, {problem}"
                )
        found += where
    return found


def _overwrites(dest: str, dist: str, owned: dict[str, set[str]], t: Target) -> str | None:
    """Why `dest` is not the wheel's `dist` to write: listed by another distribution, present but listed by none,
    or inside a package (a folder with __init__.py) of another distribution."""
    others = owned.get(dest, set()) - {dist}
    if others:
        return f"which {', '.join(sorted(others))} installed"
    if os.path.lexists(dest) and dist not in owned.get(dest, set()):
        return "which no distribution lists"
    site = next((s for s in t.site_dirs if dest.startswith(s + os.sep)), None)
    if site is None:
        return None
    top = os.path.relpath(dest, site).split(os.sep)[0]
    package = os.path.join(site, top, "__init__.py")
    if top != os.path.relpath(dest, site) and os.path.lexists(package):
        holders = owned.get(package, set()) - {dist}
        if holders or dist not in owned.get(package, set()):
            return f"inside the package {top} of {', '.join(sorted(holders)) or 'no distribution'}"
    return None


def stamp(
    t: Target, owned: dict[str, set[str]], dists: Iterable[str]
) -> dict[str, tuple[int, ...]]:
    """(size, mtime, ctime, inode) of every file the distributions `dists` (torch, torch_npu) list: a file written
    since changes its ctime at least, whatever the version string says."""
    wanted = set(dists)
    return {p: _stat(p) for p, who in owned.items() if who & wanted}


def _stat(path: str) -> tuple[int, ...]:
    try:
        st = os.lstat(path)
    except OSError:
        return ()
    return (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_mode)


def changed(stamps: dict[str, tuple[int, ...]]) -> list[str]:
    return sorted(p for p, was in stamps.items() if _stat(p) != was)


# --- the journal: what a run is about to write, kept until it is done --------------------------------------------


@dataclasses.dataclass
class Journal:
    """Before pip writes into the venv: every file it will write and each distribution it installs (name: the
    version the venv had before, None for a new one), in a file of the cache; removed once the run is done, so a
    run killed on the way leaves it for the next one (`read_journal`)."""

    path: Path
    paths: list[str] = dataclasses.field(default_factory=list)
    dists: dict[str, str | None] = dataclasses.field(default_factory=dict)

    def add(self, paths: Iterable[str], dists: dict[str, str | None]) -> None:
        self.paths += paths
        self.dists.update(dists)
        data = json.dumps({"paths": sorted(set(self.paths)), "dists": self.dists}).encode()
        cachetrust.make_dir(self.path.parent, 0o700)
        fsedit.atomic_write(self.path, data, 0o600)

    def done(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()


def read_journal(journal: Path) -> tuple[list[str], dict[str, str | None]] | None:
    try:
        data = untrusted.read_json_object(journal, None, RECORD_LIMIT, "the install journal")
    except (untrusted.Untrusted, OSError):
        return None
    paths, dists = data.get("paths"), data.get("dists")
    if not isinstance(paths, list) or not isinstance(dists, dict):
        return None
    return [p for p in paths if isinstance(p, str)], {
        k: v for k, v in dists.items() if isinstance(k, str) and isinstance(v, (str, type(None)))
    }


def remove_orphans(paths: Iterable[str], t: Target, owned: dict[str, set[str]]) -> list[str]:
    """Delete each of `paths` that is a file inside the venv's site or scripts directories and that no
    distribution's RECORD lists (what pip wrote before it was killed), then its folders left empty."""
    prefix = os.path.realpath(t.venv) + os.sep
    homes = [h for h in (*t.site_dirs, t.scripts or "") if h.startswith(prefix)]
    removed = []
    for path in paths:
        home = next((h for h in homes if os.path.normpath(path).startswith(h + os.sep)), None)
        if home is None or path in owned or not os.path.isfile(path) or os.path.islink(path):
            continue
        with contextlib.suppress(OSError):
            os.unlink(path)
            removed.append(os.path.relpath(path, home))
            folder = os.path.dirname(path)
            while folder != home and not os.listdir(folder):
                os.rmdir(folder)
                folder = os.path.dirname(folder)
    return removed
