"""What this machine has (machine.py), what a failed log means, and whether a training stack needs Apex for
Ascend at all (apexneed.py); cli.py is `invoke doctor`."""
