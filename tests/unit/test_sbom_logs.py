"""The SBOM library's DEBUG chatter stays out of a build's output: nox's root handler takes DEBUG, and cyclonedx's
serialiser logged ~800 lines of class registrations per build there."""

from __future__ import annotations

import logging

from apexkit.wheel import sbom


def test_the_sbom_library_logs_nothing_below_a_warning(caplog):
    caplog.set_level(logging.DEBUG)  # as under nox: the root logger takes everything
    logging.getLogger().setLevel(logging.DEBUG)
    sbom.warm_up()  # registers every class and dumps an empty BOM
    noisy = [
        r
        for r in caplog.records
        if r.name.split(".")[0] in ("py_serializable", "serializable", "cyclonedx")
    ]
    assert noisy == []
