"""Issue 42, keys and the signing core (apexkit/index/signing.py): Ed25519 keys, DSSE envelopes over in-toto
statements, and every refusal of an envelope or a key file, each with its own one-line reason."""

from __future__ import annotations

import base64
import hashlib
import json
import os

import pytest
from fakes import NOBODY

from apexkit import config
from apexkit.errors import ConfigError
from apexkit.index import signing
from apexkit.index.signing import Unverified
from apexkit.wheel import sbom

WHEEL = "apex-0.1+ascend.torch2.6.0-cp311-cp311-manylinux_2_28_aarch64.whl"
FACTS = {"python_tag": "cp311", "arch": "aarch64", "platform_tag": "manylinux_2_28_aarch64", "torch": "2.6.0",
         "torch_npu": "2.6.0.post3", "cxx11_abi": 1, "cuda": None}  # fmt: skip
MANIFEST = {"cache_key": "ab" * 32, "target": {"python": "3.11", "arch": "aarch64"}}


@pytest.fixture
def keys(tmp_path):
    assert signing.generate("team", str(tmp_path / "keys")) == 0
    return tmp_path / "keys" / "team.key", tmp_path / "keys" / "team.pub"


def _signed(keys, sha="cd" * 32, facts=FACTS):
    key = signing.private_key(str(keys[0]), {})
    trusted = signing.public_keys([str(keys[1])])
    st = signing.statement(MANIFEST, WHEEL, sha, facts)
    return key, trusted, signing.envelope_line(signing.sign(st, key))


def test_a_signed_statement_verifies_and_says_which_key(keys):
    key, trusted, line = _signed(keys)
    statement, keyid = signing.verify(line, trusted)
    assert keyid == key.keyid == next(iter(trusted))
    assert (
        statement["_type"] == sbom.STATEMENT_TYPE
        and statement["predicateType"] == sbom.PREDICATE_TYPE
    )
    assert statement["subject"] == [{"name": WHEEL, "digest": {"sha256": "cd" * 32}}]
    target = signing.signed_facts(statement)
    assert (
        target["glibc"] == "2.28"
        and target["cache_key"] == "ab" * 32
        and target["torch_npu"] == "2.6.0.post3"
    )
    envelope = json.loads(line)
    assert envelope["payloadType"] == "application/vnd.in-toto+json" and line.count(b"\n") == 1
    assert json.loads(base64.b64decode(envelope["payload"])) == statement


def test_the_key_id_is_the_sha256_of_the_der_public_key(keys):
    from cryptography.hazmat.primitives import serialization

    public = serialization.load_pem_public_key(keys[1].read_bytes())
    der = public.public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    assert list(signing.public_keys([str(keys[1])])) == [hashlib.sha256(der).hexdigest()]


def test_pae_is_the_dsse_spec_example():
    # the DSSE protocol's own example (secure-systems-lab/dsse protocol.md)
    assert signing.pae("http://example.com/HelloWorld", b"hello world") == (
        b"DSSEv1 29 http://example.com/HelloWorld 11 hello world"
    )


def _envelope(line: bytes, **change) -> bytes:
    env = json.loads(line)
    env.update(change)
    return json.dumps(env).encode()


def _resigned(key, payload: bytes, kind: str = signing.PAYLOAD_TYPE) -> bytes:
    sig = key.private.sign(signing.pae(kind, payload))
    return json.dumps({"payloadType": kind, "payload": base64.b64encode(payload).decode(),
                       "signatures": [{"keyid": key.keyid, "sig": base64.b64encode(sig).decode()}]}).encode()  # fmt: skip


@pytest.mark.parametrize(
    ("case", "reason"),
    [
        ("oversized", "larger than 8 MiB"),
        ("empty", "the envelope file is empty"),
        ("many lines", "more than 16 lines"),
        ("truncated", "the envelope is not JSON"),
        ("not an object", "not a JSON object"),
        ("payload type", "payloadType is 'text/plain', not application/vnd.in-toto+json"),
        ("payload not base64", "payload is not strict base64"),
        ("payload with newline", "payload is not strict base64"),
        ("payload a number", "payload is a int, not a base64 string"),
        ("no signatures", "signatures is not a list of 1 to 16 signatures"),
        ("keyid not hex", "signature 1 is not {keyid: <sha256 hex>, sig: <base64>}"),
        ("sig not base64", "signature 1 is not strict base64"),
        ("untrusted key", "none of them a trusted key"),
        ("bad signature", "bad signature by trusted key"),
        ("payload not json", "the signed payload is not JSON"),
        ("not a statement", "is not an in-toto Statement v1"),
        ("no subject", "the signed statement has no subject"),
    ],
)
def test_each_bad_envelope_is_refused_with_its_own_reason(keys, tmp_path, case, reason):
    key, trusted, line = _signed(keys)
    env = json.loads(line)
    payload = base64.b64decode(env["payload"])
    other = signing.generate("other", str(tmp_path / "o")) == 0 and signing.private_key(
        str(tmp_path / "o" / "other.key"), {}
    )
    bad = {
        "oversized": lambda: line + b" " * signing.ENVELOPE_MAX,
        "empty": lambda: b"\n \n",
        "many lines": lambda: line * 17,
        "truncated": lambda: line[: len(line) // 2],
        "not an object": lambda: b"[1, 2]",
        "payload type": lambda: _envelope(line, payloadType="text/plain"),
        "payload not base64": lambda: _envelope(line, payload=env["payload"][:-2] + "*="),
        "payload with newline": lambda: _envelope(
            line, payload=env["payload"][:8] + "\n" + env["payload"][8:]
        ),
        "payload a number": lambda: _envelope(line, payload=5),
        "no signatures": lambda: _envelope(line, signatures=[]),
        "keyid not hex": lambda: _envelope(
            line, signatures=[{"keyid": "team", "sig": env["signatures"][0]["sig"]}]
        ),
        "sig not base64": lambda: _envelope(line, signatures=[{"keyid": key.keyid, "sig": "!!"}]),
        "untrusted key": lambda: _resigned(other, payload),
        "bad signature": lambda: _envelope(line, payload=base64.b64encode(payload + b" ").decode()),
        "payload not json": lambda: _resigned(key, b"\x00\xff not json"),
        "not a statement": lambda: _resigned(key, b'{"_type": "https://example.com/other"}'),
        "no subject": lambda: _resigned(
            key, json.dumps({"_type": sbom.STATEMENT_TYPE, "subject": []}).encode()
        ),
    }[case]()
    with pytest.raises(Unverified) as err:
        signing.verify(bad, trusted)
    assert reason in str(err.value)
    assert "\n" not in str(err.value) and len(str(err.value)) < 300
    if case == "untrusted key":
        assert err.value.keyids == (other.keyid,) and other.keyid in str(err.value)


def test_no_trusted_key_verifies_nothing(keys):
    _key, _trusted, line = _signed(keys)
    with pytest.raises(Unverified, match="no trusted key is configured"):
        signing.verify(line, {})


def test_a_rotated_key_verifies_and_a_removed_one_is_revoked(keys, tmp_path):
    signing.generate("new", str(tmp_path / "n"))
    new_pub = str(tmp_path / "n" / "new.pub")
    _key, _trusted, line = _signed(keys)
    both = signing.public_keys([new_pub, str(keys[1])])
    assert signing.verify(line, both)[1] in both
    with pytest.raises(Unverified, match="none of them a trusted key"):
        signing.verify(line, signing.public_keys([new_pub]))


def test_a_second_line_may_carry_the_new_signature(keys, tmp_path):
    signing.generate("new", str(tmp_path / "n"))
    new = signing.private_key(str(tmp_path / "n" / "new.key"), {})
    _key, _trusted, line = _signed(keys)
    statement = json.loads(base64.b64decode(json.loads(line)["payload"]))
    two = line + signing.envelope_line(signing.sign(statement, new))
    assert (
        signing.verify(two, signing.public_keys([str(tmp_path / "n" / "new.pub")]))[1] == new.keyid
    )


def test_the_subject_must_be_this_wheel_file(keys, tmp_path):
    wheel = tmp_path / WHEEL
    wheel.write_bytes(b"the wheel")
    sha = hashlib.sha256(b"the wheel").hexdigest()
    _key, trusted, line = _signed(keys, sha)
    statement, _ = signing.verify(line, trusted)
    assert signing.subject_mismatch(statement, wheel) is None
    assert signing.subject_mismatch(statement, wheel, sha) is None
    wheel.write_bytes(b"another wheel")
    assert "is not the file that was signed" in signing.subject_mismatch(statement, wheel)
    other = tmp_path / WHEEL.replace("cp311-cp311", "cp310-cp310")
    other.write_bytes(b"the wheel")
    assert signing.subject_mismatch(statement, other) == (
        f"the signature is for '{WHEEL}', not '{other.name}'"
    )


def test_the_signed_facts_must_be_the_wanted_ones(keys):
    _key, trusted, line = _signed(keys)
    statement, _ = signing.verify(line, trusted)
    assert signing.facts_mismatch(statement, {"cache_key": "ab" * 32, "torch": "2.6.0"}) is None
    why = signing.facts_mismatch(statement, {"python_tag": "cp310", "cache_key": "ab" * 32})
    assert why == "the signed target facts differ (python_tag: signed 'cp311', wanted 'cp310')"
    assert "cache_key" in signing.facts_mismatch(statement, {"cache_key": "ef" * 32})


# --- keys ---------------------------------------------------------------------------------------------------------


def test_generate_writes_a_private_key_0600_and_a_public_key_0644(tmp_path):
    os.umask(0o077)
    try:
        signing.generate("team", str(tmp_path))
    finally:
        os.umask(0o022)
    assert oct((tmp_path / "team.key").stat().st_mode & 0o777) == "0o600"
    assert oct((tmp_path / "team.pub").stat().st_mode & 0o777) == "0o644"
    assert (tmp_path / "team.key").read_bytes().startswith(b"-----BEGIN PRIVATE KEY-----")
    assert (tmp_path / "team.pub").read_bytes().startswith(b"-----BEGIN PUBLIC KEY-----")


@pytest.mark.parametrize("existing", ["team.key", "team.pub"])
def test_generate_never_writes_over_a_key(tmp_path, existing):
    (tmp_path / existing).write_bytes(b"old")
    with pytest.raises(ConfigError, match="already exists; no key written"):
        signing.generate("team", str(tmp_path))
    assert sorted(p.name for p in tmp_path.iterdir()) == [existing]
    assert (tmp_path / existing).read_bytes() == b"old"


def test_generate_dry_run_and_bad_names_write_nothing(tmp_path):
    assert signing.generate("team", str(tmp_path / "k"), dry_run=True) == 0
    assert not (tmp_path / "k").exists()
    for name in ("../team", "", "-x", "a/b"):
        with pytest.raises(ConfigError, match="is not a plain name"):
            signing.generate(name, str(tmp_path))
    assert list(tmp_path.iterdir()) == []


def test_a_private_key_others_can_read_is_refused(keys):
    os.chmod(keys[0], 0o644)
    with pytest.raises(ConfigError) as err:
        signing.private_key(str(keys[0]), {})
    assert "is mode 0644: others can read or write it -- next: chmod 600" in str(err.value)
    os.chmod(keys[0], 0o620)
    with pytest.raises(ConfigError, match="mode 0620"):
        signing.private_key(str(keys[0]), {})


def test_a_private_key_that_is_a_link_or_not_ours_is_refused(keys, tmp_path):
    link = tmp_path / "link.key"
    link.symlink_to(keys[0])
    with pytest.raises(ConfigError, match="is a symbolic link"):
        signing.private_key(str(link), {})
    os.chown(keys[0], NOBODY, NOBODY)
    with pytest.raises(ConfigError, match="is owned by uid 65534, not by you"):
        signing.private_key(str(keys[0]), {})


def test_a_key_from_the_environment_is_never_shown(keys):
    pem = keys[0].read_text()
    from_env = signing.private_key(None, {signing.PEM_ENV: pem})
    assert from_env.keyid == signing.private_key(str(keys[0]), {}).keyid
    assert from_env.origin == "$APEXKIT_SIGNING_KEY_PEM" and pem not in repr(from_env)
    broken = pem.replace("MC4CAQAw", "MC4CAQBB")
    with pytest.raises(ConfigError) as err:
        signing.private_key(None, {signing.PEM_ENV: broken})
    assert "$APEXKIT_SIGNING_KEY_PEM is not a PEM private key" in str(err.value)
    assert "MC4C" not in str(err.value) and "BEGIN" not in str(err.value)
    with pytest.raises(ConfigError, match="both a signing key file and"):
        signing.private_key(str(keys[0]), {signing.PEM_ENV: pem})
    with pytest.raises(ConfigError, match="no signing key given"):
        signing.private_key(None, {})


def test_only_ed25519_keys_are_taken(tmp_path, keys):
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    ecdsa = ec.generate_private_key(ec.SECP256R1())
    path = tmp_path / "ec.pub"
    path.write_bytes(ecdsa.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))  # fmt: skip
    with pytest.raises(ConfigError, match="is not an Ed25519 key"):
        signing.public_keys([str(path)])
    path.write_bytes(b"-----BEGIN PUBLIC KEY-----\nnot a key\n-----END PUBLIC KEY-----\n")
    with pytest.raises(ConfigError, match="is not a PEM public key"):
        signing.public_keys([str(path)])
    with pytest.raises(ConfigError, match="is not a PEM public key"):
        signing.public_keys([str(keys[0])])  # the private key given as a trusted one


def test_trusted_key_files_are_read_as_untrusted(keys, tmp_path):
    os.chmod(keys[1], 0o666)
    with pytest.raises(ConfigError, match="is mode 0666: others can replace it"):
        signing.public_keys([str(keys[1])])
    os.chmod(keys[1], 0o644)
    big = tmp_path / "big.pub"
    big.write_bytes(b"x" * (signing.KEY_MAX + 1))
    with pytest.raises(ConfigError, match="is larger than 16384 bytes"):
        signing.public_keys([str(big)])
    fifo = tmp_path / "fifo.pub"
    os.mkfifo(fifo)
    with pytest.raises(ConfigError, match="is not a regular file"):
        signing.public_keys([str(fifo)])


def test_trusted_keys_come_from_flags_environment_or_config(keys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    env = {"XDG_CONFIG_HOME": str(tmp_path / "xdg")}
    assert signing.trusted_keys((), env) == {}
    (tmp_path / "xdg" / "apexkit").mkdir(parents=True)
    (tmp_path / "xdg" / "apexkit" / "config.toml").write_text(f'trusted_keys = ["{keys[1]}"]\n')
    (keyid,) = signing.trusted_keys((), env)
    assert config.load(env).get("trusted_keys", env).layer == config.USER
    assert list(signing.trusted_keys((), {**env, "APEXKIT_TRUSTED_KEYS": str(keys[1])})) == [keyid]
    with pytest.raises(ConfigError, match="nothing.pub"):
        signing.trusted_keys([str(tmp_path / "nothing.pub")], env)


def test_a_project_file_cannot_choose_the_trusted_keys(keys, tmp_path, monkeypatch, capsys):
    """A cloned repository's ./apexkit.toml must not swap the team key: its trusted_keys is ignored, loudly."""
    monkeypatch.chdir(tmp_path)
    env = {"XDG_CONFIG_HOME": str(tmp_path / "xdg")}
    (tmp_path / "apexkit.toml").write_text(f'trusted_keys = ["{keys[1]}"]\n')
    assert signing.trusted_keys((), env) == {}
    err = capsys.readouterr().err
    assert "apexkit.toml is ignored: a project file cannot choose the keys" in err
    assert len(err.strip().splitlines()) == 1


def test_the_statement_is_apexkits_provenance_with_the_target_facts():
    st = signing.statement(MANIFEST, WHEEL, "cd" * 32, FACTS)
    assert {k: v for k, v in st.items() if k != "predicate"} == {
        k: v for k, v in sbom.provenance(MANIFEST, WHEEL, "cd" * 32).items() if k != "predicate"
    }
    assert set(st["predicate"]) == {"buildDefinition", "runDetails", "apexkit_target"}
    assert st["predicate"]["apexkit_target"] == {**FACTS, "glibc": "2.28", "cache_key": "ab" * 32}
    legacy = signing.statement({}, WHEEL, "cd" * 32, {"platform_tag": "manylinux2014_x86_64"})
    assert signing.signed_facts(legacy) == {
        "platform_tag": "manylinux2014_x86_64",
        "glibc": "2.17",
        "cache_key": None,
    }


def test_the_sources_probe_checks_a_key_file_is_a_file(keys):
    from apexkit import checks
    from apexkit.proxy import sources

    row = sources.probe(config.Value("trusted_keys", (str(keys[1]),), "env"), None, "", None)
    assert row.status == checks.OK and row.detail.startswith(f"{keys[1]}: a file")
    row = sources.probe(
        config.Value("trusted_keys", (str(keys[1]) + ".gone",), "env"), None, "", None
    )
    assert "not a file" in row.detail
