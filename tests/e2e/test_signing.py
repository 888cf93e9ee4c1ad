"""Issue 42: `python -m apexkit key generate` for real (modes, refusals), and apexkit's DSSE envelopes checked by a
second, independent implementation -- OpenSSL's Ed25519 (`openssl pkeyutl -rawin`) over the pre-authentication
encoding built here from the DSSE spec, not with apexkit's function -- both ways."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import fakes
import pytest
from conftest import ROOT

from apexkit.errors import ConfigError
from apexkit.index import signing

WHEEL = "apex-0.1+ascend.torch2.6.0-cp311-cp311-manylinux_2_28_aarch64.whl"
TYPE = b"application/vnd.in-toto+json"


def apexkit(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    return subprocess.run([sys.executable, "-m", "apexkit", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)  # fmt: skip


def openssl(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True, timeout=60)


@pytest.fixture(scope="module", autouse=True)
def _openssl_has_ed25519_rawin():
    version = subprocess.run(["openssl", "version"], capture_output=True, text=True).stdout
    if not version.startswith("OpenSSL 3"):
        pytest.skip(f"pkeyutl -rawin with Ed25519 needs OpenSSL 3, this is {version.strip()}")


def pae_by_hand(payload: bytes) -> bytes:
    """DSSE protocol.md: "DSSEv1" SP LEN(type) SP type SP LEN(body) SP body."""
    return b" ".join(
        [b"DSSEv1", str(len(TYPE)).encode(), TYPE, str(len(payload)).encode(), payload]
    )


def test_key_generate_writes_the_pair_with_their_modes_and_refuses_to_overwrite(tmp_path):
    made = apexkit("key", "generate", "--name", "team", "--out", "keys", cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    key, pub = tmp_path / "keys" / "team.key", tmp_path / "keys" / "team.pub"
    assert oct(key.stat().st_mode & 0o777) == "0o600" and oct(pub.stat().st_mode & 0o777) == "0o644"
    der = subprocess.run(
        ["openssl", "pkey", "-pubin", "-in", str(pub), "-outform", "DER"], capture_output=True
    )
    keyid = hashlib.sha256(der.stdout).hexdigest()
    assert der.returncode == 0 and f"key id {keyid}" in made.stdout
    assert "BEGIN" not in made.stdout + made.stderr  # the key itself is never printed
    before = key.read_bytes(), pub.read_bytes()
    again = apexkit("key", "generate", "team", "--out", "keys", cwd=tmp_path)
    assert again.returncode == 2
    assert again.stderr.strip().splitlines() == [
        f"error: {Path('keys') / 'team.key'} already exists; no key written -- next: choose another --name, or "
        "move the old pair away first (rotation: keep trusting the old .pub)"
    ]
    assert (key.read_bytes(), pub.read_bytes()) == before


@fakes.needs_root
def test_key_generate_refuses_a_folder_another_user_owns_and_writes_nothing(tmp_path):
    """Issue 40, second hostile pass, finding 6: `--out` in a folder the real uid 65534 owns (they could swap
    team.pub once written) is refused in one line before any key is made; so is a folder inside it."""
    alice = tmp_path / "alice"
    alice.mkdir()
    os.chown(alice, fakes.NOBODY, fakes.NOBODY)
    for out, why in (
        (alice, "is owned by uid 65534"),
        (alice / "keys", f"is inside {alice}, which is"),
    ):
        made = apexkit("key", "generate", "--name", "team", "--out", str(out), cwd=tmp_path)
        assert made.returncode == 2, made.stderr
        (line,) = made.stderr.strip().splitlines()
        assert (
            line.startswith(f"error: the output directory {out} {why}") and "set --out to" in line
        )
    assert list(alice.iterdir()) == []


def test_a_key_file_another_user_owns_is_refused_without_a_chown_hint(tmp_path):
    """Finding 6's hint: a key another uid owns may have been swapped; never "own it yourself" (a chown of it)."""
    assert apexkit("key", "generate", "--name", "team", cwd=tmp_path).returncode == 0
    for name in ("team.pub", "team.key"):
        os.chown(tmp_path / name, fakes.NOBODY, fakes.NOBODY)
    with pytest.raises(ConfigError) as pub:
        signing.public_keys([str(tmp_path / "team.pub")])
    with pytest.raises(ConfigError) as key:
        signing.private_key(str(tmp_path / "team.key"), {})
    for err in (pub.value, key.value):
        assert "is owned by uid 65534, not by you" in err.cause and "own it yourself" not in str(
            err
        )
        assert (
            err.hint == "use a key file only you own; one another user owns may have been swapped"
        )


def test_a_private_key_at_0644_is_refused_on_load(tmp_path):
    assert apexkit("key", "generate", "--name", "team", cwd=tmp_path).returncode == 0
    os.chmod(tmp_path / "team.key", 0o644)
    code = (
        "import sys; from apexkit.exits import exit_code; from apexkit.index import signing; "
        "sys.exit(exit_code(lambda: signing.private_key('team.key', {})))"
    )
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    run = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert run.returncode == 2
    assert run.stderr.strip().splitlines() == [
        "error: private key 'team.key' is mode 0644: others can read or write it -- next: chmod 600 'team.key'"
    ]


def test_openssl_verifies_an_apexkit_envelope(tmp_path):
    assert apexkit("key", "generate", "--name", "team", cwd=tmp_path).returncode == 0
    key = signing.private_key(str(tmp_path / "team.key"), {})
    statement = signing.statement({"cache_key": "ab" * 32}, WHEEL, "cd" * 32, {"torch": "2.6.0"})
    envelope = json.loads(signing.envelope_line(signing.sign(statement, key)))
    assert envelope["payloadType"] == TYPE.decode()
    payload = base64.b64decode(envelope["payload"], validate=True)
    (sig,) = envelope["signatures"]
    (tmp_path / "pae.bin").write_bytes(pae_by_hand(payload))
    (tmp_path / "sig.bin").write_bytes(base64.b64decode(sig["sig"], validate=True))
    verify = [
        "pkeyutl",
        "-verify",
        "-pubin",
        "-inkey",
        "team.pub",
        "-rawin",
        "-in",
        "pae.bin",
        "-sigfile",
        "sig.bin",
    ]
    ok = openssl(*verify, cwd=tmp_path)
    assert ok.returncode == 0 and "Signature Verified Successfully" in ok.stdout, (
        ok.stdout + ok.stderr
    )
    assert json.loads(payload)["subject"] == [{"name": WHEEL, "digest": {"sha256": "cd" * 32}}]
    (tmp_path / "pae.bin").write_bytes(pae_by_hand(payload.replace(b"2.6.0", b"2.7.0")))
    bad = openssl(*verify, cwd=tmp_path)
    assert bad.returncode != 0 and "Signature Verification Failure" in bad.stdout + bad.stderr


def test_apexkit_verifies_an_envelope_signed_by_openssl(tmp_path):
    assert (
        openssl("genpkey", "-algorithm", "ed25519", "-out", "o.key", cwd=tmp_path).returncode == 0
    )
    assert openssl("pkey", "-in", "o.key", "-pubout", "-out", "o.pub", cwd=tmp_path).returncode == 0
    statement = {
        "_type": "https://in-toto.io/Statement/v1",
        "subject": [{"name": WHEEL, "digest": {"sha256": "cd" * 32}}],
        "predicateType": "https://slsa.dev/provenance/v1",
        "predicate": {"apexkit_target": {"cache_key": "ab" * 32}},
    }
    payload = json.dumps(
        statement, indent=1
    ).encode()  # any bytes: the signature is over them, not over a re-encoding
    (tmp_path / "pae.bin").write_bytes(pae_by_hand(payload))
    signed = openssl(
        "pkeyutl",
        "-sign",
        "-inkey",
        "o.key",
        "-rawin",
        "-in",
        "pae.bin",
        "-out",
        "sig.bin",
        cwd=tmp_path,
    )
    assert signed.returncode == 0, signed.stderr
    der = subprocess.run(["openssl", "pkey", "-pubin", "-in", "o.pub", "-outform", "DER"], cwd=tmp_path,
                         capture_output=True, check=True).stdout  # fmt: skip
    keyid = hashlib.sha256(der).hexdigest()
    sig = base64.b64encode((tmp_path / "sig.bin").read_bytes()).decode()
    line = json.dumps({"payloadType": TYPE.decode(), "payload": base64.b64encode(payload).decode(),
                       "signatures": [{"keyid": keyid, "sig": sig}]}).encode()  # fmt: skip
    got, by = signing.verify(line, signing.public_keys([str(tmp_path / "o.pub")]))
    assert (got, by) == (statement, keyid)
    assert signing.facts_mismatch(got, {"cache_key": "ab" * 32}) is None
    os.chmod(
        tmp_path / "o.key", 0o600
    )  # openssl's PKCS#8 key loads as a signing key, with the same key id
    assert signing.private_key(str(tmp_path / "o.key"), {}).keyid == keyid
