"""apexkit.log's sanitise, in-process: every control character but tab is escaped. The escapes in what real
commands print are in tests/e2e/test_sanitise.py."""

from __future__ import annotations

from apexkit import log


def test_sanitise_escapes_every_control_character_but_tab():
    assert log.sanitise("a\tb") == "a\tb"
    assert log.sanitise("\x1b[2J") == "\\x1b[2J"
    assert (
        log.sanitise("\x00\x07\x08\n\r\x7f\x80\x9f") == "\\x00\\x07\\x08\\x0a\\x0d\\x7f\\x80\\x9f"
    )
    assert log.sanitise("one\ntwo\x1b", keep_newlines=True) == "one\ntwo\\x1b"
    assert log.sanitise("ümlaut → ok ✓") == "ümlaut → ok ✓"  # printable non-ASCII untouched
