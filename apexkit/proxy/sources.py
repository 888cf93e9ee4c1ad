"""Probe every configured source (apexkit.config) through the configured proxy, one row each with its fix:
git URLs with `git ls-remote` (no credential prompt), package and team indexes with an HTTP GET, registry prefixes
with GET /v2/, the Debian and Python mirrors with a GET, directories by looking. In parallel, each with a short
timeout, the whole bounded (TOTAL seconds), so `doctor` and `proxy.check` say which source is closed before a
build's `git fetch` does.

Credentials in a URL never reach a command line: git is asked without them (a server that asks for them has
answered: the build sends the URL's own), an index gets them as an Authorization header.
"""

from __future__ import annotations

import base64
import concurrent.futures
import os
import re
import ssl
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path

from apexkit import checks, config, log, netenv, vocab
from apexkit.proxy.layers import host_port

AREA = "sources"
TIMEOUT = 5.0  # one probe
TOTAL = 10.0  # all of them together


def _fix(value: config.Value) -> str:
    setting = config.BY_KEY[value.key]
    where = f"{value.key} (config file)" + (f" or {setting.env}" if setting.env else "")
    return (
        f"set {where} to a mirror you can reach, or check the proxy: {vocab.command('proxy.check')}"
    )


def _split_userinfo(url: str) -> tuple[str, str | None]:
    """(the URL without user:password@, a Basic Authorization header value or None)."""
    parts = urllib.parse.urlsplit(url)
    if "@" not in parts.netloc:
        return url, None
    userinfo, _, hostport = parts.netloc.rpartition("@")
    user, _, password = userinfo.partition(":")
    token = base64.b64encode(
        f"{urllib.parse.unquote(user)}:{urllib.parse.unquote(password)}".encode()
    ).decode()
    return urllib.parse.urlunsplit(parts._replace(netloc=hostport)), f"Basic {token}"


def _bypass(url: str, no_proxy: str) -> bool:
    """Whether no_proxy covers the URL's host as curl (git) reads it: names and domains, and CIDR blocks."""
    import ipaddress

    host = urllib.parse.urlsplit(url).hostname or ""
    for entry in (e.strip() for e in no_proxy.split(",")):
        if not entry:
            continue
        if entry == "*":
            return True
        try:
            if ipaddress.ip_address(host) in ipaddress.ip_network(entry, strict=False):
                return True
            continue
        except ValueError:
            pass
        name = entry.lstrip(".").lower()
        if host.lower() == name or host.lower().endswith("." + name):
            return True
    return False


def get(
    url: str, proxy: str | None, no_proxy: str, ca_bundle: str | None, timeout: float = TIMEOUT
) -> tuple[int | None, object, str]:
    """One GET, through `proxy` unless no_proxy covers the host: (HTTP status or None, why it failed, what happened).
    The environment's proxy variables are not read: `proxy` is the one configured. Credentials in either URL go in
    an Authorization or Proxy-Authorization header, never into what is shown."""
    public, auth = _split_userinfo(url)
    via_proxy = proxy if proxy and not _bypass(public, no_proxy) else None
    request = urllib.request.Request(public, method="GET")
    if auth:  # unredirected: a mirror's login never follows a redirect to another host
        request.add_unredirected_header("Authorization", auth)
    via = ""
    if via_proxy:  # set on the request, not by ProxyHandler, which would obey the shell's no_proxy
        proxy_public, proxy_auth = _split_userinfo(via_proxy)
        # the target's Host first: set_proxy makes request.host the proxy's, which an https tunnel would send
        request.add_unredirected_header("Host", urllib.parse.urlsplit(public).netloc)
        request.set_proxy(urllib.parse.urlsplit(proxy_public).netloc, "http")
        via = f" via {host_port(via_proxy)}"
        if proxy_auth:
            request.add_unredirected_header("Proxy-Authorization", proxy_auth)
    opener = urllib.request.build_opener(
        urllib.request.ProxyHandler({}),
        urllib.request.HTTPSHandler(context=ssl.create_default_context(cafile=ca_bundle)),
    )
    start = time.monotonic()
    try:
        with opener.open(request, timeout=timeout) as response:
            response.read(1024)
            code = response.status
    except urllib.error.HTTPError as exc:
        code = exc.code
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        return None, reason, f"GET {log.mask(public)}{via}: {log.mask(str(reason))[:160]}"
    return (
        code,
        None,
        f"GET {log.mask(public)}{via}: HTTP {code} in {time.monotonic() - start:.1f}s",
    )


def git_ls_remote(
    url: str, proxy: str | None, no_proxy: str, ca_bundle: str | None, timeout: float = TIMEOUT
) -> tuple[bool, str]:
    """`git ls-remote URL HEAD` through the proxy: no prompt (GIT_TERMINAL_PROMPT=0), no credentials on the command
    line (a server asking for them has answered), ssh in batch mode. (reachable, what happened)."""
    public, auth = (
        _split_userinfo(url) if url.lower().startswith(("http://", "https://")) else (url, None)
    )
    env = {
        **{
            k: v
            for k, v in os.environ.items()
            if k
            not in (
                "http_proxy",
                "https_proxy",
                "HTTP_PROXY",
                "HTTPS_PROXY",
                "all_proxy",
                "ALL_PROXY",
            )
        },
        "GIT_TERMINAL_PROMPT": "0",
        "GIT_ASKPASS": "true",
        "SSH_ASKPASS": "true",
        "GIT_SSH_COMMAND": f"ssh -o BatchMode=yes -o ConnectTimeout={int(timeout)}",
    }
    if proxy:
        env.update(http_proxy=proxy, https_proxy=proxy, no_proxy=no_proxy, NO_PROXY=no_proxy)
    if ca_bundle:
        env["GIT_SSL_CAINFO"] = ca_bundle
    start = time.monotonic()
    argv = [
        "git",
        "-c",
        "credential.helper=",
        "-c",
        "http.lowSpeedLimit=1",
        "-c",
        f"http.lowSpeedTime={int(timeout)}",
        "ls-remote",
        "--",
        public,
        "HEAD",
    ]
    try:
        proc = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            env=env,
            timeout=timeout + 1,
            stdin=subprocess.DEVNULL,
        )
    except FileNotFoundError:
        return False, "git is not installed (not on PATH)"
    except subprocess.TimeoutExpired:
        return False, f"git ls-remote {log.mask(public)}: no answer within {timeout + 1:.0f}s"
    if proc.returncode == 0:
        head = (proc.stdout.split() or ["(no HEAD)"])[0][:12]
        return (
            True,
            f"git ls-remote {log.mask(public)}: HEAD {head} in {time.monotonic() - start:.1f}s",
        )
    last = log.mask((proc.stderr.strip().splitlines() or ["failed"])[-1])[:160]
    if auth and re.search(r"Authentication failed|could not read Username|401|403", proc.stderr):
        return (
            True,
            f"git ls-remote {log.mask(public)}: the server asks for credentials (the build sends the URL's)",
        )
    return False, f"git ls-remote {log.mask(public)}: {last}"


def registry_url(prefix: str) -> str:
    """host[:port][/path] -> the /v2/ endpoint docker would ask: http for a loopback host (dockerd treats
    127.0.0.0/8 as insecure), else https."""
    host = prefix.split("/", 1)[0]
    name = host.rsplit(":", 1)[0] if host.count(":") == 1 else host
    scheme = "http" if name == "localhost" or name.startswith("127.") else "https"
    return f"{scheme}://{host}/v2/"


def _probe_item(
    value: config.Value, item: str, proxy: str | None, no_proxy: str, ca_bundle: str | None
) -> tuple[bool, str]:
    """(whether it answered, what happened) for one URL, path or prefix of a source."""
    kind, lower = config.BY_KEY[value.key].kind, item.lower()
    local = kind in ("dirs", "file", "files") or (
        value.key == "team_indexes" and not lower.startswith(("http://", "https://"))
    )
    if kind == "git":
        return git_ls_remote(item, proxy, no_proxy, ca_bundle)
    # a file:// index or mirror is a folder (or a file) here, never a GET (urllib answers a folder with EISDIR)
    if (
        local
        or lower.startswith("file://")
        or (kind not in ("registry", "url", "urls") and item.startswith("/"))
    ):
        path = Path(urllib.parse.unquote(item[7:]) if lower.startswith("file://") else item)
        found = path.expanduser() if local else path
        what = "file" if kind in ("file", "files") else "directory"
        good = (
            found.is_file()
            if what == "file"
            else found.is_dir() or (kind in ("url", "urls") and found.is_file())
        )
        return good, f"{path}: {'a' if good else 'not a'} {what}"
    code, _, text = get(
        registry_url(item) if kind == "registry" else item, proxy, no_proxy, ca_bundle
    )
    if kind == "registry":
        return code in (200, 401), text  # 401: a registry that wants a token has answered
    # a mirror's root may 404: the host answered
    return code is not None and code < (400 if kind in ("url", "urls") else 500), text


def probe(
    value: config.Value, proxy: str | None, no_proxy: str, ca_bundle: str | None
) -> checks.Row:
    """One source's row: each of its URLs, paths or prefixes probed."""
    items = value.value if isinstance(value.value, tuple) else (str(value.value),)
    found = [_probe_item(value, item, proxy, no_proxy, ca_bundle) for item in items]
    ok = all(good for good, _ in found)
    return checks.Row(
        AREA,
        value.key,
        checks.OK if ok else checks.WARN,
        "\n".join([*(text for _, text in found), f"({value.origin})"]),
        "" if ok else _fix(value),
        {"origin": value.origin, "value": value.shown()},
    )


def probe_all(
    values: Sequence[config.Value],
    proxy: str | None,
    no_proxy: str = "",
    ca_bundle: str | None = None,
    defaults: bool = False,
    total: float = TOTAL,
) -> list[checks.Row]:
    """A row per source, in the table's order: the configured ones probed (with `defaults`, the defaults too), in
    parallel, all within `total` seconds; an unset one with no default is left out, an unprobed default skipped.
    A source that does not answer is a warning (a cached or offline build may not need it), with the fix."""
    wanted = [v for v in values if v.value not in ("", ()) and (v.configured or defaults)]
    rows: dict[str, checks.Row] = {}
    left = [v.key for v in values if v.value not in ("", ()) and not (v.configured or defaults)]
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=max(1, min(8, len(wanted))))
    futures = {pool.submit(probe, v, proxy, no_proxy, ca_bundle): v for v in wanted}
    done, _ = concurrent.futures.wait(futures, timeout=total)
    for future, value in futures.items():
        answered = future in done and future.exception() is None
        rows[value.key] = (
            future.result()
            if answered
            else checks.Row(
                AREA,
                value.key,
                checks.WARN,
                f"{value.shown()}: no answer within {total:.0f}s ({value.origin})",
                _fix(value),
            )
        )
    pool.shutdown(wait=False)
    out = [rows[s.key] for s in config.SETTINGS if s.key in rows]
    for row in out:  # the keys proxy.check's rows have always had (its --json readers rely on them)
        row.data.setdefault("configured", row.data.get("origin", ""))
        row.data.setdefault("effective", row.data.get("value", ""))
        row.data.setdefault("probe", row.detail.splitlines()[0] if row.detail else "")
    if left:
        out.append(
            checks.Row(
                AREA,
                "defaults",
                checks.SKIP,
                f"not probed (left at their default): {', '.join(left)}",
                f"configure a mirror for them ({vocab.command('config.show')}), or pass --probe-defaults",
                {"configured": "default", "effective": ", ".join(left), "probe": "not probed"},
            )
        )
    return out


def proxy_of(environ: Mapping[str, str], settings) -> tuple[str | None, str]:
    """(the proxy for the probes, no_proxy): this environment's variables when it sets a proxy (what a build's git
    and pip read), else proxy.setup's saved settings."""
    proxy = netenv.proxy(environ, "https_proxy") or netenv.proxy(environ, "http_proxy")
    if proxy:
        return proxy, environ.get("no_proxy") or environ.get("NO_PROXY") or ""
    if settings is not None and (settings.https or settings.http):
        return settings.https or settings.http, settings.no_proxy_text
    return None, ""
