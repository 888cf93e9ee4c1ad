"""The invoke commands, declared once: each command's options (name, default, help), the function
it calls, and the one way an error becomes `error: ...` and an exit code. tasks.py is `ns = commands.namespace()`;
`apexkit proxy.setup ...` runs the same tasks (apexkit.cli).

An option's value reaches the function under `to` (default: its own name); `convert` turns invoke's string into
what the function takes."""

from __future__ import annotations

import importlib
import inspect
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import argparse
    from collections.abc import Mapping

    from apexkit.wheel.cache import RemoteLookup
    from apexkit.wheel.options import BuildOptions

from apexkit import envvars, netenv
from apexkit.errors import ConfigError

REQUIRED = (
    inspect.Parameter.empty
)  # an option without a default: a positional argument (also accepted as a flag)


@dataclass(frozen=True)
class Opt:
    name: str  # python name; the flag is --name with '-' for '_'
    help: str
    default: object = None
    to: str | None = None  # the function's keyword (default: name)
    repeat: bool = False  # may be given several times (a list)
    convert: Callable | None = None

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")


@dataclass(frozen=True)
class Command:
    name: str  # "proxy.setup"
    target: str  # "apexkit.proxy.cli:setup"
    doc: str
    options: tuple[Opt, ...] = ()
    extra: dict = field(default_factory=dict)  # fixed keywords for the function


PATH_OPTIONS = (
    Opt(
        "profile",
        "shell file for the block (default ~/.bashrc; with --system /etc/profile.d/apexkit-proxy.sh)",
    ),
    Opt("system", "system-wide files: /etc/profile.d/apexkit-proxy.sh and /etc/pip.conf", False),
    Opt(
        "root",
        "prefix for every path written or read (a test root standing for /); nothing is restarted",
    ),
)
JSON = Opt("json", "print JSON on stdout", False, to="as_json")
PROBE_DEFAULTS = Opt(
    "probe_defaults",
    "also probe the sources left at their default (gitcode.com, github.com, quay.io, ...), not only the "
    "ones configured (apexkit config.show)",
    False,
)
DRY_RUN = Opt("dry_run", "print what would change; change nothing", False)


def _layers(help_text: str) -> Opt:
    return Opt("layers", help_text, to="only")


def _int(value):
    try:
        return int(value) if value is not None else None
    except ValueError:
        raise ConfigError(f"{value!r} is not a number", "pass a whole number") from None


COMMANDS: tuple[Command, ...] = (
    Command(
        "build",
        "apexkit.commands:build",
        "Build the Apex for Ascend wheel for one Python into dist/: invoke build [--image IMAGE] -- <build options>.",
        (
            Opt("python", "target Python, e.g. 3.10 (default: matrix.toml [pythons] default)"),
            Opt(
                "options",
                'build options in one string, as for nox -s build-3.X -- (e.g. "--torch 2.13.0 --jobs 2"; '
                '"--help" lists them); options after a bare -- work too',
                "",
            ),
            Opt(
                "image",
                "build inside this builder image (invoke image.build makes one); the wheel lands in dist/",
            ),
        ),
    ),
    Command(
        "proxy.setup",
        "apexkit.proxy.cli:setup",
        "Configure the proxy in all three layers (shell, Docker daemon, containers) plus mirrors and a CA.",
        (
            Opt(
                "http",
                "proxy for http:// URLs, e.g. http://user:password@proxy:3128 (default: $http_proxy/$HTTP_PROXY)",
            ),
            Opt(
                "https", "proxy for https:// URLs (default: $https_proxy/$HTTPS_PROXY, else --http)"
            ),
            Opt(
                "no_proxy",
                "extra hosts/domains/CIDRs that bypass the proxy; localhost,127.0.0.0/8,::1 are always added",
            ),
            Opt(
                "ca_cert",
                "PEM file of a TLS-intercepting proxy's CA: a bundle (system CAs + it) is exported as "
                + ", ".join(netenv.CA_VARIABLES),
            ),
            Opt("pip_index", "pip index mirror written to pip.conf (the no-proxy path)"),
            Opt(
                "registry_mirror",
                "registry mirror for the Docker daemon (daemon.json registry-mirrors); repeat for "
                "several",
                repeat=True,
            ),
            _layers("comma-separated layers to touch: shell,daemon,container,pip (default: all)"),
            *PATH_OPTIONS,
            Opt(
                "daemon_mode",
                "auto (from the engine version), systemd (drop-ins) or daemon-json (Docker >= 23)",
                "auto",
            ),
            Opt("dry_run", "print the unified diff of every file; write nothing", False),
            Opt(
                "write_config",
                "also record --pip-index as index_url in the user config file "
                "(~/.config/apexkit/config.toml, mode 0600), so builds and image.build use it",
                False,
            ),
            Opt(
                "restart",
                "restart the Docker daemon under systemd after a daemon change (--no-restart: print the "
                "commands)",
                True,
            ),
        ),
    ),
    Command(
        "proxy.check",
        "apexkit.proxy.cli:check",
        "Check every layer: configured? effective? a real request through the proxy. Exit 1 when one fails.",
        (
            Opt(
                "index_url",
                "URL for the HTTPS probe (default: the pip mirror, $PIP_INDEX_URL, else "
                "https://pypi.org/simple/)",
            ),
            Opt(
                "image",
                "local image for the container probe (needs bash; default: the first apexkit/* image)",
            ),
            _layers("comma-separated layers: shell,daemon,container,sources"),
            PROBE_DEFAULTS,
            JSON,
            *PATH_OPTIONS,
        ),
    ),
    Command(
        "proxy.show",
        "apexkit.proxy.cli:show",
        "Show the saved settings and what each layer's files hold (passwords masked).",
        (JSON, *PATH_OPTIONS),
    ),
    Command(
        "proxy.env",
        "apexkit.proxy.cli:env",
        'Print export lines for the current shell, to eval there (eval "$(... proxy.env)" in bash).',
        (
            Opt("reveal", "print passwords even on a terminal", False),
            Opt("unset", "print unset lines instead", False),
            *PATH_OPTIONS,
        ),
    ),
    Command(
        "proxy.remove",
        "apexkit.proxy.cli:remove",
        "Undo proxy.setup: files restored from backups, your own content byte-identical.",
        (
            _layers("comma-separated layers to undo (default: all)"),
            Opt("dry_run", "print the diffs; write nothing", False),
            *PATH_OPTIONS,
        ),
    ),
    Command(
        "image.build",
        "apexkit.images.cli:build",
        "Build a builder image: the base + toolchain (its own package manager), tool venv, non-root user, CA hook.",
        (
            Opt(
                "arch",
                "x86_64 or aarch64 (amd64/arm64 accepted); a foreign arch runs through QEMU binfmt "
                "(image.emulation)",
                REQUIRED,
            ),
            Opt(
                "base",
                "base image: a local or pullable reference (openeuler/openeuler:22.03, ubuntu:22.04, a MindIE "
                "image), or debootstrap[:suite] to make a Debian base here without a registry",
                REQUIRED,
            ),
            Opt("tag", "image name (default apexkit/builder:<base>-<arch>)"),
            Opt(
                "network",
                "network for RUN steps, e.g. host (automatic when the proxy listens on this host's "
                "loopback)",
            ),
            Opt(
                "ca_cert",
                "PEM file of CA certificates to trust besides the base's (a TLS-intercepting proxy's CA), "
                "or 'none' (default: proxy.setup's bundle, else $SSL_CERT_FILE)",
                to="ca_bundle",
            ),
            Opt(
                "extra_packages",
                "more distro packages, space separated (e.g. 'python3.9 python3.9-devel')",
                "",
            ),
            Opt("uid", "uid of the non-root build user (default 1000)", "1000", convert=_int),
            Opt("gid", "its gid (default 1000)", "1000", convert=_int),
            Opt(
                "pip_index",
                "credential-free index for the tool venv (default: proxy.setup's mirror, else "
                "$PIP_INDEX_URL)",
            ),
            Opt("no_cache", "rebuild every layer", False),
            Opt("dry_run", "print the plan; make, pull and build nothing", False),
            Opt("quiet", "only the step lines, not every line of output", False),
            Opt(
                "pythons",
                "more Pythons, e.g. 3.8,3.10: those the base lacks are installed with uv "
                "(python-build-standalone from github.com, through the proxy and CA); builder.json lists each Python "
                "and where it came from",
                "",
            ),
        ),
    ),
    Command(
        "image.list",
        "apexkit.images.cli:list_images",
        "List apexkit builder and base images (stale ones: docker/ changed since they were built).",
        (JSON,),
    ),
    Command(
        "image.prune",
        "apexkit.images.cli:prune",
        "Remove stale builder images (docker/ changed since) and untagged ones; --all: every apexkit image.",
        (
            Opt(
                "all",
                "remove every apexkit image, not only stale and untagged ones",
                False,
                to="everything",
            ),
            Opt("dry_run", "print what would be removed", False),
        ),
    ),
    Command(
        "image.emulation",
        "apexkit.images.cli:emulation",
        "Can this host run x86_64/aarch64 containers (natively or via QEMU binfmt)? Exit 1 when not; --enable "
        "fixes it.",
        (
            Opt("arch", "one architecture (default: all)"),
            Opt("enable", "register QEMU for it (root)", False),
            Opt("dry_run", "with --enable: print the commands", False),
            JSON,
        ),
    ),
    Command(
        "doctor",
        "apexkit.doctor.cli:main",
        "Check this machine for building Apex for Ascend (interpreters, compiler, torch, CANN, Docker, QEMU, disk, "
        "proxy, CA) and whether the training stack needs apex at all: each check with its status and the fix. "
        "Exit 1 when one fails.",
        (
            Opt("json", "print JSON on stdout (for CI)", False, to="as_json"),
            Opt(
                "log",
                "a failed build's log: name the known failures in it (cause and fix) instead of checking the "
                "machine",
                to="log_file",
            ),
            Opt(
                "venv",
                "the training environment (venv/conda dir): does it need Apex for Ascend at all? "
                "(MindSpeed >= 2.2: no)",
            ),
            Opt(
                "interpreter",
                "the training environment's interpreter (instead of --venv): does it need Apex for "
                "Ascend?",
                to="python",
            ),
            Opt(
                "scripts",
                "training scripts (dir or file) to scan for amp.initialize/combine_grad/"
                "apex.optimizers.NpuFused*",
            ),
            PROBE_DEFAULTS,
        ),
    ),
    Command(
        "publish",
        "apexkit.commands:publish",
        "Turn dist/ into a team index (apexkit install --index DIR; PEP 503 pages for pip) with an "
        "index.html grid, per-torch find-links pages and PEP 658 metadata.",
        (
            Opt("dist", "built targets (default: $APEXKIT_DIST_DIR, else ./dist)"),
            Opt("index", "index directory to write (default ./index)", "index"),
            Opt("target", "only this dist/<target-id> (repeat for several)", repeat=True),
            Opt(
                "split_by_torch",
                "one index per torch version (<index>/torch<version>/simple/), for indexes laid out "
                "that way before; not needed: wheel names carry their torch (apex-0.1+ascend.torchX.Y.Z-...)",
                False,
            ),
            Opt(
                "base_url",
                "where the index will be served, for the install lines of its index.html (default: the "
                "index directory's file:// URI; no user:password@)",
            ),
            Opt(
                "coverage",
                "also list the cells of matrix.toml that have no wheel in the index (stdout, Markdown)",
                False,
            ),
            Opt("dry_run", "print what would be published", False),
        ),
    ),
    Command(
        "install",
        "apexkit.commands:install",
        "Install the one apexkit wheel that fits a venv (its Python, arch, glibc, torch, torch_npu, C++ ABI): looked up "
        "in the indexes and verified, else built; installed with the venv's pip --no-deps --no-index. torch and "
        "torch_npu never change; an apex that is not an apexkit wheel is refused.",
        (
            Opt("venv", "the training venv (default: the active one, $VIRTUAL_ENV)"),
            Opt("interpreter", "the training venv's python (instead of --venv)"),
            Opt(
                "index",
                "an apexkit index to look the wheel up in: http(s):// (pip's proxy, CA and "
                "user:password@ apply), file:// or a directory; repeat for several (default: $APEXKIT_INDEX)",
                repeat=True,
            ),
            Opt("no_build", "a miss is an error instead of a build", False),
            Opt("publish_to", "after a build, add the built wheel to this directory index"),
            Opt(
                "build_options",
                'more options for the build on a miss, as for nox -s build-3.X -- (e.g. "--jobs 2 '
                '--wheelhouse DIR")',
                "",
            ),
            DRY_RUN,
            JSON,
        ),
    ),
    Command(
        "fleet.submit",
        "apexkit.fleet.validate:submit_command",
        "Validate (and benchmark) the wheel on every node through Slurm: one allocation, one srun step per node.",
        (
            Opt(
                "index",
                "the wheel index (invoke publish --index output) on shared storage, or its http(s) URL",
            ),
            Opt(
                "results",
                "shared results directory the nodes write <node>.json into (default ./fleet-results)",
                "fleet-results",
            ),
            Opt("target", "the index's target to validate (default: its only one)"),
            Opt(
                "stack",
                "a matrix.toml [stacks] name: its build in the index (torch_npu from the stack)",
            ),
            Opt("device", "what each node must be ready for: npu (default), cuda or cpu", "npu"),
            Opt("partition", "Slurm partition (sbatch --partition)"),
            Opt(
                "nodes",
                "number of nodes (sbatch --nodes); one srun step runs on each",
                convert=_int,
            ),
            Opt("nodelist", "these nodes, comma separated (sbatch --nodelist)"),
            Opt("gres", "generic resources per node, passed through (e.g. npu:8)"),
            Opt("account", "Slurm account, passed through"),
            Opt("time_limit", "job time limit (sbatch --time, default 01:00:00)", "01:00:00"),
            Opt(
                "bench",
                "also run a short bench/amp_bench.py (mlp, fp32) on each node: step time vs the fleet median",
                False,
            ),
            Opt("bench_args", "more amp_bench.py arguments (implies --bench), e.g. '--scale 0.05'"),
            Opt(
                "find_links",
                "wheelhouse the nodes' pip reads for torch/torch_npu (repeat for several)",
                repeat=True,
            ),
            Opt(
                "torch_index_url",
                "index the nodes install torch from (e.g. https://download.pytorch.org/whl/cpu)",
            ),
            Opt(
                "extra_index_url",
                "extra index for torch/torch_npu (repeat for several)",
                repeat=True,
            ),
            Opt(
                "node_interpreter",
                "interpreter on the nodes (default python3.X of the target)",
                to="node_python",
            ),
            Opt(
                "node_dir",
                "node-local scratch for the venvs (default $TMPDIR/apexkit-fleet, expanded on each node, "
                "else /tmp/apexkit-fleet)",
            ),
            Opt(
                "set_env",
                "CANN set_env.sh files to try on the nodes, comma separated (default the toolkit's)",
            ),
            Opt("keep_venv", "keep each node's venv after the run", False),
            Opt(
                "venv",
                "the training venv on the nodes (same path on each, or shared): up's way, the wheel goes in "
                "--no-deps and torch is kept; default a fresh venv per node",
            ),
            Opt(
                "resume",
                "resubmit only the nodes of --results that have no result (same options as before)",
                False,
            ),
            Opt("dry_run", "print the batch script; submit nothing", False),
        ),
    ),
    Command(
        "fleet.status",
        "apexkit.fleet.validate:status",
        "The fleet's Slurm jobs (squeue/scontrol/sacct) and the stage each node is at.",
        (Opt("results", "the results directory of fleet.submit", REQUIRED, convert=Path), JSON),
    ),
    Command(
        "fleet.report",
        "apexkit.fleet.validate:report",
        "One row per node: chip, driver, CANN, torch, torch_npu, wheel sha256, verdict, step time vs the median, "
        "first failing check + fix. Exit 1 when a node failed, died or did not report.",
        (
            Opt("results", "the results directory of fleet.submit", REQUIRED, convert=Path),
            JSON,
            Opt(
                "threshold",
                "flag step times further than this fraction from the median (default 0.10)",
                convert=lambda v: None if v is None else _float(v),
            ),
        ),
    ),
    Command(
        "cache.list",
        "apexkit.wheel.cachedirs:list_command",
        "List the cache's entries with their size on disk, last use and purpose (build and run venvs, git mirrors, "
        "wheel-cache entries, uv's cache, container caches), then the totals per kind.",
        (
            Opt("what", "only these kinds, comma separated: venvs,git,wheels,uv,containers"),
            JSON,
        ),
    ),
    Command(
        "cache.prune",
        "apexkit.wheel.cachedirs:prune_command",
        "Remove old cache entries (whole ones; an entry a build holds is skipped). Selectors: --older-than DAYS "
        "(last used before), --keep-last N (the N most recent per kind stay); with none it refuses, never "
        "removing everything by default.",
        (
            Opt("older_than", "remove entries last used more than this many days ago"),
            Opt("keep_last", "keep the N most recently used entries of each kind"),
            DRY_RUN,
            Opt("what", "only these kinds, comma separated: venvs,git,wheels,uv,containers"),
            JSON,
        ),
    ),
    Command(
        "config.show",
        "apexkit.commands:config_show",
        "Show every source apexkit reaches (git URLs, indexes, mirrors, registries), its effective value and where "
        "it came from: flag, env NAME, project ./apexkit.toml, user ~/.config/apexkit/config.toml or default.",
        (JSON,),
    ),
    Command(
        "up",
        "apexkit.up:main",
        "One node from bare to validated: [proxy check,] doctor, install (index hit or build), validate[, bench]; "
        "one report (JSON + Markdown) of each stage's status, time, log and first failure with its fix. Stages "
        "already done for the same venv, torch and wheel are not run again. Exit 1 when a stage failed.",
        (
            Opt("venv", "the training venv (default: the active one, $VIRTUAL_ENV)"),
            Opt("interpreter", "the training environment's interpreter (instead of --venv)"),
            Opt(
                "index",
                "index to install from, passed to apexkit install (repeat for several; default: "
                "install's, $APEXKIT_INDEX)",
                repeat=True,
            ),
            Opt(
                "no_build",
                "a wheel missing from the indexes fails install instead of building",
                False,
            ),
            Opt("proxy_check", "first run invoke proxy.check (every layer, a real request)", False),
            Opt("bench", "last run the benchmark (nox -s bench) in the venv", False),
            Opt("bench_args", "more bench/amp_bench.py options in one string (implies --bench)"),
            Opt("device", "what the venv must be ready for: npu (default), cuda or cpu", "npu"),
            Opt("report", "report directory (default reports/up/<venv name>/)"),
            Opt("force", "run every stage, also those already done", False),
            Opt(
                "dry_run",
                "print the stages and the command each would run; run and write nothing",
                False,
            ),
            JSON,
        ),
    ),
)


def _float(value) -> float:
    try:
        return float(value)
    except ValueError:
        raise ConfigError(f"{value!r} is not a number", "pass a fraction such as 0.10") from None


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
    from apexkit.index import remote

    return remote.build_lookup(opts.team_indexes, os.environ if env is None else env)


def build(
    python: str | None = None, options: str = "", image: str | None = None, remainder: str = ""
) -> Path | None:
    if python is None:
        from apexkit.plan import matrix

        python = matrix.load().default_python
    argv = (
        envvars.split_words(options, "--options")
        + envvars.split_words(remainder or "", "the build options")
        + (["--image", image] if image else [])
    )
    # the dist/<target>/ written: the edge records it in the status file (exit 0), as for nox and apexkit build
    return build_wheel(python, argv, prog=f"invoke build --python {python} --")


def publish(
    dist: str | None = None,
    index: str = "index",
    target: list[str] | None = None,
    split_by_torch: bool = False,
    dry_run: bool = False,
    base_url: str | None = None,
    coverage: bool = False,
) -> int:
    from apexkit import paths
    from apexkit.index import publish

    publish.publish(
        Path(dist) if dist else paths.dist_dir(os.environ),
        Path(index),
        target or None,
        split_by_torch,
        dry_run,
        base_url=base_url or None,
        coverage=coverage,
    )
    return 0


def config_show(as_json: bool = False) -> int:
    """apexkit config.show: apexkit.config's table, with the defaults matrix.toml keeps (the git URLs)."""
    from apexkit import config
    from apexkit.plan import matrix

    m = matrix.load()
    return config.show(
        {"ascend_apex_url": m.ascend_apex_url, "nvidia_apex_url": m.nvidia_apex_url}, as_json
    )


def install(**options) -> int:
    """apexkit install: apexkit.install.run, with the one door to a build (build_wheel) for a miss."""
    from apexkit.install import run

    return run.main(**options, build=build_wheel)


# --- invoke tasks from the declarations (errors -> one line and an exit code: apexkit.exits.run_task) ----------


def _resolve(target: str) -> Callable:
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)


def _keywords(command: Command, given: dict) -> dict:
    out = dict(command.extra)
    for opt in command.options:
        value = given.get(opt.name)
        if opt.repeat and value is None:
            value = []
        if opt.convert is not None and value is not None and value is not REQUIRED:
            value = opt.convert(value)
        out[opt.to or opt.name] = value
    return out


def task(command: Command):
    """An invoke Task for a declared command: its signature, help and iterable options from the declaration."""
    from invoke import Task

    from apexkit.exits import run_task

    params = [inspect.Parameter("c", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    helps, iterable = {}, []
    for opt in command.options:
        params.append(
            inspect.Parameter(
                opt.name, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=opt.default
            )
        )
        helps[opt.name] = opt.help
        if opt.repeat:
            iterable.append(opt.name)
    params.sort(
        key=lambda p: p.default is not inspect.Parameter.empty
    )  # required ones first, as Python wants

    def body(c, **given):
        def call():  # inside run(): a bad option value is one line too
            keywords = _keywords(command, given)
            if command.name == "build":
                keywords["remainder"] = c.remainder or ""
            return _resolve(command.target)(**keywords)

        run_task(call)

    body.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]  # set for inspect.signature (invoke)
    body.__doc__ = command.doc
    body.__name__ = command.name.rsplit(".", 1)[-1].replace("-", "_")
    positional: list[str] | None = (
        [] if all(o.default is not REQUIRED for o in command.options) else None
    )
    return Task(
        body,
        name=command.name.rsplit(".", 1)[-1],
        help=helps,
        iterable=iterable,
        positional=positional,
        auto_shortflags=False,
    )


def namespace():
    """The invoke Collection of every declared command (tasks.py's `ns`)."""
    from invoke import Collection

    ns = Collection()
    groups: dict[str, Collection] = {}
    for command in COMMANDS:
        group, _, _ = command.name.rpartition(".")
        if group:
            if group not in groups:
                groups[group] = Collection(group)
                ns.add_collection(groups[group])
            groups[group].add_task(task(command))
        else:
            ns.add_task(task(command))
    return ns


# --- the same declarations as argparse: `apexkit <command>` without invoke (builder images have no invoke) --------


def parser(command: Command, prog: str):
    import argparse

    p = argparse.ArgumentParser(prog=prog, description=command.doc, allow_abbrev=False)
    for opt in command.options:
        dest = opt.name
        if opt.default is REQUIRED:  # positional, or as --name (as invoke takes it): one of the two
            p.add_argument(f"_{dest}", metavar=opt.name.upper(), nargs="?", help=opt.help)
            p.add_argument(
                opt.flag, dest=dest, metavar="VALUE", help=f"the same as {opt.name.upper()}"
            )
        elif opt.default is True:
            p.add_argument(
                f"--no-{opt.flag[2:]}", dest=dest, action="store_false", default=True, help=opt.help
            )
        elif opt.default is False:
            p.add_argument(opt.flag, dest=dest, action="store_true", help=opt.help)
        else:
            p.add_argument(
                opt.flag,
                dest=dest,
                metavar="VALUE",
                default=opt.default,
                action="append" if opt.repeat else "store",
                help=opt.help,
            )
    return p


def _given(command: Command, p: argparse.ArgumentParser, argv: list[str]) -> dict:
    """The parsed options of `command`, each REQUIRED one given as a --flag or as a positional word."""
    given = vars(p.parse_args(argv))
    required = [o for o in command.options if o.default is REQUIRED]
    # argparse fills the positionals first to last; the ones given as --flag take none of them
    words = [w for w in (given.pop(f"_{o.name}", None) for o in required) if w is not None]
    free = [o for o in required if given.get(o.name) is None]
    if len(words) > len(free):
        named = ", ".join(o.flag for o in required if o not in free)
        p.error(
            f"{len(words)} positional argument(s) for {len(free)} place(s) "
            f"({' '.join(o.name.upper() for o in free) or 'none'}; {named} given as an option)"
        )
    for opt, word in zip(free, words):
        given[opt.name] = word
    for opt in required:
        if given.get(opt.name) is None:
            p.error(f"{opt.name.upper()} is required (or {opt.flag} VALUE)")
    return given


def main(name: str, argv: list[str], prog: str) -> int:
    """`apexkit <name> [options]`: the declared command, parsed by argparse; errors as the CLI's (apexkit.cli)."""
    from apexkit.exits import exit_code, record_status

    command = next(c for c in COMMANDS if c.name == name)
    try:
        given = _given(command, parser(command, prog), argv)
    except (
        SystemExit
    ) as exc:  # argparse: --help (0) or a usage error (2), recorded like any other exit
        record_status(
            exc.code if isinstance(exc.code, int) else 2, "invalid arguments" if exc.code else None
        )
        raise

    def call():
        keywords = _keywords(command, given)
        if command.name == "build":
            keywords["remainder"] = ""
        return _resolve(command.target)(**keywords)

    return exit_code(call)


NAMES = tuple(c.name for c in COMMANDS)
