"""Build options, resolved once: command line -> environment -> matrix.toml defaults, into a frozen dataclass.

The environment is a parameter so tests can pass their own.
"""

from __future__ import annotations

import argparse
import json
import os
import re
from collections.abc import Mapping, MutableMapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from apexkit import cachetrust, config, declare, envvars, paths, untrusted, urls, vocab
from apexkit.declare import option
from apexkit.errors import ConfigError
from apexkit.plan import matrix, target
from apexkit.wheel import cudabin, cudatool, nvidiaext, sanitize, sources

PROJECT_ROOT = matrix.PROJECT_ROOT
TEAM_INDEX_ENV = "APEXKIT_INDEX"
FALLBACK_ENV = (
    "APEXKIT_TEAM_INDEX_FALLBACK"  # 1: compile when a team index refuses TLS or the credentials
)


BACKENDS = ("ascend", "cuda")
CUDA = "NVIDIA apex on CUDA GPUs (--backend cuda)"
BOX = "in a builder image (invoke image.build makes one)"


@dataclass(frozen=True)
class BuildOptions:
    """The options of one build. A field with option() metadata (apexkit.declare) is a build option: its flag, help
    and default are written here once, and `parser` is generated from them; the others are computed by `resolve`."""

    python: str  # "3.11"
    python_path: str | None = option(
        None,
        "interpreter to build with (default: find python3.X)",
        flag="--interpreter",
        metavar="PATH",
    )
    torch: str | None = option(  # None -> matrix default for the Python (or the system torch)
        None, "torch release to build against (default: matrix.toml per Python)", metavar="VERSION"
    )
    torch_npu: str | None = option(
        None, "torch_npu release (default: matrix.toml for the torch)", metavar="VERSION"
    )
    npu: bool = option(False, "also install torch_npu (automatic when a CANN toolkit is detected)")
    stack: str | None = option(  # matrix.toml [stacks] name: sets torch and torch_npu
        None,
        "a training stack of matrix.toml [stacks] (its torch + torch_npu), e.g. mindspeed-llm-2.3.0 or field-report",
        metavar="NAME",
    )
    apex_ref: str | None = option(
        None, "Ascend apex branch, tag or commit (default: matrix.toml, master)", metavar="REF"
    )
    apex_src: Path | None = option(
        None,
        "build from your own Ascend apex checkout (copied, never modified)",
        metavar="PATH",
        type=Path,
    )
    ascend_apex_url: str = option(
        "",
        "Ascend apex git URL or mirror (env APEXKIT_ASCEND_APEX_URL)",
        metavar="URL",
        config="ascend_apex_url",
    )
    nvidia_apex_url: str = option(
        "",
        "NVIDIA apex git URL or mirror (env APEXKIT_NVIDIA_APEX_URL)",
        metavar="URL",
        config="nvidia_apex_url",
    )
    nvidia_commit: str | None = option(
        None, "override the NVIDIA apex commit the Ascend ref pins", metavar="SHA"
    )
    index_url: str | None = option(
        None,
        "package index for torch and build deps (default: pip's config)",
        metavar="URL",
        config="index_url",
    )
    extra_index_urls: tuple[str, ...] = option(
        (), "additional package index", flag="--extra-index-url", metavar="URL", repeat=True,
        config="extra_index_urls",
    )  # fmt: skip
    torch_index_url: str | None = option(
        None,
        "index for torch only, e.g. https://download.pytorch.org/whl/cpu (env APEXKIT_TORCH_INDEX_URL)",
        metavar="URL",
        config="torch_index_url",
    )
    wheelhouses: tuple[Path, ...] = option(
        (),
        "local wheels (pip --find-links)",
        flag="--wheelhouse",
        metavar="DIR",
        repeat=True,
        config="wheelhouses",
    )
    offline: bool = option(False, "no package index and no git fetch: wheelhouse and cache only")
    jobs: int = option(
        1, "parallel compile jobs (default: CPU count)", short="-j", metavar="N", type=int
    )
    use_cache: bool = option(
        True,
        "rebuild even if the wheel cache (or a team index) has these exact inputs",
        flag="--cache",
    )
    recreate_venv: bool = option(False, "recreate the cached build venv")
    use_system_torch: bool = option(
        False,
        "build against the torch the interpreter already has (MindIE, lib64 installs) instead of installing one",
    )
    skip_patches: tuple[str, ...] = option(
        (),
        "do not apply one of our patches (diagnosis)",
        flag="--skip-patch",
        metavar="ID",
        repeat=True,
    )
    sanitize: tuple[str, ...] = option(  # --sanitize address,undefined: a +asan diagnosis build
        (),
        "address,undefined: a diagnosis build compiled with those sanitizers (its own +asan target and cache key, "
        "never published); its smoke test and CPU tier run with the sanitizer runtime preloaded",
        metavar="LIST",
        convert=sanitize.parse,
    )
    setup_flags: tuple[str, ...] | None = option(
        None,
        'setup.py flags for a ref not in matrix.toml, written with =: --setup-flags="--cpp_ext"',
        metavar="FLAGS",
        convert=lambda text: tuple(text.split()) or None,
    )
    dist_dir: Path = option(
        help="output directory (default: $APEXKIT_DIST_DIR, else ./dist)", flag="--dist", metavar="DIR",
        type=Path, factory=paths.dist_dir,
    )  # fmt: skip
    build_dir: Path = option(
        help="work directory (default: $APEXKIT_BUILD_DIR, else ./build)", metavar="DIR", type=Path,
        factory=paths.build_dir,
    )  # fmt: skip
    cache_dir: Path = field(default_factory=paths.cache_dir)
    dry_run: bool = option(False, "print the plan and change nothing")
    verbose: bool = option(False, "stream compiler and pip output", short="-v")
    smoke_test: bool = option(True, "skip importing the wheel in a fresh venv")
    verify_reproducible: bool = option(
        False,
        "build twice (no wheel cache, two build directories) and require byte-identical wheels",
    )
    force: bool = option(  # replace a dist/<target> built from other inputs
        False,
        "replace a dist/<target> that was built from other inputs (default: refuse, say which inputs differ)",
    )
    test_cached: bool = option(  # smoke-test a wheel cache hit too
        False,
        "smoke-test a wheel cache hit as well (a hit is always re-hashed and zip-checked; env APEXKIT_TEST_CACHED=1)",
    )
    image: str | None = option(  # build inside this builder image (apexkit/images/container.py)
        None,
        "run this same build inside IMAGE; the wheel lands in the host's dist/ (repository read-only, only the "
        "workspace and cache writable, no --privileged)",
        metavar="IMAGE",
        group=BOX,
    )
    # team indexes (`invoke publish` output: http(s)://, file:// or a directory) asked for the cache key after a
    # local wheel-cache miss, before compiling (--team-index, else APEXKIT_INDEX; --no-team-index: none)
    team_indexes: tuple[str, ...] = option(
        (),
        "an `invoke publish` index (http(s)://[user:password@]host/..., file:// or a directory) asked for this "
        "build's cache key after a local cache miss, before compiling; repeat for several (default: "
        f"${TEAM_INDEX_ENV}, whitespace or comma separated)",
        flag="--team-index",
        metavar="URL",
        repeat=True,
        config="team_indexes",
    )
    # ccache's shared remote storage (apexkit.wheel.ccachestats): in its environment, never in argv
    compile_cache: str = option(
        "",
        "ccache's remote storage the team shares: redis://[:password@]host:port or http(s)://host/path, after the "
        "local cache; |read-only to read and never write (env APEXKIT_COMPILE_CACHE; APEXKIT_CCACHE=0: no ccache)",
        metavar="URL",
        config="compile_cache",
    )
    team_index_fallback: bool = option(
        False,
        "compile when a team index refuses this client (its TLS certificate not verified, the credentials "
        f"refused) instead of stopping (env {FALLBACK_ENV}=1; `apexkit install` reads that variable too)",
    )
    trusted_keys: tuple[str, ...] = option(
        (),
        "a trusted public key (NAME.pub): a team-index wheel is taken only when its signature verifies against one "
        "of them and signs this cache key; repeat for several (default: $APEXKIT_TRUSTED_KEYS, else the user "
        "config's trusted_keys; docs/signing.md)",
        flag="--trusted-key",
        metavar="FILE",
        repeat=True,
    )
    network: str | None = option(
        None,
        "container network, e.g. host (automatic when the proxy listens on this host's loopback)",
        metavar="NAME",
        group=BOX,
    )
    ca_bundle: str | None = option(
        None,
        "CA certificates the container trusts besides its system's (a PEM file; a full bundle works too), or "
        "'none' (default: proxy.setup's bundle, else $SSL_CERT_FILE)",
        flag="--ca-cert",
        metavar="FILE",
        group=BOX,
    )
    # "key<TAB>origin" of each source the user configured (apexkit.config): the plan says where it came from
    origins: tuple[str, ...] = ()
    # what is built: Ascend apex (NVIDIA apex + npu.patch, for torch_npu) or upstream NVIDIA apex on CUDA
    backend: str = option(
        "ascend",
        "ascend: Apex for Ascend for torch_npu (default); cuda: upstream NVIDIA apex for CUDA GPUs, compiled with "
        "nvcc against a CUDA build of torch",
        choices=BACKENDS,
        group=CUDA,
    )
    cuda_arch: str | None = (
        option(  # TORCH_CUDA_ARCH_LIST, normalised ("8.0;9.0"); None: matrix.toml [cuda]
            None,
            'GPU architectures to compile for, e.g. "8.0;9.0" or "9.0+PTX" (default: $TORCH_CUDA_ARCH_LIST, else '
            "matrix.toml [cuda] default_arch_list)",
            metavar="LIST",
            group=CUDA,
        )
    )
    cuda_ext: tuple[str, ...] = (
        option(  # "core" and contrib names (apexkit.wheel.nvidiaext); () : core
            (),
            "extensions to build: core (apex_C, amp_C, fused layer norm, ...; the default) and contrib names such as "
            "xentropy,fast_layer_norm, comma separated",
            metavar="NAMES",
            group=CUDA,
        )
    )
    nvcc_threads: int = 1  # nvcc --threads per job (cudatool.jobs)


@dataclass(frozen=True)
class Flags(BuildOptions):
    """Build an Apex for Ascend wheel in an isolated venv: fetch (cached) Ascend apex + NVIDIA apex, generate a fresh
    tree, apply our patches, compile, smoke-test the wheel in a fresh venv."""

    no_team_index: bool = option(False, f"ask no team index this run (ignore ${TEAM_INDEX_ENV})")


def parser(prog: str = "nox -s build-3.X --") -> argparse.ArgumentParser:
    """The build options' parser, generated from their declarations (--image and --interpreter must not be
    reachable by a prefix such as --i: no abbreviations)."""
    p = declare.parser(COMMAND, prog)
    p.add_argument(
        "--options-json", metavar="FILE", type=Path, help=argparse.SUPPRESS
    )  # a container build's options
    return p


def team_indexes(values: Sequence[str], what: str) -> tuple[str, ...]:
    """Team index locations, each checked by the one URL validator (apexkit.urls): http(s) like a pip index (a
    password's reserved characters percent-encoded; an error quotes the scheme and host only), file:// with a
    local absolute path, or a directory path: both become the directory's absolute path. Duplicates dropped, order
    kept."""
    out = []
    for raw in values:
        value = raw.strip()
        if not value:
            continue
        match = re.match(r"([A-Za-z][A-Za-z0-9+.-]*)://", value)
        scheme = match[1].lower() if match else ""
        if scheme:
            urls.check_chars(value, what)
        elif any(ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F for c in value):
            raise ConfigError(
                f"{what}: the directory path holds a control character", "pass the directory alone"
            )
        if scheme in ("http", "https"):
            out.append(urls.index_url(value, what))
        elif scheme == "file":
            parts = urlsplit(value)
            if parts.netloc not in ("", "localhost") or not parts.path.startswith("/"):
                raise ConfigError(
                    f"{what} {urls.shown(value)}: a file:// index is a local absolute path",
                    "write it as file:///path/to/index (or pass the directory itself)",
                )
            if parts.query or parts.fragment:
                raise ConfigError(
                    f"{what} file://…: a file:// index has no ?query or #fragment",
                    "write it as file:///path/to/index",
                )
            out.append(str(Path(unquote(parts.path)).resolve()))  # the directory it names
        elif scheme:
            raise ConfigError(
                f"{what} {urls.shown(value)}: scheme {scheme!r} is not a team index scheme",
                "use http://, https://, file:// or a directory path",
            )
        else:
            out.append(str(Path(value).expanduser().resolve()))
    return tuple(dict.fromkeys(out))


def fallback_asked(env: Mapping[str, str]) -> bool:
    """APEXKIT_TEAM_INDEX_FALLBACK=1 (true, yes): a team index that refuses TLS or the credentials is passed over."""
    return env.get(FALLBACK_ENV, "").strip().lower() in ("1", "true", "yes")


def _team_indexes(args: argparse.Namespace, found) -> tuple[str, ...]:
    """--team-index (repeatable), else $APEXKIT_INDEX (whitespace or comma separated: a comma inside a URL is
    written %2C), else the config files' team_indexes; --no-team-index: none."""
    if args.no_team_index:
        if args.team_index:
            raise ConfigError(
                "--team-index and --no-team-index contradict each other", "drop one of them"
            )
        return ()
    return team_indexes(list(found.items), found.where or found.origin)


def _source_url(found, default: str) -> str:
    """A git source URL (a config.Value): an http(s) URL is checked like an index (its credentials must parse, or it
    is refused without being echoed); file://, ssh:// and scp-like URLs only for whitespace and control characters."""
    value, what = found.text or default, found.where or found.origin
    if found.layer == config.DEFAULT:
        return value
    urls.check_chars(value.strip(), what)
    if value.strip().lower().startswith(("http://", "https://")):
        urls.split(value, what, ("http", "https"), "https://git.example.com/ascend/apex.git")
    return value.strip()


def resolve(
    python: str,
    argv: Sequence[str],
    env: Mapping[str, str] | None = None,
    prog: str = "nox -s build-3.X --",
    given: Mapping[str, object] | None = None,
) -> BuildOptions:
    """argv (session posargs) + env -> BuildOptions. `given`: typed option values by option name (a matrix
    combination's torch, torch_npu, ref or stack), which argv may still override. --help prints and raises
    SystemExit(0). The steps, in the order their errors are raised: parse, check the flags against each other and
    the stack, the backend, the folders, the settings (flag > environment > project file > user file), assemble."""
    env = os.environ if env is None else env
    m = matrix.load()
    m.check_python(python)
    args = _parse(prog, argv, given)
    if args.options_json is not None:
        return load_json(args.options_json, python)
    if args.interpreter and args.image:
        raise ConfigError(
            f"--interpreter {args.interpreter} is a host path; a build in an image uses the image's "
            f"python{python}",
            f"drop --interpreter ({vocab.command('image.build', '--pythons')} adds Pythons to an image)",
        )
    jobs = _jobs(args, env)
    _check_torch(args)
    stack = _stack(args, m, python)
    backend, cuda_arch, cuda_ext, nvcc_threads = _backend(args, env, m, python, stack)
    if backend == "cuda" and args.jobs is None and "APEXKIT_JOBS" not in env:
        jobs, nvcc_threads = cudatool.jobs(os.cpu_count() or 1, cudatool.free_gib())
    if (args.network or args.ca_cert) and not args.image:
        raise ConfigError(
            "--network and --ca-cert apply to container builds only",
            "add --image IMAGE, or drop them",
        )
    return _assemble(
        python, args, env, m, stack, jobs, (backend, cuda_arch, cuda_ext, nvcc_threads)
    )


# the doors (apexkit build, nox -s build-*, invoke build, install --build-options) give resolve their argv
COMMAND = declare.Command("build <python>", Flags, resolve)


def _parse(
    prog: str, argv: Sequence[str], given: Mapping[str, object] | None
) -> argparse.Namespace:
    """argv parsed over `given` (each a known option); --options-json stands alone."""
    p = parser(prog)
    if given:
        unknown = sorted(set(given) - {action.dest for action in p._actions})
        if unknown:
            raise ConfigError(
                f"unknown build option(s) {', '.join(unknown)}", "report this: a caller passed them"
            )
        p.set_defaults(**given)
    args = p.parse_args(list(argv))
    alone = len(argv) < 2 or (len(argv) == 2 and argv[0] == "--options-json")
    if args.options_json is not None and (given or not alone):
        raise ConfigError(
            "--options-json carries every option of the build",
            "pass it alone (apexkit build 3.X --options-json FILE), not to a combination's session",
        )
    return args


def _jobs(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    """--jobs, else $APEXKIT_JOBS, else the cores."""
    jobs = (
        args.jobs
        if args.jobs is not None
        else envvars.integer(env, "APEXKIT_JOBS", os.cpu_count() or 1, low=1, high=4096)
    )
    if jobs < 1:
        raise ConfigError(f"--jobs {jobs}: must be at least 1", "pass --jobs 1 or more")
    return jobs


def _check_torch(args: argparse.Namespace) -> None:
    """--torch and --torch-npu are versions, and --torch is not the system torch."""
    if args.torch and args.use_system_torch:
        raise ConfigError(
            "--torch and --use-system-torch contradict each other",
            "drop --torch to build against the installed torch",
        )
    _check_versions(args.torch, args.torch_npu)


def _check_versions(torch: str | None, torch_npu: str | None) -> None:
    """--torch and --torch-npu, when given, are PEP 440 versions."""
    for flag, value in (("--torch", torch), ("--torch-npu", torch_npu)):
        if value is not None:
            target.check_version(value, flag, f"pass {flag} like 2.1.0 or 2.1.0.post10")


def _stack(args: argparse.Namespace, m: matrix.Matrix, python: str) -> matrix.Stack | None:
    """The --stack (None: none given): named, not contradicted by a torch flag, of this session's Python."""
    if args.stack is not None and not args.stack.strip():
        raise ConfigError("--stack is empty", f"pass a stack name: {', '.join(m.stack_names())}")
    if not args.stack:
        return None
    torches = (args.torch, args.torch_npu, args.use_system_torch)
    clash = [f for f, v in zip(("--torch", "--torch-npu", "--use-system-torch"), torches) if v]
    if clash:
        raise ConfigError(
            f"--stack {args.stack} sets torch and torch_npu itself; {' and '.join(clash)} "
            "contradict it",
            f"drop {' '.join(clash)}, or drop --stack",
        )
    stack = m.stack(args.stack)
    if stack.python != python:
        raise ConfigError(
            f"stack {stack.name} is Python {stack.python}, this session builds for Python {python}",
            vocab.build(stack.python, f"--stack {stack.name}")
            + (f" (or nox -s build-{stack.name})" if vocab.entry() == vocab.NOX else ""),
        )
    return stack


def _folders(args: argparse.Namespace) -> tuple[Path, Path]:
    """(dist, build) folders, each a directory or to be made under one; --apex-src a directory."""
    given = (
        (args.dist or paths.dist_dir()).absolute(),
        (args.build_dir or paths.build_dir()).absolute(),
    )
    dist_dir, build_dir = given[0].resolve(), given[1].resolve()
    for flag, env_name, folder, as_given in (
        ("--dist", "APEXKIT_DIST_DIR", dist_dir, given[0]),
        ("--build-dir", "APEXKIT_BUILD_DIR", build_dir, given[1]),
    ):
        # through a link: one someone else may replace (to pick where we write) is refused
        if as_given != folder:
            cachetrust.trusted_output(as_given, f"{env_name} (or {flag})", make=False)
        existing = next(p for p in (folder, *folder.parents) if os.path.lexists(p))
        if not existing.is_dir():
            where = (
                "is not a directory"
                if existing == folder
                else f"lies under {existing}, which is not a directory"
            )
            raise ConfigError(
                f"{flag} {folder} {where}",
                f"pass {flag} DIR (or set {env_name}) to a directory; it is made when missing",
            )
    if args.apex_src is not None and not args.apex_src.expanduser().is_dir():
        raise ConfigError(
            f"--apex-src {args.apex_src} is not a directory", "pass your Ascend apex checkout"
        )
    return dist_dir, build_dir


def _settings(args: argparse.Namespace, env: Mapping[str, str], m: matrix.Matrix) -> dict:
    """Each source setting by its config key, resolved once (apexkit.declare.setting): flag > environment > project
    file > user file > default (matrix.toml's for the git URLs)."""
    cfg = config.load(env)
    defaults = m.source_urls
    return {
        o.config: declare.setting(o, getattr(args, o.name), env, cfg, defaults.get(o.config))
        for o in COMMAND.opts
        if o.config
    }


def _index(value: str | None, what: str) -> str | None:
    return urls.index_url(value, what) if value else None


def _own(value) -> tuple[str, ...]:
    """A value apexkit passes on: pip reads PIP_INDEX_URL / PIP_EXTRA_INDEX_URL itself, as before."""
    return () if value.layer == config.ENV and value.where.startswith("PIP_") else value.items


def _wheelhouses(args: argparse.Namespace, found) -> tuple[Path, ...]:
    """The wheelhouses (a config.Value), each a directory. An --offline build with none is refused only when it has
    to make its build venv (Builder._build_venv): a wheel-cache or team-index hit needs no wheelhouse."""
    wheelhouses = tuple(Path(w).expanduser() for w in found.items)
    for w in wheelhouses:
        if not w.is_dir():
            raise ConfigError(
                f"--wheelhouse {w} is not a directory"
                if found.layer == config.FLAG
                else f"wheelhouse {w} ({found.origin}) is not a directory",
                "pass a directory of .whl files",
            )
    return tuple(w.resolve() for w in wheelhouses)


def _assemble(
    python: str,
    args: argparse.Namespace,
    env: Mapping[str, str],
    m: matrix.Matrix,
    stack: matrix.Stack | None,
    jobs: int,
    shape: tuple[str, str | None, tuple[str, ...], int],
) -> BuildOptions:
    """The checked flags, folders and settings into BuildOptions: each declared option as given (converted), then
    the values computed from them; `shape`: _backend's answer."""
    dist_dir, build_dir = _folders(args)
    found = _settings(args, env, m)
    extra = found["extra_index_urls"]
    computed: dict[str, Any] = {
        "python": python,
        "torch": stack.torch if stack else args.torch,
        "torch_npu": stack.torch_npu if stack else args.torch_npu,
        "npu": bool(args.npu or args.torch_npu or (stack and stack.torch_npu)),
        "stack": stack.name if stack else None,
        "apex_src": args.apex_src.expanduser().resolve() if args.apex_src else None,
        # each index URL checked by the one URL validator (apexkit.urls: an error never quotes a password)
        "index_url": _index(next(iter(_own(found["index_url"])), None), found["index_url"].origin),
        "extra_index_urls": tuple(urls.index_url(u, extra.origin) for u in _own(extra)),
        "torch_index_url": _index(found["torch_index_url"].text, found["torch_index_url"].where),
        "ascend_apex_url": _source_url(found["ascend_apex_url"], m.ascend_apex_url),
        "nvidia_apex_url": _source_url(found["nvidia_apex_url"], m.nvidia_apex_url),
        "wheelhouses": _wheelhouses(args, found["wheelhouses"]),
        "jobs": jobs,
        "dist_dir": dist_dir,
        "build_dir": build_dir,
        "cache_dir": sources.cache_dir(env),
        "test_cached": args.test_cached or env.get("APEXKIT_TEST_CACHED", "") in ("1", "true", "yes"),
        "team_indexes": _team_indexes(args, found["team_indexes"]),
        "team_index_fallback": args.team_index_fallback or fallback_asked(env),
        "origins": tuple(f"{v.key}\t{v.origin}" for v in found.values() if v.configured),
        **dict(zip(("backend", "cuda_arch", "cuda_ext", "nvcc_threads"), shape)),
    }  # fmt: skip
    given = {
        o.dest: declare.settled(o, getattr(args, o.name), env)
        for o in declare.options_of(BuildOptions)
        if o.dest not in computed
    }
    return BuildOptions(**given, **computed)


def _backend(
    args: argparse.Namespace, env: Mapping[str, str], m: matrix.Matrix, python: str, stack
) -> tuple[str, str | None, tuple[str, ...], int]:
    """(backend, arch list, extensions, nvcc threads) of --backend / --cuda-arch / --cuda-ext, checked together: a
    CUDA build takes none of the Ascend-only options, an Ascend build none of the CUDA ones."""
    backend = args.backend or "ascend"
    if backend != "cuda":
        given = [
            f for f, v in (("--cuda-arch", args.cuda_arch), ("--cuda-ext", args.cuda_ext)) if v
        ]
        if given:
            raise ConfigError(
                f"{' and '.join(given)} apply to NVIDIA apex on CUDA only",
                f"add --backend cuda, or drop {' '.join(given)}",
            )
        return backend, None, (), 1
    ascend_only = [
        flag
        for flag, value in (
            ("--npu", args.npu),
            ("--torch-npu", args.torch_npu),
            ("--stack", stack is not None),
            ("--apex-src", args.apex_src),
            ("--setup-flags", args.setup_flags),
            ("--skip-patch", args.skip_patch),
            ("--sanitize", args.sanitize),
            ("--use-system-torch", args.use_system_torch),
            ("--image", args.image),
        )
        if value
    ]
    if ascend_only:
        verb = "is" if len(ascend_only) == 1 else "are"
        raise ConfigError(
            f"--backend cuda builds upstream NVIDIA apex for CUDA GPUs; {', '.join(ascend_only)} {verb} for the "
            "Ascend build only (or not supported for CUDA yet)",
            f"drop {' '.join(ascend_only)}, or drop --backend cuda",
        )
    if args.torch is None:
        m.cuda_default_torch(python)  # refused now when matrix.toml has none for this Python
    text = args.cuda_arch if args.cuda_arch is not None else env.get("TORCH_CUDA_ARCH_LIST")
    arches = cudabin.parse_arch_list(text if text is not None else m.cuda_default_arch_list)
    cuda_arch = ";".join(a.text for a in arches)
    cuda_ext = nvidiaext.parse_asked(args.cuda_ext) if args.cuda_ext is not None else ("core",)
    if "core" not in cuda_ext:
        raise ConfigError(
            f"--cuda-ext {','.join(cuda_ext)} leaves out core, which every NVIDIA apex build has (apex_C, amp_C)",
            f"pass --cuda-ext core,{','.join(cuda_ext)}",
        )
    return backend, cuda_arch, cuda_ext, 1


HOST_ONLY = (
    "image",
    "network",
    "ca_bundle",
    "python_path",
)  # what the host consumes: null in a container's options
_JSON_KINDS = {"str": (str,), "bool": (bool,), "int": (int,), "Path": (str,)}


def _of_kind(annotation: str, value) -> bool:
    """Whether a JSON value fits a BuildOptions annotation (str, bool, int, Path, tuple[X, ...], each `| None`)."""
    for kind in (a.strip() for a in annotation.split("|")):
        if kind == "None" and value is None:
            return True
        if kind.startswith("tuple[") and isinstance(value, list):
            inner = _JSON_KINDS.get(kind[len("tuple[") :].split(",")[0].strip(), ())
            if all(isinstance(v, inner) for v in value):
                return True
        elif (
            kind in _JSON_KINDS
            and isinstance(value, _JSON_KINDS[kind])
            and not (kind == "int" and isinstance(value, bool))
        ):
            return True
    return False


class _Deferred(int):
    """The type of THEIR_JOBS."""


# jobs left to the machine that runs the build (a Slurm node, whose CPUs only it knows): given to resolve() it stays
# as given (an int, so --jobs on the command line still replaces it); to_json writes it as null, and from_json reads
# null as that machine's default: $APEXKIT_JOBS, else its CPU count
THEIR_JOBS = _Deferred(1)
# the options file of a child on a host (a matrix cell, a Slurm job), not in a container: it may name an image to
# build in, an interpreter or a CUDA build, and its environment is inherited
ON_HOST = "on_host"
MAX_JSON_BYTES = 256 * 1024


def to_json(opts: BuildOptions) -> dict:
    """The parsed options as plain JSON: what a container build receives instead of argv to parse again."""
    data = {}
    for f in fields(BuildOptions):
        value = getattr(opts, f.name)
        if value is THEIR_JOBS:
            value = None
        elif isinstance(value, Path):
            value = str(value)
        elif isinstance(value, tuple):
            value = [str(v) if isinstance(v, Path) else v for v in value]
        data[f.name] = value
    return data


def child_json(opts: BuildOptions) -> bytes:
    """The options file of a child `apexkit build <python> --options-json FILE` on a host (ON_HOST): the options
    resolved once by its parent, capped at MAX_JSON_BYTES as load_json reads it. Write it 0600: a URL may hold a
    login."""
    data = (json.dumps({**to_json(opts), ON_HOST: True}, indent=1) + "\n").encode()
    if len(data) > MAX_JSON_BYTES:
        raise ConfigError(
            f"the build options take {len(data)} bytes as JSON, over {MAX_JSON_BYTES}",
            "pass fewer or shorter options",
        )
    return data


# the options file's variables for the container's environment: the ones that hold credentials (an index URL with
# user:password@, a proxy with a login), which `docker inspect` would show in the container's own environment
ENVIRONMENT = "environment"
_ENV_NAME = re.compile(
    r"(PIP|APEXKIT)_[A-Z0-9_]+|(http|https|all|no)_proxy|(HTTP|HTTPS|ALL|NO)_PROXY"
)


def read_environment(data: Mapping) -> dict[str, str]:
    """The options file's ENVIRONMENT: {name: value}, names of the index and proxy variables only."""
    raw = data.get(ENVIRONMENT, {})
    if not isinstance(raw, dict) or not all(
        isinstance(k, str) and isinstance(v, str) and _ENV_NAME.fullmatch(k) and "\0" not in v
        for k, v in raw.items()
    ):
        raise ConfigError(
            f"options file: {ENVIRONMENT} is not an object of index and proxy variables",
            "it is written by the host's container build (invoke build --image ...); run that",
        )
    return dict(raw)


def from_json(data: Mapping, python: str) -> BuildOptions:
    """BuildOptions from to_json's form. The file comes from the host that parsed and checked the options; fields are
    still checked for kind, and versions for PEP 440, since the options become paths and pip requirements.
    Its ENVIRONMENT is not an option (load_json sets it); ON_HOST says it is not a container's (child_json)."""
    on_host = data.get(ON_HOST) is True
    data = {k: v for k, v in data.items() if k not in (ENVIRONMENT, ON_HOST)}
    if "jobs" in data and data["jobs"] is None:  # THEIR_JOBS: this machine's
        data["jobs"] = _jobs(argparse.Namespace(jobs=None), os.environ)
    _check_json(data, python, on_host)
    kinds = {f.name: str(f.type) for f in fields(BuildOptions)}
    values = {name: _from_json_value(kinds[name], value) for name, value in data.items()}
    _check_versions(values.get("torch"), values.get("torch_npu"))
    return BuildOptions(**values)


_FROM_HOST = "it is written by the host's container build (invoke build --image ...); run that"


def _check_json(data: Mapping, python: str, on_host: bool) -> None:
    """An options file's fields: known, of their kind, for this Python; in a container none host-only and an Ascend
    build."""
    known = {f.name: f for f in fields(BuildOptions)}
    unknown = sorted(set(data) - set(known))
    if unknown or data.get("python") != python:
        raise ConfigError(
            f"options file: {'unknown fields ' + ', '.join(unknown) if unknown else 'another Python'}",
            _FROM_HOST,
        )
    wrong = next((n for n, v in data.items() if not _of_kind(str(known[n].type), v)), None)
    if wrong is not None:
        raise ConfigError(f"options file: {wrong} is not a {known[wrong].type}", _FROM_HOST)
    host_only = [n for n in HOST_ONLY if data.get(n) is not None and not on_host]
    if host_only:
        raise ConfigError(
            f"options file: {', '.join(host_only)} cannot be set inside a container build",
            _FROM_HOST,
        )
    _check_values(data)
    if not on_host and (
        data.get("backend", "ascend") != "ascend"
        or any(
            data.get(k) not in (None, (), [], 1) for k in ("cuda_arch", "cuda_ext", "nvcc_threads")
        )
    ):
        raise ConfigError(
            "options file: a CUDA build (--backend cuda) does not run in a builder image yet",
            "build on the host without --image",
        )
    if data.get("jobs", 1) < 1:
        raise ConfigError(
            f"options file: jobs {data['jobs']} is not at least 1",
            "pass --jobs 1 or more on the host",
        )


def _check_values(data: Mapping) -> None:
    """The values a flag could not have given: a backend, a sanitizer or an extension name apexkit does not know."""
    if data.get("backend", "ascend") not in BACKENDS or not set(data.get("sanitize") or ()) <= set(
        sanitize.KNOWN
    ):
        raise ConfigError(
            f"options file: backend must be one of {', '.join(BACKENDS)}, sanitize among "
            f"{', '.join(sanitize.KNOWN)}",
            _FROM_HOST,
        )
    if data.get("cuda_ext"):
        nvidiaext.parse_asked(",".join(data["cuda_ext"]))  # names only: one line for anything else


def _from_json_value(kind: str, value):
    """One checked JSON value as its BuildOptions field holds it (`kind`: the field's annotation): paths as Path,
    lists as tuples."""
    if value is None:
        return None
    path = kind.startswith(("Path", "tuple[Path"))
    if kind.startswith("tuple["):
        return tuple(Path(v) for v in value) if path else tuple(value)
    return Path(value) if path else value


def load_json(
    path: Path, python: str, environ: MutableMapping[str, str] | None = None
) -> BuildOptions:
    """The container's side of a container build (`apexkit build 3.X --options-json FILE`): the options, and the
    file's ENVIRONMENT set in `environ` (os.environ: pip, git and the fetches of this build inherit it), so that
    credentials reach the build without being in the container's environment that `docker inspect` shows."""
    try:  # a regular file, no link followed, capped: it may lie on storage that others share (a Slurm job's)
        data = untrusted.read_json_object(path, None, MAX_JSON_BYTES)
    except untrusted.Untrusted as exc:
        raise ConfigError(
            f"--options-json: {exc}",
            "it is written by the process that starts the build (a container build, a matrix run); run that",
        ) from None
    opts = from_json(data, python)
    (os.environ if environ is None else environ).update(read_environment(data))
    return opts
