"""Test doubles several test files share (tests/unit and tests/e2e alike): a small fixture wheel with a RECORD, an
index.json as `invoke publish` writes it, a dist/<target>/ with only its manifest, and a user's home and links owned
by another uid (the sudo -E case)."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import zipfile
from pathlib import Path

import pytest

LINUX = "apex-0.1+ascend.torch2.13.0-cp311-cp311-linux_x86_64.whl"
INFO = "apex-0.1+ascend.torch2.13.0.dist-info"


def _row(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}\n"


def make_wheel(folder: Path, name: str = LINUX, tag: str = "cp311-cp311-linux_x86_64") -> Path:
    members = {
        "apex_C.cpython-311-x86_64-linux-gnu.so": b"\x7fELF module",
        "apex/__init__.py": b"",
        f"{INFO}/METADATA": b"Metadata-Version: 2.1\nName: apex\nVersion: 0.1+ascend.torch2.13.0\n\n",
        f"{INFO}/WHEEL": f"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: false\nTag: {tag}\n\n".encode(),
    }
    path = folder / name
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for member, data in members.items():
            zf.writestr(zipfile.ZipInfo(member, date_time=(2020, 8, 14, 0, 0, 0)), data)
        zf.writestr(
            zipfile.ZipInfo(f"{INFO}/RECORD", date_time=(2020, 8, 14, 0, 0, 0)),
            "".join(_row(m, d) for m, d in members.items()) + f"{INFO}/RECORD,,\n",
        )
    return path


def fake_index(root: Path, *targets: tuple[str, str]) -> Path:
    """An index.json as `invoke publish` writes it (the wheels are not needed to plan or dry-run)."""
    root.mkdir(parents=True, exist_ok=True)
    files = [
        {
            "project": "apex",
            "filename": f"apex-0.1+ascend-cp{t[2:6].replace('.', '')}-x.whl",
            "sha256": "0" * 64,
            "target": t,
            "torch": torch,
        }
        for t, torch in targets
    ]
    (root / "index.json").write_text(json.dumps({"format": "apexkit-index/1", "files": files}))
    return root


def target_dir(dist: Path, name: str, identity: dict | None) -> Path:
    folder = dist / name
    folder.mkdir(parents=True)
    target = {"target_id": name} if identity is None else {"target_id": name, "identity": identity}
    (folder / "manifest.json").write_text(json.dumps({"target": target}))
    return folder


NOBODY = 65534

needs_root = pytest.mark.skipif(
    os.geteuid() != 0, reason="needs root: the home belongs to another uid (chown)"
)


def users_home(root: Path) -> Path:
    """The sudo -E case: root runs with HOME=/home/alice, a home that belongs to uid 65534."""
    home = root / "home/alice"
    os.chown(home, NOBODY, NOBODY)
    return home


def users_link(link: Path, target: str) -> None:
    """A symbolic link made by the user (uid 65534), as `ln -s` in their own home would."""
    link.symlink_to(target)
    os.lchown(link, NOBODY, NOBODY)


def publishable(
    dist: Path,
    python: str = "3.11",
    torch: str = "2.13.0",
    arch: str = "x86_64",
    torch_npu: str | None = None,
    requires_python: str | None = ">=3.8",
    attest: bool = True,
) -> Path:
    """dist/<target>/ as a build leaves it (wheel, manifest.json, SBOM and provenance naming the wheel), for publish:
    a small apexkit-shaped wheel whose name and METADATA carry the tuple. Returns the wheel."""
    label = f"torch{torch}" + (f".npu{torch_npu}" if torch_npu else "")
    version = f"0.1+ascend.{label}"
    cp = "cp" + python.replace(".", "")
    target = f"py{python}-torch{torch}-{arch}-master" + (f"+npu{torch_npu}" if torch_npu else "")
    folder = dist / target
    folder.mkdir(parents=True)
    info = f"apex-{version}.dist-info"
    metadata = (
        f"Metadata-Version: 2.1\nName: apex\nVersion: {version}\nRequires-Dist: torch=={torch}\n"
    )
    if requires_python:
        metadata += f"Requires-Python: {requires_python}\n"
    members = {
        "apex/__init__.py": b"",
        f"{info}/METADATA": (metadata + "\n").encode(),
        f"{info}/WHEEL": (
            "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: false\n"
            f"Tag: {cp}-{cp}-manylinux_2_28_{arch}\n\n"
        ).encode(),
    }
    wheel = folder / f"apex-{version}-{cp}-{cp}-manylinux_2_28_{arch}.whl"
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as zf:
        for member, data in members.items():
            zf.writestr(zipfile.ZipInfo(member, date_time=(2020, 8, 14, 0, 0, 0)), data)
        zf.writestr(
            zipfile.ZipInfo(f"{info}/RECORD", date_time=(2020, 8, 14, 0, 0, 0)),
            "".join(_row(m, d) for m, d in members.items()) + f"{info}/RECORD,,\n",
        )
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
    manifest: dict = {
        "target": {
            "target_id": target,
            "torch": torch,
            "python": python,
            "arch": arch,
            **({"torch_npu": torch_npu} if torch_npu else {}),
        },
        "wheel": {"file": wheel.name, "sha256": digest},
    }
    if attest:
        docs = {
            "sbom": (
                "sbom.cdx.json",
                {"metadata": {"component": {"hashes": [{"alg": "SHA-256", "content": digest}]}}},
            ),
            "provenance": (
                "provenance.json",
                {"subject": [{"name": wheel.name, "digest": {"sha256": digest}}]},
            ),
        }
        manifest["attestations"] = {}
        for kind, (name, doc) in docs.items():
            data = json.dumps(doc).encode()
            (folder / name).write_bytes(data)
            manifest["attestations"][kind] = {
                "file": name,
                "sha256": hashlib.sha256(data).hexdigest(),
            }
    (folder / "manifest.json").write_text(json.dumps(manifest))
    return wheel


# --- what the host plans for `apexkit build 3.11` on x86_64 (buildplan.expected_targets) ----------------------------

PLANNED_TARGET = "py3.11-torch2.13.0-x86_64-master"
PLANNED = {
    PLANNED_TARGET: {
        "python": "3.11",
        "torch": "2.13.0",
        "torch_npu": None,
        "arch": "x86_64",
        "target_id": PLANNED_TARGET,
        "identity": {},
    }
}


def planned(system_torch: str | None = None) -> dict[str, dict]:
    """The `planned` a container publish or a Slurm collect gets: this plan, whatever the other side says."""
    return PLANNED
