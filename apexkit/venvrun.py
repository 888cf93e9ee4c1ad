"""`nox -s validate` / `nox -s bench` / `apexkit validate|bench`: what `Run` says, its options declared there.

The run venv is cached per target, wheel and package sources (cache/run-venvs/): torch (+ torch_npu) as the build
had it, the wheel (--no-deps); for the bench also matplotlib for the chart, when it can be had (the bench runs without
the chart otherwise). apexkit itself never imports torch: it runs the venv's interpreter.
The packages come from where the build got its own: the index options, wheelhouses and offline flag its manifest
records ("package_sources"); --index-url, --extra-index-url, --torch-index-url, --wheelhouse and --offline given now
override them, so `nox -s build-3.11 bench -- --offline --wheelhouse DIR` builds and benches without a network.
Options this module does not know are passed to the script, e.g. `nox -s bench -- --device cpu --model qwen3-block`.
APEXKIT_BENCH_ARGS adds script options too, for one command line with a build: `nox -s build-3.11 bench`.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import stat
import subprocess
import sys
import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from apexkit import cachetrust, declare, envvars, log, paths, pipconfig, untrusted, urls, vocab
from apexkit.declare import option
from apexkit.errors import BenchError, ConfigError, EnvironmentSetupError
from apexkit.plan import matrix
from apexkit.wheel import venvs

ROOT = paths.ROOT
SCRIPTS = {"validate": ROOT / "bench" / "validate_env.py", "bench": ROOT / "bench" / "amp_bench.py"}
RUN_EXTRAS = ("matplotlib",)  # the bench's chart only: optional, never installed for validate
SOURCES = "package_sources"  # the manifest's field (apexkit.wheel.venvs.IndexOptions.recorded)
MAX_ENTRIES = 32  # index URLs or wheelhouses a manifest may list
MAX_TEXT = 4096  # characters of one URL or path read from a manifest
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
# torch wheels built against NumPy 1.x (torch 2.1, 2.2) print a traceback-shaped warning at `import torch` and lose
# torch.from_numpy when matplotlib pulls NumPy 2 (Python >= 3.9). Asked of the venv by trying, not by torch version.
NUMPY_PROBE = paths.PROBES / "numpy_torch.py"
NUMPY_1 = "numpy<2"
# dist/<target>/contracts.json: what `nox -s contracts -- --target ID` (tools/contracts.py) wrote
CONTRACT_FILE = "contracts.json"
FROM_BUILD = (
    "package sources of the run venv (default: the build's, as its manifest.json records them)"
)


@dataclass(frozen=True)
class Run:
    """Run bench/validate_env.py or bench/amp_bench.py inside a venv that holds the built wheel of a target in dist/
    (the newest, or --target ID), or inside any interpreter (--interpreter PATH)."""

    target: str | None = option(
        None, "target id in dist/ (default: the newest build)", metavar="ID"
    )
    python: str | None = option(
        None, "the newest target for this Python (e.g. 3.11)", metavar="VERSION"
    )
    in_env: str | None = option(
        None,
        "run with this interpreter as it is (no run venv)",
        flag="--interpreter",
        metavar="PATH",
    )
    dist: str = option(
        str(ROOT / "dist"), "where the builds are (default: $APEXKIT_DIST_DIR, else dist/)", env="APEXKIT_DIST_DIR",
        metavar="DIR",
    )  # fmt: skip
    reports: str = option(
        str(ROOT / "reports"),
        "where outputs go by default: <reports>/<target>/ (default: $APEXKIT_REPORTS_DIR, else reports/)",
        env="APEXKIT_REPORTS_DIR",
        metavar="DIR",
    )
    index_url: str | None = option(
        None, "package index (as for the build)", metavar="URL", group=FROM_BUILD
    )
    extra_index_url: tuple[str, ...] = option(
        (), "additional package index (repeatable; replaces the build's)", metavar="URL", repeat=True,
        group=FROM_BUILD,
    )  # fmt: skip
    torch_index_url: str | None = option(
        None, "index for torch only (env APEXKIT_TORCH_INDEX_URL)", metavar="URL", group=FROM_BUILD
    )
    wheelhouse: tuple[Path, ...] = option(
        (), "local wheels, pip --find-links (repeatable; replaces the build's)", metavar="DIR", repeat=True,
        convert=Path, group=FROM_BUILD,
    )  # fmt: skip
    offline: bool = option(
        False,
        "no package index: the wheelhouses only (default: as the build; an index URL given now turns a recorded "
        "offline off)",
        group=FROM_BUILD,
    )
    help: bool = option(
        False,
        "these options and the script's (with --interpreter PATH: the script's, run by it)",
        short="-h",
    )
    apexkit_help: bool = option(False, "these options only")


def find_target(
    dist: Path, target: str | None = None, python: str | None = None
) -> tuple[Path, dict]:
    """The manifest of the requested target, else of the newest build in `dist`."""
    found = []
    for manifest_path in dist.glob("*/manifest.json"):
        try:
            manifest = json.loads(manifest_path.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        if target and manifest_path.parent.name != target:
            continue
        if python and manifest.get("target", {}).get("python") != python:
            continue
        found.append((manifest_path.stat().st_mtime, manifest_path, manifest))
    if not found:
        wanted = f" for {target or f'Python {python}'}" if (target or python) else ""
        raise ConfigError(
            f"no built wheel{wanted} in {dist}/",
            f"build one first ({vocab.build('3.11')}), pick one with --target ID, or use --interpreter PATH",
        )
    _, path, manifest = max(found, key=lambda item: item[0])
    if len(found) > 1 and not target:
        others = sorted(p.parent.name for _, p, _ in found if p != path)
        log.info(
            f"{len(found)} builds in {dist}/: taking the newest, {path.parent.name} (--target ID for another: "
            f"{', '.join(others[:3])}{', …' if len(others) > 3 else ''})"
        )
    return path.parent, manifest


def run_venv(
    target_dir: Path,
    manifest: dict,
    cache: Path,
    index: venvs.IndexOptions | None = None,
    chart: bool = True,
) -> venvs.Venv:
    """A cached venv with torch (+ torch_npu) and the wheel, from `index` (default: the manifest's package sources);
    `chart`: with matplotlib too, where it can be had (else one line, and the venv without it)."""
    wheel = target_dir / manifest["wheel"]["file"]
    if not wheel.is_file():
        raise ConfigError(
            f"{wheel} is missing (manifest.json names it)", f"rebuild: {vocab.build('<python>')}"
        )
    if index is None:
        index = resolve_sources(manifest, target_dir, venvs.IndexOptions())
    spec = manifest["target"]
    torch_pin = manifest.get("tools", {}).get("torch") or spec["torch"]
    torch_npu = manifest.get("tools", {}).get("torch_npu") or spec.get("torch_npu")
    # The sources are part of the key: `torch==X` names a version, not a file -- indexes serve different builds under
    # one version (2.13.0 with CUDA libraries from PyPI, 2.13.0+cpu from the CPU index, a wheelhouse's own), and
    # torch's unpinned dependencies come from wherever pip looks. Only the wheel is pinned by sha256, so a venv made
    # from another index is another venv. Reuse stays where the files are the same: the key holds the URLs without
    # their credentials (a new password serves the same files), and offline only the wheelhouses (no index is read).
    # The chart library is not in the key: it is added to the same venv when the bench asks for it.
    key = hashlib.sha256(
        json.dumps(
            [
                manifest["wheel"]["sha256"],
                torch_pin,
                torch_npu,
                spec["interpreter"],
                NUMPY_PROBE.read_text(),
                sources_key(index),
            ]
        ).encode()
    ).hexdigest()[:12]
    path = cache / "run-venvs" / f"{target_dir.name}-{key}"
    log_path = cache / "run-venvs" / f"{target_dir.name}-{key}.log"
    venv = venvs.Venv(path)
    with venvs.lock(
        path
    ):  # two validate/bench runs at once: one makes the venv, the other waits and reuses it
        refused = (
            cachetrust.venv_problem(path)
            if (path / ".apexkit-complete").is_file()
            else "not made yet"
        )
        if refused not in (None, "not made yet"):
            log.warn(f"run venv {path} not reused: {refused}; making it again")
        if refused is not None:
            _make_run_venv(venv, target_dir, manifest, log_path, index, torch_pin, torch_npu)
        if chart:
            _add_chart(venv, index, log_path, torch_pin)
    return venv


def _make_run_venv(
    venv: venvs.Venv,
    target_dir: Path,
    manifest: dict,
    log_path: Path,
    index: venvs.IndexOptions,
    torch_pin: str,
    torch_npu: str | None,
) -> None:
    path, spec, wheel = venv.path, manifest["target"], target_dir / manifest["wheel"]["file"]
    cachetrust.make_dir(log_path.parent)
    with log.step(f"run venv for {target_dir.name} ({describe(index)})") as s:
        venvs.create(spec["interpreter"], path, log_path, index=index)
        venvs.pip_install(
            venv, [f"torch=={torch_pin}"], index, log_path, for_torch=True, record=False
        )
        if torch_npu:
            venvs.install_torch_npu(
                venv, torch_npu, matrix.load().npu_requires, index, log_path, record=False
            )
        _pin_numpy_1_if_needed(venv, torch_pin, index, log_path)
        venvs.pip_install(venv, [str(wheel)], index, log_path, extra=["--no-deps"], record=False)
        (path / ".apexkit-complete").write_text(manifest["wheel"]["sha256"] + "\n")
        s.note(f"{path} (log {log_path})")


def _add_chart(venv: venvs.Venv, index: venvs.IndexOptions, log_path: Path, torch_pin: str) -> None:
    """matplotlib for the bench's chart, when the venv lacks it and the sources have it; otherwise one line, and
    main() runs the bench with --no-png (results.json says "png": null)."""
    if _installed(venv, "matplotlib"):
        return
    without = (
        "the bench runs without the chart (results.json and results.md are written all the same)"
    )
    if index.offline and not _offered(index, "matplotlib"):
        log.info(
            f"  offline and no matplotlib wheel in the wheelhouse: {without}; add matplotlib and its "
            "dependencies to a --wheelhouse for the chart"
        )
        return
    try:
        venvs.pip_install(venv, list(RUN_EXTRAS), index, log_path, record=False)
    except EnvironmentSetupError as exc:
        log.info(f"  matplotlib could not be installed ({log.mask(exc.cause)}): {without}")
        return
    _pin_numpy_1_if_needed(venv, torch_pin, index, log_path)


# why the bench runs with --no-png (bench/amp_bench.py's last lines say it)
NO_CHART_VARIABLE = "APEXKIT_NO_CHART"


def no_chart_reason(index: venvs.IndexOptions) -> str:
    """Why the run venv has no matplotlib, and how to get the chart: for the bench's `report: no chart (...)`."""
    if index.offline:
        return (
            "no matplotlib in the run venv: offline, and the wheelhouse has none -- next: add matplotlib and its "
            "dependencies to the --wheelhouse (pip download -d DIR matplotlib) and run the bench again"
        )
    return (
        "no matplotlib in the run venv: it could not be installed (the run venv's log says why) -- next: make "
        "matplotlib reachable from the run venv's index or a --wheelhouse and run the bench again"
    )


def _pin_numpy_1_if_needed(
    venv: venvs.Venv, torch_pin: str, index: venvs.IndexOptions, log_path: Path
) -> None:
    """Where the venv holds NumPy (matplotlib's, torch_npu's) and this torch cannot use it: numpy<2."""
    if _installed(venv, "numpy") and not numpy_works_with_torch(venv):
        log.info(
            f"torch {torch_pin} does not work with this NumPy (built against NumPy 1.x): installing {NUMPY_1}"
        )
        venvs.pip_install(venv, [NUMPY_1], index, log_path, record=False)


def _installed(venv: venvs.Venv, name: str) -> bool:
    """Whether the venv holds the distribution `name` (by its dist-info folder; nothing is run)."""
    return any(venv.path.glob(f"lib*/python*/site-packages/{name}-*.dist-info"))


def _offered(index: venvs.IndexOptions, name: str) -> bool:
    """Whether a local place pip reads offline (a wheelhouse, pip's own find-links folders) holds a wheel of `name`."""
    places = [*index.wheelhouses, *(Path(p) for p in pipconfig.read().get_list("find-links"))]
    return any(_is_directory(p) and any(p.glob(f"{name}-*.whl")) for p in places)


# --- package sources ---------------------------------------------------------------------------------------------------


def recorded_sources(manifest: dict, where: str) -> venvs.IndexOptions:
    """The build's package sources as its manifest records them, checked as anything read from a file is: types,
    sizes, each URL through apexkit.urls, each wheelhouse an absolute path without control characters. A manifest
    from before the field records none: pip's own configuration, as the run venv had then."""
    data = manifest.get(SOURCES)
    if data is None:
        return venvs.IndexOptions()
    fix = (
        f"rebuild the target ({vocab.build('<python>')}), or pass the sources now "
        "(--index-url URL, --wheelhouse DIR, --offline)"
    )
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: {SOURCES} is not a JSON object", fix)

    def url(value: object, name: str) -> str | None:
        if value is None:
            return None
        if not isinstance(value, str) or len(value) > MAX_TEXT:
            raise ConfigError(f"{where}: {SOURCES}.{name} is not a URL", fix)
        return urls.index_url(value, f"{where} {SOURCES}.{name}")

    def texts(name: str) -> list[str]:
        value = data.get(name, [])
        if (
            not isinstance(value, list)
            or len(value) > MAX_ENTRIES
            or not all(isinstance(v, str) for v in value)
        ):
            raise ConfigError(
                f"{where}: {SOURCES}.{name} is not a list of up to {MAX_ENTRIES} strings", fix
            )
        return value

    houses = []
    for text in texts("wheelhouses"):
        if len(text) > MAX_TEXT or _CONTROL.search(text) or not os.path.isabs(text):
            raise ConfigError(
                f"{where}: {SOURCES}.wheelhouses holds an entry that is not an absolute path", fix
            )
        houses.append(Path(text))
    offline = data.get("offline", False)
    if not isinstance(offline, bool):
        raise ConfigError(f"{where}: {SOURCES}.offline is not true or false", fix)
    extras = tuple(url(u, "extra_index_urls") for u in texts("extra_index_urls"))
    return venvs.IndexOptions(
        index_url=url(data.get("index_url"), "index_url"),
        extra_index_urls=tuple(u for u in extras if u),
        torch_index_url=url(data.get("torch_index_url"), "torch_index_url"),
        wheelhouses=tuple(houses),
        offline=offline,
    )


def given_sources(args: Run) -> venvs.IndexOptions:
    """The sources options given to validate/bench now, checked as the build checks its own."""
    for w in args.wheelhouse:
        if not w.is_dir():
            raise ConfigError(
                f"--wheelhouse {w} is not a directory", "pass a directory of .whl files"
            )
    return venvs.IndexOptions(
        index_url=urls.index_url(args.index_url, "--index-url") if args.index_url else None,
        extra_index_urls=tuple(
            urls.index_url(u, "--extra-index-url") for u in args.extra_index_url
        ),
        torch_index_url=urls.index_url(args.torch_index_url, "--torch-index-url")
        if args.torch_index_url
        else None,
        wheelhouses=tuple(w.resolve() for w in args.wheelhouse),
        offline=args.offline,
    )


def merge_sources(
    recorded: venvs.IndexOptions,
    given: venvs.IndexOptions,
    env: Mapping[str, str],
    pip_config: Callable[[], Mapping[str, str]],
) -> tuple[venvs.IndexOptions, list[str]]:
    """The run venv's sources and the lines to say about them. What is given now wins, field by field: an index URL,
    the extra index URLs (all of them), the torch index (then APEXKIT_TORCH_INDEX_URL, as for the build), the
    wheelhouses (all of them); else the recorded ones. Offline when given now, or when the build was offline and
    no index URL is given now. A recorded wheelhouse that is not a directory here is left out. A recorded URL whose
    password was masked gets the credentials of a URL for the same scheme, host and port (and user) given now, in
    APEXKIT_TORCH_INDEX_URL or in pip's configuration (`pip_config`, read only then); without one it is used
    without credentials (pip's own config or ~/.netrc may still log in), saying so."""
    notes: list[str] = []
    torch_env = _configured_torch_index(env)
    asked_online = bool(given.index_url or given.extra_index_urls or given.torch_index_url)
    offline = given.offline or (recorded.offline and not asked_online)
    if recorded.offline and not offline:
        notes.append("the build was --offline; an index URL given now makes this run venv online")
    houses = given.wheelhouses or _present_wheelhouses(recorded.wheelhouses, notes)
    index_url = given.index_url or recorded.index_url
    extras = given.extra_index_urls or recorded.extra_index_urls
    torch_url = given.torch_index_url or torch_env or recorded.torch_index_url
    if not offline:  # offline, pip reads no index: nothing to log in to
        now = _credentialed(
            [given.index_url, *given.extra_index_urls, given.torch_index_url, torch_env]
        )
        configured = _pip_logins(pip_config)
        index_url = _unmasked(index_url, now, configured, notes)
        torch_url = _unmasked(torch_url, now, configured, notes)
        extras = tuple(u for u in (_unmasked(x, now, configured, notes) for x in extras) if u)
    return (
        venvs.IndexOptions(
            index_url=index_url,
            extra_index_urls=tuple(extras),
            torch_index_url=torch_url,
            wheelhouses=houses,
            offline=offline,
        ),
        notes,
    )


def _configured_torch_index(env: Mapping[str, str]) -> str | None:
    """APEXKIT_TORCH_INDEX_URL, else torch_index_url of a config file, checked; None when neither is set."""
    from apexkit import config

    torch_value = config.load(env).get("torch_index_url", env)
    if not torch_value.text:
        return None
    return urls.index_url(torch_value.text, torch_value.where or "APEXKIT_TORCH_INDEX_URL")


def _present_wheelhouses(recorded: tuple[Path, ...], notes: list[str]) -> tuple[Path, ...]:
    """The recorded wheelhouses that are directories here; a line for each one left out."""
    kept = tuple(w for w in recorded if _is_directory(w))
    notes += [
        f"the build's wheelhouse {w} is not a directory here: left out "
        "(pass --wheelhouse DIR for another)"
        for w in recorded
        if w not in kept
    ]
    return kept


def _pip_logins(pip_config: Callable[[], Mapping[str, str]]) -> Callable[[], list[str]]:
    """The index URLs of pip's configuration that carry a login, read once and only when first asked."""

    @functools.lru_cache(maxsize=None)
    def configured() -> list[str]:
        config = pipconfig.PipConfig(pip_config())
        return _credentialed([config.get("index-url"), *config.get_list("extra-index-url")])

    return configured


def _unmasked(
    url: str | None, now: list[str], configured: Callable[[], list[str]], notes: list[str]
) -> str | None:
    """A recorded URL whose secrets were masked (a login, query values): the URL given now, else in pip's
    configuration, that masks to it, or the login of one for its host; else without what was masked, saying so."""
    if url is None or not is_masked(url):
        return url
    found = _recovered(url, now) or _recovered(url, configured())
    if found and not is_masked(found):
        return found
    bare = _without_masked(found or url)
    notes.append(
        f"the build's index {url} was recorded with its secrets masked: using {log.mask(bare)} without them "
        "(pip's own config or ~/.netrc may log in); to log in, pass the URL again (--index-url, "
        "--extra-index-url or --torch-index-url)"
    )
    return bare


def resolve_sources(
    manifest: dict, target_dir: Path, given: venvs.IndexOptions
) -> venvs.IndexOptions:
    """merge_sources for a target in dist/, its lines said."""
    index, notes = merge_sources(
        recorded_sources(manifest, f"{target_dir}/manifest.json"),
        given,
        os.environ,
        pipconfig.read,
    )
    for note in notes:
        log.warn(note)
    return index


def _credentialed(candidates: list[str | None]) -> list[str]:
    """The URLs that hold a secret (a login, a query value) log.mask would hide."""
    return [c for c in candidates if c and log.mask(c) != c and not is_masked(c)]


def _recovered(masked: str, candidates: list[str]) -> str | None:
    """The candidate whose masked form is `masked` (the very URL the build recorded, ?token= and all), else
    `masked` with the login of a candidate for its host."""
    same = next((c for c in candidates if log.mask(c) == masked), None)
    return same or with_credentials_of(masked, candidates)


def _without_masked(url: str) -> str:
    """`url` without what log.mask hid: a masked login, masked query and fragment values."""
    info, hostport = _userinfo(url)
    parts = urllib.parse.urlsplit(url)
    return urllib.parse.urlunsplit(
        parts._replace(
            netloc=hostport if _masked_login(info) else parts.netloc,
            query="&".join(p for p in parts.query.split("&") if not p.endswith("***")),
            fragment="" if "***" in parts.fragment else parts.fragment,
        )
    )


def _userinfo(url: str) -> tuple[str, str]:
    """(userinfo, the rest of the authority) of a URL apexkit.urls accepted."""
    netloc = urllib.parse.urlsplit(url).netloc
    info, _, hostport = netloc.rpartition("@")
    return info, hostport


def is_masked(url: str) -> bool:
    """Whether a URL holds log.mask's stand-in (user:***@, ***@, ?token=***, #***) rather than a secret."""
    parts = urllib.parse.urlsplit(url)
    return _masked_login(_userinfo(url)[0]) or "***" in parts.query + parts.fragment


def _masked_login(info: str) -> bool:
    return info == "***" or info.endswith(":***")


def without_credentials(url: str | None) -> str | None:
    if not url or not urls.has_userinfo(url):
        return url
    return urllib.parse.urlunsplit(urllib.parse.urlsplit(url)._replace(netloc=_userinfo(url)[1]))


def _place(url: str) -> tuple[str, str, int | None]:
    parts = urllib.parse.urlsplit(url)
    scheme = parts.scheme.lower()
    return (
        scheme,
        (parts.hostname or "").lower(),
        parts.port or {"http": 80, "https": 443}.get(scheme),
    )


def with_credentials_of(masked: str, candidates: list[str]) -> str | None:
    """`masked` with the credentials of the first candidate for the same scheme, host and port (and the same user,
    where the masked URL names one); None when there is none."""
    info, hostport = _userinfo(masked)
    user = info.rpartition(":")[0] if info != "***" else None
    for candidate in candidates:
        try:  # pip's configuration may hold anything
            same = _place(candidate) == _place(masked)
            cand_info = _userinfo(candidate)[0]
        except ValueError:  # a port that is not a number, an unbalanced '[': not this host
            continue
        if same and cand_info and (user is None or cand_info.partition(":")[0] == user):
            parts = urllib.parse.urlsplit(masked)
            return urllib.parse.urlunsplit(parts._replace(netloc=f"{cand_info}@{hostport}"))
    return None


def sources_key(index: venvs.IndexOptions) -> dict:
    """The sources as the run venv's cache key names them: without credentials; offline, only the wheelhouses."""
    houses = [str(w) for w in index.wheelhouses]
    if index.offline:
        return {"offline": True, "wheelhouses": houses}
    return {
        "index": without_credentials(index.index_url),
        "extra": [without_credentials(u) for u in index.extra_index_urls],
        "torch_index": without_credentials(index.torch_index_url),
        "wheelhouses": houses,
    }


def describe(index: venvs.IndexOptions) -> str:
    """The sources in a few words, for the run venv's step line (no credentials, query values masked)."""
    houses = (
        f"wheelhouse {', '.join(str(w) for w in index.wheelhouses)}" if index.wheelhouses else ""
    )
    if index.offline:
        return "offline" + (f", {houses}" if houses else "")
    named = [
        f"index {without_credentials(index.index_url)}" if index.index_url else "",
        f"torch from {without_credentials(index.torch_index_url)}" if index.torch_index_url else "",
        f"{len(index.extra_index_urls)} extra index" if index.extra_index_urls else "",
        houses,
    ]
    return log.mask(", ".join(n for n in named if n)) or "pip's configuration"  # a ?token= too


def _is_directory(path: Path) -> bool:
    """A real directory (a link is not followed: the path came from a file)."""
    try:
        return stat.S_ISDIR(path.lstat().st_mode)
    except OSError:
        return False


def numpy_works_with_torch(venv: venvs.Venv) -> bool:
    """Whether torch imports cleanly next to the venv's NumPy and can use it."""
    argv = [str(venv.python), str(NUMPY_PROBE)]
    log.echo_command(argv)
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    return (
        proc.returncode == 0
        and "compiled using NumPy 1.x" not in proc.stderr
        and "Failed to initialize NumPy" not in proc.stderr
    )


def parse(argv: list[str], prog: str, script: str = "bench") -> tuple[Run, list[str]]:
    p = declare.parser(
        COMMAND, prog
    )  # apexkit's own options; the others go to the script (--help lists both)
    given, rest = p.parse_known_args(argv)
    args = declare.make(COMMAND, vars(given))
    if args.help and args.in_env:  # the script's own help, from the interpreter that runs it
        rest.append("--help")
    elif args.help or args.apexkit_help:
        p.print_help()
        if args.help:
            script_help(script, prog)
        raise SystemExit(0)
    return args, rest + envvars.words(os.environ, "APEXKIT_BENCH_ARGS")


def script_help(script: str, prog: str) -> None:
    """The options apexkit passes to the script: its --help run by this Python, with no wheel, venv or dist/ (a
    script that needs torch to start says how to list them instead)."""
    path = SCRIPTS[script]
    print(f"\noptions of {path.name} (passed through):")
    try:
        done = subprocess.run(
            [sys.executable, str(path), "--help"],
            capture_output=True,
            text=True,
            timeout=30,
            cwd=str(path.parent),
        )
        text = done.stdout if done.returncode == 0 else ""
    except (OSError, subprocess.TimeoutExpired):
        text = ""
    if text:
        lines = text.splitlines()
        start = next((i for i, line in enumerate(lines) if line.strip().endswith(":") and i), 0)
        print("\n".join(lines[start:]))
    else:
        print(
            f"  {path.name} needs torch to list them: {prog} --interpreter PATH --help, with PATH the python of a "
            "venv that has torch (docs/bench.md lists them too)"
        )


def contract_line(folder: Path) -> str:
    """One line for a validate/bench report: the contract dist/<target>/contracts.json says passed, or why none."""
    path = folder / CONTRACT_FILE
    try:
        data = untrusted.read_json_object(path, None, 8 << 20)
    except untrusted.Untrusted as exc:
        missing = isinstance(exc, untrusted.Refused) and exc.kind == "os"
        # the target id names the folder; anything else (a renamed folder) is not typed into a shell hint
        tid = folder.name if re.fullmatch(r"py3\.\d+-[A-Za-z0-9._+-]{1,200}", folder.name) else "ID"
        why = "" if missing else f" ({exc})"
        return f"contract: not checked{why} -- nox -s contracts -- --target {tid}"
    npu, ref, ok, when = (data.get(k) for k in ("torch_npu", "apex_ref", "ok", "checked"))
    if not isinstance(npu, str) or not isinstance(ref, str) or not isinstance(ok, bool):
        return f"contract: not checked ({CONTRACT_FILE} is not a contracts result)"
    when = when if isinstance(when, str) else "?"
    return (
        f"contract: torch_npu {untrusted.shown(npu)[1:-1]} + apex {untrusted.shown(ref)[1:-1]} "
        f"{'passed' if ok else 'DRIFTED'} (nox -s contracts, {untrusted.shown(when)[1:-1]})"
    )


def main(
    script: str, argv: list[str], prog: str, built: Callable[[], Path | None] | None = None
) -> int:
    """`built`: the dist/<target>/ a build of the same nox invocation wrote, asked once --help is done (apexkit.
    noxrun); run unless --target, --python or --interpreter names another."""
    args, rest = parse(argv, prog, script)
    env = dict(os.environ)
    made = built() if built else None  # a failed build stops here, whatever is asked
    if made and not (args.target or args.python or args.in_env):
        log.info(f"{script}: the wheel this nox invocation built, {made}")
    else:
        made = None
    if args.in_env:
        python, label = args.in_env, "in-env"
    else:
        dist, target = (made.parent, made.name) if made else (Path(args.dist), args.target)
        target_dir, manifest = find_target(dist, target, args.python)
        index = resolve_sources(manifest, target_dir, given_sources(args))
        chart = script == "bench" and "--no-png" not in rest
        venv = run_venv(target_dir, manifest, cachetrust.root(), index=index, chart=chart)
        if chart and not _installed(venv, "matplotlib"):
            # run_venv said why in one line; the bench's last lines say it again where the chart would be named
            rest.append("--no-png")
            env[NO_CHART_VARIABLE] = no_chart_reason(index)
        python, label = str(venv.python), target_dir.name
        # the bench's report and chart name the wheel (its target id, its sha256)
        env["APEXKIT_APEX_WHEEL_SHA256"] = manifest["wheel"]["sha256"]
        env["APEXKIT_TARGET_ID"] = target_dir.name
        # which API contract (nox -s contracts) this wheel's torch_npu release and apex ref passed: one line, and
        # validate's table gets it as a row
        env["APEXKIT_CONTRACT"] = contract_line(target_dir)
        log.info(env["APEXKIT_CONTRACT"])
    reports = Path(args.reports) / label
    if (
        script == "bench"
        and not any(a == "--out" or a.startswith("--out=") for a in rest)
        and "--compare" not in rest
    ):
        rest += ["--out", str(reports / "bench")]
    if script == "validate" and not any(a == "--json" or a.startswith("--json=") for a in rest):
        rest += ["--json", str(reports / "validate.json")]
    argv_run = [python, str(SCRIPTS[script]), *rest]
    log.echo_command(argv_run)
    code = subprocess.call(argv_run, env=env)
    if code != 0:
        what = (
            "the environment is not ready (see the table above)"
            if script == "validate"
            else f"{SCRIPTS[script].name} exited with {code}"
        )
        raise BenchError(what, f"fix what the report says, then run {vocab.command(script)} again")
    return 0


# validate and bench: main(script, argv, prog) parses `Run`; the options apexkit does not know go to the script
COMMAND = declare.Command("validate/bench", Run, main)
