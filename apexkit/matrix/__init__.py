"""The build matrix (model.py reads matrix.toml), running it (run.py: local, images, Slurm), refreshing it from
the package index (refresh.py) and publishing dist/ as a PEP 503 index (publish.py)."""
