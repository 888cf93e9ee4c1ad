"""What to build, decided before anything is touched: the matrix model read from matrix.toml (matrix.py) and the
identity of one target (target.py: target ids, version labels, Requires-Dist pins). Pure: no files written, no
processes started."""
