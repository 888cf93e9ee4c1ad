"""Issue 42 items 2 and 4 (the publish side): `apexkit publish --sign-key` for real, over a real fixture build and a
second build's dist, with keys made by `apexkit key generate`. Each published wheel gets <wheel>.intoto.jsonl, which
apexkit's verifier and OpenSSL (a second implementation, over the DSSE pre-authentication encoding built here from
the spec) accept with the .pub; its subject is the served file's sha256 and its signed facts are the manifest's.
A key others can read is refused before anything is written; `--resign` signs an index again (a rotation) from the
index alone."""

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
from conftest import ROOT, Runner, output

from apexkit.index import publish, signing

TYPE = b"application/vnd.in-toto+json"


def apexkit(*args: str, cwd: Path, **env: str) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if k != signing.PEM_ENV}
    environ["PYTHONPATH"] = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    return subprocess.run([sys.executable, "-m", "apexkit", *args], cwd=cwd, env={**environ, **env},
                          capture_output=True, text=True, timeout=600)  # fmt: skip


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def tree(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }


@pytest.fixture(scope="module")
def built(repos, shared_cache, tmp_path_factory):
    """(dist with a real fixture build and a hand-made second target, folder with team-a.key/.pub, team-b.*)."""
    tmp = tmp_path_factory.mktemp("signed-publish")
    runner = Runner(repos, shared_cache, tmp)
    proc = runner.nox("3.11", "--no-smoke-test")
    assert proc.returncode == 0, output(proc)[-3000:]
    fakes.publishable(runner.dist, torch="2.12.0")
    keys = tmp / "keys"
    for name in ("team-a", "team-b"):
        made = apexkit("key", "generate", "--name", name, "--out", str(keys), cwd=tmp)
        assert made.returncode == 0, output(made)
    return runner.dist, keys


def published(index: Path) -> list[dict]:
    return json.loads((index / "index.json").read_text())["files"]


def test_publish_signs_each_wheel_with_an_envelope_about_its_file_and_facts(built, tmp_path):
    dist, keys = built
    index = tmp_path / "index"
    proc = apexkit("publish", "--dist", str(dist), "--index", str(index), "--sign-key",
                   str(keys / "team-a.key"), cwd=tmp_path)  # fmt: skip
    assert proc.returncode == 0, output(proc)
    trusted = signing.public_keys([str(keys / "team-a.pub")])
    (keyid,) = trusted
    assert f"signing with key id {keyid}" in proc.stderr and "BEGIN" not in output(proc)
    folder = index / "simple" / "apex"
    files = published(index)
    assert len(files) == 2
    for f in files:
        wheel = folder / f["filename"]
        envelope = folder / (f["filename"] + signing.SUFFIX)
        assert oct(envelope.lstat().st_mode & 0o777) == "0o644"
        assert f["signature"] == {
            "filename": envelope.name,
            "sha256": sha(envelope),
            "keyid": keyid,
        }
        statement, signer = signing.verify(envelope.read_bytes(), trusted)
        assert signer == keyid
        assert statement["subject"] == [{"name": wheel.name, "digest": {"sha256": sha(wheel)}}]
        assert signing.subject_mismatch(statement, wheel) is None
        manifest = json.loads((folder / (f["filename"] + publish.MANIFEST_SUFFIX)).read_text())
        assert manifest["wheel"]["sha256"] == sha(wheel)
        facts = signing.signed_facts(statement)
        assert (
            signing.facts_mismatch(statement, publish.facts_of(manifest, wheel.name, wheel)) is None
        )
        assert facts["torch"] == manifest["target"]["torch"] and facts["arch"] == "x86_64"
        assert facts["python_tag"] == "cp311" and facts["cache_key"] == manifest.get("cache_key")
        floor = facts["platform_tag"].split("_")[1:3]  # manylinux_2_24_x86_64 -> 2.24
        assert facts["glibc"] == ".".join(floor)
    # the real build carries a cache key and a C++ ABI in its signed facts
    real = signing.signed_facts(
        signing.verify((folder / (files[1]["filename"] + signing.SUFFIX)).read_bytes(), trusted)[0]
    )
    assert publish.is_sha256(real["cache_key"]) and real["cxx11_abi"] in (0, 1)
    page = (index / "index.html").read_text()
    assert page.count(f'signed by <code class="signer" title="{keyid}">{keyid[:16]}</code>') == 2


def test_openssl_verifies_a_published_envelope(built, tmp_path):
    dist, keys = built
    index = tmp_path / "index"
    proc = apexkit("publish", "--dist", str(dist), "--index", str(index), "--sign-key",
                   str(keys / "team-a.key"), cwd=tmp_path)  # fmt: skip
    assert proc.returncode == 0, output(proc)
    f = published(index)[0]
    envelope = json.loads(
        (index / "simple" / "apex" / (f["filename"] + signing.SUFFIX)).read_bytes()
    )
    assert envelope["payloadType"] == TYPE.decode()
    payload = base64.b64decode(envelope["payload"], validate=True)
    (
        tmp_path / "pae.bin"
    ).write_bytes(  # DSSE protocol.md, by hand: "DSSEv1" SP LEN(type) SP type SP LEN SP body
        b" ".join([b"DSSEv1", str(len(TYPE)).encode(), TYPE, str(len(payload)).encode(), payload])
    )
    (tmp_path / "sig.bin").write_bytes(base64.b64decode(envelope["signatures"][0]["sig"]))
    ok = subprocess.run(
        ["openssl", "pkeyutl", "-verify", "-pubin", "-inkey", str(keys / "team-a.pub"), "-rawin",
         "-in", "pae.bin", "-sigfile", "sig.bin"],
        cwd=tmp_path, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    if "rawin" in ok.stderr and "unknown option" in ok.stderr.lower():
        pytest.skip("this OpenSSL has no pkeyutl -rawin (OpenSSL 3 has)")
    assert ok.returncode == 0 and "Signature Verified Successfully" in ok.stdout, (
        ok.stdout + ok.stderr
    )
    wheel = index / "simple" / "apex" / f["filename"]
    assert json.loads(payload)["subject"][0]["digest"]["sha256"] == sha(wheel)


def test_a_private_key_others_can_read_is_refused_and_nothing_is_written(built, tmp_path):
    dist, keys = built
    loose = tmp_path / "loose.key"
    loose.write_bytes((keys / "team-a.key").read_bytes())
    os.chmod(loose, 0o644)
    index = tmp_path / "index"
    proc = apexkit("publish", "--dist", str(dist), "--index", str(index), "--sign-key", str(loose),
                   cwd=tmp_path)  # fmt: skip
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"error: private key '{loose}' is mode 0644: others can read or write it -- next: chmod 600 '{loose}'"
    ]
    assert not index.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["loose.key"]


def test_resign_signs_every_wheel_again_with_the_new_key_from_the_index_alone(built, tmp_path):
    dist, keys = built
    index = tmp_path / "index"
    first = apexkit("publish", "--dist", str(dist), "--index", str(index), "--sign-key",
                    str(keys / "team-a.key"), cwd=tmp_path)  # fmt: skip
    assert first.returncode == 0, output(first)
    old, new = (signing.public_keys([str(keys / f"team-{n}.pub")]) for n in "ab")
    wheels = {f["filename"]: tree(index)[f"simple/apex/{f['filename']}"] for f in published(index)}

    rotated = apexkit("publish", "--index", str(index), "--sign-key", str(keys / "team-b.key"),
                      "--resign", "--dist", str(tmp_path / "no-dist"), cwd=tmp_path)  # fmt: skip
    assert rotated.returncode == 0, output(rotated)
    (new_id,) = new
    assert f"signing with key id {new_id}" in rotated.stderr
    folder = index / "simple" / "apex"
    for f in published(index):
        wheel = folder / f["filename"]
        assert wheel.read_bytes() == wheels[wheel.name]  # the wheels stay as they were
        data = (folder / (f["filename"] + signing.SUFFIX)).read_bytes()
        statement, signer = signing.verify(data, new)
        assert signer == new_id == f["signature"]["keyid"]
        assert signing.subject_mismatch(statement, wheel) is None
        with pytest.raises(signing.Unverified, match="none of them a trusted key"):
            signing.verify(data, old)
    assert f'title="{new_id}"' in (index / "index.html").read_text()


def test_resign_hashes_the_served_wheel_and_refuses_one_its_manifest_does_not_record(
    built, tmp_path
):
    dist, keys = built
    index = tmp_path / "index"
    unsigned = apexkit("publish", "--dist", str(dist), "--index", str(index), cwd=tmp_path)
    assert unsigned.returncode == 0, output(unsigned)
    assert [f["signature"] for f in published(index)] == [None, None]
    assert (index / "index.html").read_text().count('<span class="signer">unsigned</span>') == 2
    # someone replaces a served wheel and its index.json sha256 together (not its manifest): not signed
    data = json.loads((index / "index.json").read_text())
    wheel = index / "simple" / "apex" / data["files"][0]["filename"]
    wheel.write_bytes(wheel.read_bytes() + b"\0")
    data["files"][0]["sha256"] = sha(wheel)
    (index / "index.json").write_text(json.dumps(data))
    before = tree(index)
    proc = apexkit("publish", "--index", str(index), "--sign-key", str(keys / "team-a.key"),
                   "--resign", cwd=tmp_path)  # fmt: skip
    assert proc.returncode == 2
    (line,) = [x for x in proc.stderr.splitlines() if x.startswith("error:")]
    assert proc.stderr.strip().endswith(line)  # the plan's lines, then the one error
    assert line.startswith(
        f"error: cannot sign {wheel.name}: its sha256 {sha(wheel)[:12]} is not the one"
    )
    assert tree(index) == before  # nothing half-signed
