"""apexkit.proxy.layers in-process: proxy URLs, the settings read from the environment, systemd quoting, the
daemon mode, and where a path in a home leads. The `invoke proxy.*` command line is in tests/e2e/test_proxy.py."""

from __future__ import annotations

import os

import fakes
import pytest

from apexkit.proxy import layers

# --- inputs ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value, expected",
    [
        ("http://proxy:3128", "http://proxy:3128"),
        ("proxy.corp:8080", "http://proxy.corp:8080"),
        ("HTTP://Proxy.Corp:8080/", "http://proxy.corp:8080"),
        ("http://u:p%40ss@10.0.0.1:3128", "http://u:p%40ss@10.0.0.1:3128"),
        ("socks5h://[::1]:1080", "socks5h://[::1]:1080"),
    ],
)
def test_proxy_urls_are_normalised(value, expected):
    assert layers.parse_proxy_url(value, "--http") == expected


@pytest.mark.parametrize(
    "value, fragment",
    [
        ("http://proxy", "no port"),
        ("ftp://proxy:21", "not a proxy scheme"),
        ("http://proxy:99999", "out of range"),
        ("http://proxy:3128/path", "no path"),
        ("http://bad_host!:3128", "not a valid host"),
        ("http://:3128", "no host"),
    ],
)
def test_bad_proxy_urls_are_refused_with_a_hint(value, fragment):
    with pytest.raises(layers.ConfigError) as info:
        layers.parse_proxy_url(value, "--http")
    assert fragment in info.value.cause
    assert info.value.hint


def test_no_proxy_always_has_loopback_and_keeps_the_users_entries():
    assert layers.merge_no_proxy(".corp.example, 10.0.0.0/8 localhost") == (
        "localhost",
        "127.0.0.0/8",
        "::1",
        ".corp.example",
        "10.0.0.0/8",
    )
    with pytest.raises(layers.ConfigError):
        layers.merge_no_proxy("http://x")


def test_settings_come_from_the_environment_lower_case_first():
    env = {"http_proxy": "http://lower:3128", "HTTP_PROXY": "http://upper:3128", "NO_PROXY": ".lan"}
    settings = layers.make_settings(environ=env)
    assert settings.http == "http://lower:3128"
    assert settings.https == "http://lower:3128"  # https falls back to http
    assert settings.no_proxy[-1] == ".lan"
    with pytest.raises(layers.ConfigError, match="no proxy given"):
        layers.make_settings(environ={})


def test_percent_signs_survive_systemd_quoting():
    url = "http://u:p%40ss%25w0rd@proxy:3128"
    content = layers.render_dropin({"HTTP_PROXY": url, "NO_PROXY": "localhost"}).decode()
    assert "p%%40ss%%25w0rd" in content  # systemd would expand a single % as a specifier
    assert layers.dropin_environment(content) == {"HTTP_PROXY": url, "NO_PROXY": "localhost"}


def test_daemon_mode_follows_the_engine_version():
    assert layers.resolve_daemon_mode("auto", (20, 10))[0] == "systemd"
    assert layers.resolve_daemon_mode("auto", (24, 0))[0] == "daemon-json"
    assert layers.resolve_daemon_mode("auto", None)[0] == "systemd"
    with pytest.raises(layers.ConfigError, match="needs Docker >= 23"):
        layers.resolve_daemon_mode("daemon-json", (20, 10))


@fakes.needs_root
def test_in_home_takes_out_dotdot_and_follows_links(fsroot):
    home = fakes.users_home(fsroot)
    (fsroot / "etc/docker").mkdir(parents=True)
    (home / "dotfiles").mkdir()
    os.chown(home / "dotfiles", fakes.NOBODY, fakes.NOBODY)
    (home / ".docker").symlink_to("../../etc/docker")  # root's own link out of the home
    fakes.users_link(home / ".dots", "dotfiles")
    paths = layers.Paths(root=fsroot, environ={"HOME": "/home/alice"})
    assert not paths.in_home("/home/alice/../../root/.docker/config.json")
    assert not paths.in_home("/home/alice/.docker/config.json")  # really /etc/docker: stays root's
    assert paths.in_home("/home/alice/.dots/bashrc") and paths.in_home("/home/alice/.bashrc")
    environ = {"HOME": "/home/alice", "DOCKER_CONFIG": "/home/alice/../../root/.docker"}
    assert not layers.Paths(root=fsroot, environ=environ).in_home(
        layers.Paths(root=fsroot, environ=environ).docker_config
    )
