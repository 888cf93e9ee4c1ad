"""The one Docker client (the Docker SDK): a daemon that answered a ping, images by name, architectures by our
names. Used by images, proxy.check and doctor; it knows nothing of what the images hold."""

from __future__ import annotations

import logging
import os
import platform

from apexkit import log
from apexkit.errors import ConfigError, ImageError

LABEL = "org.apexkit"  # our image labels: <LABEL>.arch, <LABEL>.builder, <LABEL>.recipe


ARCHES = {"x86_64": "amd64", "aarch64": "arm64"}  # ours (uname -m) -> Docker's and Debian's name


_ARCH_ALIASES = {
    "x86_64": "x86_64",
    "amd64": "x86_64",
    "x86-64": "x86_64",
    "x64": "x86_64",
    "aarch64": "aarch64",
    "arm64": "aarch64",
    "armv8": "aarch64",
}


def normalize_arch(value: str) -> str:
    arch = _ARCH_ALIASES.get(value.strip().lower())
    if arch is None:
        raise ConfigError(
            f"unknown architecture '{value}'",
            "pass --arch x86_64 or --arch aarch64 (amd64/arm64 work too)",
        )
    return arch


def host_arch() -> str:
    return _ARCH_ALIASES.get(platform.machine().lower(), platform.machine().lower())


def client(timeout: int = 600):
    """A Docker SDK client that answered a ping, or ImageError naming DOCKER_HOST."""
    try:
        import docker
    except ImportError:
        raise ImageError(
            "the Docker SDK for Python is not installed", "pip install -r requirements/runtime.txt"
        ) from None
    for name in (
        "docker",
        "urllib3",
    ):  # their debug lines (config search, every request) show under nox otherwise
        logging.getLogger(name).setLevel(logging.WARNING)
    where = os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"
    try:
        c = docker.from_env(timeout=timeout)
        c.ping()
    except Exception as exc:  # the SDK raises several unrelated types for "no daemon"
        first = (str(exc).splitlines() or [exc.__class__.__name__])[0]
        if "Permission denied" in first or "PermissionError" in first:
            raise ImageError(
                f"no permission to use the Docker daemon at {where}",
                "add yourself to the docker group (then log in again), or run as root",
            ) from None
        raise ImageError(
            f"the Docker daemon is not reachable at {log.mask(where)} ({log.mask(first[:120])})",
            "start it (systemctl start docker, or dockerd &) or point DOCKER_HOST at it",
        ) from None
    return c


def get_image(c, reference: str):
    import docker

    try:
        return c.images.get(reference)
    except docker.errors.ImageNotFound:
        return None


def image_arch(image) -> str:
    """Our label wins: `docker import` (docker.io 20.10) records amd64 whatever the root file system holds."""
    labels = image.attrs.get("Config", {}).get("Labels") or {}
    raw = labels.get(f"{LABEL}.arch") or image.attrs.get("Architecture") or ""
    return _ARCH_ALIASES.get(raw.lower(), raw)
