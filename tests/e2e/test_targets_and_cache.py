"""Issue 13 items 6 and 7 with real builds of the fixture sources: a second local checkout does not replace the
first without --force, and a poisoned cache hit is rebuilt (--test-cached smoke-tests a good hit). The target ids
and the cache as untrusted input, in-process, are in tests/unit/test_targets_and_cache.py."""

from __future__ import annotations

import hashlib
import json
import subprocess
import zipfile

import fakes
import wheelnames
from conftest import output

BASE = "py3.11-torch2.13.0-x86_64-master"
WHEEL = wheelnames.fixture_wheel()  # manylinux_2_24 where auditwheel computes it


def test_a_second_local_checkout_does_not_replace_the_first_without_force(runner, repos, tmp_path):
    first, second = tmp_path / "a" / "apex", tmp_path / "b" / "apex"
    target = runner.dist / "py3.11-torch2.13.0-x86_64-local"
    fakes.target_dir(runner.dist, target.name, {"apex_src": str(first)})
    (target / WHEEL).write_bytes(b"the first checkout's wheel")
    subprocess.run(["git", "clone", "-q", str(repos.ascend_path), str(second)], check=True)
    proc = runner.cli("3.11", "--apex-src", str(second))
    assert proc.returncode == 2, output(proc)[-2000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert (
        len(errors) == 1
        and f"apex_src: {first} there, {second} now" in errors[0]
        and "--force" in errors[0]
    )
    assert "▸ sources" not in output(proc)  # refused before any work
    assert (target / WHEEL).read_bytes() == b"the first checkout's wheel"
    assert runner.cli("3.11", "--apex-src", str(second), "--dry-run", "--force").returncode == 0


def test_a_poisoned_hit_rebuilds_and_test_cached_smoke_tests_a_hit(runner):
    """Real builds: a cached wheel replaced by a text file with a matching sha256 is refused and rebuilt; a good hit
    with --test-cached gets the smoke test (installed in a fresh venv) and says so in its manifest."""
    first = runner.nox("3.11", "--no-smoke-test")
    assert first.returncode == 0, output(first)[-3000:]
    key = json.loads((runner.dist / BASE / "manifest.json").read_text())["cache_key"]
    entry = runner.cache / "wheels" / key[:2] / key
    good = (entry / WHEEL).read_bytes()
    planted = b"not a zip\n"
    (entry / WHEEL).write_bytes(planted)
    manifest = json.loads((entry / "manifest.json").read_text())
    manifest["wheel"]["sha256"] = hashlib.sha256(planted).hexdigest()
    (entry / "manifest.json").write_text(json.dumps(manifest))

    again = runner.nox("3.11", "--no-smoke-test")
    assert again.returncode == 0, output(again)[-3000:]
    assert "refused" in output(again) and "▸ compile" in output(again)
    published = (runner.dist / BASE / WHEEL).read_bytes()
    assert zipfile.is_zipfile(runner.dist / BASE / WHEEL) and published != planted
    assert (entry / WHEEL).read_bytes() == published  # the rebuilt wheel replaced the planted entry
    assert published == good  # reproducible: the rebuild is the wheel the cache held before

    hit = runner.nox("3.11", "--test-cached")
    assert hit.returncode == 0, output(hit)[-3000:]
    assert (
        "wheel cache hit" in output(hit)
        and "▸ compile" not in output(hit)
        and "▸ smoke test" in output(hit)
    )
    manifest = json.loads((runner.dist / BASE / "manifest.json").read_text())
    assert manifest["cache_hit"] is True and manifest["smoke_test"]["on_cache_hit"] is True
    assert manifest["smoke_test"]["modules"]["apex_C"]["ok"]
