"""tests/unit runs in-process: a test here that starts a process or opens a socket fails, naming what it did (such a
test belongs in tests/e2e: docs/testing.md). The fast tier stays fast and needs nothing but Python."""

from __future__ import annotations

import _posixsubprocess
import os
import socket
import subprocess

import pytest


@pytest.fixture(autouse=True)
def _in_process(monkeypatch):
    attempts: list[str] = []

    def refuse(what: str):
        def refused(*args, **kwargs):
            attempts.append(what)
            raise AssertionError(
                f"tests/unit runs in-process, and this test {what}: it belongs in tests/e2e "
                "(docs/testing.md)"
            )

        return refused

    monkeypatch.setattr(subprocess.Popen, "__init__", refuse("starts a process"))
    for name in ("system", "fork", "forkpty", "posix_spawn", "posix_spawnp", "execv", "execve"):
        if hasattr(os, name):
            monkeypatch.setattr(os, name, refuse(f"calls os.{name}"))
    # what Popen and multiprocessing's spawn/forkserver start processes with underneath
    monkeypatch.setattr(_posixsubprocess, "fork_exec", refuse("starts a process"))
    monkeypatch.setattr(socket.socket, "connect", refuse("opens a connection"))
    monkeypatch.setattr(socket.socket, "connect_ex", refuse("opens a connection"))
    monkeypatch.setattr(socket.socket, "bind", refuse("binds a socket"))
    for name in ("sendto", "sendmsg"):  # a datagram needs no connect
        monkeypatch.setattr(socket.socket, name, refuse("sends a datagram"))
    for name in ("getaddrinfo", "gethostbyname", "gethostbyname_ex", "gethostbyaddr"):
        monkeypatch.setattr(socket, name, refuse("looks a name up (DNS)"))
    yield attempts  # a test of this guard reads and clears it
    if attempts:  # also when the code under test caught the refusal and the test passed anyway
        pytest.fail(
            f"tests/unit runs in-process, and this test {attempts[0]}: it belongs in tests/e2e "
            "(docs/testing.md)",
            pytrace=False,
        )
