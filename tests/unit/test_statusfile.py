"""$APEXKIT_STATUS_FILE: written by a command, read back by its parent as untrusted input (apexkit.statusfile), and
the matrix runner's reading of the dist/<target>/ a child build recorded there (fleet.matrixrun.read_target)."""

from __future__ import annotations

import json
import os

import pytest

from apexkit import exits, statusfile, untrusted
from apexkit.fleet import matrixrun


def test_a_command_records_its_exit_code_error_and_target_dir(tmp_path):
    path = tmp_path / "status.json"
    target = tmp_path / "dist" / "py3.11-torch2.13.0-x86_64-master"
    target.mkdir(parents=True)
    env = {statusfile.VARIABLE: str(path)}
    statusfile.write(0, None, target, environ=env)
    assert statusfile.read(path) == statusfile.Status(0, None, str(target))
    statusfile.write(
        7, "compile failed for https://u:Secr3t@m.corp/x -- next: see the log", environ=env
    )
    status = statusfile.read(path)
    assert status.exit_code == 7 and status.target_dir is None and "Secr3t" not in status.error
    assert oct(path.stat().st_mode & 0o777) == "0o644"


def test_the_edge_records_a_built_directory_and_nothing_else(tmp_path, monkeypatch):
    path = tmp_path / "status.json"
    monkeypatch.setenv(statusfile.VARIABLE, str(path))
    assert exits.exit_code(lambda: tmp_path) == 0
    assert json.loads(path.read_text()) == {
        "exit_code": 0,
        "error": None,
        "target_dir": str(tmp_path),
    }
    assert exits.exit_code(lambda: None) == 0
    assert json.loads(path.read_text()) == {"exit_code": 0, "error": None}
    assert (
        exits.exit_code(lambda: tmp_path / "never-made") == 0
    )  # a dry run's planned directory is not recorded
    assert json.loads(path.read_text()) == {"exit_code": 0, "error": None}


def test_no_status_is_none_and_a_bad_one_is_refused(tmp_path):
    path = tmp_path / "status.json"
    assert statusfile.read(path) is None
    assert statusfile.read(tmp_path / "no-such-dir" / "status.json") is None
    (tmp_path / "elsewhere.json").write_text('{"exit_code": 0}')
    path.symlink_to(tmp_path / "elsewhere.json")
    with pytest.raises(untrusted.Untrusted, match="symbolic link"):
        statusfile.read(path)
    path.unlink()
    for text, says in [
        ("[1]", "not a JSON object"),
        ('{"exit_code": "0"}', "no integer exit_code"),
        ('{"exit_code": true}', "no integer exit_code"),
        ("{", "not JSON"),
        ('{"exit_code": 0, "target_dir": ["/etc"]}', "target_dir is not a string"),
        ('{"exit_code": 1, "error": {"a": 1}}', "error is not a string"),
        ('{"exit_code": 0, "target_dir": "/tmp\\u0000x/py3.11-torch2.13.0-x86_64-master"}', "NUL"),
        (" " * (statusfile.MAX_BYTES + 1), "larger than"),
    ]:
        path.write_text(text)
        with pytest.raises(untrusted.Untrusted, match=says):
            statusfile.read(path)
    os.mkfifo(tmp_path / "fifo.json")
    with pytest.raises(untrusted.Untrusted, match="not a regular file"):
        statusfile.read(tmp_path / "fifo.json")


def test_an_error_with_terminal_escapes_is_read_back_escaped(tmp_path):
    path = tmp_path / "status.json"
    path.write_text(json.dumps({"exit_code": 7, "error": "boom \x1b]0;owned\x07 -- next: x"}))
    assert "\x1b" not in statusfile.read(path).error


def test_the_matrix_runner_takes_only_a_target_directly_in_dist(tmp_path):
    dist = tmp_path / "dist"
    good = dist / "py3.11-torch2.13.0-x86_64-master+skip-rpath-link-flag"
    good.mkdir(parents=True)
    recorded = {
        "wheel": {"file": "apex-0.1+ascend-cp311-cp311-linux_x86_64.whl", "sha256": "0" * 64}
    }
    (good / "manifest.json").write_text(json.dumps(recorded))
    assert matrixrun.read_target(dist, str(good)) == (good, recorded)
    (tmp_path / "loop").symlink_to(
        tmp_path / "loop"
    )  # resolve() raises RuntimeError (3.8-3.12) or OSError
    outside = tmp_path / "py3.11-torch2.13.0-x86_64-master"
    outside.mkdir()
    (outside / "manifest.json").write_text("{}")
    for reported, says in [
        (None, "no dist/<target>/"),
        (str(outside), "not a target directly in"),
        (str(dist / ".." / outside.name), "not a target directly in"),
        (str(dist / "not a target"), "not a target directly in"),
        ("/tmp\0x/py3.11-torch2.13.0-x86_64-master", "not a target directly in"),
        (str(tmp_path / "loop" / "py3.11-torch2.13.0-x86_64-master"), "not a target directly in"),
    ]:
        with pytest.raises(untrusted.Untrusted, match=says):
            matrixrun.read_target(dist, reported)
    linked = dist / "py3.11-torch2.12.0-x86_64-master"
    linked.symlink_to(outside)
    with pytest.raises(untrusted.Untrusted, match="not a directory"):
        matrixrun.read_target(dist, str(linked))


def test_a_status_left_by_an_earlier_command_is_gone_when_this_one_dies_without_one(
    tmp_path, monkeypatch
):
    """CI reads $APEXKIT_STATUS_FILE after the command: a command that ends without recording (Ctrl-C inside a nox
    session, a bug's traceback, SIGKILL) must not leave the previous command's {"exit_code": 0, "target_dir": …}
    there to be taken for its own."""
    path = tmp_path / "status.json"
    monkeypatch.setenv(statusfile.VARIABLE, str(path))
    old = tmp_path / "dist" / "py3.11-torch2.13.0-x86_64-master"
    old.mkdir(parents=True)

    class Session:
        def error(self, message):
            raise SystemExit(1)

    def interrupted():
        raise KeyboardInterrupt

    def crashed():
        raise RuntimeError("a bug")

    monkeypatch.setenv(exits.TRACEBACK, "1")  # a bug's traceback let through, as for a bug report
    for run, func, raised in [
        (lambda f: exits.run_in_session(Session(), f), interrupted, KeyboardInterrupt),
        (lambda f: exits.run_in_session(Session(), f), crashed, RuntimeError),
        (exits.exit_code, crashed, RuntimeError),
        (exits.run_task, crashed, RuntimeError),
    ]:
        statusfile.write(0, None, old)  # the earlier, successful command
        with pytest.raises(raised):
            run(func)
        assert statusfile.read(path) is None, run


def test_an_unexpected_exception_is_one_line_exit_70_and_recorded(tmp_path, monkeypatch, capsys):
    """Without APEXKIT_TRACEBACK, an exception apexkit did not turn into its own error (an OSError from a path the
    user named, a ValueError nothing checked, a RecursionError) is one error line and exit 70 at every edge."""
    from invoke import Exit

    path = tmp_path / "status.json"
    monkeypatch.setenv(statusfile.VARIABLE, str(path))
    monkeypatch.delenv(exits.TRACEBACK, raising=False)

    class Session:
        def error(self, message):
            raise SystemExit(message)

    def unreadable():
        return open(tmp_path / "no-such-file")

    def deep():
        raise RecursionError("maximum recursion depth exceeded")

    assert exits.exit_code(unreadable) == exits.UNEXPECTED
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "FileNotFoundError: No such file or directory" in err
    assert "no-such-file" in err and "Traceback" not in err and "APEXKIT_TRACEBACK=1" in err
    assert statusfile.read(path).exit_code == exits.UNEXPECTED
    with pytest.raises(Exit) as task:
        exits.run_task(deep)
    assert task.value.code == exits.UNEXPECTED and "RecursionError" in str(task.value.message)
    with pytest.raises(SystemExit) as session:
        exits.run_in_session(Session(), lambda: int("abc"))
    assert "ValueError: invalid literal" in str(session.value.code)
    assert statusfile.read(path).exit_code == exits.UNEXPECTED


def test_a_usage_error_of_the_apexkit_command_is_recorded_too(tmp_path, monkeypatch, capsys):
    from apexkit import cli

    path = tmp_path / "status.json"
    monkeypatch.setenv(statusfile.VARIABLE, str(path))
    for argv in ([], ["build"], ["build", "--torch"], ["no-such-command"]):
        statusfile.write(0)  # an earlier command's
        assert cli.main(argv) == 2
        assert statusfile.read(path) == statusfile.Status(2, "invalid arguments"), argv


def test_invoke_build_records_the_target_it_wrote_like_the_other_doors(tmp_path, monkeypatch):
    """`invoke build`, `apexkit build` and `nox -s build-3.X` are the same build: each status file names the
    dist/<target>/ written (docs/commands.md: "each records $APEXKIT_STATUS_FILE the same way")."""
    from apexkit import commands

    path = tmp_path / "status.json"
    target = tmp_path / "dist" / "py3.11-torch2.13.0-x86_64-master"
    target.mkdir(parents=True)
    monkeypatch.setenv(statusfile.VARIABLE, str(path))
    monkeypatch.setattr(commands, "build_wheel", lambda python, argv, prog, given=None: target)
    exits.run_task(lambda: commands.build(commands.Build(python="3.11")))
    assert statusfile.read(path) == statusfile.Status(0, None, str(target))
    assert exits.exit_code(lambda: commands.build(commands.Build(python="3.11"))) == 0
    assert statusfile.read(path) == statusfile.Status(0, None, str(target))
