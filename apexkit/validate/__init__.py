"""Running the built wheel: validate/bench in its venv (run.py) and on every node of a Slurm cluster (fleet.py)."""
