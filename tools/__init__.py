"""Development tools, not shipped in the apexkit package: the hashed locks (pins.py, `nox -s lock`), which system
tools the tests need (testtools.py, `nox -s tests`) and the build timing (buildbench.py, `nox -s build-bench`)."""
