"""Who is this interpreter? Prints one JSON line: version ("3.11"), full version, implementation, machine, prefix,
base_prefix, executable, purelib, platlib.

Read by apexkit.wheel.interpreters.probe, which runs every python3.X candidate it finds (PATH, pyenv, /opt/python,
conda), pyenv's failing shims and the oldest Pythons included: so this file stays plain Python 3 (no f-strings, no
annotations), and a candidate that cannot run it is reported with its first line of output.
"""

import json
import platform
import sys
import sysconfig

print(
    json.dumps(
        {
            "version": "%d.%d" % sys.version_info[:2],
            "full": platform.python_version(),
            "implementation": sys.implementation.name,
            "machine": platform.machine(),
            "prefix": sys.prefix,
            "base_prefix": getattr(sys, "base_prefix", sys.prefix),
            "executable": sys.executable,
            "purelib": sysconfig.get_paths()["purelib"],
            "platlib": sysconfig.get_paths()["platlib"],
        }
    )
)
