"""Reproducible wheels and the PEP 503 index, with real fixture builds and a real pip."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import fakes
import pytest
import wheelnames
from conftest import ROOT, Runner, output

from apexkit.wheel import distdir, interpreters, wheelcheck

TARGET = "py3.11-torch2.13.0-x86_64-master"
WHEEL = wheelnames.fixture_wheel()  # manylinux_2_24 where auditwheel computes it


def invoke(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "invoke", "-r", str(ROOT), *args],
        capture_output=True,
        text=True,
        timeout=600,
    )


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_two_builds_in_different_directories_and_caches_are_byte_identical(
    repos, shared_cache, tmp_path
):
    wheels = []
    for name, cache in (
        ("one", shared_cache),
        ("two", tmp_path / "two" / "cache"),
    ):  # two caches: two venv paths
        runner = Runner(repos, cache, tmp_path / name)
        proc = runner.nox("3.11", "--no-cache", "--no-smoke-test")
        assert proc.returncode == 0, output(proc)[-3000:]
        wheels.append(runner.dist / TARGET / WHEEL)
        manifest = json.loads((runner.dist / TARGET / "manifest.json").read_text())
        commit_time = subprocess.run(
            ["git", "-C", str(repos.ascend_path), "log", "-1", "--format=%ct", "master"],
            capture_output=True,
            text=True,
        ).stdout.strip()
        assert manifest["source_date_epoch"] == int(commit_time)
    assert sha(wheels[0]) == sha(wheels[1])


def test_verify_reproducible_builds_twice_and_records_it(runner):
    proc = runner.nox("3.11", "--verify-reproducible", "--no-smoke-test")
    assert proc.returncode == 0, output(proc)[-3000:]
    text = output(proc)
    assert "reproducibility build a/2" in text and "reproducibility build b/2" in text
    manifest = json.loads((runner.dist / TARGET / "manifest.json").read_text())
    assert manifest["reproducible"] == {
        "verified": True,
        "builds": 2,
        "sha256": manifest["wheel"]["sha256"],
    }
    assert (runner.build / "reproducible-a").is_dir() and (runner.build / "reproducible-b").is_dir()
    assert sorted(p.name for p in (runner.dist / TARGET).iterdir()) == [
        WHEEL,
        "manifest.json",
        "provenance.json",
        "sbom.cdx.json",
    ]


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
    python311 = interpreters.find(
        "3.11", os.environ
    ).path  # the wheel is cp311, whatever Python runs the tests
    subprocess.run(
        [sys.executable, "-m", "virtualenv", "-q", "-p", python311, str(venv)], check=True
    )
    install = subprocess.run(
        [
            str(venv / "bin" / "pip"),
            "install",
            "--no-deps",
            "--no-cache-dir",
            "--isolated",
            "--index-url",
            index.joinpath("simple").as_uri() + "/",
            "apex",
        ],
        capture_output=True,
        text=True,
    )
    assert install.returncode == 0, install.stdout + install.stderr
    listed = subprocess.run(
        [str(venv / "bin" / "pip"), "list", "--format=json"], capture_output=True, text=True
    )
    assert {"name": "apex", "version": "0.1+ascend.torch2.13.0"} in json.loads(listed.stdout)

    again = invoke(
        "publish", "--dist", str(runner.dist), "--index", str(index)
    )  # same bytes: idempotent
    assert again.returncode == 0 and (index / "simple" / "apex" / "index.html").read_text() == page
    # the pages publish writes beside simple/ are its own: the republish above kept them, and they name the wheel
    metadata = index / "simple" / "apex" / f"{WHEEL}.metadata"
    assert metadata.is_file() and f'data-core-metadata="sha256={sha(metadata)}"' in page
    assert WHEEL in (index / "index.html").read_text()
    assert f"simple/apex/{WHEEL}#sha256={digest}" in (index / "torch-2.13.0.html").read_text()

    # another build, same filename, other bytes (without the rpath fix): never two wheels for one name
    other = Runner(repos, runner.cache, tmp_path / "other")
    proc = other.nox("3.11", "--no-smoke-test", "--skip-patch", "rpath-link-flag")
    assert proc.returncode == 0, output(proc)[-3000:]
    trap = f"{TARGET}+skip-rpath-link-flag"  # its own target; publish takes a diagnosis build only when named
    trap_manifest = json.loads((other.dist / trap / "manifest.json").read_text())
    if trap_manifest["wheel"]["file"] != WHEEL:
        # without NEEDED libstdc++ its symbols allow an older manylinux tag, hence another file name (issue 16);
        # retagged by hand to the good wheel's name (dist/<trap> rewritten with it), it must still be refused
        tool = next((runner.cache / "venvs").glob("build-py3.11-*/bin/python"))
        work = tmp_path / "retag"
        work.mkdir()
        copy = Path(shutil.copy(other.dist / trap / trap_manifest["wheel"]["file"], work))
        renamed = wheelcheck.retag(
            copy, {"computed": True, "tag": wheelnames.platform_tag()}, "x86_64", tool, 0
        )
        trap_manifest["wheel"] = {
            "file": renamed.name,
            "sha256": sha(renamed),
            "size": renamed.stat().st_size,
        }
        # recorded as its build's tag too: a wheel whose tag contradicts its manifest is refused (issue 41 item 9)
        trap_manifest["identity"]["manylinux_tag"] = wheelnames.platform_tag()
        distdir.replace_dir(other.dist, trap, {renamed.name: renamed}, trap_manifest, force=True)
    assert sha(other.dist / trap / WHEEL) != digest
    refused = invoke("publish", "--dist", str(other.dist), "--index", str(index), "--target", trap)
    assert refused.returncode == 2
    error = [x for x in refused.stderr.splitlines() if x.startswith("error: ")]
    assert (
        len(error) == 1
        and f"the index already holds (from {TARGET}) another wheel under this name" in error[0]
    )
    assert (index / "simple" / "apex" / "index.html").read_text() == page  # untouched
    split = invoke(
        "publish",
        "--dist",
        str(other.dist),
        "--index",
        str(tmp_path / "split"),
        "--split-by-torch",
        "--target",
        trap,
    )
    assert (
        split.returncode == 0
        and (tmp_path / "split" / "torch2.13.0" / "simple" / "apex" / WHEEL).is_file()
    )


def test_publish_with_nothing_built(tmp_path):
    proc = invoke("publish", "--dist", str(tmp_path / "empty"), "--index", str(tmp_path / "i"))
    assert proc.returncode == 2 and "does not exist -- next: build first" in proc.stderr


# --- trust boundaries (issue 13, items 3 and 4): fake dists and index directories laid out as an attacker or an
# unlucky user would leave them; no build needed. The wheel bytes are never opened as a zip by publish.


def fake_dist(
    tmp: Path,
    *,
    file: str = WHEEL,
    torch: str = "2.13.0",
    data: bytes = b"wheel bytes",
    sha256: str | None = None,
    target: str = TARGET,
) -> Path:
    """dist/<target>/ with a manifest and (when `file` is a plain name) the wheel beside it."""
    dist = tmp / "dist"
    folder = dist / target
    folder.mkdir(parents=True, exist_ok=True)
    if "/" not in file and not (folder / file).exists():
        (folder / file).write_bytes(data)
    manifest = {
        "wheel": {"file": file, "sha256": sha256 or hashlib.sha256(data).hexdigest()},
        "target": {"torch": torch},
    }
    (folder / "manifest.json").write_text(json.dumps(manifest))
    return dist


def refused(proc: subprocess.CompletedProcess, *needles: str) -> str:
    """Exit 2, one `error: cause -- next: step` line naming every needle, no traceback."""
    assert proc.returncode == 2, output(proc)
    assert "Traceback" not in output(proc), output(proc)
    errors = [x for x in proc.stderr.splitlines() if x.startswith("error: ")]
    assert len(errors) == 1 and " -- next: " in errors[0], proc.stderr
    for needle in needles:
        assert needle in errors[0], errors[0]
    return errors[0]


def tree(path: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(path)): (b"<dir>" if p.is_dir() else p.read_bytes())
        for p in sorted(path.rglob("*"))
    }


def no_leftovers(parent: Path) -> None:
    assert not [p.name for p in parent.iterdir() if ".tmp-" in p.name or ".old-" in p.name]


def test_publish_refuses_a_non_empty_directory_that_is_not_an_apexkit_index(tmp_path):
    dist = fake_dist(tmp_path)
    webroot = tmp_path / "www"  # an existing web root (or `--index ~`): a site, a key, a subfolder
    (webroot / ".ssh").mkdir(parents=True)
    (webroot / "index.html").write_text("<h1>my site</h1>")
    (webroot / ".ssh" / "id_rsa").write_text("KEY")
    before = tree(webroot)
    for dry in ((), ("--dry-run",)):
        proc = invoke("publish", "--dist", str(dist), "--index", str(webroot), *dry)
        refused(proc, str(webroot), "not an apexkit index")
        assert tree(webroot) == before
    no_leftovers(tmp_path)


def test_publish_index_dot_in_a_project_is_refused(tmp_path):
    dist = fake_dist(tmp_path)
    project = tmp_path / "project"
    project.mkdir()
    (project / "setup.py").write_text("print('mine')\n")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "invoke",
            "-r",
            str(ROOT),
            "publish",
            "--dist",
            str(dist),
            "--index",
            ".",
        ],
        cwd=project,
        capture_output=True,
        text=True,
        timeout=600,
    )
    refused(proc, "not an apexkit index")
    assert tree(project) == {"setup.py": b"print('mine')\n"}
    no_leftovers(tmp_path)


def test_publish_keeps_an_apexkit_index_and_refuses_files_it_did_not_write(tmp_path):
    dist = fake_dist(tmp_path)
    index = tmp_path / "index"
    index.mkdir()  # an empty directory is fine: nothing to lose
    assert invoke("publish", "--dist", str(dist), "--index", str(index)).returncode == 0
    data = json.loads((index / "index.json").read_text())
    assert data["format"] == "apexkit-index/1"  # the marker that says: apexkit wrote this directory
    assert (
        invoke("publish", "--dist", str(dist), "--index", str(index)).returncode == 0
    )  # ours: replaced
    (index / "simple" / "apex" / "notes.txt").write_text("someone else's")
    before = tree(index)
    refused(invoke("publish", "--dist", str(dist), "--index", str(index)), "simple/apex/notes.txt")
    assert tree(index) == before
    no_leftovers(tmp_path)


def published_then_edited(dist: Path, tmp_path: Path, edit) -> Path:
    """Publish `dist` into tmp_path/index, then change its index.json with `edit` (what a hand or a tool did)."""
    index = tmp_path / "index"
    assert invoke("publish", "--dist", str(dist), "--index", str(index)).returncode == 0
    data = json.loads((index / "index.json").read_text())
    edit(data)
    (index / "index.json").write_text(json.dumps(data))
    return index


def test_publish_accepts_an_index_written_before_the_marker(tmp_path):
    dist = fake_dist(tmp_path)
    index = published_then_edited(dist, tmp_path, lambda data: data.pop("format"))
    assert invoke("publish", "--dist", str(dist), "--index", str(index)).returncode == 0
    assert json.loads((index / "index.json").read_text())["format"] == "apexkit-index/1"


def test_publish_dry_run_says_what_it_would_replace(tmp_path):
    dist = fake_dist(tmp_path)
    index = tmp_path / "index"
    new = tmp_path / "new"
    dry = invoke("publish", "--dist", str(dist), "--index", str(new), "--dry-run")
    assert dry.returncode == 0 and f"would create {new}" in dry.stderr and not new.exists()
    assert invoke("publish", "--dist", str(dist), "--index", str(index)).returncode == 0
    before = tree(index)
    dry = invoke("publish", "--dist", str(dist), "--index", str(index), "--dry-run")
    assert dry.returncode == 0, output(dry)
    assert f"would replace {index}" in dry.stderr and "index.json" in dry.stderr, dry.stderr
    assert "simple/apex/index.html" in dry.stderr and "nothing else" in dry.stderr, dry.stderr
    assert tree(index) == before


def test_publish_refuses_a_poisoned_index_json(tmp_path):
    """index.json is read back on the next publish: its names must not reach outside the index either."""
    secret = tmp_path / "secret"
    secret.write_bytes(b"KEY")
    secret.chmod(0o600)
    dist = fake_dist(tmp_path)
    index = tmp_path / "index"
    assert invoke("publish", "--dist", str(dist), "--index", str(index)).returncode == 0
    data = json.loads((index / "index.json").read_text())
    data["files"].append(
        {
            "project": "apex",
            "filename": "../../../secret",
            "sha256": hashlib.sha256(b"KEY").hexdigest(),
            "target": "x",
            "torch": "2.13.0",
        }
    )
    (index / "index.json").write_text(json.dumps(data))
    before = tree(index)
    refused(invoke("publish", "--dist", str(dist), "--index", str(index)), "index.json", "filename")
    assert tree(index) == before and secret.read_bytes() == b"KEY"


def test_publish_refuses_a_torch_that_is_not_a_version(tmp_path):
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "data").write_text("precious")
    index = tmp_path / "index"
    for torch in ("/../../victim", "2.13.0/../../../victim", "../victim"):
        dist = fake_dist(tmp_path, torch=torch)
        proc = invoke("publish", "--dist", str(dist), "--index", str(index), "--split-by-torch")
        refused(proc, str(dist / TARGET / "manifest.json"), "target.torch")
        assert (victim / "data").read_text() == "precious" and sorted(os.listdir(victim)) == [
            "data"
        ]
        assert not index.exists()
    no_leftovers(tmp_path)


def secret_key(tmp_path: Path) -> Path:
    key = tmp_path / "home" / ".ssh" / "id_rsa"
    key.parent.mkdir(parents=True)
    key.write_bytes(b"-----BEGIN OPENSSH PRIVATE KEY-----\n")
    key.chmod(0o600)
    return key


def test_publish_refuses_a_wheel_file_outside_its_target(tmp_path):
    key = secret_key(tmp_path)
    digest = sha(key)
    index = tmp_path / "index"
    for file in ("../../home/.ssh/id_rsa", str(key)):
        dist = fake_dist(tmp_path, file=file, sha256=digest)
        proc = invoke("publish", "--dist", str(dist), "--index", str(index))
        refused(proc, str(dist / TARGET / "manifest.json"), "wheel.file")
        assert not index.exists() and key.stat().st_mode & 0o777 == 0o600


def test_publish_refuses_a_symlinked_wheel_and_a_file_that_is_not_a_wheel(tmp_path):
    key = secret_key(tmp_path)
    index = tmp_path / "index"
    dist = fake_dist(
        tmp_path, file="id_rsa", data=key.read_bytes()
    )  # a plain name, but not a wheel's
    refused(invoke("publish", "--dist", str(dist), "--index", str(index)), "wheel.file", "id_rsa")
    (dist / TARGET / "id_rsa").unlink()
    (dist / TARGET / WHEEL).symlink_to(key)  # a wheel's name, but a link to the key
    fake_dist(tmp_path, sha256=sha(key))
    refused(invoke("publish", "--dist", str(dist), "--index", str(index)), "wheel.file", "symlink")
    assert not index.exists()


def test_publish_refuses_a_target_folder_that_leads_out_of_dist(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / WHEEL).write_bytes(b"elsewhere")
    (outside / "manifest.json").write_text(
        json.dumps(
            {
                "wheel": {"file": WHEEL, "sha256": sha(outside / WHEEL)},
                "target": {"torch": "2.13.0"},
            }
        )
    )
    dist = tmp_path / "dist"
    dist.mkdir()
    (dist / TARGET).symlink_to(outside)
    index = tmp_path / "index"
    # dist/ itself fails the output trust rule: it holds a link (issue 40)
    refused(
        invoke("publish", "--dist", str(dist), "--index", str(index)),
        f"{dist} is holding {TARGET}, which is a link",
    )
    assert not index.exists()


def test_publish_refuses_a_manifest_that_is_not_json_or_lacks_a_field(tmp_path):
    dist = fake_dist(tmp_path)
    manifest = dist / TARGET / "manifest.json"
    manifest.write_text("{not json")
    refused(invoke("publish", "--dist", str(dist), "--index", str(tmp_path / "i")), str(manifest))
    manifest.write_text(json.dumps({"wheel": {"file": WHEEL}, "target": {"torch": "2.13.0"}}))
    refused(
        invoke("publish", "--dist", str(dist), "--index", str(tmp_path / "i")),
        str(manifest),
        "wheel.sha256",
    )
    assert not (tmp_path / "i").exists()


def test_publish_refuses_a_symlink_planted_in_an_index(tmp_path):
    secret = tmp_path / "secret"
    secret.mkdir()
    (secret / WHEEL).write_bytes(b"KEY")
    dist = fake_dist(tmp_path, data=b"KEY")
    index = tmp_path / "index"
    assert invoke("publish", "--dist", str(dist), "--index", str(index)).returncode == 0
    shutil.rmtree(index / "simple" / "apex")
    (index / "simple" / "apex").symlink_to(
        secret
    )  # the next publish would read (and rmtree) through it
    refused(
        invoke("publish", "--dist", str(dist), "--index", str(index)), "simple/apex (a symlink)"
    )
    assert (secret / WHEEL).read_bytes() == b"KEY" and (index / "simple" / "apex").is_symlink()


@fakes.needs_root
def test_publish_refuses_an_index_in_a_folder_another_user_owns_before_writing_anything(tmp_path):
    """Issue 40, second hostile pass, finding 1: `--index` inside a folder the real uid 65534 owns (they could swap
    the new index while root writes it, and point root's writes and chmods at root's own files) is refused in one
    line naming the folder and the fix; nothing is written there, not even the lock."""
    secret = tmp_path / "secret"
    secret.write_text("root only\n")
    secret.chmod(0o600)
    alice = tmp_path / "alice"
    alice.mkdir()
    fakes.users_link(alice / "index.json", str(secret))
    os.chown(alice, fakes.NOBODY, fakes.NOBODY)
    dist = fake_dist(tmp_path)
    for index in (alice / "index", alice / "index" / "deeper"):
        line = refused(invoke("publish", "--dist", str(dist), "--index", str(index)), "--index")
        assert (
            f"the output directory {index} is inside {alice}, which is owned by uid 65534" in line
        )
    assert sorted(p.name for p in alice.iterdir()) == ["index.json"]
    assert secret.read_text() == "root only\n" and secret.stat().st_mode & 0o777 == 0o600


def test_publish_leaves_a_diagnosis_build_out_unless_named(tmp_path):
    """Issue 13 item 7: a --skip-patch build has its own target (…+skip-ID); publish ships the good wheel and leaves
    the trap out (same wheel name, other bytes), unless --target names it."""
    dist = fake_dist(tmp_path, data=b"the good wheel")
    trap = f"{TARGET}+skip-rpath-link-flag"
    fake_dist(tmp_path, data=b"the trap", target=trap)
    manifest = dist / trap / "manifest.json"
    manifest.write_text(
        json.dumps(
            {
                **json.loads(manifest.read_text()),
                "target": {"torch": "2.13.0", "identity": {"skip_patches": ["rpath-link-flag"]}},
            }
        )
    )
    index = tmp_path / "index"
    proc = invoke("publish", "--dist", str(dist), "--index", str(index))
    assert proc.returncode == 0, output(proc)
    assert f"skipping {trap}: a diagnosis build (--skip-patch)" in proc.stderr
    assert [p.read_bytes() for p in index.rglob("*.whl")] == [b"the good wheel"]
    named = invoke(
        "publish", "--dist", str(dist), "--index", str(tmp_path / "trap-index"), "--target", trap
    )
    assert named.returncode == 0, output(named)
    assert [p.read_bytes() for p in (tmp_path / "trap-index").rglob("*.whl")] == [b"the trap"]


def test_wheels_for_two_torches_share_one_index(tmp_path):
    """Issue 16: the local label names the torch, so two builds for two torches are two files of one project page;
    no per-torch directories."""
    npu_wheel = "apex-0.1+ascend.torch2.7.1.npu2.7.1.post8-cp311-cp311-linux_x86_64.whl"
    dist = fake_dist(tmp_path, data=b"for torch 2.13.0")
    fake_dist(
        tmp_path,
        file=npu_wheel,
        torch="2.7.1",
        data=b"for torch 2.7.1",
        target="py3.11-torch2.7.1-x86_64-master+npu2.7.1.post8",
    )
    index = tmp_path / "index"
    proc = invoke("publish", "--dist", str(dist), "--index", str(index))
    assert proc.returncode == 0, output(proc)
    page = (index / "simple" / "apex" / "index.html").read_text()
    assert f'href="{WHEEL}#sha256=' in page and f'href="{npu_wheel}#sha256=' in page
    # no per-torch directories: the root holds the index, its grid and one find-links page per torch
    assert sorted(p.name for p in index.iterdir()) == [
        "index.html",
        "index.json",
        "simple",
        "torch-2.13.0.html",
        "torch-2.7.1.html",
    ]
    assert (index / "simple" / "apex" / npu_wheel).read_bytes() == b"for torch 2.7.1"


def test_publish_refuses_a_fifo_manifest_without_blocking(tmp_path):
    """The review's case: dist/<target>/manifest.json is a FIFO; publish used to block forever reading it."""
    dist = fake_dist(tmp_path)
    folder = dist / "t2"
    folder.mkdir()
    os.mkfifo(folder / "manifest.json")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "invoke",
            "-r",
            str(ROOT),
            "publish",
            "--dist",
            str(dist),
            "--index",
            str(tmp_path / "index"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    refused(proc, "manifest.json is not a readable JSON manifest", "is not a regular file")
    assert not (tmp_path / "index").exists()


# --- issue 16: the SBOM and provenance go into the index beside their wheel ------------------------------------------


def wheel_zip(version: str = "0.1+ascend.torch2.13.0") -> bytes:
    import io
    import zipfile

    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as zf:
        zf.writestr(
            f"apex-{version}.dist-info/METADATA",
            f"Metadata-Version: 2.1\nName: apex\nVersion: {version}\n\n",
        )
    return out.getvalue()


def attested_dist(tmp: Path, target: str = TARGET) -> Path:
    """fake_dist plus the SBOM and provenance apexkit.wheel.sbom writes for that wheel, recorded in its manifest."""
    from apexkit.wheel import sbom

    dist = fake_dist(tmp, target=target, data=wheel_zip())
    folder = dist / target
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["target"]["target_id"] = target
    for name, text in sbom.documents(manifest, folder / WHEEL).items():
        (folder / name).write_bytes(text)
    (folder / "manifest.json").write_text(json.dumps(manifest))
    return dist


def test_publish_copies_sbom_and_provenance_beside_each_wheel(tmp_path):
    dist = attested_dist(tmp_path)
    index = tmp_path / "index"
    proc = invoke("publish", "--dist", str(dist), "--index", str(index))
    assert proc.returncode == 0, output(proc)
    assert "+ .cdx.json, .provenance.json" in proc.stderr
    folder = index / "simple" / "apex"
    assert sorted(p.name for p in folder.iterdir()) == sorted(
        [
            WHEEL,
            f"{WHEEL}.cdx.json",
            f"{WHEEL}.provenance.json",
            f"{WHEEL}.manifest.json",
            f"{WHEEL}.metadata",  # PEP 658 (apexkit.index.pages)
            "index.html",
        ]
    )
    # the build's manifest beside its wheel: the index is a wheel cache (apexkit.index.remote)
    assert (folder / f"{WHEEL}.manifest.json").read_bytes() == (
        dist / TARGET / "manifest.json"
    ).read_bytes()
    assert (folder / f"{WHEEL}.cdx.json").read_bytes() == (
        dist / TARGET / "sbom.cdx.json"
    ).read_bytes()
    assert (folder / f"{WHEEL}.provenance.json").read_bytes() == (
        dist / TARGET / "provenance.json"
    ).read_bytes()
    entry = json.loads((index / "index.json").read_text())["files"][0]
    assert entry["manifest"] == {
        "filename": f"{WHEEL}.manifest.json",
        "sha256": sha(dist / TARGET / "manifest.json"),
    }
    assert entry["facts"]["torch"] == "2.13.0" and entry["facts"]["python_tag"] == "cp311"
    assert entry["attestations"] == {
        "sbom": {"filename": f"{WHEEL}.cdx.json", "sha256": sha(folder / f"{WHEEL}.cdx.json")},
        "provenance": {
            "filename": f"{WHEEL}.provenance.json",
            "sha256": sha(folder / f"{WHEEL}.provenance.json"),
        },
    }
    assert (
        ".json" not in (folder / "index.html").read_text()
    )  # the PEP 503 page lists distributions only

    # a second wheel (another target) gets its own pair; the first pair stays, re-checked from the index
    second = "apex-0.1+ascend.torch2.7.1-cp311-cp311-manylinux_2_24_x86_64.whl"
    other = tmp_path / "other"
    attested_dist(other, target="py3.11-torch2.7.1-x86_64-master")
    (other / "dist" / "py3.11-torch2.7.1-x86_64-master" / WHEEL).rename(
        other / "dist" / "py3.11-torch2.7.1-x86_64-master" / second
    )
    folder2 = other / "dist" / "py3.11-torch2.7.1-x86_64-master"
    manifest = json.loads((folder2 / "manifest.json").read_text())
    manifest["wheel"]["file"] = second
    from apexkit.wheel import sbom

    for name, text in sbom.documents(manifest, folder2 / second).items():
        (folder2 / name).write_bytes(text)
    (folder2 / "manifest.json").write_text(json.dumps(manifest))
    proc = invoke("publish", "--dist", str(other / "dist"), "--index", str(index))
    assert proc.returncode == 0, output(proc)
    assert "keep 1 published wheel and 3 manifest/SBOM/provenance files" in proc.stderr
    assert {p.name for p in folder.iterdir()} >= {
        f"{second}.cdx.json",
        f"{second}.provenance.json",
        f"{WHEEL}.cdx.json",
        f"{WHEEL}.provenance.json",
    }


@pytest.mark.parametrize("fault", ["tampered", "missing", "other wheel", "symlink"])
def test_publish_refuses_an_sbom_or_provenance_that_is_not_the_recorded_one(tmp_path, fault):
    dist = attested_dist(tmp_path)
    folder = dist / TARGET
    index = tmp_path / "index"
    assert invoke("publish", "--dist", str(dist), "--index", str(index)).returncode == 0
    before = tree(index)
    statement = folder / "provenance.json"
    if fault == "tampered":
        statement.write_text(statement.read_text().replace('"_type"', '"_type" ', 1))
        needles = ("provenance.json does not match the sha256 in its manifest",)
    elif fault == "missing":
        statement.unlink()
        needles = ("provenance.json does not exist",)
    elif fault == "other wheel":  # a statement about another wheel, its sha256 recorded to match
        text = statement.read_text().replace(WHEEL, "apex-0.1-cp311-cp311-linux_x86_64.whl")
        statement.write_text(text)
        manifest = json.loads((folder / "manifest.json").read_text())
        manifest["attestations"]["provenance"]["sha256"] = hashlib.sha256(text.encode()).hexdigest()
        (folder / "manifest.json").write_text(json.dumps(manifest))
        needles = ("has no subject", WHEEL)
    else:
        statement.unlink()
        statement.symlink_to("/etc/passwd")
        needles = ("provenance.json is a symlink",)
    refused(invoke("publish", "--dist", str(dist), "--index", str(index)), *needles)
    assert tree(index) == before  # nothing half-written
    no_leftovers(tmp_path)


def test_publish_refuses_an_index_json_whose_attestation_names_leave_the_index(tmp_path):
    dist = attested_dist(tmp_path)
    index = published_then_edited(
        dist,
        tmp_path,
        lambda data: data["files"][0]["attestations"]["sbom"].update(
            filename="../../../etc/cron.d/x"
        ),
    )
    refused(
        invoke("publish", "--dist", str(dist), "--index", str(index)), "attestations.sbom.filename"
    )


# --- issue 41 item 9 (review F6): one wheel per target id; a wheel's tags agree with its manifest ----------------------


def test_publish_keeps_the_newest_wheel_per_target_and_refuses_a_retagged_one(runner, tmp_path):
    """A real fixture build, then that wheel as a rebuild would leave it (another file name: `wheel tags --build`)
    and as someone renaming it would (`wheel tags --platform-tag`, the manifest's wheel rewritten to match, its
    recorded tag left): the index keeps the newest wheel of the target and names the one it drops; a wheel whose
    tag contradicts the glibc floor or the machine its manifest records is refused, the index untouched."""
    proc = runner.nox("3.11", "--no-smoke-test")
    assert proc.returncode == 0, output(proc)[-3000:]
    manifest = json.loads((runner.dist / TARGET / "manifest.json").read_text())
    tool = next((runner.cache / "venvs").glob("build-py3.11-*/bin/python"))
    built = manifest.get("built") or manifest["created"]  # a cache hit: the build it came from
    index = tmp_path / "index"
    assert invoke("publish", "--dist", str(runner.dist), "--index", str(index)).returncode == 0

    def variant(name: str, *tags: str, created: str = built, **edit: dict) -> Path:
        """dist <name>/<TARGET>: the fixture wheel after `wheel tags ...`, with its manifest rewritten to match."""
        work = tmp_path / name
        work.mkdir()
        shutil.copy(runner.dist / TARGET / WHEEL, work)
        if tags:
            subprocess.run(
                [tool, "-m", "wheel", "tags", "--remove", *tags, WHEEL], cwd=work, check=True
            )
        wheel = next(work.glob("*.whl"))
        changed = {**json.loads(json.dumps(manifest)), "created": created, "built": created}
        changed["wheel"] = {"file": wheel.name, "sha256": sha(wheel), "size": wheel.stat().st_size}
        for key, value in edit.items():
            changed[key] = {**changed[key], **value}
        changed.pop(
            "attestations", None
        )  # written again for the renamed wheel (distdir.replace_dir)
        distdir.replace_dir(work / "dist", TARGET, {wheel.name: wheel}, changed, force=True)
        return work / "dist"

    def wheels() -> list[str]:
        return sorted(
            f["filename"] for f in json.loads((index / "index.json").read_text())["files"]
        )

    # a rebuild of the target under another name, an hour later: it replaces the published one, which is named
    newer = variant("newer", "--build", "2", created=_later(built, 3600))
    rebuilt = WHEEL.replace("-cp311-", "-2-cp311-", 1)
    proc = invoke("publish", "--dist", str(newer), "--index", str(index))
    assert proc.returncode == 0, output(proc)
    assert wheels() == [rebuilt] and not (index / "simple" / "apex" / WHEEL).exists()
    line = [x for x in proc.stderr.splitlines() if "one wheel per target id" in x]
    assert len(line) == 1 and f"keeping {rebuilt}" in line[0], proc.stderr
    assert f"dropping the older {WHEEL} (built {built}, published before)" in line[0]
    # an older build of the same target arriving later: the newer published one stays, the older is named
    older = variant("older", "--build", "1", created=_later(built, -3600))
    proc = invoke("publish", "--dist", str(older), "--index", str(index))
    assert proc.returncode == 0, output(proc)
    assert wheels() == [rebuilt]
    assert f"dropping the older {WHEEL.replace('-cp311-', '-1-cp311-', 1)}" in proc.stderr

    before = tree(index)
    recorded = manifest["identity"]["manylinux_tag"] or "no manylinux tag"
    for name, tags, edit, needles in (
        # review F6: renamed to a newer glibc than its build computed
        ("up", ("--platform-tag", "manylinux_2_39_x86_64"), {}, ("tag manylinux_2_39_x86_64", recorded)),
        # the reverse: renamed to an older glibc, so pip would take it where it cannot load
        ("down", ("--platform-tag", "manylinux_2_17_x86_64"), {}, ("tag manylinux_2_17_x86_64", recorded)),
        # the machine: an x86_64 wheel whose manifest says it was built for aarch64
        ("arch", (), {"target": {"arch": "aarch64"}}, ("is for x86_64", "target.arch is aarch64")),
    ):  # fmt: skip
        proc = invoke("publish", "--dist", str(variant(name, *tags, **edit)), "--index", str(index))
        refused(proc, *needles, "-- next: rebuild " + TARGET)
        assert tree(index) == before


def _later(stamp: str, seconds: int) -> str:
    import calendar
    import time

    epoch = calendar.timegm(time.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ")) + seconds
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch))
