"""The proxy and CA variables, named once (apexkit/netenv.py): the reader, and the shell copy in
docker/entrypoint.sh, which must export exactly the same CA variables."""

from __future__ import annotations

import subprocess

from conftest import ROOT

from apexkit import netenv
from apexkit.proxy import layers


def test_the_entrypoint_exports_exactly_the_ca_variables(tmp_path):
    """docker/entrypoint.sh run for real, with its CA bundle path (the one containers get mounted) pointed at a file
    here: every CA variable it exports, and no other, is one of netenv.CA_VARIABLES; one already set is kept."""
    script = (ROOT / "docker" / "entrypoint.sh").read_text()
    assert layers.CONTAINER_CA_PATH in script
    bundle = tmp_path / "ca-bundle.pem"
    bundle.write_text("-----BEGIN CERTIFICATE-----\n")
    copy = tmp_path / "entrypoint.sh"
    copy.write_text(script.replace(layers.CONTAINER_CA_PATH, str(bundle)))
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "PIP_CERT": "/mine.pem"}
    out = subprocess.run(
        ["sh", str(copy), "env", "-0"], capture_output=True, env=env, check=True, timeout=60
    ).stdout
    seen = dict(item.split("=", 1) for item in out.decode().split("\0") if "=" in item)
    exported = {name for name, value in seen.items() if value == str(bundle)}
    assert exported | {"PIP_CERT"} == set(netenv.CA_VARIABLES) and seen["PIP_CERT"] == "/mine.pem"
    # and the same names in the same order, as the shell writes them
    names = next(
        line.split(" in ", 1)[1].split(";")[0].split()
        for line in script.splitlines()
        if line.strip().startswith("for var in ")
    )
    assert tuple(names) == netenv.CA_VARIABLES
