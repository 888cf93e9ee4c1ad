"""Issue 27: `python -m apexkit cache.list --json` and `cache.prune` as a user runs them, on a cache holding a real
bare git mirror (`git init --bare`), a build venv with its ready marker and a wheel-cache entry, while another
process holds the lock a build takes on one of them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from conftest import ROOT

HOLDER = """
import sys
from pathlib import Path
from apexkit import locks
with locks.hold(Path(sys.argv[1]), "the build venv"):
    print("held", flush=True)
    sys.stdin.read()
"""


def _apexkit(env, *args):
    return subprocess.run(
        [sys.executable, "-m", "apexkit", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=60,
    )


def test_cache_list_and_prune_as_subprocesses(tmp_path):
    cache = tmp_path / "cache"
    mirror = cache / "git" / "apex-0123456789ab.git"
    mirror.parent.mkdir(parents=True)
    subprocess.run(["git", "init", "-q", "--bare", str(mirror)], check=True)
    subprocess.run(
        [
            "git",
            "--git-dir",
            str(mirror),
            "remote",
            "add",
            "origin",
            "https://gitcode.com/Ascend/apex.git",
        ],
        check=True,
    )
    venv = cache / "venvs" / "build-py3.11-0123456789abcdef"
    (venv / "bin").mkdir(parents=True)
    (venv / "apexkit-ready.json").write_text(json.dumps({"packages": {"torch": "2.5.1"}}))
    wheel = cache / "wheels" / "ab" / ("ab" * 32)
    wheel.mkdir(parents=True)
    (wheel / "manifest.json").write_text(json.dumps({"wheel": {"file": "apex-0.1-cp311.whl"}}))
    old = time.time() - 90 * 86400
    for path in (venv / "apexkit-ready.json", venv, wheel / "manifest.json", wheel):
        os.utime(path, (old, old))
    for folder in [cache, *cache.rglob("*")]:
        if folder.is_dir():
            folder.chmod(0o755)
    env = dict(os.environ, APEXKIT_CACHE_DIR=str(cache), PYTHONPATH=str(ROOT))

    listed = _apexkit(env, "cache.list", "--json")
    assert listed.returncode == 0, listed.stderr
    rows = {e["name"]: e for e in json.loads(listed.stdout)["entries"]}
    assert (
        rows["git/apex-0123456789ab.git"]["for"]
        == "git mirror of https://gitcode.com/Ascend/apex.git"
    )
    assert rows["git/apex-0123456789ab.git"]["size"] > 0
    assert (
        rows["venvs/build-py3.11-0123456789abcdef"]["for"] == "build venv python 3.11, torch 2.5.1"
    )

    dry = _apexkit(env, "cache.prune", "--older-than", "0", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert "would remove 3 entries" in dry.stdout and (mirror / "HEAD").is_file() and venv.is_dir()

    bare = _apexkit(env, "cache.prune")
    assert bare.returncode == 2 and bare.stderr.count("\n") == 1
    assert (
        bare.stderr.startswith("error: ")
        and " -- next: python -m apexkit cache.prune" in bare.stderr
    )

    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(venv)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        aged = _apexkit(env, "cache.prune", "--older-than", "30", "--dry-run")
        pruned = _apexkit(env, "cache.prune", "--keep-last", "0", "--what", "venvs")
    finally:
        holder.communicate("", timeout=20)
    # a build holding the venv's lock uses it now: not 90 days old any more
    assert "venvs/" not in aged.stdout and "wheels/ab/" in aged.stdout
    assert pruned.returncode == 0, pruned.stderr
    assert venv.is_dir() and "venvs/build-py3.11-0123456789abcdef: in use, skipped" in pruned.stderr
    assert "removed 0 entries" in pruned.stdout and "1 skipped" in pruned.stdout

    pruned = _apexkit(env, "cache.prune", "--older-than", "30")
    assert pruned.returncode == 0, pruned.stderr
    assert not wheel.exists() and (mirror / "HEAD").is_file() and venv.is_dir()
    assert "removed 1 entry" in pruned.stdout
