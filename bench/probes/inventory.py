"""Every distribution of the build venv, for the SBOM and the provenance: prints one JSON line (python,
implementation, packages: [{name, version, record_sha256, tags, installer}], sorted by name).

Read by apexkit.wheel.sbom.inventory; run by the build venv's own Python (3.8+: importlib.metadata).
"""

import hashlib
import json
import sys
from importlib import metadata

out = []
for dist in metadata.distributions():
    name = dist.metadata["Name"]
    if not name:
        continue
    files = {
        str(f).replace("\\", "/").rsplit("/", 1)[-1]: f
        for f in (dist.files or [])
        if ".dist-info/" in str(f)
    }

    def read(base):
        f = files.get(base)  # noqa: B023 (called at once, in this iteration)
        try:
            return f.locate().read_bytes() if f is not None else None
        except OSError:
            return None

    record, wheel, installer = read("RECORD"), read("WHEEL"), read("INSTALLER")
    tags = [
        line.split(":", 1)[1].strip()
        for line in (wheel or b"").decode("utf-8", "replace").splitlines()
        if line.startswith("Tag:")
    ]
    out.append(
        {
            "name": name,
            "version": dist.version,
            "record_sha256": hashlib.sha256(record).hexdigest() if record is not None else None,
            "tags": tags,
            "installer": (installer or b"").decode("utf-8", "replace").strip() or None,
        }
    )
out.sort(key=lambda p: p["name"].lower())
print(
    json.dumps(
        {
            "python": sys.version.split()[0],
            "implementation": sys.implementation.name,
            "packages": out,
        }
    )
)
