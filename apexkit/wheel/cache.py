"""The content-addressed wheel cache: <cache>/wheels/<key[:2]>/<key>/ holds a built wheel, its manifest and, once
published, its SBOM and provenance, so a build of the same inputs (buildplan.cache_key) is a copy, not a compile.

The cache may be shared (CI runners, NFS, a team's /data): an entry is untrusted input. A hit is read without
following links, its wheel copied and re-hashed here (the manifest's sha256 must match the copy, not the file
that might be swapped after the check), zip-checked, and smoke-tested too with --test-cached. A cache that
someone else can write is not used at all.

A second tier can stand behind it: a `RemoteLookup` (the team index, injected by the command edge, since the wheel
build knows nothing of indexes) asked after a local miss. Its hit, already verified by the lookup, is stored here
and then read back through `lookup` like any local hit (re-hashed, zip-checked), so both tiers end in one check.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, Optional, Tuple

from apexkit import cachetrust, fsedit, log, untrusted
from apexkit.errors import ApexkitError
from apexkit.wheel import distdir, sbom

# (the wheel's verified copy, its manifest, the SBOM/provenance the entry keeps or None); typing's forms: Python 3.8
CachedWheel = Tuple[Path, dict, Optional[Dict[str, bytes]]]


@dataclass(frozen=True)
class RemoteHit:
    """A wheel a second-tier cache (the team index) holds for a cache key, downloaded into the build's work
    directory and verified by the lookup: sha256 against the index and the build's manifest, provenance subject,
    SBOM, zip check."""

    wheel: Path
    manifest: dict  # the build's manifest.json, as published beside the wheel
    documents: dict[
        str, bytes
    ]  # {sbom.SBOM_FILE: ..., sbom.PROVENANCE_FILE: ...}, or {} when the index keeps none
    source: str  # where it came from, for messages and manifest["cache_source"]: never a password (log.mask)


# (cache key, work directory) -> a verified hit, or None: a miss, or (after one warning line of its own) an index
# that could not be read or a wheel refused. Never raises for the network or for what an index holds.
RemoteLookup = Callable[[str, Path], Optional[RemoteHit]]


class WheelCache:
    def __init__(self, root: Path) -> None:
        self.root = root  # <cache>/wheels

    def entry(self, key: str) -> Path:
        return self.root / key[:2] / key

    def usable(self) -> bool:
        """Whether the wheel cache may be read and written: nobody but us (or root) can write it."""
        for path in (self.root.parent, self.root):
            try:
                st = path.stat() if path == self.root.parent else path.lstat()
            except FileNotFoundError:
                continue
            except OSError as exc:
                reason: str | None = f"unreadable ({exc.strerror})"
            else:
                reason = (
                    untrusted.others_can_write(st)
                    if stat.S_ISDIR(st.st_mode)
                    else "not a directory"
                )
            if reason:
                log.warn(
                    f"wheel cache {path} is {reason}: not using it (whoever can write it could swap the wheel this "
                    f"build publishes); chmod -R go-w {path}, or set APEXKIT_CACHE_DIR to a directory only you "
                    "can write"
                )
                return False
        return True

    def lookup(self, key: str, work: Path) -> CachedWheel | None:
        """A verified copy of the cached wheel in `work`, its manifest and the SBOM/provenance the entry keeps (None when
        it keeps none), or None (a miss, or an entry refused)."""
        entry = self.entry(key)
        if not os.path.lexists(entry):
            return None
        dest = work / "cached-wheel"
        shutil.rmtree(dest, ignore_errors=True)
        dest.mkdir(parents=True)
        try:
            with untrusted.opened_dir(entry.parent) as shard:
                _ours(os.fstat(shard), entry.parent.name)
            with untrusted.opened_dir(entry) as fd:
                _ours(os.fstat(fd), "the entry")
                manifest, name = distdir.read_manifest(fd)
                wheel = manifest["wheel"]
                documents = _cached_documents(manifest, fd)
                src = untrusted.open_regular(name, fd)
            try:
                _ours(os.fstat(src), untrusted.shown(name))
                sha, size = untrusted.copy_fd(src, dest / name)
            finally:
                os.close(src)
            if sha != wheel["sha256"]:
                raise untrusted.Untrusted(
                    f"{untrusted.shown(name)} does not match its recorded sha256"
                )
            untrusted.check_zip(dest / name)
        except (untrusted.Untrusted, OSError, ValueError) as exc:
            shutil.rmtree(dest, ignore_errors=True)
            log.warn(f"wheel cache entry {entry} refused ({exc}): rebuilding")
            return None
        manifest["wheel"] = {**wheel, "file": name, "sha256": sha, "size": size}
        return dest / name, manifest, documents

    def adopt(self, key: str, hit: RemoteHit, work: Path) -> CachedWheel | None:
        """A second-tier hit kept as this cache's entry for `key` (with its SBOM and provenance), then read back
        through `lookup` like any local hit, so the next build of these inputs is a local hit. None (one warning line)
        when its manifest is not the build of `key`, or the cache cannot take it."""
        manifest = hit.manifest
        wheel = manifest.get("wheel") if isinstance(manifest, dict) else None
        if not isinstance(wheel, dict) or wheel.get("file") != hit.wheel.name:
            why = "its manifest does not name that wheel"
        elif manifest.get("cache_key") != key:
            why = "its manifest records another cache key"
        else:
            why = ""
        if why:
            log.warn(
                f"team index {log.sanitise(log.mask(hit.source))}: {untrusted.shown(hit.wheel.name)} refused "
                f"({why}): compiling"
            )
            return None
        self.store(key, hit.wheel, _as_built(manifest))
        self.attach(key, hit.documents, manifest)
        return self.lookup(key, work)

    def store(self, key: str, wheel: Path, manifest: dict) -> None:
        entry = self.entry(key)
        try:
            tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=cachetrust.make_dir(entry.parent)))
            shutil.copy2(wheel, tmp / wheel.name)
            (tmp / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
            for name in (
                wheel.name,
                "manifest.json",
            ):  # whatever the umask: lookup refuses a writable entry
                os.chmod(tmp / name, 0o644)
            os.chmod(tmp, 0o755)
            if entry.is_symlink() or (os.path.lexists(entry) and not entry.is_dir()):
                entry.unlink()  # a link left in the cache goes; its target stays
            else:
                shutil.rmtree(entry, ignore_errors=True)
            os.replace(tmp, entry)
        except (
            OSError
        ) as exc:  # the wheel is built; a cache that cannot take it is not a failed build
            log.warn(
                f"could not store the wheel in the cache {entry.parent}: {exc.strerror or exc}"
            )

    def attach(self, key: str, documents: dict[str, bytes], manifest: dict) -> None:
        """Keep the SBOM and provenance beside the cached wheel (the entry's manifest then records them): a hit
        publishes the build's own attestations instead of writing them again (most of a no-op's time)."""
        record = manifest.get("attestations") or {}
        if not (documents and record.get("sbom") and record.get("provenance")):
            return
        entry = self.entry(key)
        try:
            stored = json.loads((entry / "manifest.json").read_text())
            if stored.get("wheel", {}).get("sha256") != manifest["wheel"]["sha256"]:
                return
            for name, data in documents.items():
                fsedit.atomic_write(entry / name, data, 0o644)
            stored["attestations"] = record
            fsedit.atomic_write(
                entry / "manifest.json", (json.dumps(stored, indent=2) + "\n").encode(), 0o644
            )
        except (
            OSError,
            ValueError,
            ApexkitError,
        ) as exc:  # the build is published; the next hit writes them again
            log.warn(f"could not keep the SBOM/provenance in the cache entry {entry}: {exc}")


def _as_built(manifest: dict) -> dict:
    """The manifest of the build itself: a published cache hit's manifest (cache_hit true) gets back the figures of
    the build it republished (`built`, built_durations_s, built_ccache), so a hit of a hit stays a hit of that build."""
    out = {k: v for k, v in manifest.items() if k != "cache_source"}
    if out.get("cache_hit"):
        out["created"] = out.pop("built", out.get("created"))
        out["durations_s"] = out.pop("built_durations_s", out.get("durations_s"))
        out["ccache"] = out.pop("built_ccache", out.get("ccache"))
    out["cache_hit"] = False
    return out


def _cached_documents(manifest: dict, fd: int) -> dict[str, bytes] | None:
    """The SBOM and provenance a cache entry keeps (read without following links, each matching the sha256 its
    manifest records), or None: then the publish writes them again."""
    record = manifest.get("attestations")
    if not isinstance(record, dict):
        return None
    out = {}
    for kind, name in (("sbom", sbom.SBOM_FILE), ("provenance", sbom.PROVENANCE_FILE)):
        entry = record.get(kind)
        if not isinstance(entry, dict) or entry.get("file") != name:
            return None
        try:
            data = untrusted.read_regular(name, fd, distdir.MANIFEST_MAX)
        except (untrusted.Untrusted, OSError):
            return None
        if hashlib.sha256(data).hexdigest() != entry.get("sha256"):
            return None
        out[name] = data
    return out


def _ours(st: os.stat_result, what: str) -> None:
    """A wheel-cache entry (its shard folder, folder, wheel) is used only when nobody but us (or root) could have
    written it: a shard made group-writable under umask 002, then tightened with chmod on the top only, may hold
    another user's entry."""
    reason = untrusted.others_can_write(st)
    if reason:
        raise untrusted.Untrusted(f"{what} is {reason}")
