"""The package-index side: publishing dist/ as a PEP 503 index (publish.py), a published index as its readers see
it (published.py: fleet.submit), the team indexes as a build cache (remote.py) and the client for any package index
(client.py: pip config, proxies, CA bundle, logins). Refreshing matrix.toml's torch_npu table from an index is a
maintainers' tool: tools/refresh.py (nox -s refresh)."""
