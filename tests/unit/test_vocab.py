"""One word per idea across the commands (apexkit/vocab.py), and the old spellings: still working, one line each."""

from __future__ import annotations

import sys

import pytest

from apexkit import venvrun, vocab
from apexkit.errors import ConfigError
from apexkit.fleet import matrixrun
from apexkit.wheel import options

DEPRECATED = "is deprecated: use"


def test_build_interpreter_and_its_old_spelling(capsys):
    new = options.resolve("3.11", ["--interpreter", sys.executable, "--dry-run"])
    assert new.python_path == sys.executable and DEPRECATED not in capsys.readouterr().err
    old = options.resolve("3.11", ["--python", sys.executable, "--dry-run"])
    assert old.python_path == sys.executable
    err = capsys.readouterr().err
    assert err.count(DEPRECATED) == 1 and "--python is deprecated: use --interpreter" in err
    assert f"apexkit {vocab.REMOVED_IN}" in err


def test_build_ca_cert_and_its_old_spelling(capsys):
    assert options.parser().parse_args(["--ca-cert", "none"]).ca_bundle == "none"
    assert options.parser().parse_args(["--ca-bundle", "none"]).ca_bundle == "none"
    assert "--ca-bundle is deprecated: use --ca-cert" in capsys.readouterr().err


def test_matrix_target_and_parallel_with_the_old_spellings(capsys):
    p = matrixrun.parser()
    new = p.parse_args(
        ["--target", "a", "--target", "b", "--parallel", "3", "--slurm-interpreter", "/x/python"]
    )
    assert (new.only, new.jobs, new.slurm_python) == (["a", "b"], 3, "/x/python")
    assert DEPRECATED not in capsys.readouterr().err
    old = p.parse_args(
        ["--only", "a", "--target", "b", "--jobs", "3", "--slurm-python", "/x/python"]
    )
    assert (old.only, old.jobs, old.slurm_python) == (["a", "b"], 3, "/x/python")
    assert capsys.readouterr().err.count(DEPRECATED) == 3
    assert p.parse_args([]).only == []  # the default list is not shared between parses


def test_validate_interpreter_and_its_old_spelling(capsys):
    args, rest = venvrun.parse(
        ["--interpreter", "/x/python", "--device", "cpu"], "apexkit validate"
    )
    assert args.in_env == "/x/python" and rest == ["--device", "cpu"]
    args, _ = venvrun.parse(["--in-env", "/y/python"], "apexkit validate")
    assert (
        args.in_env == "/y/python"
        and "--in-env is deprecated: use --interpreter" in capsys.readouterr().err
    )


def test_pick_for_keyword_commands(capsys):
    assert vocab.pick("shell", None, "--only LIST", "--layers LIST") == "shell"
    assert vocab.pick(None, "pip", "--only LIST", "--layers LIST") == "pip"
    assert "--only LIST is deprecated: use --layers LIST" in capsys.readouterr().err
    with pytest.raises(ConfigError, match="both given"):
        vocab.pick("shell", "pip", "--only LIST", "--layers LIST")


def test_old_and_new_spelling_with_different_values_is_one_error_either_order(capsys):
    for argv in (
        ["--python", "/a/python", "--interpreter", "/b/python"],
        ["--interpreter", "/b/python", "--python", "/a/python"],
    ):
        with pytest.raises((ConfigError, SystemExit)):
            options.resolve("3.11", [*argv, "--dry-run"])
    same = options.resolve(
        "3.11", ["--python", sys.executable, "--interpreter", sys.executable, "--dry-run"]
    )
    assert same.python_path == sys.executable
    capsys.readouterr()
    p = matrixrun.parser()
    args = p.parse_args(["--only", "a", "--only", "b"])
    assert (
        args.only == ["a", "b"] and capsys.readouterr().err.count(DEPRECATED) == 1
    )  # one line per option
