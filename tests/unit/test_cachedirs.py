"""Issue 27: `apexkit cache.list` / `cache.prune` on a real cache tree laid out as the builders write it: build venvs
with their ready marker, a bare git mirror, wheel-cache entries, uv's cache; old entries made old with os.utime."""

from __future__ import annotations

import fcntl
import json
import os
import time

import pytest

from apexkit.errors import ConfigError
from apexkit.wheel import cachedirs

DAY = 86400


def _age(path, days):
    """Make `path` (everything under it) and its lock file look last used `days` ago."""
    when = time.time() - days * DAY
    for top, _dirs, files in os.walk(path):
        for name in files:
            os.utime(os.path.join(top, name), (when, when), follow_symlinks=False)
    os.utime(path, (when, when))
    lock = path.with_name(path.name + ".lock")
    if lock.exists():
        os.utime(lock, (when, when))


@pytest.fixture
def cache(tmp_path, monkeypatch):
    root = tmp_path / "cache"
    for name, torch, days in (
        ("build-py3.11-aaaa", "2.5.1", 40),
        ("build-py3.10-bbbb", "2.6.0", 1),
    ):
        venv = root / "venvs" / name
        (venv / "bin").mkdir(parents=True)
        (venv / "bin" / "blob").write_bytes(os.urandom(64 * 1024))
        (venv / "apexkit-ready.json").write_text(
            json.dumps({"packages": {"torch": torch, "setuptools": "75"}, "created": 1})
        )
        _age(venv, days)
    mirror = (
        root / "git" / "apex-0123456789ab.git"
    )  # what `git init --bare` makes (tests/e2e runs git itself)
    for sub in ("objects/pack", "refs/heads", "hooks"):
        (mirror / sub).mkdir(parents=True)
    (mirror / "HEAD").write_text("ref: refs/heads/master\n")
    (mirror / "config").write_text(
        '[core]\n\tbare = true\n[remote "origin"]\n\turl = https://gitcode.com/Ascend/apex.git\n'
    )
    _age(mirror, 10)
    for key, days in (("ab" * 32, 50), ("cd" * 32, 2)):
        entry = root / "wheels" / key[:2] / key
        entry.mkdir(parents=True)
        (entry / "apex-0.1+torch2.5-cp311-cp311-linux_x86_64.whl").write_bytes(os.urandom(8192))
        (entry / "manifest.json").write_text(
            json.dumps({"wheel": {"file": "apex-0.1+torch2.5-cp311-cp311-linux_x86_64.whl"}})
        )
        _age(entry, days)
    (root / "uv" / "wheels-v5").mkdir(parents=True)
    (root / "uv" / "wheels-v5" / "x.whl").write_bytes(b"x" * 5000)
    _age(root / "uv", 3)
    for folder in [root, *root.rglob("*")]:
        if folder.is_dir() and not folder.is_symlink():
            folder.chmod(0o755)
    monkeypatch.setenv("APEXKIT_CACHE_DIR", str(root))
    monkeypatch.setenv(
        "APEXKIT_CCACHE", "0"
    )  # cache.list's ccache row would run ccache (tests/e2e does)
    return root


def _names(entries):
    return sorted(e.name for e in entries)


def test_list_gives_kinds_sizes_last_use_and_purpose(cache, capsys):
    entries = {e.name: e for e in cachedirs.scan(cache)}
    venv = entries["venvs/build-py3.11-aaaa"]
    assert venv.kind == "venvs" and venv.what == "build venv python 3.11, torch 2.5.1"
    assert venv.size >= 64 * 1024  # blocks on disk, not the names' lengths
    assert 39 < (time.time() - venv.last_used) / DAY < 41
    assert entries["git/apex-0123456789ab.git"].what == (
        "git mirror of https://gitcode.com/Ascend/apex.git"
    )
    assert entries["wheels/ab/" + "ab" * 32].what.startswith("cached wheel apex-0.1+torch2.5")
    assert entries["uv"].kind == "uv"
    assert cachedirs.list_command(as_json=True) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["trusted"] is True and len(out["entries"]) == 6
    assert out["ccache"].startswith(
        "off (APEXKIT_CCACHE=0"
    )  # the compile cache's row (its use: tests/e2e)
    sums = out["totals"]
    assert sums["all"] == sum(sums[k] for k in cachedirs.KINDS) > 0
    assert sums["venvs"] == sum(e["size"] for e in out["entries"] if e["kind"] == "venvs")


def test_a_hard_linked_file_counts_once_in_the_totals(cache, capsys):
    assert cachedirs.list_command() == 0
    assert "hard-linked" not in capsys.readouterr().out  # nothing shared: the rows add up
    a = cache / "venvs" / "build-py3.11-aaaa" / "bin" / "blob"
    os.link(a, cache / "uv" / "wheels-v5" / "blob")  # uv hard-links its cache into the venvs
    entries = cachedirs.scan(cache)
    sums = cachedirs.totals(entries)
    assert sums["all"] < sum(e.size for e in entries)
    # the listing says why its rows add up to more than its total
    assert cachedirs.list_command() == 0
    assert "a file hard-linked into several entries" in capsys.readouterr().out


def test_prune_by_age_removes_whole_old_entries_only(cache, capsys):
    assert cachedirs.prune_command(older_than="30") == 0
    assert not (cache / "venvs" / "build-py3.11-aaaa").exists()
    assert not (cache / "wheels" / "ab" / ("ab" * 32)).exists()
    left = _names(cachedirs.scan(cache))
    assert left == [
        "git/apex-0123456789ab.git",
        "uv",
        "venvs/build-py3.10-bbbb",
        "wheels/cd/" + "cd" * 32,
    ]
    assert "removed 2 entries" in capsys.readouterr().out


def test_keep_last_keeps_the_most_recent_per_kind(cache):
    assert cachedirs.prune_command(keep_last="1", what="venvs,wheels") == 0
    assert _names(cachedirs.scan(cache, ("venvs", "wheels"))) == [
        "venvs/build-py3.10-bbbb",
        "wheels/cd/" + "cd" * 32,
    ]
    assert (cache / "git" / "apex-0123456789ab.git" / "HEAD").is_file()  # not in --what


def test_dry_run_removes_nothing_and_says_how_much(cache, capsys):
    before = _names(cachedirs.scan(cache))
    assert cachedirs.prune_command(older_than="0", dry_run=True) == 0
    out = capsys.readouterr().out
    assert "would remove 6 entries" in out and "dry run: nothing removed" in out
    assert _names(cachedirs.scan(cache)) == before


def test_an_entry_whose_lock_is_held_is_skipped_in_one_line(cache, capsys):
    venv = cache / "venvs" / "build-py3.11-aaaa"
    fd = os.open(
        str(venv) + ".lock", os.O_RDWR | os.O_CREAT, 0o644
    )  # a build holding it (as locks.hold does)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.utime(str(venv) + ".lock", (1, 1))
        assert cachedirs.prune_command(older_than="30") == 0
    finally:
        os.close(fd)
    assert (venv / "apexkit-ready.json").is_file()
    assert not (cache / "wheels" / "ab" / ("ab" * 32)).exists()  # the rest still went
    err = capsys.readouterr().err
    assert "venvs/build-py3.11-aaaa: in use, skipped" in err


def test_uvs_own_lock_held_by_a_running_uv_skips_it(cache, capsys):
    (cache / "uv" / ".lock").write_text("")
    fd = os.open(cache / "uv" / ".lock", os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)  # a running uv holds it shared
        assert cachedirs.prune_command(older_than="0", what="uv") == 0
    finally:
        os.close(fd)
    assert (cache / "uv" / "wheels-v5" / "x.whl").is_file()
    assert "uv: in use, skipped" in capsys.readouterr().err


def test_a_link_planted_in_the_cache_is_never_followed(cache, tmp_path):
    precious = tmp_path / "precious"
    (precious / "bin").mkdir(parents=True)
    (precious / "bin" / "data").write_bytes(b"keep me" * 1000)
    (cache / "venvs" / "build-py3.9-link").symlink_to(precious)
    (cache / "venvs" / "build-py3.10-bbbb" / "lib").symlink_to(precious)  # a link inside an entry
    entries = {e.name: e for e in cachedirs.scan(cache)}
    assert entries["venvs/build-py3.9-link"].link
    assert entries["venvs/build-py3.9-link"].size < 7000  # the link, not what it points to
    assert cachedirs.prune_command(older_than="0", what="venvs") == 0
    assert (precious / "bin" / "data").read_bytes() == b"keep me" * 1000
    assert not os.path.lexists(cache / "venvs" / "build-py3.9-link")
    assert not (cache / "venvs" / "build-py3.10-bbbb").exists()


def test_an_untrusted_cache_is_refused_in_one_line(cache):
    (cache / "venvs").chmod(0o777)
    with pytest.raises(ConfigError) as exc:
        cachedirs.prune_command(older_than="0")
    assert "not pruning a cache others can write" in exc.value.format()
    assert "\n" not in exc.value.format()
    assert (cache / "venvs" / "build-py3.11-aaaa" / "apexkit-ready.json").is_file()


def test_no_selector_is_refused_not_everything_removed(cache):
    with pytest.raises(ConfigError) as exc:
        cachedirs.prune_command()
    assert "never removes everything" in exc.value.format() and "--dry-run" in exc.value.format()
    with pytest.raises(ConfigError):
        cachedirs.prune_command(older_than="-1")
    with pytest.raises(ConfigError):
        cachedirs.prune_command(keep_last="two")
    with pytest.raises(
        ConfigError
    ):  # nan compares false with every age: it would have selected everything
        cachedirs.prune_command(older_than="nan")
    with pytest.raises(ConfigError):
        cachedirs.prune_command(older_than="1", what="venvs,images")
    assert len(cachedirs.scan(cache)) == 6


def test_a_marker_that_is_not_json_or_a_link_is_read_as_untrusted_input(cache, tmp_path):
    marker = cache / "venvs" / "build-py3.11-aaaa" / "apexkit-ready.json"
    marker.unlink()
    secret = tmp_path / "secret.json"
    secret.write_text(json.dumps({"packages": {"torch": "SECRET"}}))
    marker.symlink_to(secret)
    (cache / "venvs" / "build-py3.10-bbbb" / "apexkit-ready.json").write_text("[\x1b[31m")
    (cache / "venvs" / "build-py3.9-x\nevil\x1b[31m").mkdir()
    whats = {e.name: e.what for e in cachedirs.scan(cache)}
    assert "venvs/build-py3.9-x\\x0aevil\\x1b[31m" in whats  # one line on a terminal
    assert "SECRET" not in whats["venvs/build-py3.11-aaaa"]
    assert whats["venvs/build-py3.10-bbbb"] == "build venv (not ready)"


def test_doctor_shows_the_cache_size_in_one_row(cache):
    from apexkit.doctor import machine

    rows = machine.check_cache(cache)
    assert len(rows) == 1 and rows[0].status == machine.OK
    assert "venvs" in rows[0].detail and "total" in rows[0].detail and "on disk" in rows[0].detail


def test_cache_commands_are_declared():
    from apexkit import commands

    assert {"cache.list", "cache.prune"} <= set(commands.NAMES)


def test_a_cache_grown_past_the_threshold_is_named_with_prune(cache):
    """After a build (issue 41 item 6): the cache's size and `cache prune` once it holds more than
    $APEXKIT_CACHE_WARN_GIB; nothing below it or with 0; a bad value is one ConfigError naming the variable."""
    line = cachedirs.grown_past(cache, {"APEXKIT_CACHE_WARN_GIB": "0.00001"})  # ~10 KiB
    assert line is not None and f"the apexkit cache {cache} holds " in line
    assert (
        "venvs " in line and "wheels " in line and "cache.prune --older-than 30 --dry-run" in line
    )
    assert cachedirs.grown_past(cache, {}) is None  # default 30 GiB
    assert cachedirs.grown_past(cache, {"APEXKIT_CACHE_WARN_GIB": "0"}) is None
    # a bad value is a warning line (the build it follows has its wheel already), never an error
    bad = cachedirs.grown_past(cache, {"APEXKIT_CACHE_WARN_GIB": "lots"})
    assert bad is not None and "WARN_GIB='lots' is not a number from 0 to 100000 -- next: " in bad
    assert "number of GiB" in bad
