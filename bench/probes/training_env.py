"""A training environment's Python and its distributions, imported nothing of the training stack: prints one line,
"APEXKIT-PROBE " + JSON (python, executable, prefix, dists: [{name, version, direct_url, path}]).

Read by apexkit.doctor.apexneed.read_environment (`invoke doctor --venv DIR|--interpreter PATH`). That interpreter
may be any Python 3: importlib.metadata where there is one (3.8+), pkg_resources before that; so this file stays
plain Python 3 (no f-strings, no annotations).
"""

import json
import sys

out = {
    "python": "%d.%d.%d" % tuple(sys.version_info[:3]),
    "executable": sys.executable,
    "prefix": sys.prefix,
    "dists": [],
}
try:
    from importlib import metadata
except ImportError:
    metadata = None
if metadata is not None:
    for d in metadata.distributions():
        name = d.metadata["Name"]
        if not name:
            continue
        try:
            direct = d.read_text("direct_url.json")
        except Exception:
            direct = None
        out["dists"].append(
            {
                "name": name,
                "version": d.version,
                "direct_url": direct,
                "path": str(getattr(d, "_path", "") or ""),
            }
        )
else:
    import pkg_resources

    for d in pkg_resources.working_set:
        out["dists"].append(
            {
                "name": d.project_name,
                "version": d.version,
                "direct_url": None,
                "path": d.location or "",
            }
        )
print("APEXKIT-PROBE " + json.dumps(out))
