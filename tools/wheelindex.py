"""The torch-npu wheels a package index lists and their metadata, read without downloading a wheel: the reader
`nox -s refresh` (tools/refresh.py) and `nox -s contracts` (tools/contracts.py) share, on top of the library's index
client (`apexkit.index.client`: pip's settings, HTTP, proxies, logins).

- the index: the PEP 691 JSON simple API, else PEP 503 HTML; file:// indexes are read from disk;
- the metadata of one wheel: the PEP 658/714 `.metadata` file where the index advertises one, else the wheel's
  `*.dist-info/METADATA` member read with HTTP range requests (a few KiB).

What an index serves is untrusted. Every page, `.metadata` file and range is read through a capped reader
(`read_capped`, PAGE_MAX / METADATA_MAX; a range only as long as asked): a link from an http(s) page is followed
only when it is http(s) (a file://, FILE: or ftp:// link is a refused wheel, with its reason), a file:// index may
link file:// wheels inside its own directory only (the folder holding its `simple/`); an answer to a range request
must be exactly the range asked, with the same total every time, and one wheel costs at most RANGE_REQUESTS of them.
"""

from __future__ import annotations

import email.parser
import errno
import hashlib
import html.parser
import http.client
import json
import os
import re
import struct
import urllib.error
import urllib.parse
import urllib.request
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from apexkit import log, untrusted
from apexkit.errors import SourceError
from apexkit.index.client import (
    INDEX_HINT,
    SCHEMES,
    Client,
    _origin,
    failure_reason,
    public_url,
    unreachable_hint,
)

PROJECT = "torch-npu"
ARCHES = ("x86_64", "aarch64")
ACCEPT = (
    "application/vnd.pypi.simple.v1+json, application/vnd.pypi.simple.v1+html;q=0.2, "
    "text/html;q=0.1"
)
# The first range request: the zip's end records and the end of its central directory, where wheel builders put the
# *.dist-info entries. The METADATA member then comes with a second request.
TAIL_BYTES = 16 * 1024
# Caps on what an index may make apexkit read: PyPI's torch-npu page is ~100 KiB, a METADATA a few KiB, a torch_npu
# wheel's central directory some hundred KiB.
PAGE_MAX = 32 << 20  # one simple index page
METADATA_MAX = 1 << 20  # one .metadata file, or the METADATA member (compressed and uncompressed)
RANGE_MAX = 8 << 20  # one range request
RANGE_REQUESTS = 32  # range requests for one wheel


class TooLarge(Exception):
    """An answer larger than its cap (the message says what and the cap)."""


def read_capped(response, limit: int, what: str) -> bytes:
    """The body of `response`, at most `limit` bytes (never more is read); TooLarge when it is larger, by its
    Content-Length or by what arrives."""
    length = (response.headers.get("Content-Length") or "").strip()
    cap = f"{limit >> 20} MiB" if limit >= 1 << 20 else f"{limit} bytes"
    if length.isdigit() and int(length) > limit:
        raise TooLarge(f"{what} is larger than {cap}")
    data = response.read(limit + 1)
    if len(data) > limit:
        raise TooLarge(f"{what} is larger than {cap}")
    return data


# ---------------------------------------------------------------------------------------------------------------
# The index: PEP 691 JSON or PEP 503 HTML -> wheel files
# ---------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class WheelFile:
    filename: str
    url: str
    version: str
    arch: str  # x86_64 | aarch64 | other
    metadata: object  # PEP 658/714: False, True, or {"sha256": ...}
    yanked: bool = False
    index: str = ""
    refused: str = (
        ""  # why its URL is not followed (a file:// or ftp:// link on a remote page), "" when it is
    )
    sha256: str = ""  # the wheel's sha256 as the index gives it (PEP 691 hashes, PEP 503 #sha256=), "" when none


class _Anchors(html.parser.HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.anchors: list[dict[str, str | None]] = []
        self.tags = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags += 1
        if tag == "a":
            self.anchors.append(dict(attrs))


def _sha256(value: object) -> str:
    """A sha256 hex digest the index gives, or "" (anything else an index sends is not a digest)."""
    return untrusted.sha256_digest(value)


def _wheel(
    filename: str,
    url: str,
    metadata: object,
    yanked: bool,
    index: str,
    base_url: str = "",
    sha256: str = "",
) -> WheelFile | None:
    match = re.match(
        r"^(?P<name>[^-]+)-(?P<version>[^-]+)(-\d[^-]*)?-[^-]+-[^-]+-(?P<plat>[^-]+)\.whl$",
        filename,
    )
    if not match or canonicalize_name(match["name"]) != PROJECT:
        return None
    plat = match["plat"]
    arch = next((a for a in ARCHES if a in plat), "other")
    refused = link_refusal(url, index, base_url or index)
    return WheelFile(
        filename, url, match["version"], arch, metadata, yanked, index, refused, _sha256(sha256)
    )


def link_refusal(url: str, index: str, page: str = "") -> str:
    """Why the wheel link `url`, listed by `index` on its page `page` (default: the index URL), is not followed;
    "" when it is. An http(s) link is followed from any page; a file:// link only from a file:// index's own page,
    and only to a file inside that index's directory (the folder holding its `simple/`)."""
    try:
        scheme = urllib.parse.urlsplit(url).scheme.lower()
        local = all(
            urllib.parse.urlsplit(u).scheme.lower() == "file" for u in (index, page or index)
        )
    except ValueError:
        return "refused: its URL is not a URL"
    if scheme in SCHEMES:
        return (
            "" if _origin(url) else "refused: its URL has no host (or a port that is not a number)"
        )
    if scheme == "file" and local:
        root = os.path.realpath(_file_path(index.rstrip("/")))
        if os.path.basename(root) == "simple":
            root = os.path.dirname(root)
        target = os.path.realpath(_file_path(url))
        if os.path.commonpath([root, target]) == root:
            return ""
        return f"refused: a file:// link out of the index's directory {root}"
    what = f"a {scheme}: link" if scheme else "a link without a scheme"
    return f"refused: {what} on an http(s) index page (only http(s) links are followed)"


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
    """The project page's wheels (a wheel whose link is not followed has `refused` set). Raises SourceError when
    the page is neither PEP 691 JSON nor PEP 503 HTML."""
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
                url = urllib.parse.urldefrag(urllib.parse.urljoin(base_url, entry["url"]))[0]
                hashes = entry.get("hashes")
                wheel = _wheel(
                    entry["filename"],
                    url,
                    _metadata_flag(metadata),
                    bool(entry.get("yanked")),
                    index,
                    base_url,
                    hashes.get("sha256", "") if isinstance(hashes, dict) else "",
                )
                if wheel:
                    wheels.append(wheel)
        except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as exc:
            raise SourceError(
                f"{log.mask(base_url)} is not a PEP 691 simple index page ({type(exc).__name__}: "
                f"{str(exc)[:80]})",
                INDEX_HINT,
            ) from None
        return wheels
    parser = _Anchors()
    parser.feed(text)
    if "html" not in content_type and not parser.tags:
        raise SourceError(
            f"{log.mask(base_url)} is not a simple index page (Content-Type {content_type or 'none'}, "
            f"no HTML)",
            INDEX_HINT,
        )
    for attrs in parser.anchors:
        href = attrs.get("href") or ""
        try:
            url, _, fragment = urllib.parse.urljoin(base_url, href).partition("#")
        except ValueError:  # an href urllib cannot split ("http://[x"): not a wheel link
            continue
        filename = urllib.parse.unquote(url.rsplit("/", 1)[-1])
        metadata = attrs.get("data-core-metadata", attrs.get("data-dist-info-metadata"))
        wheel = _wheel(
            filename,
            url,
            _metadata_flag(metadata) if metadata is not None else False,
            "data-yanked" in attrs,
            index,
            base_url,
            fragment[len("sha256=") :] if fragment.startswith("sha256=") else "",
        )
        if wheel:
            wheels.append(wheel)
    if not parser.anchors:
        raise SourceError(
            f"{log.mask(base_url)} is not a simple index page (no links in it)", INDEX_HINT
        )
    return wheels


def _file_path(url: str) -> Path:
    return Path(urllib.request.url2pathname(urllib.parse.urlsplit(url).path))


def project_url(index: str) -> str:
    return index.rstrip("/") + f"/{PROJECT}/"


def fetch_index(client: Client, index: str) -> list[WheelFile] | None:
    """The wheels `index` lists for torch-npu; None when the index has no such project (HTTP 404, no directory)."""
    url = project_url(index)
    if urllib.parse.urlsplit(url).scheme.lower() == "file":
        page = _file_path(url) / "index.html"
        try:
            body = untrusted.read_regular(page, None, PAGE_MAX)
        except untrusted.Refused as exc:
            if exc.kind == "os" and exc.errno in (errno.ENOENT, errno.ENOTDIR):
                return None
            raise SourceError(
                f"cannot read the index page {page}: it {exc.why}",
                "make it a regular file of the index (no link, no pipe), or pass --index-url",
            ) from None
        return parse_index_page(body, "text/html", page.as_uri(), index)
    try:
        with client.open(url, {"Accept": ACCEPT}, what=index) as response:
            try:
                body = read_capped(response, PAGE_MAX, public_url(url))
            except TooLarge as exc:
                raise SourceError(f"{exc}: not a simple index page", INDEX_HINT) from None
            except (OSError, http.client.HTTPException) as exc:
                raise SourceError(
                    f"cannot read {public_url(url)}: {failure_reason(exc, client.settings.timeout)}",
                    unreachable_hint(),
                ) from None
            client.count(len(body))
            return parse_index_page(
                body, response.headers.get("Content-Type", ""), response.geturl(), index
            )
    except urllib.error.HTTPError as exc:
        if exc.code in (404, 410):
            return None
        hint = (
            "the index wants a login: put user:password@ in its URL (--index-url or pip's index-url), as for pip"
            if exc.code in (401, 403)
            else INDEX_HINT
        )
        raise SourceError(f"{public_url(url)}: HTTP {exc.code} {exc.reason}", hint) from None


# ---------------------------------------------------------------------------------------------------------------
# Metadata: .metadata file, else the METADATA member through HTTP range requests
# ---------------------------------------------------------------------------------------------------------------


class NoMetadata(Exception):
    """This wheel's metadata could not be read without downloading it (the reason is the message)."""


class RangeFile:
    """A read-only, seekable view of a remote file; every read that misses the cache is one HTTP range request. An
    answer must be the range asked, exactly, with the same total size every time; one wheel costs at most
    RANGE_REQUESTS requests of at most RANGE_MAX bytes each (NoMetadata beyond)."""

    def __init__(self, client: Client, url: str) -> None:
        self.client = client
        self.url = url
        self.pos = 0
        self.blocks: list[tuple[int, bytes]] = []
        self.requests = 0
        self.size = -1  # the total the first answer gives
        self.blocks.append(self._get(None, TAIL_BYTES))

    def _get(self, start: int | None, length: int) -> tuple[int, bytes]:
        """`length` bytes from `start` (None: the last `length` bytes) in one range request: (start, data)."""
        if self.requests >= RANGE_REQUESTS:
            raise NoMetadata(f"more than {RANGE_REQUESTS} range requests for one wheel")
        if not 0 < length <= RANGE_MAX:
            raise NoMetadata(f"a range of {length} bytes asked (at most {RANGE_MAX >> 20} MiB)")
        spec = f"bytes=-{length}" if start is None else f"bytes={start}-{start + length - 1}"
        self.requests += 1
        try:
            response = self.client.open(self.url, {"Range": spec, "Accept-Encoding": "identity"})
        except urllib.error.HTTPError as exc:
            moved = f" ({exc.reason})" if 300 <= exc.code < 400 else ""  # a redirect refused
            raise NoMetadata(f"HTTP {exc.code} for a range of the wheel{moved}") from None
        with response:
            header = response.headers.get("Content-Range", "")
            if response.status != 206 or not header:
                raise NoMetadata(
                    "the server ignores HTTP range requests (no .metadata file either)"
                )
            match = re.fullmatch(r"bytes (\d{1,15})-(\d{1,15})/(\d{1,15})", header.strip())
            if not match:
                raise NoMetadata(
                    f"the answer to {spec} has Content-Range {log.sanitise(header[:60])!r}"
                )
            first, last, total = (int(g) for g in match.groups())
            if self.size >= 0 and total != self.size:
                raise NoMetadata(
                    f"the wheel's size changed between range requests ({self.size} -> {total})"
                )
            want = (
                (max(0, total - length), total - 1)
                if start is None
                else (start, min(start + length, total) - 1)
            )
            if (first, last) != want or last < first:
                raise NoMetadata(
                    f"the answer to {spec} is bytes {first}-{last}/{total}, not the range asked"
                )
            data = response.read(last - first + 1)
            self.client.count(len(data))
        if len(data) != last - first + 1:
            raise NoMetadata(
                f"the answer to {spec} ended after {len(data)} of {last - first + 1} bytes"
            )
        self.size = total
        return first, data

    def _fetch(self, start: int, end: int) -> None:
        """Cache bytes start..end (at least TAIL_BYTES / 4 of them, within the file)."""
        if not 0 <= start < self.size:
            raise NoMetadata(
                f"the zip points at byte {start}, outside the wheel ({self.size} bytes)"
            )
        length = min(max(end - start, TAIL_BYTES // 4), self.size - start)
        self.blocks.append(self._get(start, length))

    def seekable(self) -> bool:
        return True

    def readable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = 0) -> int:
        self.pos = {0: offset, 1: self.pos + offset, 2: self.size + offset}[whence]
        return self.pos

    def tell(self) -> int:
        return self.pos

    def read(self, n: int | None = -1) -> bytes:
        """Bytes from the cache, the missing parts fetched: a loop that ends, since every fetch starts at `pos` and
        brings at least one byte, and the fetches are counted."""
        end = self.size if n is None or n < 0 else min(self.size, self.pos + n)
        out = bytearray()
        while self.pos < end:
            block = next(
                ((s, d) for s, d in reversed(self.blocks) if s <= self.pos < s + len(d)), None
            )
            if block is None:
                self._fetch(self.pos, end)
                continue
            start, data = block
            piece = data[self.pos - start : end - start]
            out += piece
            self.pos += len(piece)
        return bytes(out)

    def close(self) -> None:
        self.blocks = []


def _metadata_from_zip(archive: zipfile.ZipFile) -> bytes:
    infos = [i for i in archive.infolist() if re.match(r"^[^/]+\.dist-info/METADATA$", i.filename)]
    if len(infos) != 1:
        raise NoMetadata(f"{len(infos)} *.dist-info/METADATA members in the wheel")
    if max(infos[0].file_size, infos[0].compress_size) > METADATA_MAX:
        raise NoMetadata(f"its METADATA member is larger than {METADATA_MAX >> 20} MiB")
    with archive.open(infos[0]) as member:
        data = member.read(METADATA_MAX + 1)
    if len(data) > METADATA_MAX:
        raise NoMetadata(f"its METADATA member is larger than {METADATA_MAX >> 20} MiB")
    return data


def read_metadata(client: Client, wheel: WheelFile) -> tuple[bytes, str]:
    """METADATA bytes and how they were read ("metadata file" | "range requests (N)" | "local file"); NoMetadata
    (the reason) when the wheel's link is not followed or its metadata cannot be read within the caps."""
    refused = wheel.refused or link_refusal(wheel.url, wheel.index)
    if refused:
        raise NoMetadata(refused)
    if urllib.parse.urlsplit(wheel.url).scheme.lower() == "file":
        try:
            fd = untrusted.open_regular(_file_path(wheel.url))
        except untrusted.Refused as exc:
            raise NoMetadata(f"cannot read {wheel.filename}: it {exc.why}") from None
        try:
            with os.fdopen(fd, "rb") as fh, zipfile.ZipFile(fh) as archive:
                return _metadata_from_zip(archive), "local file"
        except (OSError, zipfile.BadZipFile) as exc:
            raise NoMetadata(f"cannot read {wheel.filename}: {exc}") from None
    if wheel.metadata:
        data: bytes | None = None
        try:
            with client.open(wheel.url + ".metadata") as response:
                data = read_capped(response, METADATA_MAX, f"{wheel.filename}.metadata")
                client.count(len(data))
        except urllib.error.HTTPError:
            data = None  # advertised but absent: read it from the wheel instead
        except TooLarge as exc:
            raise NoMetadata(str(exc)) from None
        if data is not None:
            digest = wheel.metadata.get("sha256") if isinstance(wheel.metadata, dict) else None
            if digest and hashlib.sha256(data).hexdigest() != digest:
                raise NoMetadata(
                    f"{wheel.filename}.metadata does not match its sha256 on the index"
                )
            return data, "metadata file"
    remote = RangeFile(client, wheel.url)
    data = _metadata_from_tail(remote)
    if (
        data is None
    ):  # not in the tail (or zip64): let zipfile walk the whole central directory, range by range
        try:
            with zipfile.ZipFile(remote) as archive:  # a seekable file object
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
        cd_size, cd_offset = struct.unpack("<II", tail[eocd + 12 : eocd + 20])
        if 0xFFFFFFFF in (cd_size, cd_offset) or cd_offset >= remote.size:
            return None
        remote.seek(cd_offset)
        entry = _metadata_entry(remote.read(min(cd_size, TAIL_BYTES)))
    if entry is None:
        return None
    method, crc, size, offset, name_len = entry
    if size > METADATA_MAX:
        raise NoMetadata(f"its METADATA member is larger than {METADATA_MAX >> 20} MiB")
    remote._fetch(
        offset, offset + 30 + name_len + 1024 + size
    )  # the member and its local header in one request
    remote.seek(offset)
    local = remote.read(30)
    if local[:4] != b"PK\x03\x04":
        return None
    remote.seek(offset + 30 + sum(struct.unpack("<HH", local[26:30])))
    raw = remote.read(size)
    if method == 8:
        inflate = zlib.decompressobj(-15)
        data = inflate.decompress(raw, METADATA_MAX + 1)
        if len(data) > METADATA_MAX:
            raise NoMetadata(f"its METADATA member is larger than {METADATA_MAX >> 20} MiB")
    else:
        data = raw
    if zlib.crc32(data) & 0xFFFFFFFF != crc:
        raise NoMetadata("the METADATA member does not match its CRC-32")
    return data


def _metadata_entry(block: bytes) -> tuple[int, int, int, int, int] | None:
    """(method, crc, compressed size, local header offset, name length) of `*.dist-info/METADATA` in a piece of a
    zip central directory; None when it is not in it, or is zip64 or compressed other than stored/deflated."""
    for match in re.finditer(rb"PK\x01\x02", block):
        head = block[match.start() : match.start() + 46]
        if len(head) < 46:
            break
        method, crc, size, _, name_len, _, _ = struct.unpack("<HxxxxIIIHHH", head[10:34])
        offset = struct.unpack("<I", head[42:46])[0]
        if re.fullmatch(
            rb"[^/]+\.dist-info/METADATA", block[match.start() + 46 : match.start() + 46 + name_len]
        ):
            if 0xFFFFFFFF in (size, offset) or method not in (0, 8):
                return None
            return method, crc, size, offset, name_len
    return None


@dataclass(frozen=True)
class Metadata:
    name: str
    version: str
    requires_python: str
    torch: str  # the Requires-Dist on torch as written ("torch==2.13.0.*"), "" when none
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
                    torch_version = _public(
                        spec.version[:-2] if spec.version.endswith(".*") else spec.version
                    )
                except InvalidVersion:
                    continue
        break
    return Metadata(
        msg.get("Name", ""),
        msg.get("Version", ""),
        msg.get("Requires-Python", "") or "",
        torch_req,
        torch_version,
    )


def mismatch(meta: Metadata, wheel: WheelFile) -> str:
    """Why `meta` is not the metadata of `wheel` (its Name is not torch-npu, or its Version is not the version in
    the wheel's file name); "" when it is."""
    if canonicalize_name(meta.name) != PROJECT:
        return f"its metadata names {untrusted.shown(meta.name)}, not {PROJECT}"
    try:
        same = Version(meta.version) == Version(wheel.version)
    except InvalidVersion:
        same = False
    if not same:
        return f"its metadata has Version {untrusted.shown(meta.version)}, its file name {wheel.version}"
    return ""


def _public(version: str) -> str:
    parsed = Version(version)
    return parsed.public if not parsed.local else version.split("+", 1)[0]
