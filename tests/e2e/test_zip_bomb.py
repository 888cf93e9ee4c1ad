"""A zip bomb from a container or a Slurm job (review 2026-12-01, M8): a real 4.6 MB wheel whose apex/_C.so is 1 GiB
of zeros. The host's zip check refuses it before decompressing anything, and the SBOM step (which a Slurm collect
reaches through distdir.replace_dir) hashes a member as a stream, so both run in a process limited to 600 MB of
address space, and quickly."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

from apexkit import paths

WHEEL = "apex-0.1+ascend.torch2.13.0-cp311-cp311-linux_x86_64.whl"
LIMIT = 600 << 20

PROBE = r"""
import json, resource, sys, time
from pathlib import Path
resource.setrlimit(resource.RLIMIT_AS, (%(limit)d, %(limit)d))
from apexkit import untrusted
from apexkit.wheel import sbom
wheel = Path(sys.argv[1])
out = {}
t = time.monotonic()
try:
    untrusted.check_zip(wheel)
    out["check_zip"] = "accepted"
except untrusted.Untrusted as exc:
    out["check_zip"] = "refused: " + str(exc)
out["check_zip_s"] = time.monotonic() - t
t = time.monotonic()
try:
    facts = sbom._wheel_facts(wheel)
    out["facts"] = [m["size"] for m in facts["modules"]]
except MemoryError:
    out["facts"] = "MemoryError"
out["facts_s"] = time.monotonic() - t
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def bomb(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("bomb") / WHEEL
    zero = b"\0" * (1 << 20)
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as zf:
        zf.writestr("apex/__init__.py", "")
        zf.writestr(
            "apex-0.1+ascend.torch2.13.0.dist-info/METADATA",
            "Metadata-Version: 2.1\nName: apex\nVersion: 0.1+ascend.torch2.13.0\n\n",
        )
        with zf.open("apex/_C.so", "w", force_zip64=True) as fh:
            for _ in range(1024):
                fh.write(zero)
    assert path.stat().st_size < 8 << 20
    return path


def test_a_zip_bomb_is_refused_quickly_and_the_sbom_streams_it_in_bounded_memory(bomb):
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-c", PROBE % {"limit": LIMIT}, str(bomb)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=paths.PACKAGE.parent,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout)
    assert out["check_zip"].startswith("refused: ") and "zip bomb" in out["check_zip"], out
    assert "\n" not in out["check_zip"]
    assert out["check_zip_s"] < 1.0, out  # from the headers: nothing decompressed
    # even past the zip check (a bomb under its caps), the SBOM step hashes 1 GiB in 1 MiB chunks
    assert out["facts"] == [1 << 30], out
    assert time.monotonic() - started < 20
