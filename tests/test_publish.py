"""Reproducible wheels and the PEP 503 index, with real fixture builds and a real pip."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

from conftest import ROOT, Runner, output

from apexkit import interpreters

TARGET = "py3.11-torch2.13.0-x86_64-master"
WHEEL = "apex-0.1+ascend-cp311-cp311-linux_x86_64.whl"


def invoke(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "invoke", "-r", str(ROOT), *args], capture_output=True, text=True,
                          timeout=600)


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_two_builds_in_different_directories_and_caches_are_byte_identical(repos, shared_cache, tmp_path):
    wheels = []
    for name, cache in (("one", shared_cache), ("two", tmp_path / "two" / "cache")):  # two caches: two venv paths
        runner = Runner(repos, cache, tmp_path / name)
        proc = runner.nox("3.11", "--no-cache", "--no-smoke-test")
        assert proc.returncode == 0, output(proc)[-3000:]
        wheels.append(runner.dist / TARGET / WHEEL)
        manifest = json.loads((runner.dist / TARGET / "manifest.json").read_text())
        commit_time = subprocess.run(["git", "-C", str(repos.ascend_path), "log", "-1", "--format=%ct", "master"],
                                     capture_output=True, text=True).stdout.strip()
        assert manifest["source_date_epoch"] == int(commit_time)
    assert sha(wheels[0]) == sha(wheels[1])


def test_verify_reproducible_builds_twice_and_records_it(runner):
    proc = runner.nox("3.11", "--verify-reproducible", "--no-smoke-test")
    assert proc.returncode == 0, output(proc)[-3000:]
    text = output(proc)
    assert "reproducibility build a/2" in text and "reproducibility build b/2" in text
    manifest = json.loads((runner.dist / TARGET / "manifest.json").read_text())
    assert manifest["reproducible"] == {"verified": True, "builds": 2, "sha256": manifest["wheel"]["sha256"]}
    assert (runner.build / "reproducible-a").is_dir() and (runner.build / "reproducible-b").is_dir()
    assert sorted(p.name for p in (runner.dist / TARGET).iterdir()) == [WHEEL, "manifest.json"]


def test_index_installs_with_pip_and_refuses_a_second_wheel_under_one_name(runner, repos, tmp_path):
    proc = runner.nox("3.11", "--no-smoke-test")
    assert proc.returncode == 0, output(proc)[-3000:]
    index = tmp_path / "index"
    published = invoke("publish", "--dist", str(runner.dist), "--index", str(index))
    assert published.returncode == 0, output(published)
    page = (index / "simple" / "apex" / "index.html").read_text()
    digest = sha(runner.dist / TARGET / WHEEL)
    assert f'href="{WHEEL}#sha256={digest}"' in page
    assert '<a href="apex/">apex</a>' in (index / "simple" / "index.html").read_text()
    assert sha(index / "simple" / "apex" / WHEEL) == digest

    venv = tmp_path / "venv"
    python311 = interpreters.find("3.11", os.environ).path  # the wheel is cp311, whatever Python runs the tests
    subprocess.run([sys.executable, "-m", "virtualenv", "-q", "-p", python311, str(venv)], check=True)
    install = subprocess.run([str(venv / "bin" / "pip"), "install", "--no-deps", "--no-cache-dir", "--isolated",
                              "--index-url", index.joinpath("simple").as_uri() + "/", "apex"],
                             capture_output=True, text=True)
    assert install.returncode == 0, install.stdout + install.stderr
    listed = subprocess.run([str(venv / "bin" / "pip"), "list", "--format=json"], capture_output=True, text=True)
    assert {"name": "apex", "version": "0.1+ascend"} in json.loads(listed.stdout)

    again = invoke("publish", "--dist", str(runner.dist), "--index", str(index))  # same bytes: idempotent
    assert again.returncode == 0 and (index / "simple" / "apex" / "index.html").read_text() == page

    # another build, same filename, other bytes (without the rpath fix): never two wheels for one name
    other = Runner(repos, runner.cache, tmp_path / "other")
    proc = other.nox("3.11", "--no-smoke-test", "--skip-patch", "rpath-link-flag")
    assert proc.returncode == 0, output(proc)[-3000:]
    assert sha(other.dist / TARGET / WHEEL) != digest
    refused = invoke("publish", "--dist", str(other.dist), "--index", str(index))
    assert refused.returncode == 2
    error = [x for x in refused.stderr.splitlines() if x.startswith("error: ")]
    assert len(error) == 1 and f"the index already holds (from {TARGET}) another wheel under this name" in error[0]
    assert (index / "simple" / "apex" / "index.html").read_text() == page  # untouched
    split = invoke("publish", "--dist", str(other.dist), "--index", str(tmp_path / "split"), "--split-by-torch")
    assert split.returncode == 0 and (tmp_path / "split" / "torch2.13.0" / "simple" / "apex" / WHEEL).is_file()


def test_publish_with_nothing_built(tmp_path):
    proc = invoke("publish", "--dist", str(tmp_path / "empty"), "--index", str(tmp_path / "i"))
    assert proc.returncode == 2 and "does not exist -- next: build first" in proc.stderr
