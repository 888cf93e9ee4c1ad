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
