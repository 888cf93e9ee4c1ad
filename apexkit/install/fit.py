"""Whether a wheel file fits a target venv, from the wheel's own bytes: its filename tags against the tags the venv's
pip installs, its METADATA (name apex, an apexkit label "+ascend...", Requires-Dist) against what the venv holds.

An index.json may say anything about a wheel; this is what is checked before `pip install`, whatever it said."""

from __future__ import annotations

import contextlib
import email.parser
import zipfile
from dataclasses import dataclass
from pathlib import Path

from packaging.markers import InvalidMarker, UndefinedComparison, UndefinedEnvironmentName
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import (
    InvalidWheelFilename,
    canonicalize_name,
    parse_wheel_filename,
)
from packaging.version import InvalidVersion, Version

from apexkit import log, untrusted
from apexkit.install.target import Target
from apexkit.plan import target as plan_target

METADATA_LIMIT = 1 << 20  # bytes of a wheel's METADATA / RECORD read
GUARDED = ("torch", "torch-npu")  # never changed by apexkit install
MAX_ADDED = 8  # dependencies a wheel may add to a venv, theirs included (NVIDIA apex: packaging)
MAX_NAME = 100  # characters of a distribution name added


class Misfit(Exception):
    """The wheel does not fit the venv: a one-line reason (callers add the next step)."""


@dataclass(frozen=True)
class WheelFacts:
    filename: str
    version: str
    requires_dist: tuple[str, ...]
    record: tuple[tuple[str, str], ...]  # (path, hash) of its files, RECORD itself left out


def read_member(
    archive: zipfile.ZipFile,
    dist_info: str,
    name: str,
    limit: int = METADATA_LIMIT,
    missing: bytes | None = None,
) -> bytes:
    """The member `dist_info/name` of a wheel, at most `limit` bytes (Misfit beyond: refused before it is inflated);
    `missing` when it has none (None: Misfit)."""
    try:
        info = archive.getinfo(f"{dist_info}/{name}")
    except KeyError:
        if missing is not None:
            return missing
        raise Misfit(f"{_shown(archive)} has no {dist_info}/{name}") from None
    if info.file_size > limit:
        raise Misfit(f"{name} of {_shown(archive)} is larger than {limit} bytes")
    with archive.open(info) as fh:
        return fh.read(limit + 1)


def _shown(archive: zipfile.ZipFile) -> str:
    return untrusted.shown(Path(archive.filename or "the wheel").name)


def read_wheel(path: Path) -> WheelFacts:
    """The name, version, Requires-Dist and RECORD of the wheel file `path` (a zip apexkit already checked)."""
    try:
        name, version, _, _ = parse_wheel_filename(path.name)
    except (InvalidWheelFilename, InvalidVersion) as exc:
        raise Misfit(f"{untrusted.shown(path.name)} is not a wheel file name ({exc})") from None
    if name != "apex":
        raise Misfit(f"{untrusted.shown(path.name)} is not an apex wheel")
    dist_info = f"{path.name.split('-', 2)[0]}-{path.name.split('-', 2)[1]}.dist-info"
    try:
        with zipfile.ZipFile(path) as archive:
            metadata = read_member(archive, dist_info, "METADATA")
            record = read_member(archive, dist_info, "RECORD")
    except (OSError, zipfile.BadZipFile) as exc:
        raise Misfit(f"{untrusted.shown(path.name)} is not a readable wheel ({exc})") from None
    msg = email.parser.BytesParser().parsebytes(metadata, headersonly=True)
    meta_name, meta_version = msg.get("Name"), msg.get("Version")
    if not isinstance(meta_name, str) or canonicalize_name(meta_name) != "apex":
        raise Misfit(f"METADATA names {untrusted.shown(meta_name)}, not apex")
    try:
        if not isinstance(meta_version, str) or Version(meta_version) != version:
            raise Misfit(
                f"METADATA says version {untrusted.shown(meta_version)}, the file name {version}"
            )
    except InvalidVersion:
        raise Misfit(f"METADATA version {untrusted.shown(meta_version)} is not PEP 440") from None
    if plan_target.read_version(version) is None:
        raise Misfit(
            f"apex {version} is not an apexkit wheel (no +ascend or +cuNNN.torch label): apexkit installs only its "
            "own"
        )
    rows = []
    for line in record.decode(errors="replace").splitlines():
        parts = line.rsplit(",", 2)
        if len(parts) == 3 and parts[1] and not parts[0].endswith(".dist-info/RECORD"):
            rows.append((parts[0], parts[1]))
    return WheelFacts(
        filename=path.name,
        version=str(version),
        requires_dist=tuple(str(r) for r in msg.get_all("Requires-Dist") or ()),
        record=tuple(rows),
    )


def check_tags(filename: str, target: Target) -> None:
    """The file name's tags must be among those the venv's pip installs (Python, ABI and platform at once)."""
    try:
        _, _, _, tags = parse_wheel_filename(filename)
    except (InvalidWheelFilename, InvalidVersion) as exc:
        raise Misfit(f"{untrusted.shown(filename)} is not a wheel file name ({exc})") from None
    if not {str(t) for t in tags} & set(target.tags):
        wheel_tags = ", ".join(sorted(str(t) for t in tags))
        raise Misfit(
            f"{untrusted.shown(filename)} is tagged {wheel_tags}; the venv (Python {target.python}, "
            f"{target.machine}, glibc {target.glibc or 'unknown'}) installs none of those"
        )


def unmet(requires_dist: tuple[str, ...], target: Target) -> list[str]:
    """Every Requires-Dist that what the venv holds does not satisfy (markers evaluated for the venv): [] = all met.
    A requirement that is not PEP 508 counts as unmet."""
    return [why for _, why in _unmet(requires_dist, target)]


def _unmet(requires_dist: tuple[str, ...], target: Target) -> list[tuple[Requirement | None, str]]:
    """(the requirement, None where it is not PEP 508; why it is unmet) for each Requires-Dist the venv fails."""
    problems: list[tuple[Requirement | None, str]] = []
    env = dict(target.markers)
    env.setdefault("extra", "")
    for raw in requires_dist:
        try:
            req = Requirement(raw)
            if req.marker is not None and not req.marker.evaluate(env):
                continue
        except (InvalidRequirement, InvalidMarker, UndefinedComparison, UndefinedEnvironmentName):
            problems.append((None, f"{log.sanitise(raw[:200])} (not a PEP 508 requirement)"))
            continue
        have = target.seen.get(canonicalize_name(req.name))
        shown = log.sanitise(str(req)[:200])
        if have is None:
            problems.append((req, f"{shown} (not installed)"))
        elif not req.specifier.contains(have, prereleases=True):
            problems.append((req, f"{shown} (the venv has {canonicalize_name(req.name)} {have})"))
    return problems


def check_wheel(facts: WheelFacts, target: Target) -> list[str]:
    """The wheel about to be installed fits the venv: tags, and every pin (torch and torch_npu above all) met by what
    is installed now. Returns what the venv lacks and may gain (`packaging>20.6`, NVIDIA apex's one dependency):
    requirements on packages not installed at all, by name and version range only (never a URL), never torch or
    torch_npu -- a dependency whose package is installed at another version is a misfit: apexkit install adds to a
    venv, it never changes what is there."""
    check_tags(facts.filename, target)
    names = set()
    for raw in facts.requires_dist:
        with contextlib.suppress(InvalidRequirement):
            names.add(canonicalize_name(Requirement(raw).name))
    if "torch" not in names:
        raise Misfit(f"{facts.filename} pins no torch (Requires-Dist): not a wheel apexkit built")
    label = plan_target.read_version(facts.version)
    cuda = label.cuda if label else None
    if cuda is not None and cuda != target.torch_cuda:
        raise Misfit(
            f"{facts.filename} is NVIDIA apex for CUDA {cuda}; the venv's torch is "
            + (f"CUDA {target.torch_cuda}" if target.torch_cuda else "a build without CUDA")
        )
    if cuda is not None and target.torch_npu:
        raise Misfit(
            f"{facts.filename} is NVIDIA apex on CUDA; the venv has torch_npu {target.torch_npu}"
        )
    return additions(facts.filename, facts.requires_dist, target)


def additions(filename: str, requires_dist: tuple[str, ...], target: Target) -> list[str]:
    """The requirements of `requires_dist` the venv lacks and may gain (see check_wheel), or Misfit naming every one
    it may not: a pin the venv holds another version of, torch or torch_npu unmet, a URL, extras, `===`, too many."""
    missing, problems = [], []
    for req, why in _unmet(requires_dist, target):
        if (
            req is not None
            and canonicalize_name(req.name) not in (*GUARDED, "apex", *target.seen)
            and req.url is None
            and not req.extras
        ):
            added = _addable(req)
            if added is None:
                problems.append(
                    f"{why}: only a name and ==, !=, <, <=, >, >= or ~= versions are added"
                )
            else:
                missing.append(added)
        else:
            problems.append(why)
    if len(missing) > MAX_ADDED:
        problems.append(f"{len(missing)} packages the venv lacks (at most {MAX_ADDED} are added)")
    if problems:
        raise Misfit(f"{filename} requires {'; '.join(problems)}")
    return missing


ADDABLE_OPERATORS = ("==", "!=", "<", "<=", ">", ">=", "~=")


def _addable(req: Requirement) -> str | None:
    """The requirement rebuilt from its canonical name and its version clauses (`packaging>20.6`; its marker was
    evaluated for the venv), or None for what pip must not be asked: `===` (any string, a path included), a version
    that is not PEP 440."""
    if len(req.name) > MAX_NAME:
        return None
    clauses = []
    for spec in sorted(req.specifier, key=str):
        version = spec.version  # == / != may end in .* (a prefix match); str.removesuffix is 3.9+
        if spec.operator in ("==", "!=") and version.endswith(".*"):
            version = version[:-2]
        try:
            Version(version)
        except InvalidVersion:
            return None
        if spec.operator not in ADDABLE_OPERATORS:
            return None
        clauses.append(f"{spec.operator}{spec.version}")
    return canonicalize_name(req.name) + ",".join(clauses)


def same_files(facts: WheelFacts, target: Target) -> bool:
    """The venv's apex is this very wheel: same version and every file of the wheel installed with its hash."""
    if target.apex is None or not target.apex.apexkit:
        return False
    try:
        if Version(target.apex.version) != Version(facts.version):
            return False
    except InvalidVersion:
        return False
    installed = dict(target.apex.record)
    return bool(facts.record) and all(installed.get(p) == h for p, h in facts.record)


def moved(before: Target, after: Target) -> list[str]:
    """What apexkit install must never change, as words: torch / torch_npu (GUARDED) first, then every other
    distribution of `before` (not apex) whose version string changed or that is gone: apexkit install adds to a venv,
    it never changes what is there."""
    was, now = before.seen, after.seen
    names = [*GUARDED, *sorted(set(was) - {"apex", *GUARDED})]
    return [
        f"{name} {was.get(name) or 'none'} -> {now.get(name) or 'none'}"
        for name in names
        if now.get(name) != was.get(name)
    ]
