"""One validator for every URL apexkit writes into a file or a build argument: proxies, pip indexes, registry mirrors.

Each URL lands in a consumer with its own parser (a shell, systemd, dockerd's Go net/url, pip's INI reader, curl),
so the rules are the strictest common form:
- no control character and no whitespace anywhere (a newline in --pip-index would start a new pip.conf section);
- the userinfo (`user:password@`) holds only RFC 3986 characters: a reserved character in a password must be
  percent-encoded (`/` -> %2F, `#` -> %23, `@` -> %40, ...), otherwise the parsers disagree on where the host
  starts (Python and Go split at the last '@', curl at the first);
- the consumers that forbid userinfo (dockerd's registry mirrors, image build arguments that `docker history`
  records) get none.

An error never quotes the URL: at most its scheme and host (a password that breaks parsing shows up where the port
or the host was expected, so echoing the parser's own message leaks it).
"""

from __future__ import annotations

import ipaddress
import re
from urllib.parse import SplitResult, urlsplit

from apexkit.errors import ConfigError

_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
_HOSTNAME = re.compile(
    r"^(?=.{1,253}\Z)([a-z0-9_]([a-z0-9_-]{0,61}[a-z0-9])?)(\.[a-z0-9_]([a-z0-9_-]{0,61}[a-z0-9])?)*\.?\Z"
)
# RFC 3986 userinfo: unreserved / pct-encoded / sub-delims / ":" (Go's net/url refuses anything else)
_USERINFO = re.compile(r"^(?:[A-Za-z0-9\-._~!$&'()*+,;=:]|%[0-9A-Fa-f]{2})*\Z")
# C0 controls, space, DEL, C1 controls and the other Unicode whitespace
_BAD_CHAR = re.compile(r"[\x00-\x20\x7f-\x9f\s]")
ENCODE_HINT = "percent-encode reserved characters in the user name or password (/ -> %2F, # -> %23, @ -> %40, ? -> %3F)"


def _host_text(host: str) -> str | None:
    """The host in its canonical written form ([v6] in brackets), or None when it is not a host name or an IP."""
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return host if _HOSTNAME.match(host) else None
    return f"[{address.compressed}]" if address.version == 6 else address.compressed


def shown(value: str) -> str:
    """What an error may quote of a URL: its scheme and its host, nothing else (no user, password, port, path)."""
    match = _SCHEME.match(value)
    scheme = match[1].lower() if match and not _BAD_CHAR.search(match[1]) else ""
    rest = value[match.end() :] if match else value
    rest = rest.rpartition("@")[
        2
    ]  # the host follows the last '@', whatever a malformed password holds
    authority = re.split(r"[/?#\s]", rest, maxsplit=1)[0]
    if authority.startswith("["):
        host = authority[1:].partition("]")[0]
    else:
        host = authority.rpartition(":")[0] if authority.count(":") == 1 else authority
    host_text = _host_text(host.lower()) if host else None
    return f"{scheme + '://' if scheme else ''}{host_text or '…'}"


def has_userinfo(url: str | None) -> bool:
    """Whether a URL carries a user, a password or a token before its host (any '@' in its authority)."""
    if not url:
        return False
    rest = url.split("://", 1)[-1]
    return "@" in rest


def may_hold_secret(value: str) -> bool:
    """Whether a value may carry a credential: any URL (a user, password or token before the host, a ?query, a
    #fragment, a ;parameter, or a token as a path segment, as entitlement-token mirrors do: /<token>/simple/), or
    anything holding '@': such a value goes into files only their owner reads."""
    return "://" in value or any(c in value for c in "@?#;")


def check_chars(value: str, what: str) -> None:
    """Refuse control characters and whitespace anywhere in a URL (a newline would inject lines into pip.conf)."""
    bad = _BAD_CHAR.search(value)
    if bad:
        char = bad.group()
        kind = (
            "a line break"
            if char in "\r\n"
            else "whitespace"
            if char.isspace()
            else "a control character"
        )
        raise ConfigError(
            f"{what} {shown(value)}: the URL holds {kind} (character {bad.start() + 1}); nothing was written",
            "pass the URL alone, without spaces or line breaks; " + ENCODE_HINT,
        )


def split(
    value: str,
    what: str,
    schemes: tuple[str, ...],
    example: str,
    noun: str = "",
    default_scheme: str = "",
) -> tuple[SplitResult, str]:
    """Parse `value` into its parts, or refuse it in one line that quotes only its scheme and host.
    Returns (parts, how errors name it)."""
    raw = value.strip()
    if not raw:
        raise ConfigError(f"{what} is empty", f"pass {what} {example}")
    check_chars(raw, what)
    if "://" not in raw and default_scheme:
        raw = f"{default_scheme}://{raw}"
    where = f"{what} {shown(raw)}"
    rest = raw[_scheme_end(raw, where, schemes, example, noun) :]
    try:
        parts = urlsplit(raw)
    except ValueError:  # an unbalanced '[' of an IPv6 address
        raise ConfigError(
            f"{where}: the host is not a valid host name or [IPv6] address",
            f"write it as {example}",
        ) from None
    _check_userinfo(rest, parts.netloc, where)
    _check_host_port(parts, where, example)
    return parts, where


def _scheme_end(raw: str, where: str, schemes: tuple[str, ...], example: str, noun: str) -> int:
    """Where the scheme and its '://' end; a missing or unaccepted scheme is refused."""
    scheme_match = _SCHEME.match(raw)
    if not scheme_match:
        raise ConfigError(f"{where}: no scheme", f"write it as {example}")
    scheme = scheme_match[1].lower()
    if scheme not in schemes:
        raise ConfigError(
            f"{where}: scheme {scheme!r} is not {noun or 'an accepted'} scheme here",
            f"use one of {', '.join(s + '://' for s in schemes)}",
        )
    return scheme_match.end()


def _check_userinfo(rest: str, netloc: str, where: str) -> None:
    """One '@' at most, inside the authority, before characters a user name or password may hold."""
    if "@" in rest and "@" not in netloc:
        raise ConfigError(
            f"{where}: a '/', '?' or '#' before the '@' ends the host part early "
            "(a password holding them must be encoded)",
            ENCODE_HINT,
        )
    userinfo = netloc.rpartition("@")[0]
    if "@" in userinfo:
        raise ConfigError(
            f"{where}: more than one '@' (a password holding '@' must be encoded)", ENCODE_HINT
        )
    if userinfo and not _USERINFO.match(userinfo):
        raise ConfigError(
            f"{where}: the user name or password holds a character a URL does not allow there",
            ENCODE_HINT,
        )


def _check_host_port(parts: SplitResult, where: str, example: str) -> None:
    """A valid host name or IP address, and a port that is a number in 1-65535 when one is written."""
    out_of_range = ConfigError(
        f"{where}: the port is out of range (1-65535)", f"write it as {example}"
    )
    try:
        port = parts.port
    except ValueError as exc:
        if "out of range" in str(exc):
            raise out_of_range from None
        raise ConfigError(
            f"{where}: the port is not a number (a password holding '/', '#', '?' or '@' must be encoded)",
            ENCODE_HINT,
        ) from None
    host = parts.hostname or ""
    if not host:
        raise ConfigError(f"{where}: no host", f"write it as {example}")
    if _host_text(host) is None:
        raise ConfigError(
            f"{where}: the host is not a valid host name or IP address", "check for typos"
        )
    hostport = parts.netloc.rpartition("@")[2]
    if port == 0 or (port is None and re.search(r":\d*$", hostport) and not hostport.endswith("]")):
        raise out_of_range


def _base(parts: SplitResult, userinfo: bool = True) -> str:
    """scheme://[userinfo@]host[:port], with the scheme and host in lower case."""
    info = parts.netloc.rpartition("@")[0] if userinfo else ""
    port = f":{parts.port}" if parts.port is not None else ""
    return f"{parts.scheme.lower()}://{info + '@' if info else ''}{_host_text(parts.hostname or '')}{port}"


def _host_only(parts: SplitResult, value: str, cause: str, hint: str) -> None:
    """Refuse a path, a query or a fragment (an empty '?' or '#' too): the URL names a host and port only."""
    if (
        parts.path not in ("", "/")
        or parts.query
        or parts.fragment
        or value.strip().endswith(("?", "#"))
    ):
        raise ConfigError(cause, hint)


def proxy_url(value: str, what: str, schemes: tuple[str, ...]) -> str:
    """A proxy: scheme (http:// when missing), [userinfo@], host and port; no path, query or fragment."""
    parts, where = split(
        value, what, schemes, "http://[user:password@]host:port", "a proxy", default_scheme="http"
    )
    if parts.port is None:
        raise ConfigError(
            f"{where}: no port", f"add the proxy's port, e.g. {_base(parts, userinfo=False)}:3128"
        )
    _host_only(
        parts,
        value,
        f"{where}: a proxy URL has no path, query or fragment",
        f"use {_base(parts, userinfo=False)}; {ENCODE_HINT}",
    )
    return _base(parts)


def index_url(value: str, what: str) -> str:
    """A pip index: http(s), [userinfo@]host[:port][/path][?query]; normalised to end with one '/'."""
    parts, where = split(
        value, what, ("http", "https"), "https://mirror.example.com/simple/", "an index"
    )
    if parts.fragment or value.strip().endswith("#"):
        raise ConfigError(
            f"{where}: an index URL has no #fragment", f"drop the '#…' part; {ENCODE_HINT}"
        )
    raw = value.strip()
    return raw if parts.query else raw.rstrip("/") + "/"


def registry_mirror(value: str, what: str) -> str:
    """A Docker registry mirror as dockerd accepts it: http(s)://host[:port] (a trailing '/' is dropped), no userinfo,
    path, query or fragment (dockerd's ValidateMirror refuses them and the daemon does not start -- and setup
    restarts it; checked against a real dockerd in test_proxy_live.py)."""
    parts, where = split(
        value, what, ("http", "https"), "https://mirror.example.com", "a registry mirror"
    )
    if parts.username is not None or "@" in parts.netloc:
        raise ConfigError(
            f"{where}: a registry mirror takes no user name, password or token (dockerd refuses it)",
            "put registry credentials in `docker login`, not in the mirror URL",
        )
    _host_only(
        parts,
        value,
        f"{where}: a registry mirror has no path, ?query or #fragment (dockerd refuses it)",
        f"use {_base(parts)}",
    )
    return _base(parts)
