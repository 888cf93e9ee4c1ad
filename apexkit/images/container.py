"""Run the same nox build inside a builder image: `invoke build --image IMAGE -- <options>` or
`nox -s build-3.X -- --image IMAGE <options>`.

Mounted, and nothing else: the repository (read-only, /apexkit), a workspace (/workspace: dist/ and build/ of the
container), a cache (/cache: git mirrors, build venvs, wheel cache of that image), and read-only what the options
name on the host (--wheelhouse, --apex-src, file:// source URLs, the CA bundle). No --privileged. The container
runs as the invoking user (or, for root, as the image's non-root build user); the finished dist/<target>/ is then
copied into the host's dist/ by this process, so it belongs to the invoking user.

The workspace is the container's to write, so what the host takes from it is untrusted: the host keeps the
container's output beside the workspace, never in it (a symlink left there would aim the host's writes anywhere), and
takes back only a plain wheel file named by a plain basename, without following links, re-hashed here. The SBOM and
the provenance statement are not taken back: the host writes them (apexkit.wheel.sbom) from the manifest it rewrote and the
wheel it re-hashed, with the builder image's id, which only the host knows.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import glob
import json
import os
import re
import shutil
import stat
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote, urlsplit

from apexkit import cann, dockerclient, fsedit, locks, log, netenv, paths, untrusted, urls, vocab
from apexkit.errors import BuildError, ConfigError, ImageError
from apexkit.images import builder
from apexkit.plan import matrix
from apexkit.proxy import layers
from apexkit.wheel import buildplan, distdir, options, sbom
from apexkit.wheel.options import BuildOptions

REPO_MOUNT = "/apexkit"
PACKAGE_MOUNT = "/opt/apexkit-package"  # the package of a pip-installed apexkit
WORKSPACE = "/workspace"
CACHE = "/cache"
MNT = "/mnt/apexkit"
TOOL_PYTHON = (
    "/opt/apexkit/venv/bin/python"  # apexkit itself runs here; builds use the base's python3.X
)
OPTIONS_FILE = f"{WORKSPACE}/options.json"  # the parsed options (apexkit.wheel.options.to_json), 0600, removed after
PASS_ENV_PREFIXES = ("APEXKIT_FETCH_",)
PASS_ENV = (
    "APEXKIT_JOBS",
    "APEXKIT_TORCH_INDEX_URL",
    "PIP_INDEX_URL",
    "PIP_EXTRA_INDEX_URL",
    "PIP_TRUSTED_HOST",
    "PIP_DEFAULT_TIMEOUT",
    "PIP_RETRIES",
)


@dataclass
class Mount:
    host: Path
    container: str
    read_only: bool = True
    why: str = ""


@dataclass
class ContainerSpec:
    image: str
    arch: str
    command: list[str]
    user: str
    uid: int
    mounts: list[Mount]
    environment: dict[str, str]
    network: str | None
    workspace: Path
    cache: Path
    notes: list[str] = field(default_factory=list)
    options: dict = field(
        default_factory=dict
    )  # the build's options as the container sees them (OPTIONS_FILE), with the variables holding a login
    # (options.ENVIRONMENT): never in `environment`, which `docker inspect` shows

    @property
    def log_path(self) -> Path:
        """The container's output as the host keeps it: beside the workspace (build/containers/<image>-py3.X.log),
        outside every mount the container can write."""
        return self.workspace.with_name(f"{self.workspace.name}.log")

    def volumes(self) -> dict[str, dict[str, str]]:
        return {
            str(m.host): {"bind": m.container, "mode": "ro" if m.read_only else "rw"}
            for m in self.mounts
        }


def _file_url_path(url: str) -> Path | None:
    parts = urlsplit(url)
    if parts.scheme == "file":
        return Path(unquote(parts.path))
    if "://" not in url and url.startswith("/"):
        return Path(url)
    return None


def make_spec(
    opts: BuildOptions,
    image: str,
    labels: Mapping[str, str],
    arch: str,
    environ: Mapping[str, str] | None = None,
    settings: layers.ProxySettings | None = None,
    euid: int | None = None,
) -> ContainerSpec:
    """Every decision of a container build, from the options, the image's labels and the environment (pure)."""
    environ = os.environ if environ is None else environ
    tag = builder.slug(image)
    workspace = opts.build_dir / "containers" / f"{tag}-py{opts.python}"
    cache = opts.cache_dir / "containers" / tag
    mounts, python_path = _own_mounts(workspace, cache)
    inputs, inside = _host_inputs(opts)
    mounts += inputs
    passed, secret = _passed_environment(environ, settings)
    # TORCH_DEVICE_BACKEND_AUTOLOAD=0: torch >= 2.5 loads torch_npu at `import torch`, which fails without CANN
    env: dict[str, str] = {
        "APEXKIT_CACHE_DIR": CACHE,
        "PIP_CACHE_DIR": f"{CACHE}/pip",
        "PYTHONPATH": python_path,
        "PYTHONDONTWRITEBYTECODE": "1",
        cann.NO_AUTOLOAD: "0",
        sbom.BY_HOST: "1",  # the SBOM + provenance are the host's to write (_swap_in)
        **passed,
    }
    bundle = builder.resolve_ca_bundle(opts.ca_bundle, settings, environ)
    if bundle is not None:
        mounts.append(Mount(bundle, layers.CONTAINER_CA_PATH, True, "CA bundle"))
        env.update(dict.fromkeys(netenv.CA_VARIABLES, layers.CONTAINER_CA_PATH))
    if log.is_interactive():
        env["FORCE_COLOR"] = "1"
    uid, gid, notes = _container_user(labels, os.geteuid() if euid is None else euid)
    return ContainerSpec(
        image=image,
        arch=arch,
        command=[
            TOOL_PYTHON,
            "-m",
            "apexkit",
            "build",
            opts.python,
            "--options-json",
            OPTIONS_FILE,
        ],
        user=f"{uid}:{gid}",
        uid=uid,
        mounts=mounts,
        environment=env,
        network=opts.network or builder.auto_network(settings),
        workspace=workspace,
        cache=cache,
        notes=notes,
        options={
            **options.to_json(dataclasses.replace(opts, **inside)),
            **({options.ENVIRONMENT: secret} if secret else {}),
        },
    )


def _own_mounts(workspace: Path, cache: Path) -> tuple[list[Mount], str]:
    """The repository (and a pip-installed apexkit's package), the workspace and the cache; the PYTHONPATH of it."""
    mounts = [
        Mount(matrix.PROJECT_ROOT, REPO_MOUNT, True, "the repository"),
        Mount(workspace, WORKSPACE, False, "workspace"),
        Mount(cache, CACHE, False, "cache"),
    ]
    if not paths.INSTALLED:
        return mounts, REPO_MOUNT
    # pip-installed: /apexkit is apexkit/_data (noxfile, matrix.toml, ...), the package beside it
    mounts.insert(1, Mount(paths.PACKAGE, f"{PACKAGE_MOUNT}/apexkit", True, "the apexkit package"))
    return mounts, PACKAGE_MOUNT


def _host_inputs(opts: BuildOptions) -> tuple[list[Mount], dict]:
    """What the options name on the host, mounted read-only, and the options that change for the container: the
    container gets the host's parsed options with every host path replaced by its mount (no argv to re-parse)."""
    mounts = [
        Mount(wheelhouse, f"{MNT}/wheelhouse-{i}", True, "--wheelhouse")
        for i, wheelhouse in enumerate(opts.wheelhouses)
    ]
    inside: dict = {
        "dist_dir": Path(f"{WORKSPACE}/dist"),
        "build_dir": Path(f"{WORKSPACE}/build"),
        "cache_dir": Path(CACHE),
        "python_path": None,
        "image": None,
        "network": None,
        "ca_bundle": None,
        "wheelhouses": tuple(Path(m.container) for m in mounts),
    }
    if opts.apex_src:
        mounts.append(Mount(opts.apex_src, f"{MNT}/apex-src", True, "--apex-src"))
        inside["apex_src"] = Path(f"{MNT}/apex-src")
    for key, name, mount in (
        ("ascend_apex_url", "APEXKIT_ASCEND_APEX_URL", "ascend-apex"),
        ("nvidia_apex_url", "APEXKIT_NVIDIA_APEX_URL", "nvidia-apex"),
    ):
        # the URL reaches the container in the options file only (it may hold a token)
        inside[key] = url = getattr(opts, key)
        local = _file_url_path(url)
        if local is not None:
            mounts.append(Mount(local, f"{MNT}/{mount}", True, name))
            inside[key] = f"file://{MNT}/{mount}"
    return mounts, inside


def _passed_environment(
    environ: Mapping[str, str], settings: layers.ProxySettings | None
) -> tuple[dict[str, str], dict[str, str]]:
    """The host's index and fetch variables and proxy.setup's (CA paths aside), split into (plain, secret): a value
    holding a login goes in the options file only (options.ENVIRONMENT), never in what `docker inspect` shows."""
    pairs = [
        (name, value)
        for name, value in environ.items()
        if (name in PASS_ENV or name.startswith(PASS_ENV_PREFIXES))
        and value
        and "file:" not in value
    ]
    if settings is not None:
        pairs += [(n, v) for n, v in settings.environment().items() if n not in netenv.CA_VARIABLES]
    plain: dict[str, str] = {}
    secret: dict[str, str] = {}
    for name, value in pairs:
        # a value that may carry a login (user:password@ or token@ in a URL, or a ?token= query)
        (secret if urls.may_hold_secret(value) else plain)[name] = value
    return plain, secret


def _container_user(labels: Mapping[str, str], euid: int) -> tuple[int, int, list[str]]:
    """The invoking user, or for root the image's non-root build user; a note when it is the latter."""
    if euid != 0:
        return euid, os.getegid(), []
    uid = int(labels.get(f"{builder.LABEL}.uid", builder.BUILD_ID))
    return (
        uid,
        int(labels.get(f"{builder.LABEL}.gid", builder.BUILD_ID)),
        [f"as the image's build user (uid {uid}), not root"],
    )


def preflight(spec: ContainerSpec) -> None:
    """Every read-only mount must exist and be readable by the container's user; make the writable ones."""
    for m in spec.mounts:
        if m.read_only:
            if not m.host.exists():
                raise ConfigError(f"{m.why} {m.host} does not exist", "fix the path")
            st = m.host.stat()
            readable = st.st_uid == spec.uid or (
                st.st_mode & (0o005 if m.host.is_dir() else 0o004)
            ) == (0o005 if m.host.is_dir() else 0o004)
            if not readable:
                raise ConfigError(
                    f"{m.why} {m.host} is not readable by the container's build user (uid {spec.uid})",
                    f"chmod -R a+rX {m.host}, or build as a non-root user",
                )
        else:
            m.host.mkdir(parents=True, exist_ok=True)
            if os.geteuid() == 0 and m.host.stat().st_uid != spec.uid:
                os.chown(m.host, spec.uid, int(spec.user.split(":")[1]))


def inspect_image(c, image: str) -> tuple[dict, str, object]:
    found = dockerclient.get_image(c, image)
    if found is None:
        raise ImageError(
            f"image {image} is not in the Docker daemon",
            builder.build_hint(image, data=matrix.load().data),
        )
    labels, arch = dockerclient.labels(found), dockerclient.image_arch(found)
    if f"{builder.LABEL}.builder" not in labels:
        raise ImageError(
            f"{image} is not an apexkit builder image (no {builder.LABEL}.builder label)",
            vocab.command(
                "image.build", f"--arch {arch or dockerclient.host_arch()} --base {image}"
            ),
        )
    return labels, arch, found


def run(opts: BuildOptions) -> Path | None:
    """The whole container build. Returns the host's dist/<target>/ (None for --dry-run)."""
    assert opts.image is not None
    c = dockerclient.client()
    labels, arch, found = inspect_image(c, opts.image)
    image_ref = {
        "id": getattr(found, "id", None),
        "repo_digests": (getattr(found, "attrs", None) or {}).get("RepoDigests") or [],
    }
    # the Python must be in the image (its builder.json) before a container starts, not found missing inside it
    builder.require_python(
        builder.builder_json(c, opts.image), opts.image, opts.python, arch, matrix.load().data
    )
    # the dist/<target> the container may leave, from this host's plan: the container never chooses which it replaces
    planned = functools.partial(buildplan.expected_targets, opts, matrix.load(), arch)
    planned()  # an impossible combination (no torch_npu for this torch) fails here, before any container runs
    emulated = builder.emulation(arch).require(f"run {arch} containers")
    spec = make_spec(
        opts, opts.image, labels, arch, settings=layers.current_settings(layers.Paths())
    )
    log.info(f"build in container {spec.image} ({arch}, {emulated.detail})")
    log.info(f"  {'user':<15}{spec.user}" + (f" ({'; '.join(spec.notes)})" if spec.notes else ""))
    for m in spec.mounts:
        log.info(
            f"  {'mount':<15}{m.host} -> {m.container} ({'ro' if m.read_only else 'rw'}, {m.why})"
        )
    log.info(f"  {'network':<15}{spec.network or 'daemon default'}")
    if labels.get(f"{builder.LABEL}.recipe") != builder.recipe_digest():
        log.warn(
            f"{spec.image} was built from an older docker/ recipe: rebuild it with "
            + vocab.command("image.build")
        )
    # one container build per workspace (image + Python) at a time: its dist/ and options file are per workspace
    with locks.hold(spec.workspace, f"container workspace {spec.workspace}"):
        preflight(spec)
        _clear_workspace_dist(spec.workspace)
        started = time.monotonic()
        with log.step(f"build in {spec.image}") as s, _options_file(spec):
            code = _run_container(c, spec)
            if code != 0:
                raise _failure(code, spec)
            produced = produced_targets(spec.workspace)
            if opts.dry_run:
                s.note("dry run")
                return None
            if len(produced) != 1:
                raise BuildError(
                    f"the container build ended without one dist/<target> in {spec.workspace / 'dist'} "
                    f"(found {len(produced)})",
                    f"see {spec.log_path}",
                )
            final = _publish(
                produced[0],
                opts.dist_dir,
                spec,
                labels,
                time.monotonic() - started,
                opts.force,
                image_ref=image_ref,
                planned=planned,
            )
            s.note(str(final))
        return final


@contextlib.contextmanager
def _options_file(spec: ContainerSpec):
    """The parsed options for the container (it may hold index credentials: 0600, the container's user, removed
    when the container is done), instead of argv on a command line that `docker inspect` shows."""
    path = spec.workspace / Path(OPTIONS_FILE).name
    fsedit.atomic_write(path, (json.dumps(spec.options, indent=1) + "\n").encode(), 0o600)
    try:
        if os.geteuid() == 0:
            os.chown(path, spec.uid, int(spec.user.split(":")[1]), follow_symlinks=False)
        yield path
    finally:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def _run_container(c, spec: ContainerSpec) -> int:
    log.echo_command(
        [
            "docker",
            "run",
            "--rm",
            "--user",
            spec.user,
            *(f"-v={m.host}:{m.container}:{'ro' if m.read_only else 'rw'}" for m in spec.mounts),
            *([f"--network={spec.network}"] if spec.network else []),
            spec.image,
            *spec.command,
        ]
    )
    container = c.containers.create(
        spec.image,
        spec.command,
        user=spec.user,
        volumes=spec.volumes(),
        environment=spec.environment,
        network_mode=spec.network,
        working_dir=REPO_MOUNT,
        labels={f"{builder.LABEL}.run": "build"},
        init=True,
        use_config_proxy=False,
    )
    try:
        # before start: a refused log path leaves nothing running
        with dockerclient.open_log(spec.log_path, "container log") as fh:
            container.start()
            stream_output(container.logs(stream=True, follow=True), fh)
        return int(container.wait().get("StatusCode", 1))
    except KeyboardInterrupt:
        container.stop(timeout=5)
        raise
    finally:
        container.remove(force=True)


def stream_output(chunks, fh) -> None:
    """The container's output, line by line and masked, into the host's log `fh` and onto stderr."""
    for line in dockerclient.lines(chunks):
        text = log.mask(line)
        fh.write(text + "\n")
        sys.stderr.write("│ " + log.sanitise(text) + "\n")  # the log keeps the raw text
        sys.stderr.flush()


def _failure(code: int, spec: ContainerSpec) -> ImageError:
    error = ImageError(
        f"the build inside {spec.image} failed (exit {code}; its one-line error is above)",
        f"container output: {spec.log_path}; build log under {spec.workspace / 'build'}",
    )
    if 2 <= code <= 9:  # the inner apexkit error's own exit code (ConfigError … BenchError)
        error.exit_code = code
    return error


TARGET_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,199}")


def produced_targets(workspace: Path) -> list[Path]:
    """The dist/<target>/ directories the container left in the workspace: real directories (no symlinks) with a
    regular manifest.json, named like a target. Anything else is not listed (and so never copied)."""
    where = workspace / "dist"
    try:
        if not stat.S_ISDIR(where.lstat().st_mode):
            return []
        names = sorted(os.listdir(where))
    except OSError:
        return []
    found = []
    for name in names:
        try:
            if (
                TARGET_NAME.fullmatch(name)
                and stat.S_ISDIR((where / name).lstat().st_mode)
                and stat.S_ISREG((where / name / "manifest.json").lstat().st_mode)
            ):
                found.append(where / name)
        except OSError:
            continue
    return found


def _clear_workspace_dist(workspace: Path) -> None:
    """Remove the workspace's dist/ of an earlier run; a symlink left in its place goes, its target stays."""
    where = workspace / "dist"
    if where.is_symlink() or (where.exists() and not where.is_dir()):
        where.unlink()
    else:
        shutil.rmtree(where, ignore_errors=True)


def _publish(
    produced: Path,
    dist_dir: Path,
    spec: ContainerSpec,
    labels: Mapping[str, str],
    seconds: float,
    force: bool = False,
    image_ref: Mapping | None = None,
    *,
    planned: Callable[..., dict[str, dict]],
) -> Path:
    """Copy dist/<target>/ out of the workspace into the host's dist/, atomically, owned by the invoking user.

    Which dist/<target> is the host's to say: `planned(system_torch=...)` gives the target ids this build may
    produce (buildplan.expected_targets, from the host's options and the image's arch); `produced` must be named one
    of them and its manifest's target python/torch/torch_npu/arch match it (distdir.check_planned), and the host's
    identity, not the container's, is recorded and compared by check_overwrite.

    The workspace is the container's: `produced` must be a real directory directly in <workspace>/dist, its
    manifest.json and wheel regular files (opened without following links, relative to the opened directory),
    wheel.file a plain valid wheel file name. The wheel is copied and hashed here; it must match the manifest's
    sha256, and the host writes wheel.sha256/size from its own copy, then the SBOM and the provenance (apexkit.wheel.sbom,
    with the image's id from `image_ref`) from that copy and the rewritten manifest; nothing else of the container's
    target folder is taken. Anything else: ImageError, nothing in dist/."""
    where = spec.workspace / "dist"
    try:
        if produced.parent != where or not TARGET_NAME.fullmatch(produced.name):
            raise untrusted.Untrusted(
                f"{untrusted.shown(produced.name)} is not a target directory directly in {where}"
            )
        with untrusted.opened_dir(where) as dist_fd, untrusted.opened_dir(
            produced.name, dist_fd
        ) as target_fd:
            manifest, name = distdir.read_manifest(target_fd)
            # a planted link is refused first, as itself, then the plan is checked
            src = untrusted.open_regular(name, target_fd)
        try:
            distdir.check_planned(produced.name, manifest, planned)
            # never over a target built from other inputs (distdir.check_overwrite) unless `force`
            with distdir.lock(dist_dir, produced.name):
                distdir.check_overwrite(
                    dist_dir, produced.name, manifest["target"]["identity"], force
                )
                final = _swap_in(
                    src, name, manifest, dist_dir, produced.name, spec, labels, seconds, image_ref
                )
        finally:
            os.close(src)
    except untrusted.Untrusted as exc:
        left = where / (
            produced.name
            if TARGET_NAME.fullmatch(produced.name)
            else untrusted.shown(produced.name)
        )
        raise ImageError(
            f"refusing what the container left in {left}: {exc}",
            f"nothing was copied to {dist_dir}; inspect {left} and the image {spec.image} "
            f"(rebuild it with {vocab.command('image.build')})",
        ) from None
    uid, gid = dockerclient.invoking_user()
    if os.geteuid() == 0 and uid != 0:
        locks_dir = (
            dist_dir / ".locks"
        )  # distdir.lock's files: the user's next build must be able to take them
        for path in (
            final,
            *final.iterdir(),
            locks_dir,
            *locks_dir.glob(f"{glob.escape(final.name)}.lock*"),
        ):
            with contextlib.suppress(FileNotFoundError):
                os.chown(path, uid, gid, follow_symlinks=False)
    log.result(f"✓ {final / name}")
    log.info(
        f"  sha256 {manifest['wheel']['sha256']}  ({manifest['wheel']['size'] / 1024:.0f} KiB, "
        f"{spec.arch}, built in {spec.image})"
    )
    return final


def _swap_in(
    src: int,
    name: str,
    manifest: dict,
    dist_dir: Path,
    target: str,
    spec: ContainerSpec,
    labels: Mapping[str, str],
    seconds: float,
    image_ref: Mapping | None = None,
) -> Path:
    """dist/<target>/ from the open wheel `src`: appears complete (verified) or not at all."""
    tmp = Path(tempfile.mkdtemp(prefix=f".{target}.tmp-", dir=dist_dir))
    try:
        sha, size = untrusted.copy_fd(src, tmp / name)
        claimed = manifest["wheel"]["sha256"]
        if sha != claimed:
            raise untrusted.Untrusted(
                f"{untrusted.shown(name)} has sha256 {sha[:16]}…, its manifest says {untrusted.shown(claimed[:16])}"
            )
        untrusted.check_zip(tmp / name)
        manifest["wheel"] = {"file": name, "sha256": sha, "size": size}
        manifest["builder_image"] = {
            "image": spec.image,
            "arch": spec.arch,
            "base": labels.get(f"{builder.LABEL}.base"),
            "recipe": labels.get(f"{builder.LABEL}.recipe"),
            "user": spec.user,
            "container_seconds": round(seconds, 1),
        }
        if image_ref:
            manifest["builder_image"].update(
                id=image_ref.get("id"), repo_digests=list(image_ref.get("repo_digests") or [])
            )
        try:
            for file_name, data in sbom.documents(
                manifest, tmp / name
            ).items():  # sets manifest["attestations"]
                (tmp / file_name).write_bytes(data)
        except sbom.SbomError as exc:
            raise untrusted.Untrusted(str(exc)) from None
        (tmp / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
        os.chmod(tmp, 0o755)  # mkdtemp makes it 0700
        fsedit.swap_directory(tmp, dist_dir / target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return dist_dir / target
