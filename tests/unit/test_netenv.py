"""The proxy and CA variables, named once (apexkit/netenv.py): the reader, and the shell copy in
docker/entrypoint.sh, which must export exactly the same CA variables."""

from __future__ import annotations

from apexkit import netenv


def test_lower_case_wins_and_blanks_are_unset():
    environ = {
        "http_proxy": "http://lower:3128",
        "HTTP_PROXY": "http://upper:3128",
        "HTTPS_PROXY": "http://s:3128",
        "https_proxy": "  ",
        "NO_PROXY": "localhost",
        "ALL_PROXY": "socks5://x:1080",
    }
    assert netenv.cases(environ, "http_proxy") == ("http://lower:3128", "http://upper:3128")
    assert netenv.proxy(environ, "http_proxy") == "http://lower:3128"
    assert (
        netenv.proxy(environ, "https_proxy") == "http://s:3128"
    )  # the blank lower-case one counts as unset
    assert netenv.proxies(environ) == {
        "http": "http://lower:3128",
        "https": "http://s:3128",
        "no": "localhost",
    }
    assert netenv.proxies({}) == {} and netenv.proxy({"no_proxy": ""}, "no_proxy") is None


def test_the_variables_written_for_a_proxy_are_both_cases():
    assert netenv.proxy_environment("http://h:1", None, "localhost") == {
        "http_proxy": "http://h:1",
        "HTTP_PROXY": "http://h:1",
        "no_proxy": "localhost",
        "NO_PROXY": "localhost",
    }
    assert all(netenv.is_proxy_variable(n) for n in netenv.proxy_environment("a", "b", "c"))
    assert not netenv.is_proxy_variable("SSL_CERT_FILE")
    # Docker's predefined build args (docs.docker.com, "Predefined ARGs"), each proxy variable among them
    assert set(netenv.DOCKER_PROXY_ARGS) == {
        "HTTP_PROXY",
        "http_proxy",
        "HTTPS_PROXY",
        "https_proxy",
        "FTP_PROXY",
        "ftp_proxy",
        "NO_PROXY",
        "no_proxy",
        "ALL_PROXY",
        "all_proxy",
    }
    assert set(netenv.proxy_environment("a", "b", "c")) <= set(netenv.DOCKER_PROXY_ARGS)


def test_the_first_ca_variable_set_is_the_bundle():
    assert netenv.ca_variable(
        {"CURL_CA_BUNDLE": "/c.pem", "REQUESTS_CA_BUNDLE": "/r.pem", "PIP_CERT": ""}
    ) == ("REQUESTS_CA_BUNDLE", "/r.pem")
    assert netenv.ca_variable({"HOME": "/h"}) is None


def test_a_proxy_password_is_never_shown_with_or_without_a_scheme():
    """curl, pip (requests) and uv all take a proxy without a scheme (https_proxy=bob:hunter2@proxy:3128); `doctor`
    printed such a value as it was, password included."""
    from apexkit.doctor import machine

    environ = {
        "https_proxy": "bob:hunter2@proxy.corp:3128",
        "HTTPS_PROXY": "http://bob:hunter2@proxy.corp:3128",
        "http_proxy": "tok3n@proxy.corp:3128",
    }
    rows = machine.check_proxy_variables(environ)
    shown = " ".join(f"{r.detail} {r.fix}" for r in rows)
    assert "hunter2" not in shown and "tok3n" not in shown, shown
    assert "bob:***@proxy.corp:3128" in shown and "***@proxy.corp:3128" in shown
    assert netenv.shown("proxy.corp:3128") == "proxy.corp:3128"
    assert netenv.shown("http://u:p@h:1") == "http://u:***@h:1"
