"""The compile_cache setting (issue 43): checked like every URL, attributes limited to those apexkit can mask, the
timeouts bounded; APEXKIT_CCACHE=0 turns ccache off. The real ccache, Redis and HTTP storage: tests/e2e/test_compile_cache.py."""

from __future__ import annotations

import pytest

from apexkit import config, log
from apexkit.errors import ConfigError
from apexkit.wheel import ccachestats

SETTING = config.BY_KEY["compile_cache"]


@pytest.mark.parametrize(
    "url",
    [
        "redis://:s3cret@cache.example.com:6379",
        "http://u:p@h/cache|read-only",
        "https://h/c|layout=flat",
    ],
)
def test_a_redis_or_http_url_with_ccache_attributes_is_taken(url):
    assert config.check(SETTING, url, "--compile-cache") == url


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("ftp://h/c", "redis://, http://, https://"),
        ("redis://h:6379|bearer-token=s3cret", "bearer-token"),
        ("redis://h:6379|read-only|operation-timeout=forever", "operation-timeout"),
        ("redis://h:99999", "port"),
    ],
)
def test_another_scheme_or_attribute_is_one_line(url, says):
    with pytest.raises(ConfigError, match=says) as err:
        config.check(SETTING, url, "--compile-cache")
    assert "s3cret" not in err.value.format()


def test_the_remote_wait_is_bounded_unless_given_and_the_password_masked():
    assert (
        ccachestats.remote_storage("redis://h:1|read-only")
        == "redis://h:1|read-only|connect-timeout=500|operation-timeout=5000"
    )
    assert ccachestats.remote_storage("http://h/|operation-timeout=900").endswith(
        "|operation-timeout=900|connect-timeout=500"
    )
    assert log.mask("redis://:s3cret@h:6379|read-only") == "redis://:***@h:6379|read-only"


def test_apexkit_ccache_0_turns_it_off():
    assert ccachestats.find({"APEXKIT_CCACHE": "0", "PATH": "/usr/bin"}) is None
    assert ccachestats.describe_setup(None, {"APEXKIT_CCACHE": "0"}, None).startswith("off (")


def test_matrix_cells_slurm_jobs_and_containers_get_it_in_their_options_file_not_argv(tmp_path):
    from apexkit.wheel import options

    opts = options.resolve(
        "3.11",
        ["--compile-cache", "redis://:s3cret@cache:6379|read-only", "--dist", str(tmp_path / "d")],
        env={"HOME": str(tmp_path), "APEXKIT_CACHE_DIR": str(tmp_path / "c")},
    )
    data = options.child_json(opts)  # the 0600 file a cell, a Slurm job or a container build reads
    assert b'"compile_cache": "redis://:s3cret@cache:6379|read-only"' in data
    assert options.from_json(options.to_json(opts), "3.11").compile_cache == opts.compile_cache
