"""torch_npu's Requires-Dist and the installed torch's version, read from their metadata (torch_npu is not imported:
that needs CANN): prints one JSON line, {requires: [...], torch: "2.5.1"}.

Read by apexkit.wheel.venvs.install_torch_npu, after torch_npu was installed with --no-deps, to check its torch pin
and install its other requirements; run by the venv's own Python (3.8+).
"""

import json
from importlib import metadata

dist = metadata.distribution("torch_npu")
print(json.dumps({"requires": dist.requires or [], "torch": metadata.version("torch")}))
