"""Builder images: `docker/` + a base image you name -> apexkit/builder:<base>-<arch>, through the Docker SDK.

- The build context is assembled in a temporary directory: docker/Dockerfile and its scripts, the tool
  requirements (filtered from requirements/runtime.in, so the pins live in one place) and the CA bundle (or an empty file).
- Proxies go in only as Docker's predefined build args (never stored in the image or its history).
- Foreign architectures run through QEMU binfmt; `emulation()` reads /proc/sys/fs/binfmt_misc and says what is
  missing and how to enable it before anything is built.
- `--base debootstrap[:suite]` makes a Debian base without any registry (debootstrap once, cached, docker import).
- Which Pythons an image has: its builder.json (distro / manylinux / uv), read without starting a container;
  `--pythons 3.X` adds one with uv at build time. matrix.toml [matrix.images] says which base has which
  Python, so a build is checked against its image, and the image that fits is named, before anything runs.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import shutil
import tarfile
import tempfile
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from apexkit import (
    cachetrust,
    checks,
    config,
    dockerclient,
    fsedit,
    log,
    netenv,
    paths,
    untrusted,
    urls,
    vocab,
)
from apexkit.declare import option, whole_number
from apexkit.errors import ApexkitError, ConfigError, ImageError, InterpreterNotFoundError
from apexkit.plan import matrix
from apexkit.proxy import layers

DOCKER_DIR = paths.DOCKER
CONTEXT_FILES = ("Dockerfile", "install-toolchain.sh", "entrypoint.sh")
# what runs inside the builder; pins (one per Python range, by environment marker) from requirements/runtime.in
TOOL_REQUIREMENTS = (
    "nox",
    "virtualenv",
    "filelock",
    "uv",
    "pyelftools",
    "auditwheel",
    "rich",
    "packaging",
    "tomli",
)
BUILDER_REPO = "apexkit/builder"
BUILDER_JSON = "/usr/local/share/apexkit/builder.json"
BASE_REPO = "apexkit/base"
LABEL = dockerclient.LABEL
BINFMT_DIR = Path(
    os.environ.get("APEXKIT_BINFMT_DIR") or "/proc/sys/fs/binfmt_misc"
)  # env: tests, chroots
_STEP = re.compile(r"^Step (\d+)/(\d+) : (.*)$")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")  # the classic builder colours RUN steps' stderr


# --- architectures and emulation -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Emulation:
    arch: str
    host: str
    native: bool
    usable: bool
    detail: str  # what was found
    hint: str = ""  # how to enable it, when not usable

    def row(self) -> checks.Row:
        """This state as a row of the shared report (image.emulation): ok when usable, else fail."""
        return checks.Row(
            "emulation",
            self.arch,
            checks.OK if self.usable else checks.FAIL,
            self.detail,
            self.hint,
            {"host": self.host, "native": self.native, "usable": self.usable},
        )

    @staticmethod
    def legacy_json(row: checks.Row) -> dict:
        """image.emulation --json's keys from before the shared model (detail is common), kept for scripts."""
        return {"arch": row.name, **row.data, "hint": row.fix}

    def require(self, doing: str) -> Emulation:
        """This state when usable, else ImageError: cannot <doing> on this <host> host."""
        if not self.usable:
            raise ImageError(f"cannot {doing} on this {self.host} host: {self.detail}", self.hint)
        return self


def emulation(arch: str, binfmt_dir: Path = BINFMT_DIR, host: str | None = None) -> Emulation:
    """Can this host run `arch` binaries in a container? Native, or a QEMU binfmt handler with the F flag."""
    host = host or dockerclient.host_arch()
    if arch == host:
        return Emulation(arch, host, True, True, "native")
    entry = binfmt_dir / f"qemu-{arch}"
    text = entry.read_text(errors="replace") if entry.exists() else ""
    fields = dict(line.split(" ", 1) for line in text.splitlines() if " " in line)
    flags, interpreter = fields.get("flags:", "").strip(), fields.get("interpreter", "?").strip()
    enable = (
        "apt-get install qemu-user-static binfmt-support (dnf install qemu-user-static on openEuler), "
        f"mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc, update-binfmts --enable qemu-{arch}"
    )
    for failed, detail, hint in (
        (
            not (binfmt_dir / "status").exists(),
            f"binfmt_misc is not mounted at {binfmt_dir}",
            enable,
        ),
        (not entry.exists(), f"no QEMU handler for {arch} is registered ({entry} missing)", enable),
        (
            not text.startswith("enabled"),
            f"qemu-{arch} is registered but disabled",
            f"update-binfmts --enable qemu-{arch}",
        ),
        (
            "F" not in flags,
            f"qemu-{arch} is registered without the F (fix-binary) flag, so containers cannot reach "
            f"{interpreter}",
            "install Debian's qemu-user-static (it registers with F), or re-register the handler with flags F",
        ),
    ):
        if failed:
            return Emulation(arch, host, False, False, detail, hint)
    return Emulation(arch, host, False, True, f"QEMU {interpreter} (flags {flags})")


# --- inputs ----------------------------------------------------------------------------------------------------------


def tool_requirements(requirements: Path = paths.RUNTIME_PINS) -> str:
    """The direct pins (requirements/runtime.in) the builder's tool venv needs. Not the hashed lock: the image's pip
    resolves their dependencies from whatever index the image is given (a mirror may hold other releases of them)."""

    def name(line: str) -> str:
        return re.split(r"[=<>!~;\[ ]", line, maxsplit=1)[0].lower()

    lines = [x.strip() for x in requirements.read_text().splitlines()]
    lines = [x for x in lines if name(x) in TOOL_REQUIREMENTS]
    missing = set(TOOL_REQUIREMENTS) - {name(x) for x in lines}
    if missing:
        raise ConfigError(
            f"{requirements.name} lacks {', '.join(sorted(missing))}",
            f"restore {requirements} from git",
        )
    return (
        f"# generated by apexkit/images/builder.py from requirements/{requirements.name}\n"
        + "\n".join(lines)
        + "\n"
    )


def recipe_digest() -> str:
    """Content address of the recipe (docker/ files + tool pins): an image with another digest is stale."""
    digest = hashlib.sha256()
    for name in CONTEXT_FILES:
        digest.update(name.encode() + b"\0" + (DOCKER_DIR / name).read_bytes() + b"\0")
    digest.update(tool_requirements().encode())
    return digest.hexdigest()[:16]


def resolve_ca_bundle(
    option: str | None,
    settings: layers.ProxySettings | None,
    environ: Mapping[str, str] | None = None,
) -> Path | None:
    """--ca-cert FILE | none: the system's CAs plus FILE's certificates, as `proxy.setup --ca-cert` combines them (a
    full bundle works too: each certificate is kept once). Default: the bundle of `invoke proxy.setup --ca-cert`, else
    the one this host's tools are told to use (the first of netenv.CA_VARIABLES that is a file), else none."""
    environ = os.environ if environ is None else environ
    if option is not None:
        if option.lower() == "none":
            return None
        try:
            data = layers.build_ca_bundle(option)
        except ConfigError as exc:
            raise ConfigError(
                exc.cause,
                "pass a PEM file of CA certificates (e.g. your proxy's CA), or --ca-cert none",
            ) from None
        # CA certificates are public: one combined file per content, readable by the container's user
        folder = cachetrust.root(environ) / "ca"
        combined = folder / f"ca-{hashlib.sha256(data).hexdigest()[:16]}.pem"
        try:
            cachetrust.make_dir(folder)
            if not combined.is_file() or combined.read_bytes() != data:
                fsedit.atomic_write(combined, data, 0o644)
        except (OSError, ApexkitError) as exc:
            raise ConfigError(
                f"cannot write the combined CA bundle {combined}: "
                f"{getattr(exc, 'strerror', None) or exc}",
                "set APEXKIT_CACHE_DIR to a directory you can write",
            ) from None
        return combined
    found = [
        settings.ca_bundle if settings else None,
        *(environ.get(n) for n in netenv.CA_VARIABLES),
    ]
    return next((Path(p) for p in found if p and Path(p).is_file()), None)


def slug(reference: str) -> str:
    """An image reference as a tag fragment: registry.example.com/openeuler/openeuler:22.03 -> openeuler-22.03."""
    return (
        re.sub(r"[^A-Za-z0-9_.-]+", "-", reference.rsplit("/", 1)[-1].replace(":", "-"))
        .strip("-.")
        .lower()[:100]
        or "base"
    )


ID_MAX = (1 << 31) - 2  # the largest uid/gid useradd/groupadd take
BUILD_ID = 1000  # the image's non-root build user: uid and gid unless --uid / --gid say otherwise
# docker's reference grammar: [host[:port]/]name-component(/name-component)*[:tag][@digest], names lower case
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_REFERENCE = re.compile(
    rf"(?:[A-Za-z0-9.-]+(?::\d{{1,5}})?/)?{_COMPONENT}(?:/{_COMPONENT})*"
    r"(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(?:@sha256:[0-9a-f]{64})?"
)


def check_reference(reference: str, option: str) -> str:
    """An image reference as docker reads it (one line, no '..', lower-case names), else one ConfigError."""
    if len(reference) > 255 or not _REFERENCE.fullmatch(reference) or ".." in reference:
        raise ConfigError(
            f"{option} {untrusted.shown(reference)} is not an image reference",
            "pass NAME[:TAG] with a lower-case name, e.g. ubuntu:22.04 or registry.local:5000/team/builder:1",
        )
    return reference


def default_tag(base: str, arch: str) -> str:
    return f"{BUILDER_REPO}:{slug(base)}-{arch}"


def debootstrap_suite(base: str) -> str | None:
    """'debootstrap' / 'debootstrap:bookworm' -> the suite to debootstrap; None for a regular image reference."""
    if base == "debootstrap":
        return "bookworm"
    if base.startswith("debootstrap:"):
        suite = base.split(":", 1)[1]
        if not re.fullmatch(r"[a-z]+", suite):
            raise ConfigError(
                f"--base {base}: '{suite}' is not a Debian suite name",
                "e.g. --base debootstrap:bookworm",
            )
        return suite
    return None


@dataclass(frozen=True)
class ImageOptions:
    """Build a builder image: the base + toolchain (its own package manager), tool venv, non-root user, CA hook."""

    arch: str = option(
        None,
        "x86_64 or aarch64 (amd64/arm64 accepted); a foreign arch runs through QEMU binfmt (image.emulation)",
        positional=True,
    )
    base: str = option(
        None,
        "base image: a local or pullable reference (openeuler/openeuler:22.03, ubuntu:22.04, a MindIE image), "
        "or debootstrap[:suite] to make a Debian base here without a registry",
        positional=True,
    )
    tag: str | None = option(None, "image name (default apexkit/builder:<base>-<arch>)")
    network: str | None = option(
        None,
        "network for RUN steps, e.g. host (automatic when the proxy listens on this host's loopback)",
    )
    ca_cert: str | None = option(
        None,
        "PEM file of CA certificates to trust besides the base's (a TLS-intercepting proxy's CA), or 'none' "
        "(default: proxy.setup's bundle, else $SSL_CERT_FILE)",
    )
    extra_packages: str = option(
        "", "more distro packages, space separated (e.g. 'python3.9 python3.9-devel')"
    )
    uid: int = option(
        BUILD_ID,
        f"uid of the non-root build user (default {BUILD_ID})",
        convert=whole_number,
    )
    gid: int = option(BUILD_ID, f"its gid (default {BUILD_ID})", convert=whole_number)
    pip_index: str | None = option(
        None,
        "credential-free index for the tool venv (default: proxy.setup's mirror, else $PIP_INDEX_URL)",
    )
    no_cache: bool = option(False, "rebuild every layer")
    dry_run: bool = option(False, "print the plan; make, pull and build nothing")
    quiet: bool = option(False, "only the step lines, not every line of output")
    pythons: str = option(
        "",
        "more Pythons, e.g. 3.8,3.10: those the base lacks are installed with uv (python-build-standalone "
        "from github.com, through the proxy and CA); builder.json lists each Python and where it came from",
    )


# --- building --------------------------------------------------------------------------------------------------------


@dataclass
class ImagePlan:
    arch: str
    base: str  # as given
    base_ref: str  # what FROM uses
    tag: str
    network: str | None
    ca_bundle: Path | None
    build_args: dict[str, str]
    labels: dict[str, str]
    emulation: Emulation
    no_cache: bool = False
    suite: str | None = None  # --base debootstrap[:suite]
    pythons: list[str] = field(default_factory=list)  # --pythons

    def describe(self) -> list[tuple[str, str]]:
        args = {k: log.mask(v) for k, v in self.build_args.items()}
        uv = (
            f"{', '.join(self.pythons)} where the base lacks them: uv "
            f"{self.build_args.get('APEXKIT_UV_VERSION')} python install (downloads from "
            f"{self.build_args.get('UV_PYTHON_INSTALL_MIRROR') or 'github.com'})"
        )
        return [
            ("arch", f"{self.arch} ({self.emulation.detail})"),
            (
                "base",
                self.base if self.base == self.base_ref else f"{self.base} -> {self.base_ref}",
            ),
            ("tag", self.tag),
            ("network", self.network or "daemon default"),
            ("CA bundle", str(self.ca_bundle) if self.ca_bundle else "none"),
            ("build args", ", ".join(f"{k}={v}" for k, v in sorted(args.items())) or "none"),
            ("recipe", f"docker/ ({self.labels[f'{LABEL}.recipe']})"),
            *([("pythons", uv)] if self.pythons else []),
        ]


def plan_image(
    o: ImageOptions, environ: Mapping[str, str] | None = None, binfmt_dir: Path = BINFMT_DIR
) -> ImagePlan:
    """Every decision of `image.build`, before the daemon is asked anything."""
    environ = os.environ if environ is None else environ
    arch = dockerclient.normalize_arch(o.arch)
    wanted = parse_pythons(o.pythons)
    if not o.base:
        raise ConfigError(
            "--base is required",
            "e.g. --base openeuler/openeuler:22.03 or --base debootstrap:bookworm",
        )
    suite = debootstrap_suite(o.base)
    for reference, flag in ((None if suite else o.base, "--base"), (o.tag, "--tag")):
        if reference is not None:
            check_reference(reference, flag)
    if min(o.uid, o.gid) <= 0:
        raise ConfigError(
            f"--uid {o.uid} / --gid {o.gid}: the build user must not be root",
            f"pass --uid {BUILD_ID} --gid {BUILD_ID}",
        )
    if max(o.uid, o.gid) > ID_MAX:
        raise ConfigError(
            f"--uid {o.uid} / --gid {o.gid}: beyond the largest id useradd takes ({ID_MAX})",
            "pass your own id (id -u / id -g)",
        )
    cfg = config.load(environ)
    # quay.io and Docker Hub bases through the configured registry prefixes (quay_registry, docker_registry):
    # dockerd's registry-mirrors never apply to quay.io
    base_ref = (
        f"{BASE_REPO}:debian-{suite}-{arch}"
        if suite
        else config.mirrored_base(o.base, environ, cfg)[0]
    )
    settings = layers.current_settings(layers.Paths(), environ)
    proxy = settings.environment() if settings else {}
    return ImagePlan(
        arch=arch,
        base=o.base,
        base_ref=base_ref,
        build_args={
            "BASE_IMAGE": base_ref,
            "APEXKIT_ARCH": arch,
            "APEXKIT_EXTRA_PACKAGES": o.extra_packages,
            "APEXKIT_PIP_INDEX_URL": _image_pip_index(o.pip_index, settings, cfg, environ),
            "BUILD_UID": str(o.uid),
            "BUILD_GID": str(o.gid),
            **{name: proxy[name] for name in netenv.DOCKER_PROXY_ARGS if proxy.get(name)},
            **_python_build_args(wanted, cfg, environ),
        },
        labels={
            f"{LABEL}.builder": "1",
            f"{LABEL}.arch": arch,
            f"{LABEL}.base": base_ref,
            f"{LABEL}.recipe": recipe_digest(),
            f"{LABEL}.uid": str(o.uid),
            f"{LABEL}.gid": str(o.gid),
        },
        tag=o.tag or default_tag(f"debian:{suite}" if suite else o.base, arch),
        network=o.network or auto_network(settings),
        ca_bundle=resolve_ca_bundle(o.ca_cert, settings, environ),
        emulation=emulation(arch, binfmt_dir),
        no_cache=o.no_cache,
        suite=suite,
        pythons=wanted,
    )


def _image_pip_index(
    pip_index: str | None, settings: layers.ProxySettings | None, cfg, environ: Mapping[str, str]
) -> str:
    """--pip-index, else proxy.setup's, else PIP_INDEX_URL / index_url of the config files; checked, login-free."""
    setting = cfg.get("index_url", environ)
    index, index_from = (
        (pip_index, "--pip-index")
        if pip_index
        else (settings.pip_index, "the pip index of proxy.setup")
        if settings and settings.pip_index
        else (str(setting.value), setting.origin)
    )
    if index:  # the one URL validator; then no userinfo of any form (user:pw@, :pw@, TOKEN@): `docker history` keeps it
        urls.index_url(index, index_from)
        _no_login_in_history(
            index,
            index_from,
            "the pip index URL holds a password or token (user info before '@', a query)",
        )
    return index


def _python_build_args(wanted: list[str], cfg, environ: Mapping[str, str]) -> dict[str, str]:
    """--pythons: which to add with uv, its version and (uv_python_mirror) where uv downloads them from."""
    if not wanted:
        return {}
    args = {
        "APEXKIT_PYTHONS": " ".join(wanted),
        "APEXKIT_UV_VERSION": str(
            matrix.load().data.get("matrix", {}).get("images", {}).get("uv", "")
        ),
    }
    mirror = cfg.get("uv_python_mirror", environ)
    # uv python install reads it (python-build-standalone from github.com otherwise)
    if mirror.configured:
        _no_login_in_history(
            mirror.text, mirror.origin, "the Python mirror URL holds a password or token"
        )
        args["UV_PYTHON_INSTALL_MIRROR"] = mirror.text
    return args


def _no_login_in_history(url: str, origin: str, why: str) -> None:
    """A build argument stays in `docker history`: a URL holding a login or a query value (?token=) is refused."""
    if log.mask(url) != url:
        raise ConfigError(
            f"{origin} {urls.shown(url)}: {why}, which a build argument would store in the image history",
            "use a credential-free mirror for the image build, or the proxy",
        )


def parse_pythons(value: str) -> list[str]:
    """--pythons 3.8,3.10 -> ['3.8', '3.10'] (each one a version apexkit supports)."""
    wanted = [v for v in re.split(r"[,\s]+", value or "") if v]
    supported = matrix.load().supported_pythons
    for v in wanted:
        if v not in supported:
            raise ConfigError(
                f"--pythons {value}: '{v}' is not a supported Python (matrix.toml [pythons] supported: "
                f"{', '.join(supported)})",
                "e.g. --pythons 3.8,3.10",
            )
    return list(dict.fromkeys(wanted))


def auto_network(settings: layers.ProxySettings | None) -> str | None:
    """A proxy on this host's loopback is reachable from a build only on the host network."""
    for url in (settings.http, settings.https) if settings else ():
        host = layers.host_port(url).rsplit(":", 1)[0].strip("[]")
        if host in ("localhost", "::1") or host.startswith("127."):
            return "host"
    return None


def ensure_base(c, plan: ImagePlan) -> None:
    """The base image in the daemon: made by debootstrap (cached tarball), found locally, or pulled."""
    from apexkit.images import bases

    image = dockerclient.get_image(c, plan.base_ref)
    if plan.suite:
        if image is None:
            tarball = bases.rootfs_tarball(plan.suite, dockerclient.ARCHES[plan.arch])
            repository, tag = plan.base_ref.split(":", 1)  # f"{BASE_REPO}:debian-{suite}-{arch}"
            bases.import_image(
                c, tarball, repository, tag, changes=[f"LABEL {LABEL}.arch={plan.arch}"]
            )
        return
    found = dockerclient.image_arch(image or _pull(c, plan.base_ref, plan.arch))
    if found and found != plan.arch:
        log.warn(
            f"{plan.base_ref} says it is {found}; building for {plan.arch} anyway (docker import labels "
            "everything amd64): the first RUN step checks the real machine"
        )


def _pull(c, reference: str, arch: str):
    with log.step(f"pull {reference} ({arch})") as s:
        last = ""
        try:
            for event in c.api.pull(
                reference, platform=f"linux/{dockerclient.ARCHES[arch]}", stream=True, decode=True
            ):
                if "error" in event:
                    raise RuntimeError(event["error"])
                status = event.get("status", "")
                if status not in ("", last) and not re.match("Downloading|Extracting", status):
                    log.info(f"  {event.get('id', '')} {status}".rstrip())
                    last = status
        except Exception as exc:
            raise ImageError(
                f"base image {reference} is not in the daemon and could not be pulled: "
                f"{log.mask(str(exc).splitlines()[0][:200])}",
                f"check the daemon's proxy ({vocab.command('proxy.check')}), docker load it, or use --base debootstrap",
            ) from None
        image = dockerclient.get_image(c, reference)
        if image is None:
            raise ImageError(
                f"pulled {reference} but the daemon does not list it", "docker images; retry"
            )
        s.note(image.short_id)
        return image


def build(plan: ImagePlan, c=None, verbose: bool = True) -> dict:
    """Build the image, streaming the daemon's output with step progress. Returns builder.json of the image."""
    plan.emulation.require(f"build an {plan.arch} image")
    c = c or dockerclient.client()
    ensure_base(c, plan)
    log_path = (
        cachetrust.trusted_output(paths.build_dir(), paths.BUILD_SETTING)
        / "images"
        / f"{slug(plan.tag)}.log"
    )
    cachetrust.make_dir(log_path.parent)
    with dockerclient.open_log(log_path, "image log") as fh, tempfile.TemporaryDirectory(
        prefix="apexkit-image-"
    ) as tmp, log.step(f"docker build {plan.tag}") as s:
        context = Path(tmp)  # the recipe, the tool pins and the CA bundle (or an empty file)
        for name in CONTEXT_FILES:
            shutil.copy2(DOCKER_DIR / name, context / name)
        (context / "requirements-tools.txt").write_text(tool_requirements())
        (context / "ca").mkdir()
        (context / "ca" / "ca-bundle.pem").write_bytes(
            plan.ca_bundle.read_bytes() if plan.ca_bundle else b""
        )
        fh.write(f"image.build {plan.tag}\n" + "".join(f"{k}: {v}\n" for k, v in plan.describe()))
        error, lines = _follow_build(
            c.api.build(
                path=str(context),
                tag=plan.tag,
                buildargs=plan.build_args,
                labels=plan.labels,
                network_mode=plan.network,
                rm=True,
                forcerm=True,
                nocache=plan.no_cache,
                pull=False,
                decode=True,
                use_config_proxy=False,
            ),
            fh,
            verbose,
        )
        if error:
            raise _build_failure(error, lines, log_path)
        info = builder_json(c, plan.tag)
        if info is None:
            raise ImageError(
                f"{plan.tag} was built but does not describe itself ({BUILDER_JSON} unreadable)",
                "rebuild with --no-cache",
            )
        s.note(f"{len(lines)} lines of output, log {log_path}")
    return info


def _follow_build(stream: Iterable[dict], fh, verbose: bool) -> tuple[str, list[str]]:
    """The daemon's build output, masked, into the log `fh` (timed steps) and onto the console (step lines, and
    with `verbose` the others). Returns (the daemon's error, "" when none; the lines)."""
    started = time.monotonic()
    errors: list[str] = []

    def text() -> Iterator[str]:
        for chunk in stream:
            if "error" in chunk:
                errors.append(chunk.get("errorDetail", {}).get("message") or chunk["error"])
                fh.write(log.mask(errors[-1]) + "\n")
            else:
                yield chunk.get("stream", "")

    lines: list[str] = []
    for line in dockerclient.lines(text()):
        line = log.mask(_ANSI.sub("", line).rstrip("\r"))
        lines.append(line)
        step, seconds = _STEP.match(line), time.monotonic() - started
        fh.write(line + (f"  [+{seconds:.0f}s]" if step else "") + "\n")
        if step:
            log.console.print(
                f"[bold]  [{step[1]}/{step[2]}][/bold] {log.escape(log.sanitise(step[3][:110]))} "
                f"[dim]({log.format_seconds(seconds)})[/dim]"
            )
        elif verbose and line.strip() and not line.startswith((" ---> ", "Removing intermediate")):
            log.console.print(f"[dim]    {log.escape(log.sanitise(line[:200]))}[/dim]")
    return (errors[-1] if errors else ""), lines


def _build_failure(error: str, lines: list[str], log_path: Path) -> ImageError:
    for line in reversed(lines):
        if line.startswith("apexkit-error: "):
            cause, _, hint = line[len("apexkit-error: ") :].partition(" | ")
            return ImageError(cause, hint or f"full log: {log_path}")
    step = next((m for m in (_STEP.match(x) for x in reversed(lines)) if m), None)
    where = f" at step {step[1]}/{step[2]} ({step[3][:60]})" if step else ""
    hint = f"full log: {log_path}"
    if re.search(
        r"timed? ?out|Temporary failure resolving|Could not resolve|Connection refused|i/o timeout",
        error + "\n".join(lines[-20:]),
    ):
        hint += f"; downloads failed: check the proxy ({vocab.command('proxy.check')}) and --network host for a loopback proxy"
    return ImageError(f"docker build failed{where}: {log.mask(error.strip()[:200])}", hint)


def summary_lines(info: dict) -> list[str]:
    return [
        f"  {'user':<16}{info['user']} (uid {info['uid']}, gid {info['gid']})",
        f"  {'package manager':<16}{info['package_manager']}",
        f"  {'installed':<16}{' '.join(info.get('installed') or []) or 'nothing (the base has the toolchain)'}",
        f"  {'tool venv':<16}/opt/apexkit/venv (Python {info['tool_python']})",
        *(
            f"  {'python':<16}{p['path']} {p['version']} ({p.get('source', 'distro')})  packages in "
            + (p["platlib"] if p["platlib"] == p["purelib"] else f"{p['purelib']} + {p['platlib']}")
            for p in info["pythons"]
        ),
    ]


# --- which image has which Python ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class ImageChoice:
    """The builder image matrix.toml names for a Python and arch, and the `image.build` that makes it."""

    python: str
    arch: str
    image: str
    base: str  # as `invoke image.build --base` takes it
    note: str = ""  # e.g. why no Debian suite fits

    @property
    def build_command(self) -> str:
        return vocab.command("image.build", f"--arch {self.arch} --base {self.base}")


def choose_image(data: Mapping, python: str, arch: str) -> ImageChoice:
    """matrix.toml [matrix.images] row of this Python (a base whose own python3.X it is), else [matrix] image."""
    table = data.get("matrix", {})
    row = table.get("images", {}).get(python)
    if row is None:
        image = table.get("image", f"{BUILDER_REPO}:debian-bookworm-{{arch}}").format(arch=arch)
        return ImageChoice(python, arch, image, base_for_tag(image) or "<base image>")
    if isinstance(row, str):
        row = {"base": row}
    base = row["base"].format(arch=arch)
    suite = debootstrap_suite(base)
    image = row.get("image", "").format(arch=arch) or default_tag(
        f"debian:{suite}" if suite else base, arch
    )
    return ImageChoice(python, arch, image, base, row.get("note", ""))


def base_for_tag(image: str) -> str | None:
    """The --base that made an image of ours, read from its label-free name: apexkit/builder:debian-bullseye-x86_64
    -> debootstrap:bullseye. None for any other name (the base cannot be told from it)."""
    match = re.fullmatch(re.escape(BUILDER_REPO) + r":debian-([a-z]+)-(x86_64|aarch64)", image)
    return f"debootstrap:{match[1]}" if match else None


def build_hint(image: str, arch: str | None = None, data: Mapping | None = None) -> str:
    """The command that makes a missing builder image, with its own arch (apexkit/builder:<base>-<arch> says it) and
    (where the name or matrix.toml [matrix.images] says it) its base."""
    named = re.fullmatch(re.escape(BUILDER_REPO) + r":.+-(x86_64|aarch64)", image)
    arch = arch or (named[1] if named else dockerclient.host_arch())
    for python in (data or {}).get("matrix", {}).get("images", {}):
        choice = choose_image(data or {}, python, arch) if python[:1].isdigit() else None
        if choice and choice.image == image:
            return choice.build_command
    base = base_for_tag(image)
    tag = (
        ""
        if (base and default_tag(f"debian:{base.split(':', 1)[1]}", arch)) == image
        else f" --tag {image}"
    )
    return vocab.command("image.build", f"--arch {arch} --base {base or '<base image>'}{tag}")


def builder_json(c, image: str) -> dict | None:
    """builder.json of a local image, read from its file system without starting it (no emulation needed for a
    foreign arch); None when the image has none (built by an older recipe)."""
    import docker

    container = c.containers.create(image, command=["true"], network_mode="none")
    try:
        stream, stat = container.get_archive(BUILDER_JSON)
        if (
            stat.get("size", 0) > 1 << 20
        ):  # the image is untrusted: a real builder.json is a few KiB
            return None
        with tarfile.open(fileobj=io.BytesIO(b"".join(stream))) as tar:
            info = tar.getmembers()[0]
            member = (
                tar.extractfile(info) if info.isfile() else None
            )  # a link or device: not a builder.json
            data = json.loads(member.read().decode()) if member else None
    except (docker.errors.NotFound, ValueError, tarfile.TarError, IndexError):
        return None
    finally:
        container.remove(force=True)
    return data if isinstance(data, dict) else None


def python_versions(info: Mapping) -> list[str]:
    """The X.Y of every python3.X in builder.json, in its order."""
    pythons = info.get("pythons")  # from an image: anything may be there
    return [
        ".".join(p["version"].split(".")[:2])
        for p in (pythons if isinstance(pythons, list) else [])
        if isinstance(p, dict) and isinstance(p.get("version"), str)
    ]


def require_python(
    info: Mapping | None, image: str, python: str, arch: str, data: Mapping, what: str = ""
) -> None:
    """Refuse a build for `python` in an image whose builder.json lacks it, naming the image that has it."""
    if info is None:
        return  # an image from an older recipe: the build inside it finds out (and says so)
    have = python_versions(info)
    if python in have:
        return
    prefix = f"{what}: " if what else ""
    choice = choose_image(data, python, arch)
    fits = "" if choice.image == image else f" (then --image {choice.image})"
    why = f"; {choice.note}" if choice.note else ""
    raise InterpreterNotFoundError(
        f"{prefix}{image} has Python {', '.join(have) or 'none'} only",
        f"Python {python} needs a base that has it: {choice.build_command}{fits}{why}, or --pythons {python} "
        f"(uv; downloads from github.com)",
    )


class ImageFacts:
    """builder.json per local image, read once each (a matrix run asks about one image many times)."""

    def __init__(self, c=None) -> None:
        self._client = c
        self._seen: dict[str, tuple[bool, dict | None]] = {}
        self.error: str | None = None  # why the daemon could not be asked, when it could not

    def get(self, image: str) -> tuple[bool, dict | None]:
        """(exists, builder.json or None)."""
        if image not in self._seen:
            c = self.client()
            if c is None:
                return False, None
            found = dockerclient.get_image(c, image)
            self._seen[image] = (
                found is not None,
                builder_json(c, image) if found is not None else None,
            )
        return self._seen[image]

    def client(self):
        if self._client is None and self.error is None:
            try:
                self._client = dockerclient.client(timeout=60)
            except ImageError as exc:
                self.error = exc.cause
        return self._client


# --- list and prune --------------------------------------------------------------------------------------------------


def list_rows(c) -> list[dict]:
    current = recipe_digest()
    rows = []
    ours = c.images.list(filters={"label": f"{LABEL}.builder"})
    for image in ours + c.images.list(filters={"reference": BASE_REPO}):
        labels = dockerclient.labels(image)
        builder = f"{LABEL}.builder" in labels
        rows.append(
            {
                "tags": image.tags or ["<none>"],
                "id": image.short_id.split(":")[-1],
                "kind": "builder" if builder else "base",
                "arch": dockerclient.image_arch(image),
                "base": labels.get(f"{LABEL}.base", ""),
                "created": image.attrs.get("Created", "")[:19].replace("T", " "),
                "size_mb": round(image.attrs.get("Size", 0) / 1e6, 1),
                "stale": builder and labels.get(f"{LABEL}.recipe") != current,
            }
        )
    return rows


def prune(c, everything: bool = False, dry_run: bool = False) -> tuple[list[str], list[str]]:
    """Remove stale builder images (recipe changed) and untagged ones; with `everything`, all of ours. Returns (the
    removed, the kept): an image the daemon will not remove (another image is built FROM it, a container uses it) is
    kept, named with the daemon's reason; the others are removed all the same."""
    import docker

    removed: list[str] = []
    kept: list[str] = []
    for row in list_rows(c):
        untagged = row["tags"] == ["<none>"]
        names = [row["id"]] if untagged else row["tags"]
        if not (everything or row["stale"] or untagged):
            continue
        try:
            for name in [] if dry_run else names:
                c.images.remove(name, noprune=False)
            removed.append(names[0])
        except docker.errors.APIError as exc:
            reason = getattr(exc, "explanation", None) or str(exc)
            kept.append(f"{names[0]} ({log.sanitise(str(reason))[:160]})")
    return removed, kept
