"""--sanitize in-process: the option, the +asan target and version label, its own cache key, publish refusing it,
and reading a sanitizer report. The sanitizer build itself (fixture, real ASan runtime): tests/e2e/test_sanitize.py."""

from __future__ import annotations

import json

import pytest

from apexkit.errors import ConfigError
from apexkit.index import publish
from apexkit.plan import matrix
from apexkit.wheel import buildplan, options, sanitize
from apexkit.wheel.builder import identity_env
from apexkit.wheel.interpreters import Interpreter
from apexkit.wheel.options import BuildOptions

INTERP = Interpreter("/usr/bin/python3.11", "3.11", "3.11.2", "cpython", "x86_64", "/usr", "", "")


def plan(**opts):
    return buildplan.make_plan(
        BuildOptions(python="3.11", **opts), matrix.load(), INTERP, "2.13.0", env={}
    )


def test_the_option_takes_the_known_sanitizers_only():
    assert options.resolve("3.11", ["--sanitize", "undefined,address"], env={}).sanitize == (
        "address",
        "undefined",
    )
    for bad in ("thread", "address,memory", ","):
        with pytest.raises(ConfigError, match="--sanitize") as exc:
            options.resolve("3.11", ["--sanitize", bad], env={})
        assert "address,undefined" in exc.value.hint


def test_a_sanitizer_build_is_its_own_target_version_and_cache_key():
    release, asan = plan(), plan(sanitize=("address", "undefined"))
    assert asan.target_id == release.target_id + "+asan"
    assert identity_env(asan)["APEXKIT_VERSION_LABEL"] == ".torch2.13.0.asan"
    assert identity_env(release)["APEXKIT_VERSION_LABEL"] == ".torch2.13.0"
    m = matrix.load()
    key = lambda p, o: buildplan.cache_key(p, o, "a" * 40, "b" * 40, [], m)  # noqa: E731
    assert key(release, BuildOptions(python="3.11")) != key(
        asan, BuildOptions(python="3.11", sanitize=("address", "undefined"))
    )


@pytest.mark.parametrize("identity", [{"sanitize": ["address", "undefined"]}, {}])
def test_publish_never_takes_a_sanitizer_build(tmp_path, identity):
    target = "py3.11-torch2.13.0-x86_64-master+asan"
    folder = tmp_path / "dist" / target
    folder.mkdir(parents=True)
    (folder / "manifest.json").write_text(json.dumps({"target": {"identity": identity}}))
    with pytest.raises(
        ConfigError, match="no built wheel"
    ):  # skipped (one line): nothing left to publish
        publish.collect(tmp_path / "dist")
    with pytest.raises(
        ConfigError, match=r"sanitizer build \(--sanitize, \+asan\): it is never published"
    ):
        publish.collect(tmp_path / "dist", [target])


def test_a_report_becomes_one_line_with_its_first_frames():
    report = (
        "=================================================================\n"
        "==4242==ERROR: AddressSanitizer: heap-buffer-overflow on address 0x602000000050 at pc 0x7f sp 0x7ffd\n"
        "READ of size 4 at 0x602000000050 thread T0\n"
        "    #0 0x7f5a1b2c3d4e in change_data_ptr(at::Tensor, at::Tensor, int) change_dataptr.cpp:51\n"
        "    #1 0x7f5a1b2c3e00 in PyObject_Call (/usr/lib/libpython3.11.so+0x1234)\n"
    )
    line = sanitize.finding(report)
    assert line is not None and line.startswith(
        "heap-buffer-overflow; stack: #0 0x7f5a1b2c3d4e in change_data_ptr"
    )
    assert "\n" not in line and "#1 0x7f5a1b2c3e00 in PyObject_Call" in line
    ub = "x.cpp:3:12: runtime error: signed integer overflow: 2147483647 + 1 cannot be represented in type 'int'\n"
    assert sanitize.finding(ub).startswith("undefined behaviour: signed integer overflow")
    assert sanitize.finding("all clean\n") is None
