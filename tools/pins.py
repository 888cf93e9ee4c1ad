"""The host tools' pins: requirements/*.in hold the direct pins (per Python range, with the reasons), and
`nox -s lock` writes hashed universal locks from them with uv (one file for every host Python 3.8-3.13):

    requirements/runtime.in  ->  requirements/runtime.txt   (what apexkit needs to run: README command 1)
    requirements/dev.in      ->  requirements/dev.txt       (runtime + tests + lint: README command 2, .ci/run)

pip installs a file with hashes in hash-checking mode: every distribution, dependencies included, must match a
recorded sha256, so an install is repeatable. `check()` compares a lock with its .in offline (the tests run it)."""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

from packaging.markers import Marker
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from apexkit import log, paths
from apexkit.errors import ConfigError, EnvironmentSetupError

PYTHONS = ("3.8", "3.9", "3.10", "3.11", "3.12", "3.13")  # the host Pythons apexkit supports
FLOOR = PYTHONS[0]
LOCKS = {  # lock -> the .in it is made from
    paths.RUNTIME_LOCK: paths.ROOT / "requirements" / "runtime.in",
    paths.DEV_LOCK: paths.ROOT / "requirements" / "dev.in",
}
COMMAND = "nox -s lock"


@dataclass(frozen=True)
class Pin:
    name: str  # canonical
    version: str
    marker: Marker | None
    hashes: tuple[str, ...] = ()

    def holds(self, python: str) -> bool:
        return self.marker is None or self.marker.evaluate(
            {
                "python_version": python,
                "python_full_version": python + ".0",
                "sys_platform": "linux",
                "platform_system": "Linux",
            }
        )


def _pin(text: str, where: str, hashes: tuple[str, ...] = ()) -> Pin:
    try:
        req = Requirement(text)
    except InvalidRequirement as exc:
        raise ConfigError(
            f"{where}: {text!r} is not a requirement ({exc})", "write it as name==version"
        ) from None
    specs = list(req.specifier)
    if len(specs) != 1 or specs[0].operator != "==":
        raise ConfigError(
            f"{where}: {text!r} is not an exact pin (name==version)", "pin it with =="
        )
    return Pin(canonicalize_name(req.name), specs[0].version, req.marker, hashes)


def read_in(path: Path, _seen: frozenset = frozenset()) -> list[Pin]:
    """The direct pins of a .in file, following `-r other.in` (a file that includes itself is one line)."""
    if path.resolve() in _seen:
        raise ConfigError(
            f"{path} includes itself through -r", "remove the -r line that leads back to it"
        )
    _seen = _seen | {path.resolve()}
    pins: list[Pin] = []
    for raw in _read(path).splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        words = line.split(None, 1)
        if words[0] == "-r" and len(words) == 2:
            pins += read_in(path.parent / words[1].strip(), _seen)
            continue
        if line.startswith("-"):
            raise ConfigError(
                f"{path}: {line!r} is not a pin (only name==version and -r other.in)",
                "put index options in pip's config (invoke proxy.setup --pip-index), not in the .in",
            )
        pins.append(_pin(line, str(path)))
    return pins


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError as exc:
        raise ConfigError(
            f"cannot read {path}: {exc.strerror or exc}",
            f"restore {path.name} from git, or run {COMMAND} to write the locks",
        ) from None


def read_lock(path: Path) -> list[Pin]:
    """The pins of a uv/pip-compile lock (`name==version ; marker \\` then `--hash=sha256:...` lines)."""
    pins: list[Pin] = []
    entry: list[str] = []

    def flush() -> None:
        if entry:
            text = " ".join(entry)
            hashes = tuple(re.findall(r"--hash=sha256:([0-9a-f]{64})", text))
            pins.append(
                _pin(
                    re.sub(r"\s*--hash=\S+", "", text).replace("\\", " ").strip(), str(path), hashes
                )
            )
            entry.clear()

    for raw in _read(path).splitlines():
        if not raw.strip() or raw.lstrip().startswith("#"):
            continue
        if raw[0].isspace():
            entry.append(raw.strip())
        else:
            flush()
            entry.append(raw.strip())
    flush()
    return pins


def for_python(pins: list[Pin], python: str) -> dict[str, str]:
    """name -> version of the pins that hold on that Python (a name held twice is an error in the file)."""
    out: dict[str, str] = {}
    for pin in pins:
        if pin.holds(python):
            if pin.name in out and out[pin.name] != pin.version:
                raise ConfigError(
                    f"two pins of {pin.name} hold for Python {python}", "fix the markers"
                )
            out[pin.name] = pin.version
    return out


def check(lock: Path, source: Path) -> list[str]:
    """What in `lock` disagrees with `source` (its .in): a direct pin missing or at another version on a supported
    Python, or an entry without a hash. Empty when the lock is current."""
    problems = []
    wanted, locked = read_in(source), read_lock(lock)
    for pin in locked:
        if not pin.hashes:
            problems.append(f"{pin.name}=={pin.version} has no --hash")
    for python in PYTHONS:
        have = for_python(locked, python)
        for name, version in for_python(wanted, python).items():
            if have.get(name) != version:
                problems.append(
                    f"Python {python}: {source.name} pins {name}=={version}, {lock.name} has "
                    f"{have.get(name, 'nothing')}"
                )
    return problems


def lock(uv: str, only_check: bool = False) -> int:
    """Write every lock from its .in with uv (universal: one file for Python 3.8-3.13, hashes for every file of each
    pinned release on the index uv uses -- PyPI, or UV_INDEX_URL behind a mirror); only_check: compare, write nothing."""
    bad = 0
    for lock_path, source in LOCKS.items():
        if not only_check:
            argv = [
                uv,
                "pip",
                "compile",
                "--universal",
                "--generate-hashes",
                "--python-version",
                FLOOR,
                "--quiet",
                "--custom-compile-command",
                COMMAND,
                str(source.relative_to(paths.ROOT)),
                "-o",
                str(lock_path.relative_to(paths.ROOT)),
            ]
            log.echo_command(argv)
            proc = subprocess.run(argv, cwd=paths.ROOT, capture_output=True, text=True)
            if proc.returncode != 0:
                reason = (proc.stderr.strip().splitlines() or ["no output"])[-1]
                raise EnvironmentSetupError(
                    f"uv pip compile {source.name} failed: {log.mask(reason)[:300]}",
                    "check the index (UV_INDEX_URL) and the pins in requirements/*.in",
                )
        problems = check(lock_path, source)
        for problem in problems:
            log.warn(f"{lock_path.relative_to(paths.ROOT)}: {problem}")
        bad += bool(problems)
        if not problems:
            log.info(
                f"✓ {lock_path.relative_to(paths.ROOT)}: {len(read_lock(lock_path))} pins with hashes, "
                f"matching {source.relative_to(paths.ROOT)}"
            )
    return 1 if bad else 0
