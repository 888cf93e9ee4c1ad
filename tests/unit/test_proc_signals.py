"""proc.stops_like_ctrl_c: SIGTERM and SIGHUP stop `up` and `install` as Ctrl-C does (their cleanup runs: children
stopped, a half-written venv taken back, the report written), and the previous handlers come back afterwards."""

from __future__ import annotations

import os
import signal
import threading

import pytest

from apexkit import proc


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
def test_a_stop_signal_is_a_keyboard_interrupt_and_the_old_handler_comes_back(signum):
    def mine(number, frame):
        raise AssertionError("the old handler ran inside the block")

    previous = signal.signal(signum, mine)
    try:
        with pytest.raises(KeyboardInterrupt), proc.stops_like_ctrl_c():
            os.kill(os.getpid(), signum)
        assert signal.getsignal(signum) is mine
    finally:
        signal.signal(signum, previous)


def test_outside_the_main_thread_signals_stay_as_they_are():
    seen = []

    def worker():
        with proc.stops_like_ctrl_c():
            seen.append(signal.getsignal(signal.SIGTERM))

    before = signal.getsignal(signal.SIGTERM)
    thread = threading.Thread(target=worker)
    thread.start()
    thread.join()
    assert seen == [before] and signal.getsignal(signal.SIGTERM) is before


def test_a_signal_the_process_ignores_stays_ignored_as_under_nohup():
    """Review: `nohup apexkit install` must outlive the session (SIGHUP ignored), as before the shared helper."""
    previous = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        with proc.stops_like_ctrl_c():
            assert signal.getsignal(signal.SIGHUP) == signal.SIG_IGN
            os.kill(os.getpid(), signal.SIGHUP)  # ignored: no KeyboardInterrupt
            assert signal.getsignal(signal.SIGTERM) != signal.SIG_DFL  # SIGTERM still stops it
        assert signal.getsignal(signal.SIGHUP) == signal.SIG_IGN
    finally:
        signal.signal(signal.SIGHUP, previous)
