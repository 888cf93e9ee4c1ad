"""The probes of proxy.check and the sources check (apexkit.proxy.sources.get), against servers started here on
127.0.0.0/8 (review of issue 39's merge): a mirror's login never follows a redirect to another host, and the
configured proxy is used whatever the shell's no_proxy says."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator

import pytest

from apexkit.proxy import check, sources


def _serve(handler: type, host: str = "127.0.0.1", port: int = 0) -> http.server.HTTPServer:
    server = http.server.HTTPServer((host, port), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.fixture
def seen() -> Iterator[list]:
    found: list = []
    yield found


def test_the_index_login_does_not_follow_a_redirect_to_another_host(seen):
    class Elsewhere(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            seen.append(("elsewhere", self.headers.get("Authorization"), self.path))
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args):
            pass

    other = _serve(Elsewhere, "127.0.0.2")

    class Mirror(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            seen.append(("mirror", self.headers.get("Authorization"), self.path))
            self.send_response(302)
            self.send_header("Location", f"http://127.0.0.2:{other.server_port}/elsewhere")
            self.end_headers()

        def log_message(self, *args):
            pass

    mirror = _serve(Mirror)
    try:
        ok, what, _ = check.probe_https(
            f"http://alice:s3cret@127.0.0.1:{mirror.server_port}/simple/", None, None, 5
        )
        assert ok and "s3cret" not in what, what
        assert [s[0] for s in seen] == ["mirror", "elsewhere"], seen
        assert seen[0][1] is not None and seen[1][1] is None, (
            seen
        )  # the login went to the mirror only
    finally:
        mirror.shutdown()
        other.shutdown()


def test_the_configured_proxy_is_used_whatever_the_shells_no_proxy_says(seen, monkeypatch):
    class Proxy(http.server.BaseHTTPRequestHandler):  # answers every GET itself
        def do_GET(self):
            seen.append(("proxy", self.path, self.headers.get("Host")))
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args):
            pass

    class Source(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            seen.append(("direct", self.path, self.headers.get("Host")))
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args):
            pass

    proxy, source = _serve(Proxy), _serve(Source)
    monkeypatch.setenv("no_proxy", "127.0.0.1")  # the shell's own; the configured no_proxy is ""
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    try:
        url = f"http://127.0.0.1:{source.server_port}/repo.git/info/refs"
        code, _, what = sources.get(url, f"http://127.0.0.1:{proxy.server_port}", "", None, 5)
        assert code == 200 and f"via 127.0.0.1:{proxy.server_port}" in what, what
        # through the proxy, asking for the source by its full URL and its own Host
        assert seen == [("proxy", url, f"127.0.0.1:{source.server_port}")], seen
    finally:
        proxy.shutdown()
        source.shutdown()
