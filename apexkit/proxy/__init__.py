"""The corporate proxy in three layers (shell, Docker daemon, containers) plus pip/registry mirrors and a CA:
layers.py plans, writes and undoes; check.py verifies each layer; cli.py is `invoke proxy.*`."""
