import pytest

from apexkit import log
from apexkit.errors import BuildError
from apexkit.wheel import known_failures


def test_mask_hides_passwords_only():
    assert log.mask("http://alice:s3cret@proxy:3128/x") == "http://alice:***@proxy:3128/x"
    assert log.mask("git fetch https://host/repo.git") == "git fetch https://host/repo.git"
    assert "s3cret" not in log.mask("a=https://u:s3cret@h b=http://v:p4ss@g")


def test_error_is_one_line_with_next_step():
    err = BuildError("setup.py failed:\n  something", "see the log")
    assert err.format() == "setup.py failed: something -- next: see the log"
    assert err.exit_code == 7


def test_known_failure_signatures():
    ids = lambda text: [f.id for f in known_failures.match(text)]  # noqa: E731
    assert ids(
        "tree/csrc/x.cpp:2:10: fatal error: torch/extension.h: No such file or directory"
    ) == ["hardcoded-site-packages"]
    assert ids("/usr/bin/ld: cannot find -lc10: No such file or directory") == [
        "hardcoded-site-packages"
    ]
    assert ids("packaging.version.InvalidVersion: Invalid version: '0.1-ascend'") == [
        "invalid-version"
    ]
    assert ids("fatal error: acl/acl.h: No such file or directory") == ["acl-headers-missing"]
    # the aarch64 build against PyPI torch 2.5.1 (old C++ ABI) before the cxx11-abi patch, verbatim
    assert ids(
        "ImportError: /workspace/build/py3.11-torch2.5.1-aarch64-master/smoke-venv/lib/python3.11/site-packages/"
        "apex_C.cpython-311-aarch64-linux-gnu.so: undefined symbol: "
        "_ZN3c106DeviceC1ERKNSt7__cxx1112basic_stringIcSt11char_traitsIcESaIcEEE"
    ) == ["cxx11-abi-mismatch"]
    # real Ascend master against torch 2.14.1 under npu.patch's -std=c++17 (tests/data/failure-logs/cxx-std-too-old.log)
    assert ids(
        "/venv/lib/python3.11/site-packages/torch/include/ATen/ExpandUtils.h:470:28: error: "
        "‘sizes’ is not a member of ‘at::symint’"
    ) == ["cxx-std-too-old"]
    # the fixture's c10/core/StorageImpl.h under -std=c++17 against torch 2.14.1
    assert ids(
        "torch/include/c10/util/intrusive_ptr.h:775:22: note: ‘std::strong_ordering’ is only available from C++20 onwards"
    ) == ["cxx-std-too-old"]
    assert ids("all good") == []


def test_missing_system_tools_are_named_with_their_package(monkeypatch, tmp_path):
    from tools import systools

    monkeypatch.setenv("PATH", str(tmp_path))
    assert systools.missing(("patch", "readelf")) == ["patch", "readelf"]
    assert systools.ensure(("patch", "readelf"), dry_run=True) == ["binutils", "patch"]


def test_index_options_turn_into_pip_and_uv_variables(tmp_path):
    """Every index URL and find-links place goes to pip and uv through their environment, none as an argument."""
    from apexkit.pipconfig import PipConfig
    from apexkit.wheel.venvs import IndexOptions

    none = PipConfig()
    offline = IndexOptions(wheelhouses=(tmp_path,), offline=True, index_url="https://idx/simple")
    assert offline.sources(none).environment("PIP") == {
        "PIP_NO_INDEX": "1",
        "PIP_FIND_LINKS": str(tmp_path),
    }
    assert offline.sources(none).environment("UV") == {"UV_FIND_LINKS": str(tmp_path)}
    idx = IndexOptions(
        index_url="https://idx/simple", torch_index_url="https://download.pytorch.org/whl/cpu"
    )
    assert idx.sources(none, for_torch=True).environment("PIP") == {
        "PIP_INDEX_URL": "https://download.pytorch.org/whl/cpu",
        "PIP_EXTRA_INDEX_URL": "https://idx/simple",
    }
    assert idx.sources(none).environment("UV") == {"UV_INDEX_URL": "https://idx/simple"}
    # a wheelhouse whose path a separator would split is named by its file: URL
    odd = tmp_path / "a b,c"
    assert IndexOptions(wheelhouses=(odd, tmp_path)).sources(none).environment("UV") == {
        "UV_FIND_LINKS": f"{odd.as_uri()},{tmp_path}"
    }


def test_mask_hides_a_password_with_a_slash_and_keeps_paths_and_ports():
    """A raw '/' in a password (generated passwords have them) is masked up to the last '@' of its token; a port
    followed by a path, or an '@' in a path, is not a password."""
    assert log.mask("http://alice:Ab/Secret9@proxy:3128") == "http://alice:***@proxy:3128"
    assert (
        log.mask("index https://u:Tok3n/Secret@m.corp/simple x")
        == "index https://u:***@m.corp/simple x"
    )
    for kept in (
        "https://host:8080/path@v1",
        "git+https://h/r.git@v1.0",
        "see https://github.com:443/a@b",
    ):
        assert log.mask(kept) == kept


@pytest.mark.timeout(60)
def test_mask_is_linear_on_long_lines():
    """One 1 MB line (a compiler or container line) is masked in one pass: the scheme must start a word (before:
    quadratic, 4.5 s for 40 kB, so hours for this)."""
    line = "a" * 1_000_000 + " http://u:pw@h " + "b" * 1_000_000
    assert log.mask(line).count("http://u:***@h") == 1


def test_a_bare_resolution_impossible_is_not_the_setuptools_pin_conflict():
    """issue 41 C: torch missing from the wheelhouse ended in pip's generic ResolutionImpossible and was blamed on a
    setuptools pin; the real log (uv, then pip) names torch, and the setuptools signature needs setuptools."""
    from conftest import DATA

    text = (DATA / "failure-logs" / "torch-not-in-wheelhouse.log").read_text()
    assert [h.failure.id for h in known_failures.find(text)] == ["torch-not-in-wheelhouse"]
    generic = "ERROR: ResolutionImpossible: for help visit https://pip.pypa.io/en/latest/topics/x\n"
    assert known_failures.find(generic) == []
    uv_other_version = (
        "  ╰─▶ Because there is no version of torch==2.1.0 and you require torch==2.1.0, ...\n"
    )
    assert [h.failure.id for h in known_failures.find(uv_other_version)] == [
        "torch-not-in-wheelhouse"
    ]
