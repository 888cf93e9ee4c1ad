"""Issue 13 item 9: text apexkit did not write reaches the terminal with its control characters escaped.

Every test runs the real code in a child Python whose stderr is a pipe (Rich then writes no styles of its own), so
any ESC, BEL or CR in what it printed came from the foreign text. The log files keep the raw bytes.
"""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from pathlib import Path

from conftest import ROOT

OSC52 = "\x1b]52;c;ZWNobyBwd25lZA==\x07"  # writes "echo pwned" into the terminal's clipboard
CLEAR = "\x1b[2J\x1b[H"
FAKE_OK = "\x1b[32mOK\x1b[0m"
HOSTILE = [
    f"{OSC52}copied",
    f"{CLEAR}screen cleared",
    f"build {FAKE_OK}",
    "x.cpp:1: error: real failure\rall tests passed        ",
    "markup [red]x[/red] [bold]y :thumbs_up: \x9b31m c1 \x7f del\tTAB",
]
RAW = ("\x1b", "\x07", "\r", "\x9b", "\x7f")


def _child(code: str, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        cwd=cwd or ROOT,
        capture_output=True,
        text=True,
        errors="surrogateescape",
        env=_env(),
    )


def _env() -> dict[str, str]:
    import os

    env = dict(os.environ, PYTHONPATH=str(ROOT), TERM="xterm-256color", COLUMNS="300")
    env.pop("FORCE_COLOR", None)
    return env


def _assert_clean(out: str, colours_stripped: bool = False) -> None:
    for ch in RAW:
        assert ch not in out, f"raw {ch!r} reached the terminal:\n{out!r}"
    assert "\\x1b]52;c;ZWNobyBwd25lZA==\\x07copied" in out  # shown, escaped
    assert "\\x1b[2J\\x1b[Hscreen cleared" in out
    # the image build drops the classic builder's SGR colours before it prints or logs a line
    assert ("build OK" if colours_stripped else "build \\x1b[32mOK\\x1b[0m") in out
    # the CR trick: shown escaped, or (a reader with universal newlines) as a line of its own; never a rewrite
    assert re.search(r"real failure(\\x0d|\n\s*)all tests passed", out)
    assert "[red]x[/red] [bold]y :thumbs_up:" in out  # markup and emoji codes stay text
    assert re.search(
        r"\\x9b31m c1 \\x7f del[\t ]+TAB", out
    )  # C1 and DEL escaped, tab kept (Rich expands it)


def _assert_kept(log_path: Path) -> None:
    """The log file has the escape sequences as the program wrote them (a CR may have become a line break: the
    pipe is read with universal newlines)."""
    kept = log_path.read_bytes().decode()
    for line in HOSTILE:
        assert line in kept or line.replace("\r", "\n") in kept, line


def _script(tmp_path: Path) -> Path:
    """A 'setup.py' step that prints the hostile lines (stdout and stderr) and fails."""
    script = tmp_path / "hostile.py"
    script.write_text(
        "import sys\n"
        f"lines = {HOSTILE!r}\n"
        "for i, line in enumerate(lines):\n"
        "    (sys.stdout if i % 2 else sys.stderr).write(line + '\\n'); sys.stdout.flush()\n"
        "sys.exit(1)\n"
    )
    return script


def test_doctor_log_names_a_known_failure_without_replaying_its_escapes(tmp_path):
    raw = (
        "\n".join(
            [
                *HOSTILE[:3],
                f"{FAKE_OK} fatal error: torch/extension.h: No such file or directory {OSC52}",
                *HOSTILE[3:],
            ]
        )
        + "\n"
    )
    build_log = tmp_path / "build.log"
    build_log.write_bytes(raw.encode())
    proc = subprocess.run(
        [sys.executable, "-m", "apexkit", "doctor", "--log", str(build_log)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=_env(),
    )
    assert proc.returncode == 0, proc.stderr
    assert "hardcoded-site-packages" in proc.stderr
    for ch in RAW:
        assert ch not in proc.stderr + proc.stdout
    assert "\\x1b[32mOK\\x1b[0m fatal error: torch/extension.h" in proc.stderr
    assert build_log.read_bytes() == raw.encode()  # the file keeps the raw bytes


def test_doctor_log_tail_of_an_unknown_failure_is_escaped(tmp_path):
    build_log = tmp_path / "build.log"
    build_log.write_bytes(("\n".join(HOSTILE) + "\n").encode())
    proc = subprocess.run(
        [sys.executable, "-m", "apexkit", "doctor", "--log", str(build_log)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=_env(),
    )
    assert proc.returncode == 1, proc.stderr
    assert "no known failure" in proc.stderr
    _assert_clean(proc.stderr + proc.stdout)


def test_run_logged_echo_is_escaped_and_the_log_keeps_the_raw_output(tmp_path):
    log_path = tmp_path / "run.log"
    proc = _child(
        """
        import sys
        from pathlib import Path
        from apexkit.proc import run_logged
        code, tail = run_logged([sys.executable, sys.argv[1]], Path(sys.argv[2]), verbose=True)
        assert code == 1
    """,
        str(_script(tmp_path)),
        str(log_path),
    )
    assert proc.returncode == 0, proc.stderr
    _assert_clean(proc.stderr)
    _assert_kept(log_path)


def test_build_failure_tail_is_escaped_and_the_log_keeps_the_raw_output(tmp_path):
    log_path = tmp_path / "build.log"
    proc = _child(
        """
        import sys
        from pathlib import Path
        from apexkit.wheel.builder import Builder, BuildState
        from apexkit.proc import run_logged
        builder = Builder.__new__(Builder)  # only the failure report: no build plan needed
        builder.state = BuildState(log_path=Path(sys.argv[2]))
        code, tail = run_logged([sys.executable, sys.argv[1]], builder.log_path)
        assert code == 1
        builder._explain_failure(tail)
    """,
        str(_script(tmp_path)),
        str(log_path),
    )
    assert proc.returncode == 0, proc.stderr
    assert "last lines of the build log" in proc.stderr
    _assert_clean(proc.stderr)
    _assert_kept(log_path)


def test_streamed_image_build_output_is_escaped(tmp_path):
    # the daemon's JSON stream as docker-py decodes it (what a hostile Dockerfile's RUN step would print)
    proc = _child(
        """
        import sys
        from apexkit.images import builder as images
        hostile = eval(sys.argv[1])
        stream = [{"stream": "Step 1/2 : RUN evil [red]x[/red]\\x1b]52;c;ZWNobyBwd25lZA==\\x07\\n"}]
        stream += [{"stream": line + "\\n"} for line in hostile]
        with open(sys.argv[2], "w") as fh:
            error, lines = images._follow_build(stream, fh, verbose=True)
        assert not error
    """,
        repr(HOSTILE),
        str(tmp_path / "image.log"),
    )
    assert proc.returncode == 0, proc.stderr
    assert "[1/2] RUN evil [red]x[/red]\\x1b]52;c;" in proc.stderr
    _assert_clean(proc.stderr, colours_stripped=True)


def test_streamed_container_output_is_escaped_on_the_terminal_and_raw_in_the_log(tmp_path):
    """The container's output (an image can print anything) goes to the host's terminal escaped, to its log raw."""
    code = (
        "import sys; from apexkit.images import container as containerbuild; "
        "fh = open(sys.argv[1], 'w'); "
        "containerbuild.stream_output([b'\\x1b]52;c;aGk=\\x07copied\\n\\x1b[32mOK', b'\\x1b[0m\\n'], fh); fh.close()"
    )
    logfile = tmp_path / "container.log"
    proc = subprocess.run(
        [sys.executable, "-c", code, str(logfile)], cwd=ROOT, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    assert "\x1b" not in proc.stderr and "\\x1b]52;c;aGk=\\x07copied" in proc.stderr
    assert "\x1b]52;c;aGk=\x07copied" in logfile.read_text()
