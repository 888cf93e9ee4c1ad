"""`apexkit up` (also `invoke up`): one node from bare to validated -- optional proxy check, doctor, install (an index
hit or a build), validate, optional bench -- and one report (JSON + Markdown) with each stage's status, time, log and
first failure with its fix.

    apexkit up --venv ~/train-venv --index https://pypi.example/apex/simple/ [--bench] [--proxy-check] [--dry-run]

Each stage is apexkit's own command given its options as data (`Stage.options`), never a command line put together
again, run as a child process; its output goes whole to its own log and the terminal gets one line per stage.
Per stage, and why not in this process (up is a library unit: the command edge, apexkit.commands, runs commands):
  - proxy: a child with a JSON options file -- it talks to Docker and the network and prints through apexkit's
    console and spinners; in-process, catching that whole in its log means swapping up's console and stdout;
  - doctor: a child with a JSON options file -- the same output capture, and a probe that hangs or dies (a broken
    interpreter, a C extension) takes only its row;
  - install: a child with a JSON options file -- it may build for minutes, its pip and compilers write to the
    process's own output, it tightens the umask and holds the venv's lock; a killed build fails its row, not up;
  - validate, bench: a child with their own flags (`venvrun_argv`, the one command line up writes: venvrun is not a
    declared command yet) -- it runs the venv's own interpreter, where torch is.
The JSON options file is `<report>/logs/<stage>.options.json`, {"command": NAME, "options": {...}}; the edge's
`python -m apexkit.commands FILE` (commands.run_options_file) runs that declared command with them. A child answers
with its $APEXKIT_STATUS_FILE (exit code and one-line error, apexkit.statusfile) and its --json output or report
(validate.json), each read as untrusted; one that recorded nothing (killed) is "exit N", with its log as the fix. A
stage that fails or dies fails its row, not the report: the next stages are "skipped: <stage> failed".

Re-running skips what is already done: the state (<report>/state.json, in a report directory that passes the
cache's trust rule, `report_problem`) keeps, per stage, a digest of the inputs of its last successful run -- the
venv, this node and the venv directory's inode (`node_of`), its Python, its torch and torch_npu, the installed apex
(the digest of its RECORD: which files of which wheel) and the stage's own options. A stage whose digest is
unchanged is "done (from <time>)" and not run again, once what it left is seen to be still there (`undone`);
`--force` runs every stage. The state is read back as untrusted input: a corrupt one is ignored with one line and
every stage runs. Each stage's child runs in a process group of its own that up never leaves behind (`_call`).
"""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import json
import os
import re
import shlex
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TextIO

from apexkit import cachetrust, config, envvars, fsedit, locks, log, paths, statusfile, untrusted
from apexkit.errors import ConfigError
from apexkit.plan import target as targets
from apexkit.proc import group_child, stops_like_ctrl_c

STAGES = ("proxy", "doctor", "install", "validate", "bench")
# the stages whose child takes its own flags (venvrun is not a declared command yet); the others: a JSON options file
FLAGS = ("validate", "bench")
OK, FAILED, SKIPPED, DONE = "ok", "failed", "skipped", "done"
FORMAT = "apexkit-up/2"  # /2: a row names its command and options, not a command line
STATE_FORMAT = "apexkit-up-state/1"
STATE_FILE = "state.json"
STATE_MAX = 256 * 1024
OUT_MAX = 4 << 20  # a child's --json output or report read back
TEXT_MAX = 400  # a cause, fix or detail taken from a stage: one line, at most this long
DEVICES = ("npu", "cuda", "cpu")
# the device a venv's torch finds (npu, cuda, else cpu) and why, for --device auto (pick_device)
DEVICE_PROBE = paths.PROBES / "found_device.py"
PROXY_VARIABLES = ("http_proxy", "https_proxy", "no_proxy", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY")
_SHA256 = re.compile(r"[0-9a-f]{64}")
# The venv's facts, read by its own Python (3.8+): prefix, version, and torch / torch_npu / apex from the metadata
# (torch is not imported: fast, and a torch_npu without CANN does not break the probe). apex's RECORD digest names the
# wheel that is installed (its files' hashes), whichever installer put it there.
# It runs with -S (no .pth line, no sitecustomize of the venv runs) and adds the site dirs as site.py would, with
# install's probe's own code (bench/probes/target_env.py's _site_off).
_SITE_OFF = "import runpy, sys\nrunpy.run_path(sys.argv[1])['_site_off']()"
_PROBE = """
import hashlib, json, platform, sys
from importlib import metadata
out = {"prefix": sys.prefix, "python": platform.python_version()}
for name in ("torch", "torch_npu", "apex"):
    try:
        d = metadata.distribution(name)
    except metadata.PackageNotFoundError:
        out[name] = None
        continue
    rec = d.read_text("RECORD") or ""
    out[name] = {"version": d.version, "record": hashlib.sha256(rec.encode()).hexdigest()}
print(json.dumps(out))
"""


# --- what to run: options, target, plan (pure) ------------------------------------------------------------------


@dataclass(frozen=True)
class Target:
    """The venv `up` works on: its interpreter, how the stages are told about it, and the report's name for it."""

    python: Path
    given: tuple[
        str, str
    ]  # ("venv", DIR) or ("interpreter", PATH): the option doctor and install get
    name: str  # reports/up/<name>/


@dataclass(frozen=True)
class Options:
    target: Target
    report: Path
    indexes: tuple[str, ...] = ()
    no_build: bool = False
    build_options: str = ""  # install's --build-options (up's --offline is its first word)
    proxy_check: bool = False
    bench: bool = False
    bench_args: tuple[str, ...] = ()
    trusted_keys: tuple[str, ...] = ()  # install's --trusted-key files (absolute)
    # the key ids install verifies against, from whichever source (flag, environment, user config): in its inputs
    trusted_keyids: tuple[str, ...] = ()
    device: str = "auto"  # the one the venv's torch finds, picked as up runs (pick_device)
    force: bool = False
    dry_run: bool = False
    as_json: bool = False


@dataclass(frozen=True)
class Stage:
    name: str
    command: str  # the apexkit command it calls
    options: Mapping[
        str, Any
    ]  # the options up sets (the others: the command's defaults); plain JSON values
    wanted: bool = True
    why_not: str = ""  # why a stage that is not wanted is skipped

    def shown(self) -> str:
        return log.mask(log.sanitise(f"{self.command} {json.dumps(dict(self.options))}"))


def _safe_name(text: str) -> str:
    name = re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("._") or "venv"
    return name[:80]


def resolve_target(venv: str | None, interpreter: str | None, environ: Mapping[str, str]) -> Target:
    """--venv DIR, --interpreter PATH, else the active venv ($VIRTUAL_ENV)."""
    if venv and interpreter:
        raise ConfigError("--venv and --interpreter both given", "name the training venv one way")
    if interpreter:
        path = Path(interpreter).absolute()
        if not path.is_file():
            raise ConfigError(
                f"--interpreter {interpreter}: no such file",
                "pass the training venv's python, e.g. --interpreter ~/venv/bin/python",
            )
        home = path.parent.parent if path.parent.name == "bin" else path.parent
        return Target(path, ("interpreter", str(path)), _safe_name(home.name))
    flag = "--venv"
    if not venv:
        venv = environ.get("VIRTUAL_ENV")
        if not venv:
            raise ConfigError(
                "no venv given and none active ($VIRTUAL_ENV is unset)",
                "pass --venv DIR or --interpreter PATH, or activate the training venv",
            )
        flag = "$VIRTUAL_ENV"
    root = Path(venv).absolute()
    python = root / "bin" / "python"
    if not python.is_file():
        raise ConfigError(
            f"{flag} {venv}: {python} does not exist",
            "create the venv first (python3 -m venv DIR, then install torch into it), or pass --interpreter PATH",
        )
    return Target(python, ("venv", str(root)), _safe_name(root.name))


def _check_index(url: str) -> str:
    if any(c.isspace() for c in url) or not url:
        raise ConfigError(f"--index {untrusted.shown(url)} is not a URL", "pass a URL or a path")
    if log.mask(url) != url:
        raise ConfigError(
            f"--index {log.mask(url)} holds a password, and up writes it into install's options and its report",
            "set APEXKIT_INDEX instead (it reaches install through the environment) or put the credentials "
            "in ~/.netrc",
        )
    return url


def make_options(
    venv: str | None = None,
    interpreter: str | None = None,
    index: Sequence[str] | None = (),
    no_build: bool = False,
    proxy_check: bool = False,
    bench: bool = False,
    bench_args: str | None = None,
    device: str = "auto",
    report: str | None = None,
    force: bool = False,
    dry_run: bool = False,
    as_json: bool = False,
    environ: Mapping[str, str] | None = None,
    offline: bool = False,
    build_options: str | None = "",
    trusted_key: Sequence[str] | None = (),
) -> Options:
    environ = os.environ if environ is None else environ
    if device not in (*DEVICES, "auto"):
        raise ConfigError(
            f"--device {untrusted.shown(device)} is not a device",
            "choose npu, cuda or cpu, or leave --device out (the one the venv's torch finds)",
        )
    extra = tuple(envvars.split_words(bench_args or "", "--bench-args", "--scale 0.05"))
    build = " ".join(w for w in ("--offline" if offline else "", build_options or "") if w)
    envvars.split_words(build, "--build-options")  # bad quotes: one line now, not in install's log
    target = resolve_target(venv, interpreter, environ)
    where = Path(report) if report else paths.reports_dir(environ) / "up" / target.name
    keys = tuple(os.path.abspath(k) for k in trusted_key or ())
    # read once here: a key that cannot be used stops up before any stage
    from apexkit.index import signing

    keyids = tuple(sorted(signing.trusted_keys(keys, environ)))
    return Options(
        target=target,
        report=where.absolute(),
        indexes=tuple(_check_index(u) for u in index or ()),
        no_build=no_build,
        build_options=build,
        proxy_check=proxy_check,
        bench=bench or bool(extra),
        bench_args=extra,
        trusted_keys=keys,
        trusted_keyids=keyids,
        device=device,
        force=force,
        dry_run=dry_run,
        as_json=as_json,
    )


def plan(opts: Options) -> list[Stage]:
    """The five stages in order, each with its command and options (pure: nothing is looked at)."""
    target = dict([opts.target.given])
    run = {"interpreter": str(opts.target.python), "device": opts.device}
    install = {**target, "index": list(opts.indexes), "no_build": opts.no_build, "as_json": True}
    if opts.build_options:
        install["build_options"] = opts.build_options
    if opts.trusted_keys:
        install["trusted_key"] = list(opts.trusted_keys)
    bench = {**run, "out": str(opts.report / "bench"), "args": list(opts.bench_args)}
    return [
        Stage(
            "proxy",
            "proxy.check",
            {"as_json": True},
            opts.proxy_check,
            "not asked for (--proxy-check)",
        ),
        Stage("doctor", "doctor", {**target, "as_json": True}),
        Stage("install", "install", install),
        Stage("validate", "validate", {**run, "json": str(opts.report / "validate.json")}),
        Stage("bench", "bench", bench, opts.bench, "not asked for (--bench)"),
    ]


def venvrun_argv(stage: Stage) -> list[str]:
    """validate's and bench's child: `apexkit validate|bench` with their own flags (venvrun is not declared yet)."""
    o = stage.options
    argv = [
        sys.executable,
        "-m",
        "apexkit",
        stage.command,
        "--interpreter",
        o["interpreter"],
        "--device",
        o["device"],
    ]
    return argv + (
        ["--json", o["json"]] if stage.command == "validate" else ["--out", o["out"], *o["args"]]
    )


# --- the venv's facts and each stage's inputs ------------------------------------------------------------------


@dataclass(frozen=True)
class Facts:
    prefix: str
    python: str
    torch: str | None = None
    torch_npu: str | None = None
    apex: str | None = None  # the installed apex's version
    apex_record: str | None = None  # the digest of its RECORD: which wheel is installed
    node: str = ""  # this host and the venv directory itself (`node_of`)


def node_of(prefix: str) -> str:
    """The host, and the venv directory's device, inode and owner: a state copied from another node, or made for
    another venv that had the same path or name, never matches."""
    try:
        st = os.stat(prefix)
    except OSError as exc:
        return f"{socket.gethostname()} {prefix}: {exc.strerror}"
    return f"{socket.gethostname()} {st.st_dev}:{st.st_ino} uid {st.st_uid}"


def _text(value: object, limit: int = 200) -> str | None:
    return log.sanitise(value)[:limit] if isinstance(value, str) else None


def parse_facts(data: object) -> Facts:
    """The probe's JSON, untrusted: types checked, strings bounded."""
    if not isinstance(data, dict) or not isinstance(data.get("prefix"), str):
        raise ValueError("not the probe's object")
    dists: dict[str, tuple[str | None, str | None]] = {}
    for name in ("torch", "torch_npu", "apex"):
        entry = data.get(name)
        if isinstance(entry, dict):
            record = entry.get("record")
            dists[name] = (
                _text(entry.get("version"), 80),
                record if isinstance(record, str) and _SHA256.fullmatch(record) else None,
            )
        else:
            dists[name] = (None, None)
    return Facts(
        prefix=_text(data["prefix"], 4096) or "",
        python=_text(data.get("python"), 40) or "?",
        torch=dists["torch"][0],
        torch_npu=dists["torch_npu"][0],
        apex=dists["apex"][0],
        apex_record=dists["apex"][1],
    )


def probe(python: Path) -> Facts:
    """The venv's facts, from its own interpreter."""
    try:
        proc = subprocess.run(
            [
                str(python),
                "-I",
                "-S",
                "-c",
                _SITE_OFF + _PROBE,
                str(paths.PROBES / "target_env.py"),
            ],
            capture_output=True,
            timeout=120,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ConfigError(
            f"{python} does not run ({exc.__class__.__name__}: {exc})",
            "pass the training venv (--venv DIR) or a working --interpreter PATH",
        ) from None
    try:
        if proc.returncode != 0 or len(proc.stdout) > OUT_MAX:
            raise ValueError
        facts = parse_facts(json.loads(proc.stdout.decode().strip().splitlines()[-1]))
    except (ValueError, IndexError, UnicodeDecodeError):
        last = (proc.stderr.decode(errors="replace").strip().splitlines() or ["no output"])[-1]
        raise ConfigError(
            f"{python} cannot be probed (exit {proc.returncode}: {log.sanitise(last)[:TEXT_MAX]})",
            "check that it is Python 3.8 or newer and runs: "
            + shlex.join([str(python), "--version"]),
        ) from None
    return replace(facts, node=node_of(facts.prefix))


def pick_device(python: Path | str) -> str:
    """The device the interpreter's torch finds (bench/probes/found_device.py), said in one line with why."""
    argv = [str(python), str(DEVICE_PROBE)]
    log.echo_command(argv)
    try:
        proc = subprocess.run(
            argv, capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL
        )
        data = json.loads(proc.stdout.strip().splitlines()[-1])
        device, why = data["device"], log.sanitise(data["why"])[:400]
        if device not in DEVICES:
            raise ValueError(device)
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError, KeyError, TypeError) as exc:
        raise ConfigError(
            f"cannot tell which device {python} finds ({exc.__class__.__name__})",
            "pass --device npu, cuda or cpu",
        ) from None
    log.info(f"device {device}: {why} (--device npu|cuda|cpu forces one)")
    return device


def stage_inputs(
    name: str, facts: Facts, opts: Options, environ: Mapping[str, str]
) -> dict[str, Any]:
    """What a stage's result depends on: the same inputs, the same result."""
    inputs: dict[str, Any] = {"venv": facts.prefix, "node": facts.node, "python": facts.python}
    if name == "proxy":
        return {
            **inputs,
            "proxy": {k: log.mask(environ[k]) for k in PROXY_VARIABLES if k in environ},
        }
    inputs.update(torch=facts.torch, torch_npu=facts.torch_npu)
    if name == "doctor":
        return inputs
    inputs["apex"] = facts.apex_record  # the installed wheel
    if name == "install":
        indexes = list(opts.indexes) or [log.mask(environ.get("APEXKIT_INDEX", ""))]
        inputs.update(indexes=indexes, no_build=opts.no_build)
        # a wheel installed unverified, or verified by a key since revoked, is not done
        if opts.trusted_keyids:
            inputs["trusted_keys"] = list(opts.trusted_keyids)
        return inputs
    inputs["device"] = opts.device
    if name == "bench":
        inputs["bench_args"] = list(opts.bench_args)
    return inputs


def digest(inputs: Mapping[str, Any]) -> str:
    return hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()


# --- the state: per stage, the digest of its last successful run (untrusted on read) -------------------------------


@dataclass(frozen=True)
class Done:
    key: str
    finished: str  # ISO time, UTC
    seconds: float
    result: dict = field(default_factory=dict)


def _iso(value: object) -> str | None:
    if not isinstance(value, str) or len(value) > 40:
        return None
    try:
        datetime.datetime.fromisoformat(value)
    except ValueError:
        return None
    return value


def _result(value: object) -> dict[str, str]:
    """A stage's result kept in the state or taken from a child: flat strings only, bounded and sanitised."""
    if not isinstance(value, dict):
        return {}
    return {
        k: log.mask(log.sanitise(v))[:TEXT_MAX]
        for k, v in list(value.items())[:20]
        if isinstance(k, str) and re.fullmatch(r"[a-z][a-z0-9_]{0,31}", k) and isinstance(v, str)
    }


def parse_state(data: object) -> dict[str, Done]:
    """The state file's object: ValueError naming what is wrong when it is not one apexkit up wrote."""
    if not isinstance(data, dict) or data.get("format") != STATE_FORMAT:
        raise ValueError(f"its format is not {STATE_FORMAT}")
    stages = data.get("stages")
    if not isinstance(stages, dict):
        raise ValueError("its stages are not an object")
    out = {}
    for name, entry in stages.items():
        if name not in STAGES:
            continue
        if not isinstance(entry, dict):
            raise ValueError(f"stage {untrusted.shown(name)} is not an object")
        key, finished, seconds = entry.get("key"), _iso(entry.get("finished")), entry.get("seconds")
        if not isinstance(key, str) or not _SHA256.fullmatch(key):
            raise ValueError(f"stage {name}: its key is not a sha256")
        if finished is None:
            raise ValueError(f"stage {name}: its time is not an ISO time")
        if (
            not isinstance(seconds, (int, float))
            or isinstance(seconds, bool)
            or not 0 <= seconds < 1e7
        ):
            raise ValueError(f"stage {name}: its seconds are not a duration")
        out[name] = Done(key, finished, float(seconds), _result(entry.get("result")))
    return out


def load_state(report: Path) -> dict[str, Done]:
    """The state beside the report; {} when there is none or it is not usable (one line says why)."""
    path = report / STATE_FILE
    if not os.path.lexists(path):
        return {}
    try:
        return parse_state(untrusted.read_json_object(path, None, STATE_MAX, STATE_FILE))
    except (untrusted.Untrusted, ValueError) as exc:
        log.warn(f"ignoring {path}: {exc} (every stage runs again)")
        return {}


def state_bytes(state: Mapping[str, Done]) -> bytes:
    stages = {
        name: {"key": d.key, "finished": d.finished, "seconds": d.seconds, "result": d.result}
        for name, d in state.items()
    }
    return (json.dumps({"format": STATE_FORMAT, "stages": stages}, indent=1) + "\n").encode()


def previous_run(name: str, key: str, state: Mapping[str, Done], force: bool) -> Done | None:
    """The earlier successful run with the same inputs, unless --force."""
    done = state.get(name)
    return done if done is not None and done.key == key and not force else None


def undone(name: str, facts: Facts, opts: Options, report: Path) -> str | None:
    """Why a stage the state says is done must run again all the same (None: what it left is still there), looked at
    now, not taken from the state: install -- apex is installed in the venv (its RECORD digest, probed now, is in
    the key); validate -- <report>/validate.json says ready for this interpreter and device; doctor, proxy -- their
    --json output is there and names no failure; bench -- its results are there. (`report_problem` has checked that
    these files are ours: not links, not another user's.)"""
    if name == "install":
        return None if facts.apex_record else "apex is not installed in the venv now"
    if name == "bench":
        return None if (report / "bench").is_dir() else f"{report / 'bench'} is gone"
    if name == "validate":
        path, data = report / "validate.json", _read_json(report / "validate.json")
        said = [data.get(k) for k in ("ok", "python", "device")] if isinstance(data, dict) else []
        ready = said == [True, str(opts.target.python), opts.device]
        return None if ready else f"{path} does not say ready for this venv"
    path = report / "logs" / f"{name}.json"
    data = _read_json(path)
    return (
        None
        if isinstance(data, list) and not failure_from_rows(data)
        else f"{path} is missing or names a failure"
    )


# --- one stage's row ------------------------------------------------------------------------------------------------


@dataclass
class Row:
    name: str
    status: str  # ok | failed | skipped | done
    detail: str = ""
    seconds: float = 0.0
    log: str | None = None
    command: str = ""
    options: Mapping[str, Any] = field(default_factory=dict)
    exit_code: int | None = None
    cause: str | None = None
    fix: str | None = None
    finished: str | None = None
    result: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        return {
            "name": self.name,
            "status": self.status,
            "detail": self.detail,
            "seconds": round(self.seconds, 3),
            "log": self.log,
            "command": self.command,
            "options": dict(self.options),
            "exit_code": self.exit_code,
            "first_failure": {"cause": self.cause, "fix": self.fix} if self.cause else None,
            "finished": self.finished,
            "result": self.result,
        }


def _line(text: object) -> str:
    return " ".join(log.mask(log.sanitise(str(text))).split())[:TEXT_MAX]


def split_error(line: str) -> tuple[str, str]:
    """`error: <cause> -- next: <fix>` (apexkit's one line) -> (cause, fix)."""
    text = re.sub(r"^\s*error:\s*", "", line)
    cause, _, fix = text.partition(" -- next: ")
    return _line(cause), _line(fix)


def failure_from_rows(data: object) -> tuple[str, str] | None:
    """doctor / proxy.check --json: the first row that failed -> (cause, fix)."""
    if not isinstance(data, list):
        return None
    for row in data:
        if isinstance(row, dict) and row.get("status") == "fail":
            detail = str(row.get("detail") or "").splitlines()
            what = f"{row.get('area', '')} {row.get('name', '')}".strip()
            return _line(f"{what}: {detail[0] if detail else 'failed'}"), _line(
                row.get("fix") or ""
            )
    return None


def rows_summary(data: object) -> str:
    if not isinstance(data, list):
        return ""
    counts: dict[str, int] = {}
    for row in data:
        if isinstance(row, dict) and isinstance(row.get("status"), str):
            counts[row["status"]] = counts.get(row["status"], 0) + 1
    return ", ".join(
        f"{n} {s}" for s, n in sorted(counts.items()) if s in ("ok", "warn", "fail", "skip")
    )


def failure_from_validate(data: object) -> tuple[str, str] | None:
    """bench/validate_env.py's report: the first required check that is not ok -> (cause, fix)."""
    if not isinstance(data, dict) or not isinstance(data.get("checks"), list):
        return None
    for check in data["checks"]:
        if isinstance(check, dict) and check.get("required") and check.get("status") != "ok":
            return (
                _line(f"{check.get('check', '?')}: {check.get('detail', '')}"),
                _line(check.get("hint") or "fix what the validation report says"),
            )
    return None


def install_result(data: object) -> dict[str, str]:
    """`apexkit install --json`: the wheel, its sha256, where it came from (untrusted: checked, bounded)."""
    result = _result(data)
    if "sha256" in result and not _SHA256.fullmatch(result["sha256"]):
        del result["sha256"]
    return {k: result[k] for k in ("status", "wheel", "sha256", "source") if k in result}


def _read_json(path: Path) -> object:
    """A child's JSON output or report, untrusted: None when it is not one."""
    try:
        return json.loads(untrusted.read_regular(path, None, OUT_MAX).decode())
    except (untrusted.Untrusted, ValueError):
        return None


def child_env(environ: Mapping[str, str], status_file: Path) -> dict[str, str]:
    """A child's environment: this apexkit first on the path, its own status file, and no APEXKIT_BENCH_ARGS
    (up passes --bench-args to the bench stage only; the variable would reach validate too)."""
    env = {k: v for k, v in environ.items() if k != "APEXKIT_BENCH_ARGS"}
    here = str(paths.PACKAGE.parent)
    env["PYTHONPATH"] = os.pathsep.join(
        [here, *([environ["PYTHONPATH"]] if environ.get("PYTHONPATH") else [])]
    )
    env[statusfile.VARIABLE] = str(status_file)
    return env


def _open_log(path: Path) -> TextIO:
    """A stage's log, written afresh: a regular file of ours (a link or FIFO planted there is refused, not followed)."""
    try:
        return untrusted.open_log(path)
    except untrusted.Refused as exc:
        raise ConfigError(
            f"cannot write the stage log {exc}",
            f"remove it, or pass another --report DIR than {path.parent.parent}",
        ) from None


def run_stage(
    stage: Stage, logs: Path, report: Path, environ: Mapping[str, str], extra_env: Mapping[str, str]
) -> Row:
    """Run one stage, its output in logs/<stage>.log, and make its row."""
    log_path, status_path = logs / f"{stage.name}.log", logs / f"{stage.name}.status.json"
    stale = [logs / f"{stage.name}.json", status_path] + (
        [report / "validate.json"] if stage.name == "validate" else []
    )
    for path in stale:  # what an earlier run left is never read as this run's
        path.unlink(missing_ok=True)
    start = time.monotonic()
    with _open_log(log_path) as fh:
        fh.write(f"+ {stage.shown()}\n")
        code, out = _child(stage, fh, logs, {**child_env(environ, status_path), **extra_env})
    row = Row(
        stage.name,
        OK if code == 0 else FAILED,
        seconds=time.monotonic() - start,
        log=str(log_path),
        command=stage.command,
        options=stage.options,
        exit_code=code,
        finished=now(),
    )
    found = _STAGE_READERS.get(stage.name, _bench_read)(row, out, report)
    if code == 0:
        return row
    error = _status_error(status_path)
    row.cause, fix = found or (split_error(error) if error else (f"exit {code}", ""))
    row.fix = fix or f"read {log_path}"
    row.detail = row.cause
    return row


GRACE = 30.0  # seconds a stopped stage's children have to finish as after Ctrl-C (install takes back what it began)


def _call(argv: Sequence[str], **kwargs: Any) -> int:
    """Run a stage's child in a process group of its own and leave nothing of it behind (group_child: SIGINT,
    then SIGKILL after GRACE seconds; SIGINT from the kernel when up is killed outright)."""
    with group_child(argv, grace=GRACE, **kwargs) as child:
        return child.wait()


def _child(stage: Stage, fh: TextIO, logs: Path, env: Mapping[str, str]) -> tuple[int, object]:
    """The stage's child, its stderr (and validate's or bench's stdout) in its log: (its exit code, 127 when it could
    not be started; its --json output, None for validate and bench)."""
    options, out_path = logs / f"{stage.name}.options.json", logs / f"{stage.name}.json"
    if stage.name in FLAGS:
        argv = venvrun_argv(stage)
    else:
        data = {"command": stage.command, "options": dict(stage.options)}
        fsedit.atomic_write(options, (json.dumps(data, indent=1) + "\n").encode(), 0o600)
        argv = [sys.executable, "-m", "apexkit.commands", str(options)]
    with contextlib.nullcontext(fh) if stage.name in FLAGS else _open_log(out_path) as out:
        try:
            code = _call(argv, stdout=out, stderr=fh, stdin=subprocess.DEVNULL, env=env)
        except OSError as exc:
            fh.write(f"error: cannot run {argv[0]}: {exc.strerror or exc}\n")
            return 127, None
    return code, None if stage.name in FLAGS else _read_json(out_path)


# each stage's output read into its row: -> (cause, fix) of the failure it names, or None
def _rows_read(row: Row, data: Any, report: Path) -> tuple[str, str] | None:
    row.detail = rows_summary(data)
    return failure_from_rows(data)


def _install_read(row: Row, data: Any, report: Path) -> None:
    row.result = install_result(data)
    row.detail = install_detail(row.result)


# install's words for where a build's wheel came from (apexkit.install.run.built_source); any other source is the
# index the wheel was fetched from
BUILD_SOURCES = ("wheel cache", "built", "build")


def install_detail(result: Mapping[str, str]) -> str:
    """The install row's detail: the wheel and where it really came from -- `wheel cache`, `team index <url>`
    (masked), `built`, or `installed already` (the venv held that wheel: nothing was installed)."""
    status, wheel, source = (result.get(k) for k in ("status", "wheel", "source"))
    if not wheel:
        return status or ""
    if status == "already-installed":
        return f"{wheel}: installed already"
    if source and source not in BUILD_SOURCES and not source.startswith("team index "):
        source = f"team index {source}"
    return f"{wheel}: {source}" if source else wheel


def _validate_read(row: Row, data: Any, report: Path) -> tuple[str, str] | None:
    report_data = _read_json(report / "validate.json")
    if isinstance(report_data, dict) and isinstance(report_data.get("ok"), bool):
        row.detail = "ready" if report_data["ok"] else "NOT ready"
        row.result = {"verdict": row.detail, "report": str(report / "validate.json")}
    return failure_from_validate(report_data)


def _bench_read(row: Row, data: Any, report: Path) -> None:
    row.result = {"results": str(report / "bench")}


_STAGE_READERS: dict[str, Callable[[Row, Any, Path], tuple[str, str] | None]] = {
    "doctor": _rows_read,
    "proxy": _rows_read,
    "install": _install_read,
    "validate": _validate_read,
}


def _status_error(path: Path) -> str | None:
    """A child's one-line error from its status file (untrusted); None when it recorded none."""
    with contextlib.suppress(untrusted.Untrusted):
        status = statusfile.read(path)
        return status.error if status is not None else None
    return None


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


# --- the report ----------------------------------------------------------------------------------------------------


def report_dict(
    opts: Options, facts: Facts | None, rows: list[Row], started: str, seconds: float
) -> dict:
    failed = next((r for r in rows if r.status == FAILED), None)
    return {
        "format": FORMAT,
        "venv": opts.target.given[1],
        "interpreter": str(opts.target.python),
        "facts": None
        if facts is None
        else {
            "python": facts.python,
            "torch": facts.torch,
            "torch_npu": facts.torch_npu,
            "apex": facts.apex,
        },
        "device": opts.device,
        "started": started,
        "seconds": round(seconds, 3),
        "ok": failed is None,
        "first_failure": None
        if failed is None
        else {"stage": failed.name, "cause": failed.cause, "fix": failed.fix},
        "stages": [r.to_json() for r in rows],
    }


def _cell(text: object) -> str:
    return log.sanitise(str(text or "")).replace("|", "\\|").replace("`", "'")


def status_text(row: Mapping[str, Any]) -> str:
    if row["status"] == DONE:
        return f"done (from {row['finished']})"
    if row["status"] == SKIPPED:
        return f"skipped: {row['detail']}"
    return str(row["status"])


def render_markdown(report: Mapping[str, Any]) -> str:
    lines = [
        f"# apexkit up: {_cell(report['venv'])}",
        "",
        f"- started {report['started']}, {log.format_seconds(report['seconds'])}; device {report['device']}",
    ]
    facts = report.get("facts")
    if facts:
        lines.append(
            "- " + ", ".join(f"{k} {_cell(v) if v else '(none)'}" for k, v in facts.items())
        )
    verdict = "**ready**" if report["ok"] else f"**failed** at {report['first_failure']['stage']}"
    lines += [
        f"- verdict: {verdict}",
        "",
        "| stage | status | time | detail | log |",
        "|---|---|---|---|---|",
    ]
    for row in report["stages"]:
        detail = "" if row["status"] == SKIPPED else _cell(row["detail"])
        if row["first_failure"] and row["first_failure"]["fix"]:
            detail += f" → {_cell(row['first_failure']['fix'])}"
        seconds = "" if row["status"] == SKIPPED else log.format_seconds(row["seconds"])
        where = f"`{_cell(row['log'])}`" if row["log"] else ""
        lines.append(
            f"| {row['name']} | {_cell(status_text(row))} | {seconds} | {detail} | {where} |"
        )
    failure = report.get("first_failure")
    if failure:
        lines += [
            "",
            f"First failure: **{failure['stage']}**: {_cell(failure['cause'])}",
            "",
            f"Fix: {_cell(failure['fix'])}",
        ]
    return "\n".join(lines) + "\n"


def print_summary(report: Mapping[str, Any], where: Path | None) -> None:
    facts = report.get("facts") or {}
    shown = ", ".join(f"{k} {v or '(none)'}" for k, v in facts.items())
    log.out(f"up: {report['venv']}" + (f" ({shown})" if shown else ""))
    width = max(len(status_text(row)) for row in report["stages"])
    for row in report["stages"]:
        seconds = "" if row["status"] == SKIPPED else log.format_seconds(row["seconds"])
        detail = "" if row["status"] in (SKIPPED, DONE) else row["detail"]
        log.out(f"  {row['name']:<9} {status_text(row):<{width}} {seconds:>7}  {detail}".rstrip())
        if row["first_failure"]:
            log.out(f"  {'':<9} {'':<{width}} {'':>7}  → {row['first_failure']['fix']}")
    if where is not None:
        log.out(f"report: {where / 'up.md'} ({where / 'up.json'})")
    log.out("ready" if report["ok"] else f"failed at {report['first_failure']['stage']}")


# --- doing it ------------------------------------------------------------------------------------------------------


def dry_run(opts: Options, stages: list[Stage], environ: Mapping[str, str]) -> int:
    log.out(
        f"apexkit up --dry-run: {opts.target.given[1]} (report {opts.report}); nothing runs, nothing is written"
    )
    for stage in stages:
        log.out(
            f"  {stage.name:<9} {stage.shown() if stage.wanted else 'skipped: ' + stage.why_not}"
        )
    if opts.device == "auto":
        log.out(
            "device auto: up picks the one the venv's torch finds when it runs (--device forces one)"
        )
    log.out(
        "a stage whose last run succeeded for the same venv, torch and wheel is not run again (--force: all)"
    )
    for line in project_settings(opts, environ):
        log.out(line)
    error = report_problem(opts.report)
    if error is not None:
        log.warn(f"up would refuse: {error.format()}")
    return 0


def reprobe(python: Path, before: Facts) -> Facts:
    """The venv's facts after install; the earlier ones (and one line) if it cannot be probed now."""
    try:
        return probe(python)
    except ConfigError as exc:
        log.warn(f"after install: {exc.format()}")
        return before


def write_report(report_dir: Path, report: dict, state: Mapping[str, Done]) -> None:
    """up.json, up.md and the state, each written beside itself and renamed: never half-written."""
    files = {
        "up.json": (json.dumps(report, indent=1) + "\n").encode(),
        "up.md": render_markdown(report).encode(),
        STATE_FILE: state_bytes(state),
    }
    for name, data in files.items():
        try:
            fsedit.atomic_write(report_dir / name, data, 0o644)
        except OSError as exc:
            raise ConfigError(
                f"cannot write {report_dir / name}: {exc.strerror or exc}",
                "free space there or pass --report DIR somewhere writable",
            ) from None


def execute(opts: Options, environ: Mapping[str, str] | None = None) -> int:
    environ = os.environ if environ is None else environ
    if opts.dry_run:
        return dry_run(opts, plan(opts), environ)
    for line in project_settings(opts, environ):
        log.info(line)
    facts = probe(opts.target.python)
    if opts.device == "auto":  # the one the venv's torch finds, said with why
        opts = replace(opts, device=pick_device(opts.target.python))
    stages = plan(opts)
    cachetrust.tighten_umask()  # what the stages write into the report stays ours alone (report_problem)
    report_dir = _report_dir(opts.report)
    with stops_like_ctrl_c(), locks.hold(report_dir, f"the up report {report_dir}"):
        state = dict(load_state(report_dir))
        started, start = now(), time.monotonic()
        rows: list[Row] = []
        failed: str | None = None
        extra_env: dict[str, str] = {}
        interrupted = False
        for stage in stages:
            if failed or not stage.wanted:
                rows.append(
                    Row(stage.name, SKIPPED, f"{failed} failed" if failed else stage.why_not)
                )
                continue
            key = digest(stage_inputs(stage.name, facts, opts, environ))
            done = _still_done(
                stage.name,
                previous_run(stage.name, key, state, opts.force),
                facts,
                opts,
                report_dir,
            )
            if done is not None:
                log.info(
                    f"▸ {stage.name}: done (from {done.finished}), not run again (--force runs it)"
                )
                rows.append(_done_row(stage, done, report_dir))
            else:
                row, stopped = _run_logged(stage, report_dir, environ, extra_env)
                interrupted = interrupted or stopped
                rows.append(row)
                if stage.name == "install" and row.status == OK:
                    facts = reprobe(opts.target.python, facts)  # install changed the venv
                    key = digest(stage_inputs(stage.name, facts, opts, environ))
                if row.status == OK:
                    state[stage.name] = Done(key, row.finished or now(), row.seconds, row.result)
                else:
                    state.pop(stage.name, None)
                    failed = stage.name
            if stage.name == "install":  # the bench's report names the wheel it measured
                extra_env.update(_wheel_env(rows[-1].result))
        report = report_dict(opts, facts, rows, started, time.monotonic() - start)
        write_report(report_dir, report, state)
    _print_report(report, report_dir, opts.as_json)
    if interrupted:
        raise KeyboardInterrupt
    return 0 if report["ok"] else 1


def _wheel_env(result: Mapping[str, Any]) -> dict[str, str]:
    """The bench's variables for the wheel install put in (its --json, read back as untrusted): its sha256 and its
    target id, each only when it is one."""
    env = {}
    sha, target = result.get("sha256"), result.get("target")
    if isinstance(sha, str) and re.fullmatch(r"[0-9a-f]{64}", sha):
        env["APEXKIT_APEX_WHEEL_SHA256"] = sha
    if isinstance(target, str):
        with contextlib.suppress(ConfigError):
            env["APEXKIT_TARGET_ID"] = targets.Target.from_id(target).id
    return env


def _still_done(
    name: str, done: Done | None, facts: Facts, opts: Options, report: Path
) -> Done | None:
    """`done`, unless `undone` finds what it left gone: then None, and one line says why the stage runs again."""
    why = undone(name, facts, opts, report) if done is not None else None
    if why:
        log.info(f"▸ {name}: the state says done, but {why}: running it again")
    return None if why else done


def _report_dir(report_dir: Path) -> Path:
    error = report_problem(report_dir)  # before anything is made there
    if error is not None:
        raise error
    try:
        cachetrust.make_dir(report_dir / "logs")
    except OSError as exc:
        raise ConfigError(
            f"cannot create the report directory {report_dir}: {exc.strerror or exc}",
            "pass --report DIR somewhere writable",
        ) from None
    error = report_problem(report_dir)
    if error is not None:
        raise error
    return report_dir


def report_problem(report_dir: Path) -> ConfigError | None:
    """Why up may not keep its state and report in `report_dir` (None: it may): the cache's trust rule
    (cachetrust.problem) -- ours or root's, nobody else can write it or what lies directly in it, not a link,
    parents nobody else can swap. A state someone else wrote there could make up skip stages and say "ready"."""
    reason = cachetrust.problem(report_dir)
    return (
        None
        if reason is None
        else ConfigError(
            f"the up report directory {report_dir} is {reason}: up neither reads its state nor writes there",
            "pass --report DIR (a directory only you can write), or make this one yours alone "
            "(chmod -R go-w; remove it if someone else made it)",
        )
    )


def project_settings(opts: Options, environ: Mapping[str, str]) -> list[str]:
    """`<key> from project <file>: <value>` for each source a project ./apexkit.toml sets for the stages (a cloned
    repository carries its own): an index, a team index, a git URL."""
    cfg = config.load(environ)
    values = [
        cfg.get(s.key, environ, flag=list(opts.indexes) if s.key == "team_indexes" else None)
        for s in config.SETTINGS
    ]
    return [f"{v.key} from {v.origin}: {v.shown()}" for v in values if v.layer == config.PROJECT]


def _print_report(report: dict, report_dir: Path, as_json: bool) -> None:
    if as_json:
        sys.stdout.write(json.dumps(report, indent=1) + "\n")
    else:
        print_summary(report, report_dir)


def _done_row(stage: Stage, done: Done, report_dir: Path) -> Row:
    """The row of a stage an earlier run did with the same inputs."""
    return Row(
        stage.name,
        DONE,
        f"done (from {done.finished})",
        seconds=done.seconds,
        log=str(report_dir / "logs" / f"{stage.name}.log"),
        command=stage.command,
        options=stage.options,
        finished=done.finished,
        result=done.result,
    )


def _run_logged(
    stage: Stage, report_dir: Path, environ: Mapping[str, str], extra_env: Mapping[str, str]
) -> tuple[Row, bool]:
    """(the stage's row, whether Ctrl-C stopped it), one line before it and one after."""
    log.info(f"▸ {stage.name} (log {report_dir / 'logs' / (stage.name + '.log')})")
    interrupted = False
    try:
        row = run_stage(stage, report_dir / "logs", report_dir, environ, extra_env)
    except KeyboardInterrupt:  # the report still says how far it got; exit 130 after it
        interrupted = True
        row = Row(
            stage.name,
            FAILED,
            "interrupted",
            log=str(report_dir / "logs" / f"{stage.name}.log"),
            command=stage.command,
            options=stage.options,
            cause="interrupted (Ctrl-C)",
            fix="run apexkit up again: the stages already done are not run again",
            finished=now(),
        )
    mark = "✓" if row.status == OK else "✕"
    log.info(
        f"{mark} {stage.name}: {row.status}{f': {row.detail}' if row.detail else ''} "
        f"({log.format_seconds(row.seconds)})"
    )
    return row, interrupted


def main(**given: Any) -> int:
    """`apexkit up` / `invoke up`, given the declared options (apexkit.commands' `Up`) as make_options' keywords:
    exit 0 when every stage run is ok or done, 1 when one failed."""
    return execute(make_options(**given))


__all__ = ["Options", "Stage", "execute", "main", "make_options", "plan"]
