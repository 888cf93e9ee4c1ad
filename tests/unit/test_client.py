"""The library's index client (apexkit.index.client): a login goes to its own index only, and only http(s) is asked.
Its users' readers are tested with them: the team indexes (test_remote.py), tools/wheelindex.py
(test_wheelindex.py, tests/e2e/test_refresh.py)."""

from __future__ import annotations

import pytest

from apexkit.errors import ConfigError
from apexkit.index import client

REMOTE = "http://127.0.0.1:9/simple"


def no_network() -> client.Client:
    return client.Client(client.IndexSettings((REMOTE,), "test"), client.RetryPolicy(1, 0))


def test_the_login_goes_to_the_index_scheme_host_and_port_only():
    """L2: it went to any port and scheme of the same host name (an https index linking over http sent it in
    clear). Now keyed as pip keys it: scheme, host, port (the default port filled in)."""
    settings = client.IndexSettings(
        ("https://alice:S3cret@Mirror.example/simple", "http://bob:pw@127.0.0.1:8080/simple"),
        "test",
    )
    session = client.Client(settings)
    alice = session._authorization("https://mirror.example:443/files/w.whl")
    assert alice and alice.startswith("Basic ")
    assert session._authorization("https://MIRROR.example/other") == alice
    for url in (
        "http://mirror.example/files/w.whl",  # the same host over http
        "https://mirror.example:8443/files/w.whl",  # another port
        "http://127.0.0.1:8081/files/w.whl",
        "ftp://mirror.example/w.whl",
    ):
        assert session._authorization(url) is None, url
    assert session._authorization("http://127.0.0.1:8080/x") not in (None, alice)


def test_the_client_asks_http_urls_only():
    with pytest.raises(ConfigError, match="a ftp: URL .*http\\(s\\) only"):
        no_network().open("ftp://127.0.0.1:1/w.whl")
    with pytest.raises(ConfigError, match="a file: URL"):
        no_network().open("FILE:///etc/passwd")
