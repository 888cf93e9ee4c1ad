"""`invoke proxy.check`: for each layer -- configured? effective? does a real request get through?

shell      the profile block; whether this shell has the variables; an HTTPS request through the proxy to the
           package index (with the CA bundle when one is configured)
daemon     the drop-ins / daemon.json; `systemctl show --property=Environment docker` (under systemd); the proxy
           fields of `docker info` -- what the running daemon really uses
container  ~/.docker/config.json; a throwaway container (`--network host`) prints its proxy variables and sends
           CONNECT <index host>:443 through the proxy it was given
"""

from __future__ import annotations

import os
import re
import shutil
import ssl
import subprocess
from urllib.parse import urlsplit

from apexkit import checks, dockerclient, log, netenv, vocab
from apexkit.proxy import sources
from apexkit.proxy.layers import Paths, ProxySettings, host_port, read_state, systemd_running

DEFAULT_INDEX = "https://pypi.org/simple/"
NO_DAEMON = "start dockerd (or set DOCKER_HOST) and run the check again"

# Runs inside the probe container with nothing but bash and coreutils: print the proxy variables (passwords
# masked), then ask the proxy from https_proxy (or http_proxy; lower case first, as netenv.proxy) for a CONNECT
# tunnel to $APEXKIT_PROBE_TARGET.
_SHOWN = " ".join(
    [*(n for name in netenv.PROXY_VARIABLES for n in (name, name.upper())), netenv.CA_VARIABLES[0]]
)
CONTAINER_PROBE = (
    f"""
for v in {_SHOWN}; do
"""
    + r"""  eval "val=\${$v-}"
  [ -n "$val" ] && printf 'env %s=%s\n' "$v" "$(printf '%s' "$val" | sed -E 's#(://[^/:[:space:]]*):[^/[:space:]]*@#\1:***@#; s#://[^/:[:space:]]+@#://***@#')"
done
p="${https_proxy:-${HTTPS_PROXY:-${http_proxy:-${HTTP_PROXY:-}}}}"
[ -n "$p" ] || { echo "result no proxy variable in the container"; exit 3; }
rest="${p#*://}"; rest="${rest%%/*}"; auth=""
case "$rest" in *@*) auth="${rest%@*}"; rest="${rest##*@}";; esac
host="${rest%:*}"; port="${rest##*:}"; host="${host#[}"; host="${host%]}"
exec 3<>"/dev/tcp/$host/$port" || { echo "result cannot connect to $host:$port"; exit 4; }
hdr=""
if [ -n "$auth" ]; then
  hdr="Proxy-Authorization: Basic $(printf '%b' "${auth//%/\\x}" | base64 -w0)"$'\r\n'
fi
printf 'CONNECT %s HTTP/1.1\r\nHost: %s\r\n%s\r\n' "$APEXKIT_PROBE_TARGET" "$APEXKIT_PROBE_TARGET" "$hdr" >&3
IFS= read -r -t 20 status <&3 || status="no answer within 20 s"
echo "result ${status%$'\r'}"
"""
)


def layer_row(
    layer: str, configured: str, effective: str, probe: str, status: str, hint: str = ""
) -> checks.Row:
    """One layer's row of the shared report: the three findings in its detail (and in data), the hint as its fix."""
    return checks.Row(
        "proxy layers",
        layer,
        status,
        f"configured: {configured}\neffective: {effective}\nprobe: {probe}",
        hint,
        {"configured": configured, "effective": effective, "probe": probe},
    )


def probe_https(
    url: str, proxy: str | None, ca_bundle: str | None, timeout: float = 20.0
) -> tuple[bool, str, str]:
    """One HTTPS GET through `proxy` (sources.get). Returns (ok, what happened, hint)."""
    code, reason, what = sources.get(url, proxy, "", ca_bundle, timeout)
    if code is None:
        text = log.mask(str(reason))
        if isinstance(reason, ssl.SSLCertVerificationError) or "CERTIFICATE_VERIFY_FAILED" in text:
            return (
                False,
                f"{what.partition(': ')[0]}: TLS verify failed",
                "pass --ca-cert with your proxy's CA (a TLS-intercepting proxy)",
            )
        status = re.search(r"Tunnel connection failed: (40[17])", text)
        if status:  # 407 is the standard answer; tinyproxy, among others, sends 401
            return (
                False,
                f"{what.partition(': ')[0]}: the proxy refused the credentials ({status[1]})",
                "check user:password in the proxy URL (percent-encode @ : / in them)",
            )
        if isinstance(reason, ConnectionRefusedError) or "refused" in text.lower():
            return False, what, f"is the proxy running on {host_port(proxy)}?"
        return False, what, "check the proxy URL and that the index is allowed through it"
    ok = code < 400
    return ok, what, "" if ok else "the proxy or index answered with an error"


def check_shell(
    paths: Paths, settings: ProxySettings | None, index_url: str, environ=None
) -> checks.Row:
    environ = os.environ if environ is None else environ
    state = read_state(paths)["shell"]
    configured = (
        f"block in {paths.shell_profile}"
        if state.configured
        else f"no block in {paths.shell_profile}"
    )
    if settings is None or not (settings.https or settings.http):
        return layer_row(
            "shell",
            configured,
            "-",
            "-",
            "skip",
            "no proxy configured: invoke proxy.setup --http http://proxy:port",
        )
    want = host_port(settings.https or settings.http)
    have = netenv.proxy(environ, "https_proxy") or netenv.proxy(environ, "http_proxy")
    matches = bool(want) and host_port(have) == want
    ok, probe, hint = probe_https(index_url, settings.https or settings.http, settings.ca_bundle)
    status = "ok" if ok else "fail"
    if ok and not matches:
        status, hint = "warn", 'open a new shell, or: eval "$(invoke proxy.env)"'
    if ok and not state.configured:
        status, hint = (
            "warn",
            f"{vocab.command('proxy.setup')} writes the block, so new shells get the variables",
        )
    effective = "this shell has it" if matches else "not in this shell"
    return layer_row("shell", configured, effective, probe, status, hint)


def docker_client(paths: Paths, timeout: int = 30):
    """The one Docker client (images.client), made with this root's Docker config, or (None, why): the Docker SDK
    is pointed at the config.json of `paths` (under --root too) while the client is made."""
    from apexkit.errors import ImageError

    saved = os.environ.get("DOCKER_CONFIG")
    os.environ["DOCKER_CONFIG"] = str(paths.real(paths.docker_config).parent)
    try:
        return dockerclient.client(timeout=timeout), ""
    except ImageError as exc:
        return None, exc.cause
    finally:
        if saved is None:
            os.environ.pop("DOCKER_CONFIG", None)
        else:
            os.environ["DOCKER_CONFIG"] = saved


def _systemd_environment() -> str | None:
    if not (systemd_running() and shutil.which("systemctl")):
        return None
    result = subprocess.run(
        ["systemctl", "show", "--property=Environment", "docker"], capture_output=True, text=True
    )
    return result.stdout.strip() if result.returncode == 0 else None


def check_daemon(paths: Paths, settings: ProxySettings | None, client, why: str) -> checks.Row:
    state = read_state(paths)["daemon"]
    configured = (
        ", ".join(state.files) if state.configured else "no drop-in and no daemon.json proxies"
    )
    want = host_port(settings.https or settings.http) if settings else ""
    systemd_env = _systemd_environment()
    systemd = "" if systemd_env is None else f"systemctl: {log.mask(systemd_env) or 'Environment='}"
    if client is None:
        return layer_row("daemon", configured, systemd or "-", why, "skip", NO_DAEMON)
    info = client.info()
    https, http, no_proxy = (info.get(k) or "" for k in ("HttpsProxy", "HttpProxy", "NoProxy"))
    probe = log.mask(
        f"docker info: HTTPS Proxy {https or '-'}, HTTP Proxy {http or '-'}, No Proxy {no_proxy or '-'}"
    )
    if not want:
        return layer_row("daemon", configured, systemd or "-", probe, "skip", "no proxy configured")
    if host_port(https or http) == want:
        return layer_row("daemon", configured, systemd or "daemon uses it", probe, "ok")
    hint = (
        "restart the daemon so it reads the drop-ins: sudo systemctl daemon-reload && sudo systemctl restart docker"
        if state.configured
        else f"{vocab.command('proxy.setup')} (the daemon never sees the shell's variables)"
    )
    return layer_row("daemon", configured, systemd or "daemon does not use it", probe, "fail", hint)


def check_container(
    paths: Paths,
    settings: ProxySettings | None,
    client,
    why: str,
    index_url: str,
    image: str | None,
) -> checks.Row:
    state = read_state(paths)["container"]
    configured = (
        f"{paths.docker_config} proxies.default"
        if state.configured
        else f"no proxies in {paths.docker_config}"
    )
    if client is None:
        return layer_row("container", configured, "-", why, "skip", NO_DAEMON)
    chosen = image or next(  # the first apexkit/* image
        (tag for found in client.images.list() for tag in found.tags if tag.startswith("apexkit/")),
        None,
    )
    if chosen is None:
        return layer_row(
            "container",
            configured,
            "-",
            "no local image to start a probe container",
            "skip",
            "pass --image IMAGE (any local image with bash), or build one: invoke image.build",
        )
    parts = urlsplit(index_url)
    target = f"{parts.hostname}:{parts.port or 443}"
    names, seen, result = _read_probe(_probe_output(client, chosen, target))
    want = host_port(settings.https or settings.http) if settings else ""
    ok = bool(re.match(r"HTTP/1\.[01] 200", result)) and (not want or host_port(seen) == want)
    hint = ""
    if not names:
        hint = f"{vocab.command('proxy.setup')} writes proxies.default into ~/.docker/config.json"
    elif not ok:
        hint = "the proxy refused or is unreachable from the container; check its ACL and that --network host reaches it"
    return layer_row(
        "container",
        configured,
        f"container has {', '.join(names)}" if names else "container has no proxy variables",
        log.mask(f"CONNECT {target} from {chosen}: {result}"),
        "ok" if ok else "fail",
        hint,
    )


def _probe_output(client, image: str, target: str) -> str:
    """Output of the probe script in a throwaway container on the host network (the SDK adds config.json's
    proxies, as the docker CLI does)."""
    try:
        output = client.containers.run(
            image,
            ["bash", "-c", CONTAINER_PROBE],
            network_mode="host",
            remove=True,
            environment={"APEXKIT_PROBE_TARGET": target},
            stdout=True,
            stderr=True,
        )
        return output.decode("utf-8", "replace")
    except Exception as exc:  # ContainerError (probe exit != 0) carries the output in stderr
        return (getattr(exc, "stderr", None) or b"").decode("utf-8", "replace") or str(
            exc
        ).splitlines()[0]


def _read_probe(output: str) -> tuple[list[str], str, str]:
    """What the container probe printed: its proxy variables' names, its https_proxy, the CONNECT result."""
    lines = output.splitlines()
    env_lines = [line[4:] for line in lines if line.startswith("env ")]
    result = next(
        (line[7:] for line in lines if line.startswith("result ")), log.mask(output.strip())[:200]
    )
    seen = next(
        (line.split("=", 1)[1] for line in env_lines if line.lower().startswith("https_proxy=")), ""
    )
    return sorted({line.split("=", 1)[0] for line in env_lines}), seen, result


def check(
    paths: Paths,
    settings: ProxySettings | None,
    index_url: str | None = None,
    image: str | None = None,
    layers=("shell", "daemon", "container"),
) -> list[checks.Row]:
    index = (
        index_url
        or (settings.pip_index if settings and settings.pip_index else None)
        or os.environ.get("PIP_INDEX_URL")
        or DEFAULT_INDEX
    )
    rows = []
    if "shell" in layers:
        rows.append(check_shell(paths, settings, index))
    if "daemon" in layers or "container" in layers:
        client, why = docker_client(paths)
        if "daemon" in layers:
            rows.append(check_daemon(paths, settings, client, why))
        if "container" in layers:
            rows.append(check_container(paths, settings, client, why, index, image))
    return rows


def check_sources(settings: ProxySettings | None, probe_defaults: bool = False) -> list[checks.Row]:
    """The configured sources (apexkit.config), probed through this proxy: a row each (apexkit.proxy.sources)."""
    from apexkit import config
    from apexkit.errors import ConfigError
    from apexkit.plan import matrix

    m = matrix.load()
    try:
        values = config.effective_with(os.environ, m.source_urls)
    except ConfigError as exc:
        return [checks.Row(sources.AREA, "config files", checks.FAIL, exc.cause, exc.hint)]
    proxy, no_proxy = sources.proxy_of(os.environ, settings)
    ca_bundle = settings.ca_bundle if settings is not None else None
    return sources.probe_all(values, proxy, no_proxy, ca_bundle, defaults=probe_defaults)


def legacy_json(row: checks.Row) -> dict:
    """proxy.check --json's keys from before the shared model, kept for scripts that read them."""
    return {"layer": row.name, **row.data, "hint": row.fix}
