from __future__ import annotations

import base64
import functools
import http.server
import os
import subprocess
import sys
import threading
import urllib.parse

import fixture_repos
import pytest
from conftest import ROOT
from fakes import NOBODY, needs_root

from apexkit import locks
from apexkit.errors import ConfigError, SourceError
from apexkit.wheel import sources

FAST = sources.RetryPolicy(attempts=3, backoff=0.01)


def test_mirror_resolves_refs_and_fetches_only_what_is_missing(repos, tmp_path):
    mirror = sources.Mirror(repos.nvidia_url, tmp_path, FAST)
    assert not mirror.has_commit(repos.nvidia_pin)
    assert mirror.ensure_commit(repos.nvidia_pin, offline=False) == repos.nvidia_pin
    # Present now: offline works, and no fetch is needed (the URL may even be gone).
    gone = sources.Mirror(repos.nvidia_url, tmp_path, FAST)
    gone.url = "file:///nonexistent/repo"
    assert gone.ensure_commit(repos.nvidia_pin, offline=True) == repos.nvidia_pin
    ascend = sources.Mirror(repos.ascend_url, tmp_path, FAST)
    master = ascend.resolve("master", offline=False)
    assert (
        master
        == subprocess.run(
            ["git", "-C", str(repos.ascend_path), "rev-parse", "master"],
            capture_output=True,
            text=True,
        ).stdout.strip()
    )
    assert ascend.resolve("5.0.rc3", offline=True) != master


def test_pinned_sha_that_is_not_in_the_repository_is_refused(repos, tmp_path):
    # The "NVIDIA" URL points at the wrong repository: the pin cannot be verified.
    wrong = sources.Mirror(repos.ascend_url, tmp_path, FAST)
    with pytest.raises(SourceError, match=f"pinned commit {repos.nvidia_pin} is not in"):
        wrong.ensure_commit(repos.nvidia_pin, offline=False)
    with pytest.raises(SourceError, match="not a full 40-hex commit SHA"):
        wrong.ensure_commit(repos.nvidia_pin[:12], offline=False)


def test_unknown_ref_lists_branches(repos, tmp_path):
    with pytest.raises(SourceError) as exc:
        sources.Mirror(repos.ascend_url, tmp_path, FAST).resolve("5.0.rc2", offline=False)
    assert "ref '5.0.rc2' not found" in exc.value.cause and "5.0.rc3" in exc.value.cause


def test_unreachable_url_is_retried_then_a_clear_error(tmp_path, capsys):
    mirror = sources.Mirror("file:///nonexistent/ascend-apex.git", tmp_path, FAST)
    with pytest.raises(SourceError) as exc:
        mirror.resolve("master", offline=False)
    assert "after 3 attempts" in exc.value.cause and "APEXKIT_ASCEND_APEX_URL" in exc.value.hint
    err = capsys.readouterr().err
    assert "attempt 1/3" in err and "attempt 2/3" in err


def test_generated_tree_reproduces_build_sh_without_running_it(repos, tmp_path, monkeypatch):
    marker = tmp_path / "ran"
    monkeypatch.setenv("APEXKIT_FIXTURE_MARKER", str(marker))
    ascend_mirror = sources.Mirror(repos.ascend_url, tmp_path / "cache", FAST)
    sha = ascend_mirror.resolve("master", offline=False)
    ascend = sources.checkout_ascend(ascend_mirror, sha, tmp_path / "ascend")
    assert ascend.pinned_nvidia_commit() == repos.nvidia_pin  # read from scripts/build.sh
    assert sources.flags_of(ascend.root) == ("--cpp_ext",)
    nvidia = sources.Mirror(repos.nvidia_url, tmp_path / "cache", FAST)
    nvidia.ensure_commit(repos.nvidia_pin, offline=False)
    tree = tmp_path / "tree"
    (tree / "stale").mkdir(parents=True)
    sources.generate_tree(ascend, nvidia, repos.nvidia_pin, tree)
    assert not (tree / "stale").exists()  # a fresh tree every time
    setup = (tree / "setup.py").read_text()
    assert (
        "def get_package_dir():" in setup and "version='0.1-ascend'" in setup
    )  # npu.patch applied to the pin
    assert (tree / "csrc/combine_tensors/change_dataptr.cpp").is_file()  # src/ copied over the root
    assert (tree / "apex/contrib/combine_tensors/combine_tensors.py").is_file()
    assert (tree / "tests/L0/device.py").is_file() and (tree / "tests/L0/run_test.py").is_file()
    assert (
        not (tree / ".git").exists() and not (tree / "README.md").exists()
    )  # the pin, not the branch head
    assert not marker.exists()


def test_apex_src_is_copied_never_modified(repos, tmp_path):
    checkout = tmp_path / "my-apex"
    subprocess.run(["git", "clone", "-q", str(repos.ascend_path), str(checkout)], check=True)
    (checkout / "src/apex/contrib/combine_tensors/combine_tensors.py").write_text(
        "LOCAL_FIX = True\n"
    )
    before = {
        p: p.read_bytes() for p in checkout.rglob("*") if p.is_file() and ".git" not in p.parts
    }
    copy = sources.copy_ascend(checkout, tmp_path / "copy")
    assert copy.dirty and copy.commit.startswith("local:")
    (copy.root / "patch" / "npu.patch").write_text("changed in the copy")
    after = {
        p: p.read_bytes() for p in checkout.rglob("*") if p.is_file() and ".git" not in p.parts
    }
    assert before == after


# --- two builds on one cache, credentials, the cache path ------------------------------------------------------------

# Says "ready", waits for argv[3] to appear (so all processes start fetching at the same moment), then fills the mirror of argv[1]
# in the cache argv[2] the way a build does: the branch, then the pinned NVIDIA commit argv[4].
FETCH = """
import os, sys, time
from pathlib import Path
from apexkit.wheel import sources
url, cache, go, pin = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3]), sys.argv[4]
print("ready", flush=True)
while not go.exists():
    time.sleep(0.0002)
mirror = sources.Mirror(url, cache, sources.RetryPolicy(1, 0.01))
print(mirror.ensure_commit(pin, offline=False), flush=True)
"""


def _fetchers(repos, cache, go, n=2):
    """n processes, each imported and polling for `go` (touch it to start them together)."""
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", FETCH, repos.nvidia_url, str(cache), str(go), repos.nvidia_pin],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(n)
    ]
    for proc in procs:
        assert proc.stdout.readline() == "ready\n", proc.communicate()
    return procs


def test_two_processes_filling_one_empty_cache_both_succeed_with_one_mirror(repos, tmp_path):
    # before the mirror lock: "OSError: [Errno 39] Directory not empty: '...git.tmpNNN' -> '...git'" in one of them
    cache, go = tmp_path / "cache", tmp_path / "go"
    procs = _fetchers(repos, cache, go, n=3)
    go.touch()
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err[-2000:]
        assert out.strip() == repos.nvidia_pin
        assert "Traceback" not in err
    mirrors = sorted(p.name for p in (cache / "git").iterdir() if p.is_dir())
    assert len(mirrors) == 1 and mirrors[0].endswith(".git"), mirrors  # no .tmp left behind either


def test_a_fetch_waits_for_the_mirror_lock_then_reuses_what_the_holder_fetched(repos, tmp_path):
    cache, go = tmp_path / "cache", tmp_path / "go"
    go.touch()
    mirror = sources.Mirror(repos.nvidia_url, cache, FAST)
    with locks.hold(mirror.path, "held by the test"):  # the first build, on an empty cache
        (proc,) = _fetchers(repos, cache, go, n=1)
        line = proc.stderr.readline()
        assert line.startswith(
            f"waiting for the lock on git mirror {mirror.path.name} held by pid {os.getpid()}"
        ), line
        mirror.ensure_commit(
            repos.nvidia_pin, offline=False
        )  # re-entrant: this thread holds the lock already
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0 and out.strip() == repos.nvidia_pin, err
    assert "+ git" not in err  # the commit was there once the lock came free: no fetch of its own


TOKEN = (
    "glpat-Zq8/secret#tok@en"  # reserved characters: percent-encoded in the URL, decoded for git
)


class _AuthGitHandler(http.server.SimpleHTTPRequestHandler):
    """git's dumb HTTP protocol over a directory of bare repositories, behind Basic auth."""

    expected = "Basic " + base64.b64encode(f"ci-bot:{TOKEN}".encode()).decode()

    def do_GET(self):  # http.server's name for it
        if self.headers.get("Authorization") != self.expected:
            self.send_response(401)
            self.send_header("WWW-Authenticate", 'Basic realm="git"')
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        super().do_GET()

    def log_message(self, *args):
        pass


@pytest.fixture
def private_http_repo(repos, tmp_path, monkeypatch):
    served = tmp_path / "served"
    subprocess.run(
        ["git", "clone", "-q", "--bare", str(repos.ascend_path), str(served / "ascend.git")],
        check=True,
    )
    subprocess.run(["git", "-C", str(served / "ascend.git"), "update-server-info"], check=True)
    handler = functools.partial(_AuthGitHandler, directory=str(served))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    for name in (
        "http_proxy",
        "HTTP_PROXY",
        "https_proxy",
        "HTTPS_PROXY",
        "all_proxy",
        "ALL_PROXY",
    ):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("no_proxy", "127.0.0.1")
    yield f"http://127.0.0.1:{server.server_address[1]}/ascend.git"
    server.shutdown()
    server.server_close()


def _files_holding(root, secret: bytes) -> list[str]:
    return [str(p) for p in root.rglob("*") if p.is_file() and secret in p.read_bytes()]


def test_credentials_in_the_url_never_reach_the_mirror_or_the_output(
    repos, private_http_repo, tmp_path, capsys
):
    public = private_http_repo
    url = public.replace("http://", f"http://ci-bot:{urllib.parse.quote(TOKEN, safe='')}@")
    cache = tmp_path / "cache"
    with pytest.raises(SourceError):  # the server really wants the token
        sources.Mirror(public, cache, FAST).resolve("master", offline=False)
    mirror = sources.Mirror(url, cache, FAST)
    assert mirror.url == public
    master = mirror.resolve(
        "master", offline=False
    )  # the token travelled through git's environment only
    assert (
        master
        == subprocess.run(
            ["git", "-C", str(repos.ascend_path), "rev-parse", "master"],
            capture_output=True,
            text=True,
        ).stdout.strip()
    )
    config = subprocess.run(
        ["git", "--git-dir", str(mirror.path), "config", "remote.origin.url"],
        capture_output=True,
        text=True,
    ).stdout.strip()
    assert config == public
    secrets = (TOKEN.encode(), urllib.parse.quote(TOKEN, safe="").encode(), b"Zq8")
    for secret in secrets:
        assert _files_holding(cache, secret) == []
    # a mirror an older apexkit made with the credentialed URL in its config is cleaned by the next fetch
    subprocess.run(
        ["git", "--git-dir", str(mirror.path), "remote", "set-url", "origin", url], check=True
    )
    assert _files_holding(cache, b"Zq8")
    sources.Mirror(url, cache, FAST).resolve("master", offline=False)
    assert _files_holding(cache, b"Zq8") == []
    wrong = url.replace("Zq8", "Xx1")
    with pytest.raises(SourceError) as exc:
        sources.Mirror(wrong, cache, FAST).resolve("master", offline=False)
    out = capsys.readouterr()
    for secret in (*secrets, b"Xx1"):
        assert secret.decode() not in out.out + out.err + exc.value.format()


def test_cache_dir_naming_a_file_is_one_line(tmp_path):
    afile = tmp_path / "cache-file"
    afile.write_text("")
    assert (
        sources.cache_dir({"APEXKIT_CACHE_DIR": str(tmp_path / "new" / "cache")})
        == tmp_path / "new" / "cache"
    )
    for value, says in (
        (afile, "is not a directory"),
        (afile / "sub", f"lies under {afile}, which is not a directory"),
    ):
        with pytest.raises(ConfigError) as exc:
            sources.cache_dir({"APEXKIT_CACHE_DIR": str(value)})
        assert says in exc.value.cause and "APEXKIT_CACHE_DIR" in exc.value.format()
    env = dict(os.environ, APEXKIT_CACHE_DIR=str(afile))
    proc = subprocess.run(
        [sys.executable, "-m", "apexkit", "build", "3.11", "--dry-run"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        f"error: the apexkit cache {afile} (APEXKIT_CACHE_DIR) is not a directory -- next: point APEXKIT_CACHE_DIR "
        "at a directory (or unset it: ~/.cache/apexkit)"
    ]


# --- issue 41 items 2 and 3: local mirrors offline, another user's mirror, a mirror with holes -------------------


def _fetches(err: str) -> int:
    return sum(1 for line in err.splitlines() if line.startswith("+ git") and " fetch " in line)


def test_a_local_mirror_serves_offline_with_a_fresh_cache_and_a_path_is_its_file_url(
    repos, tmp_path
):
    by_url = sources.Mirror(repos.nvidia_url, tmp_path, FAST)
    by_path = sources.Mirror(str(repos.nvidia_path) + "/", tmp_path, FAST)
    assert by_path.url == repos.nvidia_url and by_path.path == by_url.path  # one cache entry
    assert by_path.ensure_commit(repos.nvidia_pin, offline=True) == repos.nvidia_pin
    ascend = sources.Mirror(str(repos.ascend_path), tmp_path, FAST)
    assert ascend.resolve("5.0.rc3", offline=True) == fixture_repos.git(
        repos.ascend_path, "rev-parse", "5.0.rc3"
    )
    assert sorted(p.name for p in (tmp_path / "git").glob("*.git")) == sorted(
        {by_url.path.name, ascend.path.name}
    )
    # a network URL is still never fetched offline
    remote = sources.Mirror("https://127.0.0.1:9/apex.git", tmp_path, FAST)
    with pytest.raises(SourceError, match="is not in the cache"):
        remote.ensure_commit(repos.nvidia_pin, offline=True)


@needs_root
def test_a_mirror_owned_by_another_user_is_one_line_with_gits_cause_and_fix(repos, tmp_path, capfd):
    theirs = tmp_path / "theirs.git"
    fixture_repos.git(tmp_path, "clone", "-q", "--bare", str(repos.nvidia_path), str(theirs))
    subprocess.run(["chown", "-R", f"{NOBODY}:{NOBODY}", str(theirs)], check=True)
    with pytest.raises(SourceError) as exc:
        sources.Mirror(f"file://{theirs}", tmp_path / "cache", FAST).ensure_commit(
            repos.nvidia_pin, offline=False
        )
    assert f"detected dubious ownership in repository at '{theirs}'" in exc.value.cause
    assert exc.value.hint == (
        f"git config --global --add safe.directory {theirs}, or use a mirror you own"
    )
    err = capfd.readouterr().err
    assert _fetches(err) == 1 and "attempt" not in err  # diagnosed once, never retried


def test_a_mirror_lacking_an_object_is_diagnosed_once_and_a_shallow_mirror_of_it_serves(
    repos, tmp_path, capfd
):
    holed = tmp_path / "holed.git"
    fixture_repos.git(tmp_path, "init", "-q", "--bare", str(holed))
    fixture_repos.git(
        holed, "-c", "fetch.unpackLimit=100000", "fetch", "-q", repos.nvidia_url, "master:master"
    )
    old = fixture_repos.git(repos.nvidia_path, "rev-parse", f"{repos.nvidia_pin}:setup.py")
    (holed / "objects" / old[:2] / old[2:]).unlink()  # a blob only the old commit names
    with pytest.raises(SourceError) as exc:
        sources.Mirror(f"file://{holed}", tmp_path / "a", FAST).ensure_commit(
            repos.nvidia_head, offline=False
        )
    assert f"lacks objects its history names (unable to read {old})" in exc.value.cause
    assert "known failure 'git-mirror-incomplete'" in exc.value.hint
    assert "git -C M.git fetch --depth 1 <mirror> <commit>" in exc.value.hint
    err = capfd.readouterr().err
    assert _fetches(err) == 1 and "attempt" not in err  # once: no retry, no second refspec
    # the fix it names: a shallow mirror of the commit the build needs, made from that same mirror, served offline
    shallow = fixture_repos.shallow_mirror(
        f"file://{holed}",
        tmp_path / "shallow.git",
        f"{repos.nvidia_head}:refs/tags/pin-{repos.nvidia_head}",
    )
    mirror = sources.Mirror(str(shallow), tmp_path / "b", FAST)
    assert mirror.ensure_commit(repos.nvidia_head, offline=True) == repos.nvidia_head
    mirror.export(repos.nvidia_head, tmp_path / "tree")
    assert (tmp_path / "tree" / "README.md").read_text() == "later upstream work\n"


def test_a_fetch_that_fails_names_the_air_gapped_recipe(tmp_path):
    """issue 41 A: the hint named only the proxy and a reachable mirror; a site with no network needs the mirror
    recipe and --offline --wheelhouse."""

    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    mirror = sources.Mirror("file:///nonexistent/apex.git", cache, sources.RetryPolicy(1, 0.0))
    with pytest.raises(SourceError) as err:
        mirror.fetch(["master"])
    line = err.value.format()
    assert line.startswith("could not fetch file:///nonexistent/apex.git after 1 attempts"), line
    assert line.endswith(
        "with no network: a local mirror and --offline --wheelhouse DIR "
        "(docs/building.md#mirrors-for-air-gapped-sites)"
    ), line
