"""Issue 16, item 6: dist/<target>/ carries a CycloneDX SBOM of the build venv and the wheel, and an in-toto / SLSA
provenance statement (inputs with digests, the wheel's digest as subject). Real files: a real fixture build, a real
venv inventory, the schema the library ships."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import zipfile
from pathlib import Path

import fakes
import pytest
import sbomschema
import wheelnames
from conftest import ROOT, output

from apexkit.errors import ImageError
from apexkit.images import container
from apexkit.wheel import patches, sbom

WHEEL = wheelnames.fixture_wheel()  # manylinux_2_24 where auditwheel computes it
TARGET = "py3.11-torch2.13.0-x86_64-master"


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def make_wheel(folder: Path) -> Path:
    path = folder / WHEEL
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr(
            "apex-0.1+ascend.torch2.13.0.dist-info/METADATA",
            "Metadata-Version: 2.1\nName: apex\n"
            "Version: 0.1+ascend.torch2.13.0\nRequires-Dist: torch==2.13.0\n\n",
        )
        zf.writestr("apex_C.cpython-311-x86_64-linux-gnu.so", b"\x7fELF module bytes")
        zf.writestr("apex/__init__.py", "")
    return path


def manifest_for(inventory: dict) -> dict:
    return {
        "apexkit": "0.1.0",
        "target": {"target_id": TARGET, "torch": "2.13.0", "python": "3.11"},
        "sources": {
            "ascend_apex": {"origin": "file:///srv/ascend", "ref": "master", "commit": "a" * 40},
            "nvidia_apex": {"url": "file:///srv/nvidia", "commit": "b" * 40},
        },
        "patches": [
            {"id": "cxx11-abi", "file": "setup.py", "status": "applied", "sha256": "c" * 64}
        ],
        "tools": {
            "python": "3.11.7",
            "compiler": sbom.compiler(),
            "interpreter": sbom.interpreter(sys.executable),
        },
        "build_venv": inventory,
        "created": "2026-11-30T17:00:00Z",
        "wheel": {"file": WHEEL},
    }


def test_inventory_reads_a_real_venv_and_hashes_wheelhouse_files(tmp_path):
    # this test's own interpreter is a real venv; pytest is in it. A wheelhouse file of the same name/version/tag
    # gives the wheel file's sha256, anything else the sha256 of the installed RECORD.
    import pytest as installed

    version = installed.__version__
    house = tmp_path / "house"
    house.mkdir()
    fake = house / f"pytest-{version}-py3-none-any.whl"
    fake.write_bytes(b"a wheel file")
    found = sbom.inventory(Path(sys.executable), [house])
    rows = {p["name"].lower(): p for p in found["packages"]}
    assert rows["pytest"]["version"] == version and len(rows["pytest"]["record_sha256"]) == 64
    assert rows["pytest"]["wheel"] == {"file": fake.name, "sha256": sha(fake), "from": "wheelhouse"}
    assert "wheel" not in rows["packaging"]


def test_documents_are_valid_cyclonedx_and_an_in_toto_statement(tmp_path):
    wheel = make_wheel(tmp_path)
    manifest = manifest_for(sbom.inventory(Path(sys.executable)))
    docs = sbom.documents(manifest, wheel)
    assert sorted(docs) == [sbom.PROVENANCE_FILE, sbom.SBOM_FILE]
    text = docs[sbom.SBOM_FILE].decode()
    sbomschema.validate(text)  # the CycloneDX 1.6 JSON schema, strict
    bom = json.loads(text)
    assert bom["bomFormat"] == "CycloneDX" and bom["specVersion"] == "1.6"
    root = bom["metadata"]["component"]
    assert root["name"] == "apex" and root["version"] == "0.1+ascend.torch2.13.0"
    assert root["hashes"] == [{"alg": "SHA-256", "content": sha(wheel)}]
    assert [a["version"] for a in root["pedigree"]["ancestors"]] == ["a" * 40, "b" * 40]
    by_name = {c["name"]: c for c in bom["components"]}
    module = by_name["apex_C.cpython-311-x86_64-linux-gnu.so"]
    assert (
        module["type"] == "file"
        and module["hashes"][0]["content"] == hashlib.sha256(b"\x7fELF module bytes").hexdigest()
    )
    assert by_name["pytest"]["scope"] == "excluded" and by_name["pytest"]["purl"].startswith(
        "pkg:pypi/pytest@"
    )
    statement = json.loads(docs[sbom.PROVENANCE_FILE])
    assert statement["_type"] == "https://in-toto.io/Statement/v1"
    assert statement["predicateType"] == "https://slsa.dev/provenance/v1"
    assert statement["subject"] == [{"name": WHEEL, "digest": {"sha256": sha(wheel)}}]
    deps = {d["name"]: d for d in statement["predicate"]["buildDefinition"]["resolvedDependencies"]}
    assert deps["ascend-apex"]["digest"] == {"gitCommit": "a" * 40}
    assert deps["patch:cxx11-abi"]["digest"] == {"sha256": "c" * 64}
    assert deps["pytest"]["annotations"]["digest_of"] == "its installed dist-info/RECORD"
    assert (
        len(deps["compiler"]["digest"]["sha256"]) == 64
        and deps["compiler"]["annotations"]["version"]
    )
    assert statement["predicate"]["runDetails"]["byproducts"] == [
        {
            "name": sbom.SBOM_FILE,
            "digest": {"sha256": hashlib.sha256(docs[sbom.SBOM_FILE]).hexdigest()},
            "mediaType": "application/vnd.cyclonedx+json",
        }
    ]
    assert manifest["attestations"]["signed"] is False
    assert (
        manifest["attestations"]["sbom"]["sha256"]
        == hashlib.sha256(docs[sbom.SBOM_FILE]).hexdigest()
    )


def test_an_sbom_that_breaks_the_schema_is_one_line(tmp_path):
    wheel = make_wheel(tmp_path)
    bom = json.loads(sbom.documents(manifest_for({"packages": []}), wheel)[sbom.SBOM_FILE])
    bom["components"][0]["type"] = "not-a-type"
    with pytest.raises(sbomschema.SchemaError) as info:
        sbomschema.validate(json.dumps(bom))
    assert "fails the CycloneDX 1.6 schema" in str(info.value) and "\n" not in str(info.value)


def test_a_manifest_from_a_container_cannot_smuggle_shapes_into_the_sbom(tmp_path):
    wheel = make_wheel(tmp_path)
    manifest = manifest_for(
        {
            "packages": [
                {"name": {"x": 1}, "version": "1"},
                "junk",
                {"name": "torch", "version": "2.13.0", "record_sha256": "../../etc"},
            ]
        }
    )
    manifest["patches"] = "not a list"
    manifest["builder_image"] = {"image": "i", "id": "sha256:" + "d" * 64, "repo_digests": "nope"}
    docs = sbom.documents(manifest, wheel)
    sbomschema.validate(docs[sbom.SBOM_FILE].decode())
    deps = {
        d["name"]: d
        for d in json.loads(docs[sbom.PROVENANCE_FILE])["predicate"]["buildDefinition"][
            "resolvedDependencies"
        ]
    }
    assert deps["torch"]["digest"] == {}  # not a sha256: left out, not copied
    assert deps["builder image"]["digest"] == {"sha256": "d" * 64}


def test_fixture_build_writes_sbom_and_provenance_into_dist(runner, repos):
    proc = runner.nox("3.11", "--no-smoke-test")
    assert proc.returncode == 0, output(proc)[-3000:]
    dist = runner.dist / TARGET
    assert sorted(p.name for p in dist.iterdir()) == [
        WHEEL,
        "manifest.json",
        "provenance.json",
        "sbom.cdx.json",
    ]
    manifest = json.loads((dist / "manifest.json").read_text())
    text = (dist / "sbom.cdx.json").read_text()
    sbomschema.validate(text)
    bom = json.loads(text)
    assert bom["metadata"]["component"]["hashes"][0]["content"] == sha(dist / WHEEL)
    components = {c["name"].lower(): c for c in bom["components"]}
    assert components["torch"]["scope"] == "required" and components["torch"]["version"].startswith(
        "2.13.0"
    )
    assert components["setuptools"]["scope"] == "excluded"
    assert any(c["type"] == "file" and c["name"].startswith("apex_C") for c in bom["components"])
    statement = json.loads((dist / "provenance.json").read_text())
    assert statement["subject"][0] == {"name": WHEEL, "digest": {"sha256": sha(dist / WHEEL)}}
    deps = {d["name"]: d for d in statement["predicate"]["buildDefinition"]["resolvedDependencies"]}
    assert (
        deps["ascend-apex"]["digest"]["gitCommit"] == manifest["sources"]["ascend_apex"]["commit"]
    )
    assert deps["nvidia-apex"]["digest"]["gitCommit"] == repos.nvidia_pin
    for patch in patches.load_all():
        assert deps[f"patch:{patch.id}"]["digest"] == {"sha256": patch.sha256}
    assert (
        len(deps["torch"]["digest"]["sha256"]) == 64 and deps["compiler"]["annotations"]["version"]
    )
    # torch's digest is that of the wheel file it was installed from, as the installer reported it (pip --report,
    # uv's pylock resolution), not of its RECORD; the torch wheel on disk here is that file
    torch = deps["torch"]
    assert torch["annotations"]["digest_of"].startswith("the wheel file torch-2.13.0"), torch
    assert torch["annotations"]["digest_from"].startswith(("pip ", "uv ")), torch
    location = torch["annotations"]["download_location"].replace("%2B", "+")
    local = Path(location[len("file://") :]) if location.startswith("file://") else None
    if local is not None and local.is_file():
        assert sha(local) == torch["digest"]["sha256"]
    assert components["torch"]["hashes"] == [
        {"alg": "SHA-256", "content": torch["digest"]["sha256"]}
    ]
    # the wheel carries the tag the binary checks computed, and the subject names that file
    platform = manifest["binary_checks"]["platform"]
    assert platform["wheel_tag"] == WHEEL.rsplit("-", 1)[1][:-4]
    assert (platform.get("retagged_from") == "linux_x86_64") == wheelnames.TAG_COMPUTED
    assert manifest["attestations"]["sbom"]["sha256"] == sha(dist / "sbom.cdx.json")
    assert manifest["attestations"]["provenance"]["sha256"] == sha(dist / "provenance.json")
    assert "sbom/provenance:" in output(proc)


def built_target(folder: Path) -> tuple[Path, dict]:
    """A dist/<target> as a build leaves it before the SBOM: the wheel and its manifest."""
    wheel = make_wheel(folder)
    manifest = manifest_for(
        {"packages": [{"name": "torch", "version": "2.13.0", "record_sha256": "e" * 64}]}
    )
    manifest["wheel"] = {"file": WHEEL, "sha256": sha(wheel), "size": wheel.stat().st_size}
    manifest["target"] = {**manifest.get("target", {}), **PLANNED[TARGET]}  # what the host planned
    (folder / "manifest.json").write_text(json.dumps(manifest))
    return wheel, manifest


PLANNED = fakes.PLANNED  # the host's plan: the only dist/<target> it takes from another side
planned = fakes.planned


def test_container_publish_writes_them_on_the_host_with_the_image_id(tmp_path):
    workspace = tmp_path / "build" / "containers" / "builder-py3.11"
    produced = workspace / "dist" / TARGET
    produced.mkdir(parents=True)
    _, manifest = built_target(produced)
    (produced / "sbom.cdx.json").write_text("left by the container: never taken")
    spec = container.ContainerSpec(
        image="apexkit/builder:x",
        arch="x86_64",
        command=[],
        user="1000:1000",
        uid=1000,
        mounts=[],
        environment={},
        network=None,
        workspace=workspace,
        cache=tmp_path / "cache",
    )
    final = container._publish(
        produced,
        tmp_path / "dist",
        spec,
        {},
        1.0,
        image_ref={"id": "sha256:" + "f" * 64, "repo_digests": []},
        planned=planned,
    )
    assert sorted(p.name for p in final.iterdir()) == [
        WHEEL,
        "manifest.json",
        "provenance.json",
        "sbom.cdx.json",
    ]
    sbomschema.validate((final / "sbom.cdx.json").read_text())
    statement = json.loads((final / "provenance.json").read_text())
    deps = {d["name"]: d for d in statement["predicate"]["buildDefinition"]["resolvedDependencies"]}
    assert deps["builder image"]["digest"] == {"sha256": "f" * 64}
    assert statement["predicate"]["runDetails"]["builder"]["id"] == "urn:apexkit:builder:image"
    written = json.loads((final / "manifest.json").read_text())
    assert written["builder_image"]["id"] == "sha256:" + "f" * 64
    assert written["attestations"]["sbom"]["sha256"] == sha(final / "sbom.cdx.json")

    # a wheel that is no zip: refused in one line before any SBOM, nothing in dist/
    (produced / WHEEL).write_bytes(b"not a zip")
    manifest["wheel"]["sha256"] = sha(produced / WHEEL)
    (produced / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ImageError) as info:
        container._publish(produced, tmp_path / "dist2", spec, {}, 1.0, planned=planned)
    assert "\n" not in info.value.format() and "refusing" in info.value.format()


def test_signing_is_documented_off_by_default():
    text = (ROOT / "docs" / "wheels.md").read_text()
    assert "sbom.cdx.json" in text and "provenance.json" in text and "cosign" in text
    assert (
        subprocess.run([sys.executable, "-c", "import apexkit.wheel.sbom"], cwd=ROOT).returncode
        == 0
    )


def test_without_the_library_the_provenance_is_still_written_and_the_manifest_says_why(tmp_path):
    wheel = make_wheel(tmp_path)
    code = (
        "import json, sys; sys.modules['cyclonedx'] = None; from pathlib import Path; from apexkit.wheel import sbom; "
        f"m = {{'created': '2026-11-30T17:00:00Z'}}; d = sbom.documents(m, Path({str(wheel)!r})); "
        "print(json.dumps({'files': sorted(d), 'attestations': m['attestations']}))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["files"] == [sbom.PROVENANCE_FILE]
    assert result["attestations"]["sbom"] is None
    assert "cyclonedx-python-lib is not installed" in result["attestations"]["sbom_missing"]


def test_a_target_collected_from_a_slurm_job_gets_them_too(tmp_path):
    # matrixrun.collect copies the wheel + manifest a job left; distdir.replace_dir writes the SBOM and provenance
    from apexkit.fleet import matrixrun
    from apexkit.plan import matrix

    combo = matrix.load().combinations([{"python": "3.11", "torch": "2.13.0", "arch": "x86_64"}])[0]
    target = tmp_path / "stage" / TARGET
    target.mkdir(parents=True)
    wheel, _ = built_target(target)
    final, _ = matrixrun.collect(tmp_path / "stage", combo, tmp_path / "dist", {"id": "1"}, False)
    assert sorted(p.name for p in final.iterdir()) == [
        WHEEL,
        "manifest.json",
        "provenance.json",
        "sbom.cdx.json",
    ]
    sbomschema.validate((final / "sbom.cdx.json").read_text())
    assert json.loads((final / "provenance.json").read_text())["subject"][0]["digest"] == {
        "sha256": sha(wheel)
    }
