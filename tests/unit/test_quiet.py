"""`apexkit -q` / APEXKIT_QUIET=1: progress hidden; warnings, errors, a failed step, what explains a failure and each
command's result still shown."""

from __future__ import annotations

import os

import pytest

from apexkit import cli, log


@pytest.fixture
def quiet(monkeypatch):
    monkeypatch.setattr(log, "QUIET", True)
    monkeypatch.setenv(log.QUIET_ENV, "1")


def test_quiet_hides_progress_and_keeps_what_the_user_must_see(quiet, capsys):
    with log.step("fetch sources"):
        log.info("  a progress line")
    log.echo_command(["git", "fetch", "https://user:secret@mirror.invalid/apex"])
    log.warn("a warning")
    log.notice("  last lines of the build log:")
    log.foreign("error: foo.cpp:1: boom")
    log.result("✓ dist/t/apex-0.1.whl")
    with pytest.raises(RuntimeError), log.step("compile"):
        raise RuntimeError("x")
    err = capsys.readouterr().err
    assert "fetch sources" not in err and "a progress line" not in err and "git fetch" not in err
    for shown in ("a warning", "last lines of the build log", "boom", "apex-0.1.whl", "✕ compile"):
        assert shown in err, shown


def test_without_quiet_the_progress_is_shown(monkeypatch, capsys):
    monkeypatch.setattr(log, "QUIET", False)
    with log.step("fetch sources"):
        log.info("  a progress line")
    err = capsys.readouterr().err
    assert "▸ fetch sources" in err and "✓ fetch sources" in err and "a progress line" in err


@pytest.mark.parametrize(
    ("value", "quiet"),
    [
        ("1", True),
        ("TRUE", True),
        (" yes ", True),
        ("on", True),
        ("0", False),
        ("", False),
        ("qiuet", False),
    ],
)
def test_the_variable_turns_quiet_on_only_for_a_yes(value, quiet):
    assert log._quiet_from({log.QUIET_ENV: value}) is quiet


def test_set_quiet_reaches_the_processes_apexkit_starts(monkeypatch):
    monkeypatch.setattr(log, "QUIET", False)
    monkeypatch.delenv(log.QUIET_ENV, raising=False)
    log.set_quiet(True)
    assert log.QUIET and log._quiet_from(os.environ)  # what a child process reads at import
    log.set_quiet(False)
    assert not log.QUIET and os.environ[log.QUIET_ENV] == "0"


def test_apexkit_dash_q_before_the_command(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("APEXKIT_STATUS_FILE", str(tmp_path / "status.json"))
    monkeypatch.setattr(log, "QUIET", False)
    monkeypatch.delenv(log.QUIET_ENV, raising=False)
    assert cli.main(["--help"]) == 0
    assert "-q, --quiet" in capsys.readouterr().out
    loud = cli.main(["nosuchcommand"])
    loud_err = capsys.readouterr().err
    quiet = cli.main(["-q", "nosuchcommand"])
    assert log.QUIET and os.environ[log.QUIET_ENV] == "1"
    assert loud == quiet != 0  # an error is an error under -q too
    assert "nosuchcommand" in loud_err and "nosuchcommand" in capsys.readouterr().err


def test_a_group_and_its_command_may_be_two_words(monkeypatch, tmp_path, capsys):
    """`apexkit cache list` is `apexkit cache.list` (the vocabulary of proxy.setup, fleet.submit stays the name)."""
    monkeypatch.setenv("APEXKIT_STATUS_FILE", str(tmp_path / "status.json"))
    with pytest.raises(SystemExit) as spaced_exit:  # argparse's --help
        cli.main(["cache", "list", "--help"])
    spaced = capsys.readouterr().out
    with pytest.raises(SystemExit) as dotted_exit:
        cli.main(["cache.list", "--help"])
    assert spaced_exit.value.code == dotted_exit.value.code == 0
    assert spaced == capsys.readouterr().out and "cache.list" in spaced
    assert cli.main(["cache", "nosuch"]) != 0  # not a command: the one-line refusal, not a join
