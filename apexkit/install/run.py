"""`apexkit install` / `invoke install` / `nox -s install`: the wheel that fits a venv, torch untouched.

1. the target: --venv DIR, --interpreter PATH or the active venv; it must be a venv (or a conda env) with pip and torch,
   and hold no `apex` that is not an apexkit wheel; one install into a venv at a time (a lock beside the cache);
2. its tuple (Python tag, arch, glibc, torch, torch_npu, C++ ABI) is looked up in the indexes (--index, repeatable;
   default $APEXKIT_INDEX) by the facts their index.json records (apexkit.index.remote);
3. a hit is fetched and verified there (sha256 three ways, provenance subject, SBOM, zip), a miss (or an index out of
   reach) is built for the venv's Python and torch (commands.build_wheel's own path: its build venv, never the target)
   unless --no-build; --publish-to DIR then adds the built target to that directory index;
4. the wheel's own tags and METADATA are checked against the venv (an index.json can lie); a requirement on a package
   the venv lacks altogether (NVIDIA apex's packaging>20.6) is installed first from the venv pip's own index, every
   installed distribution held at its version by a constraints file; then the venv's pip installs that one file:
   --no-deps --no-index --force-reinstall, by name from a folder holding only it (so pip freeze says apex==V, not a
   temporary file:// path), nothing contacted;
5. the venv is probed again: the wheel's files in place, every Requires-Dist met, torch and torch_npu the same
   versions as before -- otherwise apex is uninstalled again and the command fails.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import typing
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from apexkit import cachetrust, envvars, locks, log, paths, untrusted, vocab
from apexkit.errors import ApexkitError, ConfigError, EnvironmentSetupError
from apexkit.install import files, fit
from apexkit.install import target as targets
from apexkit.install.target import Target
from apexkit.proc import dies_with, stops_like_ctrl_c

PIP_TIMEOUT = 900.0
STATUSES = ("installed", "already-installed", "built-and-installed", "would-install", "would-build")


Builder = typing.Callable[
    ..., "Path | None"
]  # (python, argv, prog) -> dist/<target>/, None for a dry run


class InstallError(EnvironmentSetupError):
    exit_code = 1


@dataclasses.dataclass
class Result:
    status: str
    wheel: str | None
    sha256: str | None
    # where the wheel came from: the index (password masked) for an index hit; for a build, "wheel cache" (a local
    # cache hit), "team index <url>" (the build's cache hit from a team index) or "built" (compiled now); "build"
    # before a build ran (--dry-run)
    source: str
    venv: str
    target: str | None  # the build's target id
    torch: str | None
    torch_npu: str | None
    # the dependencies the venv lacked, now installed (for a dry run: that it would add)
    added: list[str] = dataclasses.field(default_factory=list)


def _lock_path(python: str, suffix: str = "") -> Path:
    """Where the lock on one venv lives: the apexkit cache, keyed by the venv's directory (nothing is written into the
    venv itself); with `suffix`, its journal (".journal") and its work folder (".work", emptied by each run)."""
    digest = hashlib.sha256(_root(python).encode()).hexdigest()[:24]
    return cachetrust.root() / "install-locks" / (digest + suffix)


def _root(python: str) -> str:
    return os.path.realpath(Path(python).expanduser().parent.parent)


def _venv_id(python: str) -> list[int]:
    """The venv directory's (device, inode): a journal of the venv once at the same path is not this one's."""
    try:
        st = os.stat(_root(python))
    except OSError:
        return []
    return [st.st_dev, st.st_ino]


def _work(python: str) -> str:
    """The folder of this run's temporary folders (the wheel's copy, pip's report): in the cache, not /tmp, so
    that a run killed -9 leaves them where the next run into the venv removes them (`_repair`)."""
    return str(cachetrust.make_dir(_lock_path(python, ".work"), 0o700))


def _repair(python: str, named: str, environ: Mapping[str, str], dry_run: bool = False) -> None:
    """What a run into this venv that was killed left: its temporary folders, and, by its journal, what its pip
    calls installed (uninstalled again: only a distribution whose RECORD is still the one that run's pip wrote,
    never torch or torch_npu) and the files pip wrote before it died, which no distribution lists (removed). One
    line says so; with `dry_run`, what it would do, nothing touched."""
    journal = files.read_journal(_lock_path(python, ".journal"))
    if dry_run:
        journal = journal if journal is not None and journal.venv == _venv_id(python) else None
    else:
        shutil.rmtree(_lock_path(python, ".work"), ignore_errors=True)
        if journal is None or journal.venv != _venv_id(python):
            return files.Journal(_lock_path(python, ".journal"), []).done()
    if journal is None:
        return None
    now = targets.probe(python, named, environ, versions_only=True)
    mine = files.written(now, journal.records)
    back = [n for n, was in journal.records.items() if n not in fit.GUARDED and mine.get(n) == was]
    other = [
        n for n, was in journal.dists.items() if n not in back and now.dists.get(n, was) != was
    ]
    if dry_run:
        orphans = files.remove_orphans(journal.paths, now, files.owners(now), dry_run=True)
        words = _repaired(sorted(back), orphans, [], other, "would be ")
        return log.warn(
            f"{_interrupted(named)}: {words}; apexkit install without --dry-run repairs it"
        )
    removed, kept = _take_back(now, back, named, environ)
    after = targets.probe(python, named, environ, versions_only=True)
    orphans = files.remove_orphans(journal.paths, after, files.owners(after))
    words = _repaired(removed, orphans, kept, other, "")
    if journal.dists.get("apex") and "apex" not in after.dists:
        words += f"; the venv's apex {journal.dists['apex']} is gone: install it again"
    log.warn(f"{_interrupted(named)}: {words}; repaired")
    return journal.done()


def _interrupted(named: str) -> str:
    return f"an earlier apexkit install into {named} was interrupted"


def _repaired(
    removed: list[str], orphans: list[str], kept: list[str], other: list[str], would: str
) -> str:
    """What `_repair` did (`would`: "would be ", for a dry run), in words."""
    what = [f"{', '.join(removed)} {would}uninstalled"] if removed else []
    if orphans:
        verb = "would remove" if would else "removed"
        what.append(f"{verb} {len(orphans)} files it left ({', '.join(orphans[:3])})")
    what += [_kept(kept)] if kept else []
    if other:
        what.append(
            f"{', '.join(sorted(other))} left as found (not what that run's pip wrote, or changed since)"
        )
    return "; ".join(what) or "it had changed nothing"


def indexes_from(given: Sequence[str] | None, environ: Mapping[str, str]) -> list[str]:
    """--index URL (repeatable), else $APEXKIT_INDEX (several: space separated), else `team_indexes` in the project
    or user config file (apexkit.config). Each an http(s):// or file:// URL or a directory."""
    from apexkit import config
    from apexkit.index import remote  # not at import: doctor and --help never read an index

    value = config.load(environ).get("team_indexes", environ, flag=list(given or ()) or None)
    found = list(value.items)
    where = "--index" if given else (value.where or "APEXKIT_INDEX")
    for url in found:
        if "://" in url:
            remote.client.check_index_url(url, where)
        elif not Path(url).expanduser().is_dir():
            raise ConfigError(
                f"{where} {log.mask(url)} is neither a URL nor a directory",
                f"pass an http(s):// or file:// index URL, or an index directory ({vocab.command('publish', '--index DIR')})",
            )
    return found


def main(
    venv: str | None = None,
    interpreter: str | None = None,
    index: list[str] | None = None,
    no_build: bool = False,
    publish_to: str | None = None,
    build_options: str = "",
    dry_run: bool = False,
    as_json: bool = False,
    environ: Mapping[str, str] | None = None,
    trusted_key: list[str] | None = None,
    *,
    build: Builder,
) -> int:
    """`build`: the one door to a wheel build (commands.build_wheel: python, argv, prog -> dist/<target>/), passed in
    by the command edge. With `as_json`, a failure too is one object on stdout (status "failed", error, hint)."""
    environ = os.environ if environ is None else environ
    try:
        with stops_like_ctrl_c():  # the venv taken back, not half-written
            result = _main(
                venv,
                interpreter,
                index,
                no_build,
                publish_to,
                build_options,
                dry_run,
                as_json,
                environ,
                build,
                trusted_key or [],
            )
    except ApexkitError as exc:
        if as_json:
            failed = {"status": "failed", "error": log.mask(exc.cause), "hint": log.mask(exc.hint)}
            print(json.dumps({**failed, "exit_code": exc.exit_code, "venv": venv or interpreter}))
        raise
    if as_json:
        print(json.dumps(dataclasses.asdict(result)))
    else:
        log.out(_summary(result))
    return 0


def _main(
    venv: str | None,
    interpreter: str | None,
    index: list[str] | None,
    no_build: bool,
    publish_to: str | None,
    build_options: str,
    dry_run: bool,
    as_json: bool,
    environ: Mapping[str, str],
    build: Builder,
    trusted_key: list[str],
) -> Result:
    python, named = targets.interpreter_for(venv, interpreter, environ)
    indexes = indexes_from(index, environ)
    from apexkit.index import signing  # the trusted keys, read before anything is fetched

    trusted = signing.trusted_keys(trusted_key, environ) if indexes else {}
    if publish_to is not None and Path(publish_to).exists() and not Path(publish_to).is_dir():
        raise ConfigError(
            f"--publish-to {publish_to} is not a directory", "pass an index directory"
        )
    lock = _lock_path(python)
    try:
        with locks.hold(lock, f"apexkit install into {named}", wait=False):
            _repair(python, named, environ, dry_run)
            try:
                return _run(
                    python,
                    named,
                    indexes,
                    no_build,
                    publish_to,
                    build_options,
                    dry_run,
                    as_json,
                    environ,
                    build,
                    trusted,
                )
            except KeyboardInterrupt:
                with contextlib.suppress(Exception):
                    _repair(python, named, environ)
                raise
    except locks.Busy as exc:
        raise InstallError(
            f"another apexkit install into {named} is running"
            + (f" (pid {exc.pid})" if exc.pid else ""),
            "wait for it to finish, then run apexkit install again",
        ) from None


def _summary(r: Result) -> str:
    what = {
        "installed": f"installed {r.wheel} from {r.source}",
        "already-installed": f"already installed: {r.wheel}",
        "built-and-installed": f"built and installed {r.wheel} ({r.target})",
        "would-install": f"would install {r.wheel} from {r.source}",
        "would-build": f"would build {r.target or 'the wheel'} and install it",
    }[r.status]
    keep = f"torch {r.torch}" + (f", torch_npu {r.torch_npu}" if r.torch_npu else "")
    verb = "would add" if r.status == "would-install" else "added"
    added = f"; {verb} {', '.join(r.added)}" if r.added else ""
    return f"{what} into {r.venv} ({keep} unchanged{added})"


def _run(
    python: str,
    named: str,
    indexes: list[str],
    no_build: bool,
    publish_to: str | None,
    build_options: str,
    dry_run: bool,
    as_json: bool,
    environ: Mapping[str, str],
    build: Builder,
    trusted: Mapping[str, typing.Any],
) -> Result:
    before = targets.probe(python, named, environ)
    targets.check_usable(before, named)
    log.info(f"target {before.venv}: {before.cell()}")
    result = Result(
        "would-build", None, None, "build", before.venv, None, before.torch, before.torch_npu
    )
    with tempfile.TemporaryDirectory(prefix="apexkit-install-", dir=_work(python)) as work:
        if indexes:
            found = _from_index(before, indexes, Path(work), dry_run, environ, trusted)
            if found is not None:
                candidate, wheel, sha = found
                result.source, result.target = candidate.shown, candidate.entry.target
                result.wheel, result.sha256 = candidate.filename, sha
                if dry_run:
                    result.status = (
                        "already-installed"
                        if _same_version(before, result.wheel)
                        else "would-install"
                    )
                    if result.status == "would-install":
                        result.added = _would_add(before, named, candidate.entry)
                    return result
                assert wheel is not None
                return _install(before, named, wheel, sha, result, "installed", environ)
        if no_build:
            raise InstallError(
                f"no wheel fits {named} ({before.cell()})"
                + (
                    f" in {', '.join(log.sanitise(log.mask(i)) for i in indexes)}"
                    if indexes
                    else " and no index is given"
                ),
                "drop --no-build to build it here, or publish that cell's wheel to the index",
            )
        if not _cuda_build(build_options):  # NVIDIA apex on CUDA: the build checks [cuda]
            _check_pairing(before)
        if dry_run:
            log.info(
                f"would build Python {before.python}, torch {before.torch_public}"
                + (f", torch_npu {before.torch_npu}" if before.torch_npu else "")
            )
            return result
        target_dir = _build(before, build_options, as_json, build)
        wheel, sha, result.source = _built_wheel(target_dir)
        result.target, result.wheel, result.sha256 = target_dir.name, wheel.name, sha
        if publish_to is not None:
            from apexkit.index import publish

            with contextlib.redirect_stdout(sys.stderr) if as_json else contextlib.nullcontext():
                publish.publish(target_dir.parent, Path(publish_to), [target_dir.name])
        return _install(before, named, wheel, sha, result, "built-and-installed", environ)


def _would_add(t: Target, named: str, entry) -> list[str]:
    """For --dry-run (nothing fetched): what installing the index's wheel would add to the venv, by the pins its
    index entry lists (publish.check_facts: a list of plain pins; the real run reads them from the wheel itself); a
    pin the venv cannot meet is the error the real run would stop at."""
    try:
        pins = tuple(entry.facts.get("requires_dist") or ())
        return fit.additions(untrusted.shown(entry.filename), pins, t)
    except fit.Misfit as exc:
        raise InstallError(
            f"the index's wheel does not fit {named}: {exc} (by its index entry); nothing would be installed",
            "report it to whoever publishes the index (its index.json says otherwise)",
        ) from None


def _same_version(t: Target, filename: str | None) -> bool:
    """For --dry-run (nothing fetched): the venv's apexkit apex has this wheel's version and tags."""
    if t.apex is None or not t.apex.apexkit or not filename:
        return False
    from packaging.utils import parse_wheel_filename

    try:
        _, version, _, tags = parse_wheel_filename(filename)
    except ValueError:
        return False
    return str(version) == t.apex.version and {str(x) for x in tags} <= set(t.apex.tags)


def _from_index(
    t: Target,
    indexes: list[str],
    work: Path,
    dry_run: bool,
    environ: Mapping[str, str],
    trusted: Mapping[str, typing.Any],
):
    """(candidate, the verified wheel file or None for a dry run, its sha256) of the first fitting wheel, or None
    (a miss, or every fitting one out of reach: one line each). A refused file is an error: nothing installed. With
    trusted keys only a wheel whose envelope verifies, signs the bytes downloaded and whose signed facts fit the
    venv is taken (remote.verified); without, one warning line says how to turn verification on."""
    from apexkit import config
    from apexkit.index import remote, signing
    from apexkit.wheel import options

    want = t.want()
    told = config.told(
        "team_indexes", indexes, environ
    )  # a project file's index: say so in every line
    if told:
        log.notice(f"team index {', '.join(map(remote.shown, indexes))}{told}")
    client = remote.make_client(indexes, environ)
    try:
        candidates, near = remote.find_by_facts(client, indexes, want)
    except (
        remote.client.Denied
    ) as exc:  # TLS or credentials refused: stop, unless asked to build instead
        if not options.fallback_asked(environ):
            raise
        log.warn(f"{exc.format()} ({options.FALLBACK_ENV}=1: building)")
        return None
    candidates = [dataclasses.replace(c, shown=c.shown + told) for c in candidates]
    if not candidates:
        log.info(f"no wheel in the index{'es' if len(indexes) > 1 else ''} fits {t.cell()}")
        for miss in near[:5]:
            log.info(f"  near miss: {log.sanitise(log.mask(miss))}")
        return None
    for candidate in candidates:
        sha = candidate.entry.sha256
        if dry_run:
            return candidate, None, sha
        try:
            fetched, signer = remote.fetch(
                client,
                candidate,
                work,
                trusted,
                lambda st: _signed_misfit(remote.misfit(signing.signed_facts(st), want)),
            )
        except remote.Unreachable as exc:
            log.warn(f"{candidate.shown}: {exc}; trying the next source")
            continue
        except remote.Refused as exc:
            raise InstallError(
                f"refused {candidate.filename} from {candidate.shown}: {exc}; nothing installed",
                f"tell whoever publishes that index ({vocab.command('publish')} writes it again), or pass another --index",
            ) from None
        if signer:
            log.info(f"{candidate.filename}: signature verified (key {signer})")
        else:
            log.warn(remote.UNVERIFIED)
        return candidate, fetched.wheel, untrusted.sha256_file(fetched.wheel)
    log.info("no fitting wheel could be fetched: building it")
    return None


def _signed_misfit(why: str | None) -> str | None:
    return f"the signed target facts do not fit the venv: {why}" if why else None


def _check_pairing(t: Target) -> None:
    """A build needs the torch's row in matrix.toml (its Python and torch_npu pairing)."""
    from apexkit.plan import matrix

    m = matrix.load()
    torch = t.torch_public or ""
    pairs = m.data["torch_npu"]["versions"]
    if torch not in pairs:
        raise InstallError(
            f"torch {torch} of the venv has no pairing in matrix.toml [torch_npu.versions] (pairs: "
            + ", ".join(f"{k}/{v['torch_npu']}" for k, v in pairs.items())
            + ")",
            "use a torch of that table in the venv, or add its row after reading Ascend/pytorch COMPATIBILITY.md",
        )
    m.check_torch_python(torch, t.python)
    if t.torch_npu:
        m.check_torch_npu(torch, t.torch_npu)


def _cuda_build(build_options: str) -> bool:
    words = envvars.split_words(build_options or "", "--build-options")
    return any(
        w == "--backend=cuda" or (w == "--backend" and words[i + 1 : i + 2] == ["cuda"])
        for i, w in enumerate(words)
    )


def build_argv(t: Target, build_options: str) -> list[str]:
    """The build's options for this venv: its torch (public release) and torch_npu, and the interpreter the venv was
    made from (the build venv is made from it; the target is never touched)."""

    argv = ["--torch", t.torch_public or ""]
    if t.torch_npu:
        argv += ["--torch-npu", t.torch_npu]
    extra = envvars.split_words(build_options or "", "--build-options")
    if t.base_executable and os.path.isfile(t.base_executable) and "--interpreter" not in extra:
        argv += ["--interpreter", t.base_executable]
    return argv + extra


def _build(t: Target, build_options: str, as_json: bool, build: Builder) -> Path:
    argv = build_argv(t, build_options)
    log.info(f"building the wheel for {t.cell()}: build {t.python} {' '.join(argv)}")
    with contextlib.redirect_stdout(sys.stderr) if as_json else contextlib.nullcontext():
        built = build(t.python, argv, "apexkit install --build-options")
    if built is None:
        raise InstallError("the build returned no wheel", "run it alone: apexkit build " + t.python)
    return built


def _built_wheel(target_dir: Path) -> tuple[Path, str, str]:
    """The wheel of dist/<target>/ (a folder only we can write), its sha256, checked against its manifest.json, and
    where the build got it (`built_source`)."""
    from apexkit.wheel import distdir

    cachetrust.trusted_output(target_dir, paths.DIST_SETTING, make=False)
    try:
        with untrusted.opened_dir(target_dir) as folder:
            manifest, name = distdir.read_manifest(folder)
        wheel = target_dir / name
        sha = untrusted.sha256_file(wheel)
        untrusted.check_zip(wheel)
    except (untrusted.Untrusted, OSError) as exc:
        raise InstallError(f"{target_dir}: {exc}", "build again (apexkit install)") from None
    if sha != manifest["wheel"]["sha256"]:
        raise InstallError(
            f"{wheel} does not match its manifest's sha256; nothing installed",
            "build again with --no-cache (--build-options '--no-cache')",
        )
    return wheel, sha, built_source(manifest)


def built_source(manifest: Mapping) -> str:
    """Where the build's wheel came from, by its manifest: "wheel cache" (a local cache hit), "team index <url>"
    (a cache hit the team index had; the URL as the build masked it) or "built" (compiled by this build)."""
    if manifest.get("cache_hit") is not True:
        return "built"
    source = manifest.get("cache_source")
    return (
        f"team index {log.mask(log.sanitise(source))[:400]}"
        if isinstance(source, str)
        else "wheel cache"
    )


def _install(
    before: Target, named: str, wheel: Path, sha: str, result: Result, status: str, environ
) -> Result:
    owned = files.owners(before)
    try:
        facts = fit.read_wheel(wheel)
        if fit.same_files(facts, before):
            result.status = "already-installed"
            return result
        missing = fit.check_wheel(facts, before)
        journal = files.Journal(
            _lock_path(before.python_path, ".journal"), _venv_id(before.python_path)
        )
        journal.paths = files.check_wheel(wheel, before, owned, files.names(before, owned))
    except fit.Misfit as exc:
        from_index = status == "installed"
        where = "the index's wheel" if from_index else "the built wheel"
        raise InstallError(
            f"{where} does not fit {named}: {exc}; nothing installed",
            "report it to whoever publishes the index (its index.json says otherwise)"
            if from_index
            else "report this (the build made a wheel for another venv)",
        ) from None
    # from a folder holding only this wheel, by name and version: pip records it as an index install (no
    # direct_url.json), so `pip freeze` says apex==V, not `apex @ file://` a temporary path gone after this run
    torch_files = files.stamp(before, owned, fit.GUARDED)
    try:
        _install_files(before, named, wheel, sha, facts, missing, result, journal, environ)
        after = targets.probe(before.python_path, named, environ, versions_only=True)
        problems = fit.moved(before, after)
        problems += [f"a file of torch changed ({p})" for p in files.changed(torch_files)[:3]]
        if after.apex is None or not fit.same_files(facts, after):
            problems.append("the wheel's files are not what is installed")
        problems += fit.unmet(facts.requires_dist, after)
        if problems:
            _pip(before, ["uninstall", "--yes", "apex"], environ, quiet=True)
            raise InstallError(
                f"after installing {wheel.name} into {named}: {'; '.join(problems)}; apex uninstalled again; "
                + _undo_apex(before, named, environ, result.added),
                "report this with the venv's pip list",
            )
    except ApexkitError:
        journal.done()  # taken back: the venv is as it was, as far as words say
        raise
    journal.done()
    result.status = status
    return result


def _install_files(
    before: Target,
    named: str,
    wheel: Path,
    sha: str,
    facts: fit.WheelFacts,
    missing: list[str],
    result: Result,
    journal: files.Journal,
    environ: Mapping[str, str],
) -> None:
    """What the wheel requires and the venv lacks, then the wheel itself, each pip call written in the journal
    first."""
    with tempfile.TemporaryDirectory(
        prefix="apexkit-install-", dir=_work(before.python_path)
    ) as folder:
        shutil.copyfile(
            wheel, Path(folder) / wheel.name, follow_symlinks=False
        )  # a copy, not a link: the folder holds nothing another user can change
        if untrusted.sha256_file(Path(folder) / wheel.name) != sha:
            raise InstallError(
                f"{wheel} changed while it was being installed; nothing installed",
                "run apexkit install again",
            )
        apex = {"apex": before.apex.version if before.apex else None}
        if missing:
            result.added = _add_dependencies(before, named, wheel, missing, environ, journal, apex)
        else:
            journal.add([], apex)
        try:
            _pip(
                before,
                [
                    "install",
                    "--no-deps",
                    "--no-index",
                    "--force-reinstall",
                    "--find-links",
                    folder,
                    f"apex=={facts.version}",
                ],
                environ,
            )
        except (
            InstallError
        ) as exc:  # pip may have installed apex and failed after (pip 26 on a legacy version)
            raise InstallError(
                f"{exc.cause}; {_undo_apex(before, named, environ, result.added)}", exc.hint
            ) from None
        journal.wrote(before, ["apex"])


# what a dependency's install takes from this shell: where the user's index is and how to reach it, never what
# changes the install itself (PIP_UPGRADE, PIP_TARGET, PIP_PREFIX, PIP_USER, PIP_REQUIREMENT, PIP_NO_BINARY, ...)
PIP_INDEX_ENV = (
    "PIP_INDEX_URL",
    "PIP_EXTRA_INDEX_URL",
    "PIP_FIND_LINKS",
    "PIP_NO_INDEX",
    "PIP_TRUSTED_HOST",
    "PIP_CERT",
    "PIP_CLIENT_CERT",
    "PIP_PROXY",
    "PIP_TIMEOUT",
    "PIP_DEFAULT_TIMEOUT",
    "PIP_RETRIES",
    "PIP_CONFIG_FILE",
)
# and what a pip.conf [install] section could turn on, turned off (the environment beats the config files)
PIP_HELD_OFF = {
    "PIP_UPGRADE": "0",
    "PIP_FORCE_REINSTALL": "0",
    "PIP_IGNORE_INSTALLED": "0",
    "PIP_USER": "0",
}


# pip install --dry-run --report (pip 22.2+): what pip would install, before it does
REPORT_PIP = Version("22.2")
REPORT_LIMIT = 4 << 20  # bytes of pip's report read


def _add_dependencies(
    before: Target,
    named: str,
    wheel: Path,
    missing: list[str],
    environ: Mapping[str, str],
    journal: files.Journal,
    apex: dict[str, str | None],
) -> list[str]:
    """What the wheel requires and the venv lacks (`packaging>20.6` for NVIDIA apex), from the venv pip's own index
    (its pip.conf and this shell's index settings: the user's mirror), wheels only (no setup.py runs), every
    distribution the venv sees held at its exact version and torch / torch_npu / apex, where absent, kept out by a
    constraints file. pip first says what it would install (--dry-run --report), dependencies of dependencies
    included: all of it must be new, at most MAX_ADDED, none of torch, torch_npu, apex. Then exactly that is
    installed, --no-deps, from the very files pip downloaded and apexkit read first (each must write only under its
    own names: files.check_wheel), and the venv probed again: anything else, and what was added is removed again.
    The venv is probed first too: a build on a miss can take an hour. Returns what was added, `name==version`."""
    now = targets.probe(before.python_path, named, environ, versions_only=True)
    moved = fit.moved(before, now)
    if moved:
        raise InstallError(
            f"{named} changed while apexkit install ran ({'; '.join(moved)}); nothing installed",
            "run apexkit install again",
        )
    pins = [f"{n}=={now.seen[n]}" for n in fit.GUARDED if n in now.seen]
    by_hand = shlex.join([now.python_path, "-m", "pip", "install", *missing, *pins])
    fix = f"install them into the venv ({by_hand}) or give its pip an index that holds them, then run apexkit install again"
    lacks = f"{wheel.name} requires {', '.join(missing)}, which {named} lacks"
    if not _pip_at_least(now.pip, REPORT_PIP):
        raise InstallError(
            f"{lacks}, and its pip {now.pip} cannot say what it would install (pip {REPORT_PIP}+); nothing installed",
            f"install them into the venv ({by_hand}) or upgrade its pip ({now.python_path} -m pip install "
            f"'pip>={REPORT_PIP}'), then run apexkit install again",
        )
    log.info(f"{lacks}: asking its pip what that takes (its own index, everything it has held)")

    def pip(args: list[str], could: str, undo: bool = False) -> None:
        """The venv's pip with the user's index settings; its failure one line (what it added taken back: `undo`)."""
        try:
            _pip(now, args, environ, pip_env=True)
        except InstallError as exc:
            then = _gone(*_take_back(now, None, named, environ)) if undo else "nothing installed"
            raise InstallError(
                f"{lacks}, and its pip could {could} ({exc.cause}); {then}", fix
            ) from None

    with tempfile.TemporaryDirectory(
        prefix="apexkit-install-", dir=_work(now.python_path)
    ) as folder:
        held, report = Path(folder) / "constraints.txt", Path(folder) / "report.json"
        held.write_text(_constraints(now))
        resolve = [
            "--only-binary=:all:",
            "--upgrade-strategy",
            "only-if-needed",
            "--constraint",
            str(held),
        ]
        pip(
            ["install", "--dry-run", "--quiet", "--report", str(report), *resolve, *missing],
            "not add them holding all it has, torch_npu and apex kept out",
        )
        planned = _planned(report, now)
        if isinstance(planned, str):
            raise InstallError(f"{lacks}, and its pip would {planned}; nothing installed", fix)
        added = [f"{n}=={v}" for n, v, _ in planned]
        log.info(f"adding {', '.join(added)}")
        # each at the version and by the sha256 of the file pip's dry run chose: an index that changes between the two
        # calls (another build of foo 1.0 requiring more) is refused, not installed --no-deps
        pinned = Path(folder) / "requirements.txt"
        pinned.write_text("".join(f"{n}==={v} --hash=sha256:{h}\n" for n, v, h in planned))
        wheels = Path(folder) / "wheels"
        fetch = ["--no-deps", "--require-hashes", "--only-binary=:all:"]
        pip(["download", *fetch, "--dest", str(wheels), "-r", str(pinned)], "not fetch them")
        _check_added(now, named, lacks, [wheel, *sorted(wheels.glob("*.whl"))], journal)
        journal.add([], {**{n: None for n, _, _ in planned}, **apex})
        pip(
            [
                "install",
                "--no-deps",
                "--require-hashes",
                *resolve,
                "--no-index",
                "--find-links",
                str(wheels),
                "--requirement",
                str(pinned),
            ],
            "not add them",
            undo=True,
        )
        journal.wrote(now, [n for n, _, _ in planned])
    after = targets.probe(before.python_path, named, environ, versions_only=True)
    new = {n: v for n, v in after.seen.items() if n not in now.seen}
    problems = fit.moved(now, after)
    if {n: _normal(v) for n, v in new.items()} != {n: v for n, v, _ in planned}:
        problems.append(
            f"pip added {', '.join(f'{n}=={v}' for n, v in sorted(new.items())) or 'nothing'}, not {', '.join(added)}"
        )
    if problems:
        raise InstallError(
            f"after adding what {wheel.name} requires to {named}: {'; '.join(problems)}; "
            + _gone(*_take_back(now, None, named, environ, after)),
            "report this with the venv's pip list",
        )
    return added


def _check_added(
    now: Target, named: str, lacks: str, wheels: list[Path], journal: files.Journal
) -> None:
    """Each wheel pip downloaded writes only under its own names (files.check_wheel: no .pth, nothing of torch, of
    any other installed distribution, of apex's wheel `wheels[0]` or of another of them), read before any of it is
    installed; then the journal says which files are about to be written."""
    owned, paths = files.owners(now), []
    taken = files.names(now, owned)
    for path in wheels:
        try:
            paths += files.check_wheel(path, now, owned, taken)
        except fit.Misfit as exc:
            raise InstallError(
                f"{lacks}, and {exc}; nothing installed",
                "ask whoever publishes that package, or install what you trust by hand, then run apexkit install "
                "again",
            ) from None
    journal.add(paths, {})


def _normal(version: str) -> str:
    """A version as pip compares it (METADATA may say 1.0RC1 for 1.0rc1); a legacy one as it is."""
    try:
        return str(Version(version))
    except InvalidVersion:
        return version


def _pip_at_least(version: str | None, least: Version) -> bool:
    try:
        return version is not None and Version(version) >= least
    except InvalidVersion:
        return False


def _planned(report: Path, t: Target) -> list[tuple[str, str, str]] | str:
    """(name, version, sha256) of each distribution pip's --report says it would install, or what is wrong with
    that, in words: the report is the index's word, read capped and typed; every entry new to the venv, from the
    index (not a URL), a PEP 508 name, a PEP 440 version and the file's sha256, none of torch, torch_npu or apex, at
    most MAX_ADDED."""
    try:
        data: dict | None = untrusted.read_json_object(report, None, REPORT_LIMIT, "pip's report")
    except (OSError, untrusted.Untrusted):
        data = None
    items = data.get("install") if data is not None else None
    if not isinstance(items, list):
        return "write no readable report of what it would install"
    if len(items) > fit.MAX_ADDED:
        return f"install {len(items)} packages (at most {fit.MAX_ADDED} are added)"
    planned: list[tuple[str, str, str]] = []
    for item in items:
        meta = item.get("metadata") if isinstance(item, dict) else None
        name = meta.get("name") if isinstance(meta, dict) else None
        version = meta.get("version") if isinstance(meta, dict) else None
        if not (isinstance(name, str) and targets.is_dist_name(name) and isinstance(version, str)):
            return "install a package its report does not name"
        key = canonicalize_name(name)
        try:
            version = str(Version(version))
        except InvalidVersion:
            return f"install {key} at {untrusted.shown(version[:80])}, not a PEP 440 version"
        if item.get("is_direct") is not False:
            return f"install {key} from a URL, not from the index"
        if key in (*fit.GUARDED, "apex"):
            return f"install {key} {version}, which apexkit install never adds"
        if key in t.seen:
            return f"replace {key} {t.seen[key]} with {version}"
        sha = _sha256_of(item.get("download_info"))
        if sha is None:
            return f"install {key} {version} from a file whose sha256 its report does not give"
        planned.append((key, version, sha))
    if not planned:
        return "install nothing (the venv still lacks them)"
    return planned


def _sha256_of(info: object) -> str | None:
    """The sha256 pip's report gives for a file (`archive_info.hashes.sha256`, or `archive_info.hash`, pip 22.2)."""
    archive = info.get("archive_info") if isinstance(info, dict) else None
    if not isinstance(archive, dict):
        return None
    hashes = archive.get("hashes")
    sha = hashes.get("sha256") if isinstance(hashes, dict) else None
    legacy = archive.get("hash")
    if sha is None and isinstance(legacy, str) and legacy.startswith("sha256="):
        sha = legacy[len("sha256=") :]
    return untrusted.sha256_digest(sha) or None


def _take_back(
    t: Target,
    names: Iterable[str] | None,
    named: str,
    environ: Mapping[str, str],
    now: Target | None = None,
) -> tuple[list[str], list[str]]:
    """Uninstall `names` (what this run's pip calls installed; None: what the venv holds `now`, probed here when not
    given, and `t`, probed just before that pip call, did not) -- each only when no other distribution's RECORD
    lists one of its files (pip would delete them). Returns (uninstalled, left in place)."""
    after = now or targets.probe(t.python_path, named, environ, versions_only=True)
    wanted = set(after.dists) - set(t.seen) if names is None else set(names) & set(after.dists)
    owned = files.owners(after)
    shared = {n for n in wanted if any(n in who and len(who) > 1 for who in owned.values())}
    gone = sorted(wanted - shared)
    if gone:
        _pip(t, ["uninstall", "--yes", *gone], environ, quiet=True)
    return gone, sorted(shared)


def _kept(kept: list[str]) -> str:
    return (
        f"{', '.join(kept)} left in place (another distribution lists its files: remove it by hand)"
    )


def _gone(removed: list[str], kept: Sequence[str] = ()) -> str:
    words = (
        f"{', '.join(removed)} uninstalled again, nothing installed"
        if removed
        else "nothing installed"
    )
    return f"{words}; {_kept(list(kept))}" if kept else words


def _undo_apex(before: Target, named: str, environ: Mapping[str, str], added: list[str]) -> str:
    """After apex's own pip install failed: an apex other than the venv's before uninstalled, then what this run
    added for it (`added`, name==version: never what someone else installed since the start); in words (an apex it
    replaced cannot be put back: that is said)."""
    now = targets.probe(before.python_path, named, environ, versions_only=True)
    words = []
    if before.apex is not None and (now.apex is None or now.apex.version != before.apex.version):
        if now.apex is not None:
            _pip(before, ["uninstall", "--yes", "apex"], environ, quiet=True)
            words.append(f"apex {now.apex.version} uninstalled again")
        words.append(f"the venv's apex {before.apex.version} is gone: install that again")
    names = [a.split("==", 1)[0] for a in added]
    return "; ".join([*words, _gone(*_take_back(before, names, named, environ, now))])


def _constraints(t: Target) -> str:
    """pip's constraints: each distribution the venv sees at its exact version (`name===version`: `==2.13.0` would
    admit 2.13.0+cpu; a PEP 440 version normalised, as pip compares it, a legacy one as it is), and torch, torch_npu
    and apex, where absent, at none (`<0`: no version is)."""
    lines = [f"{name}==={_normal(version)}\n" for name, version in sorted(t.seen.items())]
    lines += [f"{name}<0\n" for name in (*fit.GUARDED, "apex") if name not in t.seen]
    return "".join(lines)


def _pip(
    t: Target,
    args: list[str],
    environ: Mapping[str, str],
    quiet: bool = False,
    pip_env: bool = False,
) -> None:
    """The target's own pip, isolated from this shell's PIP_* settings (but for the index ones with `pip_env`: a
    dependency fetched from the user's index): installing apex itself fetches nothing (--no-index)."""
    env = {  # as the probe runs: what pip sees installed is what the probe saw (no PYTHONPATH, no user site)
        k: v
        for k, v in environ.items()
        if (not k.startswith("PIP_") or (pip_env and k in PIP_INDEX_ENV))
        and k not in ("PYTHONPATH", "PYTHONHOME", "PYTHONUSERBASE")
    }
    if pip_env:
        env.update(PIP_HELD_OFF)
    env.update(PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_NO_INPUT="1")
    argv = [t.python_path, "-s", "-m", "pip", *args]
    log.echo_command(argv)
    try:
        proc = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            env=env,
            timeout=PIP_TIMEOUT,
            stdin=subprocess.DEVNULL,
            preexec_fn=dies_with(os.getpid(), signal.SIGKILL),  # no pip outlives us
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise InstallError(
            f"pip {args[0]} did not finish: {exc}", "run it by hand to see why"
        ) from None
    if proc.returncode != 0 and not quiet:
        lines = [x for x in proc.stderr.splitlines() if x.strip()]
        # pip's first ERROR line says why ("Cannot install foo because ..."); its last is often a link or a hint
        first = next(
            (x for x in lines if x.lstrip().lower().startswith("error:")),
            lines[-1] if lines else "",
        )
        raise InstallError(
            f"pip {args[0]} failed in {t.venv}: "
            + (log.sanitise(log.mask(first[:300])) if first else str(proc.returncode)),
            "run the command above by hand to see the whole output",
        )
