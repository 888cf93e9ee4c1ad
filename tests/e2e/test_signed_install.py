"""Issue 42 item 3: verification before anything is written. A team index published signed (`apexkit publish
--sign-key`, fixture wheels from tests/fakes.py) is served over real HTTP on 127.0.0.1 and attacked; `apexkit install
--trusted-key` into a real venv (real pip) refuses each attack in one line naming the wheel, the reason and the key
ids, the venv unchanged; the build's team-index lookup refuses the same way (nothing kept: the build compiles); the
fleet node script (bench/fleet_node.py, no apexkit) verifies the envelope itself."""

from __future__ import annotations

import functools
import hashlib
import http.server
import json
import os
import shutil
import subprocess
import sys
import threading
import urllib.parse
from pathlib import Path

import fakes
import pytest
from conftest import ROOT, output

from apexkit.index import remote, signing

from .test_apexkit_install import make_venv, stub_wheel, tree

NO_PROXY = {k: "" for k in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY")}


class Served:
    """A directory served over HTTP on 127.0.0.1."""

    def __init__(self, root: Path) -> None:
        handler = functools.partial(_Quiet, directory=str(root))
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/"

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass


def apexkit(*args: str, cwd: Path, **env: str) -> subprocess.CompletedProcess:
    drop = ("VIRTUAL_ENV", "APEXKIT_INDEX", "APEXKIT_TRUSTED_KEYS", signing.PEM_ENV)
    environ = {k: v for k, v in os.environ.items() if k not in drop}
    environ.update(NO_PROXY, COLUMNS="300", XDG_CONFIG_HOME=str(cwd / "xdg"), **env)
    environ["PYTHONPATH"] = str(ROOT)
    return subprocess.run([sys.executable, "-m", "apexkit", *args], cwd=cwd, env=environ,
                          capture_output=True, text=True, timeout=600)  # fmt: skip


@pytest.fixture(scope="module")
def team(tmp_path_factory):
    """(folder, keys folder): dist/ with a torch 2.13.0 and a torch 2.12.0 wheel (Python 3.11), an index of both
    signed by team-a (`signed`), the same unsigned (`unsigned`), and one signed by team-b (`other`)."""
    tmp = tmp_path_factory.mktemp("signed-install")
    for name in ("team-a", "team-b"):
        made = apexkit("key", "generate", "--name", name, "--out", str(tmp / "keys"), cwd=tmp)
        assert made.returncode == 0, output(made)
    for torch in ("2.13.0", "2.12.0"):  # each with a build cache key (the team-index hit's lookup)
        manifest = fakes.publishable(tmp / "dist", torch=torch).parent / "manifest.json"
        data = json.loads(manifest.read_text())
        manifest.write_text(
            json.dumps({**data, "cache_key": hashlib.sha256(torch.encode()).hexdigest()})
        )
    for index, key in (("signed", "team-a"), ("unsigned", None), ("other", "team-b")):
        sign = ["--sign-key", str(tmp / "keys" / f"{key}.key")] if key else []
        proc = apexkit(
            "publish", "--dist", str(tmp / "dist"), "--index", str(tmp / index), *sign, cwd=tmp
        )
        assert proc.returncode == 0, output(proc)
    return tmp, tmp / "keys"


@pytest.fixture(scope="module")
def venv(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("venv")
    return make_venv(tmp / "venv", "3.11", str(stub_wheel(tmp, "torch", "2.13.0")))


def wheels(index: Path) -> dict[str, Path]:
    """torch release -> its wheel in the index."""
    return {
        p.name.split("torch")[1].split("-")[0]: p for p in (index / "simple" / "apex").glob("*.whl")
    }


def serve_copy(team, tmp_path: Path, name: str = "signed") -> tuple[Path, Served]:
    root = tmp_path / "served"
    shutil.copytree(team[0] / name, root)
    served = Served(root)
    return root, served


def install(
    venv: Path, url: str, keys: Path, *trusted: str, cwd: Path
) -> subprocess.CompletedProcess:
    flags = [a for k in trusted for a in ("--trusted-key", str(keys / f"{k}.pub"))]
    return apexkit("install", "--venv", str(venv), "--index", url, "--no-build", *flags, cwd=cwd)


def refused(proc: subprocess.CompletedProcess, wheel: str, *why: str) -> str:
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert proc.returncode != 0 and len(errors) == 1, output(proc)
    line = errors[0]
    assert f"refused {wheel} from" in line and "nothing installed" in line, line
    assert all(w in line for w in why), line
    assert "Traceback" not in output(proc)
    return line


def keyid(keys: Path, name: str) -> str:
    (kid,) = signing.public_keys([str(keys / f"{name}.pub")])
    return kid


def test_a_wheel_replaced_with_its_entry_manifest_and_provenance_is_refused(team, venv, tmp_path):
    """(1) Whoever can write the index republishes another wheel under the same name, index.json, manifest and
    provenance all consistent, and keeps the team's envelope beside it: its sha256 is not the signed one."""
    tmp, keys = team
    evil = tmp_path / "evil-dist"
    fakes.publishable(evil, torch="2.13.0", requires_python=">=3.9")  # same name, other bytes
    root = tmp_path / "served"
    proc = apexkit("publish", "--dist", str(evil), "--index", str(root), cwd=tmp_path)
    assert proc.returncode == 0, output(proc)
    good = wheels(tmp / "signed")["2.13.0"]
    assert good.read_bytes() != wheels(root)["2.13.0"].read_bytes()
    envelope = good.name + signing.SUFFIX
    shutil.copy(good.parent / envelope, root / "simple" / "apex" / envelope)
    served = Served(root)
    before = tree(venv)
    try:
        proc = install(venv, served.url, keys, "team-a", cwd=tmp_path)
    finally:
        served.stop()
    refused(proc, good.name, "is not the file that was signed", keyid(keys, "team-a"))
    assert tree(venv) == before
    # without the envelope: unsigned, refused as well
    (root / "simple" / "apex" / envelope).unlink()
    served = Served(root)
    try:
        proc = install(venv, served.url, keys, "team-a", cwd=tmp_path)
    finally:
        served.stop()
    refused(proc, good.name, f"it has no signature {signing.SUFFIX}", "HTTP 404")
    assert tree(venv) == before


def test_a_valid_envelope_by_an_untrusted_key_is_refused(team, venv, tmp_path):
    """(2) Signed by team-b, only team-a trusted: refused naming both key ids. Trusting both (a rotation) takes it."""
    _tmp, keys = team
    root, served = serve_copy(team, tmp_path, "other")
    before = tree(venv)
    try:
        proc = install(venv, served.url, keys, "team-a", cwd=tmp_path)
    finally:
        served.stop()
    line = refused(proc, wheels(root)["2.13.0"].name, "none of them a trusted key")
    assert keyid(keys, "team-b") in line and keyid(keys, "team-a") in line
    assert tree(venv) == before


def test_the_envelope_of_another_wheel_is_refused(team, venv, tmp_path):
    """(3) The torch 2.12.0 wheel's (valid, trusted) envelope placed beside the torch 2.13.0 wheel."""
    root, served = serve_copy(team, tmp_path)
    found = wheels(root)
    other = found["2.12.0"].parent / (found["2.12.0"].name + signing.SUFFIX)
    shutil.copy(other, found["2.13.0"].parent / (found["2.13.0"].name + signing.SUFFIX))
    before = tree(venv)
    try:
        proc = install(venv, served.url, team[1], "team-a", cwd=tmp_path)
    finally:
        served.stop()
    refused(proc, found["2.13.0"].name, f"the signature is for '{found['2.12.0'].name}'")
    assert tree(venv) == before


def test_a_signed_wheel_for_another_tuple_listed_as_this_one_is_refused_by_its_signed_facts(
    team, venv, tmp_path
):
    """(4) index.json lists the (validly signed) torch 2.12.0 wheel under torch 2.13.0's facts."""
    root, served = serve_copy(team, tmp_path)
    data = json.loads((root / "index.json").read_text())
    (entry,) = [f for f in data["files"] if f["facts"]["torch"] == "2.12.0"]
    entry["facts"]["torch"] = "2.13.0"
    entry["facts"]["requires_dist"] = ["torch==2.13.0"]
    data["files"] = [entry]
    (root / "index.json").write_text(json.dumps(data))
    before = tree(venv)
    try:
        proc = install(venv, served.url, team[1], "team-a", cwd=tmp_path)
    finally:
        served.stop()
    refused(proc, entry["filename"], "the signed target facts do not fit", "torch 2.12.0")
    assert tree(venv) == before


@pytest.mark.parametrize("damage", ["truncated", "oversized", "malformed"])
def test_a_damaged_envelope_is_one_line(team, venv, tmp_path, damage):
    """(5) Half an envelope, one over 8 MiB, and one that is not a DSSE envelope."""
    root, served = serve_copy(team, tmp_path)
    wheel = wheels(root)["2.13.0"]
    envelope = wheel.parent / (wheel.name + signing.SUFFIX)
    data = envelope.read_bytes()
    envelope.write_bytes(
        {"truncated": data[: len(data) // 2], "oversized": b" " * (signing.ENVELOPE_MAX + 1),
         "malformed": b'{"payloadType": "text/plain", "payload": "", "signatures": []}\n'}[damage]
    )  # fmt: skip
    before = tree(venv)
    try:
        proc = install(venv, served.url, team[1], "team-a", cwd=tmp_path)
    finally:
        served.stop()
    why = {"truncated": "not JSON", "oversized": "is larger than", "malformed": "payloadType"}[
        damage
    ]
    refused(proc, wheel.name, why)
    assert tree(venv) == before


def test_a_signed_wheel_and_its_trusted_key_install(team, tmp_path):
    """(6) The happy path: verified, installed; trusting two keys (a rotation) works too; with no key trusted an
    unsigned wheel installs with one warning line saying how to turn verification on."""
    _tmp, keys = team
    train = make_venv(tmp_path / "venv", "3.11", str(stub_wheel(tmp_path, "torch", "2.13.0")))
    _root, served = serve_copy(team, tmp_path)
    try:
        proc = install(train, served.url, keys, "team-b", "team-a", cwd=tmp_path)
    finally:
        served.stop()
    assert proc.returncode == 0, output(proc)
    assert f"signature verified (key {keyid(keys, 'team-a')})" in proc.stderr
    assert "installed apex-" in proc.stdout
    assert list((train / "lib").glob("python3*/site-packages/apex/__init__.py"))

    plain = make_venv(tmp_path / "plain", "3.11", str(stub_wheel(tmp_path, "torch", "2.13.0")))
    _root, served = serve_copy(team, tmp_path / "u", "unsigned")
    try:
        proc = install(plain, served.url, keys, cwd=tmp_path)
    finally:
        served.stop()
    assert proc.returncode == 0, output(proc)
    warned = [line for line in proc.stderr.splitlines() if "no trusted key is configured" in line]
    assert len(warned) == 1 and "--trusted-key FILE" in warned[0], output(proc)


def test_a_project_file_cannot_trust_a_key(team, venv, tmp_path):
    """A cloned repository's ./apexkit.toml naming team-b's key: ignored (one line says so), the user's key holds."""
    _tmp, keys = team
    (tmp_path / "xdg" / "apexkit").mkdir(parents=True)
    (tmp_path / "xdg" / "apexkit" / "config.toml").write_text(
        f'trusted_keys = ["{keys / "team-a.pub"}"]\n'
    )
    (tmp_path / "apexkit.toml").write_text(f'trusted_keys = ["{keys / "team-b.pub"}"]\n')
    root, served = serve_copy(team, tmp_path, "other")
    before = tree(venv)
    try:
        proc = install(venv, served.url, keys, cwd=tmp_path)
    finally:
        served.stop()
    assert "a project file cannot choose the keys" in proc.stderr
    refused(proc, wheels(root)["2.13.0"].name, "none of them a trusted key")
    assert tree(venv) == before


# --- the same through tinyproxy ------------------------------------------------------------------------------------


def hostile(team, tmp_path: Path, case: str) -> tuple[Path, str]:
    """(the served index's folder, the wheel it offers for torch 2.13.0) of one attack on a copy of the signed index:
    `tampered` (another wheel under the same name, its entry, manifest and provenance consistent, the team's envelope
    kept), `stripped` (the envelope deleted), `unknown-key` (the index signed by team-b), `intact` (none)."""
    tmp, _keys = team
    root = tmp_path / "served"
    if case == "tampered":  # whoever can write the index publishes their own wheel there
        fakes.publishable(tmp_path / "evil-dist", torch="2.13.0", requires_python=">=3.9")
        proc = apexkit(
            "publish", "--dist", str(tmp_path / "evil-dist"), "--index", str(root), cwd=tmp_path
        )
        assert proc.returncode == 0, output(proc)
    else:
        shutil.copytree(tmp / ("other" if case == "unknown-key" else "signed"), root)
    good = wheels(root)["2.13.0"]
    envelope = good.parent / (good.name + signing.SUFFIX)
    if case == "stripped":
        envelope.unlink()
    if case == "tampered":  # ... and keeps the team's envelope of the genuine wheel beside it
        genuine = wheels(tmp / "signed")["2.13.0"]
        assert genuine.name == good.name and genuine.read_bytes() != good.read_bytes()
        shutil.copy(genuine.parent / envelope.name, envelope)
    return root, good.name


@pytest.mark.parametrize("case", ["tampered", "stripped", "unknown-key", "intact"])
def test_through_tinyproxy_each_attack_is_refused_as_it_is_directly(
    team, venv, tinyproxy, tmp_path, case
):
    """Issue 42's proxy case: install reaches the index through the real tinyproxy (Basic auth), whose log shows the
    envelope's and the wheel's requests; each attack is refused with the very line a direct install gives, the venv
    unchanged; the intact index installs through the proxy, verified."""
    _tmp, keys = team
    root, name = hostile(team, tmp_path, case)
    served = Served(root)
    via = {k: tinyproxy.url for k in ("http_proxy", "HTTP_PROXY")}
    before = tree(venv) if case != "intact" else {}
    fresh = tmp_path / "train"
    target = (
        make_venv(fresh, "3.11", str(stub_wheel(tmp_path, "torch", "2.13.0")))
        if case == "intact"
        else venv
    )
    try:
        mark = tinyproxy.log_size()
        flags = ("--trusted-key", str(keys / "team-a.pub"), "--no-build")
        argv = ("install", "--venv", str(target), "--index", served.url, *flags)
        proxied = apexkit(*argv, cwd=tmp_path, no_proxy="", NO_PROXY="", **via)
        seen = tinyproxy.log_since(mark)
        direct = apexkit(*argv, cwd=tmp_path) if case != "intact" else proxied
    finally:
        served.stop()
    assert tinyproxy.PASSWORD not in output(proxied)
    quoted = urllib.parse.quote(name + signing.SUFFIX)
    assert f"GET {served.url}simple/apex/{quoted} " in seen, seen  # the envelope came through it
    if case == "intact":
        assert proxied.returncode == 0, output(proxied)
        assert f"signature verified (key {keyid(keys, 'team-a')})" in proxied.stderr
        assert f"GET {served.url}simple/apex/{urllib.parse.quote(name)} " in seen, seen
        assert list((target / "lib").glob("python3*/site-packages/apex/__init__.py"))
        return
    why = {
        "tampered": "is not the file that was signed",
        "stripped": f"it has no signature {signing.SUFFIX}",
        "unknown-key": "none of them a trusted key",
    }[case]
    line = refused(proxied, name, why)
    assert refused(direct, name, why) == line
    assert tree(venv) == before


# --- the build's team-index cache hit --------------------------------------------------------------------------------


def test_a_team_index_hit_is_taken_only_when_signed_for_its_cache_key(team, tmp_path, capsys):
    """remote.build_lookup as the builder calls it (after a local miss): a hit signed by a trusted key for this
    cache key is taken; by an untrusted key, or a signed wheel listed under another cache key, is refused with one
    warning line and nothing kept in the landing folder (the builder then compiles: its rule for a refused hit)."""
    _tmp, keys = team
    root, served = serve_copy(team, tmp_path)
    data = json.loads((root / "index.json").read_text())
    entry = next(f for f in data["files"] if f["facts"]["torch"] == "2.13.0")
    key = entry["cache_key"]
    trusted = signing.public_keys([str(keys / "team-a.pub")])
    untrusted_only = signing.public_keys([str(keys / "team-b.pub")])
    env = {**{k: v for k, v in os.environ.items() if k not in NO_PROXY}, **NO_PROXY}
    try:
        work = tmp_path / "landing"
        hit = remote.build_lookup([served.url], env, trusted)(key, work)
        assert hit is not None and hit.wheel.name == entry["filename"]
        assert "no trusted key" not in capsys.readouterr().err
        shutil.rmtree(work)
        assert remote.build_lookup([served.url], env, untrusted_only)(key, work) is None
        err = capsys.readouterr().err.strip().splitlines()
        assert (
            len(err) == 1 and "wheel refused" in err[0] and "none of them a trusted key" in err[0]
        )
        assert "nothing of it kept: compiling" in err[0] and not list(work.iterdir())
        # the 2.12.0 wheel (validly signed) listed under the 2.13.0 wheel's cache key
        other = next(f for f in data["files"] if f["facts"]["torch"] == "2.12.0")
        other["cache_key"] = key
        data["files"] = [other]
        (root / "index.json").write_text(json.dumps(data))
        assert remote.build_lookup([served.url], env, trusted)(key, work) is None
        err = capsys.readouterr().err
        assert "the signed target facts differ (cache_key: signed" in err and not list(
            work.iterdir()
        )
    finally:
        served.stop()


def test_a_team_index_hit_through_tinyproxy_is_verified_as_directly(
    team, tinyproxy, tmp_path, capsys
):
    """remote.build_lookup with the proxy in its environment: the hit signed by the trusted key is taken, the same
    index signed by an untrusted key refused in one warning line, nothing kept; both came through tinyproxy."""
    _tmp, keys = team
    env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
    env.update(http_proxy=tinyproxy.url, HTTP_PROXY=tinyproxy.url)
    for index, key, taken in (("signed", "team-a", True), ("other", "team-a", False)):
        root, served = serve_copy(team, tmp_path / index, index)
        entry = next(
            f for f in json.loads((root / "index.json").read_text())["files"]
            if f["facts"]["torch"] == "2.13.0"
        )  # fmt: skip
        work, mark = tmp_path / index / "landing", tinyproxy.log_size()
        try:
            trusted = signing.public_keys([str(keys / f"{key}.pub")])
            hit = remote.build_lookup([served.url], env, trusted)(entry["cache_key"], work)
        finally:
            served.stop()
        quoted = urllib.parse.quote(entry["filename"] + signing.SUFFIX)
        assert f"GET {served.url}simple/apex/{quoted} " in tinyproxy.log_since(mark)
        err = capsys.readouterr().err.strip().splitlines()
        if taken:
            assert hit is not None and hit.wheel.name == entry["filename"] and not err, err
        else:
            assert hit is None and not list(work.iterdir())
            assert (
                len(err) == 1
                and "wheel refused" in err[0]
                and "none of them a trusted key" in err[0]
            )


# --- the fleet node ---------------------------------------------------------------------------------------------------

NODE_VERIFY = """
import json, sys
from pathlib import Path
sys.path.insert(0, sys.argv[1])
if sys.argv[5] == "openssl":
    sys.modules["cryptography"] = None  # as on a node whose python3 lacks it
import fleet_node
plan = json.loads(sys.argv[3])
node = fleet_node.Node({"results": sys.argv[2], "target": "t", "index": "i", "device": "cpu", **plan})
wheel = Path(sys.argv[4])
import hashlib
ok = node.signature(wheel, hashlib.sha256(wheel.read_bytes()).hexdigest())
print(json.dumps({"ok": ok, "stage": node.result["stages"][0]}))
"""


@pytest.mark.parametrize("verifier", ["cryptography", "openssl"])
def test_the_fleet_node_verifies_the_wheel_without_apexkit(team, tmp_path, verifier):
    tmp, keys = team
    from apexkit.fleet import validate

    pems = validate._trusted_pems([str(keys / "team-a.pub")])
    root = tmp_path / "index"
    shutil.copytree(tmp / "signed", root)
    wheel = wheels(root)["2.13.0"]

    def node(plan: dict) -> dict:
        plan = {"simple_url": root.as_uri() + "/simple/", "python": "3.11", "torch": "2.13.0+cpu",
                "trusted_keys": [{"keyid": k, "pem": p} for k, p in pems], **plan}  # fmt: skip
        argv = [sys.executable, "-c", NODE_VERIFY, str(ROOT / "bench"), str(tmp_path / "results")]
        proc = subprocess.run([*argv, json.dumps(plan), str(wheel), verifier], capture_output=True,
                              text=True, timeout=120, env={**os.environ, "PYTHONPATH": ""})  # fmt: skip
        assert proc.returncode == 0, output(proc)
        return json.loads(proc.stdout.splitlines()[-1])

    good = node({})
    assert good["ok"] and good["stage"]["stage"] == "wheel signature", good
    wrong = node({"torch": "2.12.0"})["stage"]
    assert (
        not wrong["ok"]
        and "the signed target facts differ (torch: signed 2.13.0" in wrong["detail"]
    )
    other = validate._trusted_pems([str(keys / "team-b.pub")])
    stage = node({"trusted_keys": [{"keyid": k, "pem": p} for k, p in other]})["stage"]
    assert not stage["ok"] and "none of them a trusted key" in stage["detail"]
    assert "--trusted-key" in stage["fix"]
    envelope = wheel.parent / (wheel.name + signing.SUFFIX)
    shutil.copy(
        wheels(root)["2.12.0"].parent / (wheels(root)["2.12.0"].name + signing.SUFFIX), envelope
    )
    stage = node({})["stage"]
    assert not stage["ok"] and f"the signature is not for {wheel.name}" in stage["detail"]
