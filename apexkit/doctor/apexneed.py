"""Does a training environment need Apex for Ascend at all? (`invoke doctor --venv PATH --scripts DIR`)

The facts are data (apex_need.toml: each with its source and the date read). This module only
- reads the environment: runs the target interpreter, which lists its distributions with importlib.metadata
  (Python 3.8+; pkg_resources before that) without importing any training package, and reads the git branch/tag of
  editable installs (the install guides `pip install -e` MindSpeed from a checkout of a release branch);
- scans training scripts: a bounded line scan of *.py for the patterns of apex_need.toml, reported as file:line;
- decides (`decide`, pure): the rule of apex_need.toml [verdict].
"""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from urllib.parse import unquote, urlparse

from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from apexkit import paths, vocab
from apexkit.errors import ConfigError

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python < 3.11
    import tomli as tomllib

DATA = Path(__file__).with_name("apex_need.toml")
NEEDED, NOT_NEEDED, UNKNOWN = "needed", "not-needed", "unknown"
NEEDS, REPLACES, UNCLEAR, INFO = (
    "needs",
    "replaces",
    "unclear",
    "info",
)  # what one piece of evidence does
SHOWN_PER_PATTERN = 3  # file:line locations named in a row; --json has them all (up to MAX_HITS)
MAX_HITS = 200
BINARY_SNIFF = (
    8192  # a NUL byte in a file's first 8 KiB: a binary, not a script (as git and grep -I decide)
)

# Runs in the target interpreter (any Python 3): lists distributions, imports nothing of the training stack.
_PROBE = paths.PROBES / "training_env.py"


# --- facts -------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Pattern:
    id: str
    regex: re.Pattern
    needs: str  # always | unless-standins
    what: str
    source: str
    alternative: str = ""
    optional_in_try: bool = False  # an import: inside try/except ImportError it is optional


@dataclass(frozen=True)
class Facts:
    read: str
    labels: dict
    distributions: dict  # canonical name -> table of apex_need.toml
    torch_npu_optimizers: tuple
    patterns: tuple
    scan: dict


def load(path: Path = DATA) -> Facts:
    with open(path, "rb") as fh:
        data = tomllib.load(fh)
    return Facts(
        data["read"],
        data["verdict"]["labels"],
        {canonicalize_name(k): {**v, "name": k} for k, v in data["distributions"].items()},
        tuple(data["torch_npu"]["fused_optimizers"]),
        tuple(
            Pattern(
                p["id"],
                re.compile(p["regex"]),
                p["needs"],
                p["what"],
                p["source"],
                p.get("alternative", ""),
                p.get("optional_in_try", False),
            )
            for p in data["patterns"]
        ),
        data["scan"],
    )


# --- evidence and the verdict ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Evidence:
    effect: str  # needs | replaces | unclear | info
    name: str  # the distribution (mindspeed-llm) or the pattern (combine-grad)
    where: str  # "mindspeed-llm 2.3.0" or "train.py:42"
    what: str  # one line
    source: str = ""
    alternative: str = ""
    release: str = ""  # the stack's release, when one is known


@dataclass
class Verdict:
    verdict: str  # needed | not-needed | unknown
    label: str
    reasons: list  # the evidence the verdict rests on, strongest first
    evidence: list  # everything found
    apex_installed: str | None = None  # the apex version installed in the target, if any
    next_step: str = ""
    notes: list = field(default_factory=list)  # what the scan skipped
    hits: list = field(default_factory=list)  # every script hit (up to MAX_HITS), for --json

    def summary(self) -> str:
        if not self.reasons:
            return f"{self.label}: nothing found that needs apex, nothing known that replaces it"
        first = self.reasons[0]
        more = f" (+{len(self.reasons) - 1} more)" if len(self.reasons) > 1 else ""
        return f"{self.label}: {first.where} {first.what}{more}; source: {first.source}"

    def as_dict(self) -> dict:
        return asdict(self)  # the evidence in reasons and evidence as dicts too


def decide(evidence: list[Evidence], facts: Facts) -> Verdict:
    """apex_need.toml [verdict]: any `needs` -> needed; else any `replaces` -> not needed; else unknown."""
    needs, replaces, unclear = (
        [e for e in evidence if e.effect == k] for k in (NEEDS, REPLACES, UNCLEAR)
    )
    verdict, reasons = (
        (NEEDED, needs) if needs else (NOT_NEEDED, replaces) if replaces else (UNKNOWN, unclear)
    )
    return Verdict(verdict, facts.labels[verdict], reasons, list(evidence))


# --- the target environment ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Dist:
    name: str
    version: str
    source_dir: (
        str | None
    )  # the checkout it was installed from (pip install -e / pip install <dir>), if known


@dataclass(frozen=True)
class Environment:
    python: str  # 3.10.12
    executable: str
    prefix: str
    dists: dict  # canonical name -> Dist (the first on sys.path, as import would see it)

    @property
    def minor(self) -> str:
        return ".".join(self.python.split(".")[:2])


def resolve_target(venv: str | None, python: str | None) -> str | None:
    """The interpreter of --venv PATH or --interpreter PATH (None: neither given); bad input is one ConfigError."""
    if venv and python:
        raise ConfigError(
            "--venv and --interpreter both name a training environment", "pass one of them"
        )
    if venv:
        root = Path(venv).expanduser()
        if not root.is_dir():
            raise ConfigError(
                f"--venv {venv}: no such directory",
                "pass the training environment's directory (the sys.prefix of its python)",
            )
        for candidate in (root / "bin" / "python3", root / "bin" / "python"):
            if candidate.is_file() and os.access(candidate, os.X_OK):
                return str(candidate)
        raise ConfigError(
            f"--venv {venv} is not a Python environment (no bin/python3 in it)",
            "pass the venv or conda env directory, or its interpreter with --interpreter PATH",
        )
    if python:
        path = shutil.which(python) if os.sep not in python else python
        if not path or not Path(path).is_file() or not os.access(path, os.X_OK):
            raise ConfigError(
                f"--interpreter {python}: no such interpreter",
                "pass the training environment's python, e.g. --interpreter /opt/venv/bin/python3",
            )
        return path
    return None


def read_environment(python: str, timeout: float = 120) -> Environment:
    """Run `python` once: its version and distributions (importlib.metadata), nothing of the stack imported."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONHOME", "PYTHONSTARTUP")}
    with tempfile.TemporaryDirectory(
        prefix="apexkit-probe-"
    ) as cwd:  # nothing of the caller's cwd is read
        try:
            proc = subprocess.run(
                [python, str(_PROBE)],
                capture_output=True,
                text=True,
                timeout=timeout,
                cwd=cwd,
                env=env,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise ConfigError(
                f"{python} does not run ({exc.__class__.__name__}: {exc})",
                "pass the training environment's python (--venv DIR or --interpreter PATH)",
            ) from None
    line = next((x for x in proc.stdout.splitlines() if x.startswith("APEXKIT-PROBE ")), None)
    if proc.returncode != 0 or line is None:
        last = (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1]
        raise ConfigError(
            f"{python} cannot list its packages ({last[:160]})",
            "pass a Python 3.8+ interpreter of the training environment (--venv DIR or --interpreter PATH)",
        )
    try:
        data = json.loads(line[len("APEXKIT-PROBE ") :])
        dists: dict[str, Dist] = {}
        for d in data["dists"]:
            dists.setdefault(  # the first on sys.path, as import sees it
                canonicalize_name(d["name"]),
                Dist(
                    d["name"], d["version"], _source_dir(d.get("direct_url"), d.get("path") or "")
                ),
            )
        return Environment(data["python"], data["executable"], data["prefix"], dists)
    except (
        ValueError,
        KeyError,
        TypeError,
        AttributeError,
    ) as exc:  # not what _PROBE prints: a wrapper or a fake
        raise ConfigError(
            f"{python} printed an unreadable package list ({exc.__class__.__name__}: {str(exc)[:120]})",
            "pass the training environment's real Python 3.8+ interpreter (--venv DIR or --interpreter PATH)",
        ) from None


def _source_dir(direct_url: str | None, dist_path: str) -> str | None:
    if direct_url:
        try:
            info = json.loads(direct_url)
        except ValueError:
            info = {}
        url = info.get("url", "")
        if "dir_info" in info and url.startswith("file:"):
            return unquote(urlparse(url).path)
    # setup.py develop: the egg-info sits in the checkout
    develop = dist_path.endswith(".egg-info") and (Path(dist_path).parent / "setup.py").is_file()
    return str(Path(dist_path).parent) if develop else None


def git_refs(checkout: Path) -> list[str]:
    """The branch and the tags at HEAD of a git checkout (empty when it is none or git is missing)."""
    git = shutil.which("git")
    if git is None or not (checkout / ".git").exists():
        return []
    names = []
    for argv in (["rev-parse", "--abbrev-ref", "HEAD"], ["tag", "--points-at", "HEAD"]):
        try:
            proc = subprocess.run(
                [git, "-c", f"safe.directory={checkout}", "-C", str(checkout), *argv],
                capture_output=True,
                text=True,
                timeout=30,
            )
        except (OSError, subprocess.TimeoutExpired):
            continue
        if proc.returncode == 0:
            names += [
                x.strip() for x in proc.stdout.splitlines() if x.strip() and x.strip() != "HEAD"
            ]
    return names


def _setup_py_version(checkout: Path) -> str | None:
    try:
        text = (checkout / "setup.py").read_text(errors="replace")
    except OSError:
        return None
    m = re.search(r"""^__version__\s*=\s*['"]([^'"]+)['"]""", text, re.M)
    return m.group(1) if m else None


def _version(text: str) -> Version | None:
    try:
        return Version(text)
    except InvalidVersion:
        return None


@dataclass(frozen=True)
class Sighting:
    """A stack distribution seen installed in the environment or as a checkout among the scripts."""

    key: str  # canonical name, a key of apex_need.toml [distributions]
    version: str
    checkout: Path | None
    how: str  # " (from DIR)" / " (checkout DIR)"


def _release_candidates(
    table: dict, version: str, checkout: Path | None, paired: str | None
) -> tuple[list[str], str]:
    """The releases `version` may be, narrowed by the checkout's git ref, then by the paired project; how it was told."""
    candidates = list(table.get("releases", {}).get(version, []))
    if not candidates and table["version_is"] == "release" and _version(version) is not None:
        candidates = [version]
    if checkout is not None and len(candidates) != 1 and table.get("ref_release"):
        pattern = re.compile(table["ref_release"])
        for ref in git_refs(checkout):
            m = pattern.match(ref)
            if m and (not candidates or m.group(1) in candidates):
                return [m.group(1)], f" (git {ref})"
    if paired is not None and len(candidates) > 1 and paired in candidates:
        return [paired], f" (paired with {table['paired_with']} {paired})"
    return candidates, ""


def stack_evidence(
    key: str, version: str, checkout: Path | None, facts: Facts, how: str, paired: str | None = None
) -> Evidence:
    """What one MindSpeed / MindSpeed-LLM / ModelLink says: by its version, else by its checkout's branch/tag, else by
    the release of the project it is paired with (`paired`)."""
    table = facts.distributions[key]
    project, first = table["project"], table.get("replaces_from")
    upgrade = table.get("upgrade") or f"{project} >= {first}"
    source = f"{table['cite']} (read {table['read']})"
    name = table["name"]
    candidates, via = _release_candidates(table, version, checkout, paired)
    where = f"{name} {version}{how}"
    parsed = [_version(c) for c in candidates]
    release = candidates[0] if len(candidates) == 1 else ""
    if candidates and first is None:
        return Evidence(
            NEEDS,
            name,
            where,
            f"= {project}: every release installs and uses apex",
            source,
            f"move to {upgrade}, which needs no apex",
            release,
        )
    threshold = Version(first or "0")
    if not candidates or None in parsed:
        return Evidence(
            UNCLEAR,
            name,
            where,
            f"= {project} release unknown (apex_need.toml read {facts.read} has no "
            f"{table['name']} {version})",
            source,
        )
    releases = " / ".join(candidates)
    versions = [v for v in parsed if v is not None]  # every one: a None returned above
    if all(v >= threshold for v in versions):
        return Evidence(
            REPLACES,
            name,
            where,
            f"= {project} {releases}{via}: >= {first} does not install apex (MindSpeed's "
            "stand-ins replace it)",
            source,
            "",
            release,
        )
    if all(v < threshold for v in versions):
        return Evidence(
            NEEDS,
            name,
            where,
            f"= {project} {releases}{via}: releases before {first} install and use apex",
            source,
            f"move to {upgrade}, which needs no apex",
            release,
        )
    return Evidence(
        UNCLEAR,
        name,
        where,
        f"could be {project} {releases} (the version does not tell; {first} on replaces "
        "apex, older releases need it)",
        source,
        "install it editable from its git checkout (pip install -e DIR) so the release branch shows, or "
        "pass the checkout with --scripts DIR",
    )


def stacks_evidence(sightings: list[Sighting], facts: Facts) -> list[Evidence]:
    """In apex_need.toml order, so that a project's release is known before the one paired with it is read."""
    known: dict[str, str] = {}
    evidence = []
    for key, table in facts.distributions.items():
        for s in (s for s in sightings if s.key == key):
            e = stack_evidence(
                key,
                s.version,
                s.checkout,
                facts,
                s.how,
                known.get(canonicalize_name(table.get("paired_with", ""))),
            )
            known.setdefault(key, e.release)
            evidence.append(e)
    return evidence


def checkout_sightings(root: Path, facts: Facts, installed: set[str]) -> list[Sighting]:
    """A MindSpeed-LLM / MindSpeed checkout given as --scripts (the install guides run MindSpeed-LLM from its
    checkout without installing it): its release from its branch/tag, else its setup.py."""
    sightings = []
    start = root if root.is_dir() else root.parent
    for key, table in facts.distributions.items():
        if key in installed or not table.get("package"):
            continue
        for directory in [start, *start.parents][:6]:
            if _regular_file(directory / "setup.py") and _regular_file(
                directory / table["package"] / "__init__.py"
            ):
                sightings.append(
                    Sighting(
                        key,
                        _setup_py_version(directory) or "?",
                        directory,
                        f" (checkout {directory})",
                    )
                )
                break
    return sightings


# --- training scripts ------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Hit:
    pattern: str
    file: str
    line: int
    text: str
    name: str = ""  # e.g. NpuFusedAdam
    guarded: bool = (
        False  # an import inside `try: ... except ImportError:`: the code runs without apex
    )


GUARDS = {"ImportError", "ModuleNotFoundError", "Exception", "BaseException"}


def guarded_lines(text: str) -> set[int]:
    """Lines inside the body of a `try` whose handler catches ImportError (or broader): optional imports.
    Code this host's Python cannot parse counts as unguarded."""
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return set()
    lines: set[int] = set()
    for node in (n for n in ast.walk(tree) if isinstance(n, ast.Try)):
        caught = {
            "BaseException" if k is None else getattr(k, "id", getattr(k, "attr", ""))
            for handler in node.handlers
            for k in (handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type])
        }
        if caught & GUARDS:
            lines.update(
                number
                for statement in node.body
                for number in range(
                    statement.lineno,
                    (getattr(statement, "end_lineno", None) or statement.lineno) + 1,
                )
            )
    return lines


def _regular_file(path: Path) -> bool:
    """Path.is_file() without its exceptions: EACCES (another user's 0700 directory) is `False`, not a traceback."""
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except OSError:
        return False


def check_scripts_path(root: Path, shown_as: str | None = None) -> None:
    """--scripts must exist and be reachable (Path.exists() raises PermissionError under an unsearchable directory)."""
    try:
        os.stat(root)
    except FileNotFoundError:
        raise ConfigError(
            f"--scripts {shown_as or root}: no such file or directory",
            "pass the directory (or the file) holding the training scripts",
        ) from None
    except OSError as exc:
        raise ConfigError(
            f"--scripts {shown_as or root}: cannot read it ({exc.strerror or exc})",
            "pass a directory you can read, or run doctor as its owner",
        ) from None


def _list_scripts(root: Path, limits: dict) -> tuple[list[Path], list[str], list[str]]:
    """The *.py under `root` (sorted, venvs and skip_dirs left out, at most max_files); notes; unlistable dirs."""
    if not root.is_dir():
        return [root], [], []
    skip = set(limits["skip_dirs"])
    suffixes = tuple(limits["suffixes"])
    files: list[Path] = []
    unlistable: list[str] = []
    for dirpath, dirnames, filenames in os.walk(
        root, onerror=lambda exc: unlistable.append(f"{exc.filename} ({exc.strerror or exc})")
    ):
        dirnames[:] = sorted(
            d
            for d in dirnames
            if d not in skip and not _regular_file(Path(dirpath) / d / "pyvenv.cfg")
        )  # a venv inside the tree
        for name in sorted(n for n in filenames if n.endswith(suffixes)):
            if len(files) >= limits["max_files"]:
                return (
                    files,
                    [f"scanned the first {limits['max_files']} {'/'.join(suffixes)} files only"],
                    unlistable,
                )
            files.append(Path(dirpath) / name)
    return files, [], unlistable


def _read_script(path: Path, limits: dict) -> tuple[str, str]:
    """(kind, text or the OSError's words): kind is text | special | too_big | binary | error."""
    try:
        # follows a symlink to what it names; stat never opens, so a FIFO cannot block it
        info = os.stat(path)
        if not stat.S_ISREG(info.st_mode):
            return "special", ""
        if info.st_size > limits["max_file_bytes"]:
            return "too_big", ""
        with open(path, "rb") as fh:
            data = fh.read(limits["max_file_bytes"] + 1)
    except OSError as exc:
        return "error", f"{path}: {exc.strerror or exc}"
    return (
        ("binary", "")
        if b"\0" in data[:BINARY_SNIFF]
        else ("text", data.decode("utf-8", errors="replace"))
    )


def _line_hits(text: str, shown: str, facts: Facts, anything: re.Pattern) -> list[Hit]:
    """The hits of one script: the first pattern per line; comment lines never count."""
    hits: list[Hit] = []
    guarded: set[int] | None = None  # parsed only when an import pattern hits
    for number, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("#") or not anything.search(line):
            continue
        for pattern in facts.patterns:
            m = pattern.regex.search(line)
            if not m:
                continue
            name = next((g for g in m.groups() if g and g.startswith("NpuFused")), "")
            if pattern.optional_in_try and guarded is None:
                guarded = guarded_lines(text)
            optional = bool(pattern.optional_in_try and number in (guarded or ()))
            hits.append(Hit(pattern.id, shown, number, line.strip()[:160], name, optional))
            break
    return hits


def scan_scripts(
    root: Path, facts: Facts, shown_as: str | None = None
) -> tuple[list[Hit], list[str]]:
    """Every line of the *.py under `root` (or the one file `root`) that a pattern names; notes on what was skipped.
    Only regular text files are read: a FIFO or device named *.py is never opened (reading one would block or consume
    it), a file with a NUL byte in its first 8 KiB is a binary; unreadable directories are noted, never fatal."""
    check_scripts_path(root, shown_as)
    limits = facts.scan
    files, notes, unlistable = _list_scripts(root, limits)
    base = shown_as or str(root)
    anything = re.compile("|".join(f"(?:{p.regex.pattern})" for p in facts.patterns))
    hits: list[Hit] = []
    skipped: dict[str, list[str]] = {"too_big": [], "special": [], "binary": []}
    scanned = 0
    for path in files:
        kind, text = _read_script(path, limits)
        if kind == "error":
            notes.append(text)
        elif kind != "text":
            skipped[kind].append(str(path))
        else:
            scanned += 1
            hits += _line_hits(
                text,
                base if path == root else os.path.join(base, os.path.relpath(path, root)),
                facts,
                anything,
            )
    return hits, [
        f"scanned {scanned} file(s) under {base}",
        *notes,
        *_skip_notes(skipped, unlistable, limits),
    ]


def _skip_notes(skipped: dict[str, list[str]], unlistable: list[str], limits: dict) -> list[str]:
    """One note per kind of file the scan left out, in a fixed order; the odd ones named."""
    kinds = (
        ("too_big", f"file(s) over {limits['max_file_bytes']} bytes", False),
        ("special", "file(s) that are not regular files (FIFO, device, socket)", True),
        ("binary", f"binary file(s) (a NUL byte in the first {BINARY_SNIFF} bytes)", True),
    )
    notes = [
        f"skipped {len(skipped[kind])} {what}" + (f": {_first(skipped[kind])}" if named else "")
        for kind, what, named in kinds
        if skipped[kind]
    ]
    unlisted = f"could not list {len(unlistable)} directory(ies): {_first(unlistable)}"
    return notes + ([unlisted] if unlistable else [])


def _first(paths: list[str]) -> str:
    return ", ".join(paths[:SHOWN_PER_PATTERN]) + (
        f" (+{len(paths) - SHOWN_PER_PATTERN} more)" if len(paths) > SHOWN_PER_PATTERN else ""
    )


def script_evidence(hits: list[Hit], facts: Facts, standins: bool) -> list[Evidence]:
    """One piece of evidence per pattern, naming its first locations (apex_need.toml [[patterns]] order)."""
    evidence = []
    for pattern in facts.patterns:
        optional = [h for h in hits if h.pattern == pattern.id and h.guarded]
        if optional:
            evidence.append(
                Evidence(
                    INFO,
                    pattern.id,
                    _where(optional),
                    f"{pattern.what}, inside try/except ImportError: optional, runs without apex",
                    pattern.source,
                )
            )
        mine = [h for h in hits if h.pattern == pattern.id and not h.guarded]
        if not mine:
            continue
        where = _where(mine)
        alternative = pattern.alternative
        if "{name}" in alternative:
            names = sorted({h.name for h in mine if h.name})
            shipped = [n for n in names if n in facts.torch_npu_optimizers]
            alternative = (
                alternative.replace("{name}", ", ".join(shipped) or "NpuFused*")
                if shipped or not names
                else ""
            )
        evidence.append(
            Evidence(
                INFO,
                pattern.id,
                where,
                f"{pattern.what}: covered by MindSpeed's stand-in",
                pattern.source,
            )
            if pattern.needs == "unless-standins" and standins
            else Evidence(NEEDS, pattern.id, where, pattern.what, pattern.source, alternative)
        )
    return evidence


def _where(hits: list[Hit]) -> str:
    return _first([f"{h.file}:{h.line}" for h in hits])


# --- one verdict for one environment (+ scripts) --------------------------------------------------------------------------


def build_command(env: Environment | None, stacks: dict) -> str:
    """The apexkit build for that environment: its matrix.toml stack when one matches, else its Python and torch."""
    if env is None:
        return vocab.build("3.X", "--stack NAME (matrix.toml [stacks]) or --torch VERSION")
    torch = env.dists.get("torch")
    npu = env.dists.get("torch-npu")
    torch_base = torch.version.split("+")[0] if torch else None
    for name, stack in stacks.items():
        if (
            str(stack.get("python")) == env.minor
            and stack.get("torch") == torch_base
            and (npu is None or stack.get("torch_npu") == npu.version)
        ):
            return vocab.build(env.minor, f"--stack {name}")
    npu_option = f" --torch-npu {npu.version}" if npu else ""
    return (
        vocab.build(env.minor, f"--torch {torch_base}{npu_option}")
        if torch_base
        else vocab.build(env.minor)
    )


def assess(
    env: Environment | None,
    scripts: Path | None,
    facts: Facts,
    stacks: dict,
    scripts_shown: str | None = None,
) -> Verdict:
    sightings = (
        [  # the stack distributions installed in the environment
            Sighting(
                key,
                dist.version,
                Path(dist.source_dir) if dist.source_dir else None,
                f" (from {dist.source_dir})" if dist.source_dir else "",
            )
            for key in facts.distributions
            if (dist := env.dists.get(key)) is not None
        ]
        if env
        else []
    )
    hits: list[Hit] = []
    notes: list[str] = []
    if scripts is not None:
        sightings += checkout_sightings(scripts, facts, set(env.dists) if env else set())
        hits, notes = scan_scripts(scripts, facts, scripts_shown)
    evidence = stacks_evidence(sightings, facts)
    evidence += script_evidence(
        hits,
        facts,
        any(
            facts.distributions[e.name].get("standins")
            for e in evidence
            if e.name in facts.distributions
        ),
    )
    verdict = decide(evidence, facts)
    apex = env.dists.get("apex") if env else None
    verdict.apex_installed = apex.version if apex else None
    verdict.notes = notes
    verdict.hits = [asdict(h) for h in hits[:MAX_HITS]]
    verdict.next_step = _next_step(verdict, apex, env, stacks, scanned=scripts is not None)
    return verdict


def _next_step(
    verdict: Verdict, apex: Dist | None, env: Environment | None, stacks: dict, scanned: bool
) -> str:
    """The one line after the verdict: build apex, drop it, or look closer."""
    installed = f"apex {apex.version} is installed" if apex else ""
    if verdict.verdict == NEEDED:
        return _needed_step(verdict.reasons, installed, build_command(env, stacks))
    if verdict.verdict == NOT_NEEDED:
        return (f"{installed} but nothing found needs it" if apex else "nothing to build") + (
            "" if scanned else " (scripts not scanned: add --scripts DIR to be sure)"
        )
    return (f"{installed}; " if apex else "") + (
        next((e.alternative for e in verdict.reasons if e.alternative), "")
        or "apex is optional here: point doctor at the training environment and scripts "
        f"({vocab.command('doctor', '--venv DIR --scripts DIR')})"
    )


def _needed_step(reasons: list[Evidence], installed: str, build: str) -> str:
    ways_off = "; ".join(dict.fromkeys(e.alternative for e in reasons if e.alternative))
    if installed:
        return installed + (f"; to drop it: {ways_off}" if ways_off else "")
    if ways_off and all(e.alternative for e in reasons):
        return f"build it: {build}; or drop apex: {ways_off}"
    return f"build it: {build}" + (f" (a way off for some of it: {ways_off})" if ways_off else "")
