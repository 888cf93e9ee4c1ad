"""One check/report model (apexkit/checks.py): doctor, proxy.check and image.emulation give rows of one type, shown by
one renderer on stdout (or one JSON form), with one exit-code rule; progress and logs stay on stderr."""

from __future__ import annotations

import json
import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from apexkit import checks, dockerclient, log
from apexkit.doctor import cli as doctorcli
from apexkit.doctor import machine as doctor
from apexkit.images import builder as images
from apexkit.images import cli as imagecli
from apexkit.proxy import check as proxycheck
from apexkit.proxy import cli as proxycli
from apexkit.proxy import layers as proxy

SECRET = "s3cret-pw"
ROW_LINE = re.compile(r"^  (ok  |warn|FAIL|skip) (\S.{23}|\S{24,}) \S")
FIX_LINE = re.compile(r"^ {32}→ \S")
MORE_LINE = re.compile(r"^ {32}[^ →]")
SUMMARY = re.compile(r"^\d+ ok, \d+ warn, \d+ fail, \d+ skip$")
COMMON = ("area", "name", "status", "detail", "fix", "data")


def doctor_rows(tmp_path: Path) -> list[checks.Row]:
    """Real doctor checks: no python3 on an empty PATH (fail), a proxy variable set in one case only (warn)."""
    return doctor.check_python_names({"PATH": str(tmp_path)}) + doctor.check_proxy_variables(
        {"https_proxy": f"http://alice:{SECRET}@proxy:3128"}
    )


def proxy_rows(tmp_path: Path) -> list[checks.Row]:
    """Real proxy.check layers: the shell with nothing configured (skip), a daemon that does not use the proxy (fail)."""
    paths = proxy.Paths(root=tmp_path, environ={"HOME": "/root"})
    settings = proxy.make_settings(http=f"http://alice:{SECRET}@127.0.0.1:9")
    no_proxy_daemon = SimpleNamespace(
        info=lambda: {"HttpsProxy": "", "HttpProxy": "", "NoProxy": ""}
    )
    return [
        proxycheck.check_shell(paths, None, proxycheck.DEFAULT_INDEX, environ={}),
        proxycheck.check_daemon(paths, settings, no_proxy_daemon, ""),
    ]


def run_doctor(monkeypatch, rows, **options) -> int:
    monkeypatch.setattr(
        doctor,
        "run_all",
        lambda progress=None, apex=None: (progress("x"), log.info("progress"), rows)[2],
    )
    monkeypatch.setattr(
        doctor, "check_sources", lambda *a, **k: []
    )  # no probes: tests/e2e/test_config_sources.py
    return doctorcli.main(doctorcli.Doctor(**options))


def run_proxy_check(monkeypatch, tmp_path, rows, **options) -> int:
    monkeypatch.setattr(proxycheck, "check", lambda *args, **kwargs: rows)
    monkeypatch.setattr(proxycheck, "check_sources", lambda *a, **k: [])
    return proxycli.check(proxycli.Check(root=str(tmp_path), **options))


def run_emulation(tmp_path, **options) -> int:
    return imagecli.emulation(
        imagecli.Emulation(**options), binfmt_dir=tmp_path / "no-binfmt"
    )  # aarch64 (or x86_64) cannot run here


def emulation_rows(tmp_path) -> list[checks.Row]:
    return [images.emulation(arch, tmp_path / "no-binfmt").row() for arch in dockerclient.ARCHES]


def rendered(capsys, rows: list[checks.Row]) -> str:
    checks.render(rows)
    return capsys.readouterr().out


def assert_layout(text: str) -> None:
    lines = text.splitlines()
    assert lines and SUMMARY.match(lines[-1]), text
    for line in lines[:-1]:
        assert (
            ROW_LINE.match(line)
            or FIX_LINE.match(line)
            or MORE_LINE.match(line)
            or re.match(r"^\S", line)
        ), line


def test_the_three_commands_print_their_rows_through_the_one_renderer_on_stdout(
    monkeypatch, tmp_path, capsys
):
    rows = doctor_rows(tmp_path)
    run_doctor(monkeypatch, rows)
    shown = capsys.readouterr()
    assert (
        shown.out == rendered(capsys, rows)
        and "FAIL python3" in shown.out
        and "→ install python3" in shown.out
    )
    assert (
        "progress" in shown.err and "python3" not in shown.err
    )  # logs on stderr, the report on stdout
    assert_layout(shown.out)

    rows = proxy_rows(tmp_path)
    run_proxy_check(monkeypatch, tmp_path, rows)
    shown = capsys.readouterr()
    assert shown.out == rendered(capsys, rows) and shown.out.startswith("proxy layers\n")
    assert (
        "  skip shell " in shown.out
        and "  FAIL daemon " in shown.out
        and "→ apexkit proxy.setup" in shown.out
    )
    assert shown.err == ""
    assert_layout(shown.out)

    run_emulation(tmp_path)
    shown = capsys.readouterr()
    assert shown.out == rendered(capsys, emulation_rows(tmp_path)) and "FAIL aarch64" in shown.out
    assert shown.err == ""
    assert_layout(shown.out)


def test_the_json_of_each_command_has_the_common_fields_and_its_old_keys(
    monkeypatch, tmp_path, capsys
):
    run_doctor(monkeypatch, doctor_rows(tmp_path), as_json=True)
    for row in json.loads(capsys.readouterr().out):
        assert set(COMMON) <= set(row) and row["found"] == row["detail"]
    run_proxy_check(monkeypatch, tmp_path, proxy_rows(tmp_path), as_json=True)
    out = capsys.readouterr().out
    for row in json.loads(out):
        assert set(COMMON) <= set(row) and row["layer"] == row["name"] and row["hint"] == row["fix"]
        assert {"configured", "effective", "probe"} <= set(row) and row["probe"] == row["data"][
            "probe"
        ]
    run_emulation(tmp_path, as_json=True)
    rows = json.loads(capsys.readouterr().out)
    assert [r["arch"] for r in rows] == list(dockerclient.ARCHES)
    for row in rows:
        assert set(COMMON) <= set(row) and row["status"] == ("ok" if row["usable"] else "fail")
        assert {"host", "native", "hint"} <= set(row)
    assert SECRET not in out


def test_secrets_are_masked_in_the_table_and_the_json(capsys):
    rows = [
        checks.Row(
            "proxy",
            "https_proxy",
            checks.WARN,
            f"http://alice:{SECRET}@proxy:3128\nsecond line",
            f"try http://bob:{SECRET}@other:8080",
            {"url": f"http://alice:{SECRET}@proxy:3128"},
        )
    ]
    text = rendered(capsys, rows)
    assert SECRET not in text and "http://alice:***@proxy:3128" in text
    assert text.splitlines()[2] == " " * 32 + "second line"
    assert SECRET not in json.dumps(checks.to_json(rows))


def test_exit_code_is_1_when_a_row_fails_else_0(monkeypatch, tmp_path, capsys):
    warn = checks.Row("a", "b", checks.WARN, "found")
    assert checks.exit_code([warn, checks.Row("a", "c", checks.SKIP, "")]) == 0
    assert checks.exit_code([warn, checks.Row("a", "c", checks.FAIL, "")]) == 1
    rows = doctor_rows(tmp_path)
    passing = [row for row in rows if row.status != checks.FAIL]
    assert run_doctor(monkeypatch, rows) == 1 and run_doctor(monkeypatch, passing) == 0
    rows = proxy_rows(tmp_path)
    assert (
        run_proxy_check(monkeypatch, tmp_path, rows) == 1
        and run_proxy_check(monkeypatch, tmp_path, rows[:1]) == 0
    )
    assert (
        run_emulation(
            tmp_path, arch="aarch64" if dockerclient.host_arch() != "aarch64" else "x86_64"
        )
        == 1
    )
    assert run_emulation(tmp_path, arch=dockerclient.host_arch()) == 0
    with pytest.raises(ValueError, match="not one of ok, warn, fail, skip"):
        checks.Row("a", "b", "FAIL", "found")
