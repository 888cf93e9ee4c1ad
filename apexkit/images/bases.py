"""Local base images without a registry: debootstrap a Debian root file system once (cached as a tarball),
then `docker import` it into whichever daemon needs it.

debootstrap honours http_proxy, so it works behind the proxy that `invoke proxy.setup` configures.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path

from apexkit import cachetrust, config, dockerclient, log, vocab
from apexkit.errors import EnvironmentSetupError

DEBIAN_MIRROR = "http://deb.debian.org/debian"


def rootfs_tarball(
    suite: str = "bookworm",
    arch: str = "amd64",
    variant: str = "minbase",
    include: Sequence[str] = (),
    mirror: str | None = None,
) -> Path:
    """A cached tarball of a debootstrapped root file system (made on first use, about a minute)."""
    extra = (
        "-" + hashlib.sha256(",".join(sorted(include)).encode()).hexdigest()[:8] if include else ""
    )
    target = cachetrust.root() / "base-images" / f"debian-{suite}-{arch}-{variant}{extra}.tar"
    if target.is_file():
        return target
    if shutil.which("debootstrap") is None:
        raise EnvironmentSetupError("debootstrap is not installed", "apt-get install debootstrap")
    if os.geteuid() != 0:
        raise EnvironmentSetupError("debootstrap needs root", "run as root (or with sudo)")
    if not mirror:  # APEXKIT_DEBIAN_MIRROR, else debian_mirror of the config files (apexkit.config)
        mirror = config.load().get("debian_mirror", default=DEBIAN_MIRROR).text
    target.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="rootfs-", dir=target.parent))
    try:
        argv = ["debootstrap", f"--variant={variant}", f"--arch={arch}"]
        if include:
            argv.append("--include=" + ",".join(include))
        argv += [suite, str(work / "rootfs"), mirror]
        with log.step(f"debootstrap {suite} ({arch}, {variant})"):
            log.echo_command(argv)
            result = subprocess.run(argv, capture_output=True, text=True)
            if result.returncode != 0:
                tail = (result.stdout + result.stderr).strip().splitlines()[-1:]
                raise EnvironmentSetupError(
                    f"debootstrap failed: {log.mask(''.join(tail))}",
                    "check the mirror (APEXKIT_DEBIAN_MIRROR, or debian_mirror in the config file) and the "
                    f"proxy ({vocab.command('proxy.check')})",
                )
            partial = work / "rootfs.tar"
            subprocess.run(
                ["tar", "--numeric-owner", "-C", str(work / "rootfs"), "-cf", str(partial), "."],
                check=True,
            )
            os.replace(partial, target)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return target


def import_image(
    client, tarball: Path, repository: str, tag: str = "latest", changes: Sequence[str] = ()
) -> str:
    """`docker import` the tarball unless the daemon already has repository:tag. Returns the reference.

    `changes` are Dockerfile instructions applied on import (e.g. a LABEL with the real architecture)."""
    reference = f"{repository}:{tag}"
    if dockerclient.get_image(client, reference) is not None:
        return reference
    with log.step(f"docker import {tarball.name} as {reference}"):
        client.api.import_image_from_file(
            str(tarball), repository=repository, tag=tag, changes=list(changes) or None
        )
    return reference
