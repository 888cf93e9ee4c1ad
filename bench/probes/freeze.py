"""Everything in a venv, whichever installer filled it: prints one JSON line, {lowercased name: version}.

Read by apexkit.wheel.venvs.freeze (the manifest's package list); run by the venv's own Python (3.8+).
"""

import json
from importlib import metadata

print(json.dumps({(d.metadata["Name"] or "").lower(): d.version for d in metadata.distributions()}))
