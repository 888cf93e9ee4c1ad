"""One word per idea across the commands (apexkit/vocab.py); the 0.1 spellings are gone, refused like any typo."""

from __future__ import annotations

import sys

import pytest

from apexkit import commands, venvrun
from apexkit.fleet import matrixrun
from apexkit.wheel import options


def test_build_takes_interpreter_and_ca_cert():
    assert options.resolve("3.11", ["--interpreter", sys.executable, "--dry-run"]).python_path == (
        sys.executable
    )
    given = ["--ca-cert", "none", "--image", "x", "--dry-run"]
    assert options.resolve("3.11", given).ca_bundle == "none"


@pytest.mark.parametrize("old", [["--python", "/x/python"], ["--ca-bundle", "none"]])
def test_build_refuses_the_old_spellings(old, capsys):
    with pytest.raises(SystemExit) as caught:
        options.resolve("3.11", [*old, "--dry-run"])
    assert caught.value.code == 2 and "unrecognized arguments" in capsys.readouterr().err


def test_matrix_takes_target_parallel_and_slurm_interpreter():
    new, rest = matrixrun.parse(
        ["--target", "a", "--target", "b", "--parallel", "3", "--slurm-interpreter", "/x/python"]
    )
    assert (new.only, new.parallel, new.slurm_python, rest) == (["a", "b"], 3, "/x/python", [])
    first, second = matrixrun.parse([])[0], matrixrun.parse([])[0]
    assert (
        first.only == [] and first.only is not second.only
    )  # the default list is not shared between parses


@pytest.mark.parametrize("old", [["--only", "a"], ["--jobs", "3"], ["--slurm-python", "/x/python"]])
def test_matrix_refuses_the_old_spellings(old, capsys):
    with pytest.raises(SystemExit) as caught:
        matrixrun.parser().parse_args(old)
    assert caught.value.code == 2 and "unrecognized arguments" in capsys.readouterr().err


def test_validate_takes_interpreter_and_passes_an_old_spelling_to_the_script():
    args, rest = venvrun.parse(
        ["--interpreter", "/x/python", "--device", "cpu"], "apexkit validate"
    )
    assert args.in_env == "/x/python" and rest == ["--device", "cpu"]
    args, rest = venvrun.parse(["--in-env", "/y/python"], "apexkit validate")
    assert args.in_env is None and rest == ["--in-env", "/y/python"]  # validate_env.py refuses it


def test_invoke_tasks_have_no_old_keywords():
    flags = {o.name for c in commands.COMMANDS for o in c.opts}
    assert not flags & {"only", "ca_bundle", "python_path", "node_python"}
