"""The network variables of an environment, named once: the proxy variables, the CA-bundle variables, and one reader
of the proxies an environment sets.

A proxy variable comes in lower and upper case (tools disagree on which they read: curl only lower-case http_proxy,
Docker and uv upper case first). Where both are set, lower case wins, as in curl and urllib; a value of blanks is
unset. CA_VARIABLES is what `proxy.setup --ca-cert` exports and a container gets; docker/entrypoint.sh names them
again in shell (tests/{unit,e2e}/test_netenv.py keeps the two lists equal).
"""

from __future__ import annotations

from collections.abc import Mapping

from apexkit import log

PROXY_VARIABLES = ("http_proxy", "https_proxy", "no_proxy")  # each in both cases
# Docker's predefined build args: usable by RUN without an ARG line, and left out of `docker history`
DOCKER_PROXY_ARGS = tuple(
    name
    for base in ("http_proxy", "https_proxy", "ftp_proxy", "no_proxy", "all_proxy")
    for name in (base.upper(), base)
)
CA_VARIABLES = (
    "SSL_CERT_FILE",
    "REQUESTS_CA_BUNDLE",
    "PIP_CERT",
    "GIT_SSL_CAINFO",
    "CURL_CA_BUNDLE",
)


def cases(environ: Mapping[str, str], name: str) -> tuple[str, str]:
    """(lower-case value, upper-case value) of the proxy variable `name` ("http_proxy"), "" where unset."""
    return environ.get(name, "").strip(), environ.get(name.upper(), "").strip()


def proxy(environ: Mapping[str, str], name: str) -> str | None:
    """The value of the proxy variable `name` ("https_proxy") this environment sets: lower case first."""
    lower, upper = cases(environ, name)
    return lower or upper or None


def proxies(environ: Mapping[str, str]) -> dict[str, str]:
    """The proxies this environment sets, by scheme as urllib names them: http, https, and "no" for no_proxy."""
    found = {name.split("_")[0]: proxy(environ, name) for name in PROXY_VARIABLES}
    return {scheme: value for scheme, value in found.items() if value}


def shown(value: str) -> str:
    """A proxy variable's value fit to print: the password (or token) of its userinfo masked, also where the value
    has no scheme (curl, pip and uv take `user:secret@proxy:3128` as http://)."""
    if "://" in value or "@" not in value:
        return log.mask(value)
    return log.mask("http://" + value)[len("http://") :]


def proxy_environment(
    http: str | None, https: str | None, no_proxy: str | None = None
) -> dict[str, str]:
    """The variables that set these proxies, each in both cases (lower case first)."""
    env: dict[str, str] = {}
    for name, value in (("http_proxy", http), ("https_proxy", https), ("no_proxy", no_proxy)):
        if value:
            env[name] = env[name.upper()] = value
    return env


def is_proxy_variable(name: str) -> bool:
    return name.lower() in PROXY_VARIABLES


def ca_variable(environ: Mapping[str, str]) -> tuple[str, str] | None:
    """(name, value) of the first CA_VARIABLES entry this environment sets."""
    return next(((name, environ[name]) for name in CA_VARIABLES if environ.get(name)), None)
