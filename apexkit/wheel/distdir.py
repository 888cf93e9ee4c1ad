"""dist/<target-id>/: the wheel and the manifest of one target, replaced as a whole, never over another's.

A target folder appears complete or not at all (written beside it, then swapped in), and is replaced only by a build
from the same inputs: its manifest's `target.identity` names the non-default inputs (torch_npu, skipped patches,
setup.py flags, an NVIDIA pin, a local source, the system torch), and a build from other inputs is refused without
--force, so a diagnosis build never replaces the wheel that `invoke publish` would ship.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from apexkit import cachetrust, fsedit, locks, log, paths, untrusted
from apexkit.errors import BuildError, ConfigError
from apexkit.plan import target
from apexkit.wheel import sbom

MANIFEST_MAX = 16 << 20  # bytes; ours are a few KiB


def read_manifest(target_fd: int) -> tuple[dict, str]:
    """manifest.json of a dist/<target>/ another party wrote (a container, a Slurm job, a shared cache entry), opened
    in `target_fd` without following links, capped: (the manifest, its wheel's plain file name). Untrusted when it
    is not a JSON object recording wheel.file and wheel.sha256."""
    manifest = untrusted.read_json_object("manifest.json", target_fd, MANIFEST_MAX)
    wheel = manifest.get("wheel")
    if not isinstance(wheel, dict) or not isinstance(wheel.get("sha256"), str):
        raise untrusted.Untrusted("manifest.json has no wheel.file and wheel.sha256")
    return manifest, untrusted.wheel_name(wheel.get("file"))


PLANNED = ("python", "torch", "torch_npu", "arch", "target_id")


def check_planned(name: str, manifest: dict, planned: Callable[..., dict[str, dict]]) -> None:
    """A dist/<name>/ another party built (a container, a Slurm job) must be one this host planned:
    `planned(system_torch=...)` (buildplan.expected_targets bound to the host's own options and arch) names the
    target ids this build may produce; `name` must be one of them and its manifest's target python, torch,
    torch_npu, arch and target_id that plan's. For --use-system-torch the other side's torch is the one fact taken
    from it (as a PEP 440 version); python, arch, ref and identity stay the host's. Its target.identity becomes the
    host's (check_overwrite compares that one, never the other side's). Untrusted otherwise."""
    recorded = manifest.get("target")
    if not isinstance(recorded, dict):
        raise untrusted.Untrusted("manifest.json has no target object")
    reported = recorded.get("torch")
    try:
        torch = target.check_version(reported, "target.torch", "") if reported is not None else None
    except ConfigError:
        raise untrusted.Untrusted(
            f"manifest.json target.torch {untrusted.shown(reported)} is not a version"
        ) from None
    expected = planned(system_torch=torch)
    if name not in expected:
        wanted = " or ".join(sorted(expected)) or "none"
        raise untrusted.Untrusted(
            f"it left {untrusted.shown(name)}, which is not this build's target ({wanted})"
        )
    facts = expected[name]
    for key in PLANNED:
        if recorded.get(key) != facts[key]:
            raise untrusted.Untrusted(
                f"manifest.json target.{key} is {untrusted.shown(str(recorded.get(key)))}, "
                f"this build's is {facts[key]}"
            )
    recorded["identity"] = dict(facts["identity"])


def _recorded_identity(target: Path) -> dict | None:
    """target.identity of dist/<target>/manifest.json ({} for a manifest from before identities); None when the
    folder is not one apexkit wrote (a symlink, no readable manifest)."""
    try:
        fd = untrusted.open_dir(target)
        try:
            data = untrusted.read_regular("manifest.json", fd, MANIFEST_MAX)
        finally:
            os.close(fd)
        recorded = json.loads(data.decode("utf-8")).get("target", {}).get("identity", {})
    except (untrusted.Untrusted, OSError, ValueError, AttributeError):
        return None
    return recorded if isinstance(recorded, dict) else None


def _shown_value(value) -> str:
    if value is None or value == [] or value is False:
        return "default"
    return log.sanitise(" ".join(value) if isinstance(value, list) else str(value))[:80]


def check_overwrite(dist_dir: Path, name: str, wanted: dict, force: bool) -> None:
    """Refuse to replace dist/<name>/ when it was built from other inputs than `wanted` (its manifest's
    target.identity), unless --force: a diagnosis build (--skip-patch, --apex-src, ...) never silently replaces the
    good wheel that `invoke publish` would ship."""
    final = dist_dir / name
    if force or not os.path.lexists(final):
        return
    recorded = _recorded_identity(final)
    if recorded == wanted:
        return
    if recorded is None:
        what = "is not a target apexkit wrote (a symlink, or no readable manifest.json)"
    else:
        keys = sorted(set(recorded) | set(wanted), key=str)
        what = (
            "holds a wheel built from other inputs ("
            + "; ".join(
                f"{k}: {_shown_value(recorded.get(k))} there, {_shown_value(wanted.get(k))} now"
                for k in keys
                if recorded.get(k) != wanted.get(k)
            )
            + ")"
        )
    raise ConfigError(
        f"{final} {what}; nothing was replaced",
        "pass --force to replace it, or --dist DIR to keep both",
    )


def with_documents(files: dict[str, Path | bytes], manifest: dict) -> dict[str, Path | bytes]:
    """`files` and, when they are one wheel and neither document, its SBOM and provenance (apexkit.wheel.sbom, written
    from the manifest and that wheel; manifest["attestations"] records them). An SBOM that fails its schema stops the
    publish with one line."""
    wheels = [
        source for n, source in files.items() if n.endswith(".whl") and isinstance(source, Path)
    ]
    if len(wheels) != 1 or {sbom.SBOM_FILE, sbom.PROVENANCE_FILE} & set(files):
        return files
    try:
        return {**files, **sbom.documents(manifest, wheels[0])}
    except sbom.SbomError as exc:
        raise BuildError(
            f"{exc}; nothing was published", "report it: apexkit/wheel/sbom.py writes the SBOM"
        ) from None


def replace_dir(
    dist_dir: Path, name: str, files: dict[str, Path | bytes], manifest: dict, force: bool = False
) -> Path:
    """dist/<name>/ (the files + manifest.json) appears complete or not at all; never over a target built from
    other inputs (check_overwrite) unless `force`. A file given as bytes (sbom.cdx.json, provenance.json: apexkit.wheel.sbom)
    is written, a Path copied. Given one wheel and neither document, the SBOM and the provenance are written here
    (with_documents: a fresh build, a Slurm job's target collected by matrixrun)."""
    files = with_documents(files, manifest)
    final = dist_dir / name
    cachetrust.trusted_output(dist_dir, paths.DIST_SETTING)  # made now, ours alone, or refused
    with lock(dist_dir, name):
        check_overwrite(dist_dir, name, manifest.get("target", {}).get("identity") or {}, force)
        tmp = Path(tempfile.mkdtemp(prefix=f".{name}.tmp-", dir=dist_dir))
        try:
            for file_name, source in files.items():
                if isinstance(source, bytes):
                    (tmp / file_name).write_bytes(source)
                else:
                    shutil.copy2(source, tmp / file_name)
                os.chmod(tmp / file_name, 0o644)  # the wheel, SBOM, provenance: whatever the umask
            (tmp / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
            os.chmod(tmp / "manifest.json", 0o644)
            os.chmod(tmp, 0o755)  # mkdtemp makes it 0700
            fsedit.swap_directory(tmp, final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return final


def lock(dist_dir: Path, name: str):
    """The lock on dist/<name> while it is checked and swapped: `<dist>/.locks/<name>.lock` (a hidden folder, so
    `invoke publish` and `ls dist/` see only targets)."""
    return locks.hold(dist_dir / ".locks" / name, f"{dist_dir / name}")
