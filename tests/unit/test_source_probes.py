"""apexkit.proxy.sources, the pure parts and the time bound: no_proxy as curl reads it, the registry endpoint
docker asks, the defaults left unprobed (the time bound: tests/e2e/test_config_sources.py)."""

from __future__ import annotations

from apexkit import config
from apexkit.proxy import sources


def test_no_proxy_covers_names_domains_and_cidr_blocks():
    assert sources._bypass("http://127.0.0.5:80/x", "localhost,127.0.0.0/8")
    assert sources._bypass("https://git.corp.example/x", ".corp.example")
    assert sources._bypass("https://corp.example/x", "corp.example")
    assert not sources._bypass("https://gitcode.com/x", "localhost,127.0.0.0/8,.corp.example")
    assert not sources._bypass("https://gitcode.com/x", "")


def test_the_registry_probe_asks_v2_as_docker_would():
    assert sources.registry_url("127.0.0.1:5000/quay") == "http://127.0.0.1:5000/v2/"
    assert sources.registry_url("localhost:5000") == "http://localhost:5000/v2/"
    assert sources.registry_url("registry.corp/quay") == "https://registry.corp/v2/"


def test_defaults_are_listed_not_probed_unless_asked():
    value = config.Value("debian_mirror", "http://deb.debian.org/debian", config.DEFAULT)
    rows = sources.probe_all([value], None)
    assert [(r.name, r.status) for r in rows] == [("defaults", "skip")] and "debian_mirror" in rows[
        0
    ].detail


def test_a_file_index_is_looked_at_as_a_folder_not_fetched(tmp_path):
    """The newcomer walk (issue 41): doctor warned `GET file:///opt/pypi/simple: [Errno 21] Is a directory` for a
    working local index. A file:// index_url is a folder here (ok), a missing one is a warning naming the path."""
    (tmp_path / "simple").mkdir()
    (tmp_path / "links.html").write_text("<a href='x.whl'>x</a>")
    for url, status in (
        (f"file://{tmp_path}/simple", "ok"),
        (f"file://{tmp_path}/links.html", "ok"),
        (f"file://{tmp_path}/missing", "warn"),
    ):
        row = sources.probe(config.Value("index_url", url, "env"), None, "", None)
        assert row.status == status and "Errno" not in row.detail, (url, row)
    assert f"{tmp_path}/missing: not a directory" in row.detail
