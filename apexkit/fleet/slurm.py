"""The one Slurm client: sbatch, squeue, scontrol, sacct and scancel, each with a timeout and one-line errors.
Used by the fleet (fleet.submit/status) and by the matrix run on a cluster (nox -s matrix -- --run --slurm)."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
from collections.abc import Iterable
from pathlib import Path

from apexkit import log, untrusted
from apexkit.errors import ConfigError, SchedulerError

ENDED = (
    "COMPLETED",
    "CANCELLED",
    "FAILED",
    "TIMEOUT",
    "NODE_FAIL",
    "OUT_OF_MEMORY",
    "PREEMPTED",
    "BOOT_FAIL",
    "DEADLINE",
)


CHECK_CMD = "scontrol ping && sinfo"
SILENT = "Slurm did not answer"


def batch_header(options: Iterable[tuple[str, object]], extra: Iterable[str] = ()) -> list[str]:
    """The #SBATCH lines of a batch script (the one writer of them): `--option=value` per pair whose value is set (None,
    "", False and () are left out; True is the bare flag; a list or tuple is joined by commas), then each `extra` as one
    whole option. Every value is one line (a line break would end the directive and start a shell command) and is
    shell-quoted, which sbatch undoes when it reads the directive."""
    lines = []
    for option, value in options:
        if value is True:
            lines.append(f"#SBATCH --{option}")
        elif value not in (None, "", False, (), []):
            items = value if isinstance(value, (list, tuple)) else [value]
            lines.append(f"#SBATCH --{option}=" + ",".join(_word(f"--{option}", i) for i in items))
    return lines + [f"#SBATCH {_word('the extra sbatch option', x)}" for x in extra]


def _word(option: str, value: object) -> str:
    text = str(value)
    if "\n" in text or "\r" in text:
        raise ConfigError(
            f"#SBATCH {option} {untrusted.shown(text)}: not one line (it would end the directive)",
            "pass the value without line breaks",
        )
    return shlex.quote(text)


def run(argv: list[str], timeout: float = 60) -> subprocess.CompletedProcess:
    log.echo_command(argv)
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except FileNotFoundError:
        raise SchedulerError(
            f"{argv[0]} not found on PATH (no Slurm client on this host)",
            f"run from a Slurm login node, or install the client (Debian: apt-get install slurm-client); "
            f"check with: {CHECK_CMD}",
        ) from None
    except subprocess.TimeoutExpired:
        raise SchedulerError(
            f"{argv[0]} did not answer within {timeout:.0f} s (Slurm controller down or unreachable)",
            f"check it: {CHECK_CMD}",
        ) from None


def check_slurm() -> None:
    """sbatch on PATH and the controller answering, in one line each when not."""
    for tool in ("sbatch", "scontrol"):
        if shutil.which(tool) is None:
            raise SchedulerError(
                f"{tool} not found on PATH (no Slurm client on this host)",
                "run from a Slurm login node, or install the client (Debian: apt-get install "
                f"slurm-client); check with: {CHECK_CMD}",
            )
    ping = run(["scontrol", "ping"], timeout=60)
    if ping.returncode != 0 or "DOWN" in ping.stdout:
        said = " ".join(re.sub(r"\*{3,}", " ", ping.stdout + ping.stderr).split())[:200]
        raise SchedulerError(
            f"the Slurm controller does not answer (scontrol ping: {said})",
            f"start slurmctld or ask the cluster's admins; check with: {CHECK_CMD}",
        )


def job_state(job_id: str | None) -> tuple[str, str]:
    """(STATE, where it came from): squeue for live jobs, else job_info (scontrol, sacct with accounting)."""
    if not job_id:
        return "UNKNOWN", "no job id"
    if shutil.which("squeue") is None:
        return "UNKNOWN", "no Slurm client on this host"
    try:
        q = subprocess.run(
            ["squeue", "-h", "-j", job_id, "-o", "%T"], capture_output=True, text=True, timeout=30
        )
    except subprocess.TimeoutExpired:
        return "UNKNOWN", SILENT
    if q.returncode == 0 and q.stdout.strip():
        return q.stdout.split()[0], "squeue"
    info = job_info(job_id)
    return info["JobState"], info["source"]


def sbatch(script: Path, timeout: float = 120) -> tuple[str | None, str]:
    """(job id, '') or (None, why sbatch refused it in one line); a missing client or a silent controller raise
    SchedulerError (check_slurm first to say so before anything is submitted)."""
    proc = run(["sbatch", "--parsable", str(script)], timeout=timeout)
    if proc.returncode != 0:
        return None, " ".join((proc.stderr or proc.stdout).split())[
            :300
        ] or f"sbatch exit {proc.returncode}"
    return proc.stdout.strip().split(";")[0], ""


def queue_states(job_ids: list[str]) -> dict[str, str]:
    """{job id: STATE} for the jobs squeue still lists (one call); a job it no longer lists has ended."""
    if not job_ids:
        return {}
    try:
        q = subprocess.run(
            ["squeue", "-h", "-j", ",".join(job_ids), "-o", "%i %T"],
            capture_output=True,
            text=True,
            timeout=60,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SchedulerError(f"squeue did not answer ({exc})", f"check it: {CHECK_CMD}") from None
    if (
        q.returncode != 0
    ):  # every listed job gone (squeue: "Invalid job id specified"): none is queued any more
        if "Invalid job id" in q.stderr:
            return {}
        raise SchedulerError(
            f"squeue failed: {' '.join(q.stderr.split())[:200]}", f"check it: {CHECK_CMD}"
        )
    found = {}
    for line in q.stdout.splitlines():
        parts = line.split()
        if len(parts) == 2:
            found[parts[0]] = parts[1]
    return found


def job_info(job_id: str) -> dict[str, str]:
    """What scontrol (else sacct) says of a job: JobState, ExitCode (code:signal), NodeList, RunTime, Reason, and
    the source it came from; JobState UNKNOWN when Slurm no longer lists it."""
    try:
        s = subprocess.run(
            ["scontrol", "show", "job", "-o", job_id], capture_output=True, text=True, timeout=30
        )
        if s.returncode == 0 and "JobState=" in s.stdout:
            found = re.findall(
                r"\b(JobState|ExitCode|NodeList|RunTime|Reason|BatchHost)=(\S*)", s.stdout
            )
            return dict(found, source="scontrol")
        if shutil.which("sacct"):
            a = subprocess.run(
                ["sacct", "-n", "-X", "-P", "-j", job_id, "-o", "State,ExitCode,NodeList,Elapsed"],
                capture_output=True,
                text=True,
                timeout=30,
            )
            fields = (
                a.stdout.strip().splitlines()[0].split("|")
                if a.returncode == 0 and a.stdout.strip()
                else []
            )
            if len(fields) == 4:
                return {
                    "JobState": fields[0].split()[0].rstrip("+"),
                    "ExitCode": fields[1],
                    "NodeList": fields[2],
                    "RunTime": fields[3],
                    "source": "sacct",
                }
    except subprocess.TimeoutExpired:
        return {"JobState": "UNKNOWN", "source": SILENT}
    return {"JobState": "UNKNOWN", "source": "Slurm no longer lists the job (no accounting)"}


def slurm_seconds(text: str | None) -> float:
    """[D-]HH:MM:SS (or MM:SS) as seconds; 0 when unreadable."""
    found = re.fullmatch(r"(?:(\d+)-)?(?:(\d+):)?(\d+):(\d+)", text or "")
    if not found:
        return 0.0
    days, hours, minutes, seconds = (int(x or 0) for x in found.groups())
    return float(((days * 24 + hours) * 60 + minutes) * 60 + seconds)


def scancel(job_ids: list[str]) -> None:
    if job_ids:
        subprocess.run(["scancel", *job_ids], capture_output=True, text=True, timeout=60)
