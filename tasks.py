"""apexkit invoke tasks. `invoke --list` lists them; `invoke --help <task>` explains one.

build         build a wheel (same options as `nox -s build-<python> --`): invoke build --python 3.11 -- --torch 2.13.0
              inside a builder image: invoke build --image apexkit/builder:debian-bookworm-x86_64 -- <options>
proxy.setup   proxy (+ CA, mirrors) for the shell, the Docker daemon and containers; --dry-run shows the diffs
proxy.check   per layer: configured? effective? a real request through the proxy
proxy.show    what is saved and what each layer's files hold (passwords masked)
proxy.env     export lines for eval "$(invoke proxy.env)"
proxy.remove  undo setup (files restored from backups; your own content untouched)
image.build      builder image from a base (its package manager, non-root user, CA hook); x86_64 or aarch64
image.list       apexkit images (stale ones marked)
image.prune      remove stale/untagged apexkit images (--all: every one)
image.emulation  can this host run x86_64/aarch64 containers (QEMU binfmt)? --enable registers it
publish          dist/ -> PEP 503 simple index (pip install apex --index-url file:///…/index/simple/)
doctor           check this machine (each check: status + fix); --log FILE explains a failed build; --json
fleet.submit     validate (+ benchmark) a published wheel on every node of a Slurm cluster; --dry-run prints the script
fleet.status     the fleet's jobs and where each node is
fleet.report     one row per node (chip, driver, CANN, torch, sha256, verdict, step time vs median); exit 1 on a gap
config.show      every source (git URLs, indexes, mirrors, registries): effective value and origin; --json
up               one node from bare to validated: doctor, install, validate (+ bench); one report; --dry-run
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from apexkit import commands  # each command's options, help and function are declared there, once

ns = commands.namespace()
