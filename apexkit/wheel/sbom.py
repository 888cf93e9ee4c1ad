"""dist/<target>/sbom.cdx.json and provenance.json: what the wheel is made of, and how it was made.

- sbom.cdx.json: a CycloneDX 1.6 JSON SBOM written with cyclonedx-python-lib (the kept library; 11.x on Python >=
  3.9, 9.1.0 on 3.8, both write 1.6); the tests validate it against the 1.6 JSON schema (strict), which needs the
  library's json-validation extra, a test dependency (requirements/dev.in), not a runtime one. The wheel is
  metadata.component (its sha256, purl, Requires-Dist, manylinux tag; pedigree: the Ascend and NVIDIA apex commits it
  was generated from); its compiled modules are `file` components with their sha256; every package of the build
  venv is a `library` component (scope `required` for the wheel's runtime pins, `excluded` for build-only tools).
- provenance.json: an in-toto Statement v1 with a SLSA provenance v1 predicate. Subject: the wheel and its sha256.
  resolvedDependencies: the source commits (gitCommit), each patch file (sha256), every build-venv package (the
  sha256 of the wheel file it was installed from, as the installer reported it -- apexkit.wheel.venvs records pip's
  --report and uv's pylock resolution in <venv>/apexkit-installed.json -- or found in a --wheelhouse; else the sha256
  of its installed dist-info/RECORD, which lists the sha256 of every file the wheel installed), the compiler and
  the interpreter (sha256 of the binaries), and the builder image (its image id) when built in one. Byproducts: the
  SBOM and its sha256. Unsigned: signing is left to a kept tool (docs/wheels.md).

Both are functions of the manifest (which records the build venv's inventory, the compiler, the sources and patches)
and of the wheel file itself, so a cache hit and a container build (whose dist/ the host re-hashes and rewrites) get
them written by the process that publishes, from data it has checked.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import re
import shutil
import subprocess
import uuid
import zipfile
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path

from packaging.utils import canonicalize_name

from apexkit import paths, untrusted
from apexkit.wheel import wheelcheck

SBOM_FILE = "sbom.cdx.json"
PROVENANCE_FILE = "provenance.json"
SPEC_VERSION = "1.6"
STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PREDICATE_TYPE = "https://slsa.dev/provenance/v1"
BUILD_TYPE = "urn:apexkit:build:wheel:v1"  # apexkit has no public home to point at: a URN names the build recipe
_NAMESPACE = uuid.UUID(
    "6f1d2b52-7d3c-4e8a-9a43-0b5c7c1a9e61"
)  # serial numbers: uuid5(this, wheel sha256 + inputs)
BY_HOST = "APEXKIT_ATTESTATIONS_BY_HOST"  # set in a builder container: the host writes the SBOM + provenance
_MAX_STR = 512  # strings taken from a manifest (a container's is untrusted) are cut to this

# Run by the build venv's own Python (3.8+): every installed distribution, with the sha256 of its RECORD.
INVENTORY_PROBE = paths.PROBES / "inventory.py"


class SbomError(Exception):
    """A one-line reason the SBOM or the provenance could not be written."""


# --- what the build records in its manifest ----------------------------------------------------------------------


def inventory(
    python: Path, wheelhouses: Sequence[Path] = (), env: Mapping[str, str] | None = None
) -> dict:
    """The build venv's packages (name, version, RECORD sha256, wheel tags, installer), read by its own Python, plus
    the sha256 of the wheel file for each one found in a --wheelhouse (same name, version and a shared tag)."""
    try:
        proc = subprocess.run(
            [str(python), str(INVENTORY_PROBE)],
            capture_output=True,
            text=True,
            timeout=120,
            env=None if env is None else dict(env),
        )
        data = json.loads(proc.stdout.strip().splitlines()[-1]) if proc.returncode == 0 else None
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError):
        data = None
    if not isinstance(data, dict):
        return {
            "packages": [],
            "error": f"the build venv's Python ({python}) could not list its packages",
        }
    from apexkit.wheel.venvs import installed_digests

    vouched = installed_digests(
        Path(python).parent.parent
    )  # <venv>/bin/python -> <venv>/apexkit-installed.json
    files = _wheelhouse_files(wheelhouses)
    for package in data["packages"]:
        said = vouched.get(canonicalize_name(package["name"]))
        if (
            isinstance(said, dict)
            and said.get("version") == package["version"]
            and _hex(said.get("sha256"), 64)
        ):
            package["wheel"] = {
                "file": _s(said.get("file")),
                "sha256": _hex(said.get("sha256"), 64),
                "from": _s(said.get("from")),
                "url": _s(said.get("url")),
            }
            continue
        found = files.get((canonicalize_name(package["name"]), package["version"]))
        for path, tags in found or ():
            if not package["tags"] or tags & set(package["tags"]):
                package["wheel"] = {
                    "file": path.name,
                    "sha256": untrusted.sha256_file(path),
                    "from": "wheelhouse",
                }
                break
    return data


def _wheelhouse_files(wheelhouses: Sequence[Path]) -> dict:
    """(canonical name, version) -> [(wheel path, its tags)] of the wheelhouses' *.whl files."""
    from packaging.utils import InvalidWheelFilename, parse_wheel_filename

    out: dict = {}
    for folder in wheelhouses:
        try:
            names = sorted(os.listdir(folder))
        except OSError:
            continue
        for name in names:
            path = Path(folder) / name
            if not name.endswith(".whl") or not path.is_file():
                continue
            try:
                dist, version, _build, tags = parse_wheel_filename(name)
            except InvalidWheelFilename:
                continue
            out.setdefault((str(dist), str(version)), []).append((path, {str(t) for t in tags}))
    return out


def compiler(command: str | None = None) -> dict:
    """The C++ compiler setup.py runs ($CXX or g++): its path (links resolved), first --version line, sha256."""
    argv = (command or os.environ.get("CXX") or "g++").split()
    name = argv[-1] if argv else "g++"  # `ccache g++`: the compiler is the last word
    found = shutil.which(name)
    if not found:
        return {"command": name, "path": None, "version": None, "sha256": None}
    real = os.path.realpath(found)
    try:
        out = subprocess.run([real, "--version"], capture_output=True, text=True, timeout=20).stdout
        version = out.splitlines()[0] if out else None
    except (OSError, subprocess.TimeoutExpired):
        version = None
    return {"command": name, "path": real, "version": version, "sha256": _digest_or_none(real)}


def interpreter(path: str) -> dict:
    real = os.path.realpath(path)
    return {"path": real, "sha256": _digest_or_none(real)}


def _digest_or_none(path: str) -> str | None:
    try:
        return untrusted.sha256_file(Path(path))
    except OSError:
        return None


# --- reading a manifest (possibly a container's: every field checked) --------------------------------------------


def _s(value, default: str | None = None) -> str | None:
    if value is None or isinstance(value, (dict, list)):
        return default
    return str(value)[:_MAX_STR]


def _hex(value, length: int) -> str | None:
    text = _s(value)
    return text.lower() if text and re.fullmatch(rf"[0-9a-fA-F]{{{length}}}", text) else None


def _dict(value) -> dict:
    return value if isinstance(value, dict) else {}


def _patches(manifest: dict) -> list[dict]:
    raw = manifest.get("patches")
    return (
        [p for p in raw if isinstance(p, dict) and _s(p.get("id"))] if isinstance(raw, list) else []
    )


def _packages(manifest: dict) -> list[dict]:
    out = []
    raw = _dict(manifest.get("build_venv")).get("packages")
    for p in raw if isinstance(raw, list) else []:
        if isinstance(p, dict) and _s(p.get("name")) and _s(p.get("version")):
            wheel = _dict(p.get("wheel"))
            out.append(
                {
                    "name": _s(p["name"]),
                    "version": _s(p["version"]),
                    "record_sha256": _hex(p.get("record_sha256"), 64),
                    "wheel_file": _s(wheel.get("file")),
                    "wheel_sha256": _hex(wheel.get("sha256"), 64),
                    "wheel_from": _s(wheel.get("from")),
                    "wheel_url": _s(wheel.get("url")),
                    "installer": _s(p.get("installer")),
                }
            )
    return out


def _wheel_facts(wheel: Path) -> dict:
    """Name, version, Requires-Dist (METADATA) and the sha256 and size of every compiled module, read from the wheel.
    A wheel from a container or a Slurm job may be a zip bomb: METADATA is read up to its bound, each module
    decompressed as a stream in 1 MiB chunks (bounded memory, whatever its size)."""
    modules = []
    try:
        with zipfile.ZipFile(wheel) as zf:
            meta = wheelcheck.read_metadata(zf)
            for name in wheelcheck.compiled_modules(zf.namelist()):
                digest, size = hashlib.sha256(), 0
                with zf.open(name) as fh:
                    for chunk in iter(functools.partial(fh.read, 1 << 20), b""):
                        digest.update(chunk)
                        size += len(chunk)
                modules.append({"file": name, "sha256": digest.hexdigest(), "size": size})
    except (zipfile.BadZipFile, OSError, KeyError, EOFError, ValueError) as exc:
        raise SbomError(f"{wheel.name} cannot be read ({exc})") from None
    except Exception as exc:  # zlib.error, NotImplementedError (unknown compression)
        raise SbomError(f"{wheel.name} cannot be read ({type(exc).__name__})") from None
    parts = wheel.name.split(
        "-"
    )  # no METADATA (not a wheel we made): name and version from the file name
    return {
        "name": (meta["Name"] or parts[0])[:_MAX_STR],
        "version": (meta["Version"] or (parts[1] if len(parts) > 1 else "0"))[:_MAX_STR],
        "requires": meta.get_all("Requires-Dist") or [],
        "modules": modules,
    }


# --- the SBOM ------------------------------------------------------------------------------------------------------

# cyclonedx's serialiser logs every class it registers and every dump at DEBUG; under nox (whose root handler takes
# DEBUG) that was ~800 lines in a build's output. Its warnings still show.
for _name in ("py_serializable", "serializable", "cyclonedx"):
    logging.getLogger(_name).setLevel(logging.WARNING)


def sbom_text(manifest: dict, wheel: Path, wheel_sha256: str) -> str:
    """The CycloneDX 1.6 JSON SBOM, or SbomError."""
    try:
        from cyclonedx.model.bom import Bom
        from cyclonedx.model.component import Component, ComponentType
        from cyclonedx.model.lifecycle import LifecyclePhase, PredefinedLifecycle
        from cyclonedx.output.json import JsonV1Dot6
    except ImportError as exc:
        raise SbomError(
            f"cyclonedx-python-lib is not installed ({exc.name or exc}): "
            "pip install -r requirements/runtime.txt"
        ) from None
    facts = _wheel_facts(wheel)
    packages = _packages(manifest)
    root = _root(manifest, facts, wheel, wheel_sha256)
    bom = Bom(
        serial_number=uuid.uuid5(_NAMESPACE, wheel_sha256 + json.dumps(packages, sort_keys=True))
    )
    bom.metadata.component = root
    bom.metadata.timestamp = _timestamp(manifest.get("created"))
    bom.metadata.lifecycles.add(PredefinedLifecycle(LifecyclePhase.BUILD))
    bom.metadata.tools.components.add(
        Component(
            name="apexkit",
            version=_s(manifest.get("apexkit"), "unknown"),
            type=ComponentType.APPLICATION,
        )
    )
    tools = _dict(manifest.get("tools"))
    target_id = _s(_dict(manifest.get("target")).get("target_id"), "unknown")
    build = [(f"build_{k}", _s(tools.get(k))) for k in ("python", "host")]
    bom.metadata.properties.update(_props(("target", target_id), *build))
    runtime = {
        canonicalize_name(re.split(r"[\s;<>=!~\[(]", r, maxsplit=1)[0])
        for r in facts["requires"]
        if r.strip()
    }
    depends = []
    for module in facts["modules"]:
        c = Component(
            name=module["file"],
            type=ComponentType.FILE,
            bom_ref=f"file:{module['file']}",
            hashes=[_sha(module["sha256"])],
            properties=_props(("size", str(module["size"]))),
        )
        bom.components.add(c)
        depends.append(c)
    for p in packages:
        c = _package(p, canonicalize_name(p["name"]) in runtime)
        bom.components.add(c)
        if canonicalize_name(p["name"]) in runtime:
            depends.append(c)
    bom.register_dependency(root, depends)
    for c in bom.components:
        if c not in depends:
            bom.register_dependency(c, [])
    return JsonV1Dot6(bom).output_as_string(indent=2) + "\n"


def _props(*pairs: tuple[str, str | None]) -> list:
    """CycloneDX properties apexkit:NAME = value, those with a value."""
    from cyclonedx.model import Property

    return [Property(name=f"apexkit:{name}", value=value) for name, value in pairs if value]


def _sha(value: str):
    from cyclonedx.model import HashAlgorithm, HashType

    return HashType(alg=HashAlgorithm.SHA_256, content=value)


def _root(manifest: dict, facts: dict, wheel: Path, wheel_sha256: str):
    """The wheel's component: its requirements, our patches, its tags, and the sources it descends from."""
    from cyclonedx.model.component import Component, ComponentType, Pedigree
    from packageurl import PackageURL

    identity = _dict(manifest.get("identity"))
    patches = _patches(manifest)
    ancestors = _ancestors(_dict(manifest.get("sources")))
    return Component(
        name=facts["name"],
        version=facts["version"],
        type=ComponentType.LIBRARY,
        bom_ref=f"wheel:{wheel.name}",
        description="Apex for Ascend, built by apexkit",
        hashes=[_sha(wheel_sha256)],
        purl=PackageURL(
            type="pypi",
            name=canonicalize_name(facts["name"]),
            version=facts["version"],
            qualifiers={"file_name": wheel.name},
        ),
        pedigree=Pedigree(ancestors=ancestors) if ancestors else None,
        properties=_props(
            ("wheel_file", wheel.name),
            *(("requires_dist", r[:_MAX_STR]) for r in facts["requires"]),
            *(
                (
                    "patch",
                    f"{_s(p.get('id'))} {_s(p.get('status'))} sha256:{_hex(p.get('sha256'), 64)}",
                )
                for p in patches
            ),
            *((k, _s(identity.get(k))) for k in ("manylinux_tag", "max_glibc", "max_glibcxx")),
        ),
    )


def _ancestors(sources: dict) -> list:
    """Ascend apex and NVIDIA apex, each by the commit the wheel was built from."""
    from cyclonedx.model.component import Component, ComponentType

    out = []
    for key, label in (("ascend_apex", "Ascend apex"), ("nvidia_apex", "NVIDIA apex")):
        src = _dict(sources.get(key))
        commit = _hex(src.get("commit"), 40) or _s(src.get("commit"))
        if commit:
            origin = _s(src.get("origin")) or _s(src.get("url"))
            out.append(
                Component(
                    name=label,
                    version=commit,
                    type=ComponentType.LIBRARY,
                    bom_ref=f"source:{key}",
                    properties=_props(
                        ("git_commit", commit), ("origin", origin), ("ref", _s(src.get("ref")))
                    ),
                )
            )
    return out


def _package(p: dict, runtime: bool):
    """One build venv package: required at run time, or only present at build time."""
    from cyclonedx.model.component import Component, ComponentScope, ComponentType
    from packageurl import PackageURL

    notes = ("record_sha256", "installer", "wheel_file", "wheel_from", "wheel_url")
    return Component(
        name=p["name"],
        version=p["version"],
        type=ComponentType.LIBRARY,
        bom_ref=f"build-venv:{canonicalize_name(p['name'])}@{p['version']}",
        scope=ComponentScope.REQUIRED if runtime else ComponentScope.EXCLUDED,
        purl=PackageURL(type="pypi", name=canonicalize_name(p["name"]), version=p["version"]),
        hashes=[_sha(p["wheel_sha256"])] if p["wheel_sha256"] else None,
        properties=_props(*((k, p[k]) for k in notes)),
    )


def warm_up() -> None:
    """Import the CycloneDX library ahead, in a background thread while the compiler runs: the publish step then
    writes the SBOM without paying the import. Any failure here is left for the publish step to report."""
    try:
        from cyclonedx.model.bom import Bom
        from cyclonedx.output.json import JsonV1Dot6

        JsonV1Dot6(Bom()).output_as_string()
    except Exception:
        pass


def _timestamp(value) -> datetime:
    try:
        return datetime.strptime(str(value), "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc)
    except ValueError:
        return datetime.now(timezone.utc).replace(microsecond=0)


# --- the provenance --------------------------------------------------------------------------------------------------


def provenance(
    manifest: dict, wheel_name: str, wheel_sha256: str, byproducts: Sequence[dict] = ()
) -> dict:
    """An in-toto Statement v1 / SLSA provenance v1 for the wheel, from the manifest (plain JSON, no library)."""
    target, sources, tools = (_dict(manifest.get(k)) for k in ("target", "sources", "tools"))
    image = _dict(manifest.get("builder_image"))
    deps = [
        *_source_deps(sources),
        *(  # our patches by the patch file's sha256 (patches/*.toml), as in the cache key
            {
                "name": f"patch:{_s(p.get('id'))}",
                "digest": _only({"sha256": _hex(p.get("sha256"), 64)}),
                "annotations": {"edits": _s(p.get("file")), "status": _s(p.get("status"))},
            }
            for p in _patches(manifest)
        ),
        *_package_deps(manifest),
        *_tool_deps(tools),
        *([_image_dep(image)] if image else []),
    ]
    keys = ("target_id", "python", "torch", "torch_npu", "arch", "apex_ref", "flags", "identity")
    external = {k: target.get(k) for k in keys if k in target}
    epoch = manifest.get("source_date_epoch")
    return {
        "_type": STATEMENT_TYPE,
        "subject": [{"name": wheel_name, "digest": {"sha256": wheel_sha256}}],
        "predicateType": PREDICATE_TYPE,
        "predicate": {
            "buildDefinition": {
                "buildType": BUILD_TYPE,
                "externalParameters": json.loads(json.dumps(external, default=str)),
                "internalParameters": {
                    "apexkit": _s(manifest.get("apexkit")),
                    "cache_key": _s(manifest.get("cache_key")),
                    "source_date_epoch": epoch if isinstance(epoch, int) else None,
                    "setup_flags": [
                        _s(f) for f in manifest.get("setup_flags") or [] if isinstance(f, str)
                    ],
                },
                "resolvedDependencies": deps,
            },
            "runDetails": {
                "builder": {
                    "id": f"urn:apexkit:builder:{'image' if image else 'host'}",
                    "version": {"apexkit": _s(manifest.get("apexkit"), "unknown")},
                },
                "metadata": {
                    "invocationId": _s(manifest.get("cache_key"), ""),
                    "finishedOn": _s(manifest.get("built")) or _s(manifest.get("created")),
                },
                "byproducts": list(byproducts),
            },
        },
    }


def _source_deps(sources: dict) -> list[dict]:
    """Ascend apex and NVIDIA apex by git commit (a CUDA build has NVIDIA apex only)."""
    deps = []
    for key in ("ascend_apex", "nvidia_apex"):
        if key not in sources:
            continue
        src = _dict(sources.get(key))
        commit = _hex(src.get("commit"), 40)
        entry: dict = {
            "name": key.replace("_", "-"),
            "uri": _s(src.get("origin")) or _s(src.get("url")) or "unknown",
            "digest": {"gitCommit": commit} if commit else {},
        }
        # a --apex-src copy's commit is not a plain commit
        notes = _only(
            {"commit": None if commit else _s(src.get("commit")), "ref": _s(src.get("ref"))}
        )
        if notes:
            entry["annotations"] = notes
        deps.append(entry)
    return deps


def _package_deps(manifest: dict) -> list[dict]:
    """The build venv's packages: by their wheel file's sha256 where known, else by their installed RECORD's."""
    deps = []
    for p in _packages(manifest):
        notes = {}
        if p["wheel_sha256"]:
            digest, of = {"sha256": p["wheel_sha256"]}, f"the wheel file {p['wheel_file']}"
            notes = _only(
                {
                    "digest_from": p["wheel_from"] or "wheelhouse",
                    "download_location": p["wheel_url"],
                }
            )
        else:
            digest, of = _only({"sha256": p["record_sha256"]}), "its installed dist-info/RECORD"
        deps.append(
            {
                "name": p["name"],
                "uri": f"pkg:pypi/{canonicalize_name(p['name'])}@{p['version']}",
                "digest": digest,
                "annotations": {"digest_of": of, **notes, "role": "build venv"},
            }
        )
    return deps


# (the manifest's tools key, the dependency's name, the tool's fields it notes: none for the interpreter, whose
# version is tools["python"])
_TOOLS = (
    ("compiler", "compiler", ("version",)),
    ("nvcc", "nvcc", ("version", "arch_list", "torch_cuda")),  # a CUDA build's toolkit
    ("interpreter", "python", ()),
)


def _tool_deps(tools: dict) -> list[dict]:
    """The compiler, nvcc and the interpreter, each by its file's sha256."""
    deps = []
    for key, name, noted in _TOOLS:
        tool = _dict(tools.get(key))
        if tool:
            deps.append(
                {
                    "name": name,
                    "uri": f"file://{_s(tool.get('path'), '')}",
                    "digest": _only({"sha256": _hex(tool.get("sha256"), 64)}),
                    "annotations": {k: _s(tool.get(k)) for k in noted}
                    if noted
                    else {"version": _s(tools.get("python"))},
                }
            )
    return deps


def _image_dep(image: dict) -> dict:
    """The builder image a container build ran in, by its image id."""
    digests = image.get("repo_digests")
    return {
        "name": "builder image",
        "uri": f"docker-image://{_s(image.get('image'), '')}",
        "digest": _only({"sha256": _hex((_s(image.get("id")) or "").split(":", 1)[-1], 64)}),
        "annotations": {
            "repo_digests": [_s(d) for d in digests if _s(d)][:8]
            if isinstance(digests, list)
            else [],
            "recipe": _s(image.get("recipe")),
            "base": _s(image.get("base")),
        },
    }


def _only(digest: dict) -> dict:
    return {k: v for k, v in digest.items() if v}


# --- dist/<target>/ -------------------------------------------------------------------------------------------------


def documents(manifest: dict, wheel: Path) -> dict[str, bytes]:
    """The SBOM and the provenance for dist/<target>/ (file name -> bytes), and manifest["attestations"] saying what
    was written. The wheel's sha256 is computed here, from the file that is published. Without cyclonedx-python-lib
    the SBOM is left out (the manifest says why) and the provenance is still written; SbomError when the SBOM is
    invalid (a bug: nothing is published)."""
    wheel_sha = untrusted.sha256_file(wheel)
    out: dict[str, bytes] = {}
    record: dict = {"signed": False, "sbom": None, "provenance": None}
    byproducts = []
    try:
        text = sbom_text(manifest, wheel, wheel_sha).encode()
    except SbomError as exc:
        if "is not installed" not in str(exc):
            raise
        record["sbom_missing"] = str(exc)
    else:
        out[SBOM_FILE] = text
        digest = hashlib.sha256(text).hexdigest()
        record["sbom"] = {
            "file": SBOM_FILE,
            "format": f"CycloneDX {SPEC_VERSION} JSON",
            "sha256": digest,
        }
        byproducts.append(
            {
                "name": SBOM_FILE,
                "digest": {"sha256": digest},
                "mediaType": "application/vnd.cyclonedx+json",
            }
        )
    statement = (
        json.dumps(provenance(manifest, wheel.name, wheel_sha, byproducts), indent=2) + "\n"
    ).encode()
    out[PROVENANCE_FILE] = statement
    record["provenance"] = {
        "file": PROVENANCE_FILE,
        "format": f"in-toto Statement v1, {PREDICATE_TYPE}",
        "sha256": hashlib.sha256(statement).hexdigest(),
    }
    manifest["attestations"] = record
    return out
