#!/usr/bin/env python3
"""One node of an apexkit fleet run (started by `invoke fleet.submit`'s batch script, one Slurm step per node).

    python3.X fleet_node.py --plan RESULTS/.fleet/plan-N.json

On this node: a fresh node-local venv; the wheel of the plan's target downloaded from the index by pip and checked
against the index's sha256; torch (+ torch_npu, --no-deps) installed; validate_env.py run in the venv (and a short
amp_bench.py with the plan's bench arguments); one JSON result, named after the node, written atomically into the
shared results directory. With the plan's `venv` (fleet.submit --venv), `apexkit up`'s way instead: the node's own
training venv is checked against the target (Python, torch, torch_npu), the wheel goes in --no-deps (torch is never
touched; nodes sharing one venv take turns and install once), then the same validation and bench.

Every stage that fails becomes the node's first failing check with its fix, so a node
never just goes missing. Standard library only; never imports apexkit (it runs on nodes that do not have it).
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import datetime
import hashlib
import json
import os
import platform
import re
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
SCHEMA = "apexkit-fleet-node/1"
sys.path.insert(0, str(HERE))
import targetenv  # noqa: E402


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


INDEX_JSON_MAX = 64 << 20
_LOGIN_IN_URL = re.compile(r"(?i)(\b[a-z][a-z0-9+.-]*://)[^/?#\s@]*@")


def load_logins(plan: dict) -> dict:
    """{URL as in the plan: the same URL with its user:token@} from the plan's credentials file, which must be a
    regular file of this user that nobody else can read (fleet.submit writes it 0600 into a 0700 directory)."""
    path = plan.get("credentials")
    if not path:
        return {}
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    with os.fdopen(fd, "rb") as fh:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077:
            raise ValueError(f"{path} is not a private regular file of this user")
        data = json.loads(fh.read(1 << 20).decode("utf-8"))
    return {str(a): str(b) for a, b in data["logins"]}


def with_login(url, logins: dict):
    """`url` with the login of the URL it starts with (the index root for its /simple/ and /index.json)."""
    if not url:
        return url
    for public, full in sorted(logins.items(), key=lambda item: -len(item[0])):  # the closest first
        root = public.rstrip("/")
        if url == public:
            return full
        if url.startswith(root + "/"):
            return full.rstrip("/") + url[len(root) :]
    return url


def secrets_of(logins: dict) -> list:
    """Every form a login's secret may be printed in (raw and percent-decoded), longest first."""
    found = set()
    for full in logins.values():
        info = urllib.parse.urlsplit(full).netloc.rpartition("@")[0]
        user, _, password = info.partition(":")
        for part in (info, password or user):
            if part:
                found.update({part, urllib.parse.unquote(part)})
    return sorted(found, key=len, reverse=True)


def hide(text: str, secrets: list) -> str:
    """`text` with every login masked: user:token@ in a URL and any known secret."""
    text = _LOGIN_IN_URL.sub(r"\1***@", text or "")
    for secret in secrets:
        text = text.replace(secret, "***")
    return text


def basic_auth(full: str):
    parts = urllib.parse.urlsplit(full)
    if "@" not in parts.netloc:
        return None
    info = parts.netloc.rpartition("@")[0]
    user, _, password = info.partition(":")
    token = f"{urllib.parse.unquote(user)}:{urllib.parse.unquote(password)}"
    return "Basic " + base64.b64encode(token.encode()).decode()


def expand_dir(raw, environ) -> Path:
    """The node-local scratch, expanded HERE, on the node: None -> $TMPDIR/apexkit-fleet (else /tmp/...);
    $VAR, ${VAR} and ${VAR:-default} from this node's environment. ValueError when a variable is unset or the
    result is not an absolute path (a relative one would land in the shared submit directory)."""
    if not raw:
        return Path(environ.get("TMPDIR") or "/tmp") / "apexkit-fleet"

    def var(match):
        name, default = match.group(1) or match.group(3), match.group(2)
        value = environ.get(name)
        if value:
            return value
        if default is not None:
            return default
        raise ValueError(f"${name} is not set on this node")

    text = re.sub(r"\$\{([A-Za-z_]\w*)(?::-([^}]*))?\}|\$([A-Za-z_]\w*)", var, raw)
    if not os.path.isabs(text):
        raise ValueError(f"{text} is not an absolute path")
    return Path(text)


def tail(text: str, lines: int = 3) -> str:
    kept = [line.strip() for line in (text or "").strip().splitlines() if line.strip()]
    return " | ".join(kept[-lines:])[-600:]


class Node:
    def __init__(self, plan: dict) -> None:
        self.plan = plan
        self.name = os.environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]
        self.job = os.environ.get("SLURM_JOB_ID", "")
        self.results = Path(plan["results"])
        self.progress = self.results / ".fleet" / "progress" / f"{self.name}.json"
        self.result = {
            "schema": SCHEMA,
            "node": self.name,
            "hostname": socket.gethostname(),
            "job_id": self.job,
            "submission": plan.get("submission"),
            "target": plan["target"],
            "index": plan["index"],
            "device": plan["device"],
            "venv": plan.get("venv"),
            "started": now(),
            "stages": [],
            "verdict": None,
            "set_env": os.environ.get("APEXKIT_FLEET_SET_ENV") or None,
        }
        self.cleanup = None  # removes the node-local scratch (set by main)
        self.before: dict = {}  # --venv: the training venv's versions before the wheel went in
        self.logins: dict = {}  # set by main from the plan's credentials file
        self.secrets: list = []

    # --- bookkeeping -------------------------------------------------------------------------------------------------
    def mark(self, stage: str) -> None:
        """Where this node is now: `fleet.status` shows it; a job killed mid-run shows the stage it died in."""
        write_json(
            self.progress, {"node": self.name, "job_id": self.job, "stage": stage, "time": now()}
        )

    def stage(self, name: str, ok: bool, seconds: float, detail: str = "", fix: str = "") -> bool:
        detail = hide(detail, self.secrets)
        self.result["stages"].append(
            {"stage": name, "ok": ok, "seconds": round(seconds, 2), "detail": detail, "fix": fix}
        )
        if not ok and not self.result.get("first_failure"):
            self.result["first_failure"] = {"check": name, "detail": detail, "fix": fix}
        return ok

    def run(
        self, name: str, argv: list[str], fix: str, timeout: int = 3600, env: dict | None = None
    ):
        """`env`: variables added to this node's environment (pip's index URLs, logins included: never argv)."""
        self.mark(name)
        start = time.monotonic()
        shown = [f"{k}={v}" for k, v in (env or {}).items()]
        print(hide(f"+ {' '.join([*shown, *argv])}", self.secrets), flush=True)
        try:
            proc = subprocess.run(
                argv,
                capture_output=True,
                text=True,
                timeout=timeout,
                env=dict(os.environ, **env) if env else None,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            self.stage(name, False, time.monotonic() - start, str(exc), fix)
            return None
        sys.stdout.write(hide(proc.stdout[-4000:], self.secrets))
        sys.stdout.write(hide(proc.stderr[-4000:], self.secrets))
        sys.stdout.flush()
        ok = proc.returncode == 0
        self.stage(
            name, ok, time.monotonic() - start, "" if ok else tail(proc.stderr or proc.stdout), fix
        )
        return proc if ok else None

    def finish(self, verdict: str) -> int:
        """Scratch removed first (a cancel arriving now is ignored), then the result: a node that reported is done."""
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        if self.cleanup is not None:
            self.cleanup()
        self.result["verdict"] = verdict
        self.result["finished"] = now()
        write_json(self.results / f"{self.name}.json", self.result)
        self.mark("done")
        print(f"{self.name}: {verdict}", flush=True)
        return 0 if verdict == "ok" else 1

    # --- facts ---------------------------------------------------------------------------------------------------------
    def facts(self) -> None:
        import validate_env  # standard library at import time; cann_info reads the toolkit's install.info

        self.result["cann"] = validate_env.cann_info().get("version")
        self.result["driver"] = driver_version()
        self.result["chip"] = chip_name()
        self.result["arch"] = platform.machine()

    # --- the stages --------------------------------------------------------------------------------------------------
    def main(self, work: Path) -> int:
        plan = self.plan
        self.mark("start")
        self.facts()
        entry = self.index_entry()  # first: an index this node cannot reach fails in seconds
        if entry is None:
            return self.finish("fail")
        training = self.training_venv() if plan.get("venv") else None
        if plan.get("venv"):
            if training is None:
                return self.finish("fail")
            py = str(training)
        else:
            venv = work / "venv"
            if not self.run(
                "venv",
                [sys.executable, "-m", "venv", str(venv)],
                f"make sure {sys.executable} has the venv module (python3-venv) and {work} is writable",
            ):
                return self.finish("fail")
            py = str(venv / "bin" / "python")
        pip = [py, "-m", "pip", "--disable-pip-version-check"]
        self.result["wheel"] = {
            "filename": entry["filename"],
            "expected_sha256": entry["sha256"],
            "sha256": None,
        }
        version = entry["filename"].split("-")[1]
        downloads = work / "wheel"
        index_fix = (
            f"this node cannot reach the index {plan['index']}: put it on storage every node mounts or serve "
            "it over http(s) from a host the nodes reach (check from a node: curl -I <index>/simple/apex/)"
        )
        if not self.run(
            "download wheel",
            [
                *pip,
                "download",
                "--no-deps",
                "--retries",
                "1",
                "--timeout",
                "20",
                "-d",
                str(downloads),
                f"apex=={version}",
            ],
            index_fix,
            timeout=600,
            env={"PIP_INDEX_URL": with_login(plan["simple_url"], self.logins)},
        ):
            return self.finish("fail")
        wheel = downloads / entry["filename"]
        if not wheel.is_file():
            got = ", ".join(p.name for p in downloads.iterdir())
            self.stage(
                "wheel sha256",
                False,
                0,
                f"pip fetched {got}, not {entry['filename']}",
                "publish the index again (invoke publish) and resubmit",
            )
            return self.finish("fail")
        digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
        self.result["wheel"]["sha256"] = digest
        if not self.stage(
            "wheel sha256",
            digest == entry["sha256"],
            0,
            "" if digest == entry["sha256"] else f"{digest[:12]} != index {entry['sha256'][:12]}",
            "the index changed under the run or a cache/mirror serves another file: publish again",
        ):
            return self.finish("fail")
        if plan.get("trusted_keys") and not self.signature(wheel, digest):
            return self.finish("fail")
        if (
            training is not None
        ):  # the training venv: torch as it is, the wheel --no-deps, once per venv
            if not self.install_into_training_venv(py, wheel):
                return self.finish("fail")
            return self.finish("ok" if self.checked(py, work) else "fail")
        torch_env = {}  # pip reads these like its options; a login never goes on a command line
        if plan.get("find_links"):
            torch_env["PIP_FIND_LINKS"] = " ".join(
                with_login(d, self.logins) for d in plan["find_links"]
            )
        if plan.get("torch_index_url"):
            torch_env["PIP_INDEX_URL"] = with_login(plan["torch_index_url"], self.logins)
        if plan.get("extra_index_urls"):
            torch_env["PIP_EXTRA_INDEX_URL"] = " ".join(
                with_login(u, self.logins) for u in plan["extra_index_urls"]
            )
        if not self.run(
            "install torch",
            [*pip, "install", "-q", f"torch=={plan['torch']}"],
            "the node's pip cannot install torch: give it a wheelhouse (--find-links) or a torch index "
            "(--torch-index-url), or set its proxy",
            env=torch_env,
        ):
            return self.finish("fail")
        if plan.get("torch_npu") and not self.run(
            "install torch_npu",
            [*pip, "install", "-q", "--no-deps", f"torch-npu=={plan['torch_npu']}"],
            f"torch-npu {plan['torch_npu']} must be installable on this node (index, proxy or --find-links)",
            env=torch_env,
        ):
            return self.finish("fail")
        if not self.run(
            "install wheel",
            [*pip, "install", "-q", "--no-deps", str(wheel)],
            "the wheel does not install into this node's Python: check the target's Python and arch",
        ):
            return self.finish("fail")
        return self.finish("ok" if self.checked(py, work) else "fail")

    def checked(self, py: str, work: Path) -> bool:
        """The venv's torch versions into the result, then validate (and bench)."""
        found = installed(py)
        if found is not None:
            self.result["torch"], self.result["torch_npu"] = found["torch"], found["torch-npu"]
        verdict = self.validate(py, work)
        if self.plan.get("bench") is not None:
            verdict = self.bench(py, work) and verdict
        return verdict

    # --- --venv: the training venv every node already has ------------------------------------------------------------
    def training_venv(self) -> Path | None:
        """The plan's --venv on this node, if its Python, torch and torch_npu are the target's (what `apexkit up`
        checks before installing): its python, else None with the stage that says why."""
        plan = self.plan
        self.mark("training venv")
        start = time.monotonic()
        fix = (
            f"make the training venv at {plan['venv']} on every node (or on storage they all mount) with Python "
            f"{plan['python']} and torch {plan['torch']}"
            + (f" + torch_npu {plan['torch_npu']}" if plan.get("torch_npu") else "")
            + ", or submit without --venv (a fresh venv per node)"
        )
        try:
            root = expand_dir(plan["venv"], os.environ)
        except ValueError as exc:
            self.stage("training venv", False, 0, f"--venv {plan['venv']}: {exc}", fix)
            return None
        py = root / "bin" / "python"
        found = installed(str(py)) if py.is_file() else None
        if found is None:
            why = f"{py} does not exist" if not py.is_file() else f"{py} does not run"
            self.stage("training venv", False, time.monotonic() - start, why, fix)
            return None
        self.before = found
        wrong = []
        if found["python"] != plan["python"]:
            wrong.append(f"Python {found['python']}, not {plan['python']}")
        torch = (found["torch"] or "").split("+")[0]
        if torch != plan["torch"].split("+")[0]:
            wrong.append(f"torch {found['torch'] or 'missing'}, not {plan['torch']}")
        if plan.get("torch_npu") and found["torch-npu"] != plan["torch_npu"]:
            wrong.append(f"torch_npu {found['torch-npu'] or 'missing'}, not {plan['torch_npu']}")
        detail = "; ".join(wrong) or (
            f"{root}: Python {found['python']}, torch {found['torch']}"
            + (f", torch_npu {found['torch-npu']}" if found["torch-npu"] else "")
        )
        if wrong:
            detail = f"{root} has {detail} (the target is {plan['target']})"
        ok = self.stage("training venv", not wrong, time.monotonic() - start, detail, fix)
        return py if ok else None

    def install_into_training_venv(self, py: str, wheel: Path) -> bool:
        """The wheel --no-deps into the training venv: never torch or torch_npu. Nodes sharing one venv (on shared
        storage) take turns through a lock directory; a venv already holding this very build (its RECORD) is left
        as it is, so a node never rewrites apex under another node's validation."""
        root = Path(py).parent.parent
        lock = root / ".apexkit-fleet-install.lock"
        self.mark("install wheel")
        start = time.monotonic()
        try:
            held = InstallLock.take(lock, LOCK_WAIT)
        except TimeoutError as exc:
            self.stage(
                "install wheel",
                False,
                time.monotonic() - start,
                str(exc),
                f"if no node is installing into {root}, remove {lock} and resubmit with --resume",
            )
            return False
        except OSError as exc:
            self.stage(
                "install wheel",
                False,
                0,
                f"cannot lock {root}: {exc.strerror or exc}",
                f"this user must be able to write {root} (the training venv)",
            )
            return False
        try:
            found = installed(py)
            if found is not None and same_build(wheel, found.get("apex_record")):
                return self.stage(
                    "install wheel",
                    True,
                    time.monotonic() - start,
                    f"already installed: {wheel.name} (same RECORD), not reinstalled",
                )
            if not self.run(
                "install wheel",
                [
                    py,
                    "-m",
                    "pip",
                    "--disable-pip-version-check",
                    "install",
                    "-q",
                    "--no-deps",
                    "--force-reinstall",
                    str(wheel),
                ],
                "the wheel does not install into the training venv: check its Python and arch",
            ):
                return False
        finally:
            held.release()
        after = installed(py) or {}
        changed = [
            f"{name} {self.before[name]} -> {after.get(name)}"
            for name in ("torch", "torch-npu")
            if after.get(name) != self.before[name]
        ]
        if changed:
            return self.stage(
                "torch kept",
                False,
                0,
                "installing the wheel changed " + ", ".join(changed),
                "reinstall the venv's torch, and report this as an apexkit bug (the wheel went in --no-deps)",
            )
        return True

    def read(self, url: str, limit: int, what: str) -> bytes:
        """The bytes at `url` (at most `limit`: else ValueError), the plan's login as a header that a redirect does
        not carry on (urllib would resolve user:token@host)."""
        request = urllib.request.Request(url)
        auth = basic_auth(with_login(url, self.logins) or "")
        if auth:
            request.add_unredirected_header("Authorization", auth)
        with urllib.request.urlopen(request, timeout=30) as response:
            body = response.read(limit + 1)
        if len(body) > limit:
            raise ValueError(f"{what} is larger than {limit >> 20} MiB")
        return body

    def signature(self, wheel: Path, digest: str) -> bool:
        """With the plan's trusted keys (fleet.submit --trusted-key): the wheel's envelope <wheel>.intoto.jsonl beside
        it in the index verifies against one of them (apexkit's format, docs/signing.md, checked here without
        apexkit), its subject is this file with the sha256 `digest` of the bytes downloaded, and its signed facts
        are the plan's Python, torch and torch_npu. Else the stage fails: nothing goes into a venv."""
        self.mark("wheel signature")
        start = time.monotonic()
        trusted = {k["keyid"]: k["pem"] for k in self.plan["trusted_keys"]}
        url = (
            self.plan["simple_url"].rstrip("/") + "/apex/" + urllib.parse.quote(wheel.name + SUFFIX)
        )
        try:
            why = signed_wrongly(
                self.read(url, ENVELOPE_MAX, SUFFIX), trusted, wheel.name, digest, self.plan
            )
        except (
            Exception
        ) as exc:  # unreadable, not JSON, no verifier: this node's finding, never a crash
            why = f"{wheel.name}{SUFFIX}: {exc.__class__.__name__}: {str(exc)[:300]}"
        fix = (
            "only a wheel signed by a trusted key is installed: publish it signed (invoke publish --sign-key) "
            "or pass the signer's .pub with --trusted-key"
        )
        detail = f"{why}; trusted key {', '.join(sorted(trusted))}" if why else ""
        return self.stage("wheel signature", why is None, time.monotonic() - start, detail, fix)

    def index_entry(self) -> dict | None:
        """The target's file and sha256, read from the index the way this node sees it."""
        plan = self.plan
        self.mark("index")
        start = time.monotonic()
        fix = (
            f"this node cannot read {plan['index_json']}: put the index on storage every node mounts or serve it "
            "over http(s) from a host the nodes reach"
        )
        try:
            data = json.loads(
                self.read(plan["index_json"], INDEX_JSON_MAX, "index.json").decode("utf-8")
            )
            if not isinstance(data, dict) or not isinstance(data.get("files", []), list):
                raise ValueError("index.json is not an apexkit index (no files list)")
        except Exception as exc:  # any failure to read it is this node's finding, not a crash
            self.stage(
                "read index",
                False,
                time.monotonic() - start,
                f"{exc.__class__.__name__}: {exc}",
                fix,
            )
            return None
        files = [
            f
            for f in data.get("files", [])
            if isinstance(f, dict)
            and f.get("target") == plan["target"]
            and isinstance(f.get("filename"), str)
            and isinstance(f.get("sha256"), str)
            and re.fullmatch(r"apex-[A-Za-z0-9_.+!-]+\.whl", f["filename"])
        ]
        if not files:
            self.stage(
                "read index",
                False,
                time.monotonic() - start,
                f"the index has no target {plan['target']}",
                "publish that target (invoke publish) or pick another with --target",
            )
            return None
        self.stage("read index", True, time.monotonic() - start)
        return files[0]

    def validate(self, py: str, work: Path) -> bool:
        report = work / "validate.json"
        self.run(
            "validate",
            [
                py,
                str(HERE / "validate_env.py"),
                "--device",
                self.plan["device"],
                "--json",
                str(report),
            ],
            "see the first failing check",
            timeout=1800,
        )
        if not report.is_file():
            return False
        data = json.loads(report.read_text())
        self.result["validate"] = {"ok": data.get("ok"), "checks": data.get("checks", [])}
        if data.get("ok"):
            return True
        first = next(
            (c for c in data.get("checks", []) if c.get("required") and c.get("status") != "ok"),
            None,
        )
        if first is not None:  # the validation's own finding beats the generic stage line
            failure = {
                "check": first["check"],
                "detail": first.get("detail", ""),
                "fix": first.get("hint", ""),
            }
            if self.result.get("first_failure", {}).get("check") == "validate":
                self.result["first_failure"] = failure
        return False

    def bench(self, py: str, work: Path) -> bool:
        out = work / "bench"
        args = self.plan["bench"]
        proc = self.run(
            "bench",
            [
                py,
                str(HERE / "amp_bench.py"),
                "--device",
                self.plan["device"],
                "--out",
                str(out),
                "--no-png",
                *args,
            ],
            "read the node's log (RESULTS/.fleet/logs/)",
            timeout=3600,
        )
        results = out / "results.json"
        if not results.is_file():
            return False
        data = json.loads(results.read_text())
        for model, entry in data.get("models", {}).items():
            for row in entry.get("results", []):
                if row.get("status") == "ok":
                    self.result["bench"] = {
                        "model": model,
                        "mode": row["mode"],
                        "step_ms": row["step_ms_median"],
                        "config": data.get("config"),
                        "headline": data.get("headline"),
                    }
                    return proc is not None
        return False


LOCK_WAIT = 900.0  # seconds a node waits for another node's install into a shared training venv
STALE_AFTER = (
    120.0  # another host's lock whose holder record has not changed for this long is stale
)
HEARTBEAT = 10.0  # how often a holder touches its record (well under STALE_AFTER)


def here() -> str:
    """Where a pid means one process: this host, this boot and this pid namespace. Two containers may share a
    hostname and still number their processes apart; a pid from another boot is another process."""
    parts = [socket.gethostname()]
    for read in (
        lambda: Path("/proc/sys/kernel/random/boot_id").read_text().strip(),
        lambda: os.readlink("/proc/self/ns/pid"),
    ):
        try:
            parts.append(read())
        except OSError:
            parts.append("?")
    return " ".join(parts)


def pid_start(pid: int) -> int | None:
    """When process `pid` started (clock ticks since boot: /proc/<pid>/stat field 22), None when unknown: with
    `here`, it tells the process that wrote a record from a later one the kernel gave the same pid."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
        return int(fields[19])  # field 22; the fields after "(comm)" start at field 3
    except (OSError, ValueError, IndexError):
        return None


class InstallLock:
    """The training venv's install lock: a directory `lock`, made with mkdir, holding `holder`, a JSON record of
    its holder (host, pid, start, a nonce) written atomically and touched every HEARTBEAT s while held.

    A directory and not fcntl.flock, although a flock would vanish with its holder: the venv may sit on NFS or
    Lustre, where flock is either cluster-wide, node-local (mounted nolock, local_lock=flock, localflock: every node
    "gets" it and two pips write one venv at once) or refused (Lustre's noflock), and a node cannot tell which.
    mkdir is atomic on all of them, so staleness is judged instead, by the waiter: a holder here (this host, boot
    and pid namespace: `here`) whose pid is gone, or now names a process started later (`pid_start`: a reused pid),
    is stale at once; any other holder (or none recorded) is stale
    once its record has not changed for STALE_AFTER s by the waiter's own clock (no timestamp from another machine
    is compared with ours: node and file-server clocks may disagree). A stale lock is renamed away (only if it is
    still the one judged), then taken by mkdir as usual, with one line naming its holder."""

    NAME = "holder"

    def __init__(self, lock: Path) -> None:
        self.lock, self.nonce = lock, os.urandom(8).hex()
        self.stop = threading.Event()
        record = {
            "host": socket.gethostname(),
            "where": here(),
            "pid": os.getpid(),
            "pid_start": pid_start(os.getpid()),
            "started": now(),
            "nonce": self.nonce,
        }
        tmp = lock / f".holder-{self.nonce}"
        try:
            tmp.write_text(json.dumps(record))
            os.replace(tmp, lock / self.NAME)
        except OSError:
            with contextlib.suppress(OSError):
                tmp.unlink()
            os.rmdir(lock)
            raise
        threading.Thread(target=self._beat, daemon=True).start()

    def _beat(self) -> None:
        while not self.stop.wait(HEARTBEAT):
            with contextlib.suppress(OSError):
                os.utime(self.lock / self.NAME)

    def release(self) -> None:
        """Stop the heartbeat; remove the lock if it is still ours (not taken over meanwhile)."""
        self.stop.set()
        if InstallLock.state(self.lock)[1].get("nonce") == self.nonce:
            with contextlib.suppress(OSError):
                os.unlink(self.lock / self.NAME)
                os.rmdir(self.lock)

    @staticmethod
    def state(lock: Path) -> tuple[tuple, dict]:
        """(what changes whenever the lock or its record does, the holder record ({}: none or unreadable));
        FileNotFoundError when there is no lock."""
        ino = os.stat(lock).st_ino
        try:
            fd = os.open(lock / InstallLock.NAME, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
            with os.fdopen(fd, "rb") as fh:
                st = os.fstat(fd)
                record = json.loads(fh.read(4096)) if stat.S_ISREG(st.st_mode) else {}
            return (ino, st.st_ino, st.st_mtime_ns), record if isinstance(record, dict) else {}
        except (OSError, ValueError):
            return (ino,), {}

    @staticmethod
    def stale(record: dict, unchanged: float) -> str | None:
        """Why the lock holding `record`, unchanged for `unchanged` s, is stale (None: it is not)."""
        host, pid = record.get("host"), record.get("pid")
        who = (
            f"pid {pid} on {host}, since {record.get('started')}" if host else "no holder recorded"
        )
        if record.get("where") == here() and isinstance(pid, int) and pid > 0:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return f"its holder ({who}) is gone"
            except OSError:
                pass  # alive, another user's
            started = pid_start(pid)
            if started is not None and record.get("pid_start", started) != started:
                return f"its holder ({who}) is gone (pid {pid} is another process now)"
            return None
        if unchanged >= STALE_AFTER:
            return f"its holder ({who}) has not touched it for {int(unchanged)} s"
        return None

    @classmethod
    def take(cls, lock: Path, wait: float) -> InstallLock:
        """The lock, waiting up to `wait` s and taking over a stale one; TimeoutError after that, OSError when
        it cannot be made."""
        start = time.monotonic()
        seen, since, record = None, start, {}
        while True:
            try:
                os.mkdir(lock, 0o700)  # atomic on local disks and NFS alike
                return cls(lock)
            except FileExistsError:
                pass
            try:
                now_seen, record = cls.state(lock)
            except FileNotFoundError:
                continue  # released just now
            if now_seen != seen:
                seen, since = now_seen, time.monotonic()
            why = cls.stale(record, time.monotonic() - since)
            if why and cls._set_aside(lock, seen):
                print(f"taking over the stale install lock {lock}: {why}", flush=True)
                continue
            if time.monotonic() - start > wait:
                holder = (
                    f"pid {record.get('pid')} on {record.get('host')}" if record else "another node"
                )
                raise TimeoutError(f"{holder} has held {lock} for {int(wait)} s")
            time.sleep(1)

    @classmethod
    def _set_aside(cls, lock: Path, judged: tuple) -> bool:
        """Rename the stale lock away if it is still the one judged (a fresh one that slipped in is put back)."""
        aside = lock.with_name(f"{lock.name}.stale-{os.urandom(8).hex()}")
        try:
            if cls.state(lock)[0] != judged:
                return False
            os.rename(lock, aside)
            if cls.state(aside)[0] != judged:
                os.rename(aside, lock)
                return False
        except OSError:
            return False
        shutil.rmtree(aside, ignore_errors=True)
        return True


RECORD_MAX = 4 << 20
_INSTALLED = """
import importlib.metadata as m, json, platform
out = {"python": ".".join(platform.python_version_tuple()[:2])}
for n in ("torch", "torch-npu", "apex"):
    try:
        out[n] = m.version(n)
    except Exception:
        out[n] = None
try:
    out["apex_record"] = (m.distribution("apex").read_text("RECORD") or "")[:RECORD_MAX]
except Exception:
    out["apex_record"] = None
print(json.dumps(out))
""".replace("RECORD_MAX", str(RECORD_MAX))


def installed(py: str) -> dict | None:
    """Python X.Y and the versions of torch, torch-npu and apex in `py`'s environment (apex's RECORD too)."""
    try:
        proc = subprocess.run([py, "-c", _INSTALLED], capture_output=True, text=True, timeout=300)
        data = json.loads(proc.stdout) if proc.returncode == 0 else None
    except (OSError, ValueError, subprocess.TimeoutExpired):
        return None
    if not isinstance(data, dict):
        return None
    keys = ("python", "torch", "torch-npu", "apex", "apex_record")
    return {k: data.get(k) if isinstance(data.get(k), str) else None for k in keys}


def same_build(wheel: Path, record) -> bool:
    """True when the installed apex holds every file of `wheel` with the same hash (pip keeps the wheel's RECORD
    lines and only adds its own): the very same build is installed."""
    if not record:
        return False
    import zipfile

    try:
        with zipfile.ZipFile(wheel) as zf:
            name = next(
                (n for n in zf.namelist() if n.endswith(".dist-info/RECORD") and n.count("/") == 1),
                None,
            )
            if name is None or zf.getinfo(name).file_size > RECORD_MAX:
                return False
            wanted = zf.read(name).decode("utf-8").splitlines()
    except (OSError, ValueError, zipfile.BadZipFile, UnicodeError):
        return False
    have = set(record.splitlines())
    files = [line for line in wanted if line and not line.split(",")[0].endswith("/RECORD")]
    return bool(files) and all(line in have for line in files)


# --- signed delivery (apexkit/index/signing.py's format; this script never imports apexkit) ---------------------------
SUFFIX = ".intoto.jsonl"
ENVELOPE_MAX = 8 << 20
PAYLOAD_TYPE = "application/vnd.in-toto+json"


def signed_wrongly(data: bytes, trusted: dict, name: str, digest: str, plan: dict) -> str | None:
    """Why the envelope file `data` is not a signature by a key of `trusted` (key id -> PEM) over an in-toto
    statement about the wheel `name` with sha256 `digest` for the plan's Python, torch and torch_npu; None if it is.
    The first of at most 16 lines signed by a trusted key counts."""
    lines = [line for line in data.splitlines() if line.strip()][:16]
    keyids = set()
    for line in lines:
        env = json.loads(line)
        if not isinstance(env, dict) or env.get("payloadType") != PAYLOAD_TYPE:
            return f"the envelope is not a DSSE envelope of {PAYLOAD_TYPE}"
        payload = base64.b64decode(env.get("payload", ""), validate=True)
        message = b"DSSEv1 %d %s %d %s" % (
            len(PAYLOAD_TYPE),
            PAYLOAD_TYPE.encode(),
            len(payload),
            payload,
        )
        for sig in env.get("signatures") or []:
            keyids.add(str(sig.get("keyid")))
            pem = trusted.get(sig.get("keyid"))
            if pem and ed25519_valid(
                pem, base64.b64decode(sig.get("sig", ""), validate=True), message
            ):
                return statement_wrongly(json.loads(payload), name, digest, plan)
    return f"signed by {', '.join(sorted(keyids)) or 'no key'}, none of them a trusted key (or a bad signature)"


def statement_wrongly(statement: dict, name: str, digest: str, plan: dict) -> str | None:
    """Why a verified statement is not about this wheel file, or not for the plan's Python, torch and torch_npu."""
    subjects = [
        s for s in statement.get("subject") or [] if isinstance(s, dict) and s.get("name") == name
    ]
    if not any((s.get("digest") or {}).get("sha256") == digest for s in subjects):
        return f"the signature is not for {name} with sha256 {digest}"
    facts = (statement.get("predicate") or {}).get("apexkit_target") or {}
    wanted = {
        "python": plan.get("python"),
        "torch": str(plan.get("torch") or "").split("+")[0],
        "torch_npu": plan.get("torch_npu"),
    }
    wrong = [
        f"{k}: signed {facts.get(k)}, wanted {v}"
        for k, v in wanted.items()
        if v and facts.get(k) != v
    ]
    return f"the signed target facts differ ({'; '.join(wrong)})" if wrong else None


def ed25519_valid(pem: str, sig: bytes, message: bytes) -> bool:
    """An Ed25519 signature check: the `cryptography` package when this Python has it, else OpenSSL 3's
    `openssl pkeyutl -verify -rawin`; neither: RuntimeError (the node's finding: install one of them)."""
    try:
        from cryptography.exceptions import InvalidSignature
        from cryptography.hazmat.primitives.serialization import load_pem_public_key
    except ImportError:
        return openssl_valid(pem, sig, message)
    try:
        load_pem_public_key(pem.encode()).verify(sig, message)
    except InvalidSignature:
        return False
    return True


def openssl_valid(pem: str, sig: bytes, message: bytes) -> bool:
    if not shutil.which("openssl"):
        raise RuntimeError(
            "no Ed25519 verifier on this node: install the cryptography package for its python3, or OpenSSL 3"
        )
    with tempfile.TemporaryDirectory(prefix="apexkit-verify-") as tmp:
        files = {"pub.pem": pem.encode(), "sig.bin": sig, "msg.bin": message}
        for name, data in files.items():
            Path(tmp, name).write_bytes(data)
        argv = [
            "openssl",
            "pkeyutl",
            "-verify",
            "-pubin",
            "-inkey",
            "pub.pem",
            "-rawin",
            "-in",
            "msg.bin",
        ]
        proc = subprocess.run(
            [*argv, "-sigfile", "sig.bin"], cwd=tmp, capture_output=True, timeout=60
        )
    if proc.returncode not in (0, 1) or b"rawin" in proc.stderr:  # OpenSSL 1.1 has no -rawin
        raise RuntimeError(
            f"openssl cannot verify Ed25519 here: {tail(proc.stderr.decode(errors='replace'))}"
        )
    return proc.returncode == 0


def write_json(path: Path, data: dict) -> None:
    """Atomic: the report never reads half a file, whatever kills this node."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    with os.fdopen(fd, "w") as handle:
        handle.write(json.dumps(data, indent=1) + "\n")
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)


def driver_version() -> str | None:
    info = Path(targetenv.DRIVER_VERSION_INFO)
    if info.is_file():
        for line in info.read_text(errors="replace").splitlines():
            if line.lower().startswith("version="):
                return line.split("=", 1)[1].strip()
    if shutil.which("npu-smi"):
        out = subprocess.run(["npu-smi", "info"], capture_output=True, text=True, timeout=60).stdout
        found = re.search(r"Version:\s*([0-9][\w.\-]*)", out)
        if found:
            return found.group(1)
    return None


def chip_name() -> str | None:
    """The NPU's name from npu-smi (e.g. 910B3), else the CPU's model."""
    if shutil.which("npu-smi"):
        out = subprocess.run(["npu-smi", "info"], capture_output=True, text=True, timeout=60).stdout
        found = re.search(r"^\|\s*\d+\s+(\S+)\s*\|", out, re.M)
        if found:
            return found.group(1)
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        for line in cpuinfo.read_text(errors="replace").splitlines():
            if line.startswith("model name"):
                return "cpu: " + line.split(":", 1)[1].strip()
    return "cpu: " + (platform.processor() or platform.machine())


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--plan", required=True, help="the plan JSON written by invoke fleet.submit")
    args = p.parse_args(argv)
    plan = json.loads(Path(args.plan).read_text())
    node = Node(plan)
    try:
        node.logins = load_logins(plan)
        node.secrets = secrets_of(node.logins)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        node.stage(
            "credentials",
            False,
            0,
            f"the index logins cannot be read: {exc.__class__.__name__}",
            "resubmit from the submit host (invoke fleet.submit ... --resume with --index user:token@...)",
        )
        return node.finish("fail")
    try:
        base = expand_dir(plan.get("node_dir"), os.environ)
        base.mkdir(parents=True, exist_ok=True)
        work = Path(tempfile.mkdtemp(prefix=f"{node.name}-{node.job or 'job'}-", dir=base))
    except (OSError, ValueError) as exc:
        node.stage(
            "node dir",
            False,
            0,
            f"--node-dir {plan.get('node_dir') or '$TMPDIR/apexkit-fleet'}: {exc}",
            "pass --node-dir with a node-local directory this user can write (e.g. /tmp/apexkit-fleet)",
        )
        return node.finish("fail")

    def killed(
        signum, frame
    ):  # scancel / time limit: no result (the report shows the job's state), no scratch left
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, killed)
    if not plan.get("keep_venv"):
        node.cleanup = lambda: shutil.rmtree(work, ignore_errors=True)
    try:
        return node.main(work)
    except Exception as exc:  # an unexpected crash still leaves this node's row, with its cause
        node.stage(
            "fleet_node.py",
            False,
            0,
            f"{exc.__class__.__name__}: {exc}",
            "report this as an apexkit bug",
        )
        return node.finish("fail")
    finally:
        if (
            node.cleanup is not None
        ):  # killed before finish(): no result, but no scratch left either
            node.cleanup()


if __name__ == "__main__":
    sys.exit(main())
