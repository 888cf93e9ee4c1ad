"""The package-index side: publishing dist/ as a PEP 503 index (publish.py), a published index as its readers see
it (published.py: fleet.submit), the client for any package index (client.py: pip config, HTTP, PEP 503/691 pages,
METADATA by range requests) and refreshing matrix.toml's torch_npu table from one (refresh.py)."""
