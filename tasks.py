"""apexkit invoke tasks. `invoke --list` lists them; `invoke --help <task>` explains one.

build   build a wheel (same options as `nox -s build-<python> --`), e.g. invoke build --python 3.11 -o "--torch 2.13.0"
(proxy.*, image.*, source.* and doctor arrive with their issues.)
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

from invoke import Collection, Exit, task

sys.path.insert(0, str(Path(__file__).resolve().parent))

from apexkit.errors import ApexkitError


@task(help={"python": "target Python, e.g. 3.11 (default: 3.11)",
            "options": 'build options in one string, as for nox -s build-3.X -- (e.g. "--torch 2.13.0 --jobs 2"; '
                       '"--help" lists them)'},
      positional=[])
def build(c, python="3.11", options=""):
    """Build the Apex for Ascend wheel for one Python into dist/."""
    from apexkit import build as apexkit_build

    try:
        apexkit_build.main(python, shlex.split(options), prog=f"invoke build --python {python} --options")
    except ApexkitError as exc:
        raise Exit(f"error: {exc.format()}", code=exc.exit_code) from None


ns = Collection(build)
