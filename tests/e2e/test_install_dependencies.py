"""apexkit install adding what a wheel requires, with a real venv and its real pip (pip's --dry-run --report, the
constraints file, the probe before and after) against a folder of tiny wheels standing for the user's index: what
the wheel requires comes in with its own dependencies, and a dependency that would bring torch_npu, replace what the
venv holds, or be too many, is refused with nothing installed."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from apexkit import untrusted
from apexkit.install import run
from apexkit.install import target as targets


def tiny_wheel(folder: Path, name: str, version: str, *requires: str) -> Path:
    """A pure-Python wheel holding one empty module and its METADATA, RECORD with real hashes (pip checks them)."""
    stem = name.replace("-", "_")
    dist_info = f"{stem}-{version}.dist-info"
    files = {
        f"{stem}_mod/__init__.py": b"",
        f"{dist_info}/METADATA": (
            f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
            + "".join(f"Requires-Dist: {r}\n" for r in requires)
        ).encode(),
        f"{dist_info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    rows = [
        f"{path},sha256={base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b'=').decode()},{len(data)}"
        for path, data in files.items()
    ]
    files[f"{dist_info}/RECORD"] = ("\n".join([*rows, f"{dist_info}/RECORD,,"]) + "\n").encode()
    wheel = folder / f"{stem}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        for path, data in files.items():
            zf.writestr(path, data)
    return wheel


@pytest.fixture
def venv(tmp_path):
    """A venv holding a stand-in torch 2.0.0 and numpy 2.0, its pip reaching only `links` (the user's index)."""
    links = tmp_path / "links"
    links.mkdir()
    for name, version, *requires in [
        ("torch", "2.0.0"),
        ("numpy", "2.0"),
        ("numpy", "3.0"),
        ("torch-npu", "2.0.0"),
        ("foo", "1.0", "bar>=1"),
        ("bar", "1.0"),
        ("wantsnpu", "1.0", "torch-npu"),
        ("wantsnumpy", "1.0", "numpy>=3"),
        ("many", "1.0", *(f"d{i}" for i in range(9))),
        *((f"d{i}", "1.0") for i in range(9)),
    ]:
        tiny_wheel(links, name, version, *requires)
    path = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(path)], check=True, timeout=300)
    env = {
        "PATH": os.environ["PATH"],
        "HOME": str(tmp_path),
        "PIP_CONFIG_FILE": os.devnull,
        "PIP_NO_INDEX": "1",
        "PIP_FIND_LINKS": str(links),
    }
    pip = [str(path / "bin" / "python"), "-m", "pip", "install", "-q", "torch==2.0.0", "numpy==2.0"]
    made = subprocess.run(pip, env=env, capture_output=True, text=True, timeout=300)
    assert made.returncode == 0, made.stderr[-2000:]
    return path, env


def install(venv, tmp_path, *requires: str) -> tuple[run.Result | None, str, dict]:
    """run._install of an apex wheel requiring torch==2.0.0 and `requires` (the real probe, the real pip); returns
    (the result or None, the error line or "", the venv's distributions after)."""
    path, env = venv
    folder = tmp_path / "apex"
    folder.mkdir(exist_ok=True)
    wheel = tiny_wheel(folder, "apex", "0.1+ascend.torch2.0.0", "torch==2.0.0", *requires)
    named = f"--venv {path}"
    before = targets.probe(str(path / "bin" / "python"), named, env)
    result = run.Result("would-install", None, None, "file:///index", before.venv, None, None, None)
    sha = untrusted.sha256_file(wheel)
    try:
        done, error = run._install(before, named, wheel, sha, result, "installed", env), ""
    except run.InstallError as exc:
        done, error = None, str(exc)
    return done, error, listed(venv)


def listed(venv) -> dict[str, str]:
    """The venv's distributions as its pip lists them: {name: version}."""
    path, env = venv
    proc = subprocess.run(
        [str(path / "bin" / "python"), "-m", "pip", "list", "--format", "json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    return {d["name"].lower(): d["version"] for d in json.loads(proc.stdout)}


def test_a_dependency_comes_with_its_own_and_both_are_named(venv, tmp_path):
    done, error, after = install(venv, tmp_path, "foo")
    assert done is not None, error
    assert sorted(done.added) == ["bar==1.0", "foo==1.0"]  # bar: foo's, not the wheel's
    assert (after["foo"], after["bar"], after["apex"]) == ("1.0", "1.0", "0.1+ascend.torch2.0.0")
    assert (after["torch"], after["numpy"]) == ("2.0.0", "2.0")


@pytest.mark.parametrize(
    ("requires", "why"),
    [
        (
            "wantsnpu",
            "could not add them",
        ),  # torch_npu in a venv without it: `import torch` would load it
        ("wantsnumpy", "could not add them"),  # numpy 2.0 -> 3.0: the constraints hold it
        ("many", "install 10 packages (at most 8 are added)"),
    ],
)
def test_a_dependency_that_would_change_the_venv_is_refused_nothing_installed(
    venv, tmp_path, requires, why
):
    before = listed(venv)
    done, error, after = install(venv, tmp_path, requires)
    assert done is None and why in error and "nothing installed" in error, error
    assert "\n" not in error and "Traceback" not in error
    assert after == before  # not apex, not what the wheel requires, not theirs


def test_a_file_other_than_the_one_pips_dry_run_chose_is_not_installed(venv, tmp_path, monkeypatch):
    """The second pip call installs by the sha256 of the file the dry run chose (--require-hashes): an index that
    serves another build of foo 1.0 in between is refused by pip itself, nothing installed."""
    monkeypatch.setattr(run, "_sha256_of", lambda info: "0" * 64)
    before = listed(venv)
    done, error, after = install(venv, tmp_path, "foo")
    assert done is None and "nothing installed" in error and "HASHES" in error, error
    assert after == before
