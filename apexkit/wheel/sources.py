"""Upstream sources: cached git mirrors of Ascend apex and NVIDIA apex, and a fresh generated tree per build.

The generated tree reproduces what Ascend's scripts/build.sh does (pinned NVIDIA apex + patch/npu.patch + src/ +
tests/) without running it: build.sh clones again and re-applies the patch on every run, wiping local fixes.
"""

from __future__ import annotations

import hashlib
import io
import os
import re
import shutil
import subprocess
import tarfile
import time
import urllib.parse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from apexkit import cachetrust, locks, log, paths, untrusted, vocab
from apexkit.errors import ConfigError, PatchError, SourceError
from apexkit.proc import last_line

SHA_RE = re.compile(r"^[0-9a-f]{40}\Z")
_BUILD_SH_PIN = re.compile(r"git\s+checkout\s+([0-9a-f]{40})\b")
ALL_REFS = ("+refs/heads/*:refs/heads/*", "+refs/tags/*:refs/tags/*")
_FILL_HINT = (
    "run once without --offline to fill the cache, or use a local mirror (a path or file:// URL)"
)


cache_dir = paths.cache_dir  # the one home of the cache location is apexkit.paths


def _git_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env["GIT_TERMINAL_PROMPT"] = "0"  # never hang on a credential prompt in CI
    env.setdefault("GIT_ASKPASS", "true")
    env.update(extra or {})
    return env


# A credential helper given on git's command line for one fetch: it answers from the environment of that git process
# (readable only by its user, unlike the command line or the mirror's config file). The empty helper first drops the
# helpers of the user's own git config, so none of them is asked for, or stores, these credentials.
_ENV_CREDENTIAL_HELPER = (
    '!f() { test "$1" = get || return 0; '
    'printf \'username=%s\\npassword=%s\\n\' "$APEXKIT_GIT_USERNAME" "$APEXKIT_GIT_PASSWORD"; }; f'
)


def split_credentials(url: str) -> tuple[str, tuple[str, str] | None]:
    """https://user:token@host/x -> (https://host/x, (user, token)), percent-decoding both. Other URLs (file, ssh:
    keys, not passwords) come back unchanged with None."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme.lower() not in ("http", "https") or "@" not in parts.netloc:
        return url, None
    userinfo, _, hostport = parts.netloc.rpartition("@")
    user, _, password = userinfo.partition(":")
    public = urllib.parse.urlunsplit(
        (parts.scheme, hostport, parts.path, parts.query, parts.fragment)
    )
    return public, (urllib.parse.unquote(user), urllib.parse.unquote(password))


def git(
    args: Sequence[str],
    *,
    git_dir: Path | None = None,
    check: bool = True,
    echo: bool = True,
    stdout_bytes: bool = False,
    credentials: tuple[str, str] | None = None,
) -> subprocess.CompletedProcess:
    """Run git (echoed, secrets masked). `credentials` reach git through the environment and a helper, never through
    its command line or a file."""
    argv = ["git"] + ([f"--git-dir={git_dir}"] if git_dir else []) + list(args)
    if echo:
        log.echo_command(argv)
    extra: dict[str, str] = {}
    if credentials is not None:
        argv[1:1] = [
            "-c",
            "credential.helper=",
            "-c",
            f"credential.helper={_ENV_CREDENTIAL_HELPER}",
        ]
        extra = {"APEXKIT_GIT_USERNAME": credentials[0], "APEXKIT_GIT_PASSWORD": credentials[1]}
    try:
        proc = subprocess.run(argv, capture_output=True, text=not stdout_bytes, env=_git_env(extra))
    except FileNotFoundError:
        raise SourceError(
            "git is not installed (not on PATH): apexkit fetches the apex sources with it",
            "install git (apt-get install git / dnf install git) or put it on PATH",
        ) from None
    if check and proc.returncode != 0:
        err = proc.stderr.decode() if isinstance(proc.stderr, bytes) else proc.stderr
        raise SourceError(
            f"git {args[0]} failed: {log.mask(last_line(err))}", "see the git message above"
        )
    return proc


@dataclass(frozen=True)
class RetryPolicy:
    attempts: int = 3
    backoff: float = 2.0  # seconds before the 2nd attempt, doubled each time

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> RetryPolicy:
        from apexkit import envvars

        env = os.environ if env is None else env
        return cls(
            envvars.integer(env, "APEXKIT_FETCH_RETRIES", 3, low=1, high=20),
            envvars.number(env, "APEXKIT_FETCH_BACKOFF", 2.0, low=0.0, high=600.0),
        )


class Mirror:
    """A bare mirror of one upstream URL in the cache; objects are fetched only when missing.

    Fetches (and the first init) hold the mirror's lock (apexkit.locks), so builds sharing a cache take turns; reads
    (rev-parse, archive) need none: git updates refs atomically. Credentials in an http(s) URL are kept out of the
    mirror: `url` and the mirror's config hold the URL without them, and each fetch gets them from its environment."""

    def __init__(self, url: str, cache: Path, retry: RetryPolicy | None = None) -> None:
        self.url, self._credentials = split_credentials(local_url(url))
        self.local = self.url.startswith("file://")  # needs no network: fetched from even --offline
        # keyed by the URL without credentials: a rotated token keeps its mirror
        slug = (
            re.sub(r"[^A-Za-z0-9]+", "-", self.url.rstrip("/").rsplit("/", 1)[-1]).strip("-")
            or "repo"
        )
        cache = cachetrust.trusted(
            cache
        )  # a cache others can write: a private one (git runs the hooks it holds)
        self.path = (
            cache / "git" / f"{slug}-{hashlib.sha256(self.url.encode()).hexdigest()[:12]}.git"
        )
        self.retry = retry or RetryPolicy.from_env()
        for part in (self.path, self.path / "config", self.path / "hooks"):
            reason = cachetrust.entry_problem(part)
            if reason:
                raise ConfigError(
                    f"git mirror {part} is {reason}: not using it (its config and hooks run as this build)",
                    f"remove {self.path} (it is fetched again), or set APEXKIT_CACHE_DIR to a directory only "
                    "you can write",
                )

    def _lock(self):
        return locks.hold(self.path, f"git mirror {self.path.name}")

    def _ensure_init(self) -> None:
        """Create the bare mirror (held lock): built under a temporary name, renamed into place when complete."""
        if (self.path / "HEAD").exists():
            return
        tmp = self.path.with_name(self.path.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)  # an init killed half-way
        cachetrust.make_dir(tmp.parent)
        git(["init", "--bare", "--quiet", str(tmp)], echo=False)
        git(["remote", "add", "origin", self.url], git_dir=tmp, echo=False)
        os.replace(tmp, self.path)

    def commit_time(self, sha: str) -> int | None:
        out = git(
            ["log", "-1", "--format=%ct", sha], git_dir=self.path, check=False, echo=False
        ).stdout.strip()
        return int(out) if out.isdigit() else None

    def has_commit(self, rev: str) -> bool:
        if not (self.path / "HEAD").exists():
            return False
        return (
            git(
                ["cat-file", "-e", f"{rev}^{{commit}}"], git_dir=self.path, check=False, echo=False
            ).returncode
            == 0
        )

    def fetch(self, refspecs: Sequence[str]) -> None:
        """git fetch (holding the mirror's lock) with retries and exponential backoff; then one clear error."""
        with self._lock():
            self._ensure_init()
            self._fetch(refspecs)

    def _fetch(self, refspecs: Sequence[str]) -> None:
        # set-url also rewrites the credentialed URL an older apexkit stored in the config
        git(["remote", "set-url", "origin", self.url], git_dir=self.path, echo=False)
        delay = self.retry.backoff
        last = ""
        for attempt in range(1, self.retry.attempts + 1):
            proc = git(
                ["fetch", "--quiet", "--prune", "--update-shallow", "origin", *refspecs],
                git_dir=self.path,
                check=False,
                credentials=self._credentials,
            )
            if proc.returncode == 0:
                return
            last = last_line(proc.stderr)
            final = self._no_retry(refspecs, proc.stderr)
            if final is not None:
                raise final
            if attempt < self.retry.attempts:
                log.warn(
                    f"fetch from {self.url} failed (attempt {attempt}/{self.retry.attempts}): {last}; "
                    f"retrying in {delay:g}s"
                )
                time.sleep(delay)
                delay *= 2
        from apexkit.wheel import known_failures

        raise SourceError(
            f"could not fetch {log.mask(self.url)} after {self.retry.attempts} attempts: {log.mask(last)}",
            known_failures.announce(proc.stderr)
            or f"check the URL and your proxy ({vocab.command('proxy.check')}), or point APEXKIT_ASCEND_APEX_URL / "
            "APEXKIT_NVIDIA_APEX_URL at a reachable mirror; with no network: a local mirror and --offline "
            "--wheelhouse DIR (docs/building.md#mirrors-for-air-gapped-sites)",
        )

    def _no_retry(self, refspecs: Sequence[str], stderr: str) -> SourceError | None:
        """The error of a fetch no retry mends (a missing ref, a repository git refuses to read, a mirror that lacks
        objects), else None."""
        last = last_line(stderr)
        if _is_missing_ref(last):
            return NoSuchRef(
                f"{log.mask(self.url)} has no {' '.join(refspecs)}: {log.mask(last)}",
                "check the ref name or commit",
            )
        dubious = _DUBIOUS.search(stderr)
        if dubious:
            return SourceError(
                f"git refuses {log.mask(self.url)}: detected dubious ownership in repository at "
                f"'{dubious[1]}' (another user owns it)",
                f"git config --global --add safe.directory {dubious[1]}, or use a mirror you own",
            )
        from apexkit.wheel import known_failures

        for f in known_failures.match(stderr):
            if f.id == "git-mirror-incomplete":
                hole = re.search(r"unable to read [0-9a-f]{40}", stderr)
                return SourceError(
                    f"{log.mask(self.url)} lacks objects its history names "
                    f"({hole[0] if hole else log.mask(last)}): no retry fetches them",
                    f"known failure '{f.id}': {f.fix}",
                )
        return None

    def resolve(self, ref: str, offline: bool) -> str:
        """Ref (branch, tag or SHA) -> full commit SHA. Branches and tags are refreshed unless offline (a local
        mirror is read even offline)."""
        if SHA_RE.match(ref) and self.has_commit(ref):
            return ref
        offline = offline and not self.local
        if not offline:
            self.fetch(ALL_REFS)
        elif not (self.path / "HEAD").exists():
            raise SourceError(
                f"--offline, and {log.mask(self.url)} is not in the cache ({self.path})",
                _FILL_HINT,
            )
        for candidate in (f"refs/heads/{ref}", f"refs/tags/{ref}", ref):
            proc = git(
                ["rev-parse", "--verify", "--quiet", f"{candidate}^{{commit}}"],
                git_dir=self.path,
                check=False,
                echo=False,
            )
            if proc.returncode == 0:
                return proc.stdout.strip()
        branches = git(
            ["for-each-ref", "--format=%(refname:short)", "refs/heads"],
            git_dir=self.path,
            check=False,
            echo=False,
        ).stdout.split()
        raise SourceError(
            f"ref '{ref}' not found in {log.mask(self.url)}"
            + (f" (branches: {', '.join(sorted(branches)[:12])})" if branches else ""),
            "pass --apex-ref with an existing branch, tag or full commit SHA",
        )

    def ensure_commit(self, sha: str, offline: bool) -> str:
        """Make sure the pinned commit is present, fetching it only when missing, and verify it."""
        if not SHA_RE.match(sha):
            raise SourceError(
                f"pin '{sha}' is not a full 40-hex commit SHA", "pin NVIDIA apex by its full SHA"
            )
        if not self.has_commit(sha):
            if offline and not self.local:
                raise SourceError(
                    f"--offline, and commit {sha[:12]} of {log.mask(self.url)} is not in the cache",
                    _FILL_HINT,
                )
            with self._lock():
                if not self.has_commit(
                    sha
                ):  # another build may have fetched it while this one waited
                    try:
                        self.fetch([sha])  # servers with protocol v2 / allowReachableSHA1InWant
                    except NoSuchRef:
                        self.fetch(ALL_REFS)
        proc = git(
            ["rev-parse", "--verify", "--quiet", f"{sha}^{{commit}}"],
            git_dir=self.path,
            check=False,
            echo=False,
        )
        got = proc.stdout.strip()
        if proc.returncode != 0 or got != sha:
            raise SourceError(
                f"pinned commit {sha} is not in {log.mask(self.url)}"
                + (f" (resolved to {got})" if got else ""),
                "the mirror may be incomplete or point at another repository; check APEXKIT_NVIDIA_APEX_URL",
            )
        return sha

    def export(self, sha: str, dest: Path, paths: Sequence[str] = ()) -> None:
        """Write the files of `sha` (optionally only `paths`) into `dest`, without .git."""
        proc = git(
            ["archive", "--format=tar", sha, *paths],
            git_dir=self.path,
            stdout_bytes=True,
            echo=False,
        )
        dest.mkdir(parents=True, exist_ok=True)
        with tarfile.open(fileobj=io.BytesIO(proc.stdout)) as tar:
            _extract(tar, dest)


def _extract(tar: tarfile.TarFile, dest: Path) -> None:
    if hasattr(tarfile, "data_filter"):
        tar.extractall(dest, filter="data")
    else:  # pragma: no cover - Python < 3.11.4
        tar.extractall(dest)


def _is_missing_ref(message: str) -> bool:
    return any(
        s in message
        for s in (
            "couldn't find remote ref",
            "not our ref",
            "no such remote ref",
            "not allow request for unadvertised object",
        )
    )


class NoSuchRef(SourceError):
    """The source answered and lacks the ref or commit asked for."""


_DUBIOUS = re.compile(r"detected dubious ownership in repository at '([^'\n]*)'")


def local_url(url: str) -> str:
    """A plain path (/srv/apex.git, ./apex, ~/m/apex) as the file:// URL git reads the same: one mirror for both
    spellings. URLs (scheme://, scp-like host:path) come back unchanged."""
    head = url.split("/", 1)[0]
    if "://" in url or (":" in head and not url.startswith((".", "~"))):
        return url.rstrip("/") if url.startswith("file://") else url
    return "file://" + str(Path(url).expanduser().absolute()).rstrip("/")


# --- the Ascend side -------------------------------------------------------------------------------------------

ASCEND_PARTS = ("patch", "src", "tests", "scripts")


@dataclass(frozen=True)
class AscendSource:
    """Ascend apex's files for one build: a private copy, never the user's checkout."""

    root: Path
    origin: str  # URL or local path
    commit: str  # commit SHA, or "local:<content hash>" for --apex-src
    dirty: bool = False
    commit_time: int | None = (
        None  # committer time (Unix seconds): SOURCE_DATE_EPOCH for reproducible wheels
    )

    @property
    def npu_patch(self) -> Path:
        return self.root / "patch" / "npu.patch"

    def pinned_nvidia_commit(self) -> str | None:
        """The NVIDIA apex commit that scripts/build.sh checks out, when the ref has a build.sh."""
        build_sh = self.root / "scripts" / "build.sh"
        if build_sh.is_file():
            match = _BUILD_SH_PIN.search(build_sh.read_text(errors="replace"))
            if match:
                return match.group(1)
        return None


NPU_PATCH_MAX = 64 << 20  # far above any Ascend apex npu.patch (a few hundred KiB)


def flags_of(root: Path) -> tuple[str, ...]:
    """setup.py flags for a ref not in matrix.toml, read off its patch/npu.patch: --cpp_ext always,
    --npu_float_status when npu.patch builds it."""
    npu_patch = root.expanduser() / "patch" / "npu.patch"
    try:  # a regular file (through a link, as copy_ascend takes it): a FIFO or device is refused, never read
        text = untrusted.read_regular(npu_patch, None, NPU_PATCH_MAX, follow=True).decode(
            errors="replace"
        )
    except untrusted.Refused as exc:
        raise SourceError(
            f"cannot read {npu_patch} ({exc.strerror})"
            if exc.kind == "os"
            else f"{npu_patch} {exc.why}",
            "point --apex-src at an Ascend apex checkout (it has patch/npu.patch)",
        ) from None
    return ("--cpp_ext", "--npu_float_status") if '"--npu_float_status"' in text else ("--cpp_ext",)


def checkout_ascend(mirror: Mirror, sha: str, dest: Path) -> AscendSource:
    mirror.export(sha, dest)
    _require_npu_patch(dest, mirror.url)
    return AscendSource(
        root=dest, origin=mirror.url, commit=sha, commit_time=mirror.commit_time(sha)
    )


def copy_ascend(src: Path, dest: Path) -> AscendSource:
    """--apex-src: copy the user's checkout (never modified); apex/ is build.sh's clone, left out."""
    src = src.expanduser().resolve()
    if not (src / "patch" / "npu.patch").is_file():
        raise SourceError(
            f"--apex-src {src} has no patch/npu.patch", "point it at an Ascend apex checkout"
        )
    dest.mkdir(parents=True, exist_ok=True)
    for part in ASCEND_PARTS:
        if (src / part).is_dir():
            shutil.copytree(src / part, dest / part, symlinks=True)
    commit, dirty = _local_state(src)
    head = subprocess.run(
        ["git", "-C", str(src), "log", "-1", "--format=%ct"], capture_output=True, text=True
    )
    when = (
        int(head.stdout.strip()) if head.returncode == 0 and head.stdout.strip().isdigit() else None
    )
    return AscendSource(root=dest, origin=str(src), commit=commit, dirty=dirty, commit_time=when)


def _local_state(src: Path) -> tuple[str, bool]:
    """A content hash of what the build uses, plus the checkout's commit when it is a git repository."""
    digest = hashlib.sha256()
    for part in ("patch", "src", "tests"):
        base = src / part
        for path in sorted(p for p in base.rglob("*") if p.is_file()) if base.is_dir() else []:
            digest.update(str(path.relative_to(src)).encode() + b"\0" + path.read_bytes() + b"\0")
    head = subprocess.run(
        ["git", "-C", str(src), "rev-parse", "HEAD"], capture_output=True, text=True
    )
    status = subprocess.run(
        ["git", "-C", str(src), "status", "--porcelain"], capture_output=True, text=True
    )
    dirty = head.returncode != 0 or bool(status.stdout.strip())
    prefix = head.stdout.strip()[:12] + "-" if head.returncode == 0 else ""
    return f"local:{prefix}{digest.hexdigest()[:16]}", dirty


def _require_npu_patch(root: Path, origin: str) -> None:
    if not (root / "patch" / "npu.patch").is_file():
        raise SourceError(
            f"{log.mask(origin)} has no patch/npu.patch at this ref",
            "is this the Ascend apex repository? check --ascend-apex-url and --apex-ref",
        )


def generate_tree(ascend: AscendSource, nvidia: Mirror, nvidia_sha: str, dest: Path) -> None:
    """build.sh's steps, done by us in a fresh directory: NVIDIA apex @ pin, npu.patch, src/ and tests/ copied."""
    if dest.exists():
        shutil.rmtree(dest)
    nvidia.export(nvidia_sha, dest)
    if shutil.which("patch") is None:
        raise PatchError(
            "the 'patch' program is missing (npu.patch is applied with patch -p1)",
            "install it: apt-get install patch / dnf install patch",
        )
    proc = subprocess.run(
        ["patch", "-p1", "--batch", "--forward", "-i", str(ascend.npu_patch)],
        cwd=dest,
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        failed = [
            line
            for line in proc.stdout.splitlines()
            if "FAILED" in line or "can't find" in line.lower()
        ]
        raise PatchError(
            f"Ascend's patch/npu.patch does not apply to NVIDIA apex {nvidia_sha[:12]}: "
            f"{(failed or [last_line(proc.stdout + proc.stderr)])[0]}",
            "check that the NVIDIA apex pin matches this Ascend ref (scripts/build.sh names it)",
        )
    for name in ("src", "tests"):
        part = ascend.root / name
        if not part.is_dir():
            continue
        target = dest if name == "src" else dest / "tests"
        shutil.copytree(part, target, dirs_exist_ok=True, symlinks=True)
