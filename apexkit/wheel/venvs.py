"""Virtual environments (virtualenv: always the lib/pythonX.Y/site-packages layout, whatever the base Python's
distro does with lib64/) and pip installs into them, with index options from one place.

A venv shared between builds (the cached build venv) is made under its lock, and the ready check happens inside it:

    with venvs.lock(path):
        if not (path / "apexkit-ready.json").is_file():  # another build may have made it while this one waited
            venv = venvs.create(...); venvs.pip_install(venv, ...); (path / "apexkit-ready.json").write_text(...)

`create` and `pip_install` take the same lock themselves (re-entrant), so two pips never write one venv at once.

What each install put into the venv is remembered in `<venv>/apexkit-installed.json` (INSTALLED_FILE): per
distribution the sha256 of the wheel file it was installed from, as the installer itself reported it -- pip's
`--report` (download_info.archive_info.hashes), uv's resolution of the same name==version with the same options
(`uv pip compile --format pylock.toml`, the file whose tags match the installed WHEEL; a local file re-hashed here),
or the file given on the command line, hashed here. Nothing is guessed: a distribution no installer vouches for has no
entry, and apexkit.wheel.sbom then records the sha256 of its installed RECORD, labelled as such.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packaging.requirements import Requirement
from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename

from apexkit import cachetrust, locks, log, paths, pipconfig, untrusted, vocab
from apexkit.cachetrust import root as cache_dir
from apexkit.errors import EnvironmentSetupError
from apexkit.proc import appending, last_line, run_logged
from apexkit.wheel import known_failures, uvtools


@dataclass(frozen=True)
class IndexOptions:
    index_url: str | None = None
    extra_index_urls: tuple[str, ...] = ()
    torch_index_url: str | None = None
    wheelhouses: tuple[Path, ...] = ()
    offline: bool = False

    def sources(self, config: pipconfig.PipConfig, for_torch: bool = False) -> uvtools.Sources:
        """Where an install looks: these options over pip's configuration (`config`), as pip puts its command line
        over its config -- a primary index here wins, the extra indexes and find-links are pip.conf's then these;
        for torch the torch index is the primary and the index the first extra one. Offline: no index at all."""
        offline = self.offline or config.get("no-index") in ("1", "true", "yes", "on")
        primary = self.torch_index_url if (for_torch and self.torch_index_url) else self.index_url
        extras = list(self.extra_index_urls)
        if for_torch and self.torch_index_url and self.index_url:
            extras.insert(0, self.index_url)
        return uvtools.Sources(
            offline=offline,
            index_url=None if offline else primary or config.get("index-url"),
            extra_index_urls=() if offline else (*config.get_list("extra-index-url"), *extras),
            find_links=(*config.get_list("find-links"), *map(_link, self.wheelhouses)),
        )

    def recorded(self) -> dict:
        """These options as manifest.json records them ("package_sources", read back by apexkit.venvrun for the run
        venv): every URL with its password masked (log.mask; the manifest is published in the team index), the
        wheelhouses as the absolute paths the build read."""

        def shown(url: str | None) -> str | None:
            return log.mask(url) if url else None

        return {
            "index_url": shown(self.index_url),
            "extra_index_urls": [log.mask(u) for u in self.extra_index_urls],
            "torch_index_url": shown(self.torch_index_url),
            "wheelhouses": [str(w) for w in self.wheelhouses],
            "offline": self.offline,
        }

    def key(self) -> dict:
        return {
            "index": self.index_url,
            "extra": list(self.extra_index_urls),
            "torch_index": self.torch_index_url,
            "wheelhouses": [str(w) for w in self.wheelhouses],
            "offline": self.offline,
        }


def _link(wheelhouse: Path) -> str:
    """A wheelhouse as one find-links entry: its path, or its file: URL where a space or comma would split it."""
    text = str(wheelhouse)
    return wheelhouse.absolute().as_uri() if re.search(r"[\s,]", text) else text


@dataclass(frozen=True)
class Venv:
    path: Path

    @property
    def python(self) -> Path:
        return self.path / "bin" / "python"

    def run_json(self, code: str | Path, env: dict | None = None, cwd: Path | None = None) -> Any:
        """The JSON last line of a probe file (a Path: bench/probes) or of a one-line program, run by this venv."""
        argv = [str(code)] if isinstance(code, Path) else ["-c", code]
        proc = subprocess.run(
            [str(self.python), *argv], capture_output=True, text=True, env=env, cwd=cwd
        )
        if proc.returncode != 0:
            raise EnvironmentSetupError(
                f"{self.python} failed: {last_line(proc.stderr)}", "see the message above"
            )
        return json.loads(proc.stdout.strip().splitlines()[-1])


def lock(path: Path) -> contextlib.AbstractContextManager:
    """The lock on the venv at `path` (apexkit.locks): hold it from the ready check to the ready marker."""
    return locks.hold(path, f"venv {path}")


def create(
    interpreter: str,
    path: Path,
    log_path: Path,
    system_site_packages: bool = False,
    index: IndexOptions | None = None,
) -> Venv:
    """A fresh venv at `path` (whatever was there is removed), made under the venv's lock: with uv where it serves
    (`uv venv --seed`: the lib/ layout, pip seeded from uv's cache or the configured index; when seeding cannot reach
    an index, a venv without pip, which gets one from the interpreter's ensurepip only if an install falls back to
    pip), else virtualenv."""
    with lock(path):
        if path.exists():
            shutil.rmtree(path)
        cachetrust.make_dir(path.parent)
        uv = uvtools.find()
        if uv is not None:
            made = _create_uv(
                uv, interpreter, path, log_path, system_site_packages, index or IndexOptions()
            )
            if made is not None:
                return made
        return _create(interpreter, path, log_path, system_site_packages)


def _create_uv(
    uv: uvtools.Uv,
    interpreter: str,
    path: Path,
    log_path: Path,
    system_site_packages: bool,
    index: IndexOptions,
) -> Venv | None:
    base = [
        uv.binary,
        "venv",
        "--quiet",
        "--python",
        interpreter,
        *(["--system-site-packages"] if system_site_packages else []),
    ]
    args, env = uvtools.install_options(*_sources(index, False, log_path))
    env = uvtools.environment(cache_dir(), env)
    code, tail = run_logged([*base, "--seed", *args, str(path)], log_path, env=env)
    if (
        code != 0 or not (path / "bin" / "python").exists()
    ):  # no index for pip (an index serving only a mirror
        shutil.rmtree(path, ignore_errors=True)  # of some projects, offline without uv's cache)
        code, tail = run_logged([*base, str(path)], log_path, env=env)
    if code == 0 and (path / "bin" / "python").exists():
        return Venv(path)
    reason = log.mask(last_line("\n".join(tail)))
    if uvtools.choice() == "uv":
        raise EnvironmentSetupError(
            f"uv could not create a venv with {interpreter}: {reason}",
            f"see {log_path}; unset APEXKIT_INSTALLER to fall back to virtualenv",
        )
    log.info(f"  uv venv failed ({reason}): making it with virtualenv instead")
    shutil.rmtree(path, ignore_errors=True)
    return None


def _ensure_pip(venv: Venv, log_path: Path) -> None:
    """A venv uv made has no pip; pip falls back into it from the interpreter's own ensurepip (offline)."""
    if subprocess.run([str(venv.python), "-c", "import pip"], capture_output=True).returncode == 0:
        return
    code, tail = run_logged([str(venv.python), "-m", "ensurepip", "--default-pip"], log_path)
    if code != 0:
        raise EnvironmentSetupError(
            f"{venv.path} has no pip and {venv.python} cannot add one (ensurepip: "
            f"{log.mask(last_line(chr(10).join(tail)))})",
            "install the interpreter's venv module (Debian/Ubuntu: apt-get install "
            "python3-venv), or set APEXKIT_INSTALLER=pip",
        )


def _create(interpreter: str, path: Path, log_path: Path, system_site_packages: bool) -> Venv:
    # virtualenv runs on the host Python (pinned in requirements/runtime.txt); -p picks the target interpreter. Its own app
    # data (seed wheels) lives in apexkit's cache: the user's may hold wheels a periodic update fetched for the host's
    # Python (seen here: pip 26.2.1 filed under 3.8, a SyntaxError-class failure in every 3.8 venv seeded from it).
    argv = [
        sys.executable,
        "-m",
        "virtualenv",
        "--quiet",
        "--no-periodic-update",
        "--app-data",
        str(cache_dir() / "virtualenv"),
        "-p",
        interpreter,
        str(path),
    ]
    if system_site_packages:
        argv.append("--system-site-packages")
    code, tail = run_logged(argv, log_path)
    if code != 0:
        raise EnvironmentSetupError(
            f"could not create a venv with {interpreter}: {tail[-1] if tail else 'virtualenv failed'}",
            f"see {log_path}; pip install -r requirements/runtime.txt gives the virtualenv apexkit needs",
        )
    return Venv(path)


def pip_install(
    venv: Venv,
    requirements: Sequence[str],
    index: IndexOptions,
    log_path: Path,
    *,
    for_torch: bool = False,
    extra: Sequence[str] = (),
    verbose: bool = False,
    record: bool = True,
) -> None:
    """Install into the venv with uv (pip as the fallback); `record`: note each wheel's digest in the venv for the
    SBOM/provenance (the build venv; a smoke-test venv does not need it)."""
    if not requirements:
        return
    uv = uvtools.find()
    if uv is not None and _uv_install(
        uv, venv, requirements, index, log_path, for_torch, extra, verbose, record
    ):
        return
    _ensure_pip(venv, log_path)
    sources = _sources(index, for_torch, log_path, str(venv.python))[
        1
    ]  # as this pip reads its config
    env = {**os.environ, **sources.environment("PIP")}
    argv = [
        str(venv.python),
        "-m",
        "pip",
        "install",
        "--no-compile",
        "--disable-pip-version-check",
        "--progress-bar",
        "off",
        *extra,
        *requirements,
    ]
    with lock(venv.path), tempfile.TemporaryDirectory(prefix="apexkit-pip-report-") as tmp:
        report = Path(tmp) / "report.json"
        if record and _pip_version(venv) >= (
            22,
            2,
        ):  # --report: pip 22.2+ (an older pip records nothing)
            argv[4:4] = ["--report", str(report)]
        code, tail = run_logged(argv, log_path, env=env, verbose=verbose, progress=_pip_progress)
        if code == 0 and report.is_file():
            _record(venv, _from_pip_report(report))
    if code != 0:
        reason = next(
            (line for line in reversed(tail) if line.startswith("ERROR")), tail[-1] if tail else ""
        )
        known = known_failures.announce("\n".join(tail))
        if sources.offline and not known:  # a known failure's own fix comes first
            _offline_failure(requirements, reason, index, sources, log_path)
        hint = (
            known
            or f"check --torch / --index-url / --wheelhouse (or the proxy: {vocab.command('proxy.check')})"
        )
        raise EnvironmentSetupError(
            f"pip could not install {' '.join(requirements)}: {log.mask(reason)}",
            f"see {log_path}; {hint}",
        )


def _offline_failure(
    requirements: Sequence[str],
    reason: str,
    index: IndexOptions,
    sources: uvtools.Sources,
    log_path: Path,
) -> None:
    """An offline install pip could not do: what the wheelhouse lacks and the download that fills it (an offline
    run has no index and no proxy to check)."""
    import shlex

    missing = re.search(
        r"(?:No matching distribution found for|satisfies the requirement) (\S+)", reason
    )
    # pip.conf's find-links may be an https://user:token@ URL: masked, and never a download folder
    houses = [str(w) for w in index.wheelhouses] or [log.mask(f) for f in sources.find_links]
    local = [h[len("file://") :] if h.startswith("file://") else h for h in houses]
    folder = next((h for h in local if "://" not in h), "DIR")
    houses = houses or ["no wheelhouse"]
    fetch = " ".join(shlex.quote(r) for r in requirements if not r.startswith(("/", ".")))
    next_step = f"on a host with network: pip download {fetch} -d {shlex.quote(folder)}"
    if missing is None:
        raise EnvironmentSetupError(
            f"pip could not install {' '.join(requirements)} offline: {log.mask(reason)}",
            f"see {log_path}; {next_step}",
        )
    raise EnvironmentSetupError(
        f"{log.mask(missing.group(1))} is not in the wheelhouse ({', '.join(houses)}) and the build is offline",
        next_step,
    )


def _uv_install(
    uv: uvtools.Uv,
    venv: Venv,
    requirements: Sequence[str],
    index: IndexOptions,
    log_path: Path,
    for_torch: bool,
    extra: Sequence[str],
    verbose: bool,
    record: bool = True,
) -> bool:
    """uv pip install with pip's configuration carried over; False (after one line) when pip should try instead."""
    args, env = uvtools.install_options(*_sources(index, for_torch, log_path))
    argv = [uv.binary, "pip", "install", "--python", str(venv.python), *args, *extra, *requirements]
    uv_env = uvtools.environment(cache_dir(), env)
    with lock(venv.path):
        before = _dist_infos(venv)
        code, tail = run_logged(argv, log_path, env=uv_env, verbose=verbose, progress=_pip_progress)
        if code == 0:
            code, tail = _verified(uv, venv, argv, uv_env, before, log_path, verbose) or (
                code,
                tail,
            )
        if code == 0 and record:
            _record(venv, _from_uv(uv, venv, requirements, args, env, log_path))
    if code == 0:
        return True
    reason = log.mask(
        next(
            (line for line in reversed(tail) if "error" in line.lower()), last_line("\n".join(tail))
        )
    )
    host = None if "--offline" in args else unreachable_index("\n".join(tail))
    if host is not None:  # pip would only retry the same index (~42 s) and then blame a requirement
        raise EnvironmentSetupError(
            f"the package index {host} is unreachable ({reason.replace('cause:', '').strip()})",
            "set index_url to your mirror, or --offline --wheelhouse DIR",
        )
    if uvtools.choice() == "uv":
        raise EnvironmentSetupError(
            f"uv could not install {' '.join(requirements)}: {reason}",
            f"see {log_path}; unset APEXKIT_INSTALLER to let pip try",
        )
    log.info(
        f"  uv could not install {' '.join(requirements)} ({reason.strip()[:160]}): trying pip"
    )
    return False


# uv's causes when no connection to an index could be made (uv 0.13: "dns error", "error resolving DNS",
# "tcp connect error", "Network is unreachable", "Connection refused"); not an HTTP status, not a TLS failure
_UNREACHABLE = re.compile(
    r"error resolving DNS|dns error|tcp connect error|Network is unreachable|Connection refused"
)


def unreachable_index(output: str) -> str | None:
    """The host (and port) of the index uv could not connect to, from its output; None when that is not the failure."""
    if not _UNREACHABLE.search(output):
        return None
    # the netloc by hand: urlsplit raises on a stray [ in what uv echoed
    url = re.search(r"Failed to fetch: `?[a-z+]+://([^\s`/?#]+)", output)
    host = url.group(1).rsplit("@", 1)[-1] if url else ""
    if host and not re.fullmatch(
        r"[A-Za-z0-9._:\[\]%-]{1,261}", host
    ):  # uv's echo, never printed raw
        return untrusted.shown(host)
    return host or "(the configured one)"


def _sources(
    index: IndexOptions, for_torch: bool, log_path: Path, python: str = sys.executable
) -> tuple[pipconfig.PipConfig, uvtools.Sources]:
    """pip's configuration (as `python`'s pip reads it) and where this install looks, said (masked) in the log:
    the command line holds no URL."""
    config = pipconfig.read(python=python)
    sources = index.sources(config, for_torch)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with appending(log_path) as fh:
        fh.write(f"\napexkit: installing from {sources.shown()}\n")
    return config, sources


def _dist_infos(venv: Venv) -> set[Path]:
    """The venv's dist-info folders, each once (a venv's lib64 is a link to lib)."""
    return {p.resolve() for p in venv.path.glob("lib*/python*/site-packages/*.dist-info")}


RECORD_HASH_LIMIT = (
    4 << 20
)  # larger files (torch's libraries) are checked by size: hashing them all costs seconds,
# and a damaged library fails the build's own import of torch anyway


def record_problems(dist_info: Path, hash_limit: int = RECORD_HASH_LIMIT) -> list[str]:
    """The files of an installed distribution that differ from its RECORD (size; sha256 up to hash_limit bytes), or
    are missing."""
    import base64
    import csv

    site = dist_info.parent
    problems = []
    try:
        rows = list(csv.reader((dist_info / "RECORD").read_text().splitlines()))
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        return [f"{dist_info.name}/RECORD unreadable ({exc.__class__.__name__})"]
    for row in rows:
        if len(row) < 3 or not row[1].startswith("sha256=") or ".dist-info/" in row[0]:
            continue  # the dist-info's own files: vendors rewrite METADATA after RECORD (torch_npu 2.5.1.post1 does)
        path = site / row[0]
        try:
            st = path.stat()
            if not stat.S_ISREG(st.st_mode):  # a FIFO or device named by a RECORD row is never read
                problems.append(f"{row[0]} (not a regular file)")
                continue
            size = st.st_size
            if row[2] and size != int(row[2]):
                problems.append(f"{row[0]} (size)")
                continue
            if size > hash_limit:
                continue
            digest = (
                base64.urlsafe_b64encode(bytes.fromhex(untrusted.sha256_file(path)))
                .rstrip(b"=")
                .decode()
            )
        except (OSError, ValueError):
            problems.append(f"{row[0]} (missing)")
            continue
        if digest != row[1].split("=", 1)[1]:
            problems.append(f"{row[0]} (sha256)")
    return problems


def _verified(
    uv: uvtools.Uv,
    venv: Venv,
    argv: list[str],
    env: dict[str, str],
    before: set[Path],
    log_path: Path,
    verbose: bool,
) -> tuple[int, list[str]] | None:
    """What uv just installed checked against each wheel's RECORD (uv links files out of its cache, and a cache entry
    can be damaged after it was written): a mismatch cleans those packages' cache entries and installs them again,
    once, with one line; None when all was well."""
    bad = {d: p for d in sorted(_dist_infos(venv) - before) if (p := record_problems(d))}
    if not bad:
        return None
    names = [d.name.split("-", 1)[0] for d in bad]
    first = next(iter(bad.values()))[0]
    log.info(
        f"  uv installed {', '.join(names)} with files that differ from their RECORD ({first}): cleaning those "
        "uv cache entries and installing again"
    )
    with appending(log_path) as fh:
        fh.write(
            f"apexkit: RECORD mismatches after uv install: {json.dumps({d.name: p for d, p in bad.items()})}\n"
        )
    subprocess.run([uv.binary, "cache", "clean", *names], env=env, capture_output=True, timeout=600)
    again = [*argv[:3], *(f"--reinstall-package={n}" for n in names), *argv[3:]]
    code, tail = run_logged(again, log_path, env=env, verbose=verbose, progress=_pip_progress)
    still = {d.name: p for d in bad if (p := record_problems(d))}
    if (
        code == 0 and still
    ):  # fresh from the wheel and still different: the wheel disagrees with its own RECORD
        log.info(
            f"  {', '.join(still)}: the wheel's own RECORD disagrees with its files ({next(iter(still.values()))[0]});"
            " installed from a clean cache, as pip would"
        )
    return code, tail


# --- what the installers say they installed ------------------------------------------------------------------------

INSTALLED_FILE = "apexkit-installed.json"
INSTALLED_FORMAT = "apexkit-installed/1"

# Run by the venv's own Python: its own distributions (not those of a --system-site-packages base) -> version and the
# platform tags of their installed WHEEL file.
_PROBE_OWN = paths.PROBES / "own_dists.py"


def installed_digests(venv_path: Path) -> dict[str, dict]:
    """canonical name -> {name, version, sha256, file, url, from} of what the installers vouched for ({} when none)."""
    try:
        data = json.loads((venv_path / INSTALLED_FILE).read_text())
    except (OSError, ValueError):
        return {}
    packages = (
        data.get("packages")
        if isinstance(data, dict) and data.get("format") == INSTALLED_FORMAT
        else None
    )
    return packages if isinstance(packages, dict) else {}


def _record(venv: Venv, entries: list[dict]) -> None:
    """Merge `entries` into <venv>/apexkit-installed.json (written beside it, then renamed: never half-written)."""
    if not entries:
        return
    packages = installed_digests(venv.path)
    for e in entries:
        packages[canonicalize_name(e["name"])] = e
    path = venv.path / INSTALLED_FILE
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        tmp.write_text(
            json.dumps(
                {"format": INSTALLED_FORMAT, "packages": dict(sorted(packages.items()))}, indent=1
            )
            + "\n"
        )
        os.replace(tmp, path)
    except OSError as exc:  # the install worked; the SBOM then falls back to RECORD digests
        log.info(
            f"  could not record the installed wheels' digests in {path}: {exc.strerror or exc}"
        )
        tmp.unlink(missing_ok=True)


def _pip_version(venv: Venv) -> tuple[int, ...]:
    for folder in venv.path.glob("lib/python*/site-packages"):
        for info in folder.glob("pip-*.dist-info"):
            match = re.match(r"pip-(\d+)\.(\d+)", info.name)
            if match:
                return int(match[1]), int(match[2])
    return (0,)


def _file_of(url: str) -> str:
    return urllib.parse.unquote(urllib.parse.urlsplit(url).path.rsplit("/", 1)[-1])


def _from_pip_report(report: Path) -> list[dict]:
    """pip's installation report (--report, format 1): each installed distribution with the sha256 pip checked the
    downloaded (or local) archive against. Entries without one (a directory, a VCS checkout) are left out."""
    try:
        data = json.loads(report.read_text())
    except (OSError, ValueError):
        return []
    out = []
    for item in data.get("install") or [] if isinstance(data, dict) else []:
        meta, info = item.get("metadata") or {}, item.get("download_info") or {}
        archive = info.get("archive_info") or {}
        digest = (archive.get("hashes") or {}).get("sha256")
        if not digest and str(archive.get("hash", "")).startswith("sha256="):
            digest = archive["hash"].split("=", 1)[1]
        url = info.get("url") or ""
        if (
            meta.get("name")
            and meta.get("version")
            and digest
            and re.fullmatch(r"[0-9a-f]{64}", digest)
        ):
            out.append(
                {
                    "name": meta["name"],
                    "version": meta["version"],
                    "sha256": digest,
                    "file": _file_of(url),
                    "url": log.mask(url),
                    "from": f"pip {data.get('pip_version', '?')} install --report",
                }
            )
    return out


def _from_uv(
    uv: uvtools.Uv,
    venv: Venv,
    requirements: Sequence[str],
    args: list[str],
    env: dict[str, str],
    log_path: Path,
) -> list[dict]:
    """What uv installed, with the sha256 of each wheel file: uv pip install reports no digests, so the venv's new
    distributions (name==version, not yet recorded) are resolved again by uv with the same index options (`uv pip
    compile --no-deps --format pylock.toml`: PEP 751, one sha256 per file) and the one wheel whose tags the installed
    WHEEL carries is taken; a file:// wheel is re-hashed here and must agree. A wheel named on the command line is
    hashed directly. Whatever cannot be matched this way gets no entry."""
    try:
        proc = subprocess.run(
            [str(venv.python), str(_PROBE_OWN)], capture_output=True, text=True, timeout=120
        )
        own = json.loads(proc.stdout.strip().splitlines()[-1]) if proc.returncode == 0 else {}
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError):
        own = {}
    known = installed_digests(venv.path)
    out, pins = [], []
    tags: dict[str, set] = {}
    given = _given_wheels(requirements)
    for name, facts in own.items():
        key = canonicalize_name(name)
        if known.get(key, {}).get("version") == facts["version"]:
            continue  # recorded by an earlier install of this venv
        if key in given:
            path = given[key]
            out.append(
                {
                    "name": name,
                    "version": facts["version"],
                    "sha256": untrusted.sha256_file(path),
                    "file": path.name,
                    "url": path.resolve().as_uri(),
                    "from": "the wheel file given to uv pip install",
                }
            )
        else:
            pins.append(f"{name}=={facts['version']}")
            tags[key] = set(facts["tags"])
    if not pins:
        return out
    argv = [
        uv.binary,
        "pip",
        "compile",
        "-",
        "--quiet",
        "--no-header",
        "--no-deps",
        "--format",
        "pylock.toml",
        "--python",
        str(venv.python),
        *args,
    ]
    try:
        proc = subprocess.run(
            argv,
            input="\n".join(sorted(pins)) + "\n",
            capture_output=True,
            text=True,
            env=uvtools.environment(cache_dir(), env),
            timeout=300,
        )
        why = last_line(proc.stderr) if proc.returncode != 0 else ""
    except (OSError, subprocess.TimeoutExpired) as exc:
        why = str(exc)
    if why:
        with appending(
            log_path
        ) as fh:  # the SBOM falls back to RECORD digests for these; not a failed install
            fh.write(
                f"apexkit: no wheel digests from uv pip compile for {' '.join(pins)}: {log.mask(why)}\n"
            )
        return out
    return out + _pylock_matches(uv, proc.stdout, tags)


def _given_wheels(requirements: Sequence[str]) -> dict[str, Path]:
    """The wheel files named as requirements, by their project's canonical name."""
    given: dict[str, Path] = {}
    for req in requirements:
        if req.endswith(".whl") and os.path.isfile(req):
            with contextlib.suppress(InvalidWheelFilename, ValueError):
                given[canonicalize_name(parse_wheel_filename(os.path.basename(req))[0])] = Path(req)
    return given


def _pylock_matches(uv: uvtools.Uv, pylock: str, tags: Mapping[str, set]) -> list[dict]:
    """Each package of uv's pylock.toml with exactly one wheel of the installed tags; a file:// wheel only when
    what is on disk is what uv vouched for."""
    out = []
    for package in uvtools.pylock_wheels(pylock):
        key = canonicalize_name(package["name"])
        matches = [w for w in package["wheels"] if tags.get(key, set()) & w["tags"]]
        if len(matches) != 1:
            continue
        wheel = matches[0]
        if wheel["url"].startswith("file://"):
            local = Path(urllib.request.url2pathname(urllib.parse.urlsplit(wheel["url"]).path))
            try:
                if untrusted.sha256_file(local) != wheel["sha256"]:
                    continue
            except OSError:
                continue
        out.append(
            {
                "name": package["name"],
                "version": package["version"],
                "sha256": wheel["sha256"],
                "file": _file_of(wheel["url"]),
                "url": log.mask(wheel["url"]),
                "from": f"uv {uv.version_text} pip compile --format pylock.toml (same name==version and options)",
            }
        )
    return out


def _pip_progress(line: str) -> str | None:
    for word in ("Collecting", "Downloading", "Installing collected", "Processing"):
        if line.startswith(word) or line.lstrip().startswith(word):
            return line.strip()[:90]
    return None


_FREEZE = paths.PROBES / "freeze.py"


def freeze(venv: Venv) -> dict[str, str]:
    """name -> version of everything in the venv, read by its own Python (whichever installer filled it)."""
    proc = subprocess.run([str(venv.python), str(_FREEZE)], capture_output=True, text=True)
    if proc.returncode != 0:
        return {}
    return json.loads(proc.stdout.strip().splitlines()[-1])


_PROBE_NPU_REQUIRES = (
    paths.PROBES / "npu_requires.py"
)  # torch_npu's Requires-Dist, the installed torch


def install_torch_npu(
    venv: Venv,
    version: str,
    also: Sequence[str],
    index: IndexOptions,
    log_path: Path,
    env: dict | None = None,
    verbose: bool = False,
    record: bool = True,
) -> None:
    """torch_npu next to the torch already in the venv, without letting pip swap that torch: the x86_64 wheels for
    torch 2.1-2.11 pin a local build (`torch==2.1.0+cpu`) that the default index does not serve, so pip would refuse
    them. Installed with --no-deps; its torch pin is checked against the installed torch's release; then its other
    requirements (and `also`) are installed."""
    pip_install(
        venv,
        [f"torch_npu=={version}"],
        index,
        log_path,
        extra=["--no-deps"],
        verbose=verbose,
        record=record,
    )
    meta = venv.run_json(_PROBE_NPU_REQUIRES, env=env)
    others = []
    for line in meta["requires"]:
        req = Requirement(line)
        if canonicalize_name(req.name) != "torch":
            others.append(line)
            continue
        if not (
            req.specifier.contains(meta["torch"], prereleases=True)
            or same_release(req, meta["torch"])
        ):
            raise EnvironmentSetupError(
                f"torch_npu {version} requires {line}, the venv has torch {meta['torch']}",
                f"use the torch_npu for torch {meta['torch'].split('+')[0]} "
                "(matrix.toml [torch_npu.versions])",
            )
        if "+" in str(req.specifier) and "+" not in meta["torch"]:
            log.info(
                f"  torch_npu {version} asks for {line.strip()}; torch {meta['torch']} is the same release from "
                "another index (local label differs): accepted"
            )
    names = {canonicalize_name(Requirement(r).name) for r in others}
    others += [r for r in also if canonicalize_name(Requirement(r).name) not in names]
    pip_install(venv, others, index, log_path, verbose=verbose, record=record)


def same_release(req: Requirement, installed: str) -> bool:
    """torch==2.1.0+cpu vs an installed 2.1.0 (or 2.1.0+cu121): the same release, another local build."""
    pins = [s.version.split("+")[0] for s in req.specifier if s.operator in ("==", "===")]
    return bool(pins) and all(p.rstrip(".*") == installed.split("+")[0] for p in pins)
