"""apexkit's commands, each declared once (apexkit.edge): a frozen options dataclass (its docstring is the help,
its fields the options) and the function that runs it. `COMMANDS` lists them; from it come `apexkit <command>`
(apexkit.cli), the invoke tasks (tasks.py is `ns = commands.namespace()`), `apexkit --help`, completion and the
option tables of docs/commands.md (tools/docgen.py). The proxy, image and doctor commands declare their options
beside their functions (apexkit/{proxy,images,doctor}/cli.py); the others are here."""

from __future__ import annotations

import functools
import inspect
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Mapping

    from apexkit.wheel.cache import RemoteLookup
    from apexkit.wheel.options import BuildOptions

from apexkit import declare, envvars, up
from apexkit.declare import Command, fraction, json_option, option, whole_number
from apexkit.doctor import cli as doctorcli
from apexkit.errors import ConfigError
from apexkit.fleet import validate
from apexkit.images import cli as imagecli
from apexkit.index import signing
from apexkit.install import run as installrun
from apexkit.proxy import cli as proxycli
from apexkit.wheel import cachedirs

DRY_RUN = "print what would change; change nothing"
# options two or more commands share, declared once (pip's cmdoptions): each call is one more command's field
VENV = functools.partial(option, None, "the training venv (default: the active one, $VIRTUAL_ENV)")
CACHE_KINDS = functools.partial(
    option, None, "only these kinds, comma separated: venvs,git,wheels,uv,containers"
)


def fleet_results() -> Any:
    """RESULTS of fleet.status and fleet.report."""
    return option(None, "the results directory of fleet.submit", positional=True, convert=Path)


def trusted_key(rule: str) -> Any:
    """--trusted-key FILE, repeatable: `rule` says which wheel the command then installs."""
    return option(
        None,
        f"a trusted public key (NAME.pub): {rule}; repeat for several (default: $APEXKIT_TRUSTED_KEYS, else the "
        "user config's trusted_keys; docs/signing.md)",
        repeat=True,
        metavar="FILE",
    )


@dataclass(frozen=True)
class Build:
    """Build the Apex for Ascend wheel for one Python into dist/: invoke build [--image IMAGE] -- <build
    options>."""

    python: str | None = option(
        None,
        "target Python, e.g. 3.10 (default: matrix.toml [pythons] default)",
    )
    options: str | None = option(
        "",
        (
            'build options in one string, as for nox -s build-3.X -- (e.g. "--torch 2.13.0 --jobs 2";'
            ' "--help" lists them); options after a bare -- work too'
        ),
    )
    image: str | None = option(
        None,
        "build inside this builder image (invoke image.build makes one); the wheel lands in dist/",
    )


@dataclass(frozen=True)
class Publish:
    """Turn dist/ into a team index (apexkit install --index DIR; PEP 503 pages for pip) with an index.html
    grid, per-torch find-links pages and PEP 658 metadata."""

    dist: str | None = option(
        None,
        "built targets (default: $APEXKIT_DIST_DIR, else ./dist)",
    )
    index: str = option(
        "index",
        "index directory to write (default ./index)",
    )
    target: list[str] = option(
        None,
        "only this dist/<target-id> (repeat for several)",
        repeat=True,
    )
    split_by_torch: bool = option(
        False,
        (
            "one index per torch version (<index>/torch<version>/simple/), for indexes laid out that "
            "way before; not needed: wheel names carry their torch (apex-0.1+ascend.torchX.Y.Z-...)"
        ),
    )
    base_url: str | None = option(
        None,
        (
            "where the index will be served, for the install lines of its index.html (default: the "
            "index directory's file:// URI; no user:password@)"
        ),
    )
    coverage: bool = option(
        False,
        "also list the cells of matrix.toml that have no wheel in the index (stdout, Markdown)",
    )
    sign_key: str | None = option(
        None,
        (
            "sign each new wheel with this Ed25519 key (apexkit key generate; mode 0600): "
            "<wheel>.intoto.jsonl beside it (CI: $APEXKIT_SIGNING_KEY_PEM instead; docs/signing.md)"
        ),
        config="signing_key",
        metavar="FILE",
    )
    resign: bool = option(
        False,
        "sign every wheel already in the index again with the signing key (a key rotation); dist/ is not read",
    )
    dry_run: bool = option(
        False,
        "print what would be published",
    )


@dataclass(frozen=True)
class Install:
    """Install the one apexkit wheel that fits a venv (its Python, arch, glibc, torch, torch_npu, C++ ABI):
    looked up in the indexes and verified, else built; installed with the venv's pip --no-deps --no-index. torch
    and torch_npu never change; an apex that is not an apexkit wheel is refused."""

    venv: str | None = VENV()
    interpreter: str | None = option(
        None,
        "the training venv's python (instead of --venv)",
    )
    index: list[str] = option(
        None,
        (
            "an apexkit index to look the wheel up in: http(s):// (pip's proxy, CA and user:password@"
            " apply), file:// or a directory; repeat for several (default: $APEXKIT_INDEX)"
        ),
        repeat=True,
    )
    trusted_key: list[str] = trusted_key(
        "only a wheel whose signature (<wheel>.intoto.jsonl) verifies against one of these keys, signs the bytes "
        "downloaded and fits the venv is installed"
    )
    no_build: bool = option(
        False,
        "a miss is an error instead of a build",
    )
    publish_to: str | None = option(
        None,
        "after a build, add the built wheel to this directory index",
    )
    build_options: str | None = option(
        "",
        (
            'more options for the build on a miss, as for nox -s build-3.X -- (e.g. "--jobs 2 '
            '--wheelhouse DIR")'
        ),
    )
    dry_run: bool = option(False, DRY_RUN)
    as_json: bool = json_option()


@dataclass(frozen=True)
class FleetSubmit:
    """Validate (and benchmark) the wheel on every node through Slurm: one allocation, one srun step per node."""

    index: str | None = option(
        None,
        "the wheel index (invoke publish --index output) on shared storage, or its http(s) URL",
    )
    trusted_key: list[str] = trusted_key(
        "each node installs only a wheel whose signature verifies against one of them (with or without --venv)"
    )
    results: str = option(
        "fleet-results",
        "shared results directory the nodes write <node>.json into (default ./fleet-results)",
    )
    target: str | None = option(
        None,
        "the index's target to validate (default: its only one)",
    )
    stack: str | None = option(
        None,
        "a matrix.toml [stacks] name: its build in the index (torch_npu from the stack)",
    )
    device: str = option(
        "npu",
        "what each node must be ready for: npu (default), cuda or cpu",
    )
    partition: str | None = option(
        None,
        "Slurm partition (sbatch --partition)",
    )
    nodes: int | None = option(
        None,
        "number of nodes (sbatch --nodes); one srun step runs on each",
        convert=whole_number,
    )
    nodelist: str | None = option(
        None,
        "these nodes, comma separated (sbatch --nodelist)",
    )
    gres: str | None = option(
        None,
        "generic resources per node, passed through (e.g. npu:8)",
    )
    account: str | None = option(
        None,
        "Slurm account, passed through",
    )
    time_limit: str = option(
        "01:00:00",
        "job time limit (sbatch --time, default 01:00:00)",
    )
    bench: bool = option(
        False,
        (
            "also run a short bench/amp_bench.py (mlp, fp32) on each node: step time vs the fleet "
            "median"
        ),
    )
    bench_args: str | None = option(
        None,
        "more amp_bench.py arguments (implies --bench), e.g. '--scale 0.05'",
    )
    find_links: list[str] = option(
        None,
        "wheelhouse the nodes' pip reads for torch/torch_npu (repeat for several)",
        repeat=True,
    )
    torch_index_url: str | None = option(
        None,
        "index the nodes install torch from (e.g. https://download.pytorch.org/whl/cpu)",
    )
    extra_index_url: list[str] = option(
        None,
        "extra index for torch/torch_npu (repeat for several)",
        repeat=True,
    )
    node_python: str | None = option(
        None,
        "interpreter on the nodes (default python3.X of the target)",
        flag="--node-interpreter",
    )
    node_dir: str | None = option(
        None,
        (
            "node-local scratch for the venvs (default $TMPDIR/apexkit-fleet, expanded on each node, "
            "else /tmp/apexkit-fleet)"
        ),
    )
    set_env: str | None = option(
        None,
        "CANN set_env.sh files to try on the nodes, comma separated (default the toolkit's)",
    )
    keep_venv: bool = option(
        False,
        "keep each node's venv after the run",
    )
    venv: str | None = option(
        None,
        (
            "the training venv on the nodes (same path on each, or shared): up's way, the wheel goes "
            "in --no-deps and torch is kept; default a fresh venv per node"
        ),
    )
    resume: bool = option(
        False,
        "resubmit only the nodes of --results that have no result (same options as before)",
    )
    dry_run: bool = option(
        False,
        "print the batch script; submit nothing",
    )


@dataclass(frozen=True)
class FleetStatus:
    """The fleet's Slurm jobs (squeue/scontrol/sacct) and the stage each node is at."""

    results: Path = fleet_results()
    as_json: bool = json_option()


@dataclass(frozen=True)
class FleetReport:
    """One row per node: chip, driver, CANN, torch, torch_npu, wheel sha256, verdict, step time vs the median,
    first failing check + fix. Exit 1 when a node failed, died or did not report."""

    results: Path = fleet_results()
    as_json: bool = json_option()
    threshold: float | None = option(
        None,
        "flag step times further than this fraction from the median (default 0.10)",
        convert=fraction,
    )


@dataclass(frozen=True)
class CacheList:
    """List the cache's entries with their size on disk, last use and purpose (build and run venvs, git mirrors,
    wheel-cache entries, uv's cache, container caches), then the totals per kind."""

    what: str | None = CACHE_KINDS()
    as_json: bool = json_option()


@dataclass(frozen=True)
class CachePrune:
    """Remove old cache entries (whole ones; an entry a build holds is skipped). Selectors: --older-than DAYS
    (last used before), --keep-last N (the N most recent per kind stay); with none it refuses, never removing
    everything by default."""

    older_than: str | None = option(
        None,
        "remove entries last used more than this many days ago",
    )
    keep_last: str | None = option(
        None,
        "keep the N most recently used entries of each kind",
    )
    dry_run: bool = option(False, DRY_RUN)
    what: str | None = CACHE_KINDS()
    as_json: bool = json_option()


@dataclass(frozen=True)
class ConfigShow:
    """Show every source apexkit reaches (git URLs, indexes, mirrors, registries), its effective value and where
    it came from: flag, env NAME, project ./apexkit.toml, user ~/.config/apexkit/config.toml or default."""

    as_json: bool = json_option()


@dataclass(frozen=True)
class Up:
    """One node from bare to validated: [proxy check,] doctor, install (index hit or build), validate[, bench];
    one report (JSON + Markdown) of each stage's status, time, log and first failure with its fix. Stages
    already done for the same venv, torch and wheel are not run again. Exit 1 when a stage failed."""

    venv: str | None = VENV()
    interpreter: str | None = option(
        None,
        "the training environment's interpreter (instead of --venv)",
    )
    index: list[str] = option(
        None,
        (
            "index to install from, passed to apexkit install (repeat for several; default: "
            "install's, $APEXKIT_INDEX)"
        ),
        repeat=True,
    )
    trusted_key: list[str] = trusted_key(
        "passed on to apexkit install, which installs only a wheel whose signature (<wheel>.intoto.jsonl) "
        "verifies against one of these keys"
    )
    no_build: bool = option(
        False,
        "a wheel missing from the indexes fails install instead of building",
    )
    offline: bool = option(
        False,
        "a build on a miss is offline (no package index; git only from local mirrors): give --build-options "
        '"--wheelhouse DIR" or set wheelhouses',
    )
    build_options: str | None = option(
        "",
        'more options for install\'s build on a miss, as for nox -s build-3.X -- (e.g. "--wheelhouse DIR")',
    )
    proxy_check: bool = option(
        False,
        "first run invoke proxy.check (every layer, a real request)",
    )
    bench: bool = option(
        False,
        "last run the benchmark (nox -s bench) in the venv",
    )
    bench_args: str | None = option(
        None,
        "more bench/amp_bench.py options in one string (implies --bench)",
    )
    device: str = option(
        "auto",
        "what the venv must be ready for: npu, cuda or cpu (default: the one its torch finds -- npu where torch_npu "
        "and a CANN runtime answer, cuda where torch sees a GPU, else cpu -- said with why)",
    )
    report: str | None = option(
        None,
        "report directory (default reports/up/<venv name>/)",
    )
    force: bool = option(
        False,
        "run every stage, also those already done",
    )
    dry_run: bool = option(
        False,
        "print the stages and the command each would run; run and write nothing",
    )
    as_json: bool = json_option()


@dataclass(frozen=True)
class KeyGenerate:
    """Make the team's Ed25519 signing key pair: NAME.key (PEM PKCS#8, mode 0600; never over an existing file) and
    NAME.pub (PEM SubjectPublicKeyInfo, the one to trust); prints its key id (sha256 of the public key's DER)."""

    name: str = option(None, "the key's name: NAME.key and NAME.pub are written", positional=True)
    out: str = option(".", "directory to write them into (default: the current one)")
    dry_run: bool = option(False, DRY_RUN)


# --- the functions two commands need beyond their package's --------------------------------------------------------


def build_wheel(
    python: str,
    argv: list[str],
    prog: str = "nox -s build-3.X --",
    given: dict[str, object] | None = None,
) -> Path | None:
    """Every door to a wheel build (nox -s build-*, apexkit build, invoke build): resolve the options once (`given`:
    typed values, e.g. a matrix combination's, that argv may override), then build on this machine or, with --image,
    in a builder container. Returns the dist/<target-id>/ written (the status file records it), None for a dry run."""
    from apexkit.wheel import builder, options

    opts = options.resolve(python, argv, prog=prog, given=given)
    import dataclasses

    if (
        not opts.dry_run
    ):  # one trust rule for the whole cache, before a host or container build uses any of it
        from apexkit import cachetrust

        cachetrust.tighten_umask()
        opts = dataclasses.replace(opts, cache_dir=cachetrust.trusted(opts.cache_dir))
    if opts.image:
        from apexkit.images import container

        # the cache key is the container's to compute (its sources, its Python): no team index lookup there
        if opts.team_indexes:
            from apexkit import log

            log.info(
                "  team index: not asked for a build in a builder image (its own wheel cache is)"
            )
        built = container.run(dataclasses.replace(opts, team_indexes=()))
    else:
        built = builder.build(opts, remote=team_index_lookup(opts))
    return None if opts.dry_run else built


def team_index_lookup(
    opts: BuildOptions, env: Mapping[str, str] | None = None
) -> RemoteLookup | None:
    """The team indexes of `opts` as the build's cache after the local one (apexkit.index.remote.build_lookup), or
    None when none is asked (--no-cache, --no-team-index)."""
    if not opts.team_indexes or not opts.use_cache:
        return None
    from apexkit.index import remote, signing

    env = os.environ if env is None else env
    return remote.build_lookup(opts.team_indexes, env, signing.trusted_keys(opts.trusted_keys, env))


def build(o: Build, remainder: str = "") -> Path | None:
    python, image = o.python, o.image
    if python is None:
        from apexkit.plan import matrix

        python = matrix.load().default_python
    argv = (
        envvars.split_words(o.options or "", "--options")
        + envvars.split_words(remainder or "", "the build options")
        + (["--image", image] if image else [])
    )
    # the dist/<target>/ written: the edge records it in the status file (exit 0), as for nox and apexkit build
    return build_wheel(python, argv, prog=f"invoke build --python {python} --")


def publish(o: Publish) -> int:
    from apexkit import cachetrust, paths
    from apexkit.index import publish

    dist = Path(o.dist) if o.dist else paths.dist_dir(os.environ)
    publish.publish(  # the wheels publish serves come from a dist/ only we can write (--resign reads none)
        dist if o.resign else cachetrust.trusted_output(dist, paths.DIST_SETTING, make=False),
        Path(o.index),
        o.target or None,
        o.split_by_torch,
        o.dry_run,
        base_url=o.base_url or None,
        coverage=o.coverage,
        sign_key=o.sign_key or None,
        resign=o.resign,
    )
    return 0


def config_show(o: ConfigShow) -> int:
    """apexkit config.show: apexkit.config's table, with the defaults matrix.toml keeps (the git URLs)."""
    from apexkit import config
    from apexkit.plan import matrix

    m = matrix.load()
    return config.show(m.source_urls, o.as_json)


COMMANDS: tuple[Command, ...] = (
    Command("build", Build, build, rest=True),
    Command("proxy.setup", proxycli.Setup, proxycli.setup),
    Command("proxy.check", proxycli.Check, proxycli.check),
    Command("proxy.show", proxycli.Show, proxycli.show),
    Command("proxy.env", proxycli.Env, proxycli.env),
    Command("proxy.remove", proxycli.Remove, proxycli.remove),
    Command("image.build", imagecli.Build, imagecli.build),
    Command("image.list", imagecli.List, imagecli.list_images),
    Command("image.prune", imagecli.Prune, imagecli.prune),
    Command("image.emulation", imagecli.Emulation, imagecli.emulation),
    Command("doctor", doctorcli.Doctor, doctorcli.main),
    Command("publish", Publish, publish),
    Command("install", Install, declare.Spread(installrun.main, {"build": build_wheel})),
    Command("fleet.submit", FleetSubmit, declare.Spread(validate.submit_command)),
    Command("fleet.status", FleetStatus, declare.Spread(validate.status)),
    Command("fleet.report", FleetReport, declare.Spread(validate.report)),
    Command("cache.list", CacheList, declare.Spread(cachedirs.list_command)),
    Command("cache.prune", CachePrune, declare.Spread(cachedirs.prune_command)),
    Command("config.show", ConfigShow, config_show),
    Command("up", Up, declare.Spread(up.main)),
    Command("key.generate", KeyGenerate, declare.Spread(signing.generate)),
)
BY_NAME = {c.name: c for c in COMMANDS}
NAMES = tuple(BY_NAME)


def main(name: str, argv: list[str], prog: str) -> int:
    """`apexkit <name> [options]` (and nox -s install --): the declared command, parsed by argparse, run with errors
    as the CLI's (apexkit.exits)."""
    from apexkit.exits import exit_code

    command = BY_NAME[name]
    # argparse's SystemExit (--help 0, a usage error 2) is recorded by the edge (exits.settle), then on its way
    return exit_code(lambda: command.run(declare.make(command, declare.parse(command, argv, prog))))


AGAIN = "start the stage again with apexkit up (it writes this file)"


def run_options_file(path: str) -> int:
    """`python -m apexkit.commands FILE` (how `apexkit up` starts a stage): the declared command FILE names, run with
    its options ({"command": NAME, "options": {...}}, no argv parsed again), its end in $APEXKIT_STATUS_FILE."""
    from apexkit import untrusted
    from apexkit.exits import exit_code

    def run() -> object:
        try:
            data = untrusted.read_json_object(path, None, 1 << 20, "the options file")
        except (untrusted.Untrusted, OSError) as exc:
            raise ConfigError(f"{path} is not an apexkit options file ({exc})", AGAIN) from None
        name, given = data.get("command"), data.get("options")
        command = BY_NAME.get(name) if isinstance(name, str) else None
        options = declare.from_data(command, given) if command and isinstance(given, dict) else None
        if command is None or options is None:
            raise ConfigError(
                f"{path} is not an apexkit options file (a declared command and its own options, each of "
                "its kind)",
                AGAIN,
            )
        return command.run(options)

    return exit_code(run)


# --- invoke tasks: tasks.py is `ns = commands.namespace()` ---------------------------------------------------


def task(command: Command):
    """An invoke Task: its signature, help and iterable options from the declaration; errors as exits.run_task."""
    from invoke import Task

    from apexkit.exits import run_task

    def default(opt: declare.Opt) -> object:
        if opt.positional:
            return inspect.Parameter.empty
        # invoke passes what is typed as a str; a number is converted in the run (a bad one: one line)
        return opt.default if isinstance(opt.default, (bool, str)) else None

    params = [inspect.Parameter("c", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    params += sorted(  # required ones first, as Python wants
        (inspect.Parameter(o.name, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=default(o))
         for o in command.opts),
        key=lambda p: p.default is not inspect.Parameter.empty,
    )  # fmt: skip

    def body(c, **given):
        rest = (c.remainder or "",) if command.rest else ()
        run_task(lambda: command.run(declare.make(command, given), *rest))

    body.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]  # read by invoke
    body.__doc__ = command.doc
    short = command.name.rsplit(".", 1)[-1]
    return Task(body, name=short, help={o.name: o.help for o in command.opts},
                iterable=[o.name for o in command.opts if o.repeat],
                positional=None if any(o.positional for o in command.opts) else [],
                auto_shortflags=False)  # fmt: skip


def namespace():
    """The invoke Collection of every declared command (tasks.py's `ns`), a dotted name in its group's."""
    from invoke import Collection

    ns = Collection()
    groups: dict[str, Collection] = {}
    for command in COMMANDS:
        group = command.name.rpartition(".")[0]
        if group and group not in groups:
            groups[group] = Collection(group)
            ns.add_collection(groups[group])
        (groups[group] if group else ns).add_task(task(command))
    return ns


if __name__ == "__main__":  # a stage of `apexkit up` (run_options_file)
    import sys

    if len(sys.argv) != 2:
        print(
            "usage: python -m apexkit.commands OPTIONS.json (how apexkit up runs a stage)",
            file=sys.stderr,
        )
        sys.exit(2)
    sys.exit(run_options_file(sys.argv[1]))
