"""A published index read back (apexkit.index.published): index.json is untrusted input -- a regular file, no link
followed, capped, a JSON object -- and a bad one is one line naming the fix."""

from __future__ import annotations

import json

import pytest

from apexkit.errors import ConfigError
from apexkit.index import published


def test_a_published_directory_is_read_and_its_url_forms_agree(tmp_path):
    (tmp_path / "index.json").write_text(json.dumps({"format": "apexkit-index/1", "files": []}))
    for given in (str(tmp_path), f"{tmp_path}/simple/", tmp_path.as_uri()):
        index = published.parse_index(given)
        assert (
            index.path == tmp_path.resolve()
            and index.simple == tmp_path.resolve().as_uri() + "/simple/"
        )
        assert published.read_index(index) == {"format": "apexkit-index/1", "files": []}


def _linked(folder):
    (folder / "real.json").write_text("{}")
    (folder / "index.json").symlink_to(folder / "real.json")


@pytest.mark.parametrize(
    ("make", "says"),
    [
        (lambda d: (d / "index.json").write_text("[1, 2]"), "not a JSON object"),
        (lambda d: (d / "index.json").write_text("{"), "not JSON"),
        (_linked, "symbolic link"),
    ],
)
def test_a_bad_index_json_is_one_line(tmp_path, make, says):
    (tmp_path / "index.json").write_text("{}")
    index = published.parse_index(str(tmp_path))
    (tmp_path / "index.json").unlink()
    make(tmp_path)
    with pytest.raises(ConfigError, match=says) as caught:
        published.read_index(index)
    assert "\n" not in caught.value.format() and "apexkit publish --index" in caught.value.hint


def test_an_index_json_over_the_cap_is_refused(tmp_path, monkeypatch):
    (tmp_path / "index.json").write_text(json.dumps({"files": ["x" * 100]}))
    monkeypatch.setattr(published, "INDEX_JSON_MAX", 64)
    with pytest.raises(ConfigError, match="larger than"):
        published.read_index(published.parse_index(str(tmp_path)))


def test_what_is_not_an_index_is_refused_before_anything(tmp_path):
    with pytest.raises(ConfigError, match="holds no index.json"):
        published.parse_index(str(tmp_path))
    with pytest.raises(ConfigError, match="is not an index the nodes' pip can read"):
        published.parse_index("s3://bucket/apex")
    with pytest.raises(ConfigError, match="--index is empty"):
        published.parse_index("  ")


def test_root_url_drops_simple_and_refuses_other_schemes(tmp_path):
    """The one normaliser of an index URL (remote's team index and fleet's --index both use it)."""
    assert published.root_url("http://127.0.0.1:8000/team/simple/") == "http://127.0.0.1:8000/team"
    assert (
        published.root_url("http://127.0.0.1:8000/team/index.json") == "http://127.0.0.1:8000/team"
    )
    assert published.root_url(str(tmp_path) + "/") == tmp_path.as_uri()
    with pytest.raises(ConfigError, match="ftp:// is not an index apexkit can read"):
        published.root_url("ftp://127.0.0.1/x")
    with pytest.raises(ConfigError, match="has no host name"):
        published.root_url("https:///team")
    with pytest.raises(ConfigError, match="the nodes' pip can read") as caught:
        published.root_url("ftp://bob:s3cret@127.0.0.1/x", "--index", "the nodes' pip")
    assert "s3cret" not in caught.value.format()
