"""pip's configuration as apexkit reads it (apexkit/pipconfig.py): pip's own precedence, checked on `pip config list`
text and end to end with real config files read by the real pip."""

from __future__ import annotations

from apexkit import pipconfig


def test_the_command_section_beats_global_and_the_environment_beats_both():
    text = "\n".join(
        [
            "download.index-url='https://download.example/simple'",  # another command's section: not install's
            "global.cert='/global.pem'",
            "global.index-url='https://global.example/simple'",
            "install.index-url='https://install.example/simple'",
            "global.timeout='30'",
            ":env:.timeout='60'",
            "install.cert='/install.pem'",
            ":env:.cert=''",  # PIP_CERT= (empty): pip ignores it, install's value stays
            r"global.extra-index-url='\nhttps://a.example/simple\nhttps://b.example/simple'",  # a multi-line value
            "freeze.all='true'",
            "not a pip line",
            "global.proxy=not-a-repr",
        ]
    )
    conf = pipconfig.parse(text)
    assert dict(conf) == {
        "index-url": "https://install.example/simple",
        "cert": "/install.pem",
        "timeout": "60",
        "extra-index-url": "\nhttps://a.example/simple\nhttps://b.example/simple",
    }
    assert conf.get_list("extra-index-url") == [
        "https://a.example/simple",
        "https://b.example/simple",
    ]
    assert conf.get_list("find-links") == []
    # the same list as `pip download` reads it: its own section counts, install's does not
    download = pipconfig.parse(text, command="download")
    assert (
        download["index-url"] == "https://download.example/simple"
        and download["cert"] == "/global.pem"
    )


def test_the_order_of_the_lines_does_not_decide():
    lines = [
        ":env:.index-url='https://env.example/simple'",
        "install.index-url='https://install.example/simple'",
        "global.index-url='https://global.example/simple'",
    ]
    for text in ("\n".join(lines), "\n".join(reversed(lines))):
        assert pipconfig.parse(text)["index-url"] == "https://env.example/simple"


def test_one_option_under_two_names_is_one_setting():
    """pip's --timeout is also --default-timeout (one dest): PIP_DEFAULT_TIMEOUT=60 beats a pip.conf timeout = 30
    for pip, so uv must be told 60 too, not the file's 30."""
    from apexkit.wheel import uvtools

    text = "\n".join([":env:.default-timeout='60'", "global.timeout='30'"])
    conf = pipconfig.parse(text)
    assert conf.get("timeout") == "60"
    assert uvtools.install_options(conf, uvtools.Sources())[1]["UV_HTTP_TIMEOUT"] == "60"
    assert pipconfig.parse("global.default-timeout='45'")["timeout"] == "45"
