"""A client for a package index as pip would see it: pip's settings, HTTP with its proxies, CA bundle and logins.

- settings: pip's effective configuration (`apexkit.pipconfig`: index-url, extra-index-url, cert, proxy), or an
  explicit --index-url; the proxies (pip's proxy option wins, as in pip) and CA bundle this environment sets
  (`apexkit.netenv`);
- `Client`: urllib with that CA bundle and those proxies (NO_PROXY per host), bounded retries, one-line errors;
  http(s) only (the opener has no file, ftp or data handler; a redirect elsewhere is refused); user:password@ in an
  index URL travels as Basic auth to that index's scheme, host and port only, never into a report.

The team indexes (remote.py, published.py) and `apexkit install` use it; the maintainers' reader of torch-npu pages
and wheel METADATA (PEP 503/691, PEP 658, HTTP range requests) is tools/wheelindex.py, on top of it.
"""

from __future__ import annotations

import base64
import math
import os
import re
import socket
import ssl
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field

from apexkit import log, netenv, pipconfig, urls, vocab
from apexkit.errors import ConfigError, SourceError
from apexkit.wheel.sources import RetryPolicy

DEFAULT_INDEX = "https://pypi.org/simple"
SCHEMES = ("http", "https")  # what the client asks, and what a remote page may link to


def unreachable_hint() -> str:
    return f"check the proxy ({vocab.command('proxy.check')}) or pass --index-url"


CA_HINT = (
    "give the CA that signed its certificate: PIP_CERT=FILE, or pip's cert (pip config set global.cert FILE: "
    "cert = FILE in pip.conf), or SSL_CERT_FILE=FILE"
)


class Denied(SourceError):
    """The index answered, but not to this client as configured: its TLS certificate is not verified by the CA
    bundle given, or it refused the credentials (HTTP 401/403). Asking again does not help: with a team index
    configured, the build and `install` stop on it (unless asked to fall back to compiling)."""


def credentials_refused(cl: Client, url: str, code: int, answered: str | None = None) -> Denied:
    """The error for an index that answered `url` with 401/403 (from `answered`, where a redirect led): where the
    credentials came from, masked."""
    answered = url if not answered or public_url(answered) == public_url(url) else answered
    if answered != url:  # the login is never forwarded past a redirect (Client.open)
        sent = f"redirected from {log.mask(url)}; the index URL's user:password@ is not sent there"
    elif cl._authorization(url):
        sent = "the user:password@ of its URL was sent"
    else:
        sent = "none were sent: its URL has no user:password@"
    return Denied(
        f"credentials refused by {log.mask(answered)} (HTTP {code}; {sent})",
        "put the right user:password@ in the index URL (percent-encode reserved characters), or ask the index's "
        "owner for access",
    )


INDEX_HINT = "pass --index-url with a PEP 503/691 simple index that serves torch-npu (e.g. https://pypi.org/simple)"


# ---------------------------------------------------------------------------------------------------------------
# Settings: pip's configuration, resolved once
# ---------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class IndexSettings:
    urls: tuple[str, ...]  # the index first, then pip's extra indexes
    origin: str  # where `urls` came from, for the report
    cert: str | None = None  # CA bundle (pip's cert or PIP_CERT, else netenv.CA_VARIABLES)
    proxies: Mapping[str, str] = field(
        default_factory=dict
    )  # scheme -> proxy URL; "no" -> NO_PROXY
    timeout: float = 20.0


def resolve_settings(
    index_url: str | None,
    env: Mapping[str, str],
    timeout: float = 20.0,
    pip_config: Mapping[str, str] | None = None,
) -> IndexSettings:
    """The index URLs, CA bundle, proxies and timeout of `pip install` in `env` (pip's configuration: `pip_config`,
    else read through `pipconfig`), `index_url` replacing pip's indexes when given."""
    conf = pipconfig.read(env) if pip_config is None else pipconfig.PipConfig(pip_config)
    if index_url:
        urls, origin = [index_url], "--index-url"
    else:
        primary = conf.get("index-url")
        origin = "pip config index-url" if primary else f"pip's default index ({DEFAULT_INDEX})"
        urls = [primary or DEFAULT_INDEX, *conf.get_list("extra-index-url")]
        if len(urls) > 1:
            origin += " + extra-index-url"
    # pip's cert (PIP_CERT included), else the first CA variable set (proxy.setup --ca-cert sets them all)
    cert_origin = (
        ("pip's cert option or PIP_CERT", conf["cert"])
        if conf.get("cert")
        else netenv.ca_variable(env) or (None, None)
    )
    if cert_origin[1] and not os.path.isfile(cert_origin[1]):
        raise ConfigError(
            f"the CA bundle {cert_origin[1]} ({cert_origin[0]}) does not exist",
            "fix pip's cert setting (pip config list) or the variable",
        )
    for url in urls:
        check_index_url(
            url.strip(), "--index-url" if index_url else "pip's index-url / extra-index-url"
        )
    if not 0 < timeout < math.inf:
        raise ConfigError(
            f"timeout {timeout!r} is not a positive number of seconds", "pass --timeout like 20"
        )
    proxies = netenv.proxies(env)
    if conf.get("proxy"):  # pip's own proxy option wins over the environment, as in pip
        proxies.update(http=conf["proxy"], https=conf["proxy"])
    return IndexSettings(
        tuple(dict.fromkeys(u.strip() for u in urls if u.strip())),
        origin,
        cert_origin[1],
        proxies,
        timeout,
    )


def check_index_url(url: str, where: str) -> None:
    """An index is an http://, https:// (with a host) or file:// URL; anything else is one ConfigError."""
    if not url:
        return
    hint = (
        f"pass {where} with an http://, https:// or file:// index (e.g. https://pypi.org/simple)"
        if where.startswith("--")
        else "fix it (pip config list; pip config set global.index-url URL) or pass --index-url"
    )
    try:
        parts = urllib.parse.urlsplit(url)
        if parts.scheme.lower() in SCHEMES and parts.hostname:
            urls.index_url(url, where)  # the one URL validator: a password is never quoted
        _ = parts.port  # raises ValueError for a port that is not a number
    except ValueError as exc:
        raise ConfigError(f"{where} {log.mask(url)} is not a URL ({exc})", hint) from None
    if parts.scheme not in ("http", "https", "file"):
        what = f"a {parts.scheme}:// URL" if parts.scheme else "not a URL (no scheme)"
        raise ConfigError(
            f"{where} {log.mask(url)} is {what}; an index is read over http(s) or from file://",
            hint,
        )
    if parts.scheme != "file" and not parts.hostname:
        raise ConfigError(f"{where} {log.mask(url)} has no host name", hint)


# ---------------------------------------------------------------------------------------------------------------
# HTTP: one client, bounded retries, one-line errors
# ---------------------------------------------------------------------------------------------------------------


class Client:
    """urllib with the CA bundle and proxies of `settings`; NO_PROXY honoured per host."""

    def __init__(self, settings: IndexSettings, retry: RetryPolicy | None = None) -> None:
        self.settings = settings
        self.retry = retry or RetryPolicy.from_env()
        context = (
            ssl.create_default_context(cafile=settings.cert)
            if settings.cert
            else ssl.create_default_context()
        )
        proxies = {k: v for k, v in settings.proxies.items() if k in SCHEMES}
        self._proxied = _http_opener(context, proxies)
        self._direct = _http_opener(context, {})
        # pip accepts user:password@ in an index URL (a private mirror); urllib does not: send it as Basic auth, to
        # that index's scheme, host and port only (as pip does): not to another port or over http on the same host
        self._auth: dict[tuple[str, str, int], str] = {}
        for index in settings.urls:
            origin = _origin(index)
            parts = urllib.parse.urlsplit(index)
            if origin is not None and parts.username is not None:
                token = f"{urllib.parse.unquote(parts.username)}:{urllib.parse.unquote(parts.password or '')}"
                self._auth.setdefault(origin, "Basic " + base64.b64encode(token.encode()).decode())
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
        url, request = self._request(url, headers)
        delay = self.retry.backoff
        for attempt in range(1, self.retry.attempts + 1):
            try:
                with self._lock:
                    self.requests += 1
                return self._opener(url).open(request, timeout=self.settings.timeout)
            except urllib.error.HTTPError as exc:
                if exc.code == 407 or (
                    exc.code == 401 and self.via(url)
                ):  # tinyproxy, among others, sends 401
                    self._proxy_refused(url, exc.code)
                if (exc.code < 500 and exc.code != 429) or attempt == self.retry.attempts:
                    raise
            except (urllib.error.URLError, OSError) as exc:
                reason = failure_reason(exc, self.settings.timeout)
                tunnel = re.search(r"Tunnel connection failed: (40[17])", reason)
                if tunnel:
                    self._proxy_refused(url, int(tunnel[1]))
                if attempt == self.retry.attempts or "certificate" in reason:
                    raise self._unreachable(url, what, reason) from None
            except (
                ValueError
            ) as exc:  # a URL, proxy or timeout urllib/socket refuse: no retry helps
                raise ConfigError(
                    f"cannot ask {log.mask(url)}: {exc}",
                    "check --index-url, --timeout and the proxy variables",
                ) from None
            time.sleep(delay)
            delay *= 2
        raise AssertionError("unreachable")  # pragma: no cover

    def _request(
        self, url: str, headers: Mapping[str, str] | None
    ) -> tuple[str, urllib.request.Request]:
        """`url` without its login, and the request for it (the login as an Authorization header); http(s) only."""
        try:
            url = public_url(url)
            request = urllib.request.Request(
                url, headers={"User-Agent": "apexkit-refresh", **(headers or {})}
            )
        except ValueError as exc:
            raise ConfigError(f"cannot ask {log.mask(url)}: {exc}", INDEX_HINT) from None
        if request.type not in SCHEMES:
            raise ConfigError(
                f"cannot ask {log.mask(url)}: a {request.type}: URL (apexkit asks an index over http(s) only)",
                INDEX_HINT,
            )
        auth = self._authorization(url)
        if auth:  # unredirected: a redirect to another host (a CDN) does not get the mirror's login
            request.add_unredirected_header("Authorization", auth)
        return url, request

    def _unreachable(self, url: str, what: str, reason: str) -> SourceError:
        """The error for an index (or its proxy) that did not answer `url` after the retries."""
        target = public_url(what) if what else urllib.parse.urlsplit(url).netloc
        if self.via(url) and reason == "connection refused":
            return SourceError(
                f"cannot reach the proxy{self.via(url)[10:]} for {target}: connection refused",
                f"is the proxy running? check it with {vocab.command('proxy.check')}",
            )
        if "certificate" in reason:
            return Denied(f"cannot reach {target}{self.via(url)}: {reason}", CA_HINT)
        return SourceError(f"cannot reach {target}{self.via(url)}: {reason}", unreachable_hint())

    def _authorization(self, url: str) -> str | None:
        """The Basic auth header for `url`: that of the index with the same scheme, host and port, if any."""
        origin = _origin(url)
        return self._auth.get(origin) if origin is not None else None

    def _proxy_refused(self, url: str, code: int) -> None:
        raise SourceError(
            f"the proxy{self.via(url)[10:]} refused the credentials (HTTP {code}) for "
            f"{log.mask(url)}",
            "check user:password in the proxy URL (percent-encode @ : / in them), "
            f"then {vocab.command('proxy.check')}",
        ) from None


class _Redirects(urllib.request.HTTPRedirectHandler):
    """urllib's redirects, to http(s) only (urllib itself would follow one to ftp://)."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        if urllib.parse.urlsplit(newurl).scheme.lower() not in SCHEMES:
            raise urllib.error.HTTPError(
                req.full_url, code, "a redirect to a URL that is not http(s)", headers, fp
            )
        return super().redirect_request(req, fp, code, msg, headers, newurl)


def _http_opener(
    context: ssl.SSLContext, proxies: Mapping[str, str]
) -> urllib.request.OpenerDirector:
    """An opener with the HTTP(S) handlers only: build_opener would add file://, ftp:// and data: handlers."""
    opener = urllib.request.OpenerDirector()
    for handler in (
        urllib.request.ProxyHandler(dict(proxies)),
        urllib.request.UnknownHandler(),
        urllib.request.HTTPHandler(),
        urllib.request.HTTPSHandler(context=context),
        urllib.request.HTTPDefaultErrorHandler(),
        _Redirects(),
        urllib.request.HTTPErrorProcessor(),
    ):
        opener.add_handler(handler)
    return opener


def _origin(url: str) -> tuple[str, str, int] | None:
    """(scheme, host, port) of an http(s) URL, the port filled in; None for anything else."""
    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port
    except ValueError:
        return None
    scheme = parts.scheme.lower()
    if scheme not in SCHEMES or not parts.hostname:
        return None
    return scheme, parts.hostname.lower(), port or (443 if scheme == "https" else 80)


def public_url(url: str) -> str:
    """`url` without user:password@ (they travel as a header, and never into a report or matrix.toml)."""
    parts = urllib.parse.urlsplit(url)
    if parts.username is None and parts.password is None:
        return url
    host = parts.hostname or ""
    netloc = (f"[{host}]" if ":" in host else host) + (f":{parts.port}" if parts.port else "")
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc))


def failure_reason(exc: BaseException, timeout: float) -> str:
    reason = getattr(exc, "reason", exc)
    if isinstance(reason, ssl.SSLCertVerificationError) or "CERTIFICATE_VERIFY_FAILED" in str(
        reason
    ):
        return "TLS certificate verification failed"
    if isinstance(reason, socket.gaierror):
        return f"DNS lookup failed ({reason.strerror or reason})"
    if isinstance(reason, ConnectionRefusedError):
        return "connection refused"
    if isinstance(reason, (socket.timeout, TimeoutError)) or "timed out" in str(reason):
        return f"no answer within {timeout:g} s"
    text = str(getattr(reason, "strerror", None) or reason)
    return log.mask(text) or type(reason).__name__
