"""The proxy and CA variables, named once (apexkit/netenv.py): the reader, and the shell copy in
docker/entrypoint.sh, which must export exactly the same CA variables."""

from __future__ import annotations

import subprocess

from conftest import ROOT

from apexkit import netenv
from apexkit.proxy import layers


def test_lower_case_wins_and_blanks_are_unset():
    environ = {"http_proxy": "http://lower:3128", "HTTP_PROXY": "http://upper:3128", "HTTPS_PROXY": "http://s:3128",
               "https_proxy": "  ", "NO_PROXY": "localhost", "ALL_PROXY": "socks5://x:1080"}
    assert netenv.cases(environ, "http_proxy") == ("http://lower:3128", "http://upper:3128")
    assert netenv.proxy(environ, "http_proxy") == "http://lower:3128"
    assert netenv.proxy(environ, "https_proxy") == "http://s:3128"  # the blank lower-case one counts as unset
    assert netenv.proxies(environ) == {"http": "http://lower:3128", "https": "http://s:3128", "no": "localhost"}
    assert netenv.proxies({}) == {} and netenv.proxy({"no_proxy": ""}, "no_proxy") is None


def test_the_variables_written_for_a_proxy_are_both_cases():
    assert netenv.proxy_environment("http://h:1", None, "localhost") == {
        "http_proxy": "http://h:1", "HTTP_PROXY": "http://h:1", "no_proxy": "localhost", "NO_PROXY": "localhost"}
    assert all(netenv.is_proxy_variable(n) for n in netenv.proxy_environment("a", "b", "c"))
    assert not netenv.is_proxy_variable("SSL_CERT_FILE")
    # Docker's predefined build args (docs.docker.com, "Predefined ARGs"), each proxy variable among them
    assert set(netenv.DOCKER_PROXY_ARGS) == {"HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy", "FTP_PROXY",
                                             "ftp_proxy", "NO_PROXY", "no_proxy", "ALL_PROXY", "all_proxy"}
    assert set(netenv.proxy_environment("a", "b", "c")) <= set(netenv.DOCKER_PROXY_ARGS)


def test_the_first_ca_variable_set_is_the_bundle():
    assert netenv.ca_variable({"CURL_CA_BUNDLE": "/c.pem", "REQUESTS_CA_BUNDLE": "/r.pem", "PIP_CERT": ""}) == (
        "REQUESTS_CA_BUNDLE", "/r.pem")
    assert netenv.ca_variable({"HOME": "/h"}) is None


def test_the_entrypoint_exports_exactly_the_ca_variables(tmp_path):
    """docker/entrypoint.sh run for real, with its CA bundle path (the one containers get mounted) pointed at a file
    here: every CA variable it exports, and no other, is one of netenv.CA_VARIABLES; one already set is kept."""
    script = (ROOT / "docker" / "entrypoint.sh").read_text()
    assert layers.CONTAINER_CA_PATH in script
    bundle = tmp_path / "ca-bundle.pem"
    bundle.write_text("-----BEGIN CERTIFICATE-----\n")
    copy = tmp_path / "entrypoint.sh"
    copy.write_text(script.replace(layers.CONTAINER_CA_PATH, str(bundle)))
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "PIP_CERT": "/mine.pem"}
    out = subprocess.run(["sh", str(copy), "env", "-0"], capture_output=True, env=env, check=True, timeout=60).stdout
    seen = dict(item.split("=", 1) for item in out.decode().split("\0") if "=" in item)
    exported = {name for name, value in seen.items() if value == str(bundle)}
    assert exported | {"PIP_CERT"} == set(netenv.CA_VARIABLES) and seen["PIP_CERT"] == "/mine.pem"
    # and the same names in the same order, as the shell writes them
    names = next(line.split(" in ", 1)[1].split(";")[0].split() for line in script.splitlines()
                 if line.strip().startswith("for var in "))
    assert tuple(names) == netenv.CA_VARIABLES
