"""Signed delivery (docs/signing.md): the team's Ed25519 key signs an in-toto statement per wheel, in a DSSE envelope
kept beside the wheel as `<wheel file name>.intoto.jsonl` (one envelope per line; apexkit writes one line).

- Keys: `generate` (apexkit key generate) writes NAME.key (PEM PKCS#8, 0600, created so) and NAME.pub (PEM
  SubjectPublicKeyInfo). A key id is the lowercase hex sha256 of the public key's DER SubjectPublicKeyInfo.
  `private_key` reads the signing key from a file only we can read, or from $APEXKIT_SIGNING_KEY_PEM (a CI secret,
  never shown); `public_keys` / `trusted_keys` read the trusted public keys (config trusted_keys,
  $APEXKIT_TRUSTED_KEYS, --trusted-key): several may be trusted (rotation), removing one revokes it.
- Envelopes: `sign` makes one (payloadType application/vnd.in-toto+json, signatures over the DSSE pre-authentication
  encoding `pae`); `verify` reads one from untrusted bytes and returns the statement and the key id that signed it,
  else raises `Unverified` with one reason. `statement` makes the in-toto Statement v1 (the SLSA provenance of
  apexkit.wheel.sbom plus the wheel's target facts under predicate.apexkit_target); `subject_mismatch` and
  `facts_mismatch` say why a verified statement is not about this wheel file, or not for what was asked.

Callers turn `Unverified` into their own one-line error naming the wheel (its `keyids` are the envelope's).
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import hashlib
import json
import os
import re
import stat
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from apexkit import cachetrust, config, log, untrusted
from apexkit.errors import ConfigError, EnvironmentSetupError
from apexkit.wheel import sbom

PAYLOAD_TYPE = "application/vnd.in-toto+json"
SUFFIX = ".intoto.jsonl"  # <wheel file name>.intoto.jsonl
TARGET_FIELD = "apexkit_target"  # the predicate's extension field (SLSA: <vendor>_<name>) with the target facts
PEM_ENV = "APEXKIT_SIGNING_KEY_PEM"  # the private key's PEM itself (a CI secret), instead of a file
KEY_MAX = 16 << 10  # bytes of a key file
ENVELOPE_MAX = (
    8 << 20
)  # bytes of an .intoto.jsonl (a provenance lists every build-venv package: ~100 KiB)
MAX_LINES = MAX_SIGNATURES = 16
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


class Unverified(untrusted.Untrusted):
    """An envelope that is not a valid signature by a trusted key over an in-toto statement: one reason."""

    def __init__(self, reason: str, keyids: Sequence[str] = ()) -> None:
        super().__init__(reason)
        self.keyids = tuple(keyids)


def _crypto() -> Any:
    """cryptography's Ed25519 and serialization modules (a runtime pin; absent only on Python 3.9.0/3.9.1)."""
    try:
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import ed25519
    except ImportError:
        raise EnvironmentSetupError(
            "signing needs the cryptography package, which is not installed",
            "pip install -r requirements/runtime.txt (on Python 3.9.2+ or 3.8)",
        ) from None
    return serialization, ed25519


def key_id(public_key: Any) -> str:
    """The key id: lowercase hex sha256 of the DER SubjectPublicKeyInfo (the usual DSSE / sigstore derivation)."""
    serialization, _ = _crypto()
    der = public_key.public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return hashlib.sha256(der).hexdigest()


@dataclass(frozen=True)
class SigningKey:
    private: Any = field(repr=False)  # an Ed25519PrivateKey
    keyid: str
    origin: str  # the file, or $APEXKIT_SIGNING_KEY_PEM: where it came from, for a message


# --- keys ---------------------------------------------------------------------------------------------------------


def generate(name: str, out: str = ".", dry_run: bool = False) -> int:
    """apexkit key generate: NAME.key (0600 from its creation, never over an existing file) and NAME.pub (0644)."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ConfigError(
            f"key name {untrusted.shown(name)} is not a plain name",
            "use letters, digits, '.', '_' or '-' (e.g. --name team-2026)",
        )
    # a folder another user controls: they could swap NAME.pub (or the key) once written
    folder = cachetrust.trusted_output(Path(out), "--out", make=False, entries=False)
    key_path, pub_path = folder / f"{name}.key", folder / f"{name}.pub"
    for path in (key_path, pub_path):
        if os.path.lexists(path):
            raise ConfigError(
                f"{path} already exists; no key written",
                "choose another --name, or move the old pair away first (rotation: keep trusting the old .pub)",
            )
    if dry_run:
        log.out(f"would write {key_path} (mode 0600) and {pub_path} (mode 0644)")
        return 0
    serialization, ed25519 = _crypto()
    private = ed25519.Ed25519PrivateKey.generate()
    secret = private.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    public = private.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    cachetrust.make_dir(folder, 0o700)
    _write_new(key_path, secret, 0o600)
    try:
        _write_new(pub_path, public, 0o644)
    except BaseException:
        key_path.unlink()
        raise
    log.out(f"wrote {key_path} (private, mode 0600) and {pub_path} (public)")
    log.out(f"key id {key_id(private.public_key())}")
    return 0


def _write_new(path: Path, data: bytes, mode: int) -> None:
    """A new file (O_EXCL: never an existing one, never through a link), created with `mode`."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
    except OSError as exc:
        raise ConfigError(
            f"cannot create {path}: {exc.strerror}", "choose another --name or --out"
        ) from None
    try:
        os.fchmod(fd, mode)  # the umask may have taken bits a public key keeps
        os.write(fd, data)
    except BaseException:
        os.close(fd)
        path.unlink()
        raise
    os.close(fd)


def _ed25519(data: bytes, private: bool, where: str, fix: str) -> Any:
    serialization, ed25519 = _crypto()
    kind = ed25519.Ed25519PrivateKey if private else ed25519.Ed25519PublicKey
    try:
        key = (
            serialization.load_pem_private_key(data, password=None)
            if private
            else serialization.load_pem_public_key(data)
        )
    except TypeError:  # an encrypted key
        raise ConfigError(
            f"{where} is encrypted (apexkit reads an unencrypted PKCS#8 key kept at 0600)", fix
        ) from None
    except Exception:  # ValueError, UnsupportedAlgorithm: never shown, the text is a secret
        what = "private" if private else "public"
        raise ConfigError(f"{where} is not a PEM {what} key", fix) from None
    if not isinstance(key, kind):
        raise ConfigError(f"{where} is not an Ed25519 key", fix)
    return key


def _read_key_file(path: str, private: bool) -> bytes:
    """A key file's bytes: a regular file (no link), ours, not over KEY_MAX; a private one that no one else may read
    or write, a public one that no one else may write."""
    shown = untrusted.shown(path)
    fix = "chmod 600 " + shown if private else f"chmod go-w {shown}"
    try:
        fd = untrusted.open_regular(path)
        with os.fdopen(fd, "rb") as fh:
            st = os.fstat(fd)
            data = fh.read(KEY_MAX + 1)
    except untrusted.Refused as exc:
        raise ConfigError(f"key file {exc}", "give the key file itself, a regular file") from None
    if st.st_uid != os.geteuid() and (private or st.st_uid != 0):
        raise ConfigError(
            f"key file {shown} is owned by uid {st.st_uid}, not by you",
            "use a key file only you own; one another user owns may have been swapped",
        )
    mode = stat.S_IMODE(st.st_mode)
    bad = mode & 0o077 if private else mode & 0o022
    if private and bad:
        raise ConfigError(
            f"private key {shown} is mode {mode:04o}: others can read or write it", fix
        )
    if bad:
        raise ConfigError(f"trusted key {shown} is mode {mode:04o}: others can replace it", fix)
    if len(data) > KEY_MAX:
        raise ConfigError(
            f"key file {shown} is larger than {KEY_MAX} bytes", "give the .pub or .key file"
        )
    return data


def private_key(path: str | None, environ: Mapping[str, str] | None = None) -> SigningKey:
    """The signing key: the file `path` (--sign-key, config signing_key), or the PEM in $APEXKIT_SIGNING_KEY_PEM;
    both, or neither, is refused in one line. The PEM is never shown."""
    environ = os.environ if environ is None else environ
    pem = environ.get(PEM_ENV, "")
    if path and pem.strip():
        raise ConfigError(f"both a signing key file and ${PEM_ENV} are given", "pass one of them")
    if path:
        fix = f"give an Ed25519 key made by {'apexkit key generate'}"
        key = _ed25519(
            _read_key_file(path, True), True, f"private key {untrusted.shown(path)}", fix
        )
        return SigningKey(key, key_id(key.public_key()), path)
    if not pem.strip():
        raise ConfigError(
            "no signing key given",
            f"pass --sign-key FILE (or set signing_key, or ${PEM_ENV} to the key's PEM)",
        )
    fix = f"set ${PEM_ENV} to the whole PEM of an unencrypted Ed25519 key (apexkit key generate)"
    key = _ed25519(pem.encode("utf-8", "replace")[:KEY_MAX], True, f"${PEM_ENV}", fix)
    return SigningKey(key, key_id(key.public_key()), f"${PEM_ENV}")


def public_keys(paths: Sequence[str]) -> dict[str, Any]:
    """key id -> Ed25519 public key of each file in `paths` (a file others can write is refused: it is the anchor)."""
    fix = "give the NAME.pub that apexkit key generate wrote"
    out = {}
    for path in paths:
        data = _read_key_file(path, False)
        key = _ed25519(data, False, f"trusted key {untrusted.shown(path)}", fix)
        out[key_id(key)] = key
    return out


def trusted_keys(
    flags: Sequence[str] = (), environ: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """The trusted public keys: --trusted-key files, else $APEXKIT_TRUSTED_KEYS, else the user config file's
    trusted_keys. Empty: verification is off. A project ./apexkit.toml's trusted_keys is ignored, with one warning
    line: a cloned repository must not swap the team's key."""
    found = config.load(environ)
    value = found.get("trusted_keys", environ, flag=list(flags))
    if value.layer == config.PROJECT:
        log.warn(
            f"trusted_keys in {log.sanitise(value.where)} is ignored: a project file cannot choose the keys "
            "-- pass --trusted-key, set APEXKIT_TRUSTED_KEYS or trusted_keys in the user config file"
        )
        value = dataclasses.replace(found, project={}).get("trusted_keys", environ)
    return public_keys(value.items)


# --- envelopes ----------------------------------------------------------------------------------------------------


def pae(payload_type: str, payload: bytes) -> bytes:
    """DSSE's pre-authentication encoding: "DSSEv1" SP LEN(type) SP type SP LEN(body) SP body (lengths in ASCII
    decimal of the UTF-8 bytes)."""
    kind = payload_type.encode("utf-8")
    return b"DSSEv1 %d %s %d %s" % (len(kind), kind, len(payload), payload)


def canonical(data: object) -> bytes:
    """The bytes a statement is signed as: JSON with sorted keys, no spaces, UTF-8."""
    return json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def sign(statement: Mapping[str, object], key: SigningKey) -> dict:
    """A DSSE envelope of `statement` signed by `key`."""
    payload = canonical(statement)
    sig = key.private.sign(pae(PAYLOAD_TYPE, payload))
    return {
        "payloadType": PAYLOAD_TYPE,
        "payload": base64.b64encode(payload).decode(),
        "signatures": [{"keyid": key.keyid, "sig": base64.b64encode(sig).decode()}],
    }


def envelope_line(envelope: Mapping[str, object]) -> bytes:
    """The envelope as the one line of an .intoto.jsonl file."""
    return json.dumps(envelope, sort_keys=True, separators=(",", ":")).encode() + b"\n"


def _b64(value: object, what: str) -> bytes:
    """Strict standard base64 (no whitespace, no other alphabet), else Unverified."""
    if not isinstance(value, str):
        raise Unverified(f"{what} is a {type(value).__name__}, not a base64 string")
    try:
        return base64.b64decode(value.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError):
        raise Unverified(f"{what} is not strict base64") from None


def _envelope(line: bytes) -> tuple[bytes, list[tuple[str, bytes]]]:
    """(payload, [(keyid, signature)]) of one envelope line, its shape and types checked."""
    try:
        env = json.loads(line.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise Unverified("the envelope is not JSON") from None
    if not isinstance(env, dict):
        raise Unverified("the envelope is not a JSON object")
    if env.get("payloadType") != PAYLOAD_TYPE:
        raise Unverified(
            f"payloadType is {untrusted.shown(env.get('payloadType'))}, not {PAYLOAD_TYPE}"
        )
    payload, sigs = _b64(env.get("payload"), "payload"), env.get("signatures")
    if not isinstance(sigs, list) or not 0 < len(sigs) <= MAX_SIGNATURES:
        raise Unverified(f"signatures is not a list of 1 to {MAX_SIGNATURES} signatures")
    out = []
    for n, entry in enumerate(sigs, 1):
        keyid = entry.get("keyid", "") if isinstance(entry, dict) else None
        if not isinstance(keyid, str) or (keyid and not untrusted.sha256_digest(keyid)):
            raise Unverified(f"signature {n} is not {{keyid: <sha256 hex>, sig: <base64>}}")
        out.append((keyid.lower(), _b64(entry.get("sig"), f"signature {n}")))
    return payload, out


def _check_line(line: bytes, trusted: Mapping[str, Any]) -> tuple[dict, str]:
    payload, sigs = _envelope(line)
    message, keyids = pae(PAYLOAD_TYPE, payload), [k for k, _ in sigs if k]
    tried = []
    for keyid, sig in sigs:
        for kid in (
            [keyid] if keyid else list(trusted)
        ):  # no keyid (DSSE allows it): each trusted key
            if kid in trusted:
                tried.append(kid)
                if _valid(trusted[kid], sig, message):
                    return _statement_of(payload, keyids), kid
    if tried:
        raise Unverified(f"bad signature by trusted key {', '.join(sorted(set(tried)))}", keyids)
    raise Unverified(
        f"signed by {', '.join(keyids) or 'no named key'}, none of them a trusted key", keyids
    )


def _valid(public: Any, sig: bytes, message: bytes) -> bool:
    from cryptography.exceptions import InvalidSignature

    try:
        public.verify(sig, message)
    except InvalidSignature:
        return False
    return True


def _statement_of(payload: bytes, keyids: Sequence[str]) -> dict:
    """The signed payload as an in-toto Statement v1 (signed does not mean well formed)."""
    try:
        data = json.loads(payload.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise Unverified("the signed payload is not JSON", keyids) from None
    subject = data.get("subject") if isinstance(data, dict) else None
    if not isinstance(data, dict) or data.get("_type") != sbom.STATEMENT_TYPE:
        raise Unverified(
            f"the signed payload is not an in-toto Statement v1 ({sbom.STATEMENT_TYPE})", keyids
        )
    if (
        not isinstance(subject, list)
        or not subject
        or not all(isinstance(s, dict) for s in subject)
    ):
        raise Unverified("the signed statement has no subject", keyids)
    return data


def verify(data: bytes, trusted: Mapping[str, Any]) -> tuple[dict, str]:
    """(the statement, the key id that signed it) of an .intoto.jsonl's bytes: the first line whose envelope is
    signed by a key of `trusted` (key id -> public key). Else Unverified, naming why (of the first line)."""
    if not trusted:
        raise Unverified("no trusted key is configured")
    if len(data) > ENVELOPE_MAX:
        raise Unverified(f"the envelope file is larger than {ENVELOPE_MAX >> 20} MiB")
    lines = [line for line in data.splitlines() if line.strip()]
    if not lines:
        raise Unverified("the envelope file is empty")
    if len(lines) > MAX_LINES:
        raise Unverified(f"the envelope file has more than {MAX_LINES} lines")
    first: Unverified | None = None
    for line in lines:
        try:
            return _check_line(line, trusted)
        except Unverified as exc:
            first = first or exc
    assert first is not None
    raise first


# --- the statement ------------------------------------------------------------------------------------------------


def statement(
    manifest: dict,
    wheel_name: str,
    wheel_sha256: str,
    facts: Mapping[str, object],
    byproducts: Sequence[dict] = (),
) -> dict:
    """The in-toto Statement v1 publish signs: apexkit's SLSA provenance of the wheel (apexkit.wheel.sbom) with the
    target facts under predicate.apexkit_target -- `facts` (publish.facts_of: python/abi/platform tags, arch, torch,
    torch_npu, CUDA, C++ ABI, ...), the glibc floor of its platform tag and the manifest's cache key."""
    found = re.search(r"manylinux_(\d+)_(\d+)_", str(facts.get("platform_tag") or ""))
    legacy = {"manylinux2014": "2.17", "manylinux2010": "2.12", "manylinux1": "2.5"}
    glibc = (
        f"{found[1]}.{found[2]}"
        if found
        else legacy.get(str(facts.get("platform_tag")).split("_")[0])
    )
    key = manifest.get("cache_key")
    out = sbom.provenance(manifest, wheel_name, wheel_sha256, byproducts)
    out["predicate"][TARGET_FIELD] = {
        **facts,
        "glibc": glibc,
        "cache_key": key if untrusted.sha256_digest(key) else None,
    }
    return out


def signed_facts(statement: Mapping[str, Any]) -> dict:
    """predicate.apexkit_target of a verified statement ({} when it has none)."""
    predicate = statement.get("predicate")
    facts = predicate.get(TARGET_FIELD) if isinstance(predicate, dict) else None
    return facts if isinstance(facts, dict) else {}


def subject_mismatch(
    statement: Mapping[str, Any], wheel: Path, sha256: str | None = None
) -> str | None:
    """Why the verified `statement` is not about the wheel file `wheel` (its name and its sha256, `sha256` when the
    caller hashed it already), or None when it is."""
    sha = sha256 or untrusted.sha256_file(wheel)
    subjects = [s for s in statement.get("subject") or [] if isinstance(s, dict)]
    named = [s for s in subjects if s.get("name") == wheel.name]
    if not named:
        names = ", ".join(untrusted.shown(s.get("name")) for s in subjects[:3])
        return f"the signature is for {names or 'no file'}, not {untrusted.shown(wheel.name)}"
    digests = [s.get("digest") for s in named]
    if not any(
        isinstance(d, dict) and untrusted.sha256_digest(d.get("sha256")) == sha for d in digests
    ):
        return f"{untrusted.shown(wheel.name)} is not the file that was signed (its sha256 {sha} differs)"
    return None


def facts_mismatch(statement: Mapping[str, Any], wanted: Mapping[str, object]) -> str | None:
    """Why the signed target facts are not `wanted` (each key given: equal), or None when they fit. `wanted`: e.g.
    {"cache_key": key} for a team-index cache hit, or index.json's facts of the entry (only a hint: signed wins)."""
    facts = signed_facts(statement)
    wrong = [k for k, v in wanted.items() if facts.get(k) != v]
    if not wrong:
        return None
    shown = "; ".join(
        f"{k}: signed {untrusted.shown(facts.get(k))}, wanted {untrusted.shown(wanted[k])}"
        for k in wrong[:3]
    )
    return f"the signed target facts differ ({shown})"
