"""Fleet: validate (and benchmark) a published wheel on every node of a Slurm cluster, then one row per node.

    invoke fleet.submit --index /shared/apex-index --results /shared/fleet --partition ascend --nodes 16 [--dry-run]
    invoke fleet.status /shared/fleet          # the jobs and where each node is
    invoke fleet.report /shared/fleet [--json]  # node, chip, driver, CANN, torch, torch_npu, sha256, verdict, step time

Why one allocation with one `srun` step per node, not a job array: array tasks cannot be pinned to distinct nodes
(each task gets whatever node is free, two may share one and a node may get none), while one `sbatch --nodes N`
allocation names every node up front and `srun --nodes=1 --nodelist=<node>` runs exactly one step on each. Each step
stands alone (`--kill-on-bad-exit=0`, the job `--no-kill`), so one failing or lost node does not take the others
with it, and `--resume` asks for exactly the nodes that have no result yet.

The results directory is shared storage (the nodes write into it): `<node>.json` per node (written atomically by
bench/fleet_node.py), `.fleet/` holds what the nodes run (the bench scripts, the plan, the batch script), the
submissions (fleet.json), the per-node progress and the logs. Slurm is used through its own CLI: sbatch, squeue,
scontrol and sacct (when accounting is enabled).
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import shlex
import statistics
import time
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from apexkit import cann, envvars, fsedit, log, paths, vocab
from apexkit.errors import ConfigError, SchedulerError
from apexkit.fleet import inputs, slurm
from apexkit.index import published
from apexkit.plan import matrix
from apexkit.plan.target import Target

BENCH = paths.BENCH  # the checkout's bench/, or the installed package's copy
STATE_FILE = "fleet.json"
FORMAT = "apexkit-fleet/1"
SET_ENV = (
    cann.SET_ENV_FILES
)  # what the node script tries, in order (CANN <= 8.3, then 8.5+); --set-env replaces it
DEFAULT_THRESHOLD = 0.10  # a node's step time more than 10 % off the fleet median is flagged
MIN_FOR_OUTLIERS = 3  # ... once at least this many nodes have a step time
SHORT_BENCH = "--model mlp --modes fp32 --warmup 1 --repeats 3 --steps 2 --peak table"


# --- the index -----------------------------------------------------------------------------------------------------


def pick_target(data: dict | None, target: str | None, stack: Any = None) -> str:
    """The one target to validate: --target, a stack's build, or the index's only target."""
    targets = sorted({f["target"] for f in index_files(data) if isinstance(f.get("target"), str)})
    if stack is not None:
        prefix = f"py{stack.python}-torch{stack.torch}-{stack.arch}-"
        matching = [  # --target narrows the stack's builds to that one
            t
            for t in targets
            if t.startswith(prefix)
            and (not stack.torch_npu or f"+npu{stack.torch_npu}" in t)
            and (not target or t == target)
        ]
        if not matching:
            raise ConfigError(
                f"the index has no build of stack {stack.name} ({prefix}*"
                f"{'+npu' + stack.torch_npu if stack.torch_npu else ''})",
                f"build it ({vocab.build(stack.python, f'--stack {stack.name}')}) and publish it ({vocab.command('publish')})",
            )
        return matching[0]
    if target:
        if data is not None and target not in targets:
            raise ConfigError(
                f"the index has no target {target} (it has: {', '.join(targets) or 'nothing'})",
                "pick one of those with --target, or publish that build",
            )
        return target
    if data is None:
        raise ConfigError(
            "the index cannot be read from this host, so the target must be named",
            "pass --target py3.X-torchV-ARCH-REF (as in the index's index.json)",
        )
    if len(targets) != 1:
        raise ConfigError(
            f"the index holds {len(targets)} targets ({', '.join(targets) or 'none'})",
            "pick one with --target or --stack",
        )
    return targets[0]


def index_files(data: dict | None) -> list[dict]:
    """index.json's files[] entries that are objects (another host's file: anything else is ignored)."""
    files = (data or {}).get("files")
    return [f for f in files if isinstance(f, dict)] if isinstance(files, list) else []


# --- the submission ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Placement:
    """Slurm placement, passed through to sbatch as given."""

    partition: str | None = None
    nodes: int | None = None
    nodelist: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    gres: str | None = None
    account: str | None = None
    time_limit: str = "01:00:00"

    def count(self) -> int:
        return self.nodes or len(self.nodelist)


@dataclass(frozen=True)
class Plan:
    """Everything one submission needs: what the batch script and the nodes read."""

    results: Path
    index: published.Index
    target: str
    python: str
    torch: str
    torch_npu: str | None
    device: str
    placement: Placement
    bench: tuple[str, ...] | None = None  # amp_bench.py arguments; None: no benchmark
    find_links: tuple[str, ...] = ()
    torch_index_url: str | None = None
    extra_index_urls: tuple[str, ...] = ()
    node_python: str | None = None
    node_dir: str | None = None  # None: $TMPDIR/apexkit-fleet on the node, else /tmp/apexkit-fleet
    set_env: tuple[str, ...] = SET_ENV
    keep_venv: bool = False
    venv: str | None = (
        None  # the training venv on the nodes (up's way); None: a fresh venv per node
    )
    submission: int = 1
    # (key id, PEM) of each trusted public key (--trusted-key, else apexkit's trusted keys): the nodes verify the wheel
    trusted_keys: tuple[tuple[str, str], ...] = ()
    extra_sbatch: tuple[str, ...] = field(default=())
    # {URL as written to shared files: the same URL with its user:token@}: never in fleet.json, the plan or the script
    logins: dict[str, str] = field(default_factory=dict, repr=False)

    @property
    def credentials_file(self) -> Path:
        return self.fleet_dir / inputs.PRIVATE / f"credentials-{self.submission}.json"

    @property
    def fleet_dir(self) -> Path:
        return self.results / ".fleet"

    @property
    def plan_file(self) -> Path:
        return self.fleet_dir / f"plan-{self.submission}.json"

    @property
    def script_file(self) -> Path:
        return self.fleet_dir / f"submit-{self.submission}.sbatch"

    def node_plan(self) -> dict:
        return {
            "format": FORMAT,
            "submission": self.submission,
            "results": str(self.results),
            "index": self.index.url,
            "simple_url": self.index.simple,
            "index_json": self.index.index_json,
            "target": self.target,
            "python": self.python,
            "torch": self.torch,
            "torch_npu": self.torch_npu,
            "device": self.device,
            "bench": list(self.bench) if self.bench is not None else None,
            "find_links": list(self.find_links),
            "torch_index_url": self.torch_index_url,
            "extra_index_urls": list(self.extra_index_urls),
            "node_dir": self.node_dir,
            "node_python": self.node_python,
            "set_env": list(self.set_env),
            "keep_venv": self.keep_venv,
            "venv": self.venv,
            "credentials": str(self.credentials_file) if self.logins else None,
            "trusted_keys": [{"keyid": k, "pem": pem} for k, pem in self.trusted_keys],
        }


def check_plan(plan: Plan) -> None:
    """Every value the batch script or the nodes' command lines get, against the strict pattern of its kind (the CLI's,
    index.json's target, node names read back from files for --resume): one ConfigError, nothing written."""
    p = plan.placement
    _check_words(
        ("--device", plan.device, "device"),
        ("--partition", p.partition, "partition"),
        ("--account", p.account, "account"),
        ("--gres", p.gres, "gres"),
        ("--time-limit", p.time_limit, "time"),
        *(("--nodelist", node, "node") for node in p.nodelist),
        *(("the node list to exclude (from the result files)", node, "node") for node in p.exclude),
        ("the target", plan.target, "target"),
    )
    inputs.check("path", str(plan.results), "--results")
    # sbatch --output expands %j, %N, ...
    if "%" in str(plan.results):
        raise ConfigError(
            f"--results {inputs.untrusted.shown(str(plan.results))} holds a '%' (Slurm file name pattern)",
            "use a directory without '%'; nothing was submitted",
        )
    _check_words(
        ("--node-interpreter", plan.node_python, "path"),
        ("the target's Python", plan.python, "path"),
        ("--node-dir", plan.node_dir, "node_dir"),
    )
    # srun's cwd is the shared submit directory
    if plan.node_dir is not None and not plan.node_dir.startswith(("/", "$")):
        raise ConfigError(
            f"--node-dir {inputs.untrusted.shown(plan.node_dir)} is not an absolute path (on the nodes it "
            "would be inside the shared submit directory)",
            "pass a node-local path like /tmp/apexkit-fleet or $TMPDIR/apexkit-fleet",
        )
    _check_words(("--venv", plan.venv, "node_dir"))
    if plan.venv is not None and not plan.venv.startswith(("/", "$")):
        raise ConfigError(
            f"--venv {inputs.untrusted.shown(plan.venv)} is not an absolute path",
            "pass the training venv's path as the nodes see it, e.g. /shared/envs/train or $HOME/venvs/train",
        )
    _check_words(
        *(("--set-env", item, "path") for item in plan.set_env),
        *(("--bench-args", arg, "bench_arg") for arg in plan.bench or ()),
        *(("the extra sbatch option", extra, "sbatch") for extra in plan.extra_sbatch),
    )


def render_script(plan: Plan) -> str:
    """The batch script (pure): one allocation, one `srun` step per node, each writing <results>/<node>.json."""
    check_plan(plan)
    p = plan.placement
    q = shlex.quote
    fleet = plan.fleet_dir
    lines = [
        "#!/bin/bash",
        *slurm.batch_header(
            [
                ("job-name", f"apexkit-fleet-{int(plan.submission)}"),
                ("partition", p.partition),
                ("nodes", int(p.count())),
                ("nodelist", p.nodelist),
                ("exclude", p.exclude),
                ("ntasks-per-node", 1),
                ("gres", p.gres),
                ("account", p.account),
                ("time", p.time_limit),
                ("no-kill", True),
                ("output", f"{fleet}/logs/job-%j.out"),
            ],
            plan.extra_sbatch,
        ),
    ]
    lines += [
        f"# apexkit fleet: {q(plan.target)} from {log.sanitise(inputs.shown_url(plan.index.url, plan.logins))}"
        + (
            f" installed into the training venv {plan.venv} (torch kept)"
            if plan.venv
            else " in a fresh venv"
        )
        + " on every node of the allocation, validated for "
        f"--device {plan.device}{' and benchmarked' if plan.bench is not None else ''}",
        "# one srun step per node (not a job array: array tasks cannot be pinned to distinct nodes); each step",
        "# stands alone (--kill-on-bad-exit=0, --no-kill) and writes <results>/<node>.json",
        "set -u",
        f"FLEET={q(str(fleet))}",
        f"PLAN={q(str(plan.plan_file))}",
        f"NODE_PYTHON={q(plan.node_python or 'python' + plan.python)}",
        f"SET_ENV_FILES={q(' '.join(plan.set_env))}",
        "export FLEET PLAN NODE_PYTHON SET_ENV_FILES",
        'nodes=$(scontrol show hostnames "$SLURM_JOB_NODELIST")',
        'printf "%s\\n" $nodes > "$FLEET/jobs/$SLURM_JOB_ID.nodes"',
        "read -r -d '' NODE_STEP <<'EOF'",
        "# on each node: CANN's set_env.sh when present, then the node runner",
        "APEXKIT_FLEET_SET_ENV=",
        "for f in $SET_ENV_FILES; do",
        '  if [ -f "$f" ]; then . "$f"; APEXKIT_FLEET_SET_ENV="$f"; break; fi',
        "done",
        "export APEXKIT_FLEET_SET_ENV",
        'exec "$NODE_PYTHON" "$FLEET/bench/fleet_node.py" --plan "$PLAN"',
        "EOF",
        "export NODE_STEP",
        "for node in $nodes; do",
        '  srun --nodes=1 --ntasks=1 --nodelist="$node" --kill-on-bad-exit=0'
        + (f" --gres={q(p.gres)}" if p.gres else "")
        + ' --output="$FLEET/logs/$node.$SLURM_JOB_ID.log" bash -c "$NODE_STEP" &',
        "done",
        "wait",
        "",
    ]
    return "\n".join(lines)


def load_state(results: Path) -> dict:
    path = results / STATE_FILE
    # fsedit.read_regular: a named pipe, a device or a huge file planted as fleet.json is one line, never a hang
    data = fsedit.read_regular(path, str(path), ConfigError, "use another --results directory")
    if data is None:
        return {"format": FORMAT, "submissions": []}
    state = fsedit.load_json_object(path, str(path), data)
    subs = state.get("submissions")
    if (
        state.get("format") != FORMAT
        or not isinstance(subs, list)
        or not all(isinstance(s, dict) for s in subs)
    ):
        raise ConfigError(
            f"{path} is not an apexkit fleet record", "use another --results directory"
        )
    return state


def save_state(results: Path, state: dict) -> None:
    fsedit.atomic_write(results / STATE_FILE, fsedit.dump_json(state), 0o644)


def read_results(results: Path) -> tuple[dict[str, dict], dict[str, str]]:
    """({node: its checked result}, {file stem: why it is unreadable}) for every <results>/*.json but fleet.json."""
    found: dict[str, dict] = {}
    bad: dict[str, str] = {}
    for path in sorted(results.glob("*.json")):
        if path.name == STATE_FILE:
            continue
        try:
            found[path.stem] = inputs.read_result(path)
        except inputs.Unreadable as exc:
            bad[path.stem] = str(exc)
    return found, bad


def expected_nodes(results: Path, state: dict) -> tuple[list[str], list[dict]]:
    """Every node a submission was placed on (the allocation's list when the job started, else what was asked for),
    and the submissions whose nodes are not known (never started, placed by --nodes N)."""
    nodes: list[str] = []
    unplaced = []
    for sub in state["submissions"]:
        allocated = _allocated(results, sub)
        if allocated is None and _asked(sub):
            allocated = _asked(sub)
        if allocated is None:
            unplaced.append(sub)
            continue
        nodes += [n for n in allocated if n not in nodes]
    return nodes, unplaced


def _allocated(results: Path, sub: dict) -> list[str] | None:
    job = sub.get("job_id")
    nodes = results / ".fleet" / "jobs" / f"{job}.nodes"
    return inputs.read_node_names(nodes) if inputs.valid("job", job) else None


def _asked(sub: dict) -> list[str]:
    """The node names a submission asked for (fleet.json), the plain ones only."""
    names = sub.get("nodelist")
    return [n for n in names if inputs.valid("node", n)] if isinstance(names, list) else []


def submit(plan: Plan, dry_run: bool = False, resume: bool = False) -> str | None:
    """Write what the nodes run into <results>/.fleet/ and sbatch the script; returns the job id."""
    results = plan.results
    state = load_state(results)
    if resume:
        resumed = resume_plan(plan, state)
        if resumed is None:
            log.info(f"every node in {results} has a result: nothing to resubmit")
            return None
        plan = resumed
    if not resume and state["submissions"] and not dry_run:
        raise ConfigError(
            f"{results} already holds fleet submissions ({len(state['submissions'])})",
            "resubmit the nodes without a result with --resume, or use another --results directory",
        )
    script = render_script(plan)
    if dry_run:
        print(script, end="")
        if plan.logins:
            log.info(
                f"the login(s) of {', '.join(map(log.mask, plan.logins.values()))} would go to "
                f"{plan.credentials_file} (0600, in a 0700 directory), read on each node into pip's "
                "environment; no file, script or log gets them"
            )
        return None
    slurm.check_slurm()
    for sub in ("bench", "logs", "jobs", "progress"):
        (plan.fleet_dir / sub).mkdir(parents=True, exist_ok=True)
    if plan.logins:
        inputs.write_logins(plan.credentials_file, plan.logins)
    for sub in (
        "",
        "probes",
    ):  # what the nodes run: bench/'s scripts, probes and data (stdlib + torch only)
        (plan.fleet_dir / "bench" / sub).mkdir(parents=True, exist_ok=True)
        for source in sorted((BENCH / sub).iterdir()):
            if (
                source.is_file()
                and not source.is_symlink()
                and source.suffix in (".py", ".json", ".toml")
            ):
                fsedit.atomic_write(
                    plan.fleet_dir / "bench" / sub / source.name, source.read_bytes(), 0o755
                )
    fsedit.atomic_write(plan.plan_file, fsedit.dump_json(plan.node_plan()), 0o644)
    fsedit.atomic_write(plan.script_file, script.encode(), 0o755)
    job_id, why = slurm.sbatch(plan.script_file)
    if job_id is None:
        raise SchedulerError(
            f"sbatch refused the job: {log.mask(why)}",
            f"fix the placement (--partition/--nodes/--nodelist/--gres/--account); the script is "
            f"{plan.script_file}",
        )
    if not inputs.valid("job", job_id):
        raise SchedulerError(
            f"sbatch answered {inputs.untrusted.shown(job_id)[:80]}, not a job id",
            f"check the job with squeue; the script is {plan.script_file}",
        )
    p = plan.placement
    state["submissions"].append(
        {
            "submission": plan.submission,
            "job_id": job_id,
            "target": plan.target,
            "index": plan.index.url,
            "device": plan.device,
            "partition": p.partition,
            "nodes": p.count(),
            "nodelist": list(p.nodelist),
            "exclude": list(p.exclude),
            "submitted": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "plan": dict(
                plan.node_plan(),
                placement={
                    "partition": p.partition,
                    "gres": p.gres,
                    "account": p.account,
                    "time_limit": p.time_limit,
                },
            ),
        }
    )
    save_state(results, state)
    where = ",".join(p.nodelist) if p.nodelist else f"{p.count()} node(s)"
    log.info(f"submitted job {job_id}: {plan.target} on {where}; results in {results}")
    log.info(
        f"  {vocab.command('fleet.status', str(results))}    {vocab.command('fleet.report', str(results))}"
    )
    print(job_id)  # stdout: the job id alone, for scripts (progress is on stderr)
    return job_id


def resume_plan(plan: Plan, state: dict) -> Plan | None:
    """The same run for the nodes without a result only: their names when known, else a count with the done ones
    excluded. Jobs still queued or running are left alone (resubmitting them would run those nodes twice)."""
    if not state["submissions"]:
        raise ConfigError(
            f"{plan.results} has no earlier submission to resume", "submit without --resume first"
        )
    results = plan.results
    done = set(read_results(results)[0])  # an unreadable result is not done: its node runs again
    live = [
        s
        for s in state["submissions"]
        if slurm.job_state(s.get("job_id"))[0]
        in ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING")
    ]
    if live:
        raise ConfigError(
            f"job {', '.join(s['job_id'] for s in live)} is still queued or running",
            f"wait for it ({vocab.command('fleet.status', str(results))}) or cancel it (scancel JOBID), then --resume",
        )
    nodes, unplaced = expected_nodes(results, state)
    missing = [n for n in nodes if n not in done]
    extra = sum(int(s.get("nodes") or 0) for s in unplaced)
    if not missing and not extra:
        return None
    last = state["submissions"][-1]
    number = max(int(s.get("submission", 0)) for s in state["submissions"]) + 1
    count, nodelist, exclude = (
        (len(missing) + extra, (), tuple(sorted(done))) if extra else (None, tuple(missing), ())
    )
    placement = Placement(  # the names when known, else a count with the done nodes excluded
        partition=plan.placement.partition or _text(last.get("partition")),
        nodes=count,
        nodelist=nodelist,
        exclude=exclude,
        gres=plan.placement.gres,
        account=plan.placement.account,
        time_limit=plan.placement.time_limit,
    )
    log.info(
        f"resume: {len(done)} node(s) have a result; resubmitting "
        f"{', '.join(missing) if missing else ''}{' + ' if missing and extra else ''}"
        f"{f'{extra} unplaced node(s)' if extra else ''}"
    )
    return dataclasses.replace(plan, placement=placement, submission=number)


# --- the report ----------------------------------------------------------------------------------------------------


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _progress(results: Path, node: str) -> dict:
    """A node's last stage ({'stage': str, 'job_id': str}), {} when unknown or not plain."""
    if not inputs.valid("node", node):
        return {}
    data = inputs.read_small_json(results / ".fleet" / "progress" / f"{node}.json")
    stage, job = data.get("stage"), data.get("job_id")
    plain = isinstance(stage, str) and len(stage) <= 100
    return {"stage": stage, "job_id": job if isinstance(job, str) else None} if plain else {}


def rows(results: Path, threshold: float = DEFAULT_THRESHOLD) -> tuple[list[dict], dict]:
    """One row per node: its result, or what happened to it (running, dead with the job's state, never placed)."""
    if not results.is_dir():
        raise ConfigError(
            f"{results} is not a directory", "pass the --results directory fleet.submit wrote"
        )
    state = load_state(results)
    if not state["submissions"]:
        raise ConfigError(
            f"{results} holds no fleet submission ({STATE_FILE} missing)",
            f"submit first: {vocab.command('fleet.submit', f'--results {results} ...')}",
        )
    found, unreadable = read_results(results)
    jobs = {
        s["job_id"]: slurm.job_state(s["job_id"])
        for s in state["submissions"]
        if inputs.valid("job", s.get("job_id"))
    }
    nodes, unplaced = expected_nodes(results, state)
    extra = [n for n in [*found, *unreadable] if n not in nodes]
    table = [
        _result_row(node, found[node])
        if node in found
        else _unreadable_row(results, node, unreadable[node])
        if node in unreadable  # one row saying why; the other nodes still report
        else _job_row(results, state, jobs, node)
        for node in nodes + sorted(set(extra), key=extra.index)
    ]
    table += [_unplaced_row(results, jobs, sub) for sub in unplaced]
    return table, _summary(results, table, jobs, _mark_outliers(table, threshold), threshold)


def _summary(
    results: Path, table: list[dict], jobs: dict, median: float | None, threshold: float
) -> dict:
    return {
        "results": str(results),
        "nodes": len(table),
        "ok": sum(r["status"] == "ok" for r in table),
        "failed": sum(r["status"] == "fail" for r in table),
        "missing": sum(r["status"] in ("dead", "no result", "pending", "running") for r in table),
        "unreadable": sum(r["status"] == "unreadable" for r in table),
        "median_step_ms": median,
        "outlier_threshold": threshold,
        "outliers": [r["node"] for r in table if r.get("outlier")],
        "jobs": {j: {"state": s, "source": src} for j, (s, src) in jobs.items()},
    }


# what a node's result file gives its row, in the report's order
_RESULT_FIELDS: tuple[str, ...] = (
    "chip",
    "driver",
    "cann",
    "torch",
    "torch_npu",
    "wheel_sha256",
    "step_ms",
    "job_id",
    "set_env",
    "first_failure",
)
# a job without a result: (its status, what the row says) by the Slurm state; any other state is a dead job
_JOB_STATUS = {
    "PENDING": ("pending", "job {job} pending"),
    "CONFIGURING": ("pending", "job {job} configuring"),
    "RUNNING": ("running", "job {job} running{stage}"),
    "COMPLETING": ("running", "job {job} running{stage}"),
    "UNKNOWN": ("no result", "job {job}: state unknown ({source}); no result file"),
}


def _result_row(node: str, data: dict) -> dict:
    return {
        "node": node,
        "status": data.get("verdict") or "fail",
        **{k: data.get(k) for k in _RESULT_FIELDS},
    }


def _unreadable_row(results: Path, node: str, why: str) -> dict:
    return {
        "node": node if inputs.valid("node", node) else inputs.untrusted.shown(node),
        "status": "unreadable",
        "first_failure": {
            "check": "result",
            "detail": f"unreadable result: {why}",
            "fix": f"look at {results}/{inputs.untrusted.shown(node)[1:-1]}.json; "
            f"--resume runs that node again",
        },
    }


def _job_row(results: Path, state: dict, jobs: dict, node: str) -> dict:
    """The row of a node without a result: what its last job is doing, or that it died."""
    placed = [s for s in state["submissions"] if node in (_allocated(results, s) or _asked(s))]
    job_id = placed[-1].get("job_id") if placed else None
    jstate, source = jobs.get(job_id, ("UNKNOWN", "no job"))
    stage = _progress(results, node)
    stage_text = (
        f" during {stage['stage']}" if stage.get("stage") and stage.get("job_id") == job_id else ""
    )
    status, detail = _JOB_STATUS.get(jstate, ("dead", "job {job} {state}{stage}, no result"))
    return {
        "node": node,
        "status": status,
        "job_id": job_id,
        "job_state": jstate,
        "first_failure": {
            "check": "job",
            "detail": detail.format(job=job_id, state=jstate, stage=stage_text, source=source),
            "fix": "resubmit the nodes without a result: "
            + vocab.command("fleet.submit", f"--results {results} --resume")
            if status in ("dead", "no result")
            else f"wait: {vocab.command('fleet.status', str(results))}",
        },
    }


def _unplaced_row(results: Path, jobs: dict, sub: dict) -> dict:
    jstate, _ = jobs.get(sub.get("job_id"), ("UNKNOWN", ""))
    return {
        "node": f"({sub.get('nodes')} unplaced)",
        "status": "pending" if jstate in ("PENDING", "CONFIGURING", "RUNNING") else "dead",
        "job_id": sub.get("job_id"),
        "job_state": jstate,
        "first_failure": {
            "check": "job",
            "detail": f"job {sub.get('job_id')} {jstate}: no node was allocated",
            "fix": vocab.command("fleet.submit", f"--results {results} --resume"),
        },
    }


def _mark_outliers(table: list[dict], threshold: float) -> float | None:
    """The median step time, each row's deviation from it and whether it is an outlier; with fewer than 3 step times
    the median says nothing about which one is off."""
    steps = [r["step_ms"] for r in table if isinstance(r.get("step_ms"), (int, float))]
    median = statistics.median(steps) if steps else None
    for r in table:
        if median and len(steps) >= MIN_FOR_OUTLIERS and isinstance(r.get("step_ms"), (int, float)):
            r["deviation"] = round((r["step_ms"] - median) / median, 4)
            r["outlier"] = abs(r["deviation"]) > threshold
    return median


def _short(value: Any, width: int = 0) -> str:
    text = "-" if value in (None, "") else str(value)
    return text[:width] if width else text


def render(table: list[dict], summary: dict) -> str:
    head = [
        "node",
        "status",
        "chip",
        "driver",
        "CANN",
        "torch",
        "torch_npu",
        "wheel sha256",
        "step ms",
        "vs median",
        "first failing check -> fix",
    ]
    body = []
    for r in table:
        dev = r.get("deviation")
        dev_text = "-" if dev is None else f"{dev:+.1%}" + (" OUTLIER" if r.get("outlier") else "")
        failure = r.get("first_failure") or {}
        body.append(
            [
                r["node"],
                {"ok": "ok", "fail": "FAIL", "dead": "DEAD", "unreadable": "UNREADABLE"}.get(
                    r["status"], r["status"]
                ),
                _short(r.get("chip"), 28),
                _short(r.get("driver")),
                _short(r.get("cann")),
                _short(r.get("torch")),
                _short(r.get("torch_npu")),
                _short(r.get("wheel_sha256"), 12),
                "-" if r.get("step_ms") is None else f"{r['step_ms']:.2f}",
                dev_text,
                (
                    "-"
                    if not failure
                    else f"{failure.get('check')}: {failure.get('detail')}"
                    + (f" -> {failure['fix']}" if failure.get("fix") else "")
                ),
            ]
        )
    widths = [
        max(len(log.sanitise(str(row[i]))) for row in [head, *body]) for i in range(len(head) - 1)
    ]
    lines = [
        "  ".join(
            [
                *[log.sanitise(str(c)).ljust(w) for c, w in zip(row[:-1], widths)],
                log.sanitise(str(row[-1])),
            ]
        ).rstrip()
        for row in [head, *body]
    ]
    median = summary["median_step_ms"]
    unreadable = f", {summary['unreadable']} unreadable" if summary.get("unreadable") else ""
    lines.append(
        f"{summary['nodes']} node(s): {summary['ok']} ok, {summary['failed']} failed, {summary['missing']} "
        f"without a result{unreadable}; step-time median "
        f"{'-' if median is None else f'{median:.2f} ms'}, outliers beyond ±{summary['outlier_threshold']:.0%}: "
        f"{', '.join(summary['outliers']) or 'none'}"
    )
    return "\n".join(lines)


def report(
    results: Path, as_json: bool = False, threshold: float | None = DEFAULT_THRESHOLD
) -> int:
    """Print the per-node table (or JSON); exit 1 when a node failed, died or has not reported."""
    threshold = DEFAULT_THRESHOLD if threshold is None else threshold
    if (
        isinstance(threshold, bool)
        or not isinstance(threshold, (int, float))
        or not (math.isfinite(threshold) and threshold >= 0)
    ):
        raise ConfigError(
            f"--threshold {threshold!r} is not a fraction >= 0", "pass --threshold 0.1 (10 %)"
        )
    table, summary = rows(results, threshold)
    print(
        json.dumps({"summary": summary, "nodes": table}, indent=2, allow_nan=False)
        if as_json
        else render(table, summary)
    )
    return 0 if summary["nodes"] and summary["ok"] == summary["nodes"] else 1


def status(results: Path, as_json: bool = False) -> int:
    """The submissions' job states and where each node is now; exit 0 (it is a look, not a verdict)."""
    state = load_state(results)
    if not state["submissions"]:
        raise ConfigError(
            f"{results} holds no fleet submission",
            f"submit first: {vocab.command('fleet.submit', f'--results {results}')}",
        )
    jobs = []
    for sub in state["submissions"]:
        job = sub.get("job_id")
        jstate, source = (
            slurm.job_state(job) if inputs.valid("job", job) else ("UNKNOWN", "no job id")
        )
        nodes = _allocated(results, sub) or _asked(sub)
        jobs.append(
            {
                "submission": sub.get("submission"),
                "job_id": sub.get("job_id"),
                "state": jstate,
                "source": source,
                "target": sub.get("target"),
                "nodes": nodes or sub.get("nodes"),
                "progress": {n: _progress(results, n).get("stage") for n in nodes},
            }
        )
    if as_json:
        print(json.dumps({"results": str(results), "jobs": jobs}, indent=2))
        return 0
    for j in jobs:
        where = (
            ", ".join(f"{n} ({s or 'not started'})" for n, s in j["progress"].items())
            or f"{j['nodes']} node(s)"
        )
        print(
            log.sanitise(
                f"job {j['job_id']} (submission {j['submission']}, {j['target']}): {j['state']} "
                f"[{j['source']}]: {where}"
            )
        )
    return 0


def submit_command(
    *,
    results: str,
    index: str | None = None,
    resume: bool = False,
    dry_run: bool = False,
    **options,
) -> int:
    """`invoke fleet.submit`: a new plan from the options, or with --resume and no --index the last one's."""
    if resume and index is None:
        plan = stored_plan(results)
    else:
        if index is None:
            raise ConfigError(
                "--index is required",
                f"pass the directory {vocab.command('publish')} wrote, or its URL",
            )
        plan = make_plan(results=results, index=index, resume=resume, **options)
    submit(plan, dry_run=dry_run, resume=resume)
    return 0


def stored_plan(results: str) -> Plan:
    """The last submission's plan, for --resume without repeating the options (its logins from its 0600 file)."""
    path = Path(results).expanduser().resolve()
    state = load_state(path)
    if not state["submissions"]:
        raise ConfigError(
            f"{path} has no earlier submission to resume", "submit without --resume first"
        )
    last = state["submissions"][-1]
    try:
        p = last["plan"]
        placement = p.get("placement") or {}
        index_url = p["index"]
        if not isinstance(index_url, str):
            raise TypeError("index")
        index = published.Index(
            index_url,
            Path(urllib.parse.unquote(urllib.parse.urlsplit(index_url).path))
            if index_url.startswith("file:")
            else None,
        )
        logins = inputs.read_logins(Path(str(p["credentials"]))) if p.get("credentials") else {}
        plan = Plan(
            results=path,
            index=index,
            target=str(p["target"]),
            python=str(p["python"]),
            torch=str(p["torch"]),
            torch_npu=_text(p.get("torch_npu")),
            device=str(p["device"]),
            placement=Placement(
                partition=_text(placement.get("partition")),
                gres=_text(placement.get("gres")),
                account=_text(placement.get("account")),
                time_limit=_text(placement.get("time_limit")) or "01:00:00",
            ),
            bench=tuple(str(a) for a in p["bench"]) if p.get("bench") is not None else None,
            find_links=tuple(str(x) for x in p.get("find_links") or ()),
            torch_index_url=_text(p.get("torch_index_url")),
            extra_index_urls=tuple(str(x) for x in p.get("extra_index_urls") or ()),
            node_python=_text(p.get("node_python")),
            node_dir=_text(p.get("node_dir")),
            set_env=tuple(str(x) for x in p.get("set_env") or SET_ENV),
            keep_venv=bool(p.get("keep_venv")),
            venv=_text(p.get("venv")),
            submission=int(last.get("submission", 1)),
            trusted_keys=tuple(
                (str(k["keyid"]), str(k["pem"])) for k in p.get("trusted_keys") or ()
            ),
            logins=logins,
        )
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ConfigError(
            f"{path / STATE_FILE}: the last submission's plan is not readable ({type(exc).__name__}: "
            f"{inputs.untrusted.shown(str(exc))[:80]})",
            "resubmit with the options (--index ... --resume), or use another --results directory",
        ) from None
    check_plan(plan)
    return plan


def make_plan(
    *,
    results: str,
    index: str,
    target: str | None = None,
    stack: str | None = None,
    device: str = "npu",
    partition: str | None = None,
    nodes: int | None = None,
    nodelist: str | None = None,
    gres: str | None = None,
    account: str | None = None,
    time_limit: str = "01:00:00",
    bench: bool = False,
    bench_args: str | None = None,
    find_links: list[str] | None = None,
    torch_index_url: str | None = None,
    extra_index_url: list[str] | None = None,
    node_python: str | None = None,
    node_dir: str | None = None,
    set_env: str | None = None,
    keep_venv: bool = False,
    venv: str | None = None,
    resume: bool = False,
    trusted_key: list[str] | None = None,
) -> Plan:
    """Options -> a checked Plan (the command edge calls this; tests too)."""
    names = _nodelist(nodes, nodelist, resume)
    _check_words(  # before anything is read; check_plan checks them all again with the rest
        ("--device", device, "device"),
        ("--partition", partition, "partition"),
        ("--account", account, "account"),
        ("--gres", gres, "gres"),
        ("--time-limit", time_limit, "time"),
        *(("--nodelist", name, "node") for name in names),
        ("--node-interpreter", node_python, "path"),
        ("--node-dir", node_dir, "node_dir"),
        ("--venv", venv, "node_dir"),
        ("--target", target, "target"),
    )
    logins: dict[str, str] = {}

    def public(value: str, option: str) -> str:
        shared, full = inputs.split_login(value, option)
        if full is not None:
            logins[shared] = full
        return shared

    inputs.urls.check_chars(index.strip(), "--index")
    full_idx = published.parse_index(index)  # read_index gets the login (Basic auth), nothing else
    idx = (
        full_idx
        if full_idx.path is not None
        else published.Index(public(full_idx.url, "--index"), None)
    )
    find_links = [public(x, "--find-links") for x in find_links or ()]
    torch_index_url = public(torch_index_url, "--torch-index-url") if torch_index_url else None
    extra_index_url = [public(x, "--extra-index-url") for x in extra_index_url or ()]
    matrix_stack = matrix.load().stack(stack) if stack else None
    data = published.read_index(full_idx)
    chosen = inputs.check("target", pick_target(data, target, matrix_stack), "the index's target")
    facts = Target.from_id(chosen).facts()
    plan = Plan(
        results=Path(results).expanduser().resolve(),
        index=idx,
        target=chosen,
        python=facts["python"] or "3",
        torch=_index_torch(data, chosen, facts["torch"] or ""),
        torch_npu=facts["torch_npu"] or (matrix_stack.torch_npu if matrix_stack else None),
        device=device,
        placement=Placement(
            partition=partition,
            nodes=nodes or len(names) or None,
            nodelist=names,
            gres=gres,
            account=account,
            time_limit=time_limit,
        ),
        bench=_bench(bench, bench_args),
        find_links=tuple(find_links),
        torch_index_url=torch_index_url,
        extra_index_urls=tuple(extra_index_url),
        node_python=node_python,
        node_dir=node_dir or None,
        set_env=tuple(x for x in set_env.split(",") if x) if set_env else SET_ENV,
        keep_venv=keep_venv,
        venv=venv or None,
        trusted_keys=_trusted_pems(trusted_key or []),
        logins=logins,
    )
    check_plan(plan)  # and so --bench-args and --set-env
    return plan


def _trusted_pems(flags: list[str]) -> tuple[tuple[str, str], ...]:
    """(key id, PEM) of each trusted key (apexkit.index.signing.trusted_keys), for the nodes' own check."""
    from apexkit.index import signing

    keys = signing.trusted_keys(flags)
    if not keys:  # verification off: no cryptography needed (Python 3.9.0/3.9.1 have none)
        return ()
    from cryptography.hazmat.primitives import serialization

    spki = serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    return tuple((k, v.public_bytes(*spki).decode()) for k, v in sorted(keys.items()))


def _check_words(*checks: tuple[str, str | None, str]) -> None:
    """Each (option, value, kind) given against the strict pattern of its kind."""
    for option, value, kind in checks:
        if value is not None:
            inputs.check(kind, value, option)


def _nodelist(nodes: int | None, nodelist: str | None, resume: bool) -> tuple[str, ...]:
    """--nodelist's names, checked with --nodes (--resume may give neither: it asks for the nodes without a result)."""
    names = tuple(n for n in re.split(r"[,\s]+", nodelist or "") if n)
    if nodes is not None and nodes < 1:
        raise ConfigError(
            f"--nodes {nodes}: must be at least 1", "pass --nodes N or --nodelist a,b,c"
        )
    if not names and not nodes and not resume:
        raise ConfigError(
            "no placement: neither --nodes nor --nodelist",
            "pass --nodes N (with --partition) or --nodelist node1,node2",
        )
    if names and nodes and nodes != len(names):
        raise ConfigError(
            f"--nodes {nodes} but --nodelist names {len(names)} node(s)", "pass one of them"
        )
    return names


def _index_torch(data: dict | None, target: str, default: str) -> str:
    """The torch the index says the target's wheel was built against, else the one its name gives."""
    torches = [f.get("torch") for f in index_files(data) if f.get("target") == target]
    return next((str(t) for t in torches if isinstance(t, str) and t), default)


def _bench(bench: bool, args: str | None) -> tuple[str, ...] | None:
    """What the nodes benchmark with: the short run, then --bench-args; None: no benchmark."""
    if not (bench or args):
        return None
    return tuple(shlex.split(SHORT_BENCH)) + (
        tuple(envvars.split_words(args, "--bench-args", "--scale 0.05")) if args else ()
    )
