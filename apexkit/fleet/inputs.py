"""What a fleet run puts into its batch script and what it takes back from the nodes, checked.

- Every value that reaches the sbatch script (the placement, the node interpreter and scratch, the set_env files,
  the bench arguments, the target named by an index's index.json, node names read back for --resume) must match a
  strict pattern for its kind, and is shell-quoted as well; anything else is one ConfigError before anything is
  written or submitted.
- Index logins (user:token@ in --index, --find-links, --torch-index-url, --extra-index-url) are split off their
  URLs: what is written to the shared results directory, the script and the logs is the URL without them; the logins
  go to a 0600 file in a 0700 directory that each node reads into pip's environment (bench/fleet_node.py).
- A node's result file is untrusted: read with apexkit.untrusted's rules (regular file, no links, capped, never
  blocking on a FIFO), its fields type-checked, its name equal to the node it claims, its step time finite.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import stat
import urllib.parse
from pathlib import Path
from typing import Any

from apexkit import fsedit, log, untrusted, urls
from apexkit.errors import ConfigError

RESULT_MAX = 1 << 20  # bytes: a node's result is a few KiB
SMALL_MAX = 64 << 10  # a progress file, a job's node list
NODE_SCHEMA = "apexkit-fleet-node/"
CREDENTIALS_FORMAT = "apexkit-fleet-credentials/1"
PRIVATE = "private"  # <results>/.fleet/private/: 0700, the logins (0600)

_PATH = r"[A-Za-z0-9_./+@:,=~-]+"
# kind -> (pattern, what it is not, what to pass instead)
KINDS: dict[str, tuple[re.Pattern[str], str, str]] = {
    "partition": (
        re.compile(r"[A-Za-z0-9_.,-]{1,200}"),
        "a Slurm partition name",
        "pass a partition name like ascend (letters, digits, _ . , -)",
    ),
    "account": (
        re.compile(r"[A-Za-z0-9_.,-]{1,200}"),
        "a Slurm account name",
        "pass an account name like llm (letters, digits, _ . , -)",
    ),
    "time": (
        re.compile(r"(?:\d{1,5}-)?\d{1,6}(?::\d{1,2}){0,2}|INFINITE|UNLIMITED|infinite|unlimited"),
        "a Slurm time limit",
        "pass [D-]HH:MM:SS, e.g. 01:00:00",
    ),
    "gres": (
        re.compile(r"[A-Za-z0-9_:,.=-]{1,200}"),
        "a Slurm gres specification",
        "pass NAME[:TYPE]:COUNT, e.g. npu:8",
    ),
    "device": (
        re.compile(r"npu|cuda|cpu"),
        "one of npu, cuda, cpu",
        "pass --device npu (default), cuda or cpu",
    ),
    "node": (
        re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}"),
        "a Slurm node name",
        "pass node names like node01 (letters, digits, . _ -), comma separated",
    ),
    "target": (
        re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,199}"),  # images.container.TARGET_NAME
        "an apexkit target name",
        "pass --target py3.X-torchV-ARCH-REF as in the index's index.json (publish the index again if it "
        "lists such a name)",
    ),
    "path": (
        re.compile(_PATH),
        "a plain path (letters, digits and _ . / + @ : , = ~ -)",
        "pass a path without spaces, quotes, $ or line breaks",
    ),
    "node_dir": (
        re.compile(
            r"(?:[A-Za-z0-9_./+@:,=~-]|\$[A-Za-z_][A-Za-z0-9_]*|\$\{[A-Za-z_][A-Za-z0-9_]*(?::-"
            + _PATH
            + r")?\})+"
        ),
        "a node-local path (plain characters and $VAR / ${VAR} / ${VAR:-default}, expanded on the node)",
        "pass an absolute path like /tmp/apexkit-fleet or $TMPDIR/apexkit-fleet",
    ),
    "bench_arg": (
        re.compile(r"[A-Za-z0-9_.,:=+/@%-]{0,200}"),
        "a plain amp_bench.py argument",
        "pass arguments like '--scale 0.05' (letters, digits and _ . , : = + / @ % -)",
    ),
    "job": (
        re.compile(r"\d{1,20}(?:_\d{1,20})?"),
        "a Slurm job id",
        "use another --results directory (its fleet.json was edited by hand)",
    ),
    "sbatch": (
        re.compile(r"--[a-z][a-z-]{0,40}(?:=[A-Za-z0-9_.,:=/+-]{0,200})?"),
        "a plain sbatch option",
        "pass it as --name=value with plain characters",
    ),
}


def check(kind: str, value: object, option: str) -> str:
    """`value` when it matches its kind's pattern, else one ConfigError naming `option`."""
    pattern, noun, fix = KINDS[kind]
    if not isinstance(value, str) or not pattern.fullmatch(value):
        raise ConfigError(
            f"{option} {untrusted.shown(value)} is not {noun}", f"{fix}; nothing was submitted"
        )
    return value


def valid(kind: str, value: object) -> bool:
    return isinstance(value, str) and KINDS[kind][0].fullmatch(value) is not None


# --- logins ----------------------------------------------------------------------------------------------------------


def split_login(value: str, option: str) -> tuple[str, str | None]:
    """(the URL or path as written to shared files, the URL with its login or None). http(s) URLs are checked with
    apexkit.urls' rules; a path must be plain; a login anywhere but in an http(s) URL is refused."""
    raw = value.strip()
    urls.check_chars(raw, option)
    scheme = urllib.parse.urlsplit(raw).scheme.lower() if "://" in raw else ""
    if scheme in ("http", "https"):
        parts, _ = urls.split(raw, option, ("http", "https"), "https://host/simple/", "an index")
        userinfo, _, hostport = parts.netloc.rpartition("@")
        if not userinfo and "@" not in parts.netloc:
            return raw, None
        public = urllib.parse.urlunsplit(
            (parts.scheme, hostport, parts.path, parts.query, parts.fragment)
        )
        return public, raw
    if urls.has_userinfo(raw):
        raise ConfigError(
            f"{option} {urls.shown(raw)}: a user name, password or token is only accepted in an http(s) URL",
            "drop it (a path or file:// URL needs none); nothing was submitted",
        )
    if scheme and scheme != "file":
        raise ConfigError(
            f"{option} {urls.shown(raw)}: {scheme}:// is not something the nodes' pip reads",
            "pass a path on shared storage or an http(s) URL",
        )
    check("path", raw[len("file://") :] if scheme == "file" else raw, option)
    return raw, None


def with_login(url: str | None, logins: dict[str, str]) -> str | None:
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


def shown_url(url: str, logins: dict[str, str]) -> str:
    """What may be printed of a URL: its login masked (user:***@host)."""
    return log.mask(with_login(url, logins) or url)


def private_dir(fleet: Path) -> Path:
    """<fleet>/private/, a real directory of ours, mode 0700 (whatever the umask or who made it first)."""
    path = fleet / PRIVATE
    fleet.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileExistsError):
        os.mkdir(path, 0o700)
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
        raise ConfigError(
            f"{path} is not a directory of yours (a link, a file or another user's)",
            "remove it, or use another --results directory; nothing was submitted",
        )
    os.chmod(path, 0o700)
    return path


def write_logins(path: Path, logins: dict[str, str]) -> None:
    private_dir(path.parent.parent)
    data = {"format": CREDENTIALS_FORMAT, "logins": [[k, v] for k, v in logins.items()]}
    fsedit.atomic_write(path, fsedit.dump_json(data), 0o600)


def read_logins(path: Path) -> dict[str, str]:
    """The logins an earlier submission wrote (for --resume): our own 0600 file, or one ConfigError."""
    fix = "pass --index (and the other URLs) with their user:token@ again, with --resume"
    try:
        fd = untrusted.open_regular(path)
        with os.fdopen(fd, "rb") as fh:
            st = os.fstat(fh.fileno())
            if st.st_uid != os.geteuid() or st.st_mode & 0o077:
                raise ConfigError(
                    f"{path} is not a private file of yours (mode {stat.S_IMODE(st.st_mode):o})",
                    fix,
                )
            data = json.loads(fh.read(SMALL_MAX + 1).decode("utf-8"))
        pairs = data.get("logins") if isinstance(data, dict) else None
        if not isinstance(pairs, list) or data.get("format") != CREDENTIALS_FORMAT:
            raise ValueError("not an apexkit fleet credentials file")
        out = {}
        for pair in pairs:
            if not (
                isinstance(pair, list) and len(pair) == 2 and all(isinstance(x, str) for x in pair)
            ):
                raise ValueError("a login is not a [url, url] pair")
            out[pair[0]] = pair[1]
        return out
    except (untrusted.Untrusted, OSError, ValueError, KeyError, RecursionError) as exc:
        raise ConfigError(
            f"the index logins of the last submission cannot be read ({log.sanitise(str(exc))[:200]})",
            fix,
        ) from None


# --- what the nodes wrote ------------------------------------------------------------------------------------------


class Unreadable(Exception):
    """A node's file is not what it claims to be; the message says why (one line, foreign text escaped)."""


_TEXT_FIELDS = (
    "hostname",
    "chip",
    "driver",
    "cann",
    "torch",
    "torch_npu",
    "job_id",
    "set_env",
    "arch",
)


def _text(data: dict, key: str, limit: int = 300) -> str | None:
    value = data.get(key)
    if value is None:
        return None
    if not isinstance(value, str) or len(value) > limit:
        raise Unreadable(f"{key} is not a short text ({untrusted.shown(value)[:40]})")
    return value


def _finite(value: object, key: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise Unreadable(f"{key} is not a finite number ({untrusted.shown(str(value))[:40]})")
    if value < 0:
        raise Unreadable(f"{key} is negative ({value})")
    return float(value)


def read_result(path: Path) -> dict:
    """A node's `<node>.json`, checked: the fields the report shows, typed; else Unreadable with the reason."""
    data = _load_result(path)
    out: dict[str, Any] = {"node": _node_of(data, path), "verdict": data.get("verdict")}
    if out["verdict"] not in ("ok", "fail", None):
        raise Unreadable(f"verdict {untrusted.shown(out['verdict'])[:40]} is not ok or fail")
    for key in _TEXT_FIELDS:
        out[key] = _text(data, key)
    sha = _object(data, "wheel").get("sha256")
    if sha is not None and not (isinstance(sha, str) and re.fullmatch(r"[0-9a-f]{64}", sha)):
        raise Unreadable(f"wheel.sha256 {untrusted.shown(sha)[:40]} is not a sha256")
    out["wheel_sha256"] = sha
    out["step_ms"] = _finite(_object(data, "bench").get("step_ms"), "bench.step_ms")
    failure = _object(data, "first_failure")
    out["first_failure"] = (
        {k: _text(failure, k, 4000) or "" for k in ("check", "detail", "fix")} if failure else None
    )
    return out


def _load_result(path: Path) -> dict:
    try:
        return untrusted.read_json_object(path, None, RESULT_MAX)
    except untrusted.Refused as exc:
        raise Unreadable(f"{path.name} {exc.why}") from None
    except RecursionError:
        raise Unreadable(f"{path.name} is not JSON (nested too deeply)") from None
    except (untrusted.Untrusted, OSError, UnicodeError) as exc:
        raise Unreadable(log.sanitise(str(exc) or type(exc).__name__)[:200]) from None


def _node_of(data: dict, path: Path) -> str:
    """The node a result is of: a fleet node result, of the node its file is named after."""
    schema = data.get("schema")
    if not isinstance(schema, str) or not schema.startswith(NODE_SCHEMA):
        raise Unreadable(
            f"not an apexkit fleet node result (schema {untrusted.shown(schema)[:40]})"
        )
    node = data.get("node")
    if node != path.stem:
        raise Unreadable(f"{path.name} claims to be node {untrusted.shown(node)[:60]}")
    if not valid("node", node):
        raise Unreadable(f"{untrusted.shown(node)[:60]} is not a Slurm node name")
    return path.stem


def _object(data: dict, key: str) -> dict:
    value = data.get(key)
    if value is not None and not isinstance(value, dict):
        raise Unreadable(f"{key} is not an object")
    return value or {}


def read_small_json(path: Path) -> dict:
    """A progress file: {} when missing or not a plain small JSON object."""
    try:
        return untrusted.read_json_object(path, None, SMALL_MAX)
    except (untrusted.Untrusted, OSError, RecursionError, UnicodeError):
        return {}


def read_node_names(path: Path) -> list[str] | None:
    """A job's node list (`scontrol show hostnames`, one a line): None when missing or unreadable; names that are
    not node names are dropped with a warning."""
    try:
        text = untrusted.read_regular(path, None, SMALL_MAX).decode("utf-8")
    except (untrusted.Untrusted, OSError, UnicodeError):
        return None
    names = [line.strip() for line in text.splitlines() if line.strip()]
    bad = [n for n in names if not valid("node", n)]
    if bad:
        log.warn(
            f"{path}: ignored {len(bad)} line(s) that are not node names ({untrusted.shown(bad[0])[:60]})"
        )
    return [n for n in names if n not in bad]
