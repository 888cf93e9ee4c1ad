"""Issue 27: `apexkit` is the whole CLI -- a help generated from the declarations, --version, every command's --help
without a wheel, and messages that name the door the user came in by (apexkit / invoke / nox)."""

from __future__ import annotations

import argparse
import json
import platform
import sys

import pytest
from conftest import ROOT

import apexkit
from apexkit import cli, commands, exits, statusfile, venvrun, vocab
from apexkit.errors import ConfigError


@pytest.fixture(autouse=True)
def _door():
    yield
    vocab.set_entry(vocab.APEXKIT)


def _help_lines(text: str) -> dict[str, str]:
    """command -> its line, from the `commands:` block of the help."""
    block = text.split("commands:\n", 1)[1].split("\n\n", 1)[0]
    return {line.split()[0]: line for line in block.splitlines()}


def test_help_lists_every_declared_command_and_every_session_once(capsys):
    assert cli.main(["--help"]) == 0
    out = capsys.readouterr().out
    listed = _help_lines(out)
    for name in [*commands.NAMES, "matrix", "validate", "bench", "completion"]:
        assert name in listed, name
    assert len(listed) == len(commands.NAMES) + len(cli.OTHERS)
    for line in listed.values():  # one line each, fitting a terminal
        assert len(line) <= 120 and "invoke --list" not in line, line
        assert line.count("(") == line.count(")"), line
    assert "nox -s" not in out.split("start here:")[0]


MAINTAINER_TOOLS = (
    "contracts",
    "refresh",
    "lock",
    "build-bench",
)  # nox sessions of a checkout (tools/)


def test_the_maintainers_tools_are_not_apexkit_commands(capsys):
    """Issue 39: what only apexkit's maintainers run (tools/) neither ships nor shows in `apexkit --help` or its
    completion; typed anyway, it is one line naming its nox session."""
    assert cli.main(["--help"]) == 0
    out = capsys.readouterr().out
    listed = _help_lines(out)
    for name in MAINTAINER_TOOLS:
        assert name not in listed and f"apexkit {name}" not in out, name
        assert name not in commands.NAMES, name
    sub = next(a for a in cli.full_parser()._actions if isinstance(a, argparse._SubParsersAction))
    assert not set(MAINTAINER_TOOLS) & set(sub.choices)
    for name in ("contracts", "lock", "build-bench"):
        assert cli.main([name]) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: unknown command") and f"nox -s {name} in a checkout" in err, (
            err
        )


def test_nothing_under_apexkit_imports_tools_and_tools_hold_the_moved_modules():
    """apexkit never imports tools/ (a checkout's, not shipped); the moved maintainers' modules are gone from it."""
    import ast

    for path in sorted((ROOT / "apexkit").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom) and not node.level
                else []
            )
            assert not [n for n in names if n.split(".")[0] == "tools"], path
    for gone in ("contracts.py", "index/refresh.py"):
        assert not (ROOT / "apexkit" / gone).exists(), gone
    for moved in ("contracts", "refresh", "wheelindex", "pins", "buildbench"):
        assert (ROOT / "tools" / f"{moved}.py").is_file(), moved


def test_bare_apexkit_prints_the_same_help_on_stderr_and_exits_2(capsys):
    assert cli.main([]) == 2
    bare = capsys.readouterr()
    assert bare.out == ""
    cli.main(["--help"])
    assert capsys.readouterr().out == bare.err


def test_version_names_apexkit_and_its_python(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv(statusfile.VARIABLE, str(tmp_path / "status.json"))
    assert cli.main(["--version"]) == 0
    out = capsys.readouterr().out.strip()
    assert out.startswith(f"apexkit {apexkit.__version__} (Python {platform.python_version()}, ")
    assert sys.executable in out
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert f'version = "{apexkit.__version__}"' in pyproject  # one version, two places: they agree
    assert json.loads((tmp_path / "status.json").read_text())["exit_code"] == 0


def test_matrix_help_is_apexkits_own(capsys):
    with pytest.raises(SystemExit) as done:
        cli.main(["matrix", "--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: apexkit matrix") and "nox -s" not in out.split("\n\n")[0]


@pytest.mark.parametrize("script", ["validate", "bench"])
def test_validate_and_bench_help_need_no_wheel(script, capsys, tmp_path, monkeypatch):
    empty = tmp_path / "dist"
    empty.mkdir()
    monkeypatch.setenv("APEXKIT_DIST_DIR", str(empty))
    asked = []  # the script's own options come from running it: that is tests/e2e/test_front_door.py's
    monkeypatch.setattr(venvrun, "script_help", lambda name, prog: asked.append((name, prog)))
    with pytest.raises(SystemExit) as done:
        cli.main([script, "--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: apexkit {script}") and "--interpreter PATH" in out
    assert asked == [(script, f"apexkit {script}")]


def test_each_declared_command_has_a_help(capsys):
    for name in commands.NAMES:
        if name == "build":  # apexkit build <python>: below
            continue
        with pytest.raises(SystemExit) as done:
            cli.main([name, "--help"])
        assert done.value.code == 0, name
        assert capsys.readouterr().out.startswith(f"usage: apexkit {name}"), name
    assert cli.main(["build", "--help"]) == 0
    assert capsys.readouterr().out.startswith("usage: apexkit build <python>")


@pytest.mark.parametrize(
    ("door", "proxy", "matrix", "build"),
    [
        (vocab.APEXKIT, "apexkit proxy.setup --ca-cert F", "apexkit matrix --run", "apexkit build 3.11 --jobs 2"),
        (vocab.INVOKE, "invoke proxy.setup --ca-cert F", "nox -s matrix -- --run", "invoke build --python 3.11 -- --jobs 2"),
        (vocab.NOX, "invoke proxy.setup --ca-cert F", "nox -s matrix -- --run", "nox -s build-3.11 -- --jobs 2"),
    ],
)  # fmt: skip
def test_a_command_is_named_in_the_door_in_use(door, proxy, matrix, build):
    vocab.set_entry(door)
    assert vocab.command("proxy.setup", "--ca-cert F") == proxy
    assert vocab.command("matrix", "--run") == matrix
    assert vocab.build("3.11", "--jobs 2") == build


def _hint() -> None:
    raise ConfigError("no wheel", f"build one: {vocab.build('3.11')}")


def test_each_edge_sets_its_door(tmp_path, monkeypatch):
    status = tmp_path / "status.json"
    monkeypatch.setenv(statusfile.VARIABLE, str(status))

    def error() -> str:
        return json.loads(status.read_text())["error"]

    vocab.set_entry(vocab.NOX)
    monkeypatch.setenv("APEXKIT_DIST_DIR", str(tmp_path))
    assert cli.main(["validate"]) == 2  # `apexkit validate` with an empty dist/
    assert "build one first (apexkit build 3.11)" in error()

    from invoke import Exit

    with pytest.raises(Exit) as caught:
        exits.run_task(_hint)
    assert "build one: invoke build --python 3.11" in str(caught.value.message)

    class Session:
        def error(self, message):
            raise RuntimeError(message)

    with pytest.raises(RuntimeError, match="build one: nox -s build-3.11"):
        exits.run_in_session(Session(), _hint)


def test_an_unknown_command_is_one_line_with_the_nearest(capsys):
    assert cli.main(["prxy.setup"]) == 2
    err = capsys.readouterr().err
    assert err == (
        "error: unknown command 'prxy.setup' -- next: did you mean apexkit proxy.setup? "
        "apexkit --help lists the commands\n"
    )
    assert cli.main(["completion", "zsh"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        'error: apexkit completion knows bash, not zsh -- next: eval "$(apexkit completion bash)"'
    ]


def test_python_m_apexkit_is_told_python_m_apexkit(tmp_path, monkeypatch):
    """A checkout's venv has no `apexkit` script: run as `python -m apexkit`, the next step is typed that way."""
    status = tmp_path / "status.json"
    monkeypatch.setenv(statusfile.VARIABLE, str(status))
    monkeypatch.setenv("APEXKIT_DIST_DIR", str(tmp_path))
    monkeypatch.setattr(sys, "argv", [str(ROOT / "apexkit" / "__main__.py"), "validate"])
    assert cli.main() == 2
    assert (
        "build one first (python -m apexkit build 3.11)" in json.loads(status.read_text())["error"]
    )
    monkeypatch.setattr(sys, "argv", ["/venv/bin/apexkit", "validate"])
    assert cli.main() == 2
    assert "build one first (apexkit build 3.11)" in json.loads(status.read_text())["error"]


def test_bench_and_validate_name_the_newest_of_several_builds(tmp_path, capsys):
    """Issue 41: a bare `nox -s bench` with several builds in dist/ says which it took and how to pick another."""
    import os

    for n, name in enumerate(("py3.8-a", "py3.11-b", "py3.9-c")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "manifest.json").write_text(json.dumps({"target": {"python": "3.x"}}))
        os.utime(tmp_path / name / "manifest.json", (1e9 + n, 1e9 + n))
    assert venvrun.find_target(tmp_path)[0].name == "py3.9-c"
    err = capsys.readouterr().err
    assert (
        f"3 builds in {tmp_path}/: taking the newest, py3.9-c (--target ID for another: py3.11-b, py3.8-a)"
        in (" ".join(err.split()))
    )
    venvrun.find_target(tmp_path, "py3.8-a")  # asked for by name: nothing to say
    assert "taking the newest" not in capsys.readouterr().err


def test_a_failed_or_later_build_of_the_invocation_stops_validate_and_bench(tmp_path):
    from apexkit import noxrun
    from apexkit.errors import BenchError

    noxrun.BUILT.clear()
    assert (
        noxrun._built(["lint", "bench"], "bench") is None
    )  # no build in the invocation: dist/'s newest
    with pytest.raises(
        BenchError, match="build-3.8 has not run before bench in this nox invocation"
    ):
        noxrun._built(["bench", "build-3.8"], "bench")
    noxrun.BUILT["build-3.8"] = "failed"
    with pytest.raises(BenchError) as failed:
        noxrun._built(["build-3.8", "bench"], "bench")
    assert failed.value.format().startswith(
        "build-3.8 failed in this nox invocation: bench takes no other wheel from dist/ -- next: "
    )
    noxrun.BUILT["build-3.11"] = tmp_path
    assert noxrun._built(["build-3.8", "build-3.11", "validate"], "validate") == tmp_path
    noxrun.BUILT.clear()
    # each session keeps its own words of one `-- ARGS`, values and all, in order
    argv = ["--jobs", "2", "--device", "cpu", "--steps", "2", "--offline"]
    assert noxrun._minus(argv, ["--device", "cpu", "--steps", "2"]) == ["--jobs", "2", "--offline"]
