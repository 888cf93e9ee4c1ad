"""Run a Python command line (`-m MODULE ARGS...`, e.g. `-m invoke -r ROOT proxy.setup ...`) with apexkit.fsedit's
one-file write wrapped: after the N-th file written it says so on stderr and sleeps, so that a test can kill the
process between two writes, as a closed SSH session would (tests/e2e/test_proxy_files.py).

    python tests/e2e/pause_after_write.py N -m invoke -r ROOT proxy.setup --http URL --root DIR

With APEXKIT_TEST_RESUME_FILE=PATH in the environment, it goes on writing once PATH exists (the test changes the
tree in that pause, as a user with inotify on the file just written could), instead of sleeping until killed.

The library has no hook for this: the write is wrapped here, in the process that runs the real command line.
"""

from __future__ import annotations

import os
import runpy
import sys
import time
from pathlib import Path

PAUSE_S = 120  # longer than any test waits: the test kills the process long before


def main(argv: list[str]) -> None:
    if len(argv) < 3 or not argv[0].isdigit() or argv[1] != "-m":
        sys.exit("usage: pause_after_write.py N -m MODULE [ARGS...]")
    wanted, module, args = int(argv[0]), argv[2], argv[3:]
    resume = os.environ.get("APEXKIT_TEST_RESUME_FILE")
    sys.path.insert(
        0, str(Path(__file__).resolve().parents[2])
    )  # the checkout's apexkit, as `invoke -r ROOT` uses
    from apexkit import fsedit

    write = fsedit._write
    written = 0

    def write_then_pause(change: fsedit.Change) -> None:
        nonlocal written
        write(change)
        written += 1
        if written == wanted:
            sys.stderr.write(f"apexkit-test: paused after write {written}\n")
            sys.stderr.flush()
            deadline = time.monotonic() + PAUSE_S
            while time.monotonic() < deadline and not (resume and os.path.exists(resume)):
                time.sleep(0.02 if resume else 1)

    fsedit._write = write_then_pause
    sys.argv = [module, *args]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main(sys.argv[1:])
