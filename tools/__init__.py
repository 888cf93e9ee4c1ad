"""The maintainers' tools, not shipped in the apexkit package nor listed in `apexkit --help` (as cibuildwheel keeps
its bin/): the hashed locks (pins.py, `nox -s lock`), which system tools the tests need (testtools.py, `nox -s
tests`), the build timing (buildbench.py, `nox -s build-bench`), the API contracts of bench/ (contracts.py, `nox -s
contracts`) and the torch_npu table's refresh (refresh.py, `nox -s refresh`) with the index reader both use
(wheelindex.py). They may import apexkit; apexkit never imports them (tests/unit/test_front_door.py)."""


def run_main(main) -> None:
    """`python -m tools.X ARGS` in a checkout: X's main(ARGS) with apexkit's one-line errors and exit codes (its nox
    session maps every failure to 1); messages name apexkit as a checkout runs it, `python -m apexkit`."""
    import sys

    from apexkit import exits, vocab

    vocab.set_entry(vocab.APEXKIT, "python -m apexkit")
    sys.exit(exits.exit_code(lambda: main(sys.argv[1:])))
