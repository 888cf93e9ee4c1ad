"""The venv `apexkit install` installs into, as its own interpreter sees it (bench/probes/target_env.py).

The probe's JSON is untrusted (a venv is anyone's directory): its size is capped, every field's type checked, versions
parsed as PEP 440 before they are compared, and nothing of it becomes a path or a shell word unchecked; what is shown
of it goes through log.sanitise."""

from __future__ import annotations

import json
import os
import re
import subprocess
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from apexkit import cann, log, paths, untrusted
from apexkit.errors import ConfigError

PROBE = paths.PROBES / "target_env.py"
OUTPUT_LIMIT = (
    1 << 20
)  # bytes of probe output read: a few hundred tags and RECORD rows are ~100 KiB
PROBE_TIMEOUT = 180.0  # seconds: `import torch` on a slow shared disk
_TAG = re.compile(r"^[A-Za-z0-9_.]+-[A-Za-z0-9_.]+-[A-Za-z0-9_.]+\Z")
_SHORT = re.compile(r"^[A-Za-z0-9_.+!-]{1,64}\Z")  # a version, a python tag, an arch
_CUDA = re.compile(r"^[0-9]{1,3}\.[0-9]{1,3}\Z")  # torch.version.cuda: "13.0"
# a distribution name (PEP 508): never a newline or an option (--index-url ...) in the constraints file pip reads
_NAME = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9._-]{0,98}[A-Za-z0-9])?\Z")
_DIST_VERSION = re.compile(
    r"^[A-Za-z0-9_.+!-]{1,256}\Z"
)  # PEP 440 or a legacy one: what pip still lists


class ProbeError(ConfigError):
    """The target interpreter could not be probed, or answered something that is not the probe's JSON."""


@dataclass(frozen=True)
class Apex:
    version: str
    apexkit: bool  # an apexkit wheel: its local label starts with "ascend" (or "cuNNN.torch": NVIDIA apex on CUDA)
    record: tuple[tuple[str, str], ...] = ()
    tags: tuple[str, ...] = ()


@dataclass(frozen=True)
class Target:
    python_path: str  # the interpreter given (or the venv's bin/python)
    venv: str  # sys.prefix as the interpreter reports it
    python: str  # "3.11"
    python_tag: str  # "cp311"
    machine: str  # "x86_64"
    glibc: str | None
    is_venv: bool
    conda: bool
    pip: str | None
    tags: tuple[str, ...]  # the wheel tags it installs, best first
    markers: dict[str, str]
    torch: str | None  # the installed version, local label kept: "2.13.0+cpu"
    torch_cxx11_abi: int | None
    torch_import_error: str | None
    torch_npu: str | None
    cann: str | None
    base_executable: str | None
    dists: dict[str, str] = field(default_factory=dict)  # canonical name -> version: the venv's own
    # the others its interpreter imports (a --system-site-packages base's): pip counts them as installed
    visible: dict[str, str] = field(default_factory=dict)
    apex: Apex | None = None
    torch_cuda: str | None = None  # torch.version.cuda ("13.0"); None: a CPU build, or no torch
    site_dirs: tuple[str, ...] = ()  # every folder a distribution is found in (realpath)
    scripts: str | None = None  # where pip writes a wheel's scripts

    @property
    def seen(self) -> dict[str, str]:
        """Every distribution the interpreter (and so its pip) sees, the venv's own first."""
        return {**self.visible, **self.dists}

    @property
    def cuda_cell(self) -> str:
        return f", CUDA {self.torch_cuda}" if self.torch_cuda else ""

    @property
    def torch_public(self) -> str | None:
        return Version(self.torch).public if self.torch else None

    def cell(self) -> str:
        """The matrix cell this venv is, in words: the one a missing wheel is named by."""
        return (
            f"Python {self.python} ({self.python_tag}), torch {self.torch}, torch_npu "
            f"{self.torch_npu or 'none'}{self.cuda_cell}, {self.machine}, glibc {self.glibc or 'unknown'}"
        )

    def want(self) -> dict[str, object]:
        """The facts remote.find_by_facts matches an index's wheels against."""
        return {
            "tags": self.tags,
            "python_tag": self.python_tag,
            "arch": self.machine,
            "glibc": self.glibc,
            "torch": self.torch_public,
            "torch_npu": self.torch_npu,
            "cxx11_abi": self.torch_cxx11_abi,
            "cuda": self.torch_cuda,
        }


def interpreter_for(
    venv: str | None, interpreter: str | None, environ: Mapping[str, str]
) -> tuple[str, str]:
    """(the interpreter to probe, how the target was named): --interpreter, else --venv's bin/python, else the active
    venv ($VIRTUAL_ENV, else $CONDA_PREFIX)."""
    if venv and interpreter:
        raise ConfigError("--venv and --interpreter both given", "pass one of them")
    if interpreter:
        return interpreter, f"--interpreter {interpreter}"
    where = venv or environ.get("VIRTUAL_ENV") or environ.get("CONDA_PREFIX")
    if not where:
        raise ConfigError(
            "no target venv: no --venv, no --interpreter and no active venv ($VIRTUAL_ENV)",
            "pass --venv DIR (the training venv), or activate it first",
        )
    named = f"--venv {where}" if venv else f"the active venv {where}"
    root = Path(where).expanduser()
    if not root.is_dir():
        raise ConfigError(f"{named} is not a directory", "pass --venv DIR of an existing venv")
    for candidate in (root / "bin" / "python", root / "bin" / "python3"):
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate), named
    raise ConfigError(
        f"{named} has no bin/python: it is not a venv",
        "pass --venv DIR of a venv (python -m venv DIR), or --interpreter PATH",
    )


def probe(
    python: str, named: str, environ: Mapping[str, str] | None = None, versions_only: bool = False
) -> Target:
    """Run the probe with the target's interpreter (TORCH_DEVICE_BACKEND_AUTOLOAD=0) and read its one JSON line;
    `versions_only`: without importing torch (its C++ ABI then unknown)."""
    path = Path(python).expanduser()
    if not path.is_file() or not os.access(path, os.X_OK):
        raise ConfigError(
            f"{named}: {python} is not an executable file",
            "pass --interpreter PATH of the training venv's python",
        )
    env = dict(os.environ if environ is None else environ)
    env[cann.NO_AUTOLOAD] = "0"
    for key in ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP"):
        env.pop(key, None)  # what the venv is, not what this shell adds to it
    with tempfile.TemporaryDirectory(prefix="apexkit-probe-") as cwd:
        try:
            proc = subprocess.run(
                # -S: no .pth file and no sitecustomize of the venv runs (the probe adds its site dirs itself)
                [
                    str(path),
                    "-s",
                    "-S",
                    str(PROBE),
                    *(["--versions-only"] if versions_only else []),
                ],
                capture_output=True,
                env=env,
                cwd=cwd,
                timeout=PROBE_TIMEOUT,
                stdin=subprocess.DEVNULL,
            )
        except subprocess.TimeoutExpired:
            raise ProbeError(
                f"{named}: {python} did not answer in {PROBE_TIMEOUT:g}s",
                "check that it starts (python -c 'import torch')",
            ) from None
        except OSError as exc:
            raise ProbeError(
                f"{named}: {python} cannot be run ({exc.strerror or exc})",
                "pass --interpreter PATH of a working python",
            ) from None
    if proc.returncode != 0:
        last = [x for x in proc.stderr[-4096:].decode(errors="replace").splitlines() if x.strip()]
        raise ProbeError(
            f"{named}: {python} failed to describe itself: "
            f"{log.sanitise(last[-1][:200]) if last else f'exit {proc.returncode}'}",
            "check that the interpreter starts",
        )
    return parse(proc.stdout, python, named)


def _bad(named: str, what: str) -> ProbeError:
    return ProbeError(
        f"{named}: the probe's answer is not usable ({what})",
        "check that the interpreter is a CPython 3.8+ (report this if it is)",
    )


def _str(
    data: Mapping, key: str, named: str, *, optional: bool = False, limit: int = 4096
) -> str | None:
    value = data.get(key)
    if value is None and optional:
        return None
    if not isinstance(value, str) or len(value) > limit or "\0" in value:
        raise _bad(named, f"{key} is not a string")
    return value


def _version(value: object, key: str, named: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not _SHORT.match(value):
        raise _bad(named, f"{key} is not a version")
    try:
        Version(value)
    except InvalidVersion:
        raise _bad(named, f"{key} {log.sanitise(value)} is not a PEP 440 version") from None
    return value


def is_dist_name(name: str) -> bool:
    """A PEP 508 distribution name of at most 100 characters: never a newline or an option for pip."""
    return bool(_NAME.match(name))


MAX_DISTS = 20_000  # a large training venv holds ~400


def _dists(data: dict, key: str, named: str) -> dict[str, str]:
    """{canonical name: version} of the probe's `key`; a name that is not PEP 508 or a version with other characters
    than a version's refuses the probe (each one is held in pip's constraints file, one per line: never skipped)."""
    raw = data.get(key)
    if not isinstance(raw, dict) or len(raw) > MAX_DISTS:
        raise _bad(named, f"{key} is not an object of at most {MAX_DISTS} entries")
    found: dict[str, str] = {}
    fix = "remove or reinstall that distribution (its .dist-info folder), then run apexkit install again"
    for name, version in raw.items():
        if not (isinstance(name, str) and _NAME.match(name)):
            raise ProbeError(
                f"{named} holds a distribution named {untrusted.shown(str(name)[:80])}: not a PEP 508 name",
                fix,
            )
        if not (isinstance(version, str) and _DIST_VERSION.match(version)):
            raise ProbeError(
                f"{named} holds {name} at version {untrusted.shown(str(version)[:80])}: not a version",
                fix,
            )
        found[canonicalize_name(name)] = version
    return found


def _load(stdout: bytes, named: str) -> dict:
    """The probe's last non-blank stdout line as a JSON object (torch may print before it)."""
    if len(stdout) > OUTPUT_LIMIT:
        raise _bad(named, f"more than {OUTPUT_LIMIT} bytes")
    lines = [x for x in stdout.decode(errors="replace").splitlines() if x.strip()]
    try:
        data = json.loads(lines[-1]) if lines else None
    except ValueError:
        data = None
    if not isinstance(data, dict):
        raise _bad(named, "no JSON object")
    return data


def _check_shape(data: dict, named: str) -> None:
    """The plain words, the true/false fields, the wheel tags and the markers, each of its type."""
    for key in ("python", "python_tag", "machine"):
        value = _str(data, key, named)
        if not value or not _SHORT.match(value):
            raise _bad(named, f"{key} is not a plain word")
    _str(data, "glibc", named, optional=True)
    for key in ("is_venv", "conda"):
        if not isinstance(data.get(key), bool):
            raise _bad(named, f"{key} is not true/false")
    tags = data.get("tags")
    if tags is not None and (
        not isinstance(tags, list) or not all(isinstance(t, str) and _TAG.match(t) for t in tags)
    ):
        raise _bad(named, "tags are not wheel tags")
    markers = data.get("markers")
    if not isinstance(markers, dict) or not all(
        isinstance(k, str) and isinstance(v, str) and len(v) < 1024 for k, v in markers.items()
    ):
        raise _bad(named, "markers are not strings")


def _torch(data: dict, named: str) -> tuple[str | None, int | None, str | None, str | None]:
    """The torch fields of a Target: its version, C++ ABI, import error and CUDA release (all None without torch)."""
    torch = data.get("torch")
    if torch is None:
        return None, None, None, None
    if not isinstance(torch, dict):
        raise _bad(named, "torch is not an object")
    version = _version(torch.get("version"), "torch.version", named)
    abi = torch.get("cxx11_abi")
    if abi not in (None, 0, 1) or isinstance(abi, bool):
        raise _bad(named, "torch.cxx11_abi is not 0, 1 or null")
    error = torch.get("import_error")
    cuda = torch.get("cuda")
    if cuda is not None and not (isinstance(cuda, str) and _CUDA.match(cuda)):
        raise _bad(named, "torch.cuda is not a CUDA release")
    return version, abi, log.sanitise(error[:300]) if isinstance(error, str) else None, cuda


def _apex(data: dict, named: str) -> Apex | None:
    """The apex the venv holds, if any; RECORD rows and tags that are not strings are dropped."""
    apex = data.get("apex")
    if apex is None:
        return None
    if not isinstance(apex, dict) or not isinstance(apex.get("apexkit"), bool):
        raise _bad(named, "apex is not an object")
    record, tags = apex.get("record"), apex.get("tags")
    return Apex(
        version=_version(apex.get("version"), "apex.version", named) or "",
        apexkit=apex["apexkit"],
        record=tuple(
            (r[0], r[1])
            for r in (record if isinstance(record, list) else [])
            if isinstance(r, list) and len(r) == 2 and all(isinstance(x, str) for x in r)
        ),
        tags=tuple(t for t in (tags if isinstance(tags, list) else []) if isinstance(t, str)),
    )


def _paths(data: dict, named: str) -> tuple[tuple[str, ...], str | None]:
    """(the site directories, the scripts folder): absolute paths, or none (an older probe's answer)."""
    paths = data.get("paths")
    if paths is None:
        return (), None
    dirs, scripts = paths.get("site_dirs") if isinstance(paths, dict) else None, None
    if isinstance(paths, dict):
        scripts = _str(paths, "scripts", named, optional=True)
    if not isinstance(dirs, list) or not all(isinstance(d, str) and os.path.isabs(d) for d in dirs):
        raise _bad(named, "paths.site_dirs is not a list of absolute paths")
    return tuple(dirs), scripts if scripts and os.path.isabs(scripts) else None


def parse(stdout: bytes, python: str, named: str) -> Target:
    """The probe's last stdout line (torch may print before it) as a Target; anything else is one ProbeError."""
    data = _load(stdout, named)
    _check_shape(data, named)
    glibc = data.get("glibc")
    torch, abi, import_error, torch_cuda = _torch(data, named)
    dists = _dists(data, "dists", named)
    visible = _dists(data, "visible", named) if data.get("visible") is not None else {}
    apex = _apex(data, named)
    base = _str(data, "base_executable", named, optional=True)
    site_dirs, scripts = _paths(data, named)
    return Target(
        python_path=python,
        venv=_str(data, "prefix", named) or "",
        python=data["python"],
        python_tag=data["python_tag"],
        machine=data["machine"],
        glibc=glibc if glibc is not None and re.match(r"^\d+\.\d+$", glibc) else None,
        is_venv=data["is_venv"],
        conda=data["conda"],
        pip=_version(data.get("pip"), "pip", named),
        tags=tuple(data.get("tags") or ()),
        markers=dict(data["markers"]),
        torch_npu=_version(data.get("torch_npu"), "torch_npu", named),
        cann=_version(data.get("cann"), "cann", named) if _cann_ok(data.get("cann")) else None,
        base_executable=base if base and os.path.isabs(base) else None,
        dists=dists,
        visible={k: v for k, v in visible.items() if k not in dists},
        apex=apex,
        torch=torch,
        torch_cxx11_abi=abi,
        torch_import_error=import_error,
        torch_cuda=torch_cuda,
        site_dirs=site_dirs,
        scripts=scripts,
    )


def _cann_ok(value: object) -> bool:
    """CANN versions are not PEP 440 (8.1.RC1): a plain word is enough, it is only reported."""
    return isinstance(value, str) and bool(_SHORT.match(value))


def check_usable(t: Target, named: str) -> None:
    """What must hold before anything is looked up: a venv, its pip, a torch, and no foreign `apex`."""
    if not (t.is_venv or t.conda):
        raise ConfigError(
            f"{named}: {t.python_path} is not in a venv (sys.prefix is the base interpreter's {t.venv})",
            "make the training venv first (python -m venv DIR) and pass --venv DIR; apexkit install "
            "never installs into a system Python",
        )
    if t.pip is None or not t.tags:
        raise ConfigError(
            f"{named} has no pip: apexkit installs with the venv's own pip",
            f"{t.python_path} -m ensurepip (a uv venv: uv venv --seed)",
        )
    if t.torch is None:
        raise ConfigError(
            f"{named} has no torch: the wheel is chosen by the venv's torch, and apexkit install never installs "
            "torch",
            "install the torch you train with first (pip install torch==X), then run apexkit install again",
        )
    if t.apex is not None and not t.apex.apexkit:
        raise ConfigError(
            f"{named} holds a distribution named apex {t.apex.version} that is not an apexkit wheel (PyPI's apex "
            "is an unrelated project)",
            f"{t.python_path} -m pip uninstall apex, then run apexkit install again",
        )
