"""`invoke publish`: dist/ -> a PEP 503 "simple" index directory that pip installs from (file:// or any static web
server): <index>/simple/index.html, <index>/simple/<project>/index.html with `<wheel>#sha256=<digest>` links, the
wheels beside them, and index.json (which build each file came from).

One filename is one wheel: a filename already in the index with other bytes, or two targets offering different
wheels under one name, is refused. One target id is one wheel: a rebuild of a target under another file name
replaces the older wheel of that target (by the build time its manifest records), named in one line. A wheel whose
platform tag contradicts its manifest (the machine, or the glibc floor its build computed) is refused: renamed, it
would install where it cannot load. Wheel names carry the build tuple in their local version label
(apex-0.1+ascend.torch2.13.0-..., see docs/wheels.md) and METADATA pins that torch, so wheels for several torches
share one index and pip picks the one that installs next to the user's torch (`pip install
"apex==0.1+ascend.torch2.7.1.npu2.7.1.post11"` names one). --split-by-torch (one index per torch version) still
works; it was needed while every wheel was apex-0.1+ascend-..., and is kept for indexes laid out that way.
The index is rebuilt in a temporary directory and swapped in, so readers never see
a half-written one, and wheels published earlier stay.

Each wheel's SBOM and provenance (dist/<target>/sbom.cdx.json, provenance.json: apexkit.wheel.sbom) go next to it, named
after the wheel so two wheels never share one: simple/<project>/<wheel>.cdx.json and <wheel>.provenance.json
(ATTESTATIONS), the way PEP 658 puts <wheel>.metadata beside a wheel. They are not links of the PEP 503 page (pip
and uv want distributions there); index.json lists them per wheel with their sha256. Like the wheel, each is read
without following links, must match the sha256 its manifest recorded, must name this wheel (the provenance's
subject, the SBOM's metadata.component hash) and is re-hashed while it is copied; a target whose manifest records none
(built before apexkit wrote them) is published without them.

The index is also the team's wheel cache (apexkit.index.remote): each wheel's build manifest goes beside it as
<wheel>.manifest.json, and index.json records per wheel its cache key (buildplan.cache_key: a build elsewhere with
the same inputs takes this wheel instead of compiling) and its facts (python and its tags, arch, torch, torch_npu,
CANN, C++ ABI, version, Requires-Dist, Requires-Python: `facts_of`), so `apexkit install` matches a venv to a wheel
without guessing from the name. Facts come from an untrusted manifest and are kept only as short plain strings.

Trust: dist/*/manifest.json, the index directory and its index.json may have been written by someone else (a build
container, a cache, a user's web root). publish never destroys what it did not make: an index root is replaced only
when it does not exist, is empty, or is an apexkit index -- index.json (a regular file, marked
`"format": "apexkit-index/1"`; indexes from before the marker are recognised by their shape) and nothing in the
tree but what that index.json lists (simple/index.html, simple/<project>/index.html and the wheels). A manifest's
torch must be a PEP 440 version before it becomes a path, its wheel.file a plain wheel filename of a regular,
non-symlink file in its own dist/<target>/; every wheel (new or already published) is read without following links
and re-hashed on the host while it is copied.
"""

from __future__ import annotations

import calendar
import contextlib
import dataclasses
import hashlib
import json
import os
import re
import shutil
import stat
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packaging.utils import canonicalize_name, parse_wheel_filename
from packaging.version import Version

from apexkit import cachetrust, fsedit, locks, log, untrusted, vocab
from apexkit.errors import ApexkitError, ConfigError
from apexkit.index import pages, signing
from apexkit.plan import matrix, target
from apexkit.wheel import distdir, sbom

FORMAT = "apexkit-index/1"  # index.json's marker: this directory is an index apexkit wrote
# manifest["attestations"] kind -> (its file in dist/<target>/, the suffix it gets after the wheel's name in the index)
ATTESTATIONS = {
    "sbom": (sbom.SBOM_FILE, ".cdx.json"),
    "provenance": (sbom.PROVENANCE_FILE, ".provenance.json"),
}
ATTESTATION_MAX = 16 << 20  # bytes; a torch build venv's SBOM is ~100 KiB
MANIFEST_SUFFIX = (
    ".manifest.json"  # the build's dist manifest beside its wheel: the index is a wheel cache too
)
SIGNATURE = "signature"  # the Attestation kind of <wheel>.intoto.jsonl (signing.SUFFIX), its keyid the signer's
_SHA256 = re.compile(r"[0-9a-f]{64}")
# a platform tag's glibc floor and machine: manylinux_2_24_x86_64, the legacy manylinux2014_x86_64, linux_x86_64
_PLATFORM = re.compile(r"(?:manylinux_(\d+)_(\d+)|manylinux(1|2010|2014)|linux)_([a-z0-9_]+)")
_LEGACY_GLIBC = {"1": (2, 5), "2010": (2, 12), "2014": (2, 17)}
_REBUILD = "rebuild that target (or remove it from the dist directory)"
# What a fact of index.json may be: short printable text from a small alphabet (versions, tags, refs, pins), so a
# reader may show it, compare it and put it in a page after escaping, never a path or markup.
_FACT = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+!=<>~*,;: -]{0,199}")
FACT_FIELDS = (
    "python",
    "python_tag",
    "abi_tag",
    "platform_tag",
    "arch",
    "torch",
    "torch_npu",
    "cann",
    "version",
    "requires_python",
    "apex_ref",
    "backend",
    "cuda",
)


@dataclass(frozen=True)
class Attestation:
    kind: str  # a key of ATTESTATIONS
    filename: str  # in the index: <wheel filename><suffix>
    path: Path  # where it is read from (dist/<target>/sbom.cdx.json, or the index itself)
    sha256: str
    keyid: str = ""  # a signature's: the key id that signed it


@dataclass(frozen=True)
class Entry:
    project: str  # PEP 503 normalised
    filename: str
    path: Path
    sha256: str
    target: str  # the dist/<target-id> it was built as
    torch: str
    in_index: bool = False  # already published (read from index.json)
    attestations: tuple[Attestation, ...] = ()
    cache_key: str | None = (
        None  # the build's content address (buildplan.cache_key): the index is a wheel cache
    )
    facts: dict = field(
        default_factory=dict
    )  # what the wheel is for (FACT_FIELDS, cxx11_abi, requires_dist, ...)
    manifest: Attestation | None = None  # the build's manifest, published as <wheel>.manifest.json
    signature: Attestation | None = None  # <wheel>.intoto.jsonl (docs/signing.md); None: unsigned


def _field(data: Any, dotted: str, where: Path) -> Any:
    """data["a"]["b"] for "a.b", or a one-line refusal naming the file and the field."""
    value = data
    for key in dotted.split("."):
        if not isinstance(value, dict) or key not in value:
            raise ConfigError(f"{where}: no {dotted}", _REBUILD)
        value = value[key]
    return value


def torch_version(raw: Any, where: Path, field: str) -> str:
    """The public PEP 440 version (2.13.0 for 2.13.0+cpu) a torch field names, checked before it becomes a path."""
    return Version(target.check_version(raw, f"{where}: {field}", _REBUILD)).public


def _why(exc: untrusted.Refused) -> str:
    """What publish says of a file `untrusted` refused to open."""
    return {"link": "is a symlink", "type": "is not a regular file"}.get(exc.kind) or str(
        exc.error or exc.why
    )


def _copy_hashed(src: Path, dst: Path | None) -> str:
    """sha256 of the regular file `src` (read without following links), copied to `dst` on the way when given."""
    digest = hashlib.sha256()
    try:
        fd = untrusted.open_regular(src)
    except untrusted.Refused as exc:
        if isinstance(exc.error, FileNotFoundError):
            raise exc.error from None
        raise ValueError(_why(exc)) from None
    with os.fdopen(fd, "rb") as fh, open(dst, "xb") if dst else open(os.devnull, "wb") as out:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
            out.write(chunk)
    return digest.hexdigest()


def _fact(value: Any) -> str | None:
    return value if isinstance(value, str) and _FACT.fullmatch(value) else None


def _requires_python(wheel: Path) -> str | None:
    """Requires-Python of the wheel's METADATA (read as its .metadata page is: pages.read_metadata), or None."""
    try:
        return _fact(pages.requires_python(pages.read_metadata(wheel)))
    except ConfigError:
        return None


def facts_of(manifest: dict, filename: str, wheel: Path | None = None) -> dict:
    """What a wheel is for, as index.json records it (files[i].facts): the target's python, arch, torch, torch_npu,
    the stack's CANN, the C++ ABI its torch had, the wheel's tags, version and pins. Read from an untrusted manifest:
    each value a short plain string (or null), so readers compare and show them without more checks."""
    plan, identity = _object(manifest, "target"), _object(manifest, "identity")
    expect = _object(_object(manifest, "binary_checks"), "expect")
    _name, version, _build, tags = parse_wheel_filename(filename)
    tag = sorted(tags, key=str)[0]
    torch = _fact(plan.get("torch"))
    try:
        torch = Version(torch).public if torch else None
    except ValueError:  # InvalidVersion, or a number past int's digit limit
        torch = None
    abi = expect.get("cxx11_abi")
    pins = identity.get("requires_dist")
    return {
        "python": _fact(plan.get("python")),
        "python_tag": tag.interpreter,
        "abi_tag": tag.abi,
        "platform_tag": tag.platform,
        "arch": _fact(plan.get("arch")),
        "torch": torch,
        "torch_npu": _fact(plan.get("torch_npu")),
        "cann": _fact(plan.get("cann")),
        "cxx11_abi": abi if abi in (0, 1) and not isinstance(abi, bool) else None,
        "version": str(version),
        "requires_dist": [p for p in pins if _fact(p)] if isinstance(pins, list) else [],
        "requires_python": _requires_python(wheel) if wheel is not None else None,
        "apex_ref": _fact(plan.get("apex_ref")),
        # NVIDIA apex on CUDA: for a venv whose torch is that CUDA release only (an Ascend wheel: null, null)
        "backend": "cuda" if plan.get("backend") == "cuda" else None,
        "cuda": _fact(plan.get("torch_cuda")) if plan.get("backend") == "cuda" else None,
        "identity": _plain(_object(plan, "identity")),
    }


def _object(data: dict, key: str) -> dict:
    value = data.get(key)
    return value if isinstance(value, dict) else {}


def _plain(value: Any, depth: int = 0) -> Any:
    """A JSON value reduced to plain facts (strings matching _FACT, numbers, booleans, lists, objects), or None."""
    if depth > 3:
        return None
    if isinstance(value, bool) or value is None or isinstance(value, int):
        return value
    if isinstance(value, str):
        return _fact(value)
    if isinstance(value, list):
        return [_plain(v, depth + 1) for v in value[:64]]
    if isinstance(value, dict):
        return {k: _plain(v, depth + 1) for k, v in list(value.items())[:64] if _fact(k)}
    return None


def check_facts(raw: Any, where: str, fix: str) -> dict:
    """files[i].facts of an index.json read back: an object whose FACT_FIELDS are plain strings or null."""
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}.facts is not an object", fix)
    for key in FACT_FIELDS:
        if raw.get(key) is not None and _fact(raw.get(key)) is None:
            raise ConfigError(f"{where}.facts.{key} is not a plain version or tag", fix)
    abi, pins = raw.get("cxx11_abi"), raw.get("requires_dist", [])
    if abi not in (None, 0, 1) or isinstance(abi, bool):
        raise ConfigError(f"{where}.facts.cxx11_abi is not 0, 1 or null", fix)
    if not isinstance(pins, list) or any(_fact(p) is None for p in pins):
        raise ConfigError(f"{where}.facts.requires_dist is not a list of pins", fix)
    return {**raw, "identity": _plain(raw.get("identity") or {})}


def is_sha256(value: Any) -> bool:
    return isinstance(value, str) and bool(_SHA256.fullmatch(value))


def collect(dist: Path, targets: list[str] | None = None) -> list[Entry]:
    """Every dist/<target>/ with a manifest and its wheel (checked against the manifest's sha256)."""
    build = f"build first: {vocab.build('3.11')}"
    if not dist.is_dir():
        raise ConfigError(f"{dist} does not exist", f"{build} (or pass --dist DIR)")
    built = sorted(dist.glob("*/manifest.json"))
    named = [m for m in built if not targets or m.parent.name in targets]
    entries = [e for m in named if (e := _built(dist, m, targets)) is not None]
    missing = sorted(set(targets or ()) - {e.target for e in entries})
    if missing:
        raise ConfigError(
            f"no built target {', '.join(missing)} in {dist}",
            f"choose from {', '.join(p.parent.name for p in built)}",
        )
    if not entries:
        raise ConfigError(f"no built wheel in {dist} (no */manifest.json)", build)
    return entries


def _built(dist: Path, manifest_path: Path, targets: list[str] | None) -> Entry | None:
    """The wheel of one dist/<target>/, checked; None for a build that is left out (said in one line)."""
    folder, target = manifest_path.parent, manifest_path.parent.name
    manifest, manifest_bytes = _read_manifest(dist, manifest_path)
    if _left_out(target, manifest, targets):
        return None
    try:
        file = untrusted.wheel_name(_field(manifest, "wheel.file", manifest_path))
    except untrusted.Untrusted as exc:
        raise ConfigError(f"{manifest_path}: {exc}", _REBUILD) from None
    expected = _field(manifest, "wheel.sha256", manifest_path)
    if not is_sha256(expected):
        raise ConfigError(
            f"{manifest_path}: wheel.sha256 {expected!r} is not a sha256 hex digest", _REBUILD
        )
    torch = torch_version(
        _field(manifest, "target.torch", manifest_path), manifest_path, "target.torch"
    )
    wheel = folder / file
    try:
        digest = _copy_hashed(wheel, None)
    except FileNotFoundError:
        raise ConfigError(
            f"{manifest_path}: wheel.file {file} does not exist in {folder}", _REBUILD
        ) from None
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{manifest_path}: wheel.file {file} {exc}", _REBUILD) from None
    if digest != expected:
        raise ConfigError(f"{wheel} does not match the sha256 in its manifest", f"rebuild {target}")
    why = _contradiction(file, manifest)
    if why:
        raise ConfigError(
            f"{wheel}: {why}", f"rebuild {target} (a wheel keeps the tags its build computed)"
        )
    attestations = _attestations(manifest, manifest_path, file, digest)
    if not attestations:
        log.info(
            f"  {target}: no SBOM or provenance recorded in its manifest (built before apexkit wrote them): "
            "the wheel goes without them"
        )
    cache_key = manifest.get("cache_key")
    return Entry(
        canonicalize_name(parse_wheel_filename(file)[0]),
        file,
        wheel,
        digest,
        target,
        torch,
        attestations=attestations,
        cache_key=cache_key if is_sha256(cache_key) else None,
        facts=facts_of(manifest, file, wheel),
        manifest=Attestation(
            "manifest",
            file + MANIFEST_SUFFIX,
            manifest_path,
            hashlib.sha256(manifest_bytes).hexdigest(),
        ),
    )


def _platform(tag: Any) -> tuple[tuple[int, int] | None, str] | None:
    """(glibc floor or None, machine) of a linux platform tag; None for another tag (any, win_amd64, ...)."""
    m = _PLATFORM.fullmatch(tag) if isinstance(tag, str) else None
    return (
        None
        if m is None
        else (_LEGACY_GLIBC.get(m[3]) or ((int(m[1]), int(m[2])) if m[1] else None), m[4])
    )


def _contradiction(file: str, manifest: dict) -> str | None:
    """How the wheel's platform tag contradicts its manifest (None when it does not): the machine (target.arch), the
    manylinux tag its build computed from the modules' symbols (identity.manylinux_tag, recorded as null when none
    was), or the newest glibc symbol its modules need (identity.max_glibc): a renamed wheel would install where it
    cannot load, or be refused where it would."""
    identity, arch = _object(manifest, "identity"), _object(manifest, "target").get("arch")
    need = re.fullmatch(r"GLIBC_(\d+)\.(\d+)", str(identity.get("max_glibc")))
    computed = _platform(identity.get("manylinux_tag"))
    for tag in sorted({t.platform for t in parse_wheel_filename(file)[3]}):
        found = _platform(tag)
        if found is None:
            continue
        glibc, machine = found
        if isinstance(arch, str) and machine != arch:
            return f"its platform tag {tag} is for {machine}, its manifest's target.arch is {arch}"
        if glibc and "manylinux_tag" in identity and (computed is None or computed[0] != glibc):
            return (
                f"its platform tag {tag} says glibc {glibc[0]}.{glibc[1]}, its manifest records the build computed "
                f"{identity['manylinux_tag'] or 'no manylinux tag'} (identity.manylinux_tag)"
            )
        if glibc and need and glibc < (int(need[1]), int(need[2])):
            return (
                f"its platform tag {tag} says glibc {glibc[0]}.{glibc[1]}, below the {need[0]} its manifest records "
                "its modules need (identity.max_glibc)"
            )
    return None


def _built_at(e: Entry) -> float:
    """When a wheel was built: its manifest's `built` (a cache hit: the build it came from) or `created`, else the
    wheel file's mtime (0 when unreadable)."""
    manifest: Any = {}
    if e.manifest:
        with contextlib.suppress(untrusted.Refused, UnicodeDecodeError, ValueError, RecursionError):
            manifest = json.loads(
                untrusted.read_regular(e.manifest.path, None, distdir.MANIFEST_MAX)
            )
    for key in ("built", "created"):
        with contextlib.suppress(TypeError, ValueError, AttributeError):
            return float(calendar.timegm(time.strptime(manifest.get(key), "%Y-%m-%dT%H:%M:%SZ")))
    try:
        return e.path.lstat().st_mtime
    except OSError:
        return 0.0


def _one_per_target(files: list[Entry]) -> list[Entry]:
    """One wheel per target id: of wheels built as one dist/<target> (a rebuild under another file name), the newest
    by build time stays (a tie: the one being published) and each older one leaves the index, named in one line."""
    by_target: dict[str, list[Entry]] = {}
    for e in files:
        by_target.setdefault(e.target if e.target != "?" else f"?{e.filename}", []).append(e)
    for tid, mine in by_target.items():
        if len(mine) > 1:
            built = {e.filename: _built_at(e) for e in mine}
            mine.sort(key=lambda e: (built[e.filename], not e.in_index))
            for old in mine[:-1]:
                log.info(
                    f"  {tid}: one wheel per target id: keeping {mine[-1].filename} (built "
                    f"{_when(built[mine[-1].filename])}), dropping the older {old.filename} (built "
                    f"{_when(built[old.filename])}"
                    + (", published before)" if old.in_index else f", in {old.path.parent})")
                )
    return sorted((mine[-1] for mine in by_target.values()), key=lambda e: (e.project, e.filename))


def _when(seconds: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(seconds))


def _read_manifest(dist: Path, manifest_path: Path) -> tuple[dict, bytes]:
    """dist/<target>/manifest.json as an object and its bytes: read without following links, inside `dist`."""
    folder = manifest_path.parent
    if (
        folder.is_symlink()
        or not (folder.resolve() == dist.resolve() or dist.resolve() in folder.resolve().parents)
        or manifest_path.is_symlink()
    ):
        raise ConfigError(
            f"{folder if folder.is_symlink() else manifest_path} is a symlink: publish takes only "
            f"what was built inside {dist}",
            "replace it with the directory itself, or remove it",
        )
    try:
        manifest_bytes = untrusted.read_regular(manifest_path, None, distdir.MANIFEST_MAX)
        manifest = json.loads(manifest_bytes.decode("utf-8"))
    except untrusted.Refused as exc:  # not a FIFO (a blocked read), device or link
        why: object = _why(exc)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        why = exc
    else:
        if isinstance(manifest, dict):
            return manifest, manifest_bytes
        why = "not an object"
    raise ConfigError(f"{manifest_path} is not a readable JSON manifest ({why})", _REBUILD)


def _left_out(target: str, manifest: dict, targets: list[str] | None) -> bool:
    """Whether a built target stays out of the index: a sanitizer build always (refused when named), a diagnosis
    build unless named."""
    identity = _object(_object(manifest, "target"), "identity")
    if identity.get("sanitize") or "asan" in target.split("+")[1:]:
        if targets:
            raise ConfigError(
                f"{target} is a sanitizer build (--sanitize, +asan): it is never published",
                "build the target without --sanitize and publish that one",
            )
        log.info(f"  skipping {target}: a sanitizer build (--sanitize, +asan) is never published")
        return True
    if identity.get("skip_patches") and not targets:
        log.info(
            f"  skipping {target}: a diagnosis build (--skip-patch); name it with --target to publish it"
        )
        return True
    return False


def _attestations(
    manifest: dict, manifest_path: Path, wheel: str, wheel_sha256: str
) -> tuple[Attestation, ...]:
    """The SBOM and provenance of dist/<target>/ that its manifest records (attestations.<kind>.file and .sha256),
    each read once without following links, matched against that sha256 and checked to describe this wheel."""
    recorded = manifest.get("attestations")
    if not isinstance(recorded, dict):
        return ()
    folder, target = manifest_path.parent, manifest_path.parent.name
    hint = f"rebuild {target} (it writes its SBOM and provenance again)"
    out = []
    for kind, (source, suffix) in ATTESTATIONS.items():
        record = recorded.get(kind)
        if (
            record is None
        ):  # no SBOM without cyclonedx-python-lib (attestations.sbom_missing says why)
            continue
        if not isinstance(record, dict) or record.get("file") != source:
            raise ConfigError(f"{manifest_path}: attestations.{kind}.file is not {source}", hint)
        expected = record.get("sha256")
        if not is_sha256(expected):
            raise ConfigError(
                f"{manifest_path}: attestations.{kind}.sha256 {expected!r} is not a sha256 hex digest",
                hint,
            )
        path = folder / source
        try:
            data = untrusted.read_regular(path, None, ATTESTATION_MAX)
        except untrusted.Refused as exc:
            if isinstance(exc.error, FileNotFoundError):
                raise ConfigError(
                    f"{manifest_path}: attestations.{kind} {source} does not exist in {folder}",
                    hint,
                ) from None
            if exc.kind == "size":  # larger than any we write: not the one its manifest names
                raise ConfigError(
                    f"{path} does not match the sha256 in its manifest", hint
                ) from None
            raise ConfigError(f"{path} {_why(exc)}", hint) from None
        if hashlib.sha256(data).hexdigest() != expected:
            raise ConfigError(f"{path} does not match the sha256 in its manifest", hint)
        why = not_about(kind, data, wheel, wheel_sha256)
        if why:
            raise ConfigError(f"{path} {why}", hint)
        out.append(Attestation(kind, wheel + suffix, path, expected))
    return tuple(out)


def not_about(kind: str, data: bytes, wheel: str, wheel_sha256: str) -> str | None:
    """Why this SBOM / provenance does not describe `wheel` (None when it does)."""
    try:
        doc = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        return "is not JSON"
    if not isinstance(doc, dict):
        return "is not a JSON object"
    if kind == "provenance":
        subjects = doc.get("subject")
        named = (
            isinstance(subjects, list)
            and {"name": wheel, "digest": {"sha256": wheel_sha256}} in subjects
        )
        return None if named else f"has no subject {wheel} with the wheel's sha256"
    component = (
        doc.get("metadata", {}).get("component") if isinstance(doc.get("metadata"), dict) else None
    )
    hashes = component.get("hashes") if isinstance(component, dict) else None
    described = isinstance(hashes, list) and {"alg": "SHA-256", "content": wheel_sha256} in hashes
    return (
        None if described else "does not describe the wheel (metadata.component has not its sha256)"
    )


def _foreign(root: Path, hint: str, what: str) -> ConfigError:
    return ConfigError(
        f"{root} is not an apexkit index: {what}; publish replaces the whole directory and would "
        "delete it",
        hint,
    )


def _existing(root: Path) -> list[Entry]:
    """What an index already holds (from its index.json), after making sure that replacing `root` loses nothing
    apexkit did not write: a missing or empty directory, or an apexkit index whose tree holds only its own files."""
    hint = (
        "publish into a new or empty directory (e.g. --index ./index), or move the other files out of "
        f"{root}"
    )
    if root.is_symlink():
        raise ConfigError(
            f"{root} is a symlink", f"pass the directory it points to ({root.resolve()}) as --index"
        )
    if root.exists() and not root.is_dir():
        raise ConfigError(f"{root} is not a directory", hint)
    if not root.exists() or not any(root.iterdir()):
        return []
    data_file = root / "index.json"
    fix = f"restore {data_file} from the index's last publish, or publish into a new directory"
    entries = [
        read_entry(f, root, f"{data_file}: files[{n}]", fix)
        for n, f in enumerate(_index_files(root, hint))
    ]
    ours = {Path("index.json"), Path("simple"), Path("simple/index.html"), Path("index.html")}
    for e in entries:
        folder = Path("simple", e.project)
        ours |= {
            folder,
            folder / "index.html",
            folder / e.filename,
            Path(pages.torch_page_name(pages.facts(e)["torch"])),
        }
        # the .metadata beside a wheel is regenerated from it
        ours |= {
            folder / name
            for name in (e.filename + pages.METADATA_SUFFIX, *(a.filename for a in _documents(e)))
        }
    others = sorted(
        f"{p.relative_to(root)}{' (a symlink)' if p.is_symlink() else ''}"
        for p in root.rglob("*")
        if p.relative_to(root) not in ours or p.is_symlink()
    )  # rglob does not descend into links
    if others:
        raise _foreign(root, hint, f"it holds {_list(others)}, which its index.json does not list")
    return entries


def _index_files(root: Path, hint: str) -> list:
    """files of the index.json of a non-empty root, refused (`_foreign`) unless apexkit wrote it (marked FORMAT,
    or shaped as before the marker)."""
    data_file = root / "index.json"
    if data_file.is_symlink() or not data_file.is_file():
        names = _list(sorted(p.name for p in root.iterdir()))
        raise _foreign(root, hint, f"it holds {names} and no index.json")
    try:
        files = listed(json.loads(data_file.read_text()))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError):
        raise _foreign(root, hint, "its index.json is not JSON") from None
    if files is None:
        raise _foreign(root, hint, f'its index.json has no "format": "{FORMAT}"')
    return files


def listed(data: Any) -> list | None:
    """files of a parsed index.json that apexkit wrote (marked FORMAT, or shaped as before the marker), else None."""
    if not isinstance(data, dict) or not isinstance(data.get("files"), list):
        return None
    legacy = "format" not in data and set(data) == {"generated", "files"}  # before the marker
    return data["files"] if data.get("format") == FORMAT or legacy else None


def read_entry(f: Any, root: Path, where: str, fix: str) -> Entry:
    """files[i] of the index.json of the index `root` (`where` names it in errors), checked, as an Entry already in
    the index: the one reader of index.json's entries (publish refuses a bad one, apexkit.index.remote leaves it
    out). ConfigError otherwise."""
    if not isinstance(f, dict):
        raise ConfigError(f"{where} is not an object", fix)
    try:
        name = untrusted.wheel_name(f.get("filename"), f"{where}.filename")
    except untrusted.Untrusted as exc:
        raise ConfigError(str(exc), fix) from None
    project = canonicalize_name(parse_wheel_filename(name)[0])
    if not re.fullmatch(
        r"[a-z0-9]+(?:-[a-z0-9]+)*", project
    ):  # it becomes simple/<project>/ in a URL and a path
        raise ConfigError(
            f"{where}.project {untrusted.shown(project)} is not a plain ASCII project name", fix
        )
    if f.get("project") != project:
        raise ConfigError(f"{where}.project {f.get('project')!r} is not {project!r}", fix)
    for key in ("sha256", "cache_key"):
        if (key == "sha256" or f.get(key) is not None) and not is_sha256(f.get(key)):
            raise ConfigError(f"{where}.{key} {f.get(key)!r} is not a sha256 hex digest", fix)
    torch = f.get("torch", "")
    if torch:
        target.check_version(torch, f"{where}.torch", fix)
    folder = root / "simple" / project
    recorded = f.get("attestations")
    recorded = {} if recorded is None else recorded
    if not isinstance(recorded, dict) or set(recorded) - set(ATTESTATIONS):
        raise ConfigError(
            f"{where}.attestations is not an object of {', '.join(ATTESTATIONS)}", fix
        )
    attestations = [
        _document(
            record, kind, name + ATTESTATIONS[kind][1], folder, f"{where}.attestations.{kind}", fix
        )
        for kind, record in sorted(recorded.items())
    ]
    kept = f.get("target")
    return Entry(
        project,
        name,
        folder / name,
        f["sha256"],
        kept if isinstance(kept, str) else "?",
        torch,
        in_index=True,
        attestations=tuple(a for a in attestations if a),
        cache_key=f.get("cache_key"),
        facts=check_facts(f.get("facts"), where, fix),
        manifest=_document(
            f.get("manifest"), "manifest", name + MANIFEST_SUFFIX, folder, f"{where}.manifest", fix
        ),
        signature=_document(
            f.get(SIGNATURE), SIGNATURE, name + signing.SUFFIX, folder, f"{where}.{SIGNATURE}", fix
        ),
    )


def _document(
    record: Any, kind: str, name: str, folder: Path, where: str, fix: str
) -> Attestation | None:
    """index.json's record of a file beside a wheel, {filename: `name`, sha256} (a signature's with its keyid), as an
    Attestation; None when there is none."""
    if record is None:
        return None
    if not isinstance(record, dict):
        raise ConfigError(f"{where} is not an object", fix)
    if record.get("filename") != name:
        raise ConfigError(f"{where}.filename is not {name}", fix)
    keys = ("sha256", "keyid") if kind == SIGNATURE else ("sha256",)
    for key in keys:
        if not is_sha256(record.get(key)):
            raise ConfigError(f"{where}.{key} is not a sha256 hex digest", fix)
    keyid = record["keyid"] if kind == SIGNATURE else ""
    return Attestation(kind, name, folder / name, record["sha256"], keyid)


def _documents(e: Entry) -> tuple[Attestation, ...]:
    """The files published beside a wheel: its manifest (when recorded), SBOM, provenance and signature."""
    return tuple(a for a in (e.manifest, *e.attestations, e.signature) if a)


def _list(names: list[str]) -> str:
    """Names found on disk, for one error line: control characters shown escaped, at most five."""
    names = [name if name.isprintable() else ascii(name) for name in names]
    return ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")


def plan(
    entries: list[Entry], index: Path, split_by_torch: bool = False
) -> dict[Path, list[Entry]]:
    """index root -> its files (old and new), refusing two different wheels under one filename."""
    groups: dict[Path, list[Entry]] = {}
    for entry in entries:
        root = (
            index / f"torch{torch_version(entry.torch, entry.path, 'torch')}"
            if split_by_torch
            else index
        )
        # a checked version is one path component; keep it that way
        if split_by_torch and root.parent != index:
            raise ConfigError(
                f"{entry.target}: torch {entry.torch!r} does not name a folder inside {index}",
                f"rebuild {entry.target}",
            )
        if root not in groups:
            groups[root] = _existing(root)
        groups[root].append(entry)
    for root, files in groups.items():
        by_name: dict[str, Entry] = {}
        for entry in files:
            other = by_name.get(entry.filename)
            if other is not None and other.sha256 != entry.sha256:
                where = (
                    f"the index already holds (from {other.target})"
                    if other.in_index
                    else f"{other.target} has"
                )
                raise ConfigError(
                    f"{entry.filename}: {where} another wheel under this name (sha256 {other.sha256[:12]}) than "
                    f"{entry.target} (sha256 {entry.sha256[:12]}) in {root}",
                    "rebuild both (a diagnosis build and a good one share a name), pick one with --target, or use "
                    "another --index",
                )
            # the same bytes published again keep their signature
            if other is not None and entry.signature is None:
                entry = dataclasses.replace(entry, signature=other.signature)
            by_name[entry.filename] = entry
        groups[root] = _one_per_target(list(by_name.values()))
    return groups


def write(
    root: Path,
    files: list[Entry],
    base_url: str | None = None,
    cells: list[matrix.Combination] | None = None,
    key: signing.SigningKey | None = None,
    resign: bool = False,
) -> None:
    """Build the index for `root` next to it (simple/, index.json and the pages of apexkit.index.pages), then swap
    it in. `base_url`: where it will be served (default: root's file:// URI); `cells`: matrix.toml's, for the grid's
    "missing" section; `key`: sign each new wheel (each wheel: `resign`)."""
    cachetrust.make_dir(root.parent)
    tmp = Path(tempfile.mkdtemp(prefix=f".{root.name}.tmp-", dir=root.parent))  # 0700
    made = os.open(tmp, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    # every file is written through the folder made, wherever its name goes (a link swapped in leads nowhere)
    here = Path(f"/proc/self/fd/{made}") if os.path.isdir("/proc/self/fd") else tmp
    generated = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    metadata: dict[str, pages.Metadata] = {}
    try:
        projects = sorted({e.project for e in files})
        (here / "simple").mkdir()
        (here / "simple" / "index.html").write_text(
            pages.simple_page("Simple index", [(f"{p}/", p, None) for p in projects])
        )
        files = [
            signed
            for project in projects
            for signed in _write_project(
                here / "simple" / project,
                [e for e in files if e.project == project],
                metadata,
                key,
                resign,
            )
        ]
        pages.write_pages(here, files, metadata, base_url or root.as_uri(), cells or [], generated)
        (here / "index.json").write_text(
            json.dumps(
                {
                    "format": FORMAT,
                    "generated": generated,
                    "files": [_listed(e, metadata) for e in files],
                },
                indent=1,
            )
            + "\n"
        )
        _served_modes(made)
        _swap(tmp, root, made)
    except BaseException:
        if _same(tmp, made):  # never a folder swapped in for ours
            shutil.rmtree(tmp, ignore_errors=True)
        raise
    finally:
        os.close(made)


def _served_modes(top: int) -> None:
    """0755 folders and 0644 files (any web server serves them) for the folder `top` and all in it, each set
    through a descriptor opened without following links: never a chmod of what a link names."""
    os.fchmod(top, 0o755)
    for _, dirs, names, folder in os.fwalk(".", dir_fd=top):
        for name in dirs + names:
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=folder)
            try:
                os.fchmod(fd, 0o755 if stat.S_ISDIR(os.fstat(fd).st_mode) else 0o644)
            finally:
                os.close(fd)


def _swap(tmp: Path, root: Path, made: int) -> None:
    """The folder `made` (named `tmp`) in place of `root`; refused when another one is there in its stead."""
    if _same(tmp, made):
        fsedit.swap_directory(tmp, root)
        if _same(root, made):
            return
    raise ConfigError(
        f"the new index for {root} was replaced while it was written (in {root.parent}): {root} may not be "
        "what publish wrote",
        f"publish into a folder only you can write (--index), then remove {root}",
    )


def _same(path: Path, fd: int) -> bool:
    """`path` (not followed) is the file open as `fd`."""
    try:
        st, mine = os.lstat(path), os.fstat(fd)
    except OSError:
        return False
    return (st.st_dev, st.st_ino) == (mine.st_dev, mine.st_ino)


def _write_project(
    folder: Path,
    mine: list[Entry],
    metadata: dict[str, pages.Metadata],
    key: signing.SigningKey | None,
    resign: bool,
) -> list[Entry]:
    """simple/<project>/ of the new index: each wheel with its manifest, SBOM, provenance and signature, re-read
    without following links and re-hashed on the way, a new signature by `key` (for a new wheel; for each one when
    `resign`), its PEP 658 metadata (into `metadata`), and the PEP 503 page. Returns the entries as written."""
    folder.mkdir()
    out = []
    for e in mine:
        digest = _copy_checked(e, e.path, folder / e.filename, e.sha256)
        signer = key if resign or not e.in_index else None
        for a in _documents(e):
            if not (signer and a.kind == SIGNATURE):
                _copy_checked(e, a.path, folder / a.filename, a.sha256)
        if signer:
            e = dataclasses.replace(e, signature=_sign(e, folder, digest, signer))
        out.append(e)
        found = pages.write_metadata(folder, e.filename)  # PEP 658
        if found:
            metadata[e.filename] = found
    (folder / "index.html").write_text(
        pages.simple_page(
            f"Links for {folder.name}",
            [
                (f"{e.filename}#sha256={e.sha256}", e.filename, metadata.get(e.filename))
                for e in mine
            ],
        )
    )
    return out


def _sign(e: Entry, folder: Path, sha256: str, key: signing.SigningKey) -> Attestation:
    """<wheel>.intoto.jsonl in the new index's `folder`: a DSSE envelope by `key` over the statement of the wheel
    copied there (`sha256`: hashed from the bytes copied, never a recorded one) and of its manifest's copy beside it,
    which must record that same sha256. A new file (never through a link); the index's swap makes it appear."""
    fix = f"publish {e.filename} again from its dist/{e.target}/ (or rebuild it)"
    try:
        if e.manifest is None:
            raise untrusted.Untrusted("it has no manifest in the index to say what it is for")
        manifest = untrusted.read_json_object(
            folder / e.manifest.filename, None, distdir.MANIFEST_MAX
        )
    except (OSError, untrusted.Untrusted) as exc:
        raise ConfigError(f"cannot sign {e.filename}: {exc}", fix) from None
    if _object(manifest, "wheel").get("sha256") != sha256:
        raise ConfigError(
            f"cannot sign {e.filename}: its sha256 {sha256[:12]} is not the one its manifest records",
            fix,
        )
    line = signing.envelope_line(
        signing.sign(
            signing.statement(
                manifest, e.filename, sha256, facts_of(manifest, e.filename, folder / e.filename)
            ),
            key,
        )
    )
    name = e.filename + signing.SUFFIX
    with open(folder / name, "xb") as out:  # O_CREAT|O_EXCL: never an existing file or a link
        out.write(line)
    return Attestation(SIGNATURE, name, folder / name, hashlib.sha256(line).hexdigest(), key.keyid)


def _copy_checked(e: Entry, src: Path, dst: Path, sha256: str) -> str:
    """Copy a file of `e` (the wheel or one beside it) into the new index, refused unless it still has `sha256`."""
    try:
        digest = _copy_hashed(src, dst)
    except (OSError, ValueError) as exc:
        raise ConfigError(
            f"{src} ({'already in the index' if e.in_index else e.target}) cannot be read as a regular file: "
            f"{exc}",
            f"rebuild {e.target} or restore the file",
        ) from None
    if digest != sha256:
        raise ConfigError(
            f"{src} changed since it was checked (sha256 {digest[:12]}, expected {sha256[:12]})",
            f"rebuild {e.target} and publish again",
        )
    return digest


def _listed(e: Entry, metadata: dict[str, pages.Metadata]) -> dict:
    """index.json's files[i] of one wheel (the keys of what it lacks left out)."""

    def ref(file: Attestation | pages.Metadata | None) -> dict | None:
        return {"filename": file.filename, "sha256": file.sha256} if file else None

    sig = e.signature

    optional = {
        "cache_key": e.cache_key,
        "facts": e.facts,
        "manifest": ref(e.manifest),
        "attestations": {a.kind: ref(a) for a in e.attestations},
        "metadata": ref(metadata.get(e.filename)),
    }
    return {
        "project": e.project,
        "filename": e.filename,
        "sha256": e.sha256,
        "target": e.target,
        "torch": e.torch,
        **{key: value for key, value in optional.items() if value},
        SIGNATURE: {**(ref(sig) or {}), "keyid": sig.keyid} if sig else None,  # null: unsigned
    }


def _replaced(root: Path, files: list[Entry]) -> str:
    """What writing `root` does to what is there now, in words (for the log and --dry-run). `root` has passed
    _existing: it holds nothing but the files of its index.json."""
    if not root.exists():
        return f"create {root}/"
    old = sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())
    if not old:
        return f"fill the empty directory {root}/"
    wheels = {f"simple/{e.project}/{e.filename}" for e in files}
    kinds = {
        "wheel": wheels,
        "document": {f"simple/{e.project}/{a.filename}" for e in files for a in _documents(e)},
        "metadata": {name + pages.METADATA_SUFFIX for name in wheels},
    }
    found = {kind: len(names.intersection(old)) for kind, names in kinds.items()}
    gone = [name for name in old if name not in set().union(*kinds.values())]
    # pages are rewritten; a wheel that leaves (an older one of its target id) goes with the files beside it
    rewritten = [name for name in gone if name.endswith(".html") or name == "index.json"]
    removed = [name for name in gone if name not in rewritten]
    return (
        f"replace {root}/ (an apexkit index): rewrite {', '.join(rewritten)}"
        + (
            f" and {pages.count(found['metadata'], '.metadata file')} (from the wheels)"
            if found["metadata"]
            else ""
        )
        + f"; keep {pages.count(found['wheel'], 'published wheel')}"
        + (
            f" and {pages.count(found['document'], 'manifest/SBOM/provenance file')}"
            if found["document"]
            else ""
        )
        + (f"; remove {', '.join(removed)}" if removed else "; remove nothing else")
    )


def publish(
    dist: Path,
    index: Path,
    targets: list[str] | None = None,
    split_by_torch: bool = False,
    dry_run: bool = False,
    base_url: str | None = None,
    coverage: bool = False,
    sign_key: str | None = None,
    resign: bool = False,
) -> dict[Path, list[Entry]]:
    """Publish dist/ into `index`. `base_url`: where the index will be served, for the copy-paste lines of
    index.html (checked: no userinfo); `coverage`: also print which cells of matrix.toml have no wheel (stdout);
    `sign_key`: the private key file that signs each new wheel (else $APEXKIT_SIGNING_KEY_PEM when set; none:
    unsigned); `resign`: sign every wheel already in `index` again with that key (a rotation), dist/ not read."""
    base = pages.check_base_url(base_url) if base_url else None
    # the key (--sign-key, config signing_key, or $APEXKIT_SIGNING_KEY_PEM), or None; a key others can read is
    # refused before anything is read or written (--resign without a key: "no signing key given")
    key = (
        signing.private_key(sign_key)
        if (sign_key or os.environ.get(signing.PEM_ENV, "").strip() or resign)
        else None
    )
    # an index (or a folder above it) another user can swap: they would pick where root writes (and chmods)
    cachetrust.trusted_output(index, "--index", make=False)
    # One publish at a time per index, from reading what it holds (`_existing`, in `plan`) to the swap: two at once
    # would each build on the same old index and the later swap would drop the other's wheel. A dry run writes
    # nothing and takes no lock. The one waiting says so ("waiting for the lock on ... held by pid N").
    hold = (
        contextlib.nullcontext()
        if dry_run
        else locks.hold(index.resolve(), f"the index {index.resolve()}")
    )
    with hold:
        groups = (
            _resign_plan(index.resolve(), split_by_torch, targets)
            if resign
            else plan(collect(dist, targets), index.resolve(), split_by_torch)
        )  # refuses before anything is written
        return _publish(groups, index, dry_run, base, coverage, key, resign)


def _resign_plan(
    index: Path, split_by_torch: bool, targets: list[str] | None
) -> dict[Path, list[Entry]]:
    """--resign: each index root (index/, or index/torch*/ with --split-by-torch) -> the wheels it holds."""
    if targets:
        raise ConfigError("--resign signs every wheel of the index again", "drop --target")
    roots = sorted(p.parent for p in index.glob("torch*/index.json")) if split_by_torch else [index]
    groups = {root: _existing(root) for root in roots}
    if not any(groups.values()):
        raise ConfigError(
            f"{index} holds no published wheel to sign again",
            f"publish first: {vocab.command('publish', f'--index {index} --sign-key FILE')}",
        )
    return groups


def _publish(
    groups: dict[Path, list[Entry]],
    index: Path,
    dry_run: bool,
    base: str | None,
    coverage: bool,
    key: signing.SigningKey | None,
    resign: bool,
) -> dict[Path, list[Entry]]:
    cells = _matrix_cells(coverage)
    for root, files in groups.items():
        log.info(f"{'would ' if dry_run else ''}{_replaced(root, files)}")
        log.info(
            f"{'would write' if dry_run else 'index'} {root}/simple/ ({pages.count(len(files), 'wheel')})"
        )
        for e in files:
            extra = ", ".join(a.filename[len(e.filename) :] for a in e.attestations)
            signer = (
                key.keyid
                if key and (resign or not e.in_index)
                else getattr(e.signature, "keyid", "")
            )
            log.info(
                f"  {e.filename}  sha256 {e.sha256[:12]}  ({e.target})"
                + (f" + {extra}" if extra else "")
                + (f"  signed by {signer[:16]}" if signer else "  unsigned")
            )
        if key:
            log.info(
                f"  {'would sign' if dry_run else 'signing'} with key id {key.keyid} ({key.origin})"
            )
        if not dry_run:
            served = base and "/".join([base, *root.relative_to(index.resolve()).parts])
            write(root, files, served, cells, key, resign)
            where = log.mask(served) if served else root.as_uri()  # --base-url: where it is served
            serve = (
                ""
                if served
                else "; or serve the folder: python3 -m http.server, and publish with --base-url URL"
            )
            log.info(
                f"  apexkit install --index {where}  (the wheel that fits a venv, torch untouched{serve})"
            )
            log.info(
                f"  the grid: {where}/index.html"
                + (f" (here: {root.as_uri()}/index.html)" if served else "")
            )
    if coverage:
        published = [e for files in groups.values() for e in files]
        for line in pages.coverage_lines(
            cells, pages.missing(cells, published), f"{index}/" + (" (would be)" if dry_run else "")
        ):
            log.report.print(line, markup=False)
    return groups


def _matrix_cells(required: bool) -> list[matrix.Combination]:
    """matrix.toml's cells, for the grid's "missing" section and --coverage; without a readable matrix.toml the
    grid goes without that section (one warning), and --coverage is an error."""
    try:
        return pages.matrix_cells(matrix.load())
    except ApexkitError as exc:
        if required:
            raise
        log.warn(f"index.html without its missing cells: {exc}")
        return []
