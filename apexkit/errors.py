"""One error hierarchy: a one-line cause, the next step to take, and a unique exit code.

`main()` wrappers (CLI, nox sessions, invoke tasks) print `format()` and exit with `exit_code`;
a user error never shows a traceback.
"""

from __future__ import annotations

from apexkit.log import sanitise


class ApexkitError(Exception):
    """Base class. `cause` says what failed, `hint` says what to run or change next."""

    exit_code = 1

    def __init__(self, cause: str, hint: str = "") -> None:
        super().__init__(cause)
        # one line, and safe on a terminal: causes quote foreign text (a compiler line, a container's manifest)
        self.cause = sanitise(" ".join(cause.split()))
        self.hint = sanitise(" ".join(hint.split()))

    def format(self) -> str:
        """The one line shown to the user."""
        return f"{self.cause} -- next: {self.hint}" if self.hint else self.cause

    def __str__(self) -> str:
        return self.format()


class ConfigError(ApexkitError):
    """Bad option, unknown Python/torch/ref, invalid combination."""

    exit_code = 2


class InterpreterNotFoundError(ApexkitError):
    """No working python3.X could be found."""

    exit_code = 3


class SourceError(ApexkitError):
    """Fetching or verifying the upstream sources failed."""

    exit_code = 4


class PatchError(ApexkitError):
    """One of our patches no longer applies (upstream drift)."""

    exit_code = 5


class EnvironmentSetupError(ApexkitError):
    """Creating a venv or installing torch / build dependencies failed."""

    exit_code = 6


class BuildError(ApexkitError):
    """setup.py failed; the full log is kept."""

    exit_code = 7


class SmokeTestError(ApexkitError):
    """The wheel built but its compiled modules do not import in a fresh venv."""

    exit_code = 8


class BenchError(ApexkitError):
    """validate found the environment not ready, or the benchmark failed."""

    exit_code = 9


class ImageError(ApexkitError):
    """Docker: daemon unreachable, image missing, image build failed, cross-arch emulation missing."""

    exit_code = 10


class SchedulerError(ApexkitError):
    """Slurm missing, its controller down, or sbatch refused the job (invoke fleet.*)."""

    exit_code = 11
