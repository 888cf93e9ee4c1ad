"""publish's reading of dist/<target>/manifest.json, in-process: what a build left (or someone else put there) is one
ConfigError line whatever its shape. Publishing to a real index and pip installing from it: tests/e2e/test_publish.py."""

from __future__ import annotations

import os

import pytest

from apexkit.errors import ConfigError
from apexkit.index import publish


@pytest.mark.parametrize("text", ["[1]", '"a string"', "null", "7"])
def test_a_manifest_that_is_json_but_not_an_object_is_one_line(tmp_path, text):
    target = tmp_path / "dist" / "py3.11-torch2.13.0-x86_64-master"
    target.mkdir(parents=True)
    (target / "manifest.json").write_text(text)
    with pytest.raises(ConfigError, match="not a readable JSON manifest"):
        publish.collect(tmp_path / "dist")


# --- issue 25: index.json records what each wheel is for (facts) and its cache key ------------------------------------

WHEEL = "apex-0.1+ascend.torch2.7.1.npu2.7.1.post8-cp310-cp310-manylinux_2_28_aarch64.whl"


def manifest(**target) -> dict:
    return {
        "target": {
            "python": "3.10",
            "arch": "aarch64",
            "torch": "2.7.1+cpu",
            "torch_npu": "2.7.1.post8",
            "cann": "8.1.RC1",
            "apex_ref": "master",
            "identity": {"torch_npu": "2.7.1.post8"},
            **target,
        },
        "identity": {"requires_dist": ["torch==2.7.1", "torch_npu==2.7.1.*"]},
        "binary_checks": {"expect": {"cxx11_abi": 1}},
    }


def test_facts_are_read_from_the_manifest_and_the_wheel_name():
    facts = publish.facts_of(manifest(), WHEEL)
    assert facts == {
        "python": "3.10",
        "python_tag": "cp310",
        "abi_tag": "cp310",
        "platform_tag": "manylinux_2_28_aarch64",
        "arch": "aarch64",
        "torch": "2.7.1",  # the public version: +cpu names torch's build, not its ABI
        "torch_npu": "2.7.1.post8",
        "cann": "8.1.RC1",
        "cxx11_abi": 1,
        "version": "0.1+ascend.torch2.7.1.npu2.7.1.post8",
        "requires_dist": ["torch==2.7.1", "torch_npu==2.7.1.*"],
        "requires_python": None,
        "apex_ref": "master",
        "backend": None,  # Ascend apex: no CUDA release to match
        "cuda": None,
        "identity": {"torch_npu": "2.7.1.post8"},
    }
    # what publish writes, it reads back
    assert publish.check_facts(facts, "files[0]", "fix") == facts


@pytest.mark.parametrize(
    "field, value",
    [
        ("torch", "<script>alert(1)</script>"),
        ("cann", "8.1\n<b>"),
        ("arch", ["x86_64"]),
        ("apex_ref", "../../etc"),
        ("python", "3.11\x1b[2J"),
    ],
)
def test_a_hostile_manifest_value_never_becomes_a_fact(field, value):
    facts = publish.facts_of(manifest(**{field: value}), WHEEL)
    assert facts[field] is None
    assert publish.check_facts(facts, "files[0]", "fix")[field] is None


def test_a_hostile_manifest_abi_or_pin_is_dropped():
    m = manifest()
    m["binary_checks"]["expect"]["cxx11_abi"] = True  # a bool is not the 0/1 torch reports
    m["identity"]["requires_dist"] = ["torch==2.7.1", "<img src=x>", 7]
    facts = publish.facts_of(m, WHEEL)
    assert facts["cxx11_abi"] is None
    assert facts["requires_dist"] == ["torch==2.7.1"]


@pytest.mark.parametrize(
    "facts, needle",
    [
        ("a string", "facts is not an object"),
        ({"torch": "<b>2.7.1</b>"}, "facts.torch is not a plain version"),
        ({"cxx11_abi": 2}, "facts.cxx11_abi"),
        ({"requires_dist": "torch==2.7.1"}, "facts.requires_dist"),
    ],
)
def test_an_index_json_whose_facts_lie_in_shape_is_one_line(facts, needle):
    with pytest.raises(ConfigError, match=needle):
        publish.check_facts(facts, "files[0]", "fix")


def test_the_index_pages_are_the_index_own_and_anything_else_is_foreign(tmp_path):
    """_existing: an index's index.html, torch-<version>.html and <wheel>.metadata (apexkit.index.pages) are its own
    files, so publishing over it works; a page for a torch it does not hold, or a .metadata of no wheel, is not."""
    import fakes

    dist = tmp_path / "dist"
    wheel = fakes.publishable(dist)
    index = tmp_path / "index"
    publish.publish(dist, index)
    for own in ("index.html", "torch-2.13.0.html", f"simple/apex/{wheel.name}.metadata"):
        assert (index / own).is_file()
    assert [e.filename for e in publish._existing(index)] == [wheel.name]
    for foreign in ("torch-2.12.0.html", "simple/apex/apex-0.2-py3-none-any.whl.metadata"):
        (index / foreign).write_text("")
        with pytest.raises(ConfigError, match=f"it holds {foreign}"):
            publish._existing(index)
        (index / foreign).unlink()


# --- issue 41 item 9 (review F6): a wheel's platform tag agrees with its manifest -------------------------------------


@pytest.mark.parametrize(
    ("tag", "identity", "arch", "needle"),
    [
        ("manylinux_2_28_aarch64", {"manylinux_tag": "manylinux_2_28_aarch64"}, "aarch64", None),
        ("linux_aarch64", {"manylinux_tag": "manylinux_2_28_aarch64"}, "aarch64", None),  # not retagged
        ("manylinux2014_aarch64", {"manylinux_tag": "manylinux_2_17_aarch64"}, "aarch64", None),
        ("manylinux_2_24_aarch64", {"max_glibc": "GLIBC_2.4"}, "aarch64", None),  # GLIBCXX sets the tag
        ("manylinux_2_39_aarch64", {"manylinux_tag": "manylinux_2_34_aarch64"}, "aarch64", "computed manylinux_2_34"),
        ("manylinux_2_17_aarch64", {"manylinux_tag": None}, "aarch64", "computed no manylinux tag"),
        ("manylinux_2_17_aarch64", {"max_glibc": "GLIBC_2.34"}, "aarch64", "below the GLIBC_2.34"),
        ("manylinux_2_28_x86_64", {}, "aarch64", "is for x86_64, its manifest's target.arch is aarch64"),
    ],
)  # fmt: skip
def test_a_platform_tag_that_contradicts_its_manifest_is_named(tag, identity, arch, needle):
    name = f"apex-0.1-cp310-cp310-{tag}.whl"
    why = publish._contradiction(name, {"identity": identity, "target": {"arch": arch}})
    assert (why is None) if needle is None else (needle in str(why)), why


# --- issue 42: publish signs (docs/signing.md) ------------------------------------------------------------------------


def _signed_index(tmp_path, monkeypatch):
    import fakes

    from apexkit.index import signing

    monkeypatch.delenv(signing.PEM_ENV, raising=False)
    signing.generate("team", str(tmp_path / "keys"))
    dist = tmp_path / "dist"
    wheel = fakes.publishable(dist)
    index = tmp_path / "index"
    publish.publish(dist, index, sign_key=str(tmp_path / "keys" / "team.key"))
    return dist, index, wheel, signing.public_keys([str(tmp_path / "keys" / "team.pub")])


def test_a_republish_without_a_key_keeps_each_signature(tmp_path, monkeypatch):
    from apexkit.index import signing

    dist, index, wheel, trusted = _signed_index(tmp_path, monkeypatch)
    envelope = index / "simple" / "apex" / (wheel.name + signing.SUFFIX)
    signed = envelope.read_bytes()
    publish.publish(dist, index)  # the same bytes again, unsigned this time: the signature stays
    publish.publish(dist, index, dry_run=True, sign_key=str(tmp_path / "keys" / "team.key"))
    assert envelope.read_bytes() == signed
    (keyid,) = trusted
    assert signing.verify(signed, trusted)[1] == keyid
    (entry,) = publish._existing(index)
    assert entry.signature is not None and entry.signature.keyid == keyid


def test_the_ci_secret_signs_when_it_holds_the_pem(tmp_path, monkeypatch):
    import fakes

    from apexkit.index import signing

    signing.generate("ci", str(tmp_path))
    monkeypatch.setenv(signing.PEM_ENV, (tmp_path / "ci.key").read_text())
    wheel = fakes.publishable(tmp_path / "dist")
    publish.publish(tmp_path / "dist", tmp_path / "index")
    data = (tmp_path / "index" / "simple" / "apex" / (wheel.name + signing.SUFFIX)).read_bytes()
    assert signing.verify(data, signing.public_keys([str(tmp_path / "ci.pub")]))


@pytest.mark.parametrize(
    "record",
    [
        "a string",
        {"filename": "other.intoto.jsonl", "sha256": "0" * 64, "keyid": "1" * 64},
        {"sha256": "0" * 64},
    ],
)
def test_an_index_json_signature_record_of_another_shape_is_one_line(tmp_path, monkeypatch, record):
    import json

    _dist, index, _wheel, _ = _signed_index(tmp_path, monkeypatch)
    data = json.loads((index / "index.json").read_text())
    data["files"][0]["signature"] = record
    (index / "index.json").write_text(json.dumps(data))
    with pytest.raises(
        ConfigError,
        match=r"files\[0\]\.signature( is not an object|\.filename is not .*\.intoto\.jsonl)",
    ):
        publish._existing(index)


# --- issue 40 (second hostile pass, finding 1): the new index cannot be redirected while it is written --------------


def test_a_link_swapped_in_for_the_new_index_mid_write_gets_no_write_and_no_chmod(
    tmp_path, monkeypatch
):
    """Another user renames publish's temporary folder away (once simple/ is in it) and puts a link to their own
    folder in its place, holding index.json -> a file only root can read: publish's writes stay in the folder it
    made, nothing is chmodded through the link, and their folder never becomes the index (one line)."""
    victim = tmp_path / "secret"
    victim.write_text("root only\n")
    victim.chmod(0o600)
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "index.json").symlink_to(victim)
    parent = tmp_path / "www"
    parent.mkdir()
    real = publish.pages.write_pages

    def swapped(here, *args):  # the attacker's move, between two of publish's writes
        (tmp,) = [p for p in parent.iterdir() if ".tmp-" in p.name]
        tmp.rename(parent / "moved")
        tmp.symlink_to(theirs)
        return real(here, *args)

    monkeypatch.setattr(publish.pages, "write_pages", swapped)
    with pytest.raises(ConfigError, match="was replaced while it was written"):
        publish.write(parent / "index", [])
    assert victim.read_text() == "root only\n" and victim.stat().st_mode & 0o777 == 0o600
    assert sorted(p.name for p in theirs.iterdir()) == ["index.json"]  # nothing written there
    assert (theirs / "index.json").is_symlink() and not os.path.lexists(parent / "index")
    assert sorted(
        p.name for p in (parent / "moved").iterdir()
    ) == [  # all of it went to the folder made
        "index.html",
        "index.json",
        "simple",
    ]
