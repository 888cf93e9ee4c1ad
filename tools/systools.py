"""The system tools a build (and the test suite) needs, installed with the distro's package manager when missing."""

from __future__ import annotations

import os
import shutil
import subprocess

from apexkit import log
from apexkit.errors import EnvironmentSetupError

# command -> Debian package that provides it
DEBIAN_PACKAGES = {
    "git": "git",
    "patch": "patch",
    "g++": "g++",
    "gcc": "gcc",
    "readelf": "binutils",
    "diff": "diffutils",
    "tar": "tar",
}
# what the test suite needs on top: a real proxy, a real Docker engine, base images without a registry
TEST_PACKAGES = {
    "tinyproxy": "tinyproxy",
    "dockerd": "docker.io",
    "debootstrap": "debootstrap",
    # a private Slurm cluster for the fleet tests (tests/services.py SlurmCluster)
    "munged": "munge",
    # ccache's remote storage for the compile-cache tests (tests/e2e/test_compile_cache.py starts it on 127.0.0.1)
    "redis-server": "redis-server",
    "slurmctld": "slurmctld",
    "slurmd": "slurmd",
    "sbatch": "slurm-client",
    # the published index's HTML page rendered in a real browser (tests/e2e/test_index_job.py)
    "chromium": "chromium",
}
# aarch64 containers on an x86_64 host: QEMU user emulation registered through binfmt_misc
QEMU_PACKAGES = {"qemu-aarch64-static": "qemu-user-static", "update-binfmts": "binfmt-support"}


def can_install() -> bool:
    """Root with apt-get: missing Debian packages can be installed here."""
    return shutil.which("apt-get") is not None and os.geteuid() == 0


def missing(commands=tuple(DEBIAN_PACKAGES)) -> list[str]:
    return [c for c in commands if shutil.which(c) is None]


def ensure(commands=tuple(DEBIAN_PACKAGES), dry_run: bool = False) -> list[str]:
    """Install what is missing (apt-get, as root); returns the packages installed (or that would be)."""
    absent = missing(commands)
    if not absent:
        return []
    packages = sorted({{**DEBIAN_PACKAGES, **TEST_PACKAGES, **QEMU_PACKAGES}[c] for c in absent})
    if dry_run:
        return packages
    if shutil.which("apt-get") is None or os.geteuid() != 0:
        raise EnvironmentSetupError(
            f"missing tools: {', '.join(absent)}",
            f"install them with your package manager ({' '.join(packages)} on Debian)",
        )
    for argv in (
        ["apt-get", "update", "-qq"],
        ["apt-get", "install", "-y", "-qq", "--no-install-recommends", *packages],
    ):
        log.echo_command(argv)
        subprocess.run(argv, check=True, env=dict(os.environ, DEBIAN_FRONTEND="noninteractive"))
    return packages
