"""What `nox -s tests` may change on this machine: nothing, unless asked.

Installing Debian packages (docker.io, tinyproxy, debootstrap, qemu-user-static, binfmt-support, chromium for the index
page, and munge, slurmctld, slurmd, slurm-client for the fleet tests' private Slurm cluster) and registering a
binfmt handler are host-wide changes, so they happen only when asked for: `APEXKIT_INSTALL_SYSTEM_TOOLS=1`, or `CI=true`
(`APEXKIT_INSTALL_SYSTEM_TOOLS=0` wins over CI), and only as root with apt-get. Then a missing service fails its
tests (APEXKIT_REQUIRE_SERVICES=1), so CI never passes by skipping. Otherwise the tests that need a missing tool skip,
naming the command that installs it (`skip_reason`).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from tools import systools

OPT_IN = "APEXKIT_INSTALL_SYSTEM_TOOLS"
# command -> Debian package, for every command the build and the tests use (the docker CLI comes with docker.io)
ALL_TOOLS = {
    **systools.DEBIAN_PACKAGES,
    **systools.TEST_PACKAGES,
    **systools.QEMU_PACKAGES,
    "docker": "docker.io",
    "scontrol": "slurm-client",
    "squeue": "slurm-client",
    "scancel": "slurm-client",
}


def install_requested(environ: Mapping[str, str]) -> bool:
    """APEXKIT_INSTALL_SYSTEM_TOOLS=1, or CI=true without APEXKIT_INSTALL_SYSTEM_TOOLS=0."""
    explicit = environ.get(OPT_IN, "").strip().lower()
    if explicit:
        return explicit in ("1", "true", "yes")
    return environ.get("CI", "").strip().lower() in ("1", "true")


@dataclass(frozen=True)
class Plan:
    """What the tests session does to the system before pytest runs."""

    install: tuple[
        str, ...
    ] = ()  # missing commands whose Debian packages to install (systools.ensure takes these)
    register_binfmt: bool = False  # QEMU aarch64 through binfmt_misc
    require_services: bool = False  # a missing service fails its tests instead of skipping them
    not_installed: tuple[str, ...] = ()  # missing test/QEMU tools left alone (their tests skip)
    missing_build_tools: tuple[
        str, ...
    ] = ()  # missing git/g++/patch...: the session stops, naming the command


def decide(
    environ: Mapping[str, str],
    can_install: bool,
    missing: Callable[[Sequence[str]], list[str]] = systools.missing,
) -> Plan:
    """The plan for this machine: pure but for `missing` (which commands are not on PATH)."""
    build = tuple(missing(tuple(systools.DEBIAN_PACKAGES)))
    extra = tuple(missing((*systools.TEST_PACKAGES, *systools.QEMU_PACKAGES)))
    if install_requested(environ) and can_install:
        return Plan(install=(*build, *extra), register_binfmt=True, require_services=True)
    return Plan(not_installed=extra, missing_build_tools=build)


def packages(commands: Sequence[str]) -> tuple[str, ...]:
    return tuple(sorted({ALL_TOOLS.get(c, c) for c in commands}))


def install_command(commands: Sequence[str]) -> str:
    """The one command that installs what provides `commands` (Debian/Ubuntu)."""
    sudo = "" if os.geteuid() == 0 else "sudo "
    return f"{sudo}apt-get install -y --no-install-recommends {' '.join(packages(commands))}"


def skip_reason(*commands: str) -> str:
    """Why a test that needs `commands` is skipped, and the exact command that would let it run."""
    absent = [c for c in commands if shutil.which(c) is None] or list(commands)
    return (
        f"{', '.join(absent)} not installed -- install: {install_command(absent)} "
        f"(or let the tests install them, as root: {OPT_IN}=1 nox -s tests)"
    )
