"""Issue 13 items 6 and 7: distinct inputs get distinct dist/<target> folders (or a refusal to overwrite without
--force), and the wheel cache is untrusted input (symlinks, a text file named .whl, a swapped wheel, a cache that
others can write) -- real files, real builds of the fixture sources."""

from __future__ import annotations

import grp
import hashlib
import json
import os
import zipfile
from pathlib import Path

import fakes
import pytest
import wheelnames

from apexkit import untrusted
from apexkit.errors import ConfigError
from apexkit.plan import matrix
from apexkit.wheel import buildplan, distdir
from apexkit.wheel.cache import WheelCache
from apexkit.wheel.interpreters import Interpreter
from apexkit.wheel.options import BuildOptions

INTERP = Interpreter("/usr/bin/python3.11", "3.11", "3.11.2", "cpython", "x86_64", "/usr", "", "")
BASE = "py3.11-torch2.13.0-x86_64-master"
WHEEL = wheelnames.fixture_wheel()  # manylinux_2_24 where auditwheel computes it


def plan_id(**opts) -> str:
    return buildplan.make_plan(
        BuildOptions(python="3.11", **opts), matrix.load(), INTERP, "2.13.0", env={}
    ).target_id


# --- item 7: distinct inputs, distinct outputs -----------------------------------------------------------------


def test_every_non_default_input_has_its_own_target_id():
    ids = {
        "default": plan_id(),
        "npu": plan_id(npu=True, torch_npu="2.13.0"),
        "skip": plan_id(skip_patches=("rpath-link-flag", "cxx11-abi")),
        "nvidia": plan_id(nvidia_commit="4ef930c1c884fdca5f472ab2ce7cb9b505d26c1a"),
        "flags": plan_id(setup_flags=("--cpp_ext", "--npu_float_status")),
        "system": plan_id(use_system_torch=True),
        "local": plan_id(apex_src=Path("/srv/my-apex")),
    }
    assert ids["default"] == BASE
    assert ids["npu"] == f"{BASE}+npu2.13.0"
    assert (
        ids["skip"] == f"{BASE}+skip-cxx11-abi.rpath-link-flag"
    )  # sorted: the same set is the same target
    assert ids["nvidia"] == f"{BASE}+nvidia-4ef930c1c884"
    assert ids["flags"] == f"{BASE}+flags-cpp_ext.npu_float_status"
    assert ids["system"] == f"{BASE}+system-torch"
    assert ids["local"] == "py3.11-torch2.13.0-x86_64-local"
    assert len(set(ids.values())) == len(ids)
    # the ref's own flags given explicitly are the default build, not a variant
    assert plan_id(setup_flags=("--cpp_ext",)) == BASE
    combined = plan_id(
        npu=True, torch_npu="2.13.0", skip_patches=("cxx11-abi",), use_system_torch=False
    )
    assert combined == f"{BASE}+npu2.13.0+skip-cxx11-abi"


def test_check_overwrite_refuses_other_inputs_and_says_which(tmp_path):
    fakes.target_dir(tmp_path, "py3.11-torch2.13.0-x86_64-local", {"apex_src": "/home/a/apex"})
    with pytest.raises(ConfigError) as exc:
        distdir.check_overwrite(
            tmp_path, "py3.11-torch2.13.0-x86_64-local", {"apex_src": "/home/b/apex"}, force=False
        )
    text = exc.value.format()
    assert (
        "apex_src: /home/a/apex there, /home/b/apex now" in text and "nothing was replaced" in text
    )
    assert "--force" in exc.value.hint and "\n" not in text
    distdir.check_overwrite(
        tmp_path, "py3.11-torch2.13.0-x86_64-local", {"apex_src": "/home/a/apex"}, force=False
    )
    distdir.check_overwrite(
        tmp_path, "py3.11-torch2.13.0-x86_64-local", {"apex_src": "/home/b/apex"}, force=True
    )
    # a manifest from before identities is a default build; a missing target is free
    fakes.target_dir(tmp_path, BASE, None)
    distdir.check_overwrite(tmp_path, BASE, {}, force=False)
    distdir.check_overwrite(
        tmp_path, "py3.11-torch2.1.0-x86_64-master", {"torch_npu": "2.1.0.post10"}, force=False
    )


def test_check_overwrite_refuses_a_folder_apexkit_did_not_write(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    fakes.target_dir(tmp_path, "real", {})
    (tmp_path / "dist").mkdir()
    (tmp_path / "dist" / BASE).symlink_to(tmp_path / "real", target_is_directory=True)
    with pytest.raises(ConfigError, match="is not a target apexkit wrote"):
        distdir.check_overwrite(tmp_path / "dist", BASE, {}, force=False)
    elsewhere.mkdir()
    (elsewhere / BASE).mkdir()
    (elsewhere / BASE / "notes.txt").write_text("mine")
    with pytest.raises(ConfigError, match="is not a target apexkit wrote"):
        distdir.replace_dir(elsewhere, BASE, {}, {"target": {"identity": {}}})
    assert (elsewhere / BASE / "notes.txt").read_text() == "mine"


# --- item 6: the wheel cache is untrusted input ----------------------------------------------------------------

KEY = "ab" + "c" * 62


def _wheel_bytes() -> bytes:
    import io

    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr("apex/__init__.py", "")
    return buf.getvalue()


class Cache:
    def __init__(self, root: Path) -> None:
        self.root = root / "cache"
        self.entry = self.root / "wheels" / KEY[:2] / KEY
        self.work = root / "work"
        self.work.mkdir()
        self.secret = root / "id_rsa"
        self.secret.write_bytes(b"-----BEGIN OPENSSH PRIVATE KEY-----\n")
        self.cache = WheelCache(self.root / "wheels")

    def put(self, name: str = WHEEL, data: bytes | None = None, sha: str | None = None) -> None:
        self.entry.mkdir(parents=True, exist_ok=True)
        data = _wheel_bytes() if data is None else data
        if name == WHEEL and not (self.entry / name).is_symlink():
            (self.entry / name).write_bytes(data)
        digest = sha or hashlib.sha256(data).hexdigest()
        (self.entry / "manifest.json").write_text(
            json.dumps({"wheel": {"file": name, "sha256": digest, "size": 1}})
        )

    def lookup(self):
        found = self.cache.lookup(KEY, self.work)
        return None if found is None else found[:2]


def test_a_good_cache_entry_is_copied_rehashed_and_sized(tmp_path):
    cache = Cache(tmp_path)
    cache.put()
    wheel, manifest = cache.lookup()
    assert wheel.parent == cache.work / "cached-wheel" and wheel.read_bytes() == _wheel_bytes()
    assert manifest["wheel"]["size"] == len(_wheel_bytes())  # the real size, not the manifest's 1


@pytest.mark.parametrize(
    "attack",
    [
        "text-file",
        "wheel-symlink",
        "entry-symlink",
        "bad-name",
        "swapped-bytes",
        "manifest-symlink",
    ],
)
def test_a_poisoned_cache_entry_is_refused_not_published(tmp_path, capfd, attack):
    cache = Cache(tmp_path)
    secret = cache.secret.read_bytes()
    if attack == "text-file":  # a text file named like the wheel, with a matching digest
        cache.put(data=b"#!/bin/sh\nrm -rf ~\n")
    elif attack == "wheel-symlink":
        cache.entry.mkdir(parents=True)
        (cache.entry / WHEEL).symlink_to(cache.secret)
        cache.put(sha=hashlib.sha256(secret).hexdigest())
    elif attack == "entry-symlink":
        real = tmp_path / "planted"
        real.mkdir()
        (real / WHEEL).write_bytes(_wheel_bytes())
        (real / "manifest.json").write_text(
            json.dumps(
                {"wheel": {"file": WHEEL, "sha256": hashlib.sha256(_wheel_bytes()).hexdigest()}}
            )
        )
        cache.entry.parent.mkdir(parents=True)
        cache.entry.symlink_to(real, target_is_directory=True)
    elif attack == "bad-name":
        cache.put(name=f"../../{cache.secret.name}", sha=hashlib.sha256(secret).hexdigest())
    elif attack == "swapped-bytes":
        cache.put(sha="0" * 64)
    elif attack == "manifest-symlink":
        cache.put()
        (cache.entry / "manifest.json").unlink()
        (cache.entry / "manifest.json").symlink_to(cache.secret)
    assert cache.lookup() is None
    err = capfd.readouterr().err
    assert "refused" in err and "rebuilding" in err and "BEGIN OPENSSH" not in err
    assert not (cache.work / "cached-wheel").exists()  # nothing kept from the refused entry


@pytest.mark.skipif(os.geteuid() != 0, reason="making the cache another user's needs root (chown)")
def test_a_cache_owned_by_someone_else_is_not_used(tmp_path, capfd):
    cache = Cache(tmp_path)
    cache.put()
    os.chown(cache.root, 4242, 4242)
    assert cache.cache.usable() is False
    assert "is owned by uid 4242: not using it" in capfd.readouterr().err


def test_a_group_or_world_writable_cache_is_not_used(tmp_path, capfd):
    cache = Cache(tmp_path)
    cache.put()
    assert cache.cache.usable() is True
    os.chmod(cache.root / "wheels", 0o777)
    assert cache.cache.usable() is False
    assert "is world-writable: not using it" in capfd.readouterr().err
    os.chmod(cache.root / "wheels", 0o775)
    if untrusted._private_group(
        os.stat(cache.root / "wheels")
    ):  # the owner's own group (umask 002): fine
        assert cache.cache.usable() is True
        if os.geteuid() != 0:
            return
        os.chown(cache.root / "wheels", -1, grp.getgrnam("users").gr_gid)  # a group others are in
    assert cache.cache.usable() is False
    assert "is group-writable" in capfd.readouterr().err


def test_a_shard_tightened_on_top_only_still_refuses_anothers_entry(tmp_path, capfd):
    """The review's case: a cache made under umask 000, then `chmod go-w cache cache/wheels` -- the shard folder
    wheels/ab stays world-writable, and an entry planted there by another user is refused."""
    cache = Cache(tmp_path)
    cache.put()
    os.chmod(cache.entry.parent, 0o777)
    assert cache.cache.usable() is True and cache.lookup() is None
    assert "is world-writable" in capfd.readouterr().err
    os.chmod(cache.entry.parent, 0o755)
    if os.geteuid() == 0:
        os.chown(cache.entry, 65534, 65534)  # an entry that belongs to someone else
        assert cache.lookup() is None
        assert "owned by uid 65534" in capfd.readouterr().err
