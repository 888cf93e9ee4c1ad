"""Issue 26, review items H1 and L6, with real builds of the fixture repos: under umask 000 a build leaves nothing
group/other-writable in its cache or dist/ and still hits its own wheel cache; a venv planted in a world-writable
cache is never run, the build uses a private cache instead (apexkit.cachetrust)."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, output

TARGET = "py3.11-torch2.13.0-x86_64-master"


class Built:
    def __init__(self, repos, top: Path) -> None:
        self.repos, self.top = repos, top
        self.xdg = top / "xdg"
        self.cache = (
            self.xdg / "apexkit"
        )  # the per-user default: the private cache a refused one falls back to

    def build(self, *args: str, umask: int = 0o022, **extra: str) -> subprocess.CompletedProcess:
        env = dict(os.environ)
        env.update(self.repos.env(self.cache))
        env.pop("APEXKIT_CACHE_DIR")
        env.update({"XDG_CACHE_HOME": str(self.xdg), "APEXKIT_FETCH_BACKOFF": "0.05"}, **extra)
        argv = [sys.executable, "-m", "apexkit", "build", "3.11", "--no-smoke-test", *args]
        argv += ["--dist", str(self.top / "dist"), "--build-dir", str(self.top / "build")]
        return subprocess.run(
            argv,
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=900,
            preexec_fn=lambda: os.umask(umask),
        )


@pytest.fixture(scope="module")
def built(repos, tmp_path_factory) -> Built:
    """One real build, under umask 000, into a fresh cache (the compile is this module's one slow step)."""
    b = Built(repos, tmp_path_factory.mktemp("cachetrust"))
    proc = b.build(umask=0)
    assert proc.returncode == 0, output(proc)[-3000:]
    return b


def _uv_lock(path: Path) -> bool:
    """uv's own lock files (uv/**/*.lock, <venv>/.lock): uv makes them 0666 whatever the umask (astral-sh/uv#11328,
    #12665); empty files it only flocks, no content anyone runs or installs."""
    named = path.name == ".lock" or (path.suffix == ".lock" and "uv" in path.parts)
    return named and path.is_file() and path.stat().st_size == 0


def _writable_by_others(top: Path) -> list[str]:
    return sorted(
        f"{oct(stat.S_IMODE(p.lstat().st_mode))} {p}"
        for p in [top, *top.rglob("*")]
        if not p.is_symlink() and p.lstat().st_mode & 0o022 and not _uv_lock(p)
    )


def test_umask_000_leaves_nothing_group_or_other_writable_and_the_wheel_cache_still_hits(built):
    assert _writable_by_others(built.cache) == []
    assert _writable_by_others(built.top / "dist") == []
    for name in ("manifest.json", "sbom.cdx.json", "provenance.json"):
        assert stat.S_IMODE((built.top / "dist" / TARGET / name).stat().st_mode) == 0o644
    again = built.build(umask=0)
    text = output(again)
    assert again.returncode == 0, text[-3000:]
    assert "✓ wheel cache hit" in text and "not using" not in text
    assert _writable_by_others(built.cache) == []


def test_a_venv_planted_in_a_world_writable_cache_is_not_run(built, tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    marker = tmp_path / "PWNED"
    # the planted venv sits where this build's venv is (the name is a hash of public inputs), marked ready
    for venv in (built.cache / "venvs").glob("build-py3.11-*"):
        if not venv.is_dir():
            continue
        planted = shared / "venvs" / venv.name
        (planted / "bin").mkdir(parents=True)
        (planted / "apexkit-ready.json").write_text(json.dumps({"packages": {}, "created": 0}))
        for name in ("python", "python3", "python3.11"):
            (planted / "bin" / name).write_text(
                f"#!/bin/sh\necho PLANTED-PYTHON-RAN-AS-$(id -un) > {marker}\nexit 1\n"
            )
            (planted / "bin" / name).chmod(0o777)
    assert list((shared / "venvs").iterdir())
    for path in [shared, *shared.rglob("*")]:
        path.chmod(0o777)
    proc = built.build(APEXKIT_CACHE_DIR=str(shared))
    text = output(proc)
    assert proc.returncode == 0, text[-3000:]
    assert not marker.exists(), marker.read_text()
    lines = [line for line in text.splitlines() if "not using any of it" in line]
    assert len(lines) == 1 and f"the apexkit cache {shared} is world-writable" in lines[0]
    assert f"using the private cache {built.cache}" in lines[0]
    assert "✓ wheel cache hit" in text  # the private cache is a real one: its wheel is used
    assert not (shared / "git").exists() and not (shared / "wheels").exists()
