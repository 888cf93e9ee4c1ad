"""The venv's own distributions (not those of a --system-site-packages base): prints one JSON line,
{name: {version, tags}} with the platform tags of each one's installed WHEEL file.

Read by apexkit.wheel.venvs (_from_uv: what uv installed, to be matched with the wheel files uv resolves); run by the
venv's own Python (3.8+: importlib.metadata).
"""

import contextlib
import json
import os
import sys
from importlib import metadata

prefix = os.path.realpath(sys.prefix) + os.sep
out = {}
for dist in metadata.distributions():
    name = dist.metadata["Name"]
    path = os.path.realpath(str(dist.locate_file(""))) + os.sep
    if not name or not path.startswith(prefix):
        continue
    tags = []
    with contextlib.suppress(OSError):
        tags = [
            line.split(":", 1)[1].strip()
            for line in (dist.read_text("WHEEL") or "").splitlines()
            if line.startswith("Tag:")
        ]
    out[name] = {"version": dist.version, "tags": tags}
print(json.dumps(out))
