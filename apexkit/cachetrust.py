"""One trust rule for everything under apexkit's cache: the wheels, the build and run venvs, the git mirrors, uv's
and virtualenv's caches, the container caches and the locks beside them.

A cache directory is trusted when it is owned by us (the effective user) or root and nobody else can write it (no
group or other write bit; a user-private group's write bit is allowed, as untrusted.others_can_write says), and
it is not a link. The cache root and each entry directly under it are checked once per process, before anything
in it is used (`root`, `trusted`). When one fails, apexkit uses a private cache for ALL of it -- never the shared
one for venvs or mirrors and a private one for wheels only -- and says so in one line.

A build venv is reused only when its directory and its bin/python pass the same check (`venv_problem`): a planted
interpreter would run as the builder.

Everything apexkit creates here gets an explicit mode, whatever the umask (`make_dir`), and `tighten_umask` keeps
the tools it runs (uv, git, virtualenv, pip) from making group/other-writable files either.
"""

from __future__ import annotations

import atexit
import os
import shutil
import stat
import tempfile
import threading
from collections.abc import Mapping
from pathlib import Path

from apexkit import log, paths, untrusted
from apexkit.errors import ConfigError

_resolved: dict[str, Path] = {}
_TEMPORARY = "apexkit-cache-"  # the prefix of a private cache for one run (_private)
_guard = threading.Lock()


def problem(path: Path, entries: bool = True) -> str | None:
    """Why the directory `path` may hold someone else's files (None: it is trusted, or does not exist yet). Checks
    `path` itself and (unless not `entries`) every entry directly under it (the wheels/, venvs/, git/ ... folders)."""
    st, why = _lstat(path)
    if st is None:
        return why or _swappable(path)
    if stat.S_ISLNK(st.st_mode):
        if st.st_uid not in (0, os.geteuid()):
            return f"a link owned by uid {st.st_uid}"
        try:
            st = os.stat(
                path
            )  # the root may be a link the user made (to a bigger disk): judge its target
        except OSError as exc:
            return f"a link that cannot be followed ({exc.strerror})"
    if not stat.S_ISDIR(st.st_mode):
        return "not a directory"
    reason = untrusted.others_can_write(st) or _swappable(path)
    if reason or not entries:
        return reason
    try:
        names = sorted(os.listdir(path))
    except OSError as exc:
        return f"unreadable ({exc.strerror})"
    for name in names:
        reason = entry_problem(Path(path) / name)
        if reason:
            return f"holding {name}, which is {reason}"
    return None


def _swappable(path: Path) -> str | None:
    """Why someone else can replace `path` or a folder above it, as written or with its links resolved, else None:
    a parent others can write, unless it is sticky and ours or root's and so is the entry in it (in a sticky
    folder, only the folder's owner and the entry's owner may rename that entry: the kernel's rule)."""
    me = os.geteuid()
    for chain in dict.fromkeys((Path(os.path.abspath(path)), Path(os.path.realpath(path)))):
        for entry, parent in zip((chain, *chain.parents), chain.parents):
            pst = _stat(parent)
            why = untrusted.others_can_write(pst) if pst is not None else None
            if why and pst and pst.st_mode & stat.S_ISVTX and pst.st_uid in (0, me):
                est = _lstat(entry)[0]
                if est is None or est.st_uid in (0, me):
                    continue
                return f"inside {parent}, where uid {est.st_uid} owns {entry.name} (and so can replace it)"
            if why:
                return f"inside {parent}, which is {why} (anyone there can replace it)"
    return None


def trusted_output(path: Path, setting: str, make: bool = True, entries: bool = True) -> Path:
    """`path`, a directory apexkit writes into or reads back from outside the cache (build/, dist/, reports/, the
    <target> folders under them, the kept CUDA objects), held to the cache's rule (`problem`) before anything is
    written there: made 0755 when missing (unless not `make`), else ConfigError naming it, why, and `setting` (the
    option or variable that points elsewhere). Never a private fallback: outputs are where the user looks.
    `entries`: judge what is already in it too (not for a folder apexkit only adds new files to, O_EXCL)."""
    path = Path(path)
    reason = problem(path, entries)
    if reason is None and make and not os.path.lexists(path):
        try:
            make_dir(path)
            reason = problem(path, entries)  # ours now, unless someone raced us to it
        except OSError as exc:
            reason = f"not creatable ({exc.strerror})"
    if reason:
        raise ConfigError(
            f"the output directory {path} is {reason}: not writing into it nor reading from it",
            f"remove it (or, as its owner, chown it to you and chmod go-w), or set {setting} to a directory "
            "only you can write",
        )
    return path


def entry_problem(path: Path) -> str | None:
    """Why one file or directory in the cache is not ours alone (None: it is, or does not exist): a link, owned
    by another user, or writable by others."""
    st, why = _lstat(path)
    if st is None:
        return why
    return "a link" if stat.S_ISLNK(st.st_mode) else untrusted.others_can_write(st)


def _lstat(path: Path) -> tuple[os.stat_result | None, str | None]:
    """(the lstat of `path`, None); (None, None) when it does not exist; (None, why) when it cannot be read."""
    try:
        return os.lstat(path), None
    except FileNotFoundError:
        return None, None
    except OSError as exc:
        return None, f"unreadable ({exc.strerror})"


def venv_problem(venv: Path) -> str | None:
    """Why the venv at `venv` may not be reused (None: it may): its directory, bin/ and bin/python must be ours,
    not writable by others, and bin/python no link out of places only we or root control."""
    for path in (venv, venv / "bin"):
        reason = entry_problem(path)
        if reason:
            return f"{path} is {reason}"
    python = venv / "bin" / "python"
    inside = True
    for hops in range(
        9
    ):  # venvs link bin/python to the base interpreter: follow, checking each hop
        try:
            st = os.lstat(python)
        except OSError as exc:
            return f"{python} is missing ({exc.strerror})"
        if not stat.S_ISLNK(st.st_mode):
            reason = _writable(st, inside)
            return f"{python} is {reason}" if reason else None
        if hops == 8:
            break
        target = Path(os.path.normpath(os.path.join(os.path.dirname(python), os.readlink(python))))
        inside = inside and _within(target, venv)
        parent = _stat(target.parent)
        if parent is None or _writable(parent, inside):
            return f"{python} links into {target.parent}, which others can write"
        python = target
    return f"{python} is a chain of links"


def _within(path: Path, top: Path) -> bool:
    return os.path.commonpath([os.path.abspath(path), os.path.abspath(top)]) == os.path.abspath(top)


def _writable(st: os.stat_result, inside: bool) -> str | None:
    """Inside the venv: the full rule. Outside (the base interpreter the venv links to, which apexkit runs anyway
    to make the venv): only that nobody but its owner can write it."""
    if inside:
        return untrusted.others_can_write(st)
    if st.st_mode & 0o022 and not stat.S_ISLNK(st.st_mode):
        return "group- or world-writable"
    return None


def _stat(path: Path) -> os.stat_result | None:
    try:
        return os.stat(path)
    except OSError:
        return None


def trusted(configured: Path) -> Path:
    """The cache to use for the configured one: itself when `problem` finds nothing (created 0755 when missing),
    else a private cache, with one warning line. Decided once per path and process."""
    key = os.path.abspath(str(configured))
    with _guard:
        if key in _resolved:
            return _resolved[key]
        if key in {str(p) for p in _resolved.values()}:  # already a private cache we chose
            return Path(key)
        reason = problem(configured)
        if reason is None:
            try:
                make_dir(Path(configured))
                reason = problem(configured)  # made by us just now, unless someone raced us to it
            except OSError as exc:
                reason = f"not creatable ({exc.strerror})"
        if reason is None:
            chosen = Path(configured)
        else:
            chosen = _private(Path(configured))
            log.warn(
                f"the apexkit cache {configured} is {reason}: not using any of it (wheels, venvs, git mirrors, "
                f"uv, containers, locks); using the private cache {chosen}"
                + (" (for this run: removed at exit)" if chosen.name.startswith(_TEMPORARY) else "")
                + f" -- next: chmod -R go-w {configured} "
                "(as its owner), or set APEXKIT_CACHE_DIR to a directory only you can write"
            )
        _resolved[key] = chosen
        return chosen


def root(env: Mapping[str, str] | None = None) -> Path:
    """The cache apexkit uses: paths.cache_dir (APEXKIT_CACHE_DIR, XDG_CACHE_HOME, ~/.cache/apexkit), trusted."""
    return trusted(paths.cache_dir(env))


def _private(refused: Path) -> Path:
    """A cache only we can write: the per-user default when the refused one was set elsewhere, else a fresh
    directory in the temporary folder (0700, removed at exit)."""
    env = {k: v for k, v in os.environ.items() if k != "APEXKIT_CACHE_DIR"}
    try:
        default = paths.cache_dir(env)
    except Exception:  # a default under a file: fall through to a temporary cache
        default = None
    if default is not None and os.path.abspath(default) != os.path.abspath(refused):
        try:
            make_dir(default, 0o700)
            if problem(default) is None:
                return default
        except OSError:
            pass
    made = Path(tempfile.mkdtemp(prefix=f"{_TEMPORARY}{os.geteuid()}-"))
    os.chmod(made, 0o700)
    atexit.register(shutil.rmtree, str(made), True)
    return made


def make_dir(path: Path, mode: int = 0o755) -> Path:
    """mkdir -p with an explicit `mode` for each folder it creates (an existing one keeps its mode), whatever the
    umask."""
    path = Path(path)
    missing = []
    for folder in (path, *path.parents):
        if os.path.lexists(folder):
            break
        missing.append(folder)
    for folder in reversed(missing):
        try:
            os.mkdir(folder, mode)
        except FileExistsError:
            continue
        fd = os.open(
            folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
        )  # never a link swapped in
        try:
            os.fchmod(fd, mode)
        finally:
            os.close(fd)
    return path


def tighten_umask() -> None:
    """Add go-w to the process umask, so files apexkit and the tools it runs (uv, git, virtualenv, pip) create
    are never group/other-writable, even under umask 000."""
    old = os.umask(0o022)
    os.umask(old | 0o022)
