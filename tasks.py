"""apexkit invoke tasks: `invoke --list` lists them, `invoke --help <task>` explains one. Each is declared once in
apexkit/commands.py (docs/commands.md has every task's options); `apexkit <task>` runs the same declarations."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from apexkit import commands  # each command's options, help and function are declared there, once

ns = commands.namespace()
