"""A published index as its readers see it: the directory `invoke publish` wrote (on shared storage) or its http(s)
URL, and its index.json read back as untrusted input (capped, a JSON object), e.g. by fleet.submit."""

from __future__ import annotations

import json
import os
import re
import urllib.error
import urllib.parse
from dataclasses import dataclass
from pathlib import Path

from apexkit import log, untrusted, vocab
from apexkit.errors import ApexkitError, ConfigError
from apexkit.index import client

INDEX_JSON_MAX = 64 << 20  # bytes; an index.json lists a few hundred wheels in some KiB


@dataclass(frozen=True)
class Index:
    """Where the nodes get the wheel: an `invoke publish` directory (a path on shared storage) or its http(s) URL."""

    url: str  # the index root as a URL (file:// for paths), no trailing slash
    path: Path | None  # the local directory when it is one

    @property
    def simple(self) -> str:
        return self.url + "/simple/"

    @property
    def index_json(self) -> str:
        return self.url + "/index.json"


def root_url(raw: str, who: str = "index", readers: str = "apexkit") -> str:
    """The index root `raw` names, as a URL without a trailing slash: .../simple/ and /index.json dropped, a
    directory path made file://. The one normaliser of an index given by a user (`who` and `readers` in errors)."""
    text = raw.strip()
    if not text:
        raise ConfigError(
            f"{who} is empty",
            f"pass the directory `{vocab.command('publish', '--index')}` wrote, or its URL",
        )
    text = re.sub(r"/(simple/?|index\.json)$", "", text.rstrip("/")) or "/"
    scheme = urllib.parse.urlsplit(text).scheme
    if scheme in ("http", "https", "file"):
        client.check_index_url(text, "the index")
        return text
    if scheme:
        raise ConfigError(
            f"{who} {log.mask(text)}: {scheme}:// is not an index {readers} can read",
            f"pass an http(s):// URL, a file:// URL or a directory `{vocab.command('publish')}` wrote",
        )
    return Path(text).expanduser().resolve().as_uri()


def parse_index(raw: str) -> Index:
    """--index of a fleet run: an http(s) index as given, a local one (path or file://) checked to hold index.json."""
    url = root_url(raw, "--index", "the nodes' pip")
    parts = urllib.parse.urlsplit(url)
    if parts.scheme != "file":
        return Index(url, None)
    path = Path(urllib.parse.unquote(parts.path)).expanduser().resolve()
    if not (path / "index.json").is_file():
        raise ConfigError(
            f"--index {raw}: {path} holds no index.json (not an `{vocab.command('publish')}` index)",
            f"publish one first: {vocab.command('publish', f'--index {path}')}",
        )
    return Index(path.as_uri(), path)


def read_index(index: Index, timeout: float = 15) -> dict | None:
    """index.json as this host sees it, or None when an http index cannot be read from here."""
    if index.path is not None:
        try:
            return untrusted.read_json_object(index.path / "index.json", None, INDEX_JSON_MAX)
        except (OSError, untrusted.Untrusted) as exc:
            raise ConfigError(
                f"{index.path}/index.json cannot be read as JSON: {exc}",
                f"publish the index again: {vocab.command('publish', f'--index {index.path}')}",
            ) from None
    # through the index client: user:token@ in the URL travels as Basic auth (urllib would hand "user:token@host" to
    # the resolver as a host name), pip's CA bundle and the proxies apply, and nothing printed holds the login
    from apexkit.wheel.sources import RetryPolicy

    try:
        settings = client.resolve_settings(index.simple, os.environ, timeout=timeout)
        http = client.Client(settings, RetryPolicy(1, 0.0))
        with http.open(index.index_json, what=index.index_json) as response:
            body = response.read(INDEX_JSON_MAX + 1)
        if len(body) > INDEX_JSON_MAX:
            raise ValueError(f"larger than {INDEX_JSON_MAX >> 20} MiB")
        data = json.loads(body.decode("utf-8"))
        if not isinstance(data, dict):
            raise ValueError("not a JSON object")
        return data
    except (OSError, ValueError, RecursionError, urllib.error.URLError, ApexkitError) as exc:
        why = exc.format() if isinstance(exc, ApexkitError) else str(exc)
        log.warn(
            f"cannot read {log.mask(index.index_json)} from this host "
            f"({log.sanitise(log.mask(why))[:200]}); the nodes will read it themselves"
        )
        return None
