"""apexkit.index.remote in-process, on file:// indexes `publish` wrote: finding a wheel by cache key and by what a venv
holds, and refusing what an index serves when it is not what it claims. Over HTTP, through a proxy and with a login:
tests/e2e/test_team_index_cache.py and tests/e2e/test_apexkit_install.py."""

from __future__ import annotations

import hashlib
import io
import json
import zipfile
from pathlib import Path

import pytest

from apexkit.index import client, publish, remote
from apexkit.wheel import sbom

KEY = "ab" * 32
WHEEL = "apex-0.1+ascend.torch2.13.0-cp311-cp311-manylinux_2_28_x86_64.whl"
TARGET = "py3.11-torch2.13.0-x86_64-master"


def wheel_bytes(version: str = "0.1+ascend.torch2.13.0") -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as zf:
        zf.writestr(
            f"apex-{version}.dist-info/METADATA",
            f"Metadata-Version: 2.1\nName: apex\nVersion: {version}\nRequires-Python: >=3.11\n"
            "Requires-Dist: torch==2.13.0\n\n",
        )
    return out.getvalue()


def built(
    tmp: Path, name: str = WHEEL, torch: str = "2.13.0", key: str = KEY, cuda: str | None = None
) -> Path:
    """dist/<target>/ as a build leaves it: wheel, manifest (cache key, target, pins), SBOM and provenance. `cuda`:
    NVIDIA apex on CUDA built against torch of that CUDA release."""
    version = name.split("-")[1]
    target = f"py3.11-torch{torch}-x86_64-master" + ("+cuda.sm90" if cuda else "")
    folder = tmp / "dist" / target
    folder.mkdir(parents=True)
    data = wheel_bytes(version)
    (folder / name).write_bytes(data)
    manifest = {
        "wheel": {"file": name, "sha256": hashlib.sha256(data).hexdigest(), "size": len(data)},
        "target": {
            "python": "3.11",
            "arch": "x86_64",
            "torch": torch,
            "torch_npu": None,
            "apex_ref": "master",
            "identity": {},
            "target_id": target,
            **({"backend": "cuda", "torch_cuda": cuda} if cuda else {"backend": "ascend"}),
        },
        "cache_key": key,
        "identity": {"requires_dist": [f"torch=={torch}"]},
        "binary_checks": {"expect": {"cxx11_abi": 1}},
    }
    documents = sbom.documents(manifest, folder / name)
    for file, text in documents.items():
        (folder / file).write_bytes(text)
    (folder / "manifest.json").write_text(json.dumps(manifest))
    return tmp / "dist"


def published_index(tmp: Path, **kw) -> Path:
    publish.publish(built(tmp, **kw), tmp / "index")
    return tmp / "index"


def cl() -> client.Client:
    return client.Client(client.IndexSettings(urls=(), origin="test"))


def venv_tags(python: str = "cp311", arch: str = "x86_64", glibc: int = 36) -> tuple[str, ...]:
    """The wheel tags a venv's pip installs, best first (the newest glibc first), as the probe lists them."""
    platforms = [f"manylinux_2_{minor}_{arch}" for minor in range(glibc, 16, -1)]
    return tuple(f"{python}-{python}-{p}" for p in [*platforms, f"linux_{arch}"])


WANT = {
    "tags": venv_tags(),
    "python_tag": "cp311",
    "arch": "x86_64",
    "glibc": "2.36",
    "torch": "2.13.0+cpu",
    "torch_npu": None,
    "cxx11_abi": 1,
}


def test_a_wheel_is_found_by_its_cache_key_and_fetched_verified(tmp_path):
    index = published_index(tmp_path)
    hit = remote.find_by_key(cl(), [str(index)], KEY)
    assert hit is not None and hit.filename == WHEEL and hit.shown == index.as_uri()
    got, signer = remote.fetch(cl(), hit, tmp_path / "work")
    assert got.wheel.read_bytes() == (tmp_path / "dist" / TARGET / WHEEL).read_bytes()
    assert got.manifest["cache_key"] == KEY
    assert set(got.documents) == {sbom.SBOM_FILE, sbom.PROVENANCE_FILE}
    assert signer is None  # no trusted key: not verified
    assert remote.find_by_key(cl(), [str(index)], "cd" * 32) is None


def test_a_wheel_is_found_by_what_the_venv_holds(tmp_path):
    index = published_index(tmp_path)
    fits, near = remote.find_by_facts(cl(), [index.as_uri() + "/simple/"], WANT)
    assert [f.filename for f in fits] == [WHEEL] and near == []
    for change, why in [
        ({"torch": "2.12.0"}, "for torch 2.13.0, the venv has 2.12.0"),
        ({"tags": venv_tags(python="cp310")}, "tagged cp311-cp311-manylinux_2_28_x86_64, which"),
        ({"tags": venv_tags(arch="aarch64")}, "tagged cp311-cp311-manylinux_2_28_x86_64, which"),
        ({"tags": venv_tags(glibc=17)}, "tagged cp311-cp311-manylinux_2_28_x86_64, which"),
        ({"torch_npu": "2.13.0"}, "built without torch_npu"),
        ({"cxx11_abi": 0}, "C++ ABI"),
    ]:
        fits, near = remote.find_by_facts(cl(), [str(index)], {**WANT, **change})
        assert fits == []
        assert [n for n in near if n.startswith(f"{WHEEL} (") and why in n], (change, near)
        assert remote.misfit(
            publish.facts_of(
                json.loads((tmp_path / "dist" / TARGET / "manifest.json").read_text()), WHEEL
            ),
            {**WANT, **change},
        )


@pytest.mark.parametrize("fault", ["wheel", "provenance", "manifest-names-another", "cache-key"])
def test_what_an_index_serves_that_is_not_what_it_claims_is_refused(tmp_path, fault):
    index = published_index(tmp_path)
    folder = index / "simple" / "apex"
    data = json.loads((index / "index.json").read_text())
    entry = data["files"][0]
    if fault == "wheel":  # other bytes under the name
        (folder / WHEEL).write_bytes(wheel_bytes("0.2"))
        needle = "does not match the sha256 its index.json records"
    elif fault == "provenance":  # a statement about another wheel, its sha256 recorded to match
        path = folder / f"{WHEEL}.provenance.json"
        text = path.read_text().replace(WHEEL, "apex-0.1-cp311-cp311-linux_x86_64.whl")
        path.write_text(text)
        entry["attestations"]["provenance"]["sha256"] = hashlib.sha256(text.encode()).hexdigest()
        needle = "has no subject"
    elif fault == "manifest-names-another":
        path = folder / f"{WHEEL}.manifest.json"
        manifest = json.loads(path.read_text())
        manifest["wheel"]["sha256"] = "0" * 64
        path.write_text(json.dumps(manifest))
        entry["manifest"]["sha256"] = hashlib.sha256(path.read_bytes()).hexdigest()
        needle = "names another wheel or sha256"
    else:
        path = folder / f"{WHEEL}.manifest.json"
        manifest = json.loads(path.read_text())
        manifest["cache_key"] = "cd" * 32
        path.write_text(json.dumps(manifest))
        entry["manifest"]["sha256"] = hashlib.sha256(path.read_bytes()).hexdigest()
        needle = "another cache key"
    (index / "index.json").write_text(json.dumps(data))
    hit = remote.find_by_key(cl(), [str(index)], KEY)
    assert hit is not None
    with pytest.raises(remote.Refused, match=needle):
        remote.fetch(cl(), hit, tmp_path / "work")
    assert list((tmp_path / "work").iterdir()) == []  # nothing of it left


@pytest.mark.parametrize(
    "body",
    [b"not json", b"[]", b'{"format": "other", "files": []}', b'{"format": "apexkit-index/1"}'],
)
def test_an_index_json_that_is_not_an_apexkit_index_is_one_line_and_no_hit(tmp_path, body, capsys):
    (tmp_path / "index.json").write_bytes(body)
    assert remote.read_listing(cl(), str(tmp_path)) is None
    assert remote.find_by_key(cl(), [str(tmp_path)], KEY) is None
    assert "team index" in capsys.readouterr().err


def test_an_entry_that_lies_in_shape_is_left_out_and_the_rest_kept(tmp_path, capsys):
    index = published_index(tmp_path)
    data = json.loads((index / "index.json").read_text())
    bad = dict(data["files"][0], filename="../../etc/passwd.whl")
    worse = dict(data["files"][0], facts={"torch": "<script>"})
    data["files"] = [bad, worse, *data["files"]]
    (index / "index.json").write_text(json.dumps(data))
    listing = remote.read_listing(cl(), str(index))
    assert listing is not None and [e.filename for e in listing] == [WHEEL]
    assert capsys.readouterr().err.count("an entry is left out") == 2


def test_a_missing_index_is_unreachable_not_a_traceback(tmp_path, capsys):
    assert remote.read_listing(cl(), str(tmp_path / "nowhere")) is None
    assert "cannot be read" in capsys.readouterr().err


def test_shown_masks_the_password():
    assert "s3cret" not in remote.shown("http://bob:s3cret@127.0.0.1:8000/team")


CUDA_WHEEL = "apex-0.1+cu130.torch2.13.0-cp311-cp311-manylinux_2_28_x86_64.whl"


def test_nvidia_apex_on_cuda_goes_only_to_a_venv_of_its_cuda_and_first_there(tmp_path):
    dist = built(
        tmp_path
    )  # Ascend apex without torch_npu (the CPU tier), and NVIDIA apex for CUDA 13.0
    built(tmp_path, name=CUDA_WHEEL, key="cd" * 32, cuda="13.0")
    publish.publish(dist, tmp_path / "index")
    index = [str(tmp_path / "index")]
    fits, near = remote.find_by_facts(cl(), index, {**WANT, "cuda": None})  # a CPU torch
    assert [f.filename for f in fits] == [WHEEL]
    assert near == [
        f"{CUDA_WHEEL} ({(tmp_path / 'index').as_uri()}): NVIDIA apex for CUDA 13.0, the venv's torch is a "
        "build without CUDA"
    ]
    fits, near = remote.find_by_facts(cl(), index, {**WANT, "cuda": "13.0"})
    assert [f.filename for f in fits] == [CUDA_WHEEL, WHEEL] and near == []
    fits, near = remote.find_by_facts(cl(), index, {**WANT, "cuda": "12.8"})
    assert [f.filename for f in fits] == [WHEEL]
    assert "NVIDIA apex for CUDA 13.0, the venv's torch is CUDA 12.8" in near[0]
    # an Ascend venv (torch_npu) whose torch is a CUDA build, as x86_64's default torch is: Ascend apex only
    fits, near = remote.find_by_facts(cl(), index, {**WANT, "cuda": "13.0", "torch_npu": "2.13.0"})
    assert fits == [] and "torch_npu" in near[-1]
