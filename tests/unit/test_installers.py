"""The installers' pure parts: pip's configuration translated for uv (apexkit.wheel.uvtools) and the RECORD check
that never reads a FIFO (apexkit.wheel.venvs). Real installs with uv and virtualenv + pip are in
tests/e2e/test_installers.py."""

from __future__ import annotations

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
    args, env = uvtools.install_options(config, [])
    assert args[:2] == ["--index-strategy", "unsafe-best-match"]
    joined = " ".join(args)
    assert "--index-url https://env.corp/simple/" in joined
    assert (
        "--extra-index-url https://a.corp/simple --extra-index-url https://b.corp/simple" in joined
    )
    assert "--allow-insecure-host a.corp --allow-insecure-host b.corp" in joined
    assert (
        "--find-links /opt/wheels" in joined and "--constraint /etc/pip/constraints.txt" in joined
    )
    proxy = "http://u:p@proxy.corp:3128"
    assert env == {
        "SSL_CERT_FILE": "/etc/corp-ca.pem",
        "http_proxy": proxy,
        "HTTP_PROXY": proxy,
        "https_proxy": proxy,
        "HTTPS_PROXY": proxy,
        "UV_HTTP_TIMEOUT": "60",
    }
    # apexkit's own --index-url wins over the config's; offline drops every index
    args, _ = uvtools.install_options(config, ["--index-url", "https://opt.corp/simple/"])
    assert args.count("--index-url") == 1 and "https://opt.corp/simple/" in args
    args, _ = uvtools.install_options(config, ["--no-index", "--find-links", "/w"])
    assert "--offline" in args and "--index-url" not in args and "--extra-index-url" not in args


def test_record_rows_naming_a_fifo_are_never_read(tmp_path):
    """A RECORD is the wheel's word: a row naming a FIFO must not hang the check (it is reported instead)."""
    import os

    site = tmp_path / "site-packages"
    dist = site / "odd-1.0.dist-info"
    dist.mkdir(parents=True)
    os.mkfifo(site / "pipe")
    (dist / "RECORD").write_text("pipe,sha256=47DEQpj8HBSa-_TImW-5JCeuQeRkm5NMpJWZG3hSuFU,0\n")
    assert venvs.record_problems(dist) == ["pipe (not a regular file)"]
