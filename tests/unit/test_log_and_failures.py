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
    assert ids("tree/csrc/x.cpp:2:10: fatal error: torch/extension.h: No such file or directory") == [
        "hardcoded-site-packages"]
    assert ids("/usr/bin/ld: cannot find -lc10: No such file or directory") == ["hardcoded-site-packages"]
    assert ids("packaging.version.InvalidVersion: Invalid version: '0.1-ascend'") == ["invalid-version"]
    assert ids("fatal error: acl/acl.h: No such file or directory") == ["acl-headers-missing"]
    # the aarch64 build against PyPI torch 2.5.1 (old C++ ABI) before the cxx11-abi patch, verbatim
    assert ids("ImportError: /workspace/build/py3.11-torch2.5.1-aarch64-master/smoke-venv/lib/python3.11/site-packages/"
               "apex_C.cpython-311-aarch64-linux-gnu.so: undefined symbol: "
               "_ZN3c106DeviceC1ERKNSt7__cxx1112basic_stringIcSt11char_traitsIcESaIcEEE") == ["cxx11-abi-mismatch"]
    assert ids("all good") == []


def test_missing_system_tools_are_named_with_their_package(monkeypatch, tmp_path):
    from apexkit import systools

    monkeypatch.setenv("PATH", str(tmp_path))
    assert systools.missing(("patch", "readelf")) == ["patch", "readelf"]
    assert systools.ensure(("patch", "readelf"), dry_run=True) == ["binutils", "patch"]


def test_index_options_turn_into_pip_arguments(tmp_path):
    from apexkit.wheel.venvs import IndexOptions

    offline = IndexOptions(wheelhouses=(tmp_path,), offline=True, index_url="https://idx/simple")
    assert offline.pip_args() == ["--no-index", "--find-links", str(tmp_path)]
    idx = IndexOptions(index_url="https://idx/simple", torch_index_url="https://download.pytorch.org/whl/cpu")
    assert idx.pip_args(for_torch=True) == ["--index-url", "https://download.pytorch.org/whl/cpu",
                                            "--extra-index-url", "https://idx/simple"]
    assert idx.pip_args() == ["--index-url", "https://idx/simple"]


def test_doctor_log_streams_a_large_log_once(tmp_path):
    """A 40 MB build log is read in one streamed pass: the known failure near its end is found with its line number
    (across 1 MB blocks), and the CLI's peak memory stays near its 30 MB baseline (before: the whole log read twice,
    131 MB peak for this log, 1.2 GB for a 500 MB one)."""
    import subprocess
    import sys

    from conftest import ROOT

    big = tmp_path / "build.log"
    filler = "g++ -pthread -B /opt/compiler -fno-strict-overflow -Wsign-compare -DNDEBUG -g -O2 -Wall -fPIC x.cpp\n"
    lines = 40 * 2**20 // len(filler)
    with open(big, "w") as fh:
        block = filler * 10000
        for _ in range(lines // 10000):
            fh.write(block)
        fh.write("x.cpp:2:10: fatal error: torch/extension.h: No such file or directory\n")
        fh.write("\x1b[2Jthe last line\n")
    expected_line = (lines // 10000) * 10000 + 1
    with open(big) as fh:
        hits, tail = known_failures.scan(fh, block=1 << 20)
    assert [(h.failure.id, h.line_no) for h in hits] == [("hardcoded-site-packages", expected_line)]
    assert tail[-1] == "\x1b[2Jthe last line" and len(tail) == 10
    probe = ("import resource, subprocess, sys; p = subprocess.run(sys.argv[1:], capture_output=True, text=True); "
             "print(p.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss); print(p.stderr)")
    out = subprocess.run([sys.executable, "-c", probe, sys.executable, "-m", "apexkit", "doctor", "--log", str(big)],
                         cwd=ROOT, capture_output=True, text=True, check=True).stdout
    code, max_rss_kib = (int(x) for x in out.split("\n", 1)[0].split())
    assert code == 0 and f"hardcoded-site-packages  line {expected_line}:" in out
    assert max_rss_kib < 80 * 1024, f"peak RSS {max_rss_kib} KiB for a 40 MB log"


def test_mask_hides_a_password_with_a_slash_and_keeps_paths_and_ports():
    """A raw '/' in a password (generated passwords have them) is masked up to the last '@' of its token; a port
    followed by a path, or an '@' in a path, is not a password."""
    assert log.mask("http://alice:Ab/Secret9@proxy:3128") == "http://alice:***@proxy:3128"
    assert log.mask("index https://u:Tok3n/Secret@m.corp/simple x") == "index https://u:***@m.corp/simple x"
    for kept in ("https://host:8080/path@v1", "git+https://h/r.git@v1.0", "see https://github.com:443/a@b"):
        assert log.mask(kept) == kept


@pytest.mark.timeout(60)
def test_mask_is_linear_on_long_lines():
    """One 1 MB line (a compiler or container line) is masked in one pass: the scheme must start a word (before:
    quadratic, 4.5 s for 40 kB, so hours for this)."""
    line = "a" * 1_000_000 + " http://u:pw@h " + "b" * 1_000_000
    assert log.mask(line).count("http://u:***@h") == 1
