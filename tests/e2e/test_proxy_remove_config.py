"""Issue 41 item 7: `proxy.remove` undoes `proxy.setup --write-config`: the index_url that setup recorded in the user
config file is taken out again (the other keys stay), and an index_url changed since is kept with one line saying so.
Real apexkit commands under --root, a real config file."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from conftest import ROOT

from apexkit import config

MIRROR = "http://127.0.0.1:9/simple/"


def proxy(fsroot: Path, command: str, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("XDG_CONFIG_HOME", "PIP_INDEX_URL")}
    env["HOME"] = "/home/alice"
    argv = [sys.executable, "-m", "apexkit", command, "--root", str(fsroot), *args]
    return subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)


def set_up(fsroot: Path) -> Path:
    done = proxy(fsroot, "proxy.setup", "--layers", "pip", "--pip-index", MIRROR, "--write-config")
    assert done.returncode == 0, done.stderr[-2000:]
    written = fsroot / "home/alice/.config/apexkit/config.toml"
    assert config.read_file(written, "user")["index_url"] == MIRROR
    return written


def test_proxy_remove_takes_out_the_index_url_setup_wrote_and_keeps_the_rest(fsroot):
    written = set_up(fsroot)
    table = dict(config.read_file(written, "user"), wheelhouses=["/srv/wheels"])
    written.write_text(config.render(table))  # a key of the user's own, beside setup's
    dry = proxy(fsroot, "proxy.remove", "--dry-run")
    assert dry.returncode == 0 and f'-index_url = "{MIRROR}"' in dry.stdout, dry.stderr
    assert config.read_file(written, "user")["index_url"] == MIRROR  # --dry-run wrote nothing
    done = proxy(fsroot, "proxy.remove")
    assert done.returncode == 0, done.stderr[-2000:]
    assert config.read_file(written, "user") == {"wheelhouses": ("/srv/wheels",)}
    assert (written.stat().st_mode & 0o777) == 0o600
    assert "written: /home/alice/.config/apexkit/config.toml" in done.stderr
    assert (
        not (fsroot / "etc/pip.conf").exists()
        or MIRROR not in (fsroot / "etc/pip.conf").read_text()
    )


def test_an_index_url_changed_since_setup_is_kept_and_said(fsroot):
    written = set_up(fsroot)
    written.write_text(config.render({"index_url": "https://other.example/simple/"}))
    done = proxy(fsroot, "proxy.remove")
    assert done.returncode == 0, done.stderr[-2000:]
    assert config.read_file(written, "user") == {"index_url": "https://other.example/simple/"}
    kept = [line for line in done.stderr.splitlines() if "kept: index_url" in line]
    assert kept == [
        "kept: index_url in /home/alice/.config/apexkit/config.toml (not the mirror proxy.setup wrote; edit the "
        "file to remove it)"
    ], done.stderr
