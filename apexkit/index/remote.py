"""The team's published index as a source of prebuilt wheels: the first cache of a build (by cache key) and where
`apexkit install` finds the wheel that fits a venv (by its facts). Ascend publishes no apex wheels, so a trustworthy
team index is the only place a prebuilt one can come from.

An index is what `invoke publish` wrote (apexkit.index.publish), reached as http(s):// (through pip's proxy, CA and
the user:password@ of its URL, as apexkit.index.client does for pip's own indexes), file:// or a directory path. Its
index.json lists each wheel with its sha256, cache key, facts, and the build manifest, SBOM and provenance beside it.

Everything an index serves is untrusted: index.json is size-capped and each entry checked (a wheel filename, sha256
digests, facts as plain strings: publish.check_facts), an entry that fails is left out with one line. A wheel is
taken only when the bytes downloaded match the sha256 of index.json and of its own build manifest, the provenance
names that wheel with that sha256, the SBOM describes it, and the zip reads back (the same checks as a hit of the
local wheel cache); anything else is `Refused`. A network failure is `Unreachable`: callers fall back to building
(build) or say so (install). An index that answers but refuses this client (TLS not verified by the CA given,
credentials refused: HTTP 401/403) is `client.Denied`: the build and install stop with its fix, unless asked to
fall back (--team-index-fallback, APEXKIT_TEAM_INDEX_FALLBACK=1).
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import os
import shutil
import tempfile
import typing
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from apexkit import log, untrusted
from apexkit.errors import ApexkitError, ConfigError
from apexkit.index import client, publish, published, signing
from apexkit.wheel import distdir, sbom
from apexkit.wheel.cache import RemoteHit, RemoteLookup

WHEEL_MAX = 4 << 30  # bytes; a CUDA build of apex is some hundred MiB
_CHUNK = 1 << 20


class Refused(Exception):
    """What the index serves is not what it claims (the message says what, on one line)."""


class Unreachable(Exception):
    """The index cannot be read from here (the message says why, on one line)."""


@dataclass(frozen=True)
class Candidate:
    shown: str  # the index root with the password masked, for messages ("cache hit from <shown>")
    entry: publish.Entry  # the checked index.json files[i]
    base: str  # the URL of simple/<project>/, where the wheel and the files beside it are

    @property
    def filename(self) -> str:
        return self.entry.filename


# why a verified statement's signed facts do not fit what is asked, or None (typing's form: Python 3.8)
Fits = typing.Callable[[dict], Optional[str]]
UNVERIFIED = (
    "installing without verifying its signature: no trusted key is configured -- to verify, pass "
    "--trusted-key FILE (the team's .pub), set APEXKIT_TRUSTED_KEYS or trusted_keys in the user config file "
    "(docs/signing.md)"
)


def shown(index: str) -> str:
    return log.sanitise(log.mask(index))


def make_client(indexes: Sequence[str], env: Mapping[str, str], timeout: float = 20.0):
    """A client with pip's CA bundle and proxies (pip's configuration, as `pip install` would use them), sending the
    user:password@ of each index URL as Basic auth to that host only."""
    settings = client.resolve_settings(None, env, timeout)
    return client.Client(dataclasses.replace(settings, urls=tuple(indexes)))


def _file(url: str) -> Path:
    return Path(urllib.request.url2pathname(urllib.parse.urlsplit(url).path))


def _why(exc: BaseException) -> str:
    if isinstance(exc, untrusted.Refused) and isinstance(exc.error, FileNotFoundError):
        return "not found"
    return log.sanitise(log.mask(str(exc)))[:200]


def _get(cl: client.Client, url: str, limit: int) -> bytes:
    """The bytes at `url`, at most `limit` (read as `_download` reads)."""
    out = io.BytesIO()
    _download(cl, url, out, limit)
    return out.getvalue()


def _download(cl: client.Client, url: str, out: typing.BinaryIO, limit: int) -> str:
    """Stream `url` (file:// read without following links) into `out`, at most `limit` bytes, hashing what is
    written: its sha256. Unreachable when it cannot be read (missing, HTTP error, network), Refused when it is
    larger."""
    digest, size = hashlib.sha256(), 0
    try:
        file = url.startswith("file:")
        source = os.fdopen(untrusted.open_regular(_file(url)), "rb") if file else cl.open(url)
        with source:
            for chunk in iter(lambda: source.read(_CHUNK), b""):
                size += len(chunk)
                if size > limit:
                    raise Refused(f"{client.public_url(url)} is larger than {limit} bytes")
                digest.update(chunk)
                out.write(chunk)
    except (urllib.error.HTTPError, ApexkitError, untrusted.Untrusted, OSError, ValueError) as exc:
        raise _unreachable(cl, url, exc) from None
    cl.count(size)
    return digest.hexdigest()


def _unreachable(cl: client.Client, url: str, exc: BaseException) -> Exception:
    """What a failed read of `url` raises: client.Denied (TLS not verified, credentials refused: asking again or
    another index does not help, the fix is the user's) as it is, else Unreachable with the cause."""
    if isinstance(exc, urllib.error.HTTPError):
        if exc.code in (401, 403):
            return client.credentials_refused(cl, url, exc.code, exc.filename)
        return Unreachable(f"{client.public_url(url)}: HTTP {exc.code}")
    if isinstance(exc, ApexkitError):
        return exc if isinstance(exc, client.Denied) else Unreachable(exc.cause)
    return Unreachable(f"{client.public_url(url)}: {_why(exc)}")


# --- index.json ------------------------------------------------------------------------------------------------------


def _entry(raw: object, n: int, where: str) -> publish.Entry | None:
    """files[n] of an index.json checked (publish.read_entry), or None (with one line) when it is not an entry
    apexkit wrote."""
    try:
        entry = publish.read_entry(raw, Path("."), f"files[{n}]", "")
    except ConfigError as exc:
        log.warn(f"{where}: an entry is left out ({log.sanitise(log.mask(exc.cause))[:200]})")
        return None
    return dataclasses.replace(entry, target=log.sanitise(entry.target)[:200])


def read_listing(cl: client.Client, index: str) -> list[publish.Entry] | None:
    """The checked entries of one index's index.json, or None (one warning line) when it cannot be read from here or
    is not an apexkit index."""
    root = published.root_url(index)
    where = shown(root)
    try:
        body = _get(cl, root + "/index.json", published.INDEX_JSON_MAX)
        files = publish.listed(json.loads(body.decode("utf-8")))
    except (Unreachable, Refused) as exc:
        log.warn(f"team index {where} cannot be read ({exc})")
        return None
    except (UnicodeDecodeError, ValueError, RecursionError):
        log.warn(f"team index {where}: index.json is not JSON")
        return None
    if files is None:
        log.warn(
            f'team index {where}: index.json is not an apexkit index ("format": "{publish.FORMAT}")'
        )
        return None
    return [e for n, raw in enumerate(files) if (e := _entry(raw, n, where)) is not None]


def _candidate(index: str, entry: publish.Entry) -> Candidate:
    root = published.root_url(index)
    return Candidate(shown(root), entry, f"{root}/simple/{entry.project}/")


def find_by_key(cl: client.Client, indexes: Sequence[str], key: str) -> Candidate | None:
    """The first wheel of `indexes` (in order) built from the inputs `key` names (buildplan.cache_key) whose index keeps
    its build manifest (a cache hit republishes it), or None."""
    for index in indexes:
        for entry in read_listing(cl, index) or []:
            if entry.cache_key == key and entry.manifest is not None:
                return _candidate(index, entry)
    return None


def misfit(facts: Mapping[str, object], want: Mapping[str, object]) -> str | None:
    """Why a wheel with these facts does not fit the venv `want` describes (None when it fits). `want`: tags (the
    wheel tags the venv's pip installs, best first), python_tag (cp311), arch and glibc ("2.35") for the words, torch
    (its version, a local label allowed), torch_npu (or None), cxx11_abi (0/1 or None when unknown), cuda. The first
    of _MISFITS that finds one says why."""
    return next((why for check in _MISFITS if (why := check(facts, want))), None)


def _tag(facts: Mapping[str, object]) -> str:
    return "-".join(str(facts.get(k)) for k in ("python_tag", "abi_tag", "platform_tag"))


def _tags_misfit(facts: Mapping[str, object], want: Mapping[str, object]) -> str | None:
    """The wheel's python, abi and platform tags: one the venv's pip installs (its Python, arch and glibc at once)."""
    if _tag(facts) in want.get("tags", ()):  # type: ignore[operator]
        return None
    venv = f"{want.get('python_tag')}, {want.get('arch')}, glibc {want.get('glibc') or 'unknown'}"
    return f"tagged {_tag(facts)}, which the venv ({venv}) does not install"


def _torch_misfit(facts: Mapping[str, object], want: Mapping[str, object]) -> str | None:
    """The torch and torch_npu the wheel was built for, and its Requires-Dist pins of them."""
    torch, npu = _version(want.get("torch")), want.get("torch_npu")
    if torch is None:
        return "the venv has no torch"
    if facts.get("torch") != torch.public:
        return f"for torch {facts.get('torch')}, the venv has {torch}"
    if (facts.get("torch_npu") is None) != (npu is None):
        return (
            f"built without torch_npu, the venv has torch_npu {npu}"
            if npu
            else f"for torch_npu {facts.get('torch_npu')}, the venv has none"
        )
    have = {"torch": str(torch), "torch-npu": str(npu) if npu else None}
    for pin in facts.get("requires_dist") or []:  # type: ignore[attr-defined]
        try:
            req = Requirement(str(pin))
        except InvalidRequirement:
            return f"its pin {pin!r} is not a requirement"
        name = canonicalize_name(req.name)
        version = have.get(name, "")
        if name in have and not (version and req.specifier.contains(version, prereleases=True)):
            return f"pins {pin}, the venv has {name} {version or 'missing'}"
    return None


def _build_misfit(facts: Mapping[str, object], want: Mapping[str, object]) -> str | None:
    """The CUDA release, C++ ABI and patches the wheel was built with."""
    if facts.get("backend") == "cuda" and _release(facts.get("cuda")) != _release(want.get("cuda")):
        return f"NVIDIA apex for CUDA {facts.get('cuda')}, the venv's torch is " + (
            f"CUDA {want.get('cuda')}" if want.get("cuda") else "a build without CUDA"
        )
    abi, built = want.get("cxx11_abi"), facts.get("cxx11_abi")
    if None not in (abi, built) and built != abi:
        return f"built for the {'new' if built else 'old'} C++ ABI, the venv's torch uses the other"
    if (facts.get("identity") or {}).get("skip_patches"):  # type: ignore[attr-defined]
        return "a diagnosis build (--skip-patch)"
    return None


_MISFITS = (_tags_misfit, _torch_misfit, _build_misfit)


def find_by_facts(
    cl: client.Client, indexes: Sequence[str], want: Mapping[str, object]
) -> tuple[list[Candidate], list[str]]:
    """The wheels of `indexes` that fit the venv `want` describes (see `misfit`), best first: earlier indexes first,
    then builds with default inputs, then the venv pip's order of their tags; and the near misses (same torch, or
    same Python) as "<filename> (<index>): <why>"."""
    fits: list[tuple[int, int, str, Candidate]] = []
    near: list[str] = []
    torch = _version(want.get("torch"))
    same = {"torch": torch.public if torch else None, "python_tag": want.get("python_tag")}
    for rank, index in enumerate(indexes):
        for entry in read_listing(cl, index) or []:
            facts = entry.facts
            if not facts:
                continue
            why = misfit(facts, want)
            candidate = _candidate(index, entry)
            if why is None:
                plain = set((facts.get("identity") or {}).keys()) <= {"torch_npu"}
                # a venv with a CUDA torch and no torch_npu: NVIDIA apex on CUDA before Ascend's CPU tier
                other = (
                    bool(want.get("cuda"))
                    and facts.get("backend") != "cuda"
                    and not want.get("torch_npu")
                )
                fits.append((rank, int(other) * 2 + (0 if plain else 1), _tag(facts), candidate))
            elif any(facts.get(key) == value for key, value in same.items()):
                near.append(f"{entry.filename[:200]} ({candidate.shown}): {why[:200]}")
    tags = list(want.get("tags", ()))  # type: ignore[call-overload]
    fits.sort(key=lambda f: (f[0], f[1], tags.index(f[2])))  # pip's order: the newest glibc first
    return [f[3] for f in fits], near


def _release(version: object) -> str | None:
    """ "13.0" of a CUDA version ("13.0", "13.0.88"); None when it is not one."""
    parts = str(version).split(".")
    return (
        ".".join(parts[:2])
        if version and len(parts) >= 2 and all(p.isdigit() for p in parts[:2])
        else None
    )


def _version(version: object) -> Version | None:
    try:
        return Version(str(version))
    except InvalidVersion:
        return None


# --- fetch and verify ------------------------------------------------------------------------------------------------


def fetch(
    cl: client.Client,
    candidate: Candidate,
    work: Path,
    trusted: Mapping[str, Any] | None = None,
    fits: Fits | None = None,
) -> tuple[RemoteHit, str | None]:
    """Download the candidate's wheel (and its manifest, SBOM and provenance) into a new folder of `work` and verify
    them; with `trusted` keys (key id -> public key), first its envelope (`verified`). Returns the verified wheel and
    the trusted key id whose envelope verified it (None: verification off). Refused / Unreachable; nothing of a
    refused wheel is left behind."""
    work.mkdir(parents=True, exist_ok=True)
    folder = Path(tempfile.mkdtemp(prefix="team-index-", dir=work))
    try:
        return _fetch(cl, candidate, folder, trusted or {}, fits or (lambda statement: None))
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise


def verified(
    cl: client.Client,
    candidate: Candidate,
    wheel: Path,
    sha: str,
    trusted: Mapping[str, Any],
    fits: Fits,
) -> str:
    """The trusted key id whose envelope (<wheel>.intoto.jsonl beside it, whatever index.json says) signs a
    statement about `wheel` with the sha256 `sha` of the bytes downloaded, whose signed facts `fits` accepts; else
    Refused naming the reason and the key ids."""
    trusting = f"trusted key {', '.join(sorted(trusted))}"
    try:
        data = _get(
            cl,
            candidate.base + urllib.parse.quote(wheel.name + signing.SUFFIX),
            signing.ENVELOPE_MAX,
        )
        statement, keyid = signing.verify(data, trusted)
    except Unreachable as exc:
        raise Refused(f"it has no signature {signing.SUFFIX} ({exc}); {trusting}") from None
    except Refused as exc:
        raise Refused(f"its signature file {exc}; {trusting}") from None
    except signing.Unverified as exc:
        raise Refused(f"its signature does not verify: {exc}; {trusting}") from None
    why = signing.subject_mismatch(statement, wheel, sha) or fits(statement)
    if why:
        raise Refused(f"{why} (signed by {keyid})")
    return keyid


def _fetch(
    cl: client.Client, candidate: Candidate, folder: Path, trusted: Mapping[str, Any], fits: Fits
) -> tuple[RemoteHit, str | None]:
    entry, name = candidate.entry, candidate.filename
    quoted = urllib.parse.quote(name)
    with open(folder / name, "xb") as out:
        sha = _download(cl, candidate.base + quoted, out, WHEEL_MAX)
    signer = verified(cl, candidate, folder / name, sha, trusted, fits) if trusted else None
    if sha != entry.sha256:
        raise Refused(
            f"{untrusted.shown(name)} from {candidate.shown} does not match the sha256 its index.json records"
        )
    try:
        untrusted.check_zip(folder / name)
    except untrusted.Untrusted as exc:
        raise Refused(str(exc)) from None
    texts: dict[str, bytes] = {}
    for record in (entry.manifest, *entry.attestations):
        if record is None:
            continue
        kind = record.kind
        data = _get(
            cl,
            candidate.base + urllib.parse.quote(record.filename),
            distdir.MANIFEST_MAX if kind == "manifest" else publish.ATTESTATION_MAX,
        )
        if hashlib.sha256(data).hexdigest() != record.sha256:
            raise Refused(
                f"the {kind} of {untrusted.shown(name)} from {candidate.shown} does not match the sha256 its "
                "index.json records"
            )
        texts[kind] = data
    if "provenance" not in texts:
        raise Refused(
            f"{candidate.shown} keeps no provenance for {untrusted.shown(name)}: nothing says who built it"
        )
    for kind in ("provenance", "sbom"):
        if kind in texts:
            why = publish.not_about(kind, texts[kind], name, sha)
            if why:
                raise Refused(f"the {kind} of {untrusted.shown(name)} from {candidate.shown} {why}")
    manifest: dict = {}
    if "manifest" in texts:
        manifest = _manifest(texts, name, sha, entry, candidate.shown)
    documents = {sbom.PROVENANCE_FILE: texts["provenance"]}
    if "sbom" in texts:
        documents[sbom.SBOM_FILE] = texts["sbom"]
    return RemoteHit(folder / name, manifest, documents, candidate.shown), signer


def _manifest(
    texts: dict[str, bytes], name: str, sha: str, entry: publish.Entry, where: str
) -> dict:
    """The build manifest beside the wheel: a JSON object naming this wheel, its sha256 and the entry's cache key,
    whose recorded SBOM/provenance are the ones the index keeps."""
    try:
        manifest = json.loads(texts["manifest"].decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise Refused(f"the manifest of {untrusted.shown(name)} from {where} is not JSON") from None
    wheel = manifest.get("wheel") if isinstance(manifest, dict) else None
    if not isinstance(wheel, dict) or wheel.get("file") != name or wheel.get("sha256") != sha:
        raise Refused(
            f"the manifest of {untrusted.shown(name)} from {where} names another wheel or sha256"
        )
    if entry.cache_key is not None and manifest.get("cache_key") != entry.cache_key:
        raise Refused(
            f"the manifest of {untrusted.shown(name)} from {where} records another cache key than its index.json"
        )
    recorded = manifest.get("attestations")
    for kind, (filename, _suffix) in publish.ATTESTATIONS.items():
        record = recorded.get(kind) if isinstance(recorded, dict) else None
        if kind in texts and not (
            isinstance(record, dict)
            and record.get("file") == filename
            and record.get("sha256") == hashlib.sha256(texts[kind]).hexdigest()
        ):
            raise Refused(
                f"the manifest of {untrusted.shown(name)} from {where} does not record the {kind} the index keeps"
            )
    return manifest


# --- the build's cache after the local one ---------------------------------------------------------------------------


def build_lookup(
    indexes: Sequence[str], env: Mapping[str, str], trusted: Mapping[str, Any] | None = None
) -> RemoteLookup:
    """The team indexes as a build's cache after the local one (apexkit.wheel.cache.RemoteLookup: the builder never
    imports apexkit.index): reached through pip's proxy and CA settings, user:password@ in an index URL sent as Basic
    auth; each index in turn, every failure one warning line, then a compile. With `trusted` keys a hit is taken
    only when its envelope verifies and signs this cache key (`verified`); a refused one is a failure as above."""
    indexes, trusted = tuple(indexes), dict(trusted or {})

    def lookup(key: str, work: Path) -> RemoteHit | None:
        def cause(exc: Exception) -> str:
            why = exc.cause if isinstance(exc, ApexkitError) else getattr(exc, "strerror", None)
            return log.mask(str(why or exc))

        try:
            http = make_client(indexes, env)
        except (ApexkitError, OSError) as exc:  # pip's configuration (its CA bundle) is broken
            log.warn(f"team index not asked ({cause(exc)}): compiling")
            return None
        # each index in turn: one that cannot be read or serves a wheel that is refused does not hide the next one
        for n, index in enumerate(indexes):
            then = "asking the next index" if n + 1 < len(indexes) else "compiling"
            where = shown(index)
            try:
                candidate = find_by_key(http, [index], key)
                if candidate is None:
                    continue
                where = candidate.shown
                hit, _signer = fetch(
                    http,
                    candidate,
                    work,
                    trusted,
                    lambda st: signing.facts_mismatch(st, {"cache_key": key}),
                )
            except Refused as exc:
                log.warn(f"team index {where}: wheel refused ({exc}); nothing of it kept: {then}")
                continue
            except client.Denied:  # the builder stops on it (unless --team-index-fallback)
                raise
            except (Unreachable, ApexkitError, OSError) as exc:
                log.warn(f"team index {where}: {cause(exc)}: {then}")
                continue
            if not trusted:
                log.info(UNVERIFIED.replace("installing", "taking the team index's wheel"))
            return hit
        return None

    return lookup
