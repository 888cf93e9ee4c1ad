"""One URL validator and one masker (issue 13, item 8): no injection into the files proxy.setup writes, no secret in
any output or in any file others can read, a failed read-back puts every file back, no userinfo in image build args.

The command-line checks run the real `invoke proxy.*` tasks under a --root test directory (see test_proxy.py).
"""

from __future__ import annotations

import json
import re
import stat

import pytest
from proxyroot import paths, snapshot

from apexkit import fsedit, log, urls
from apexkit.errors import ConfigError, EnvironmentSetupError
from apexkit.images import builder
from apexkit.proxy import layers

# A password is these two halves around the character under test: neither half may show anywhere.
A, B = "Kq7Lm", "Zw9Tn"
PROXY_SCHEMES = layers.PROXY_SCHEMES


# --- the masker -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, expected",
    [
        ("http://alice:s3cret@proxy:3128/x", "http://alice:***@proxy:3128/x"),
        ("http://:s3cret@proxy:3128", "http://:***@proxy:3128"),
        (
            "http://alice:p@ss@proxy:3128",
            "http://alice:***@proxy:3128",
        ),  # up to the LAST '@' before the host
        ("http://alice:pa ss@proxy:3128", "http://alice:***@proxy:3128"),  # a space in the password
        ("http://alice:pa\tss@proxy:3128", "http://alice:***@proxy:3128"),
        (
            "export x=http://TOKEN123@proxy:3128",
            "export x=http://***@proxy:3128",
        ),  # a token alone is the secret
        ("http://alice:p%40ss%2Fw@proxy:3128", "http://alice:***@proxy:3128"),  # percent-encoded
        ("http://alice@corp.example:s3cret@proxy:3128", "http://alice@corp.example:***@proxy:3128"),
        (
            "'http://u:it'\"'\"'s@proxy'",
            "'http://u:***@proxy'",
        ),  # shlex-quoted password with a quote
        (
            'Environment="HTTP_PROXY=http://u:s3cret@h:1" x',
            'Environment="HTTP_PROXY=http://u:***@h:1" x',
        ),
        # idempotent
        (
            "http://alice:***@proxy:3128 http://***@proxy",
            "http://alice:***@proxy:3128 http://***@proxy",
        ),
    ],
)
def test_mask_hides_every_userinfo_form(text, expected):
    assert log.mask(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "git fetch https://host/repo.git",
        "pip install git+https://github.com/NVIDIA/apex@0da3ffb9",  # '@' after a '/' is a ref, not userinfo
        "pip install foo @ https://files.example/x.whl",
        "http://proxy:3128 no secret here",
    ],
)
def test_mask_leaves_text_without_userinfo_alone(text):
    assert log.mask(text) == text


def test_mask_never_joins_two_urls_or_two_lines():
    assert (
        log.mask("a=https://u:s3cret@h b=http://v:p4ss@g") == "a=https://u:***@h b=http://v:***@g"
    )
    assert log.mask("http://u:pa ss@h1 http://v:q@h2") == "http://u:***@h1 http://v:***@h2"
    # no '@' on the URL's own line: the next line is not taken for its host
    assert log.mask("http://u:pw\nmail bob@corp") == "http://u:pw\nmail bob@corp"
    assert log.mask("http://u:pw@h:1 -> ask admin@corp") == "http://u:***@h:1 -> ask admin@corp"


# --- the validator ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value, expected",
    [
        ("http://:pw@proxy:3128", "http://:pw@proxy:3128"),
        ("http://TOKEN@proxy:3128", "http://TOKEN@proxy:3128"),
        ("http://alice:p%40ss%2F@proxy:3128", "http://alice:p%40ss%2F@proxy:3128"),
        ("http://alice:a:b!$&'()*+,;=@proxy:3128", "http://alice:a:b!$&'()*+,;=@proxy:3128"),
        ("  http://proxy:3128  ", "http://proxy:3128"),
    ],
)
def test_proxy_userinfo_forms_that_every_parser_reads_alike_are_kept(value, expected):
    assert urls.proxy_url(value, "--http", PROXY_SCHEMES) == expected


@pytest.mark.parametrize(
    "password, problem",
    [
        (f"{A}/{B}", "before the '@' ends the host part early"),
        (f"{A}#{B}", "before the '@' ends the host part early"),
        (f"{A}?{B}", "before the '@' ends the host part early"),
        (f"{A}@{B}", "more than one '@'"),
        (f"{A} {B}", "whitespace"),
        (f"{A}\n{B}", "a line break"),
        (f"{A}\x1b{B}", "a control character"),
        (f'{A}"{B}', "a character a URL does not allow"),
        (f"{A}%{B}", "a character a URL does not allow"),  # '%' not followed by two hex digits
        (f"{A}[{B}", "host"),
    ],
)
def test_a_password_that_does_not_parse_is_refused_without_being_quoted(password, problem):
    value = f"http://alice:{password}@127.0.0.1:3128"
    with pytest.raises(ConfigError) as info:
        urls.proxy_url(value, "--http", PROXY_SCHEMES)
    message = info.value.format()
    assert problem in message
    assert A not in message and B not in message
    assert "\n" not in message
    if "'@'" in problem or "early" in problem:
        assert "%2F" in message and "%23" in message and "%40" in message  # says how to write it


def test_the_port_error_names_the_part_not_the_password():
    # the issue's own examples: urllib says "Port could not be cast to integer value as 'Ab'"
    def refusal(value: str) -> str:
        with pytest.raises(ConfigError) as info:
            urls.proxy_url(value, "--http", PROXY_SCHEMES)
        return str(info.value)

    for value in (
        "http://alice:Ab/Secret9@127.0.0.1:3128",
        "http://alice:Xy7#Secret@127.0.0.1:3128",
    ):
        message = refusal(value)
        assert message.startswith("--http http://127.0.0.1: ")
        for leak in ("Ab", "Secret", "Xy7", "alice"):
            assert leak not in message
    message = refusal("http://proxy:12ab")
    assert "port is not a number" in message and "12ab" not in message


@pytest.mark.parametrize(
    "value, problem",
    [
        ("https://mirror.example/simple\n[global]\ntrusted-host = evil.example", "a line break"),
        ("https://mirror.example/simple\r\nindex-url=x", "a line break"),
        ("https://mirror.example/sim ple", "whitespace"),
        ("ftp://mirror.example/simple", "scheme 'ftp'"),
        ("https://mirror.example/simple#frag", "no #fragment"),
        ("mirror.example/simple", "no scheme"),
    ],
)
def test_pip_index_refusals(value, problem):
    with pytest.raises(ConfigError, match=re.escape(problem)):
        urls.index_url(value, "--pip-index")


def test_pip_index_keeps_userinfo_and_a_query():
    assert (
        urls.index_url("https://u:p%40w@m.example/simple", "--pip-index")
        == "https://u:p%40w@m.example/simple/"
    )
    assert (
        urls.index_url("https://m.example/simple?x=1", "--pip-index")
        == "https://m.example/simple?x=1"
    )


@pytest.mark.parametrize(
    "value, problem",
    [
        ("https://u:pw@mirror.example", "no user name, password or token"),
        ("https://TOKEN@mirror.example", "no user name, password or token"),
        ("https://:pw@mirror.example", "no user name, password or token"),
        ("https://mirror.example?token=abc", "no path, ?query or #fragment"),
        ("https://mirror.example/#x", "no path, ?query or #fragment"),
        ("http://10.0.0.5:5000/mirror", "no path, ?query or #fragment"),
        ("https://mirror.example /x", "whitespace"),
        ("https://mirror.example\n", None),  # outer whitespace is trimmed: accepted
        ("unix:///var/run/x.sock", "scheme 'unix'"),
        ("registry-1.docker.io", "no scheme"),
    ],
)
def test_registry_mirror_forms_dockerd_refuses_are_refused(value, problem):
    if problem is None:
        assert urls.registry_mirror(value, "--registry-mirror") == "https://mirror.example"
        return
    with pytest.raises(ConfigError, match=re.escape(problem)) as info:
        urls.registry_mirror(value, "--registry-mirror")
    assert (
        "pw" not in str(info.value)
        and "TOKEN" not in str(info.value)
        and "abc" not in str(info.value)
    )


def test_registry_mirror_keeps_host_and_port():
    assert (
        urls.registry_mirror("http://10.0.0.5:5000/", "--registry-mirror") == "http://10.0.0.5:5000"
    )
    assert urls.registry_mirror("HTTPS://[::1]:5000", "--registry-mirror") == "https://[::1]:5000"


def test_no_proxy_entries_with_control_characters_are_refused():
    with pytest.raises(ConfigError, match="control character"):
        layers.merge_no_proxy(".corp\x1b[2J")


def _scan(text: str, where: str) -> None:
    assert A not in text and B not in text, f"secret in {where}: {text[:2000]}"


# --- a failed read-back rolls back ---------------------------------------------------------------------------------


def test_failed_read_back_puts_every_file_back(fsroot):
    bashrc = fsroot / "home/alice/.bashrc"
    bashrc.write_bytes(b"# mine\nexport A=1")
    bashrc.chmod(0o640)
    conf = fsroot / "home/alice/.config/pip/pip.conf"
    conf.parent.mkdir(parents=True)
    conf.write_bytes(b"[global]\ntimeout = 60\n")
    before = snapshot(fsroot)
    where = paths(fsroot)
    settings = layers.make_settings(
        http="http://proxy.corp.example:3128",
        pip_index="https://pypi.mirror.example/simple",
        environ={},
    )
    plan = layers.make_plan(settings, where, ("shell", "pip"))

    def another_writer():  # between our write and our read-back, something else rewrites pip.conf
        conf.write_bytes(b"[global]\nindex-url = https://elsewhere.example/simple/\n")

    with pytest.raises(
        EnvironmentSetupError, match="read-back after writing found differences.*put back"
    ) as info:
        layers.setup(plan, after_write=another_writer)
    assert "pip.conf: index-url" in str(info.value)
    assert (
        snapshot(fsroot) == before
    )  # the files, their modes, and no backup or manifest left behind

    # with nobody in the way the same plan goes through, and verify reads back what it wrote
    assert layers.setup(layers.make_plan(settings, where, ("shell", "pip"))) == 3
    assert (
        fsedit.ini_get(conf.read_text(), "global", "index-url")
        == "https://pypi.mirror.example/simple/"
    )
    assert stat.S_IMODE(bashrc.stat().st_mode) == 0o640


# --- image build arguments ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "index",
    [
        f"https://alice:{A}@mirror.example/simple/",
        f"https://:{A}@mirror.example/simple/",
        f"https://{A}@mirror.example/simple/",
        f"https://alice:{A}%40{B}@mirror.example/simple/",
        f"https://mirror.example/simple/?private_token={A}",  # a query: `docker history` keeps it too
    ],
)
def test_image_build_refuses_any_userinfo_in_the_index_build_arg(tmp_path, index):
    environ = {"HOME": str(tmp_path), "XDG_CONFIG_HOME": str(tmp_path / "config")}
    for kwargs in ({"pip_index": index}, {}):
        env = dict(environ) if kwargs else {**environ, "PIP_INDEX_URL": index}
        with pytest.raises(ConfigError, match="holds a password or token") as info:
            builder.plan_image(builder.ImageOptions("x86_64", "debian", **kwargs), environ=env)
        _scan(info.value.format(), "the error")
        assert "image history" in info.value.cause and info.value.hint


def test_image_build_index_build_arg_goes_through_the_validator(tmp_path):
    environ = {"HOME": str(tmp_path), "XDG_CONFIG_HOME": str(tmp_path / "config")}
    with pytest.raises(ConfigError, match="line break"):
        builder.plan_image(
            builder.ImageOptions("x86_64", "debian", pip_index="https://m.example/simple\nX"),
            environ=environ,
        )


def test_saved_settings_that_no_longer_validate_are_ignored_with_a_warning(fsroot, capsys):
    where = paths(fsroot)
    state = fsroot / where.settings_file.lstrip("/")
    state.parent.mkdir(parents=True)
    state.write_text(json.dumps({"settings": {"http": "http://proxy:3128\n[x]", "https": None}}))
    assert layers.current_settings(where, environ={}) is None
    assert "saved proxy settings" in capsys.readouterr().err


# --- issue 40 (review 2026-12-04 L1, F2, L3): queries, unencoded passwords, nested config files ------------------


@pytest.mark.parametrize(
    "text, expected",
    [
        ("https://idx.corp/simple?token=SECRET123", "https://idx.corp/simple?token=***"),
        (
            "x https://h/s?private_token=GLPAT-SECRET&a=1#access_token=AT-SECRET y",
            "x https://h/s?private_token=***&a=***#access_token=*** y",
        ),
        ("https://h/simple/?SECRET", "https://h/simple/?***"),
        ("https://u:SECRET@h/s?token=***", "https://u:***@h/s?token=***"),  # idempotent
        # a raw '#', '/' or '@' in a password: hidden up to the token's last '@', none of it shown
        ("http://tuser:t@k:en/#%@host/", "http://tuser:***@host/"),
    ],
)
def test_mask_hides_query_strings_and_unencoded_passwords(text, expected):
    assert log.mask(text) == expected


def test_a_query_token_goes_into_the_options_file_not_the_container_environment(
    tmp_path, monkeypatch
):
    from apexkit.images import container
    from apexkit.wheel import options

    monkeypatch.setenv("APEXKIT_CACHE_DIR", str(tmp_path / "cache"))
    opts = options.resolve(
        "3.11", ["--dist", str(tmp_path / "dist"), "--build-dir", str(tmp_path / "build")], env={}
    )
    environ = {
        "PIP_INDEX_URL": "https://idx.corp/simple?token=SECRET123",
        "PIP_EXTRA_INDEX_URL": "https://gl.corp/api/v4/simple?private_token=GLPAT-SECRET",
        # a token as a path segment (entitlement-token mirrors) or a ;parameter: any URL is kept out
        "APEXKIT_TORCH_INDEX_URL": "https://dl.mirror.corp/ENTITLEMENT-abc123/whl/cpu;token=SEMI",
        "PIP_TRUSTED_HOST": "idx.corp",
    }
    spec = container.make_spec(
        opts, "apexkit/builder:debian-bookworm-x86_64", {}, "x86_64", environ=environ, euid=4321
    )
    secrets = ("SECRET123", "GLPAT-SECRET", "ENTITLEMENT-abc123", "SEMI")
    for secret in secrets:
        assert secret not in json.dumps(spec.environment) and secret not in " ".join(spec.command)
    assert spec.environment["PIP_TRUSTED_HOST"] == "idx.corp"  # what holds no URL stays plain
    spec.workspace.mkdir(parents=True)
    with container._options_file(spec) as path:
        assert (path.stat().st_mode & 0o777) == 0o600
        assert all(secret in path.read_text() for secret in secrets)


@pytest.mark.parametrize("where", ["--index", "--team-index", "APEXKIT_INDEX"])
def test_an_index_password_with_unencoded_reserved_characters_is_refused_unquoted(where):
    """F2: `install --index 'http://u:t@k:en/#%@host/'` printed `http://u:***@k:en/#%@host/` and named --index-url."""
    from apexkit.index import client

    with pytest.raises(ConfigError) as info:
        client.check_index_url("http://tuser:t@k:en/#%@host/", where)
    message = info.value.format()
    assert message.startswith(f"{where} http://host: ") and "percent-encode" in message
    assert "\n" not in message
    for leak in ("t@k", "k:en", "en/", "#%", "tuser"):
        assert leak not in message, leak
    assert "--index-url" not in message


def test_a_config_files_team_index_with_an_unencoded_password_is_refused_unquoted(tmp_path):
    from apexkit import config

    (tmp_path / "apexkit.toml").write_text('team_indexes = ["http://tuser:t@k:en/#%@host/"]\n')
    with pytest.raises(ConfigError) as info:
        config.load({}, cwd=tmp_path)
    message = info.value.format()
    assert "percent-encode" in message and "apexkit.toml" in message
    assert "t@k" not in message and "k:en" not in message


def test_a_deeply_nested_config_file_is_one_line_naming_it(tmp_path):
    from apexkit import config

    path = tmp_path / "apexkit.toml"
    path.write_text("team_indexes = " + "[" * 30000 + "]" * 30000 + "\n")
    assert path.stat().st_size < config.MAX_BYTES
    with pytest.raises(ConfigError) as info:
        config.load({}, cwd=tmp_path)
    assert str(path) in info.value.format() and "nested too deeply" in info.value.format()


def test_a_project_files_value_says_where_it_comes_from(tmp_path):
    from apexkit import config

    (tmp_path / "apexkit.toml").write_text(f'team_indexes = ["{tmp_path}"]\n')
    value = config.load({}, cwd=tmp_path).get("team_indexes", {})
    assert value.told == f" (from project {tmp_path / 'apexkit.toml'})"
    assert config.load({}, cwd=tmp_path).get("team_indexes", {}, flag=["/x"]).told == ""
