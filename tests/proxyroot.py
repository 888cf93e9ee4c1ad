"""The proxy commands against a --root test directory standing for /: the fake user's proxy URL, the real `invoke`
command line (no proxy variables of the caller's), and what a tree holds. Shared by tests/unit and tests/e2e."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

from conftest import ROOT

from apexkit.proxy import layers

PASSWORD = "hunter2-Secret"
PROXY = f"http://alice:{PASSWORD}@proxy.corp.example:3128"


def invoke(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
    base.update({"HOME": "/home/alice", "XDG_CONFIG_HOME": "", "DOCKER_CONFIG": ""})
    base = {k: v for k, v in base.items() if v}
    base.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "invoke", "-r", str(ROOT), *args],
        capture_output=True,
        text=True,
        env=base,
        timeout=120,
    )


def snapshot(root: Path) -> dict[str, tuple[bytes, int]]:
    return {
        str(p.relative_to(root)): (p.read_bytes(), stat.S_IMODE(p.stat().st_mode))
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def paths(root: Path, **kwargs) -> layers.Paths:
    return layers.Paths(root=root, environ={"HOME": "/home/alice"}, **kwargs)
