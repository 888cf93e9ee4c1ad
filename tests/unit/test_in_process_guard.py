"""tests/unit/conftest.py keeps the fast tier in-process: every way a test could start a process or reach the network
is refused, not only subprocess.Popen and socket.connect."""

from __future__ import annotations

import multiprocessing
import socket

import pytest


def _refused(attempts: list, call) -> None:
    with pytest.raises(AssertionError, match="tests/unit runs in-process"):
        call()
    assert attempts, "refused without being recorded"
    attempts.clear()  # this test asked for it: the tier guard must not fail it at teardown


def test_name_lookups_datagrams_and_spawned_processes_are_refused(request):
    attempts = request.getfixturevalue("_in_process")
    _refused(attempts, lambda: socket.getaddrinfo("pypi.org", 443))
    _refused(attempts, lambda: socket.gethostbyname("pypi.org"))
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        _refused(attempts, lambda: udp.sendto(b"x", ("127.0.0.1", 9)))
    finally:
        udp.close()
    spawn = multiprocessing.get_context("spawn")
    _refused(attempts, lambda: spawn.Process(target=print).start())
