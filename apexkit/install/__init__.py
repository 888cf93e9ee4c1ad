"""`apexkit install`: the one apexkit wheel that fits a training venv, looked up in the team's indexes (or built),
verified, and installed with the venv's own pip, --no-deps and --no-index -- torch and torch_npu never change.

- target.py: the venv, read by bench/probes/target_env.py run with its interpreter (untrusted: capped, types checked);
- fit.py: whether a wheel file fits it (filename tags, METADATA's name, label and Requires-Dist) -- checked on the
  bytes about to be installed, whatever an index.json claimed;
- run.py: the command (lock on the venv, lookup, fetch or build, install, check, undo on a failed check).
"""
