"""One URL validator and one masker (issue 13, item 8) through the real `invoke proxy.*` tasks under a --root test
directory: no injection into the files proxy.setup writes, no secret in any output or in any file others can read.
The validator and the masker in-process are in tests/unit/test_urls.py."""

from __future__ import annotations

from urllib.parse import quote

import pytest
from proxyroot import invoke, snapshot

# A password is these two halves around the character under test: neither half may show anywhere.
A, B = "Kq7Lm", "Zw9Tn"


# --- through the command line: injection refused, nothing written -------------------------------------------------


def test_pip_index_with_newlines_injects_nothing(fsroot):
    conf = fsroot / "home/alice/.config/pip/pip.conf"
    conf.parent.mkdir(parents=True)
    conf.write_text("[global]\ntimeout = 60\n")
    before = snapshot(fsroot)
    injected = "https://mirror.example/simple\n[global]\ntrusted-host = evil.example\n[install]\nuser = yes"
    result = invoke(
        "proxy.setup", "--pip-index", injected, "--layers", "pip", "--root", str(fsroot)
    )
    assert result.returncode == 2
    assert (
        result.stderr.strip().count("\n") == 0
        and "line break" in result.stderr
        and "next:" in result.stderr
    )
    assert "evil" not in result.stderr
    assert snapshot(fsroot) == before


@pytest.mark.parametrize(
    "mirror",
    [
        "https://mirror.example ?x",
        "https://u:pw@mirror.example",
        "https://mirror.example/?token=abc",
    ],
)
def test_registry_mirror_that_would_stop_dockerd_writes_nothing(fsroot, mirror):
    daemon_json = fsroot / "etc/docker/daemon.json"
    daemon_json.parent.mkdir(parents=True)
    daemon_json.write_text('{"data-root": "/srv/docker"}\n')
    before = snapshot(fsroot)
    result = invoke(
        "proxy.setup", "--registry-mirror", mirror, "--layers", "daemon", "--root", str(fsroot)
    )
    assert result.returncode == 2 and result.stderr.strip().count("\n") == 0
    assert "pw" not in result.stderr and "abc" not in result.stderr
    assert snapshot(fsroot) == before


# --- the secret scan ------------------------------------------------------------------------------------------------

RESERVED = "/?#[]@:!$&'()*+,;=% "
SUB_DELIMS = (
    ":!$&'()*+,;="  # allowed raw in a password by RFC 3986 (and by Go, curl and Python alike)
)


def _cases():
    url = "http://alice:{}@proxy.corp.example:3128"
    cases = [
        pytest.param(["--http", url.format(f"{A}{char}{B}")], id=f"raw{char!r}")
        for char in RESERVED
        if char not in SUB_DELIMS
    ]
    cases.append(pytest.param(["--http", url.format(f"{A}{SUB_DELIMS}{B}")], id="raw-sub-delims"))
    cases.append(
        pytest.param(
            ["--http", url.format(quote(f"{A}{RESERVED}{B}", safe=""))], id="percent-encoded"
        )
    )
    cases += [
        pytest.param(["--http", f"http://:{A}{B}@proxy.corp.example:3128"], id="empty-user"),
        pytest.param(
            ["--http", f"http://{A}{B}@proxy.corp.example:3128", "--daemon-mode", "daemon-json"],
            id="token",
        ),
        pytest.param(
            ["--http", f"http://alice:{A}@{B}@proxy.corp.example:3128"], id="at-in-password"
        ),
        pytest.param(
            ["--http", f"http://alice:{A} {B}@proxy.corp.example:3128"], id="space-in-password"
        ),
        pytest.param(
            ["--pip-index", f"https://alice:{A}%40{B}@pypi.mirror.example/simple"], id="pip-encoded"
        ),
        pytest.param(["--pip-index", f"http://{A}{B}@pypi.mirror.example/simple"], id="pip-token"),
        pytest.param(
            ["--pip-index", f"https://alice:{A}#{B}@pypi.mirror.example/simple"], id="pip-raw-hash"
        ),
        pytest.param(
            ["--registry-mirror", f"https://alice:{A}{B}@mirror.example"], id="mirror-credentials"
        ),
        pytest.param(
            ["--registry-mirror", f"https://mirror.example/?token={A}{B}"], id="mirror-query"
        ),
    ]
    return cases


def _scan(text: str, where: str) -> None:
    assert A not in text and B not in text, f"secret in {where}: {text[:2000]}"


@pytest.mark.parametrize("args", _cases())
def test_no_secret_in_any_output_or_readable_file(fsroot, args):
    (fsroot / "home/alice/.bashrc").write_text("# mine\n")
    common = [*args, "--root", str(fsroot)]
    if "--daemon-mode" not in args:
        common += ["--daemon-mode", "systemd"]
    dry = invoke("proxy.setup", *common, "--dry-run")
    _scan(dry.stdout + dry.stderr, "the dry run")
    if dry.returncode != 0:  # refused: one line, nothing written
        assert dry.returncode == 2 and dry.stderr.strip().count("\n") == 0, dry.stderr
        assert invoke("proxy.setup", *common).returncode == 2
        assert snapshot(fsroot) == {"home/alice/.bashrc": (b"# mine\n", 0o644)}
        return
    real = invoke("proxy.setup", *common)
    assert real.returncode == 0, real.stderr
    shown = invoke("proxy.show", "--root", str(fsroot))
    as_json = invoke("proxy.show", "--json", "--root", str(fsroot))
    undo = invoke("proxy.remove", "--dry-run", "--root", str(fsroot))
    for result in (real, shown, as_json, undo):
        _scan(result.stdout + result.stderr, " ".join(result.args[4:6]))
    files = snapshot(fsroot)
    assert any(
        A.encode() in data or quote(A).encode() in data for data, _ in files.values()
    )  # it was written
    for relative, (data, mode) in files.items():
        if mode & 0o077:
            _scan(data.decode("utf-8", "replace"), relative)
