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

from apexkit import cachetrust, fsedit, log, untrusted
from apexkit.install.fit import Misfit, read_member
from apexkit.install.target import Target

RECORD_LIMIT = 64 << 20  # bytes of one installed RECORD (torch's: ~2 MB)
# modules every start of the interpreter imports, as it runs a .pth: in any form (x.py, x/, x.pyc, x.*.so)
STARTUP = ("sitecustomize", "usercustomize")
NOT_NAMES = (
    ".dist-info",
    ".egg-info",
    ".egg-link",
    ".data",
    ".pth",
)  # top-level entries that import nothing


def _rows(data: bytes) -> list[str]:
    return [row[0] for row in csv.reader(io.StringIO(data.decode(errors="replace"))) if row]


def _records(t: Target) -> Iterable[tuple[str, str, Path]]:
    """(site directory, canonical name, RECORD path) of every distribution installed in the venv's site dirs."""
    for site in t.site_dirs:
        with contextlib.suppress(OSError):
            for entry in os.scandir(site):
                if entry.name.endswith(".dist-info") and entry.is_dir(follow_symlinks=False):
                    yield (
                        site,
                        canonicalize_name(entry.name.split("-", 1)[0]),
                        Path(entry.path, "RECORD"),
                    )


def owners(t: Target) -> dict[str, set[str]]:
    """{absolute path: the distributions whose RECORD lists it} over every site directory of the venv."""
    found: dict[str, set[str]] = {}
    for site, dist, record in _records(t):
        try:
            rows = _rows(untrusted.read_regular(record, None, RECORD_LIMIT))
        except untrusted.Untrusted:
            continue
        for row in rows:
            found.setdefault(os.path.normpath(os.path.join(site, row)), set()).add(dist)
    return found


def written(t: Target, dists: Iterable[str]) -> dict[str, list]:
    """{name: (device, inode, size, mtime, sha256) of its installed RECORD} for each of `dists` the venv holds: what
    a pip call just wrote, told apart from the same files installed again later by someone else (a new RECORD)."""
    found: dict[str, list] = {}
    for _, dist, record in _records(t):
        if dist in dists:
            with contextlib.suppress(OSError, untrusted.Untrusted):
                st, data = os.lstat(record), untrusted.read_regular(record, None, RECORD_LIMIT)
                found[dist] = [
                    st.st_dev,
                    st.st_ino,
                    st.st_size,
                    st.st_mtime_ns,
                    fsedit.sha256(data),
                ]
    return found


def _name(top: str) -> str:
    """The import name a top-level entry of a site directory provides: x for x/, x.py, x.pyc, x.cpython-311-....so."""
    return top.split(".", 1)[0]


def _import_name(parts: list[str]) -> str:
    """The top-level import name the path `parts` (under a site directory) belongs to: `_name` of its first part, and
    x for __pycache__/x.cpython-311[.opt-1].pyc -- the bytecode `import x` runs in place of x.py."""
    return _name(parts[1] if parts[0] == "__pycache__" and len(parts) > 1 else parts[0])


def names(t: Target, owned: dict[str, set[str]]) -> dict[str, set[str]]:
    """{top-level import name: the distributions whose RECORD lists a file under it ("" for one on disk that none
    lists)} over the venv's site dirs: what a wheel must not write under, unless it is the wheel's own."""
    found: dict[str, set[str]] = {}
    for path, who in owned.items():
        for site in t.site_dirs:
            parts = os.path.relpath(path, site).split(os.sep)
            if path.startswith(site + os.sep) and not parts[0].endswith(NOT_NAMES):
                found.setdefault(_import_name(parts), set()).update(who)
    for site in t.site_dirs:
        with contextlib.suppress(OSError):
            for top in os.listdir(site):
                if top != "__pycache__" and not top.endswith(NOT_NAMES):
                    found.setdefault(_name(top), {""})
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
    if top.endswith(".pth") or _import_name(parts) in STARTUP:
        return f"{untrusted.shown('/'.join(parts))}, which every start of the venv's python runs"
    if top.endswith((".dist-info", ".egg-info", ".egg-link", ".data")):
        return f"another distribution's metadata ({untrusted.shown(member)})"
    return [os.path.join(site, *parts) for site in t.site_dirs]


def check_wheel(
    wheel: Path, t: Target, owned: dict[str, set[str]], taken: dict[str, set[str]]
) -> list[str]:
    """Every file of the wheel file `wheel` where pip would write it in the venv, or Misfit: one that would land
    outside its own names -- over a file another distribution lists (or none does), under a top-level import name
    another provides (`taken`: installed, or a wheel checked before in the same run; this one's names are added to
    it), a .pth. Its zip members and its RECORD both: pip writes the members."""
    stem = wheel.name.split("-", 2)
    dist = canonicalize_name(stem[0])
    own = (f"{stem[0]}-{stem[1]}.dist-info", f"{stem[0]}-{stem[1]}.data")
    try:
        untrusted.check_zip(wheel)
        with zipfile.ZipFile(wheel) as archive:
            members = {i.filename for i in archive.infolist() if not i.is_dir()}
            members |= set(_rows(read_member(archive, own[0], "RECORD", RECORD_LIMIT, b"")))
            scripts = _scripts(
                read_member(archive, own[0], "entry_points.txt", missing=b""), t.python
            )
            members |= {f"{own[1]}/scripts/{name}" for name in scripts}
    except untrusted.Untrusted as exc:  # check_zip's: a bomb, a bad CRC (it names the wheel)
        raise Misfit(str(exc)) from None
    except (OSError, zipfile.BadZipFile) as exc:
        raise Misfit(f"{untrusted.shown(wheel.name)} is not a readable wheel ({exc})") from None
    found = []
    for member in sorted(members):
        where = _destinations(member, own, t)
        if isinstance(where, str):
            raise Misfit(f"{untrusted.shown(wheel.name)} brings {where}")
        for dest in where:
            problem = _overwrites(dest, dist, owned, t, taken)
            if problem:
                raise Misfit(
                    f"{untrusted.shown(wheel.name)} would write "
                    f"{untrusted.shown(os.path.relpath(dest, os.path.realpath(t.venv)))}, {problem}"
                )
        found += where
    return found


def _scripts(entry_points: bytes, python: str) -> set[str]:
    """The scripts pip writes for a wheel's entry_points.txt (read as importlib.metadata and pkg_resources read it):
    each name of its [console_scripts] and [gui_scripts], and for pip (easy_install) the copies pip adds: pip3,
    pip3.11 (easy_install-3.11) of the venv's `python`."""
    found, section = set(), None
    for line in entry_points.decode(errors="replace").splitlines():
        line = line.strip()
        if line.startswith("[") and line.endswith("]"):
            section = line.strip("[]").strip()
        elif line and not line.startswith("#") and section in ("console_scripts", "gui_scripts"):
            found.add(line.split("=", 1)[0].strip())
    if "pip" in found:
        found |= {f"pip{python.split('.')[0]}", f"pip{python}"}
    if "easy_install" in found:
        found.add(f"easy_install-{python}")
    return found


def _overwrites(
    dest: str, dist: str, owned: dict[str, set[str]], t: Target, taken: dict[str, set[str]]
) -> str | None:
    """Why `dest` is not the wheel's `dist` to write: listed by another distribution, present but listed by none,
    under a top-level import name (package, module, namespace, its bytecode) another provides, or a script another
    wheel of the run writes; else `dist` takes that name (that script)."""
    others = owned.get(dest, set()) - {dist}
    if others:
        return f"which {', '.join(sorted(others))} installed"
    if os.path.lexists(dest) and dist not in owned.get(dest, set()):
        return "which no distribution lists"
    site = next((s for s in t.site_dirs if dest.startswith(s + os.sep)), None)
    name = _import_name(os.path.relpath(dest, site).split(os.sep)) if site else dest
    holders = taken.setdefault(name, {dist}) - {dist}
    if not holders:
        return None
    shown = ", ".join(sorted(h or "no distribution" for h in holders))
    return (
        f"inside the package {log.sanitise(name[:100])} of {shown}"
        if site
        else f"which {shown} writes too"
    )


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
    """Before pip writes into the venv: the venv's directory (device, inode: a venv made again at the same path is
    another), every file pip will write and each distribution it installs (name: the version the venv had before,
    None for a new one), and after each pip call the RECORD it wrote (`written`); in a private file of the cache,
    removed once the run is done, so a run killed on the way leaves it for the next one (`read_journal`)."""

    path: Path
    venv: list[int]
    paths: list[str] = dataclasses.field(default_factory=list)
    dists: dict[str, str | None] = dataclasses.field(default_factory=dict)
    records: dict[str, list] = dataclasses.field(default_factory=dict)

    def add(self, paths: Iterable[str], dists: dict[str, str | None]) -> None:
        self.paths += paths
        self.dists.update(dists)
        self._save()

    def wrote(self, t: Target, dists: Iterable[str]) -> None:
        """Right after a pip call installed `dists`: their RECORDs, the only ones a repair may take back."""
        self.records.update(written(t, set(dists)))
        self._save()

    def _save(self) -> None:
        data = {**dataclasses.asdict(self), "path": None, "paths": sorted(set(self.paths))}
        cachetrust.make_dir(self.path.parent, 0o700)
        fsedit.atomic_write(self.path, json.dumps(data).encode(), 0o600)

    def done(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()


def read_journal(path: Path) -> Journal | None:
    """The journal a killed run left, or None (none, or not one apexkit wrote: dropped). Only a regular file of
    ours that nobody else can write (fsedit.check_private: EnvironmentSetupError otherwise) is acted on."""
    fsedit.check_private(path, "the install journal", directory=False)
    try:
        data = untrusted.read_json_object(path, None, RECORD_LIMIT, "the install journal")
    except (untrusted.Untrusted, OSError):
        return None
    venv, paths, dists, records = (data.get(k) for k in ("venv", "paths", "dists", "records"))
    if not (isinstance(venv, list) and isinstance(paths, list) and isinstance(dists, dict)):
        return None
    return Journal(
        path,
        venv,
        [p for p in paths if isinstance(p, str)],
        {k: v for k, v in dists.items() if isinstance(k, str) and isinstance(v, (str, type(None)))},
        records if isinstance(records, dict) else {},
    )


def remove_orphans(
    paths: Iterable[str], t: Target, owned: dict[str, set[str]], dry_run: bool = False
) -> list[str]:
    """Delete each of `paths` that is a file inside the venv's site or scripts directories, reached through no
    symbolic link, and that no distribution's RECORD lists (what pip wrote before it was killed), then its folders
    left empty; with `dry_run`, only say which."""
    prefix = os.path.realpath(t.venv) + os.sep
    homes = [h for h in (*t.site_dirs, t.scripts or "") if h.startswith(prefix)]
    removed = []
    for path in paths:
        home = next((h for h in homes if os.path.normpath(path).startswith(h + os.sep)), None)
        if home is None or path in owned or not os.path.isfile(path):
            continue
        if os.path.realpath(path) != os.path.normpath(path):  # a link, or inside a linked folder
            continue
        if dry_run:
            removed.append(os.path.relpath(path, home))
            continue
        with contextlib.suppress(OSError):
            os.unlink(path)
            removed.append(os.path.relpath(path, home))
            folder = os.path.dirname(path)
            while folder != home and not os.listdir(folder):
                os.rmdir(folder)
                folder = os.path.dirname(folder)
    return removed
