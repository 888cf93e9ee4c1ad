"""The package-index side: a client that reads an index as pip would (client.py), publishing dist/ as a PEP 503 index
(publish.py) and refreshing the torch_npu table of matrix.toml from an index (refresh.py)."""
