"""The one Docker client (the Docker SDK): a daemon that answered a ping, images by name, their labels, architectures
by our names, and the host's log of what a daemon prints. Used by images, proxy.check and doctor; it knows nothing of
what the images hold."""

from __future__ import annotations

import codecs
import logging
import os
import platform
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import TextIO

from apexkit import log, untrusted
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


def labels(image) -> dict:
    """An image's labels ({} when it has none)."""
    return image.attrs.get("Config", {}).get("Labels") or {}


def image_arch(image) -> str:
    """Our label wins: `docker import` (docker.io 20.10) records amd64 whatever the root file system holds."""
    raw = labels(image).get(f"{LABEL}.arch") or image.attrs.get("Architecture") or ""
    return _ARCH_ALIASES.get(raw.lower(), raw)


def invoking_user(environ: Mapping[str, str] | None = None) -> tuple[int, int]:
    """The user the outputs belong to: SUDO_UID/SUDO_GID under sudo, else this process's."""
    environ = os.environ if environ is None else environ
    if os.geteuid() == 0 and environ.get("SUDO_UID", "").isdigit():
        return int(environ["SUDO_UID"]), int(environ.get("SUDO_GID", environ["SUDO_UID"]))
    return os.geteuid(), os.getegid()


def open_log(path: Path, what: str) -> TextIO:
    """The host's log of a daemon's output (`what`: "image log", "container log"), written afresh as
    untrusted.open_log opens it (never through a symlink, into a FIFO or device, or into a file hard-linked
    elsewhere) and owned by the invoking user. The caller keeps it outside every mount a container can write."""
    try:
        fh = untrusted.open_log(path)
    except untrusted.Refused as exc:
        why = {
            "links": "it is not a regular file with one link",
            "os": (exc.strerror or "unwritable").lower(),
        }.get(exc.kind, f"it {exc.why}")
        raise ImageError(
            f"refusing to write the {what} {path}: {why}",
            f"remove {path} (apexkit writes a fresh log there) and look at who made it",
        ) from None
    uid, gid = invoking_user()
    if os.geteuid() == 0 and uid != 0:
        os.fchown(fh.fileno(), uid, gid)
    return fh


def lines(chunks: Iterable[bytes | str]) -> Iterator[str]:
    """The text lines of a daemon's output however it is chunked, the last one even without its newline (bytes
    read as UTF-8, what does not decode replaced)."""
    decode = codecs.getincrementaldecoder("utf-8")("replace").decode
    pending = ""
    for chunk in chunks:
        *complete, pending = (
            pending + (decode(chunk) if isinstance(chunk, bytes) else chunk)
        ).split("\n")
        yield from complete
    pending += decode(b"", True)
    if pending:
        yield pending
