"""`nox -s refresh` (tools/refresh.py), in-process: pip's config precedence, real wheel metadata
(tests/data/torch-npu-metadata/), the plan against matrix.toml, index pages, and the rendering of matrix.toml. The
command against a package index served on 127.0.0.1 is in tests/e2e/test_refresh.py."""

from __future__ import annotations

import conftest
import pytest

from apexkit import pipconfig
from apexkit.errors import ConfigError
from apexkit.index import client
from tools import refresh, wheelindex

DATA = conftest.DATA / "torch-npu-metadata"


def versions_keys(text: str) -> list[str]:
    return list(refresh.matrix.tomllib.loads(text)["torch_npu"]["versions"])


# --- pure parts --------------------------------------------------------------------------------------------------


def test_pip_config_precedence_is_pips():
    text = (
        "global.index-url='https://mirror.example/simple'\n"
        "install.index-url='https://install.example/simple'\n"
        ":env:.cert='/etc/ssl/ca.pem'\nglobal.cert='/other.pem'\n"
        "global.extra-index-url='file:///opt/pypi/simple https://x.example/simple'\n"
    )
    conf = pipconfig.parse(text)
    assert (
        conf["index-url"] == "https://install.example/simple" and conf["cert"] == "/etc/ssl/ca.pem"
    )
    settings = client.resolve_settings(
        None,
        {"HTTPS_PROXY": "http://p:3128", "no_proxy": "localhost"},
        pip_config={**conf, "cert": ""},
    )
    assert settings.urls == (
        "https://install.example/simple",
        "file:///opt/pypi/simple",
        "https://x.example/simple",
    )
    assert settings.proxies == {"https": "http://p:3128", "no": "localhost"}
    assert client.resolve_settings("http://i/simple", {}, pip_config={}).urls == (
        "http://i/simple",
    )
    assert client.resolve_settings(None, {}, pip_config={}).urls == (client.DEFAULT_INDEX,)
    with pytest.raises(ConfigError, match="does not exist"):
        client.resolve_settings(None, {}, pip_config={"cert": "/nonexistent/ca.pem"})


def test_metadata_of_the_real_wheels_gives_torch_and_its_local_label():
    meta = {
        p.name.split("-")[1]
        + "/"
        + ("aarch64" if "aarch64" in p.name else "x86_64"): wheelindex.parse_metadata(
            p.read_bytes()
        )
        for p in DATA.glob("*.METADATA")
    }
    assert (
        meta["2.13.0/x86_64"].torch == "torch==2.13.0.*"
        and meta["2.13.0/x86_64"].torch_version == "2.13.0"
    )
    assert meta["2.1.0.post17/x86_64"].torch == "torch (==2.1.0+cpu)"
    assert meta["2.1.0.post17/x86_64"].torch_version == "2.1.0"
    assert refresh.local_label(meta["2.1.0.post17/x86_64"].torch) == "cpu"
    assert refresh.local_label(meta["2.1.0.post17/aarch64"].torch) is None


def test_plan_keeps_unknown_rows_and_picks_the_newest_post_release():
    rows = {
        "2.7.1": {"torch_npu": "2.7.1.post8", "cann": ["9.1.0"]},
        "1.11.0": {"torch_npu": "1.11.0.post14", "cann": []},
        "2.12.0": {"torch_npu": "2.12.0", "cann": ["9.1.0"]},
    }
    releases = [
        refresh.Release("2.7.1.post11", ["aarch64"], {"aarch64": "torch==2.7.1"}, "2.7.1"),
        refresh.Release("2.7.1.post10", ["aarch64"], {"aarch64": "torch==2.7.1"}, "2.7.1"),
        refresh.Release("2.9.1", ["aarch64"], {"aarch64": "torch==2.9.1"}, "2.9.1"),
    ]
    changes = {c.torch: c for c in refresh.plan(rows, releases)}
    assert [c.torch for c in refresh.plan(rows, releases)] == ["2.12.0", "2.9.1", "2.7.1", "1.11.0"]
    assert (changes["2.7.1"].kind, changes["2.7.1"].new) == ("update", "2.7.1.post11")
    assert (
        changes["2.9.1"].kind == "add"
        and changes["2.12.0"].kind == "absent"
        and changes["1.11.0"].kind == "older"
    )
    text = (
        '[torch_npu]\nread = "x"\n\n[torch_npu.versions]\n"2.12.0" = { torch_npu = "2.12.0", cann = ["9.1.0"] }\n'
        '"2.7.1" = { torch_npu = "2.7.1.post8", cann = ["9.1.0"] }  # kept\n'
        '"1.11.0" = { torch_npu = "1.11.0.post14", cann = [] }\n'
    )
    out = refresh.render(text, list(changes.values()), "2030-01-02", "http://i/simple")
    assert out.splitlines()[5:9] == [
        '"2.12.0" = { torch_npu = "2.12.0", cann = ["9.1.0"] }',
        f'"2.9.1" = {{ torch_npu = "2.9.1", cann = [] }}  # {refresh.CANN_COMMENT}',
        '"2.7.1" = { torch_npu = "2.7.1.post11", cann = ["9.1.0"] }  # kept',
        '"1.11.0" = { torch_npu = "1.11.0.post14", cann = [] }',
    ]
    assert 'read = "2030-01-02"' in out


def test_html_page_attributes_and_relative_links():
    page = (
        b'<html><a href="../../f/torch_npu-2.14.0-cp311-cp311-manylinux_2_28_x86_64.whl#sha256=ab" '
        b'data-core-metadata="sha256=cd">x</a><a href="torch_npu-2.1.0-cp38-cp38-linux_aarch64.whl" '
        b'data-dist-info-metadata="true" data-yanked="">y</a><a href="torch_npu-2.2.0.tar.gz">z</a></html>'
    )
    wheels = wheelindex.parse_index_page(
        page, "text/html", "https://i.example/simple/torch-npu/", "https://i.example/simple"
    )
    assert [(w.url, w.arch, w.metadata, w.yanked) for w in wheels] == [
        (
            "https://i.example/f/torch_npu-2.14.0-cp311-cp311-manylinux_2_28_x86_64.whl",
            "x86_64",
            {"sha256": "cd"},
            False,
        ),
        (
            "https://i.example/simple/torch-npu/torch_npu-2.1.0-cp38-cp38-linux_aarch64.whl",
            "aarch64",
            True,
            True,
        ),
    ]


def test_a_render_that_would_not_read_back_is_refused():
    text = '[torch_npu]\nread = "x"\n\n[torch_npu.versions]\n"2.1.0" = { torch_npu = "2.1.0", cann = ["8.0.0"] }\n'
    change = refresh.RowChange("2.1.0", "update", "2.1.0", "2.1.0.post17", (("x86_64", "cpu"),))
    want = refresh.expected_rows(
        refresh.matrix.tomllib.loads(text)["torch_npu"]["versions"], [change]
    )
    assert want == {
        "2.1.0": {"torch_npu": "2.1.0.post17", "cann": ["8.0.0"], "torch_local": {"x86_64": "cpu"}}
    }
    good = refresh.render(text, [change], "2030-01-02", "http://i/simple")
    refresh.check_rendered(good, want, "m.toml")
    with pytest.raises(
        ConfigError,
        match=r"m\.toml: the refreshed \[torch_npu\.versions\] would not read back.*2\.1\.0",
    ):
        refresh.check_rendered(text, want, "m.toml")
    # what the inline layout used to give: a comment inside an inline table
    broken = text.replace(
        '"2.1.0" = {',
        'versions = { "2.2.0" = { torch_npu = "2.2.0", cann = [] }  # cann\n, "2.1.0" = {',
    )
    with pytest.raises(ConfigError, match=r"m\.toml: the refreshed file would not be valid TOML"):
        refresh.check_rendered(broken, want, "m.toml")


def test_new_rows_go_in_newest_first_around_the_rows_already_there():
    text = (
        '[torch_npu]\nread = "x"\n\n[torch_npu.versions]\n"2.13.0" = { torch_npu = "2.13.0", cann = [] }\n'
        '"2.12.0" = { torch_npu = "2.12.0", cann = [] }\n\n[other]\na = 1\n'
    )
    rows = refresh.matrix.tomllib.loads(text)["torch_npu"]["versions"]
    releases = [
        refresh.Release(v, ["aarch64"], {"aarch64": f"torch=={t}"}, t)
        for v, t in [
            ("2.15.0", "2.15.0"),
            ("2.14.0", "2.14.0"),
            ("2.13.0", "2.13.0"),
            ("2.12.0", "2.12.0"),
            ("2.7.1.post11", "2.7.1"),
            ("2.1.0.post17", "2.1.0"),
        ]
    ]
    out = refresh.render(text, refresh.plan(rows, releases), "2030-01-02", "http://i/simple")
    assert versions_keys(out) == ["2.15.0", "2.14.0", "2.13.0", "2.12.0", "2.7.1", "2.1.0"]
    assert out.endswith("\n[other]\na = 1\n")
