"""apexkit.wheel.sources in-process: credentials are split from a source URL. The git mirrors are in
tests/e2e/test_sources.py."""

from __future__ import annotations

from apexkit.wheel import sources


def test_split_credentials():
    assert sources.split_credentials("https://u:p%40ss@git.example.com:8443/a/apex.git") == (
        "https://git.example.com:8443/a/apex.git",
        ("u", "p@ss"),
    )
    assert sources.split_credentials("https://tokenonly@host/x.git") == (
        "https://host/x.git",
        ("tokenonly", ""),
    )
    for plain in (
        "https://host/x.git",
        "file:///srv/x.git",
        "ssh://git@host/x.git",
        "git@host:x.git",
    ):
        assert sources.split_credentials(plain) == (plain, None)
