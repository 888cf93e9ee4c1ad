"""`nox -s matrix -- --refresh [--write]`: which torch-npu releases the package index serves and which torch each one
requires (its Requires-Dist), as a difference against matrix.toml [torch_npu.versions]; `--write` applies it.

Plan, then do:
- settings: pip's effective configuration (`python -m pip config list`: index-url, extra-index-url, cert, proxy; the
  PIP_* variables show there too), or `--index-url`; HTTPS_PROXY / HTTP_PROXY / NO_PROXY from the environment;
- the index: the PEP 691 JSON simple API, else PEP 503 HTML; file:// indexes are read from disk;
- the metadata of one wheel per release and arch, never the wheel: the PEP 658/714 `.metadata` file where the index
  advertises one, else the wheel's `*.dist-info/METADATA` member read with HTTP range requests (a few KiB);
- `plan()` (pure) compares the releases with the table; `render()` (pure) rewrites matrix.toml with tomlkit, keeping
  every comment, the order (newest torch first) and every other table byte for byte, and updating the table's
  provenance (`source`, `read`). CANN is not in the wheel metadata: existing CANN lists are never changed, a new row
  gets `cann = []` and a comment saying where to read it.

Only releases >= 2.1 are read (older torch_npu wheels predate the tables apexkit builds from); pre-releases and
yanked releases are listed as skipped.
"""

from __future__ import annotations

import argparse
import ast
import base64
import datetime
import email.parser
import hashlib
import html.parser
import http.client
import json
import math
import os
import re
import socket
import ssl
import struct
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import zipfile
import zlib
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from apexkit import fsedit, log
from apexkit.errors import ConfigError, EnvironmentSetupError, SourceError
from apexkit.plan import matrix
from apexkit.wheel.sources import RetryPolicy

PROJECT = "torch-npu"
OLDEST = Version("2.1")
DEFAULT_INDEX = "https://pypi.org/simple"
ARCHES = ("x86_64", "aarch64")
ACCEPT = ("application/vnd.pypi.simple.v1+json, application/vnd.pypi.simple.v1+html;q=0.2, "
          "text/html;q=0.1")
# The first range request: the zip's end records and the end of its central directory, where wheel builders put the
# *.dist-info entries. The METADATA member then comes with a second request.
TAIL_BYTES = 16 * 1024
CANN_COMMENT = "cann: not in the wheel metadata; read it in Ascend/pytorch COMPATIBILITY.md"
UNREACHABLE_HINT = "check the proxy (invoke proxy.check) or pass --index-url"
INDEX_HINT = "pass --index-url with a PEP 503/691 simple index that serves torch-npu (e.g. https://pypi.org/simple)"


# ---------------------------------------------------------------------------------------------------------------
# Settings: pip's configuration, resolved once
# ---------------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class IndexSettings:
    urls: tuple[str, ...]          # the index first, then pip's extra indexes
    origin: str                    # where `urls` came from, for the report
    cert: str | None = None        # CA bundle (pip's cert, PIP_CERT, REQUESTS_CA_BUNDLE, SSL_CERT_FILE)
    proxies: Mapping[str, str] = field(default_factory=dict)  # scheme -> proxy URL; "no" -> NO_PROXY
    timeout: float = 20.0


def parse_pip_config(text: str) -> dict[str, str]:
    """`pip config list` lines (`global.index-url='...'`, `:env:.cert='...'`) -> the effective value per option,
    in pip's order: [global] < [install] < PIP_* environment variables."""
    ranks = {"global": 0, "install": 1, "download": 1, ":env:": 2}
    best: dict[str, tuple[int, str]] = {}
    for line in text.splitlines():
        match = re.match(r"^(?P<section>:env:|[A-Za-z0-9_-]+)\.(?P<key>[A-Za-z0-9_-]+)=(?P<value>.*)$", line.strip())
        if not match or match["section"] not in ranks:
            continue
        value = match["value"]
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            try:  # pip prints repr(): a multi-line extra-index-url comes as '\\nhttps://a\\nhttps://b'
                value = str(ast.literal_eval(value))
            except (ValueError, SyntaxError):
                value = value[1:-1]
        key = match["key"].replace("_", "-").lower()
        rank = ranks[match["section"]]
        if key not in best or rank >= best[key][0]:
            best[key] = (rank, value)
    return {key: value for key, (_, value) in best.items()}


def read_pip_config(env: Mapping[str, str], python: str = sys.executable) -> dict[str, str]:
    """pip's effective configuration as this user's `pip install` sees it; the PIP_* variables where pip is absent."""
    try:
        proc = subprocess.run([python, "-m", "pip", "config", "list"], capture_output=True, text=True, timeout=60,
                              env=dict(env))
        if proc.returncode == 0:
            return parse_pip_config(proc.stdout)
    except (OSError, subprocess.TimeoutExpired):
        pass
    return {key[4:].replace("_", "-").lower(): value for key, value in env.items()
            if key.startswith("PIP_") and value}


def environment_proxies(env: Mapping[str, str]) -> dict[str, str]:
    """http/https proxies and no_proxy from the environment, lowercase names first (as curl and urllib do)."""
    out: dict[str, str] = {}
    for scheme in ("http", "https", "no"):
        value = env.get(f"{scheme}_proxy") or env.get(f"{scheme.upper()}_PROXY")
        if value:
            out[scheme] = value
    return out


def resolve_settings(index_url: str | None, env: Mapping[str, str], timeout: float = 20.0,
                     pip_config: Mapping[str, str] | None = None) -> IndexSettings:
    conf = dict(read_pip_config(env) if pip_config is None else pip_config)
    if index_url:
        urls, origin = [index_url], "--index-url"
    else:
        primary = conf.get("index-url")
        origin = "pip config index-url" if primary else f"pip's default index ({DEFAULT_INDEX})"
        urls = [primary or DEFAULT_INDEX, *conf.get("extra-index-url", "").split()]
        if len(urls) > 1:
            origin += " + extra-index-url"
    cert_origin = next(((name, value) for name, value in (
        ("pip's cert option or PIP_CERT", conf.get("cert")), ("REQUESTS_CA_BUNDLE", env.get("REQUESTS_CA_BUNDLE")),
        ("SSL_CERT_FILE", env.get("SSL_CERT_FILE"))) if value), (None, None))
    if cert_origin[1] and not os.path.isfile(cert_origin[1]):
        raise ConfigError(f"the CA bundle {cert_origin[1]} ({cert_origin[0]}) does not exist",
                          "fix pip's cert setting (pip config list) or the variable")
    for url in urls:
        check_index_url(url.strip(), "--index-url" if index_url else "pip's index-url / extra-index-url")
    if not 0 < timeout < math.inf:
        raise ConfigError(f"timeout {timeout!r} is not a positive number of seconds", "pass --timeout like 20")
    proxies = environment_proxies(env)
    if conf.get("proxy"):  # pip's own proxy option wins over the environment, as in pip
        proxies.update(http=conf["proxy"], https=conf["proxy"])
    return IndexSettings(tuple(dict.fromkeys(u.strip() for u in urls if u.strip())), origin, cert_origin[1],
                         proxies, timeout)


def check_index_url(url: str, where: str) -> None:
    """An index is an http://, https:// (with a host) or file:// URL; anything else is one ConfigError."""
    if not url:
        return
    hint = ("pass --index-url with an http://, https:// or file:// simple index (e.g. https://pypi.org/simple)"
            if where == "--index-url" else "fix it (pip config list; pip config set global.index-url URL) or pass "
            "--index-url")
    try:
        parts = urllib.parse.urlsplit(url)
        _ = parts.port  # raises ValueError for a port that is not a number
    except ValueError as exc:
        raise ConfigError(f"{where} {log.mask(url)} is not a URL ({exc})", hint) from None
    if parts.scheme not in ("http", "https", "file"):
        what = f"a {parts.scheme}:// URL" if parts.scheme else "not a URL (no scheme)"
        raise ConfigError(f"{where} {log.mask(url)} is {what}; an index is read over http(s) or from file://", hint)
    if parts.scheme != "file" and not parts.hostname:
        raise ConfigError(f"{where} {log.mask(url)} has no host name", hint)


def positive_seconds(value: str) -> float:
    """argparse type of --timeout: 0 < seconds < inf (a socket refuses the rest with a ValueError)."""
    try:
        seconds = float(value)
    except ValueError:
        seconds = math.nan
    if not 0 < seconds < math.inf:
        raise argparse.ArgumentTypeError(f"{value!r} is not a positive number of seconds (e.g. --timeout 20)")
    return seconds


# ---------------------------------------------------------------------------------------------------------------
# HTTP: one client, bounded retries, one-line errors
# ---------------------------------------------------------------------------------------------------------------

class Client:
    """urllib with the CA bundle and proxies of `settings`; NO_PROXY honoured per host."""

    def __init__(self, settings: IndexSettings, retry: RetryPolicy | None = None) -> None:
        self.settings = settings
        self.retry = retry or RetryPolicy.from_env()
        context = ssl.create_default_context(cafile=settings.cert) if settings.cert else ssl.create_default_context()
        https = urllib.request.HTTPSHandler(context=context)
        proxies = {k: v for k, v in settings.proxies.items() if k in ("http", "https")}
        self._proxied = urllib.request.build_opener(https, urllib.request.ProxyHandler(proxies))
        self._direct = urllib.request.build_opener(https, urllib.request.ProxyHandler({}))
        # pip accepts user:password@ in an index URL (a private mirror); urllib does not: send it as Basic auth
        self._auth: dict[str, str] = {}
        for index in settings.urls:
            parts = urllib.parse.urlsplit(index)
            if parts.username is not None:
                token = f"{urllib.parse.unquote(parts.username)}:{urllib.parse.unquote(parts.password or '')}"
                self._auth[parts.hostname or ""] = "Basic " + base64.b64encode(token.encode()).decode()
        self._lock = threading.Lock()
        self.requests = 0
        self.received = 0  # bytes of response bodies read

    def count(self, nbytes: int) -> None:
        with self._lock:
            self.received += nbytes

    def _opener(self, url: str) -> urllib.request.OpenerDirector:
        host = urllib.parse.urlsplit(url).hostname or ""
        no_proxy = self.settings.proxies.get("no")
        if no_proxy and urllib.request.proxy_bypass_environment(host, {"no": no_proxy}):  # type: ignore[attr-defined]  # not in typeshed
            return self._direct
        return self._proxied

    def via(self, url: str) -> str:
        scheme = urllib.parse.urlsplit(url).scheme
        proxy = self.settings.proxies.get(scheme) if self._opener(url) is self._proxied else None
        if not proxy:
            return ""
        parts = urllib.parse.urlsplit(proxy if "://" in proxy else f"http://{proxy}")
        return f" via proxy {parts.hostname}:{parts.port or 80}"

    def open(self, url: str, headers: Mapping[str, str] | None = None, what: str = ""):
        """The response (caller reads and closes it), or an HTTPError for 4xx; retries timeouts, resets and 5xx.
        Unreachable after the retries -> SourceError."""
        try:
            url = public_url(url)
            request = urllib.request.Request(url, headers={"User-Agent": "apexkit-refresh", **(headers or {})})
        except ValueError as exc:
            raise ConfigError(f"cannot ask {log.mask(url)}: {exc}", INDEX_HINT) from None
        auth = self._auth.get(urllib.parse.urlsplit(url).hostname or "")
        if auth:  # unredirected: a redirect to another host (a CDN) does not get the mirror's login
            request.add_unredirected_header("Authorization", auth)
        delay = self.retry.backoff
        for attempt in range(1, self.retry.attempts + 1):
            try:
                with self._lock:
                    self.requests += 1
                return self._opener(url).open(request, timeout=self.settings.timeout)
            except urllib.error.HTTPError as exc:
                if exc.code == 407 or (exc.code == 401 and self.via(url)):  # tinyproxy, among others, sends 401
                    self._proxy_refused(url, exc.code)
                if (exc.code < 500 and exc.code != 429) or attempt == self.retry.attempts:
                    raise
            except (urllib.error.URLError, OSError) as exc:
                reason = _reason(exc, self.settings.timeout)
                tunnel = re.search(r"Tunnel connection failed: (40[17])", reason)
                if tunnel:
                    self._proxy_refused(url, int(tunnel[1]))
                if attempt == self.retry.attempts or "certificate" in reason:
                    target = public_url(what) if what else urllib.parse.urlsplit(url).netloc
                    hint = ("pass your proxy's CA bundle (pip config set global.cert FILE, or PIP_CERT)"
                            if "certificate" in reason else UNREACHABLE_HINT)
                    if self.via(url) and reason == "connection refused":
                        raise SourceError(f"cannot reach the proxy{self.via(url)[10:]} for {target}: connection "
                                          f"refused", "is the proxy running? check it with invoke proxy.check") from None
                    raise SourceError(f"cannot reach {target}{self.via(url)}: {reason}", hint) from None
            except ValueError as exc:  # a URL, proxy or timeout urllib/socket refuse: no retry helps
                raise ConfigError(f"cannot ask {log.mask(url)}: {exc}",
                                  "check --index-url, --timeout and the proxy variables") from None
            time.sleep(delay)
            delay *= 2
        raise AssertionError("unreachable")  # pragma: no cover

    def _proxy_refused(self, url: str, code: int) -> None:
        raise SourceError(f"the proxy{self.via(url)[10:]} refused the credentials (HTTP {code}) for "
                          f"{log.mask(url)}", "check user:password in the proxy URL (percent-encode @ : / in them), "
                          "then invoke proxy.check") from None


def public_url(url: str) -> str:
    """`url` without user:password@ (they travel as a header, and never into a report or matrix.toml)."""
    parts = urllib.parse.urlsplit(url)
    if parts.username is None and parts.password is None:
        return url
    host = parts.hostname or ""
    netloc = (f"[{host}]" if ":" in host else host) + (f":{parts.port}" if parts.port else "")
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc))


def _reason(exc: BaseException, timeout: float) -> str:
    reason = getattr(exc, "reason", exc)
    if isinstance(reason, ssl.SSLCertVerificationError) or "CERTIFICATE_VERIFY_FAILED" in str(reason):
        return "TLS certificate verification failed"
    if isinstance(reason, socket.gaierror):
        return f"DNS lookup failed ({reason.strerror or reason})"
    if isinstance(reason, ConnectionRefusedError):
        return "connection refused"
    if isinstance(reason, (socket.timeout, TimeoutError)) or "timed out" in str(reason):
        return f"no answer within {timeout:g} s"
    text = str(getattr(reason, "strerror", None) or reason)
    return log.mask(text) or type(reason).__name__


# ---------------------------------------------------------------------------------------------------------------
# The index: PEP 691 JSON or PEP 503 HTML -> wheel files
# ---------------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class WheelFile:
    filename: str
    url: str
    version: str
    arch: str              # x86_64 | aarch64 | other
    metadata: object       # PEP 658/714: False, True, or {"sha256": ...}
    yanked: bool = False
    index: str = ""


class _Anchors(html.parser.HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.anchors: list[dict[str, str | None]] = []
        self.tags = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags += 1
        if tag == "a":
            self.anchors.append(dict(attrs))


def _wheel(filename: str, url: str, metadata: object, yanked: bool, index: str) -> WheelFile | None:
    match = re.match(r"^(?P<name>[^-]+)-(?P<version>[^-]+)(-\d[^-]*)?-[^-]+-[^-]+-(?P<plat>[^-]+)\.whl$", filename)
    if not match or canonicalize_name(match["name"]) != PROJECT:
        return None
    plat = match["plat"]
    arch = next((a for a in ARCHES if a in plat), "other")
    return WheelFile(filename, url, match["version"], arch, metadata, yanked, index)


def _metadata_flag(value: object) -> object:
    if isinstance(value, dict):
        return value or True
    if isinstance(value, str):  # HTML attribute: "true" or "sha256=<hex>"
        if value.strip().lower() in ("", "false"):
            return False
        algo, _, digest = value.partition("=")
        return {algo: digest} if digest else True
    return bool(value)


def parse_index_page(body: bytes, content_type: str, base_url: str, index: str) -> list[WheelFile]:
    """The project page's wheels. Raises SourceError when the page is neither PEP 691 JSON nor PEP 503 HTML."""
    text = body.decode("utf-8", "replace")
    wheels = []
    if "json" in content_type:
        try:
            data = json.loads(text)
            files = data["files"]
            if not isinstance(files, list):
                raise TypeError("files is not a list")
            for entry in files:
                metadata = entry.get("core-metadata", entry.get("data-dist-info-metadata", False))
                wheel = _wheel(entry["filename"], urllib.parse.urljoin(base_url, entry["url"]),
                               _metadata_flag(metadata), bool(entry.get("yanked")), index)
                if wheel:
                    wheels.append(wheel)
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise SourceError(f"{log.mask(base_url)} is not a PEP 691 simple index page ({type(exc).__name__}: "
                              f"{str(exc)[:80]})", INDEX_HINT) from None
        return wheels
    parser = _Anchors()
    parser.feed(text)
    if "html" not in content_type and not parser.tags:
        raise SourceError(f"{log.mask(base_url)} is not a simple index page (Content-Type {content_type or 'none'}, "
                          f"no HTML)", INDEX_HINT)
    for attrs in parser.anchors:
        href = attrs.get("href") or ""
        url = urllib.parse.urljoin(base_url, href).split("#", 1)[0]
        filename = urllib.parse.unquote(url.rsplit("/", 1)[-1])
        metadata = attrs.get("data-core-metadata", attrs.get("data-dist-info-metadata"))
        wheel = _wheel(filename, url, _metadata_flag(metadata) if metadata is not None else False,
                       "data-yanked" in attrs, index)
        if wheel:
            wheels.append(wheel)
    if not parser.anchors:
        raise SourceError(f"{log.mask(base_url)} is not a simple index page (no links in it)", INDEX_HINT)
    return wheels


def _file_path(url: str) -> Path:
    return Path(urllib.request.url2pathname(urllib.parse.urlsplit(url).path))


def project_url(index: str) -> str:
    return index.rstrip("/") + f"/{PROJECT}/"


def fetch_index(client: Client, index: str) -> list[WheelFile] | None:
    """The wheels `index` lists for torch-npu; None when the index has no such project (HTTP 404, no directory)."""
    url = project_url(index)
    if url.startswith("file:"):
        directory = _file_path(url)
        page = directory / "index.html"
        if not page.is_file():
            return None
        return parse_index_page(page.read_bytes(), "text/html", page.as_uri(), index)
    try:
        with client.open(url, {"Accept": ACCEPT}, what=index) as response:
            try:
                body = response.read()
            except (OSError, http.client.HTTPException) as exc:
                raise SourceError(f"cannot read {public_url(url)}: {_reason(exc, client.settings.timeout)}",
                                  UNREACHABLE_HINT) from None
            client.count(len(body))
            return parse_index_page(body, response.headers.get("Content-Type", ""), response.geturl(), index)
    except urllib.error.HTTPError as exc:
        if exc.code in (404, 410):
            return None
        hint = ("the index wants a login: put user:password@ in its URL (--index-url or pip's index-url), as for pip"
                if exc.code in (401, 403) else INDEX_HINT)
        raise SourceError(f"{public_url(url)}: HTTP {exc.code} {exc.reason}", hint) from None


# ---------------------------------------------------------------------------------------------------------------
# Metadata: .metadata file, else the METADATA member through HTTP range requests
# ---------------------------------------------------------------------------------------------------------------

class NoMetadata(Exception):
    """This wheel's metadata could not be read without downloading it (the reason is the message)."""


class RangeFile:
    """A read-only, seekable view of a remote file; every read that misses the cache is one HTTP range request."""

    def __init__(self, client: Client, url: str) -> None:
        self.client = client
        self.url = url
        self.pos = 0
        self.blocks: list[tuple[int, bytes]] = []
        self.requests = 0
        start, data, self.size = self._get(f"bytes=-{TAIL_BYTES}")
        self.blocks.append((start, data))

    def _get(self, spec: str) -> tuple[int, bytes, int]:
        self.requests += 1
        try:
            response = self.client.open(self.url, {"Range": spec, "Accept-Encoding": "identity"})
        except urllib.error.HTTPError as exc:
            raise NoMetadata(f"HTTP {exc.code} for a range of the wheel") from None
        with response:
            match = re.match(r"bytes (\d+)-(\d+)/(\d+)", response.headers.get("Content-Range", ""))
            if response.status != 206 or not match:
                raise NoMetadata("the server ignores HTTP range requests (no .metadata file either)")
            data = response.read(int(match[2]) - int(match[1]) + 1)
            self.client.count(len(data))
        return int(match[1]), data, int(match[3])

    def _fetch(self, start: int, end: int) -> None:
        start, data, _ = self._get(f"bytes={start}-{max(end, start + TAIL_BYTES // 4) - 1}")
        self.blocks.append((start, data))

    def seekable(self) -> bool:
        return True

    def readable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = 0) -> int:
        self.pos = {0: offset, 1: self.pos + offset, 2: self.size + offset}[whence]
        return self.pos

    def tell(self) -> int:
        return self.pos

    def read(self, n: int = -1) -> bytes:
        end = self.size if n is None or n < 0 else min(self.size, self.pos + n)
        if end <= self.pos:
            return b""
        for start, data in self.blocks:
            if start <= self.pos and end <= start + len(data):
                out = data[self.pos - start:end - start]
                self.pos = end
                return out
        self._fetch(self.pos, end)
        return self.read(end - self.pos)

    def close(self) -> None:
        self.blocks = []


def _metadata_from_zip(archive: zipfile.ZipFile) -> bytes:
    names = [n for n in archive.namelist() if re.match(r"^[^/]+\.dist-info/METADATA$", n)]
    if len(names) != 1:
        raise NoMetadata(f"{len(names)} *.dist-info/METADATA members in the wheel")
    return archive.read(names[0])


def read_metadata(client: Client, wheel: WheelFile) -> tuple[bytes, str]:
    """METADATA bytes and how they were read ("metadata file" | "range requests (N)" | "local file")."""
    if wheel.url.startswith("file:"):
        try:
            with zipfile.ZipFile(_file_path(wheel.url)) as archive:
                return _metadata_from_zip(archive), "local file"
        except (OSError, zipfile.BadZipFile) as exc:
            raise NoMetadata(f"cannot read {wheel.filename}: {exc}") from None
    if wheel.metadata:
        try:
            with client.open(wheel.url + ".metadata") as response:
                data = response.read()
                client.count(len(data))
        except urllib.error.HTTPError:
            data = None  # advertised but absent: read it from the wheel instead
        if data is not None:
            digest = wheel.metadata.get("sha256") if isinstance(wheel.metadata, dict) else None
            if digest and hashlib.sha256(data).hexdigest() != digest:
                raise NoMetadata(f"{wheel.filename}.metadata does not match its sha256 on the index")
            return data, "metadata file"
    remote = RangeFile(client, wheel.url)
    data = _metadata_from_tail(remote)
    if data is None:  # not in the tail (or zip64): let zipfile walk the whole central directory, range by range
        try:
            with zipfile.ZipFile(remote) as archive:
                data = _metadata_from_zip(archive)
        except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, ValueError) as exc:
            raise NoMetadata(f"{wheel.filename} is not a readable zip ({exc})") from None
    return data, f"range requests ({remote.requests})"


def _metadata_from_tail(remote: RangeFile) -> bytes | None:
    """The METADATA member found through its central directory entry, which wheel builders put at the start of the
    directory (bdist_wheel, torch_npu) or at its end (some others): look in the tail already read, else read the
    directory's first block. None when neither holds it (or for zip64): zipfile then walks the whole directory."""
    tail = remote.blocks[0][1]
    entry = _metadata_entry(tail)
    if entry is None:
        eocd = tail.rfind(b"PK\x05\x06")
        if eocd < 0 or len(tail) < eocd + 22:
            return None
        cd_size, cd_offset = struct.unpack("<II", tail[eocd + 12:eocd + 20])
        if 0xFFFFFFFF in (cd_size, cd_offset):
            return None
        remote.seek(cd_offset)
        entry = _metadata_entry(remote.read(min(cd_size, TAIL_BYTES)))
    if entry is None:
        return None
    method, crc, size, offset, name_len = entry
    remote._fetch(offset, offset + 30 + name_len + 1024 + size)  # the member and its local header in one request
    remote.seek(offset)
    local = remote.read(30)
    if local[:4] != b"PK\x03\x04":
        return None
    remote.seek(offset + 30 + sum(struct.unpack("<HH", local[26:30])))
    raw = remote.read(size)
    data = zlib.decompressobj(-15).decompress(raw) if method == 8 else raw
    if zlib.crc32(data) & 0xFFFFFFFF != crc:
        raise NoMetadata("the METADATA member does not match its CRC-32")
    return data


def _metadata_entry(block: bytes) -> tuple[int, int, int, int, int] | None:
    """(method, crc, compressed size, local header offset, name length) of `*.dist-info/METADATA` in a piece of a
    zip central directory; None when it is not in it, or is zip64 or compressed other than stored/deflated."""
    for match in re.finditer(rb"PK\x01\x02", block):
        head = block[match.start():match.start() + 46]
        if len(head) < 46:
            break
        method, crc, size, _, name_len, _, _ = struct.unpack("<HxxxxIIIHHH", head[10:34])
        offset = struct.unpack("<I", head[42:46])[0]
        if re.fullmatch(rb"[^/]+\.dist-info/METADATA", block[match.start() + 46:match.start() + 46 + name_len]):
            if 0xFFFFFFFF in (size, offset) or method not in (0, 8):
                return None
            return method, crc, size, offset, name_len
    return None


@dataclass(frozen=True)
class Metadata:
    name: str
    version: str
    requires_python: str
    torch: str               # the Requires-Dist on torch as written ("torch==2.13.0.*"), "" when none
    torch_version: str | None  # the torch release it pins (public part), None when it pins none


def parse_metadata(data: bytes) -> Metadata:
    msg = email.parser.HeaderParser().parsestr(data.decode("utf-8", "replace"))
    torch_req, torch_version = "", None
    for line in msg.get_all("Requires-Dist") or []:
        try:
            req = Requirement(line)
        except InvalidRequirement:
            continue
        if canonicalize_name(req.name) != "torch" or (req.marker and "extra" in str(req.marker)):
            continue
        torch_req = " ".join(line.split())
        for spec in req.specifier:
            if spec.operator in ("==", "==="):
                try:
                    torch_version = _public(spec.version[:-2] if spec.version.endswith(".*") else spec.version)
                except InvalidVersion:
                    continue
        break
    return Metadata(msg.get("Name", ""), msg.get("Version", ""), msg.get("Requires-Python", "") or "", torch_req,
                    torch_version)


def _public(version: str) -> str:
    parsed = Version(version)
    return parsed.public if not parsed.local else version.split("+", 1)[0]


def local_label(requirement: str) -> str | None:
    """`torch (==2.1.0+cpu)` -> "cpu": a torch build that PyPI's plain torch does not satisfy."""
    match = re.search(r"==\s*[0-9][^,;)\s]*\+([A-Za-z0-9.]+)", requirement)
    return match[1] if match else None


# ---------------------------------------------------------------------------------------------------------------
# Releases
# ---------------------------------------------------------------------------------------------------------------

@dataclass
class Release:
    version: str                                   # torch_npu
    platforms: list[str]                           # arches of its wheels
    requires: dict[str, str] = field(default_factory=dict)   # arch -> Requires-Dist on torch
    torch: str | None = None                       # the torch release it pins
    inferred: bool = False                         # torch taken from the torch_npu version (no == pin)
    skipped: str = ""                              # why its metadata could not be read
    how: str = ""                                  # how the metadata was read

    @property
    def local(self) -> dict[str, str]:
        return {arch: label for arch, req in sorted(self.requires.items()) if (label := local_label(req))}


@dataclass
class Survey:
    releases: list[Release]                        # >= 2.1, final, newest first
    ignored: dict[str, list[str]]                  # reason -> versions
    indexes: dict[str, str]                        # index -> what it gave


def survey(client: Client, settings: IndexSettings, workers: int = 8) -> Survey:
    wheels: list[WheelFile] = []
    indexes: dict[str, str] = {}
    for index in settings.urls:
        found = fetch_index(client, index)
        indexes[public_url(index)] = "no torch-npu project" if found is None else f"{len(found)} torch-npu wheels"
        wheels += found or []
    if not wheels:
        raise SourceError(f"no torch-npu wheels on {', '.join(public_url(u) for u in settings.urls)} (HTTP 404 or an "
                          f"empty project page)", INDEX_HINT)
    by_version: dict[Version, list[WheelFile]] = {}
    ignored: dict[str, list[str]] = {}
    for wheel in wheels:
        try:
            version = Version(wheel.version)
        except InvalidVersion:
            ignored.setdefault("not a PEP 440 version", []).append(wheel.version)
            continue
        by_version.setdefault(version, []).append(wheel)
    chosen: dict[Version, list[WheelFile]] = {}
    for version, files in sorted(by_version.items(), reverse=True):
        live = [f for f in files if not f.yanked]
        reason = ("older than 2.1" if version < OLDEST else "pre-release" if version.is_prerelease
                  else "yanked" if not live else "")
        if reason:
            ignored.setdefault(reason, []).append(str(version))
            continue
        # one wheel per arch (the first index that has one wins, as in pip)
        per_arch: dict[str, WheelFile] = {}
        for wheel in sorted(live, key=lambda w: (settings.urls.index(w.index), w.filename)):
            per_arch.setdefault(wheel.arch, wheel)
        chosen[version] = [per_arch[a] for a in (*ARCHES, "other") if a in per_arch][:2]
    jobs = [(version, wheel) for version, files in chosen.items() for wheel in files]
    with ThreadPoolExecutor(max_workers=workers) as pool:
        results = list(pool.map(lambda job: _read_one(client, job[1]), jobs))
    releases = {v: Release(str(v), sorted({w.arch for w in by_version[v]} - {"other"})) for v in chosen}
    for (version, wheel), result in zip(jobs, results):
        release = releases[version]
        if isinstance(result, str):
            release.skipped = release.skipped or f"{wheel.filename}: {result}"
            continue
        meta, how = result
        release.requires[wheel.arch] = meta.torch
        release.how = how
        if meta.torch_version and not release.torch:
            release.torch = meta.torch_version
    for version, release in releases.items():
        if release.torch is None:  # no == pin on torch (or unread): torch_npu X.Y.Z[.postN] belongs to torch X.Y.Z
            release.torch, release.inferred = matrix.torch_npu_torch(str(version)), True
        if release.requires:
            release.skipped = ""  # one readable wheel is enough
    if releases and all(r.skipped for r in releases.values()):
        first = next(iter(releases.values()))
        raise SourceError(f"could not read the metadata of any torch-npu release on {', '.join(indexes)} (e.g. "
                          f"{first.skipped})", "pass --index-url with an index that serves PEP 658 .metadata files "
                          "or answers HTTP range requests (e.g. https://pypi.org/simple)")
    return Survey(list(releases.values()), ignored, indexes)


def _read_one(client: Client, wheel: WheelFile) -> tuple[Metadata, str] | str:
    try:
        data, how = read_metadata(client, wheel)
    except NoMetadata as exc:
        return str(exc)
    except (OSError, http.client.HTTPException, zipfile.BadZipFile, zlib.error, struct.error, EOFError) as exc:
        return f"unreadable ({type(exc).__name__}: {_reason(exc, client.settings.timeout)})"
    return parse_metadata(data), how


# ---------------------------------------------------------------------------------------------------------------
# Plan (pure): the table against the releases
# ---------------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class RowChange:
    torch: str
    kind: str            # add | update | same | absent (no release for the row's torch) | unread | older (< 2.1)
    old: str | None      # the row's torch_npu
    new: str | None      # the newest torch_npu for this torch on the index
    local: tuple[tuple[str, str], ...] = ()     # (arch, label) the newest release pins torch with
    old_local: tuple[tuple[str, str], ...] = ()
    requires: str = ""   # the newest release's Requires-Dist, for the report

    @property
    def changes_file(self) -> bool:
        return self.kind in ("add", "update")


def _key(version: str) -> Version:
    try:
        return Version(version)
    except InvalidVersion:
        return Version("0")


def plan(rows: Mapping[str, Mapping], releases: Sequence[Release]) -> list[RowChange]:
    """One RowChange per torch in the table or on the index, newest torch first."""
    newest: dict[str, Release] = {}
    unread = {r.torch: r.version for r in releases if r.skipped}
    release: Release | None  # each release, then the newest of each torch (None: not on the index)
    for release in releases:
        if release.skipped:
            continue
        if release.torch and (release.torch not in newest or _key(release.version) > _key(newest[release.torch].version)):
            newest[release.torch] = release
    out = []
    for torch in sorted(set(rows) | set(newest), key=_key, reverse=True):
        row, release = rows.get(torch), newest.get(torch)
        old = str(row["torch_npu"]) if row else None
        old_local = tuple(sorted((str(k), str(v)) for k, v in (row or {}).get("torch_local", {}).items()))
        if release is None:
            kind = "older" if _key(torch) < OLDEST else "unread" if torch in unread else "absent"
            out.append(RowChange(torch, kind, old, unread.get(torch), old_local, old_local))
            continue
        local = tuple(sorted(release.local.items()))
        requires = "; ".join(f"{arch}: {req}" for arch, req in sorted(release.requires.items()))
        if len(set(release.requires.values())) == 1:
            requires = next(iter(release.requires.values()))
        if row is None:
            kind = "add"
        elif _key(release.version) > _key(old or "0") or local != old_local:
            kind = "update"
        else:
            kind = "same"
        new = release.version if kind == "add" or _key(release.version) > _key(old or "0") else old
        out.append(RowChange(torch, kind, old, new, local, old_local, requires))
    return out


def describe(change: RowChange) -> str:
    """One line of the difference."""
    t = change.torch
    local = ", ".join(f"{arch} = \"{label}\"" for arch, label in change.local)
    if change.kind == "add":
        extra = f", torch_local = {{ {local} }}" if local else ""
        text = f'+ "{t}" = {{ torch_npu = "{change.new}", cann = []{extra} }}   new: {change.requires}; CANN: fill in by hand'
    elif change.kind == "update":
        parts = []
        if change.new != change.old:
            parts.append(f"torch_npu {change.old} -> {change.new} ({change.requires}; CANN list kept: check it for "
                         f"{change.new})")
        if change.local != change.old_local:
            parts.append(f"torch_local = {{ {local} }}" if local else "torch_local removed")
        text = f'~ "{t}": ' + "; ".join(parts)
    elif change.kind == "same":
        text = f'= "{t}": torch_npu {change.old} is the newest ({change.requires})'
    elif change.kind == "unread":
        text = f'? "{t}": torch_npu {change.old}: the metadata of {change.new} could not be read (row kept)'
    elif change.kind == "absent":
        text = f'? "{t}": torch_npu {change.old}: no release for torch {t} on the index (row kept)'
    else:
        text = f'  "{t}": torch_npu {change.old}: torch < 2.1, not checked'
    if change.local and change.kind in ("add", "update", "same"):
        pins = ", ".join(f"{arch} wheels pin torch=={t}+{label}" for arch, label in change.local)
        text += f"  [local label: {pins}; pip refuses PyPI's plain torch {t} for them]"
    return text


# ---------------------------------------------------------------------------------------------------------------
# Render (pure): matrix.toml with the plan applied, through tomlkit
# ---------------------------------------------------------------------------------------------------------------

def _row_item(torch_npu: str, cann: str, local: Sequence[tuple[str, str]], comment: str):
    import tomlkit

    text = f'torch_npu = "{torch_npu}", cann = {cann}'
    if local:
        text += ", torch_local = { " + ", ".join(f'{arch} = "{label}"' for arch, label in local) + " }"
    line = f"x = {{ {text} }}" + (f"  # {comment}" if comment else "")
    return tomlkit.parse(line + "\n").item("x")


def _row_keys(versions) -> list[str]:
    """The rows of a tomlkit table in document order (iterating the table gives insertion order instead)."""
    return [key.key for key, _ in versions.value.body if key is not None]


def _versions_table(doc, name: str):
    """doc's [torch_npu.versions] as a tomlkit table with a header of its own; anything else is refused."""
    from tomlkit.container import OutOfOrderTableProxy
    from tomlkit.items import InlineTable, Table

    table = doc.get("torch_npu")
    versions = table.get("versions") if hasattr(table, "get") else None
    if isinstance(versions, Table) and not versions.is_super_table():
        return table, versions
    how = ("an inline table (versions = { ... })" if isinstance(versions, InlineTable) else
           "dotted keys (versions.\"X\" = ...)" if isinstance(versions, (Table, OutOfOrderTableProxy)) else
           "not a table")
    raise ConfigError(f"{name}: [torch_npu.versions] is written as {how}; --write edits only a "
                      f"[torch_npu.versions] table with one row per line",
                      "rewrite it as a [torch_npu.versions] table, or apply the difference above by hand")


def expected_rows(rows: Mapping[str, Mapping], changes: Sequence[RowChange]) -> dict[str, dict]:
    """The rows `render` must leave: `rows` with every add/update applied."""
    out = {str(k): dict(v) for k, v in rows.items()}
    for change in changes:
        if not change.changes_file:
            continue
        row = out.get(change.torch) if change.kind == "update" else None
        row = {**(row or {"cann": []}), "torch_npu": change.new or ""}
        row.pop("torch_local", None)
        if change.local:
            row["torch_local"] = dict(change.local)
        out[change.torch] = row
    return out


def check_rendered(out: str, want: Mapping[str, Mapping], name: str) -> None:
    """Refuse a rendered matrix that is not TOML or does not read back as the rows `want`."""
    hint = "apply the difference above by hand (nothing was written)"
    try:
        got = matrix.tomllib.loads(out)["torch_npu"]["versions"]
    except (matrix.tomllib.TOMLDecodeError, KeyError, TypeError) as exc:
        raise ConfigError(f"{name}: the refreshed file would not be valid TOML ({exc})", hint) from None
    if got != want:
        wrong = sorted(set(got) ^ set(want)) or [k for k in want if got.get(k) != want[k]]
        raise ConfigError(f"{name}: the refreshed [torch_npu.versions] would not read back as planned "
                          f"(rows {', '.join(wrong)})", hint)


def render(text: str, changes: Sequence[RowChange], today: str, index: str, name: str = "matrix.toml") -> str:
    """`text` (matrix.toml) with every add/update applied; everything else as it was, line endings included.
    Raises ConfigError when [torch_npu.versions] is not a table of its own, or the result would not read back."""
    try:
        import tomlkit
    except ImportError:
        raise ConfigError("tomlkit (the comment-keeping TOML writer) is not installed",
                          "pip install -r requirements.txt") from None

    todo = [c for c in changes if c.changes_file]
    if not todo:
        return text
    crlf = "\r\n" in text and text.count("\r\n") == text.count("\n")
    if crlf:  # tomlkit writes new lines with \n: edit with \n, then put the file's \r\n back
        text = text.replace("\r\n", "\n")
    want = expected_rows(matrix.tomllib.loads(text)["torch_npu"]["versions"], todo)
    doc = tomlkit.parse(text)
    table, versions = _versions_table(doc, name)
    for change in todo:
        if change.kind == "update":
            old = versions[change.torch]
            comment = old.trivia.comment.lstrip("#").strip() if old.trivia.comment else ""
            versions[change.torch] = _row_item(change.new or "", old["cann"].as_string(), change.local, comment)
            continue
        item = _row_item(change.new or "", "[]", change.local, CANN_COMMENT)
        older = [k for k in _row_keys(versions) if _key(k) < _key(change.torch)]
        if older:
            position = next(i for i, (k, _) in enumerate(versions.value.body) if k is not None and k.key == older[0])
            versions.value._insert_at(position, change.torch, item)
        else:
            newer = [k for k in _row_keys(versions) if _key(k) > _key(change.torch)]
            if newer:
                versions.value._insert_after(newer[-1], change.torch, item)
            else:
                versions.append(change.torch, item)
    table["read"] = today
    source = str(table.get("source", ""))
    if "package index" not in source:
        table["source"] = (f"{source}; " if source else "") + (f"torch_npu releases and their torch: package index "
                                                                f"{public_url(index)} (Requires-Dist)")
    out = tomlkit.dumps(doc)
    check_rendered(out, want, name)
    return out.replace("\n", "\r\n") if crlf else out


# ---------------------------------------------------------------------------------------------------------------
# The command
# ---------------------------------------------------------------------------------------------------------------

def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="nox -s matrix -- --refresh",
                                description="compare matrix.toml [torch_npu.versions] with the torch-npu releases "
                                            "on the package index (through pip's index, proxy and CA bundle)")
    p.add_argument("--refresh", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--write", action="store_true", help="apply the difference to the matrix file (atomic; comments, "
                   "order and the other tables kept)")
    p.add_argument("--matrix", type=Path, default=matrix.MATRIX_PATH, metavar="FILE",
                   help="the matrix file to compare and write (default: the repository's matrix.toml)")
    p.add_argument("--index-url", metavar="URL", help="ask this simple index only (default: pip's index-url and "
                   "extra-index-url; https://pypi.org/simple when pip sets none)")
    p.add_argument("--timeout", type=positive_seconds, default=20.0, metavar="S", help="per request (default 20 s; 3 tries)")
    return p


def main(argv: Sequence[str], env: Mapping[str, str] | None = None, today: str | None = None) -> int:
    """Print the difference; with --write apply it. Raises ApexkitError (one line) on failure; nothing written then."""
    args = parser().parse_args(list(argv))
    env = os.environ if env is None else env
    path: Path = args.matrix
    try:
        raw = path.read_bytes()  # bytes: read_text would turn \r\n into \n, and the file would never match again
        text = raw.decode("utf-8")
        rows = matrix.tomllib.loads(text)["torch_npu"]["versions"]
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror or exc}", "pass --matrix with an existing file") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path} is not UTF-8 text (byte {exc.start}: {exc.reason})",
                          "save it as UTF-8, or pass --matrix with a UTF-8 copy") from None
    except (matrix.tomllib.TOMLDecodeError, KeyError, TypeError) as exc:
        raise ConfigError(f"{path} has no readable [torch_npu.versions] table ({exc})",
                          "fix the file (git diff matrix.toml) or pass --matrix") from None
    check_rows(rows, path)
    settings = resolve_settings(args.index_url, env, args.timeout)
    client = Client(settings)
    log.info(f"▸ torch-npu on {', '.join(public_url(u) for u in settings.urls)} ({settings.origin}"
             f"{client.via(settings.urls[0])}); releases >= 2.1 only")
    started = time.monotonic()
    result = survey(client, settings)
    log.info(f"✓ {sum(1 for r in result.releases if r.requires)} releases' metadata read with {client.requests} "
             f"requests, {client.received / 1024:.0f} KiB, no wheel downloaded "
             f"({log.format_seconds(time.monotonic() - started)})")
    changes = plan(rows, result.releases)
    print(report(result, changes, path))
    new_text = render(text, changes, today or datetime.date.today().isoformat(), settings.urls[0], str(path))
    if new_text == text:
        print(f"{path}: up to date with the index")
        return 0
    target = path.resolve()  # a symlinked matrix: write its target, keep the link
    change = fsedit.Change(str(path), target, new_text.encode("utf-8"), mode=fsedit.file_mode(target) or 0o644)
    print(change.diff(), end="")
    if not args.write:
        print(f"nothing written; run again with --write to apply it to {path}")
        return 0
    fsedit.preflight([change], f"make {path} writable, or pass --matrix with a copy")
    if fsedit.read_bytes(target) != raw:
        raise ConfigError(f"{path} changed while the index was read; nothing was written", "run the refresh again")
    try:
        fsedit.atomic_write(target, change.new or b"", change.mode)
    except OSError as exc:
        raise EnvironmentSetupError(f"cannot write {path}: {exc.strerror or exc}; nothing was changed",
                                    "free space or fix the permissions, then run again") from None
    print(f"wrote {path} ({sum(c.changes_file for c in changes)} rows changed; [torch_npu] read = "
          f"{today or datetime.date.today().isoformat()})")
    return 0


def check_rows(rows: object, path: Path) -> None:
    """[torch_npu.versions] is a table of rows `"X.Y.Z" = { torch_npu = "...", cann = [...] }`: one line otherwise."""
    shape = '"2.1.0" = { torch_npu = "2.1.0.post17", cann = ["8.0.0"] }'
    if not isinstance(rows, dict):
        raise ConfigError(f"{path}: [torch_npu.versions] is {json.dumps(rows, default=str)[:60]}, not a table",
                          f"write it as a [torch_npu.versions] table of rows like {shape}")
    for torch, row in rows.items():
        if not (isinstance(row, dict) and isinstance(row.get("torch_npu"), str) and isinstance(row.get("cann"), list)
                and isinstance(row.get("torch_local", {}), dict)):
            raise ConfigError(f'{path}: [torch_npu.versions] row "{torch}" = {json.dumps(row, default=str)[:80]} is '
                              f"not a table with torch_npu (a string) and cann (a list)", f"write it like {shape}")


def report(result: Survey, changes: Sequence[RowChange], path: Path) -> str:
    lines = [f"{public_url(index)}: {what}" for index, what in result.indexes.items()]
    lines.append(f"{'torch_npu':<16} {'torch (Requires-Dist)':<44} platforms")
    for release in result.releases:
        if release.skipped:
            lines.append(f"{release.version:<16} {'SKIPPED: ' + release.skipped}")
            continue
        reqs = sorted(set(release.requires.values()))
        req = reqs[0] if len(reqs) == 1 else "; ".join(f"{a}: {r}" for a, r in sorted(release.requires.items()))
        req = req or "(no torch requirement)"
        if release.inferred:
            req += f" (torch {release.torch} from the version)"
        lines.append(f"{release.version:<16} {req:<44} {' '.join(release.platforms) or '-'}")
    for reason, versions in result.ignored.items():
        lines.append(f"ignored ({reason}): {', '.join(versions)}")
    lines.append(f"{path} [torch_npu.versions] against the index:")
    lines += [describe(c) for c in changes]
    return "\n".join(lines)
