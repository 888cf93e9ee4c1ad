"""Issue 15/39: one command edge -- each command is one options dataclass (apexkit.declare) and the function that runs
it, referenced directly; tasks.py is a one-liner onto them. The command lines are run in tests/e2e/test_commands.py."""

from __future__ import annotations

import dataclasses
import inspect

import pytest
from conftest import ROOT

from apexkit import commands, declare


@pytest.mark.parametrize("command", commands.COMMANDS, ids=lambda c: c.name)
def test_each_declaration_fits_its_function(command):
    assert command.doc and all(o.help for o in command.opts), command.name
    flags = [o.flag for o in command.opts]
    assert len(flags) == len(set(flags)), f"{command.name}: an option declared twice"
    o = command.options(**{f.dest: "x" for f in command.opts if f.positional})
    run = command.run
    if isinstance(run, declare.Spread):  # a library function that takes the fields as keywords
        inspect.signature(run.func).bind(**declare.values(o), **run.fixed)
    else:  # TypeError: the function does not take what the edge passes
        inspect.signature(run).bind(o, *(("",) if command.rest else ()))
    assert dataclasses.is_dataclass(o) and command.options.__dataclass_params__.frozen


def test_a_bad_number_is_one_line_inside_the_run():
    report = commands.BY_NAME["fleet.report"]
    with pytest.raises(declare.ConfigError, match="'abc' is not a number"):
        declare.make(report, {"results": "r", "threshold": "abc"})
    made = declare.make(report, {"results": "r", "threshold": "0.2"})
    assert (str(made.results), made.threshold, made.as_json) == ("r", 0.2, False)


def test_tasks_py_only_hands_over():
    code = [
        line
        for line in (ROOT / "tasks.py").read_text().split('"""', 2)[2].splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert len(code) <= 6 and code[-1] == "ns = commands.namespace()"


def test_a_setting_resolves_flag_then_environment_then_files_then_default(tmp_path, monkeypatch):
    """An option with a config key resolves in one place (apexkit.config): flag > environment > project file >
    user file > default; one with only a variable: flag > variable > default."""
    from dataclasses import dataclass

    from apexkit.declare import option

    @dataclass(frozen=True)
    class Probe:
        """A probe."""

        index_url: str = option("https://pypi.org/simple/", "an index", config="index_url")
        uv: str | None = option(None, "uv to use", env="APEXKIT_UV")

    command = declare.Command("probe", Probe, print)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "cfg"))
    env = {"XDG_CONFIG_HOME": str(tmp_path / "cfg")}
    assert declare.make(command, {}, env) == Probe()
    (tmp_path / "apexkit.toml").write_text('index_url = "https://project.example/simple/"\n')
    assert declare.make(command, {}, env).index_url == "https://project.example/simple/"
    env = {**env, "PIP_INDEX_URL": "https://env.example/simple/", "APEXKIT_UV": "/x/uv"}
    assert declare.make(command, {}, env) == Probe("https://env.example/simple/", "/x/uv")
    given = {"index_url": "https://flag.example/simple/", "uv": "/y/uv"}
    assert declare.make(command, given, env) == Probe(*given.values())


@pytest.fixture
def offline_env(tmp_path, monkeypatch):
    """No wheelhouse anywhere: no variable, no config file; the cache and dist/ in tmp_path."""
    for name in ("APEXKIT_WHEELHOUSE", "APEXKIT_CONFIG", "APEXKIT_BUILD_IMAGE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "home" / ".config"))
    monkeypatch.setenv("APEXKIT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("APEXKIT_DIST_DIR", str(tmp_path / "dist"))
    monkeypatch.setenv("APEXKIT_BUILD_DIR", str(tmp_path / "build"))
    monkeypatch.chdir(tmp_path)


def test_an_offline_build_with_no_wheelhouse_takes_a_cache_hit(offline_env, tmp_path, monkeypatch):
    """Issue 41: `up --offline` (install's build) failed before the wheel cache was looked at; a hit needs no
    wheelhouse. The build runs offline with no wheelhouse (none made up is recorded)."""
    from apexkit.wheel import builder

    seen = []

    def build(opts, remote=None):
        seen.append(opts)
        return tmp_path / "dist" / "py3.11-target"

    monkeypatch.setattr(builder, "build", build)
    got = commands.build_wheel("3.11", ["--offline", "--torch", "2.13.0"])
    assert got == tmp_path / "dist" / "py3.11-target"
    assert seen[0].offline and seen[0].wheelhouses == ()
