"""Bad input at the command edge (issue 26, item 12 / review L4, L7): each is one `error:` line with the next step,
exit != 0, no traceback, nothing written -- run as a user would, `python -m apexkit` / `invoke` in a subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT


def run(
    *argv: str, env: dict[str, str] | None = None, cwd: Path = ROOT
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, *argv],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
        env={**os.environ, **(env or {})},
        stdin=subprocess.DEVNULL,
    )


def one_error_line(proc: subprocess.CompletedProcess, *words: str, code: int = 2) -> str:
    text = proc.stdout + proc.stderr
    assert proc.returncode == code, text
    assert "Traceback" not in text, text
    errors = [line for line in text.splitlines() if "error:" in line]
    assert len(errors) == 1, text
    assert " -- next: " in errors[0] or "error: " in errors[0]
    for word in words:
        assert word in errors[0], errors[0]
    return errors[0]


@pytest.mark.parametrize(
    ("variable", "value", "argv"),
    [
        ("APEXKIT_JOBS", "abc", ("-m", "apexkit", "build", "3.11", "--dry-run")),
        ("APEXKIT_JOBS", "0", ("-m", "apexkit", "build", "3.11", "--dry-run")),
        # 0 attempts was `AssertionError: unreachable` in the index client (nox -s refresh reads through it)
        (
            "APEXKIT_FETCH_RETRIES",
            "0",
            ("-m", "tools.refresh", "--index-url", "http://127.0.0.1:9/simple"),
        ),
        (
            "APEXKIT_FETCH_BACKOFF",
            "-1",
            ("-m", "tools.refresh", "--index-url", "http://127.0.0.1:9/simple"),
        ),
        (
            "APEXKIT_BENCH_ARGS",
            "'unbalanced",
            ("-m", "apexkit", "bench", "--dist", "/nonexistent-dist"),
        ),
    ],
)
def test_an_environment_variable_is_checked_where_it_is_read(variable, value, argv, tmp_path):
    proc = run(*argv, env={variable: value, "APEXKIT_CACHE_DIR": str(tmp_path / "cache")})
    one_error_line(proc, f"${variable}")


def test_no_git_on_path_is_one_line_naming_git(repos, tmp_path):
    venv_bin = str(Path(sys.executable).parent)  # python, but no git (nor /usr/bin) on PATH
    proc = run(
        "-m",
        "apexkit",
        "build",
        "3.11",
        "--dist",
        str(tmp_path / "dist"),
        "--build-dir",
        str(tmp_path / "b"),
        env={**repos.env(tmp_path / "cache"), "PATH": venv_bin},
    )
    one_error_line(proc, "git is not installed", code=4)
    assert not (tmp_path / "dist").exists()


def test_a_matrix_file_without_include_tables_builds_nothing_and_says_so(tmp_path):
    whole = tmp_path / "whole.toml"
    whole.write_text((ROOT / "matrix.toml").read_text())
    empty = tmp_path / "empty.toml"
    empty.write_text("")
    proc = run("-m", "apexkit", "matrix", "--matrix", str(whole), "--format", "github")
    assert proc.stdout == ""  # not {"include": []}: a CI that builds nothing must not stay green
    one_error_line(proc, "no [[include]] tables", "whole matrix.toml")
    one_error_line(run("-m", "apexkit", "matrix", "--matrix", str(empty)), "no [[include]] tables")


def test_an_empty_matrix_toml_is_one_line(tmp_path):
    from apexkit.errors import ConfigError
    from apexkit.plan import matrix

    for text in ("", '[pythons]\nsessions = ["3.11"]\ndefault = "3.11"\nsupported = "3.11"\n'):
        path = tmp_path / f"m{len(text)}.toml"
        path.write_text(text)
        with pytest.raises(ConfigError) as err:
            matrix.load(path)
        assert "[pythons]" in err.value.cause and "git checkout" in err.value.hint
    with pytest.raises(ConfigError) as err:
        matrix.load(tmp_path / "missing.toml")
    assert "missing" in err.value.cause and "run from an apexkit checkout" not in err.value.hint


def test_unbalanced_quotes_in_options_are_one_line():
    proc = run(
        "-m", "invoke", "-r", str(ROOT), "build", "--python", "3.11", "--options", "--torch '2.1"
    )
    one_error_line(proc, "--options", "No closing quotation")


def test_positionals_fill_the_places_the_flags_left(tmp_path):
    proc = run("-m", "apexkit", "image.build", "--arch", "x86_64", "ubuntu:22.04", "--dry-run")
    assert proc.returncode == 0 and "ubuntu:22.04" in proc.stderr, (
        proc.stderr
    )  # BASE, not "ARCH and --arch"
    proc = run(
        "-m", "apexkit", "image.build", "x86_64", "ubuntu:22.04", "--arch", "x86_64", "--dry-run"
    )
    assert proc.returncode == 2 and "2 positional argument(s) for 1 place(s)" in proc.stderr, (
        proc.stderr
    )


@pytest.mark.parametrize(
    ("extra", "words"),
    [
        (("x86_64", "ubuntu:22.04", "--uid", "99999999999"), ("--uid", "largest id")),
        (("x86_64", "ubuntu:22.04", "--tag", "UPPER/../x"), ("--tag", "not an image reference")),
        (("x86_64", "ubuntu\n22.04"), ("--base", "not an image reference", "\\n")),
    ],
)
def test_image_build_refuses_values_docker_or_useradd_would_refuse_later(extra, words):
    proc = run("-m", "apexkit", "image.build", *extra, "--dry-run")
    one_error_line(proc, *words)


def test_an_exception_nothing_checked_is_one_line_exit_70(tmp_path):
    """An OSError nothing turned into an apexkit error: one line at the edge, naming the path."""
    proc = run(
        "-c",
        "import sys; from apexkit import exits; sys.exit(exits.exit_code(lambda: open('/proc/self/nope/x')))",
    )
    one_error_line(proc, "FileNotFoundError", "/proc/self/nope/x", "APEXKIT_TRACEBACK=1", code=70)
    proc = run(
        "-c",
        "import sys; from apexkit import exits; sys.exit(exits.exit_code(lambda: open('/proc/self/nope/x')))",
        env={"APEXKIT_TRACEBACK": "1"},
    )
    assert (
        proc.returncode == 1 and "Traceback" in proc.stderr
    )  # asked for: the traceback, for a bug report


def test_proxy_layers_empty_or_given_twice_is_one_line_naming_the_option(fsroot):
    base = (
        "-m",
        "apexkit",
        "proxy.setup",
        "--http",
        "http://127.0.0.1:3128",
        "--root",
        str(fsroot),
        "--dry-run",
    )
    one_error_line(run(*base, "--layers", ""), "--layers ''", "names no layer")  # not "every layer"
    one_error_line(
        run(*base, "--only", "shell"), "unrecognized arguments: --only"
    )  # the 0.1 spelling: gone
    everything = run(*base)
    assert everything.returncode == 0, everything.stderr  # no --layers at all: still every layer
