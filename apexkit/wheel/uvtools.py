"""uv for venvs and installs, where it serves: found, new enough, and told everything the user configured for pip.

uv makes a venv in a fraction of a second and installs from its cache by hard links (torch 2.13.0 into a fresh venv:
~1 s warm, against ~40 s for virtualenv + pip). But uv does not read pip.conf, so a corporate setup that works for
pip (index-url, extra-index-url, find-links, trusted-host, cert, proxy, constraint, timeout -- from files or PIP_*
variables) is read once (`apexkit.pipconfig`) and handed to uv as its own variables (every URL and path: never on a
command line) and options. Where uv is missing, too old, or fails where pip may not, apexkit uses virtualenv + pip and
says so in one line.

APEXKIT_INSTALLER=pip forces virtualenv + pip, =uv refuses the fallback (for tests and for users who want to know);
APEXKIT_UV names a uv binary.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from apexkit import log, netenv, pipconfig

MIN_VERSION = (0, 5, 0)  # --index-strategy, --allow-insecure-host, venv --seed as used here
CHOICES = ("auto", "uv", "pip")


@dataclass(frozen=True)
class Uv:
    binary: str
    version: tuple[int, ...]

    @property
    def version_text(self) -> str:
        return ".".join(map(str, self.version))


def choice(environ: Mapping[str, str] | None = None) -> str:
    environ = os.environ if environ is None else environ
    value = (environ.get("APEXKIT_INSTALLER") or "auto").strip().lower()
    return value if value in CHOICES else "auto"


def _version(binary: str) -> tuple[int, ...] | None:
    try:
        out = subprocess.run(
            [binary, "--version"], capture_output=True, text=True, timeout=30
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    match = re.match(r"uv (\d+)\.(\d+)\.(\d+)", out.strip())
    return tuple(int(x) for x in match.groups()) if match else None


def _candidates(environ: Mapping[str, str]) -> list[str]:
    if environ.get("APEXKIT_UV"):
        return [environ["APEXKIT_UV"]]
    found = []
    try:
        from uv import find_uv_bin  # the uv wheel pinned in requirements/runtime.txt

        found.append(find_uv_bin())
    except (ImportError, FileNotFoundError):
        pass
    on_path = shutil.which("uv")
    if on_path:
        found.append(on_path)
    return found


_said: set[str] = set()


def _once(message: str) -> None:
    if message not in _said:
        _said.add(message)
        log.info(f"  {message}")


def find(environ: Mapping[str, str] | None = None) -> Uv | None:
    """The uv to use, or None (virtualenv + pip), saying once why not."""
    environ = os.environ if environ is None else environ
    if choice(environ) == "pip":
        return None
    return _find(tuple(_candidates(environ)))


@functools.lru_cache(maxsize=8)
def _find(candidates: tuple[str, ...]) -> Uv | None:
    if not candidates:
        _once(
            "uv not found: making venvs with virtualenv + pip (pip install -r requirements/runtime.txt brings uv)"
        )
        return None
    for binary in candidates:
        version = _version(binary)
        if version is None:
            _once(f"uv at {binary} does not run: making venvs with virtualenv + pip")
            continue
        if version < MIN_VERSION:
            _once(
                f"uv {'.'.join(map(str, version))} at {binary} is older than "
                f"{'.'.join(map(str, MIN_VERSION))}: making venvs with virtualenv + pip"
            )
            continue
        return Uv(binary, version)
    return None


# --- pip's configuration, for uv -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Sources:
    """Where an install looks (venvs.IndexOptions.sources: apexkit's options over pip's configuration). pip and uv
    get it in their environment, never on their command line: an index URL may hold a password or a token, and any
    user reads a process's command line (ps, /proc/PID/cmdline), only its owner its environment."""

    offline: bool = False
    index_url: str | None = None
    extra_index_urls: tuple[str, ...] = ()
    find_links: tuple[str, ...] = ()

    def environment(self, tool: str) -> dict[str, str]:
        """The variables that say it to `tool` ("PIP" or "UV"; uv 0.13 has no variable for --no-index: an option)."""
        values = {
            f"{tool}_INDEX_URL": self.index_url or "",
            f"{tool}_EXTRA_INDEX_URL": " ".join(self.extra_index_urls),
            f"{tool}_FIND_LINKS": ("," if tool == "UV" else " ").join(self.find_links),
            f"{tool}_NO_INDEX": "1" if self.offline and tool == "PIP" else "",
        }
        return {name: value for name, value in values.items() if value}

    def shown(self) -> str:
        """Where from, for the install log: every URL masked."""
        named = ["no index (offline)"] if self.offline else []
        named += [f"index {self.index_url}"] if self.index_url else []
        named += [f"extra index {u}" for u in self.extra_index_urls]
        named += [f"find-links {place}" for place in self.find_links]
        return ", ".join(map(log.mask, named)) or "pip's default index"


def install_options(
    config: pipconfig.PipConfig, sources: Sources
) -> tuple[list[str], dict[str, str]]:
    """uv pip install options and environment for pip's config and where to install from (`sources`): every URL
    and path that pip.conf or apexkit names goes into the environment, the switches alone onto the command line."""
    args: list[str] = [
        "--index-strategy",
        "unsafe-best-match",
    ]  # pip picks the best version across all indexes
    env = sources.environment("UV")
    if sources.offline:
        args += ["--no-index", "--offline"]
    else:
        for host in config.get_list("trusted-host"):
            args += ["--allow-insecure-host", host]
    if config.get("constraint"):  # uv venv takes no constraints: it does not read this variable
        env["UV_CONSTRAINT"] = " ".join(config.get_list("constraint"))
    if config.get("cert"):
        env["SSL_CERT_FILE"] = config.get("cert") or ""
    if config.get("client-cert"):
        env["SSL_CLIENT_CERT"] = config.get("client-cert") or ""
    if config.get("proxy"):
        env.update(netenv.proxy_environment(config["proxy"], config["proxy"]))
    timeout = config.get("timeout") or config.get("default-timeout")
    if timeout:
        env["UV_HTTP_TIMEOUT"] = timeout.split(".")[0]
    return args, env


# where to install from, as an option on the command line would be: over what the user exported
_SOURCE_VARIABLES = ("UV_INDEX_URL", "UV_EXTRA_INDEX_URL", "UV_FIND_LINKS", "UV_CONSTRAINT")


def environment(cache: Path, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment uv runs in: its cache beside apexkit's (hard links need one file system), pip's settings
    translated (`extra`). pip's proxy option wins over the exported proxy variables, as in pip (PipSession passes
    it with every request, and requests lets the environment only fill in what is unset); for the rest (a CA
    bundle, a timeout) what the user exported wins over a config file."""
    env = dict(os.environ)
    env.setdefault("UV_CACHE_DIR", str(cache / "uv"))
    env["UV_NO_PROGRESS"] = "1"
    env.pop("VIRTUAL_ENV", None)  # uv would otherwise prefer the venv apexkit itself runs in
    for name, value in (extra or {}).items():
        if netenv.is_proxy_variable(name) or name in _SOURCE_VARIABLES:
            env[name] = value
        else:
            env.setdefault(name, value)
    return env


def pylock_wheels(text: str) -> list[dict]:
    """The packages of a PEP 751 pylock.toml (as `uv pip compile --format pylock.toml` writes it): name, version and
    each wheel's url (or path), sha256 and tags. Entries without a sha256 or a wheel file name are left out."""
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # Python < 3.11: tomli, as for matrix.toml
        import tomli as tomllib
    from urllib.parse import unquote

    from packaging.utils import InvalidWheelFilename, parse_wheel_filename

    try:
        data = tomllib.loads(text)
    except (tomllib.TOMLDecodeError, ValueError):
        return []
    out = []
    for package in data.get("packages") or []:
        if not isinstance(package, dict) or not package.get("name") or not package.get("version"):
            continue
        wheels = []
        for wheel in package.get("wheels") or []:
            if not isinstance(wheel, dict):
                continue
            url = str(wheel.get("url") or wheel.get("path") or "")
            digest = str((wheel.get("hashes") or {}).get("sha256", ""))
            try:
                tags = {
                    str(t)
                    for t in parse_wheel_filename(
                        unquote(str(wheel.get("name") or url.rsplit("/", 1)[-1]))
                    )[3]
                }
            except (InvalidWheelFilename, ValueError):
                continue
            if re.fullmatch(r"[0-9a-f]{64}", digest):
                wheels.append({"url": url, "sha256": digest, "tags": tags})
        out.append(
            {"name": str(package["name"]), "version": str(package["version"]), "wheels": wheels}
        )
    return out
