"""The installers' pure parts: pip's configuration translated for uv (apexkit.wheel.uvtools) and the RECORD check
that never reads a FIFO (apexkit.wheel.venvs). Real installs with uv and virtualenv + pip are in
tests/e2e/test_installers.py."""

from __future__ import annotations

from pathlib import Path

from apexkit import pipconfig
from apexkit.wheel import uvtools, venvs


def test_pip_config_scopes_and_translation():
    text = "\n".join(
        [
            "global.index-url='https://mirror.corp/simple/'",
            "global.extra-index-url='https://a.corp/simple https://b.corp/simple'",
            r"install.trusted-host='a.corp\nb.corp'",  # pip prints a multi-line value as its repr
            "global.find-links='/opt/wheels'",
            "global.cert='/etc/corp-ca.pem'",
            "global.constraint='/etc/pip/constraints.txt'",
            "global.timeout='60'",
            ":env:.index-url='https://env.corp/simple/'",
            "global.proxy='http://u:p@proxy.corp:3128'",
        ]
    )
    config = pipconfig.parse(text)
    assert (
        config.get("index-url") == "https://env.corp/simple/"
    )  # PIP_INDEX_URL beats the file, as in pip
    args, env = uvtools.install_options(config, venvs.IndexOptions().sources(config))
    assert args == [
        "--index-strategy",
        "unsafe-best-match",
        "--allow-insecure-host",
        "a.corp",
        "--allow-insecure-host",
        "b.corp",
    ]  # the switches alone: no URL, no path
    proxy = "http://u:p@proxy.corp:3128"
    assert env == {
        "UV_INDEX_URL": "https://env.corp/simple/",
        "UV_EXTRA_INDEX_URL": "https://a.corp/simple https://b.corp/simple",
        "UV_FIND_LINKS": "/opt/wheels",
        "UV_CONSTRAINT": "/etc/pip/constraints.txt",
        "SSL_CERT_FILE": "/etc/corp-ca.pem",
        "http_proxy": proxy,
        "HTTP_PROXY": proxy,
        "HTTPS_PROXY": proxy,
        "https_proxy": proxy,
        "UV_HTTP_TIMEOUT": "60",
    }
    # apexkit's own index wins over the config's, its extra indexes and wheelhouses come after the config's
    own = venvs.IndexOptions(
        index_url="https://opt.corp/simple/",
        extra_index_urls=("https://c.corp/simple",),
        wheelhouses=(Path("/w"),),
    )
    _, env = uvtools.install_options(config, own.sources(config))
    assert env["UV_INDEX_URL"] == "https://opt.corp/simple/"
    assert (
        env["UV_EXTRA_INDEX_URL"]
        == "https://a.corp/simple https://b.corp/simple https://c.corp/simple"
    )
    assert env["UV_FIND_LINKS"] == "/opt/wheels,/w"
    # offline drops every index
    offline = venvs.IndexOptions(wheelhouses=(Path("/w"),), offline=True)
    args, env = uvtools.install_options(config, offline.sources(config))
    assert "--offline" in args and "--no-index" in args
    assert "UV_INDEX_URL" not in env and "UV_EXTRA_INDEX_URL" not in env


def test_the_sources_override_what_the_user_exported_for_uv_and_the_log_line_is_masked(monkeypatch):
    """An option on uv's command line beat the user's UV_* variables; the variables apexkit sets do too. The
    install log names the sources with every secret masked."""
    monkeypatch.setenv("UV_INDEX_URL", "https://exported.example/simple/")
    monkeypatch.setenv("UV_HTTP_TIMEOUT", "5")
    env = uvtools.environment(
        Path("/cache"), {"UV_INDEX_URL": "https://own.example/", "UV_HTTP_TIMEOUT": "60"}
    )
    assert env["UV_INDEX_URL"] == "https://own.example/" and env["UV_HTTP_TIMEOUT"] == "5"
    sources = uvtools.Sources(
        index_url="https://u:SECRET@team.example/simple/",
        extra_index_urls=("https://m.example/simple/?token=SECRET",),
    )
    assert sources.shown() == (
        "index https://u:***@team.example/simple/, extra index https://m.example/simple/?token=***"
    )


def test_record_rows_naming_a_fifo_are_never_read(tmp_path):
    """A RECORD is the wheel's word: a row naming a FIFO must not hang the check (it is reported instead)."""
    import os

    site = tmp_path / "site-packages"
    dist = site / "odd-1.0.dist-info"
    dist.mkdir(parents=True)
    os.mkfifo(site / "pipe")
    (dist / "RECORD").write_text("pipe,sha256=47DEQpj8HBSa-_TImW-5JCeuQeRkm5NMpJWZG3hSuFU,0\n")
    assert venvs.record_problems(dist) == ["pipe (not a regular file)"]


def test_the_unreachable_index_is_named_from_uvs_output_never_raw():
    failed = "error: Failed to fetch: `https://user:pw@mirror.corp:3141/simple/torch/`\n  Caused by: tcp connect error"
    assert venvs.unreachable_index(failed) == "mirror.corp:3141"
    hostile = "error: Failed to fetch: `http://ev\x1b[31mil.corp/simple/`\n  Caused by: dns error"
    shown = venvs.unreachable_index(hostile)
    assert shown is not None and "\x1b" not in shown and "\\x1b" in shown
    assert venvs.unreachable_index("error: Failed to fetch: `x`\n  Caused by: 404") is None
