"""The run venv's package sources (apexkit.venvrun): what the manifest records (passwords masked), how the options
given to validate/bench now are merged with them, what a masked URL becomes, and the run venv's cache key."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from apexkit import pipconfig, venvrun
from apexkit.errors import ConfigError
from apexkit.wheel.venvs import IndexOptions

SECRET = "s3cr%2Ft%40x"  # percent-encoded '/' and '@' in the password
TEAM = f"https://alice:{SECRET}@team.example:8443/simple/"
TOKEN = "https://tok3nvalue@tokens.example/simple/"


def no_pip_config():
    raise AssertionError("pip's configuration was read although no masked URL needed it")


def merged(recorded, given=None, env=None, config=no_pip_config):
    return venvrun.merge_sources(recorded, given or IndexOptions(), env or {}, config)


def test_the_manifest_records_sources_with_every_password_masked(tmp_path):
    options = IndexOptions(
        index_url=TEAM,
        extra_index_urls=(TOKEN, "https://mirror.example/simple/"),
        torch_index_url="https://bob:pw@torch.example/whl/cpu/",
        wheelhouses=(tmp_path,),
        offline=True,
    )
    recorded = options.recorded()
    text = json.dumps(recorded)
    for secret in (SECRET, "tok3nvalue", ":pw@"):
        assert secret not in text
    assert recorded == {
        "index_url": "https://alice:***@team.example:8443/simple/",
        "extra_index_urls": [
            "https://***@tokens.example/simple/",
            "https://mirror.example/simple/",
        ],
        "torch_index_url": "https://bob:***@torch.example/whl/cpu/",
        "wheelhouses": [str(tmp_path)],
        "offline": True,
    }
    back = venvrun.recorded_sources({"package_sources": recorded}, "m.json")
    assert back.wheelhouses == (tmp_path,) and back.offline is True
    assert back.index_url == recorded["index_url"] and venvrun.is_masked(back.index_url)
    assert not venvrun.is_masked("https://mirror.example/simple/")


def test_a_manifest_without_the_field_means_pips_own_configuration():
    assert venvrun.recorded_sources({}, "m.json") == IndexOptions()


@pytest.mark.parametrize(
    "field, value, said",
    [
        (None, ["not", "an", "object"], "package_sources is not a JSON object"),
        ("wheelhouses", ["relative/dir"], "not an absolute path"),
        ("wheelhouses", ["/tmp/a\nb"], "not an absolute path"),
        ("wheelhouses", "/tmp", "is not a list"),
        ("extra_index_urls", [f"https://x.example/{i}/" for i in range(33)], "up to 32"),
        ("extra_index_urls", [7], "is not a list"),
        ("index_url", 5, "index_url is not a URL"),
        ("index_url", "ftp://host/simple/", "scheme 'ftp'"),
        ("offline", "yes", "offline is not true or false"),
    ],
)
def test_a_damaged_sources_field_is_one_line_naming_it(field, value, said):
    data = value if field is None else {**IndexOptions().recorded(), field: value}
    with pytest.raises(ConfigError) as caught:
        venvrun.recorded_sources({"package_sources": data}, "dist/t/manifest.json")
    assert said in caught.value.cause and "dist/t/manifest.json" in caught.value.cause
    if field != "index_url" or not isinstance(
        value, str
    ):  # a URL's own error says how to write one
        assert "apexkit build <python>" in caught.value.hint


def test_a_recorded_url_that_does_not_parse_is_refused_without_echoing_it():
    bad = "https://alice:pa/ss@team.example/simple/"
    with pytest.raises(ConfigError) as caught:
        venvrun.recorded_sources({"package_sources": {"index_url": bad}}, "m.json")
    assert "pa/ss" not in caught.value.format()


def test_by_default_the_recorded_sources_are_used(tmp_path):
    recorded = IndexOptions(
        index_url="https://mirror.example/simple/",
        extra_index_urls=("https://more.example/simple/",),
        torch_index_url="https://torch.example/whl/cpu/",
        wheelhouses=(tmp_path,),
        offline=False,
    )
    assert merged(recorded) == (recorded, [])


def test_what_is_given_now_wins_field_by_field(tmp_path):
    old, new = tmp_path / "old", tmp_path / "new"
    old.mkdir()
    new.mkdir()
    recorded = IndexOptions(
        index_url="https://mirror.example/simple/",
        extra_index_urls=("https://a.example/simple/", "https://b.example/simple/"),
        torch_index_url="https://torch.example/whl/cpu/",
        wheelhouses=(old,),
    )
    given = IndexOptions(extra_index_urls=("https://c.example/simple/",), wheelhouses=(new,))
    index, notes = merged(recorded, given)
    assert index.index_url == "https://mirror.example/simple/"  # not given: the build's
    assert index.extra_index_urls == ("https://c.example/simple/",)  # given: all of them replaced
    assert index.wheelhouses == (new,) and index.torch_index_url == recorded.torch_index_url
    assert notes == []
    # the torch index: given, then APEXKIT_TORCH_INDEX_URL, then the build's
    env = {"APEXKIT_TORCH_INDEX_URL": "https://env.example/whl/"}
    assert merged(recorded, env=env)[0].torch_index_url == "https://env.example/whl/"
    given = IndexOptions(torch_index_url="https://now.example/whl/")
    assert merged(recorded, given, env)[0].torch_index_url == "https://now.example/whl/"


def test_offline_comes_from_the_build_or_now_and_an_index_given_now_turns_it_off(tmp_path):
    recorded = IndexOptions(wheelhouses=(tmp_path,), offline=True)
    index, notes = merged(recorded)
    assert index.offline and index.wheelhouses == (tmp_path,) and notes == []
    assert index.sources(pipconfig.PipConfig()).environment("PIP") == {
        "PIP_NO_INDEX": "1",
        "PIP_FIND_LINKS": str(tmp_path),
    }
    assert merged(IndexOptions(), IndexOptions(offline=True))[0].offline
    online, notes = merged(recorded, IndexOptions(index_url="https://mirror.example/simple/"))
    assert not online.offline and "makes this run venv online" in notes[0]
    both = IndexOptions(index_url="https://mirror.example/simple/", offline=True)
    assert merged(recorded, both)[0].offline


def test_a_recorded_wheelhouse_that_is_gone_is_left_out_saying_so(tmp_path):
    here, link = tmp_path / "here", tmp_path / "link"
    here.mkdir()
    link.symlink_to(here)  # a link read from a file is not followed
    recorded = IndexOptions(wheelhouses=(here, tmp_path / "gone", link), offline=True)
    index, notes = merged(recorded)
    assert index.wheelhouses == (here,)
    assert len(notes) == 2 and all("--wheelhouse DIR" in n for n in notes)
    assert str(tmp_path / "gone") in notes[0]


def test_a_masked_url_takes_the_credentials_of_the_same_host_given_now():
    recorded = IndexOptions(index_url="https://alice:***@team.example:8443/simple/")
    given = IndexOptions(
        extra_index_urls=(
            "https://alice:other@elsewhere.example:8443/",  # another host
            "http://alice:wrongscheme@team.example:8443/",  # another scheme
            "https://alice:wrongport@team.example/",  # another port
            "https://mallory:notalice@team.example:8443/",  # another user
            f"https://alice:{SECRET}@team.example:8443/other/path/",
        )
    )
    index, notes = merged(recorded, given)
    assert (
        index.index_url == f"https://alice:{SECRET}@team.example:8443/simple/"
    )  # the recorded path
    assert notes == []


def test_a_masked_token_url_takes_any_credentials_for_its_host_from_pip_or_the_environment():
    recorded = IndexOptions(
        extra_index_urls=("https://***@tokens.example/simple/",),
        torch_index_url="https://bob:***@torch.example/whl/cpu/",
    )
    config = {"extra-index-url": "https://mirror.example/ https://tok3n@tokens.example:443/x/"}
    env = {"APEXKIT_TORCH_INDEX_URL": "https://bob:pw@torch.example/whl/cu/"}
    index, notes = merged(recorded, env=env, config=lambda: config)
    assert index.extra_index_urls == ("https://tok3n@tokens.example/simple/",)
    assert (
        index.torch_index_url == "https://bob:pw@torch.example/whl/cu/"
    )  # the variable itself wins
    assert notes == []


def test_a_masked_url_without_credentials_here_is_used_bare_with_one_line():
    recorded = IndexOptions(index_url="https://alice:***@team.example/simple/")
    index, notes = merged(recorded, config=lambda: {"index-url": "https://other.example/"})
    assert index.index_url == "https://team.example/simple/"
    assert len(notes) == 1 and "pass the URL again" in notes[0] and ".netrc" in notes[0]
    assert "alice:***@team.example" in notes[0]


def test_a_masked_query_token_takes_the_url_that_masks_to_it_given_now_or_in_pips_config():
    """The manifest records ?token=*** (as log.mask hides any query value): a later run gets the URL given now, or
    in pip's configuration, whose masked form is the recorded one; without one, the URL without the masked values,
    saying so -- never a literal *** sent to the index."""
    query = "https://mirror.example/simple/?token=q5ecret"
    both = "https://alice:pw@team.example/simple/?private_token=p5ecret"
    other = "https://mirror.example/other/?token=n0tthis"  # same host, another path: masks to another URL
    build = IndexOptions(index_url=query, extra_index_urls=(both,))
    recorded = venvrun.recorded_sources({"package_sources": build.recorded()}, "m.json")
    assert recorded.index_url == "https://mirror.example/simple/?token=***"
    assert "secret" not in json.dumps(build.recorded()) and venvrun.is_masked(recorded.index_url)
    index, notes = merged(
        recorded,
        IndexOptions(extra_index_urls=(other,)),
        config=lambda: {"index-url": query, "extra-index-url": f"https://x.example/ {both}"},
    )
    assert index.index_url == query and notes == []
    assert index.extra_index_urls == (other,)  # given now: replaces the recorded ones
    given = IndexOptions(index_url=query)
    index, notes = merged(recorded, given, config=lambda: {"extra-index-url": both})
    assert index.index_url == query and index.extra_index_urls == (both,) and notes == []
    # nothing here masks to it: the URL without its token (pip's config or .netrc may still log in), one line
    index, notes = merged(recorded, config=lambda: {"index-url": other})
    assert index.index_url == "https://mirror.example/simple/"
    assert index.extra_index_urls == ("https://team.example/simple/",)
    assert len(notes) == 2 and "pass the URL again" in notes[0] and "?token=***" in notes[0]
    assert not any(secret in " ".join(notes) for secret in ("q5ecret", "p5ecret", "n0tthis"))
    assert "q5ecret" not in venvrun.describe(IndexOptions(index_url=query))


def test_offline_no_url_is_resolved_and_pips_config_is_not_read(tmp_path):
    recorded = IndexOptions(
        index_url="https://alice:***@team.example/simple/", wheelhouses=(tmp_path,), offline=True
    )
    index, notes = merged(recorded)  # no_pip_config raises if it is called
    assert index.offline and notes == []


def test_the_cache_key_names_the_sources_without_credentials(tmp_path):
    one = IndexOptions(index_url="https://alice:one@team.example/simple/")
    two = IndexOptions(index_url="https://alice:two@team.example/simple/")
    other = IndexOptions(index_url="https://mirror.example/simple/")
    assert venvrun.sources_key(one) == venvrun.sources_key(two) != venvrun.sources_key(other)
    assert "one" not in json.dumps(venvrun.sources_key(one))
    house = IndexOptions(wheelhouses=(tmp_path,), offline=True)
    assert venvrun.sources_key(house) == venvrun.sources_key(
        IndexOptions(index_url="https://mirror.example/", wheelhouses=(tmp_path,), offline=True)
    )
    assert venvrun.sources_key(house) != venvrun.sources_key(IndexOptions(wheelhouses=(tmp_path,)))
    assert "team.example" not in venvrun.describe(house) and "offline" in venvrun.describe(house)
    assert "one" not in venvrun.describe(one) and "team.example" in venvrun.describe(one)


def test_the_sources_options_are_venvruns_and_the_rest_goes_to_the_script(tmp_path, monkeypatch):
    monkeypatch.delenv("APEXKIT_BENCH_ARGS", raising=False)
    args, rest = venvrun.parse(
        [
            "--offline",
            "--wheelhouse",
            str(tmp_path),
            "--device",
            "cpu",
            "--extra-index-url",
            "https://a.example/simple/",
            "--wheelhouse",
            str(tmp_path),
            "--index-url=https://mirror.example/simple",
            "--torch-index-url",
            "https://torch.example/whl/cpu",
            "--model",
            "mlp",
        ],
        "nox -s bench --",
    )
    assert rest == ["--device", "cpu", "--model", "mlp"]
    given = venvrun.given_sources(args)
    assert given == IndexOptions(
        index_url="https://mirror.example/simple/",
        extra_index_urls=("https://a.example/simple/",),
        torch_index_url="https://torch.example/whl/cpu/",
        wheelhouses=(tmp_path.resolve(), tmp_path.resolve()),
        offline=True,
    )


def test_given_sources_are_checked_like_the_builds(tmp_path):
    def args(**kw):
        base = dict(
            index_url=None, extra_index_url=[], torch_index_url=None, wheelhouse=[], offline=False
        )
        return argparse.Namespace(**{**base, **kw})

    with pytest.raises(ConfigError, match="is not a directory"):
        venvrun.given_sources(args(wheelhouse=[tmp_path / "none"]))
    with pytest.raises(ConfigError) as caught:
        venvrun.given_sources(args(index_url="https://alice:pa@ss@team.example/simple/"))
    assert "pa@ss" not in caught.value.format()


def test_without_credentials_keeps_everything_but_them():
    assert venvrun.without_credentials(TEAM) == "https://team.example:8443/simple/"
    assert venvrun.without_credentials("https://mirror.example/simple/?x=1") == (
        "https://mirror.example/simple/?x=1"
    )
    assert venvrun.without_credentials(None) is None


def test_a_manifest_round_trip_of_real_paths(tmp_path):
    house = tmp_path / "house"
    house.mkdir()
    recorded = IndexOptions(wheelhouses=(house,), offline=True).recorded()
    manifest = {"package_sources": json.loads(json.dumps(recorded))}
    index, notes = merged(venvrun.recorded_sources(manifest, "m.json"))
    assert index == IndexOptions(wheelhouses=(Path(house),), offline=True) and notes == []
