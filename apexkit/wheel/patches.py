"""Our patches (patches/*.toml), applied to the generated tree after Ascend's npu.patch.

Each is idempotent (its `applied` marker present -> skipped), applies only where the trap's signature is found,
and stops the build before compiling when upstream drifted (signature present, `find` no longer matches).
"""

from __future__ import annotations

import hashlib
import re
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from apexkit import paths
from apexkit.errors import ConfigError, PatchError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

PATCHES_DIR = paths.PATCHES

APPLIED = "applied"
ALREADY = "already applied"
NOT_APPLICABLE = "not applicable"
SKIPPED = "skipped (--skip-patch)"


@dataclass(frozen=True)
class Edit:
    find: str
    replace: str
    applied: str


@dataclass(frozen=True)
class Patch:
    id: str
    summary: str
    file: str
    applies_when: str
    edits: tuple[Edit, ...]
    sha256: str
    path: Path


@dataclass(frozen=True)
class PatchResult:
    id: str
    file: str
    status: str
    sha256: str


def load_all(directory: Path = PATCHES_DIR) -> list[Patch]:
    patches = []
    for path in sorted(directory.glob("*.toml")):
        raw = path.read_bytes()
        try:
            data = tomllib.loads(raw.decode())
            patch = Patch(
                id=data["id"],
                summary=data["summary"],
                file=data["file"],
                applies_when=data["applies_when"],
                edits=tuple(Edit(e["find"], e["replace"], e["applied"]) for e in data["edits"]),
                sha256=hashlib.sha256(raw).hexdigest(),
                path=path,
            )
            for regex in [patch.applies_when] + [
                r for e in patch.edits for r in (e.find, e.applied)
            ]:
                re.compile(regex)
        except (KeyError, tomllib.TOMLDecodeError, re.error) as exc:
            raise ConfigError(
                f"patch file {path.name} is malformed: {exc}", "fix the patch file"
            ) from None
        patches.append(patch)
    ids = [p.id for p in patches]
    if len(set(ids)) != len(ids):
        raise ConfigError(f"duplicate patch ids in {directory}", "give each patch its own id")
    return patches


def check_skips(patches: Iterable[Patch], skip: Iterable[str]) -> None:
    known = {p.id for p in patches}
    unknown = sorted(set(skip) - known)
    if unknown:
        raise ConfigError(
            f"--skip-patch {', '.join(unknown)}: no such patch",
            f"known: {', '.join(sorted(known))}",
        )


def apply_one(patch: Patch, tree: Path) -> str:
    """Apply `patch` to `tree`; returns its status. Writes the file only when something changed."""
    target = tree / patch.file
    if not target.is_file():
        return NOT_APPLICABLE
    text = target.read_text()
    if all(re.search(e.applied, text) for e in patch.edits):
        return ALREADY
    if not re.search(patch.applies_when, text):
        return NOT_APPLICABLE
    new = text
    for number, edit in enumerate(patch.edits, 1):
        if re.search(edit.applied, new):
            continue
        new, count = re.subn(edit.find, edit.replace, new)
        if count == 0:
            raise PatchError(
                f"patch {patch.id} no longer applies to {patch.file} (edit {number}: pattern not found; "
                "upstream changed this file)",
                f"update {patch.path.relative_to(patch.path.parent.parent)}, or --skip-patch {patch.id} to build without it",
            )
        if not re.search(edit.applied, new):
            raise PatchError(
                f"patch {patch.id} edit {number} did not leave its marker in {patch.file}",
                f"fix 'applied' in {patch.path.name}",
            )
    tmp = target.with_name(target.name + ".apexkit-tmp")
    tmp.write_text(new)
    tmp.replace(target)
    return APPLIED


def apply_all(
    tree: Path, skip: Iterable[str] = (), patches: list[Patch] | None = None
) -> list[PatchResult]:
    patches = load_all() if patches is None else patches
    skip = set(skip)
    check_skips(patches, skip)
    results = []
    for patch in patches:
        status = SKIPPED if patch.id in skip else apply_one(patch, tree)
        results.append(PatchResult(patch.id, patch.file, status, patch.sha256))
    return results
