"""`nox -s matrix`: the build matrix as a table, JSON or a GitHub Actions matrix; `-- --run` builds every combination
here (in parallel with --parallel, one log per combination) and prints a summary; `build-<id>` sessions build one.

A combination whose arch is not the host's builds in the builder image matrix.toml [matrix.images] names for its
Python (else [matrix] image); `--image IMAGE` builds every combination in IMAGE. Before anything runs, each such
combination is checked against its image: the image must exist, be of the combination's arch and list the
combination's Python in its builder.json; otherwise it is refused in one line naming the image (and the
`invoke image.build`) that fits.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from apexkit import (
    cachetrust,
    declare,
    dockerclient,
    envvars,
    fsedit,
    log,
    paths,
    statusfile,
    untrusted,
    vocab,
)
from apexkit.errors import ApexkitError, ConfigError
from apexkit.fleet import runreport, runwatch, slurm
from apexkit.images import builder
from apexkit.plan import matrix
from apexkit.plan.matrix import Combination
from apexkit.proc import group_child
from apexkit.wheel import options
from apexkit.wheel.options import BuildOptions


def load_combinations(path: Path | None) -> tuple[matrix.Matrix, list[Combination]]:
    """matrix.toml, or a file with [[include]] tables (and optionally its own [images] / image, as [matrix.images] /
    [matrix] image)."""
    m = matrix.load()
    if path is None:
        return m, m.combinations()
    try:
        data = matrix.tomllib.loads(path.read_text())
    except (OSError, matrix.tomllib.TOMLDecodeError) as exc:
        raise ConfigError(
            f"--matrix {path}: {exc}", "pass a TOML file with [[include]] tables"
        ) from None
    if "images" in data or "image" in data:  # the file's own, over matrix.toml's
        own = {k: data[k] for k in ("images", "image") if k in data}
        m = matrix.Matrix({**m.data, "matrix": {**m.data.get("matrix", {}), **own}})
    include = data.get("include")
    whole = "matrix" in data and isinstance(data["matrix"], dict)
    if not isinstance(include, list) or not include:
        raise ConfigError(
            f"--matrix {path} holds no [[include]] tables"
            + (
                " (it is a whole matrix.toml: its combinations are [[matrix.include]])"
                if whole
                else ""
            )
            + ": nothing would be built",
            "drop --matrix to use matrix.toml"
            if whole
            else "add [[include]] tables (python, torch, ...)",
        )
    return m, m.combinations(include)


def image_for(
    m: matrix.Matrix, combo: Combination, host: str | None = None, image: str | None = None
) -> str | None:
    """The builder image this combination builds in: `image` when given, else the one for its Python when its arch
    is not the host's (None: it builds on this host)."""
    if image:
        return image
    if combo.arch == (host or dockerclient.host_arch()):
        return None
    return builder.choose_image(m.data, combo.python, combo.arch).image


def build_options(
    m: matrix.Matrix, combo: Combination, host: str | None = None, image: str | None = None
) -> dict[str, str]:
    """The build options that make this combination here, typed (the builder image for a foreign arch)."""
    chosen = image_for(m, combo, host, image)
    return {**combo.build_options(), **({"image": chosen} if chosen else {})}


def resolve_cell(
    m: matrix.Matrix,
    combo: Combination,
    passthrough: Sequence[str],
    run: Mapping[str, object],
    host: str | None = None,
    image: str | None = None,
) -> BuildOptions:
    """The build options of one cell, resolved once here as `apexkit build` resolves them: the combination's typed
    options (its builder image for a foreign arch) and the run's (`run`: dist, build_dir, jobs), the passthrough
    flags over them. ConfigError when they do not resolve (argparse's exit 2 for a flag that is none)."""
    return options.resolve(
        combo.python,
        passthrough,
        prog=vocab.prog("build"),
        given={**build_options(m, combo, host, image), **run},
    )


def prepare(
    m: matrix.Matrix,
    combo: Combination,
    passthrough: Sequence[str],
    facts: builder.ImageFacts | None,
    run: Mapping[str, object],
    host: str | None = None,
    image: str | None = None,
) -> Result | BuildOptions:
    """One cell before anything runs: its refused row (by matrix.toml, its builder image or its build options), or
    its build options (resolve_cell)."""
    try:
        m.validate(combo)
        refusal = check_image(m, combo, facts, host, image)[2]
        if refusal:
            return Result(combo.id, "refused", detail=refusal)
        return resolve_cell(m, combo, passthrough, run, host, image)
    except ConfigError as exc:
        return Result(combo.id, "refused", detail=exc.cause)


def child_argv(interpreter: str, opts: BuildOptions, options_file: Path) -> list[str]:
    """The child process of a cell (a local one, a Slurm job): `apexkit build <python> --options-json FILE`, FILE
    holding the options resolved here (options.child_json); it answers with its status file and manifest."""
    return [interpreter, "-m", "apexkit", "build", opts.python, "--options-json", str(options_file)]


def check_image(
    m: matrix.Matrix,
    combo: Combination,
    facts: builder.ImageFacts | None,
    host: str | None = None,
    image: str | None = None,
) -> tuple[str, str, str | None]:
    """(image, state, refusal): does the combination's builder image exist, have its arch and its Python?
    image '' = builds on this host; refusal is the one line that stops the combination (None: it may run)."""
    chosen = image_for(m, combo, host, image)
    if chosen is None:
        return "", "host", None
    if facts is None:
        return chosen, "not checked", None
    exists, info = facts.get(chosen)
    if facts.error:
        return chosen, "not checked", f"{combo.id}: cannot check {chosen}: {facts.error}"
    if not exists:
        return (
            chosen,
            "missing",
            (
                f"{combo.id}: {chosen} is not in the Docker daemon -- next: "
                f"{builder.build_hint(chosen, combo.arch, m.data)}"
            ),
        )
    if info is not None and info.get("arch") and info["arch"] != combo.arch:
        return (
            chosen,
            f"is {info['arch']}",
            (
                f"{combo.id}: {chosen} is an {info['arch']} image -- next: "
                f"{builder.choose_image(m.data, combo.python, combo.arch).build_command}"
            ),
        )
    try:
        builder.require_python(info, chosen, combo.python, combo.arch, m.data, what=combo.id)
    except ApexkitError as exc:
        return chosen, f"lacks Python {combo.python}", exc.format()
    return chosen, "fits" if info is not None else "no builder.json (older recipe)", None


def rows(
    m: matrix.Matrix,
    combos: list[Combination],
    facts: builder.ImageFacts | None = None,
    image: str | None = None,
) -> list[dict]:
    out = []
    for combo in combos:
        refused = None
        try:
            m.validate(combo)
        except ConfigError as exc:
            refused = exc.cause
        chosen, state, image_refused = check_image(m, combo, facts, image=image)
        out.append(
            {
                "id": combo.id,
                "python": combo.python,
                "torch": combo.torch,
                "torch_npu": combo.torch_npu or "",
                "cann": combo.cann or "",
                "arch": combo.arch,
                "ref": combo.ref,
                "runner": m.runners.get(combo.arch, "ubuntu-24.04"),
                "session": f"build-{combo.id}",
                "backend": combo.backend,
                # the index a CI job takes torch from: the CPU build for Ascend apex (it needs no GPU torch), the CUDA
                # build for NVIDIA apex on CUDA (matrix.toml [index] / [cuda])
                "torch_index": m.cuda.get("torch_index_url", "")
                if combo.backend == "cuda"
                else m.data.get("index", {}).get("torch_cpu_index_url", ""),
                "refused": refused,
                "image": chosen,
                "image_state": state,
                "image_refused": image_refused if facts is not None and not facts.error else None,
            }
        )
    return out


def github(table: list[dict]) -> str:
    """The `strategy.matrix` JSON for GitHub Actions (valid combinations only; one line for $GITHUB_OUTPUT)."""
    keys = (
        "id",
        "python",
        "torch",
        "torch_npu",
        "arch",
        "runner",
        "session",
        "backend",
        "torch_index",
    )
    return json.dumps(
        {"include": [{k: r[k] for k in keys} for r in table if not r["refused"]]},
        separators=(",", ":"),
    )


def refusals(table: list[dict]) -> list[tuple[str, str]]:
    """(id, why) of every refused row: by matrix.toml's tables, or by its builder image when images were checked."""
    return [
        (r["id"], r["refused"] or r["image_refused"])
        for r in table
        if r["refused"] or r["image_refused"]
    ]


def markdown(table: list[dict]) -> str:
    """The matrix for a CI job summary ($GITHUB_STEP_SUMMARY): refused combinations first, then every row."""

    def cell(text: str) -> str:
        return log.sanitise(str(text)).replace("|", "\\|")

    refused = refusals(table)
    head = [f"### {len(refused)} of {len(table)} combinations refused", ""]
    head += [f"- `{cell(rid)}`: {cell(why)}" for rid, why in refused] + [""]
    lines = [
        *(head if refused else []),
        f"### Build matrix: {len(table) - len(refused)} of {len(table)} combinations to build",
        "",
        "| combination | python | torch | torch_npu | arch | runner | session |",
        "|---|---|---|---|---|---|---|",
        *(
            f"| {cell(r['id'])} | {r['python']} | {r['torch']} | {r['torch_npu'] or '-'} | {r['arch']} | "
            f"{r['runner']} | {'REFUSED' if r['refused'] or r['image_refused'] else cell(r['session'])} |"
            for r in table
        ),
    ]
    return "\n".join(lines)


def print_table(table: list[dict], facts: builder.ImageFacts | None = None) -> None:
    wheres = [f"{r['image']} ({r['image_state']})" if r["image"] else "this host" for r in table]
    width = max([len("builds in"), *map(len, wheres)])
    log.out(
        f"{'combination':<34} {'python':<7} {'torch':<8} {'torch_npu':<14} {'arch':<8} {'runner':<17} "
        f"{'builds in':<{width}} note"
    )
    for r, where in zip(table, wheres):
        note = f"REFUSED: {r['refused']}" if r["refused"] else r["session"]
        log.out(
            f"{r['id']:<34} {r['python']:<7} {r['torch']:<8} {r['torch_npu'] or '-':<14} {r['arch']:<8} "
            f"{r['runner']:<17} {where:<{width}} {note}"
        )
    if facts is not None and facts.error:
        log.info(f"images not checked: {facts.error}")


@dataclass
class Result:
    id: str
    status: str  # built | cached | refused | failed
    seconds: float = 0.0
    detail: str = ""
    wheel: str = ""
    size: int = 0
    sha256: str = ""
    cache_hit: bool = False
    log: str = ""
    extra: dict = field(default_factory=dict)
    steps: dict | None = None  # the manifest's step timings (durations_s), checked; None when none


def build_child(argv: list[str], out: TextIO, env: dict[str, str]) -> int:
    """A cell's `apexkit build`, its output into `out`, in a process group of its own (proc.group_child): a matrix
    run stopped (Ctrl-C, an error) or killed outright leaves none of its builds running. Returns its exit code."""
    with group_child(
        argv, stdout=out, stderr=subprocess.STDOUT, cwd=matrix.PROJECT_ROOT, env=env
    ) as child:
        return child.wait()


def run_one(
    combo: Combination,
    opts: BuildOptions,
    logs: Path,
    on_start: Callable[[Path], None] | None = None,
) -> Result:
    """Build one cell, its options resolved (prepare), in a child process; `on_start(status file)` is called as the
    child starts (the watch reads the child's current step beside that file)."""
    log_path = logs / f"{combo.id}.log"
    status_path = logs / f"{combo.id}.status.json"  # kept beside the log once read
    started = time.monotonic()
    # the child writes its status into a directory of this call's own: another matrix run sharing build/matrix/
    # (same --build-dir) never reads it or removes it, and an old one is never there
    private = Path(tempfile.mkdtemp(prefix=f".{combo.id}.", suffix=".status", dir=logs))
    child_status = private / "status.json"
    argv = child_argv(sys.executable, opts, private / "options.json")
    if on_start is not None:
        on_start(child_status)
    try:
        fsedit.atomic_write(private / "options.json", options.child_json(opts), 0o600)
        try:
            fh = untrusted.open_log(log_path)  # never through a link or FIFO planted there
        except untrusted.Refused as exc:
            return Result(combo.id, "failed", 0.0, f"its log: {exc}", log=str(log_path))
        with fh:
            print("+ " + log.mask(" ".join(argv)), file=fh, flush=True)
            returncode = build_child(
                argv,
                fh,
                dict(os.environ, COLUMNS="160", **{statusfile.VARIABLE: str(child_status)}),
            )
        seconds = time.monotonic() - started
        try:
            status = statusfile.read(child_status)
        except untrusted.Untrusted as exc:
            return Result(combo.id, "failed", seconds, f"its status file: {exc}", log=str(log_path))
    finally:  # also on Ctrl-C: nothing of this run's left in build/matrix/ but the log and its status
        with contextlib.suppress(
            OSError
        ):  # this run's child status beside its log (none if it left none)
            if os.path.lexists(child_status):
                os.replace(child_status, status_path)
            elif os.path.lexists(status_path):
                os.unlink(status_path)
        shutil.rmtree(private, ignore_errors=True)
    if returncode != 0 or status is None or status.exit_code != 0:
        detail = (status.error if status is not None else "") or (
            f"exit {returncode}{'' if status else ', no status recorded'} (see {log_path})"
        )
        return Result(combo.id, "failed", seconds, detail[:300], log=str(log_path))
    try:
        target, manifest = read_target(opts.dist_dir, status.target_dir)
    except untrusted.Untrusted as exc:
        return Result(combo.id, "failed", seconds, f"the build reported {exc}", log=str(log_path))
    wheel = manifest.get("wheel", {}) if isinstance(manifest.get("wheel"), dict) else {}
    return Result(
        combo.id,
        "cached" if manifest.get("cache_hit") else "built",
        seconds,
        str(target),
        str(wheel.get("file", "")),
        wheel["size"] if type(wheel.get("size")) is int else 0,
        str(wheel.get("sha256", "")),
        bool(manifest.get("cache_hit")),
        str(log_path),
        steps=runreport.step_timings(manifest),
    )


def read_target(dist: Path, reported: str | None) -> tuple[Path, dict]:
    """The dist/<target>/ a child build recorded in its status file, and its manifest: a target directly in `dist`
    (whatever passthrough options made of its id, e.g. +skip-…), a real directory, a regular manifest.json."""
    from apexkit.images.container import TARGET_NAME
    from apexkit.wheel import distdir

    if not reported:
        raise untrusted.Untrusted("no dist/<target>/ in its status file")
    path = Path(reported)
    parent = None  # a link loop, a NUL: not a directory of ours either way
    with contextlib.suppress(OSError, RuntimeError, ValueError):
        parent = path.parent.resolve()
    if parent != dist.resolve() or not TARGET_NAME.fullmatch(path.name):
        raise untrusted.Untrusted(
            f"{untrusted.shown(reported)}, which is not a target directly in {dist}"
        )
    fd = untrusted.open_dir(dist / path.name)
    try:
        manifest, _ = distdir.read_manifest(fd)
    finally:
        os.close(fd)
    return dist / path.name, manifest


def run_all(
    m: matrix.Matrix,
    combos: list[Combination],
    passthrough: list[str],
    dist: Path,
    build_dir: Path,
    parallel: int,
    image: str | None = None,
    heartbeat: float = runwatch.DEFAULT_SECONDS,
) -> list[Result]:
    """`parallel` cells at a time, each a child with the cores // parallel compile jobs (unless the passthrough
    options say --jobs), its options resolved here first."""
    cores = os.cpu_count() or 1
    parallel = max(1, min(parallel, cores, len(combos) or 1))
    jobs_each = max(1, cores // parallel)
    facts = builder.ImageFacts()  # every image is asked once, before its combinations run
    run = {"dist": dist, "build_dir": build_dir, "jobs": jobs_each}
    cells = {c.id: prepare(m, c, passthrough, facts, run, image=image) for c in combos}
    logs = build_dir / "matrix"
    logs.mkdir(parents=True, exist_ok=True)
    log.info(
        f"▸ {len(combos)} combinations, {parallel} at a time ({jobs_each} compile jobs each); logs in {logs}/"
    )
    watch = runwatch.Watch(len(combos), heartbeat)
    index = {c.id: i for i, c in enumerate(combos, 1)}

    def one(combo: Combination) -> Result:
        def on_start(status_file: Path) -> None:
            watch.started(combo.id, index[combo.id], describe(combo, m, image), status_file)

        cell = cells[combo.id]
        result = cell if isinstance(cell, Result) else run_one(combo, cell, logs, on_start)
        watch.ended(
            combo.id,
            index[combo.id],
            result.status,
            result.seconds,
            result.wheel if result.status in ("built", "cached") else result.detail,
        )
        return result

    stop = watch.pulse()
    try:
        with ThreadPoolExecutor(max_workers=parallel) as pool:
            return list(pool.map(one, combos))  # in the combinations' order
    finally:
        stop()


def describe(combo: Combination, m: matrix.Matrix | None = None, image: str | None = None) -> str:
    """What a start line says of a combination: Python, torch (+ torch_npu, CANN), arch, ref, where it builds."""
    where = None
    if m is not None:
        with contextlib.suppress(ApexkitError):
            where = image_for(m, combo, image=image)
    parts = [
        f"Python {combo.python}",
        f"torch {combo.torch}",
        combo.torch_npu and f"torch_npu {combo.torch_npu}",
        combo.cann and f"CANN {combo.cann}",
        combo.arch,
        f"ref {combo.ref}",
        where and f"in {where}",
    ]
    return ", ".join(p for p in parts if p)


# --- the matrix on a Slurm cluster (--run --slurm) -----------------------------------------------------------------

SLURM_POLL = (
    5.0  # seconds between squeue calls while waiting ($APEXKIT_SLURM_POLL, read when a run starts)
)


def _per_arch(
    values: list[str], option: str, default: dict[str, str | None]
) -> dict[str, str | None]:
    """`--slurm-partition NAME` (every arch) / `ARCH=NAME` (that arch), repeatable; `none` drops it."""
    chosen = dict(default)
    for value in values:
        arch, sep, rest = value.partition("=")
        if sep and arch in ("x86_64", "aarch64"):
            chosen[arch] = rest
        elif sep and arch and not any(c in arch for c in "|&,[]*"):
            raise ConfigError(
                f"{option} {value}: {arch} is not an arch", f"write {option} x86_64=… or aarch64=…"
            )
        else:
            chosen = {a: value for a in ("x86_64", "aarch64")}
    return {a: (None if v in (None, "", "none") else v) for a, v in chosen.items()}


@dataclass(frozen=True)
class SlurmOptions:
    partition: dict  # arch -> partition or None
    constraint: dict  # arch -> node feature expression or None
    account: str | None = None
    time_limit: str = "02:00:00"
    cpus: int | None = None
    python: str = sys.executable
    node_build_dir: str | None = None  # None: the shared --build-dir
    extra: tuple[str, ...] = ()


def slurm_options(args: Matrix) -> SlurmOptions:
    if args.image:
        raise ConfigError(
            "--image with --slurm: on the cluster each combination builds natively on a node of its "
            "arch, not in a builder image",
            "drop --image (or build here without --slurm)",
        )
    for option in (
        "slurm_partition",
        "slurm_constraint",
        "slurm_sbatch",
        "slurm_account",
        "slurm_time",
    ):
        values = getattr(args, option)
        for value in values if isinstance(values, list) else [values]:
            if value is not None and ("\n" in value or "\r" in value):
                raise ConfigError(
                    f"--{option.replace('_', '-')} {value!r}: one line (it becomes an #SBATCH line)",
                    f"pass --{option.replace('_', '-')} without line breaks",
                )
    if args.slurm_cpus is not None and args.slurm_cpus < 1:
        raise ConfigError(
            f"--slurm-cpus {args.slurm_cpus}: must be at least 1",
            "pass --slurm-cpus 8, or leave it out",
        )
    return SlurmOptions(
        partition=_per_arch(
            args.slurm_partition, "--slurm-partition", {"x86_64": None, "aarch64": None}
        ),
        constraint=_per_arch(
            args.slurm_constraint, "--slurm-constraint", {"x86_64": "x86_64", "aarch64": "aarch64"}
        ),
        account=args.slurm_account,
        time_limit=args.slurm_time,
        cpus=args.slurm_cpus,
        python=args.slurm_python or sys.executable,
        node_build_dir=args.slurm_build_dir,
        extra=tuple(args.slurm_sbatch),
    )


def batch_script(
    combo: Combination, cell: BuildOptions, stage: Path, logs: Path, opts: SlurmOptions
) -> str:
    """The batch script of one cell (pure): one task on one node of its arch, `apexkit build --options-json` from
    the checkout with the options resolved here (<stage>/options-<id>.json; the compile jobs, unless the
    passthrough options said --jobs, are the node's: $SLURM_CPUS_PER_TASK, else nproc) into <stage>/dist-<id>;
    the output is build/matrix/<id>.log, as for a local run."""
    q = shlex.quote
    arch = combo.arch
    lines = [
        "#!/bin/bash",
        *slurm.batch_header(
            [
                ("job-name", f"apexkit-{combo.id}"),
                ("partition", opts.partition.get(arch)),
                ("constraint", opts.constraint.get(arch)),
                ("nodes", 1),
                ("ntasks", 1),
                ("cpus-per-task", opts.cpus),
                ("account", opts.account),
                ("time", opts.time_limit),
                ("export", "ALL"),
                ("chdir", matrix.PROJECT_ROOT),
                ("output", logs / (combo.id + ".log")),
            ],
            opts.extra,
        ),
    ]
    lines += [
        f"# apexkit matrix: {combo.id} on one {arch} node, from the checkout {matrix.PROJECT_ROOT} (shared "
        "storage), into the shared staging directory; the submitting process copies the wheel into dist/",
        "set -u",
        f"cd {q(str(matrix.PROJECT_ROOT))} || exit 3",
        'echo "+ apexkit matrix: '
        + combo.id
        + " on ${SLURMD_NODENAME:-$(hostname)} ($(uname -m)), job "
        '${SLURM_JOB_ID:-?}"',
        f'if [ "$(uname -m)" != {q(arch)} ]; then',
        f"  echo \"error: node ${{SLURMD_NODENAME:-$(hostname)}} is $(uname -m), not {arch} (fix the node's "
        f'features or --slurm-constraint/--slurm-partition)"; exit 3',
        "fi",
        f"rm -rf {q(str(stage / ('dist-' + combo.id)))} {q(str(status_path(stage, combo)))}",
        f"export {statusfile.VARIABLE}={q(str(status_path(stage, combo)))}",
        'export APEXKIT_JOBS="${SLURM_CPUS_PER_TASK:-$(nproc)}"',
        "exec " + " ".join(q(a) for a in child_argv(opts.python, cell, options_path(stage, combo))),
        "",
    ]
    return "\n".join(lines)


def status_path(stage: Path, combo: Combination) -> Path:
    """Where a job's `apexkit build` records how it ended (apexkit.statusfile), on the shared staging directory."""
    return stage / f"status-{combo.id}.json"


def options_path(stage: Path, combo: Combination) -> Path:
    """Where a job's build options lie (0600), on the shared staging directory."""
    return stage / f"options-{combo.id}.json"


def planned_targets(
    m: matrix.Matrix,
    combo: Combination,
    passthrough: Sequence[str] = (),
    cell: BuildOptions | None = None,
) -> Callable[..., dict[str, dict]]:
    """The dist/<target> ids a job for `combo` may leave, from this host's own plan of its options (`cell`, else
    resolved from the passthrough options): buildplan.expected_targets on the combination's arch; ConfigError when
    there is none."""
    from apexkit.wheel import buildplan

    if cell is None:
        cell = resolve_cell(m, combo, passthrough, {}, host=combo.arch)
    planned = functools.partial(buildplan.expected_targets, cell, m, combo.arch)
    planned()
    return planned


def collect(
    stage_dist: Path,
    combo: Combination,
    dist: Path,
    job: dict,
    force: bool,
    expected: str | None = None,
    planned: Callable[..., dict[str, dict]] | None = None,
) -> tuple[Path, dict]:
    """Copy the one dist/<target>/ a job left in <stage>/dist-<id>/ into dist/, by the rules for what another party
    wrote (untrusted.py): real directories, regular files opened without following links, wheel.file a plain wheel
    name, the wheel copied and re-hashed here and matching its manifest; dist/<target> swapped in whole and never
    over a target built from other inputs (distdir.replace_dir / check_overwrite). Untrusted or ConfigError."""
    from apexkit.images.container import TARGET_NAME
    from apexkit.wheel import distdir

    if not os.path.lexists(stage_dist):
        raise untrusted.Untrusted(f"the job ended without error but left nothing in {stage_dist}")
    stage_fd = untrusted.open_dir(stage_dist)
    try:
        names = sorted(n for n in os.listdir(stage_fd) if not n.startswith("."))
        if len(names) != 1:
            raise untrusted.Untrusted(
                f"{len(names)} entries in {stage_dist} ({', '.join(map(untrusted.shown, names[:5]))})"
                f", expected one dist/<target>/"
            )
        target = names[0]
        if not TARGET_NAME.fullmatch(target):
            raise untrusted.Untrusted(f"{untrusted.shown(target)} is not a target name")
        if expected is not None and target != expected:
            raise untrusted.Untrusted(
                f"it left {untrusted.shown(target)}, its status file names "
                f"{untrusted.shown(expected)}"
            )
        target_fd = untrusted.open_dir(target, stage_fd)
    finally:
        os.close(stage_fd)
    try:
        manifest, name = distdir.read_manifest(target_fd)
        wheel = manifest["wheel"]
        # which dist/<target> it replaces is this host's to say: its own plan of the combination and passthrough
        # options (+skip-…, the node's CANN: +npu…), the manifest's python/torch/arch matching; the host's identity
        distdir.check_planned(target, manifest, planned or planned_targets(matrix.load(), combo))
        src = untrusted.open_regular(name, target_fd)
    finally:
        os.close(target_fd)
    dist.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target}.slurm-", dir=dist))
    try:
        try:
            sha, size = untrusted.copy_fd(src, tmp / name)
        finally:
            os.close(src)
        if sha != wheel["sha256"]:
            raise untrusted.Untrusted(
                f"{untrusted.shown(name)} has sha256 {sha[:16]}…, its manifest says "
                f"{untrusted.shown(wheel['sha256'][:16])}"
            )
        untrusted.check_zip(tmp / name)
        manifest["wheel"] = {**wheel, "file": name, "sha256": sha, "size": size}
        manifest["slurm"] = job
        final = distdir.replace_dir(dist, target, {name: tmp / name}, manifest, force=force)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final, manifest


def _failure_cause(status: statusfile.Status | None, info: dict) -> str:
    """The build's one-line error from the job's status file, else its state and exit code."""
    state, code = info.get("JobState", "UNKNOWN"), info.get("ExitCode", "")
    said = {
        "CANCELLED": "cancelled (scancel, or the node went away)",
        "TIMEOUT": "killed at its time limit (--slurm-time)",
        "NODE_FAIL": "lost its node",
        "OUT_OF_MEMORY": "killed: out of memory",
        "PREEMPTED": "preempted",
        "UNKNOWN": "no longer known to Slurm",
    }.get(state.split()[0], state)
    where = f" on {info['NodeList']}" if info.get("NodeList") not in (None, "", "(null)") else ""
    head = f"job {info.get('JobId', '')}".strip()
    text = f"{head}{where} {said}" + (f" (exit {code})" if state == "FAILED" and code else "")
    return (f"{text}: {status.error}" if status is not None and status.error else text)[:300]


def run_slurm(
    m: matrix.Matrix,
    combos: list[Combination],
    passthrough: list[str],
    dist: Path,
    build_dir: Path,
    opts: SlurmOptions,
    dry_run: bool = False,
) -> list[Result]:
    """One sbatch job per valid combination (on a node of its arch), then wait and collect each job's wheel into
    dist/; refused combinations are never submitted; a failed, cancelled or timed-out job is a failed row."""

    logs = build_dir / "matrix"
    stage = logs / "slurm" / (time.strftime("run-%Y%m%d-%H%M%S-", time.gmtime()) + str(os.getpid()))
    results, cells, planned = _sort_out(
        m,
        combos,
        passthrough,
        stage,
        matrix.PROJECT_ROOT / opts.node_build_dir if opts.node_build_dir else build_dir,
    )
    todo = [c for c in combos if c.id in cells]
    refused = [
        f"✕ {c.id}: refused, not submitted — {results[c.id].detail}"
        for c in combos
        if c.id in results
    ]
    if dry_run:
        for line in refused:
            log.info(line)
        for combo in todo:
            print(f"# ---- {combo.id}: {stage / (combo.id + '.sbatch')}")
            print(batch_script(combo, cells[combo.id], stage, logs, opts), end="")
            text = log.mask(options.child_json(cells[combo.id]).decode())
            print(
                f"# {options_path(stage, combo)}:\n"
                + "".join(f"# {x}\n" for x in text.splitlines())
            )
        return []
    slurm.check_slurm()
    poll = envvars.number(os.environ, "APEXKIT_SLURM_POLL", SLURM_POLL, low=0.1, high=600.0)
    watch = runwatch.Watch(len(combos), runwatch.interval(os.environ))
    index = {c.id: i for i, c in enumerate(combos, 1)}
    stage.mkdir(parents=True, exist_ok=True)
    jobs: dict[str, Combination] = {}
    submitted_at: dict[str, float] = {}
    log.info(
        f"▸ {len(combos)} combinations: {len(todo)} to submit to Slurm, {len(combos) - len(todo)} refused; "
        f"logs in {logs}/, batch scripts in {stage}/"
    )
    for line in refused:
        log.info(f"  {line}")

    def started(job_id: str, combo: Combination) -> None:
        watch.started(combo.id, index[combo.id], f"job {job_id}", status_path(stage, combo))

    def ended(job_id: str, combo: Combination) -> None:
        watch.forget(combo.id)
        elapsed = time.monotonic() - submitted_at[job_id]
        options_path(stage, combo).unlink(missing_ok=True)
        results[combo.id] = _finish(
            combo, job_id, stage, dist, logs, cells[combo.id].force, elapsed, planned[combo.id]
        )

    try:
        for combo in todo:
            script = stage / f"{combo.id}.sbatch"
            fsedit.atomic_write(
                options_path(stage, combo), options.child_json(cells[combo.id]), 0o600
            )
            script.write_text(batch_script(combo, cells[combo.id], stage, logs, opts))
            job_id = _submit(script, combo, logs, opts, results)
            if job_id is not None:
                jobs[job_id] = combo
                submitted_at[job_id] = time.monotonic()
        _poll(dict(jobs), watch, started, ended, poll)
    except (
        BaseException
    ):  # Ctrl-C or a lost controller: the jobs this run submitted do not outlive it
        left = [j for j, c in jobs.items() if c.id not in results]
        if left:
            log.warn(f"cancelling job(s) {', '.join(left)}")
            slurm.scancel(left)
        raise
    return [results[c.id] for c in combos]


def _sort_out(
    m: matrix.Matrix,
    combos: list[Combination],
    passthrough: list[str],
    stage: Path,
    node_build_dir: Path,
) -> tuple[dict[str, Result], dict[str, BuildOptions], dict[str, Callable[..., dict[str, dict]]]]:
    """(the refused combinations' rows, the build options of each to submit, what each job may leave by this host's
    plan): each job builds natively on its node into <stage>/dist-<id>, with the node's compile jobs."""
    refused: dict[str, Result] = {}
    cells: dict[str, BuildOptions] = {}
    planned = {}
    for combo in combos:
        cell = prepare(
            m,
            combo,
            passthrough,
            None,
            {
                "dist": stage / f"dist-{combo.id}",
                "build_dir": node_build_dir,
                "jobs": options.THEIR_JOBS,
            },
            combo.arch,
        )
        if isinstance(cell, BuildOptions):
            try:
                planned[combo.id] = planned_targets(m, combo, cell=cell)
                cells[combo.id] = cell
                continue
            except ConfigError as exc:
                cell = Result(combo.id, "refused", detail=exc.cause)
        refused[combo.id] = cell
    return refused, cells, planned


def _submit(
    script: Path, combo: Combination, logs: Path, opts: SlurmOptions, results: dict[str, Result]
) -> str | None:
    """sbatch the combination's script: its job id, or None with its failed row in `results`."""
    (logs / f"{combo.id}.log").unlink(missing_ok=True)  # Slurm appends to an existing --output
    job_id, why = slurm.sbatch(script)
    asked = ", ".join(
        f"{what} {value}"
        for what, value in (
            ("partition", opts.partition.get(combo.arch)),
            ("constraint", opts.constraint.get(combo.arch)),
        )
        if value
    )
    if job_id is None:
        why = (
            f"{why} (asked for: {asked or 'any node'}; is there a {combo.arch} node? see sinfo -o '%P %f %N'"
            f", --slurm-partition/--slurm-constraint)"
        )
        results[combo.id] = Result(
            combo.id, "failed", detail=f"not submitted: {why}", log=str(script)
        )
        log.info(f"  ✕ {combo.id}: sbatch refused it — {why}")
        return None
    log.info(f"  ⋯ {combo.id}: job {job_id} ({combo.arch}{', ' + asked if asked else ''})")
    return job_id


def _poll(
    waiting: dict[str, Combination],
    watch: runwatch.Watch,
    started: Callable[[str, Combination], None],
    ended: Callable[[str, Combination], None],
    poll: float,
) -> None:
    """Ask squeue every `poll` seconds until no job of `waiting` is queued: each change of state is one line (the
    first RUNNING is `started`: from then on its heartbeat names its build's step), a job that left is `ended`."""
    seen: dict[str, str] = {}
    ran: set[str] = set()
    while waiting:
        live = slurm.queue_states(list(waiting))
        for job_id, combo in list(waiting.items()):
            state = live.get(job_id)
            if state is None:
                del waiting[job_id]
                ended(job_id, combo)
            elif seen.get(job_id) != state:
                seen[job_id] = state
                if state == "RUNNING" and job_id not in ran:
                    ran.add(job_id)
                    started(job_id, combo)
                else:
                    watch.say(f"  ⋯ {combo.id}: job {job_id} {state}")
        if waiting:
            watch.beat()
            time.sleep(poll)


def _finish(
    combo: Combination,
    job_id: str,
    stage: Path,
    dist: Path,
    logs: Path,
    force: bool,
    waited: float,
    planned: Callable[..., dict[str, dict]] | None = None,
) -> Result:
    info = dict(slurm.job_info(job_id), JobId=job_id)
    log_path = logs / f"{combo.id}.log"
    seconds = slurm.slurm_seconds(info.get("RunTime")) or waited
    node = info.get("BatchHost") or info.get("NodeList") or ""
    try:
        status = statusfile.read(status_path(stage, combo))
        status_problem = ""
    except untrusted.Untrusted as exc:
        status, status_problem = None, str(exc)
    if (
        info.get("JobState") != "COMPLETED"
        or info.get("ExitCode", "0:0") != "0:0"
        or status_problem
    ):
        refusing = f"; refusing its status file: {status_problem}" if status_problem else ""
        result = Result(
            combo.id,
            "failed",
            seconds,
            (_failure_cause(status, info) + refusing)[:300],
            log=str(log_path),
            extra={"job_id": job_id, "node": node, "state": info.get("JobState")},
        )
    else:
        job = {"job_id": job_id, "node": node, "state": "COMPLETED", "run_seconds": seconds}
        expected = (
            Path(status.target_dir).name if status is not None and status.target_dir else None
        )
        try:
            final, manifest = collect(
                stage / f"dist-{combo.id}", combo, dist, job, force, expected, planned
            )
        except untrusted.Untrusted as exc:
            result = Result(
                combo.id,
                "failed",
                seconds,
                f"job {job_id} on {node}: refusing what it left in "
                f"{stage / ('dist-' + combo.id)}: {exc}"[:300],
                log=str(log_path),
                extra=job,
            )
        except ApexkitError as exc:
            result = Result(
                combo.id, "failed", seconds, exc.format()[:300], log=str(log_path), extra=job
            )
        else:
            shutil.rmtree(stage / f"dist-{combo.id}", ignore_errors=True)
            status_path(stage, combo).unlink(missing_ok=True)
            wheel = manifest["wheel"]
            result = Result(
                combo.id,
                "cached" if manifest.get("cache_hit") else "built",
                seconds,
                str(final),
                wheel["file"],
                wheel["size"],
                wheel["sha256"],
                bool(manifest.get("cache_hit")),
                str(log_path),
                extra=job,
                steps=runreport.step_timings(manifest),
            )
    mark = "✓" if result.status in ("built", "cached") else "✕"
    log.info(
        f"  {mark} {combo.id}: {result.status} on {node or '?'} (job {job_id}, "
        f"{log.format_seconds(result.seconds)})"
        + (f" — {result.detail}" if result.status == "failed" else "")
    )
    return result


def cells(results: list[Result], combos: list[Combination]) -> list[runreport.Cell]:
    """The results as the grid and the timeline see them (each with its combination's Python, torch, arch)."""
    by_id = {c.id: c for c in combos}
    return [
        runreport.Cell(
            r.id,
            c.python,
            c.torch,
            c.torch_npu or "",
            c.arch,
            r.status,
            r.wheel,
            r.detail,
            r.steps,
            c.cann or "",
            c.ref,
        )
        for r in results
        if (c := by_id.get(r.id)) is not None
    ]


def report_markdown(results: list[Result], combos: list[Combination]) -> tuple[str, str]:
    """(summary.md's text, the part printed on the terminal): the grid, the per-combination table, the timeline."""
    found = cells(results, combos)
    shown = runreport.grid(found) + "\n\n### Combinations\n\n" + summary(results)
    return shown + "\n\n" + runreport.timeline(found), shown


def summary(results: list[Result]) -> str:
    lines = [
        "| combination | wheel | size | sha256 | build time | cache hit |",
        "|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {r.id} | {r.status.upper()}: {r.detail} | | | {log.format_seconds(r.seconds) if r.seconds else ''} | |"
        if r.status in ("refused", "failed")
        else f"| {r.id} | {r.wheel} | {r.size / 1024:.0f} KiB | {r.sha256[:12]} | "
        f"{log.format_seconds(r.seconds)} | {'yes' if r.cache_hit else 'no'} |"
        for r in results
    ]
    return "\n".join(lines)


@dataclass(frozen=True)
class Matrix:
    """the build matrix: list, GitHub JSON, or run it"""

    format: str = declare.option(
        "table",
        "table (default), json (every field, refused ones too), github (strategy.matrix; a refused "
        "combination fails it, see --allow-refused), markdown (for $GITHUB_STEP_SUMMARY, refused ones first)",
        choices=("table", "json", "github", "markdown"),
    )
    allow_refused: bool = declare.option(
        False,
        "with --format github: leave refused combinations "
        "out of the matrix and exit 0 (default: exit 1 naming them, so CI cannot lose a combination)",
    )
    matrix: Path | None = declare.option(
        None,
        "a TOML file with [[include]] tables instead of matrix.toml [[matrix.include]]",
        metavar="FILE",
        type=Path,
    )
    only: list[str] = declare.option(
        None, "only this combination (repeat)", flag="--target", repeat=True, metavar="ID"
    )
    run: bool = declare.option(False, "build the combinations here and print a summary")
    image: str | None = declare.option(
        None,
        "build every combination in this builder image (default: a "
        "combination of another arch builds in the image matrix.toml [matrix.images] names for its Python)",
        metavar="IMAGE",
    )
    parallel: int = declare.option(
        1,
        "with --run: combinations "
        "built at the same time (bounded by the CPU count; each build's compile jobs: -- --jobs N)",
        metavar="N",
        type=int,
    )
    dist: Path | None = declare.option(
        None,
        "with --run: output directory (default: $APEXKIT_DIST_DIR, else ./dist)",
        metavar="DIST",
        type=Path,
    )
    build_dir: Path | None = declare.option(
        None,
        "with --run: work directory (default: $APEXKIT_BUILD_DIR, else ./build)",
        metavar="BUILD_DIR",
        type=Path,
    )
    slurm: bool = declare.option(
        False,
        "with --run: submit each combination to Slurm as one job "
        "on a node of its arch (the checkout and --build-dir on shared storage), wait, and collect the "
        "wheels into --dist",
    )
    dry_run: bool = declare.option(
        False, "with --run --slurm: print the batch scripts, submit nothing"
    )
    slurm_partition: list[str] = declare.option(
        None,
        "the partition (for every arch, or ARCH=NAME for one; repeat)",
        repeat=True,
        metavar="[ARCH=]NAME",
    )
    slurm_constraint: list[str] = declare.option(
        None,
        "the node "
        "feature a combination's node must have (default: its arch, x86_64 / aarch64; ARCH=none or none: "
        "no constraint, e.g. with a per-arch --slurm-partition)",
        repeat=True,
        metavar="[ARCH=]EXPR",
    )
    slurm_account: str | None = declare.option(None, "sbatch --account", metavar="A")
    slurm_time: str = declare.option(
        "02:00:00", "each job's time limit (default 02:00:00)", metavar="T"
    )
    slurm_cpus: int | None = declare.option(
        None,
        "sbatch --cpus-per-task (the build's --jobs); "
        "default: the partition's, and the build uses the node's CPU count",
        metavar="N",
        type=int,
    )
    slurm_python: str | None = declare.option(
        None,
        "the interpreter on the nodes "
        "that runs apexkit (default: this one, a venv on shared storage)",
        flag="--slurm-interpreter",
        metavar="PATH",
    )
    slurm_build_dir: str | None = declare.option(
        None,
        "each job's --build-dir (default: --build-dir, shared; "
        "a node-local one such as /tmp/apexkit-build avoids the shared filesystem for compiling)",
        metavar="DIR",
    )
    slurm_sbatch: list[str] = declare.option(
        None,
        "another sbatch option for every job, e.g. --slurm-sbatch=--qos=build (repeat)",
        repeat=True,
        metavar="OPT",
    )


def parser() -> argparse.ArgumentParser:
    """matrix's parser, generated from Matrix, plus the build options after -- (passed to every build)."""
    p = declare.parser(COMMAND, vocab.prog("matrix"))
    p.add_argument(
        "build_options",
        nargs="*",
        help="after --: passed to every build (e.g. -- --wheelhouse DIR)",
    )
    return p


def parse(argv: list[str]) -> tuple[Matrix, list[str]]:
    """matrix's options and the build options after --."""
    given = vars(parser().parse_args(argv))  # make reads the declared options only
    return declare.make(COMMAND, given), given["build_options"]


def main(argv: list[str]) -> int:
    # the table refresher is a maintainers' tool now (tools/refresh.py)
    if "--refresh" in argv:
        raise ConfigError(
            "matrix --refresh moved: refreshing matrix.toml's torch_npu table is a maintainers' tool",
            "run nox -s refresh -- [--write] in a checkout of apexkit",
        )
    return run(*parse(argv))


def run(args: Matrix, passthrough: list[str]) -> int:
    """`apexkit matrix`: the matrix shown, or built (here or on Slurm), `passthrough` (after --) given to every build."""
    m, combos = load_combinations(args.matrix)
    # --target: a combination's id (its session name) or the target id its build writes
    unknown = sorted(set(args.only or ()) - {c.id for c in combos} - {c.target_id for c in combos})
    if unknown:
        raise ConfigError(
            f"--target {', '.join(unknown)}: not in the matrix",
            f"ids: {', '.join(c.id for c in combos)} (or their target ids, as in dist/)",
        )
    combos = [c for c in combos if not args.only or c.id in args.only or c.target_id in args.only]
    if (args.slurm or args.dry_run) and not args.run:
        raise ConfigError(
            f"{'--slurm' if args.slurm else '--dry-run'} is for --run",
            f"add --run ({vocab.command('matrix', '--run --slurm [--dry-run]')})",
        )
    if not args.run:
        show(m, combos, args.format, args.image, args.allow_refused)
        return 0
    if args.parallel < 1:
        raise ConfigError(
            f"--parallel {args.parallel}: must be at least 1", "pass --parallel 1 or more"
        )
    (
        dist,
        build_dir,
    ) = (  # judged before any cell runs, made by the cells (a run that stops at once makes none)
        cachetrust.trusted_output(given.resolve(), setting, make=False)
        for given, setting in (
            (args.dist or paths.dist_dir(), paths.DIST_SETTING),
            (args.build_dir or paths.build_dir(), paths.BUILD_SETTING),
        )
    )
    results = _build(m, combos, args, passthrough, dist, build_dir)
    if results is None:  # a dry run: the batch scripts printed
        return 0
    write_reports(build_dir / "matrix", results, combos)
    bad = [r for r in results if r.status in ("refused", "failed")]
    if bad:
        raise MatrixError(
            f"{len(bad)} of {len(results)} combinations did not build "
            f"({', '.join(f'{r.id}: {r.status}' for r in bad)})",
            f"see the summary above and {build_dir / 'matrix'}/<id>.log",
        )
    return 0


COMMAND = declare.Command("matrix", Matrix, run, rest=True)


def show(
    m: matrix.Matrix, combos: list[Combination], form: str, image: str | None, allow_refused: bool
) -> None:
    """The matrix as a table, JSON, Markdown or a GitHub Actions matrix (refused rows stop that one)."""
    # the GitHub matrix (and its summary) is for another machine's daemon: only the table and JSON ask this one
    facts = None if form in ("github", "markdown") else builder.ImageFacts()
    table = rows(m, combos, facts, image=image)
    refused = refusals(table) if form == "github" else []
    if refused and not allow_refused:
        raise MatrixError(
            f"{len(refused)} of {len(table)} combinations refused: "
            + "; ".join(f"{rid}: {why}" for rid, why in refused),
            f"fix or remove those rows ({vocab.command('matrix')} shows every row), or pass --allow-refused "
            "to build the others",
        )
    writers: dict[str, Callable[[list[dict]], str]] = {
        "github": github,
        "markdown": markdown,
        "json": functools.partial(json.dumps, indent=1),
    }
    if form in writers:
        print(writers[form](table))
    else:
        print_table(table, facts)


def _build(
    m: matrix.Matrix,
    combos: list[Combination],
    args: Matrix,
    passthrough: list[str],
    dist: Path,
    build_dir: Path,
) -> list[Result] | None:
    """Every combination built, on Slurm or here; None after a dry run (which only prints the batch scripts)."""
    if args.slurm:
        results = run_slurm(
            m, combos, passthrough, dist, build_dir, slurm_options(args), dry_run=args.dry_run
        )
        return None if args.dry_run else results
    if args.dry_run:
        raise ConfigError(
            "--dry-run is for --run --slurm (it prints the batch scripts)",
            "add --slurm, or drop --dry-run",
        )
    heartbeat = runwatch.interval(os.environ)  # checked before anything runs
    return run_all(
        m,
        combos,
        passthrough,
        dist,
        build_dir,
        args.parallel,
        image=args.image,
        heartbeat=heartbeat,
    )


def write_reports(where: Path, results: list[Result], combos: list[Combination]) -> None:
    """summary.md (grid, table, timeline; timeline.png when matplotlib imports here), summary.json, the grid and
    table on the terminal, and the same Markdown appended to $GITHUB_STEP_SUMMARY when it names a file."""
    cachetrust.trusted_output(where, paths.BUILD_SETTING)  # made now, ours alone, or refused
    text, shown = report_markdown(results, combos)
    png = where / "timeline.png"
    why_not = runreport.draw_timeline(cells(results, combos), png)
    if why_not is None:
        text += "\n\n(the same timeline drawn: timeline.png beside this file)"
    else:
        with contextlib.suppress(OSError):
            png.unlink()  # an earlier run's picture is not this run's
    fsedit.atomic_write(where / "summary.md", (text + "\n").encode(), 0o644)
    fsedit.atomic_write(
        where / "summary.json",
        (json.dumps([r.__dict__ for r in results], indent=1) + "\n").encode(),
        0o644,
    )
    log.info(shown)
    log.info(
        f"timeline: {where / 'summary.md'}"
        + (f", {png}" if why_not is None else f" (Markdown only: {why_not})")
    )
    problem = runreport.append_step_summary(text)
    if problem:
        log.warn(problem)


class MatrixError(ApexkitError):
    exit_code = 1
