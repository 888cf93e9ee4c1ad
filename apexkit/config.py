"""Where every source apexkit reaches comes from, configured once: one table of settings, each with its config key,
environment variable, flag and default, resolved flag > environment > project file > user file > default. Each
effective value knows where it came from (`Value.origin`), so the build plan, `doctor` and `apexkit config.show`
can say it.

Files (TOML, one flat table of the keys below; both optional):
  project  ./apexkit.toml in the current directory
  user     $XDG_CONFIG_HOME/apexkit/config.toml, else ~/.config/apexkit/config.toml

A config file is untrusted input: a symbolic link, a file another user can write, one over 64 KiB, a value of the
wrong type or an unknown key is refused in one line (the unknown key with the nearest known one). URLs are checked
by apexkit.urls and shown masked (apexkit.log.mask).
"""

from __future__ import annotations

import difflib
import os
import re
import stat
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from apexkit import log, untrusted, urls, vocab
from apexkit.errors import ConfigError

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python < 3.11: tomli, as for matrix.toml
    import tomli as tomllib

PROJECT_FILE = "apexkit.toml"
MAX_BYTES = 64 * 1024
FLAG, ENV, PROJECT, USER, DEFAULT = "flag", "env", "project", "user", "default"

# kinds: "url" an http(s) index; "git" a git URL (http(s), ssh, file, scp-like); "urls"/"dirs" lists; "dir" a
# directory; "registry" host[:port][/path] standing for a registry in image references; "mirror" an http(s) URL
# or file:// (uv's Python mirror); "text" a URL checked for characters only; "file"/"files" local file paths.


@dataclass(frozen=True)
class Setting:
    key: str  # the config file's key
    env: str  # the environment variable ("" when none)
    flag: str  # the command-line flag ("" when none), as the command that takes it spells it
    default: str  # "" when the tool's own default applies (pip's config)
    kind: str
    what: str  # what comes from it, one line (README "Behind a firewall", generated: nox -s docs)
    host: str  # the outside host it stands for (the same table)

    @property
    def is_list(self) -> bool:
        return self.kind in ("urls", "dirs", "files")


SETTINGS: tuple[Setting, ...] = (
    Setting(
        "ascend_apex_url",
        "APEXKIT_ASCEND_APEX_URL",
        "--ascend-apex-url",
        "matrix.toml [sources] ascend_apex_url",
        "git",
        "Ascend apex (git)",
        "gitcode.com",
    ),
    Setting(
        "nvidia_apex_url",
        "APEXKIT_NVIDIA_APEX_URL",
        "--nvidia-apex-url",
        "matrix.toml [sources] nvidia_apex_url",
        "git",
        "NVIDIA apex (git)",
        "github.com",
    ),
    Setting(
        "index_url",
        "PIP_INDEX_URL",
        "--index-url",
        "",
        "url",
        "torch, torch_npu, build deps; image.build's tool venv",
        "pypi.org (the package index)",
    ),
    Setting(
        "extra_index_urls",
        "PIP_EXTRA_INDEX_URL",
        "--extra-index-url",
        "",
        "urls",
        "more packages",
        "pypi.org (more indexes)",
    ),
    Setting(
        "torch_index_url",
        "APEXKIT_TORCH_INDEX_URL",
        "--torch-index-url",
        "",
        "url",
        "torch only (CPU builds: `https://download.pytorch.org/whl/cpu`)",
        "download.pytorch.org",
    ),
    Setting(
        "wheelhouses",
        "APEXKIT_WHEELHOUSE",
        "--wheelhouse",
        "",
        "dirs",
        "pip `--find-links` directories",
        "none (local wheels)",
    ),
    Setting(
        "team_indexes",
        "APEXKIT_INDEX",
        "--team-index",
        "",
        "urls",
        "built wheels (cache hits, `apexkit install`)",
        "your team index",
    ),
    Setting(
        "compile_cache",
        "APEXKIT_COMPILE_CACHE",
        "--compile-cache",
        "",
        "cache",
        "ccache's shared remote storage (`redis://host:port` or `http(s)://…`, read-only for CI; docs/building.md)",
        "your team's Redis or HTTP cache",
    ),
    Setting(
        "debian_mirror",
        "APEXKIT_DEBIAN_MIRROR",
        "",
        "http://deb.debian.org/debian",
        "text",
        "debootstrap bases (`image.build --base debootstrap:SUITE`)",
        "deb.debian.org",
    ),
    Setting(
        "quay_registry",
        "APEXKIT_QUAY_REGISTRY",
        "",
        "quay.io",
        "registry",
        "manylinux2014 bases (Python 3.8/3.10/3.12 images)",
        "quay.io",
    ),
    Setting(
        "docker_registry",
        "APEXKIT_DOCKER_REGISTRY",
        "",
        "docker.io",
        "registry",
        "openeuler, ubuntu, … bases",
        "Docker Hub",
    ),
    Setting(
        "uv_python_mirror",
        "UV_PYTHON_INSTALL_MIRROR",
        "",
        "https://github.com/astral-sh/python-build-standalone/releases/download",
        "mirror",
        "`image.build --pythons` (uv python install)",
        "github.com (python-build-standalone)",
    ),
    Setting(
        "signing_key",
        "",
        "",
        "",
        "file",
        "the Ed25519 key publish signs wheels with (CI: `APEXKIT_SIGNING_KEY_PEM` holds the PEM; docs/signing.md)",
        "none (a local key file)",
    ),
    Setting(
        "trusted_keys",
        "APEXKIT_TRUSTED_KEYS",
        "",
        "",
        "files",
        "the public keys a signed wheel must verify against (docs/signing.md)",
        "none (local key files)",
    ),
)
BY_KEY = {s.key: s for s in SETTINGS}


@dataclass(frozen=True)
class Value:
    key: str
    value: object  # str, or tuple[str, ...] for a list setting; "" / () when unset
    layer: str  # flag | env | project | user | default
    where: str = ""  # the flag, the variable or the file

    @property
    def origin(self) -> str:
        return f"{self.layer} {self.where}".strip()

    @property
    def text(self) -> str:
        """A single-valued setting's value ("" when unset)."""
        return self.value if isinstance(self.value, str) else ""

    @property
    def items(self) -> tuple[str, ...]:
        """A list setting's values (a single one as a 1-tuple; () when unset)."""
        if isinstance(self.value, tuple):
            return self.value
        return (self.value,) if isinstance(self.value, str) and self.value else ()

    @property
    def configured(self) -> bool:
        """Set by the user (any layer but the default)."""
        return self.layer != DEFAULT

    @property
    def told(self) -> str:
        """' (from project ./apexkit.toml)' when a project file set it (a cloned repository's file would redirect
        quietly otherwise: say it wherever the value takes effect), else the empty string."""
        return f" (from project {log.sanitise(self.where)})" if self.layer == PROJECT else ""

    def shown(self) -> str:
        """The value for a person: credentials masked, a list comma separated."""
        text = ", ".join(self.value) if isinstance(self.value, tuple) else str(self.value)
        return log.sanitise(log.mask(text))


def user_file(environ: Mapping[str, str] | None = None) -> Path:
    environ = os.environ if environ is None else environ
    base = environ.get("XDG_CONFIG_HOME") or ""
    root = Path(base) if base and os.path.isabs(base) else Path.home() / ".config"
    return root / "apexkit" / "config.toml"


def project_file(cwd: Path | None = None) -> Path:
    return (cwd or Path.cwd()) / PROJECT_FILE


def _nearest(key: str) -> str:
    near = difflib.get_close_matches(key, list(BY_KEY), n=1, cutoff=0.5)
    return f"did you mean {near[0]}?" if near else f"the keys: {', '.join(BY_KEY)}"


def read_file(path: Path, what: str) -> dict[str, object]:
    """A config file's table, checked: {} when there is none. Refused in one line: a symbolic link, not a regular
    file, writable by another user, over MAX_BYTES, not TOML, an unknown key, a value of the wrong type."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return {}
    except OSError as exc:
        raise ConfigError(
            f"{what} config {path}: {exc.strerror}", "fix its permissions or remove it"
        ) from None
    shown = untrusted.shown(str(path))
    if stat.S_ISLNK(st.st_mode):
        raise ConfigError(
            f"{what} config {shown} is a symbolic link; it is not read",
            "put the file itself there (cp --remove-destination TARGET FILE)",
        )
    try:  # one open (no link followed): the mode checked is the one of the file read, not of a swapped-in one
        fd = untrusted.open_regular(path, None)
        with os.fdopen(fd, "rb") as fh:
            st = os.fstat(fd)
            data = fh.read(MAX_BYTES + 1)
        if len(data) > MAX_BYTES:
            raise untrusted.Refused(str(path), "size", limit=MAX_BYTES)
    except untrusted.Refused as exc:
        raise ConfigError(
            f"{what} config {shown} {exc.why}",
            f"keep it a regular file under {MAX_BYTES >> 10} KiB",
        ) from None
    bad = untrusted.others_can_write(st)
    if bad:
        raise ConfigError(
            f"{what} config {shown} is {bad}: another user could change where apexkit fetches from",
            f"chmod go-w {shown} (and own it yourself)",
        )
    try:
        table = tomllib.loads(data.decode("utf-8"))
    except RecursionError:  # [[[...]]] thousands deep: no key takes more than a list of strings
        raise ConfigError(
            f"{what} config {shown} is nested too deeply to read",
            'write key = "value" or key = ["…", "…"] lines, nothing nested',
        ) from None
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        first = log.sanitise(str(exc).splitlines()[0] if str(exc) else "not TOML")[:120]
        raise ConfigError(
            f"{what} config {shown} is not valid TOML ({first})",
            f'write key = "value" lines ({vocab.command("config.show")} lists the keys)',
        ) from None
    out: dict[str, object] = {}
    for key, value in table.items():
        if key not in BY_KEY:
            raise ConfigError(
                f"{what} config {shown}: unknown key {untrusted.shown(key)}",
                f"{_nearest(key)} ({vocab.command('config.show')} lists them)",
            )
        out[key] = _typed(BY_KEY[key], value, f"{what} config {shown}: {key}")
    return out


def _typed(setting: Setting, value: object, what: str) -> object:
    """A file's value in the setting's type: a string, or for a list setting a string or a list of strings."""
    if setting.is_list:
        items = [value] if isinstance(value, str) else value
        if not isinstance(items, list) or not all(isinstance(v, str) for v in items):
            raise ConfigError(
                f"{what} is a {type(value).__name__}, not a string or a list of strings",
                f'write {setting.key} = ["…"]',
            )
        return tuple(check(setting, v, what) for v in items if v.strip())
    if not isinstance(value, str):
        raise ConfigError(
            f"{what} is a {type(value).__name__}, not a string", f'write {setting.key} = "…"'
        )
    return check(setting, value, what) if value.strip() else ""


_REGISTRY = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?(?::\d{1,5})?(?:/[a-z0-9._-]+)*")


def check(setting: Setting, value: str, what: str) -> str:
    """One value of `setting`, checked by its kind (apexkit.urls for URLs); returned stripped."""
    value = value.strip()
    urls.check_chars(value, what)
    kind = setting.kind
    if kind in ("url", "urls") and setting.key != "team_indexes":
        return urls.index_url(value, what)
    if setting.key == "team_indexes" and value.lower().startswith(("http://", "https://")):
        urls.index_url(
            value, what
        )  # a directory or file:// otherwise (apexkit.wheel.options.team_indexes)
    if value.startswith("-"):  # never an option to git, pip or debootstrap
        raise ConfigError(
            f"{what} {untrusted.shown(value)} starts with '-'",
            "write the URL itself (https://…, file://…)",
        )
    if kind == "cache":
        _compile_cache(value, what)
    if kind == "git" and value.lower().startswith(("http://", "https://")):
        urls.split(value, what, ("http", "https"), "https://git.example.com/ascend/apex.git")
    if kind == "mirror" and not value.lower().startswith("file://"):
        urls.split(
            value, what, ("http", "https"), "https://mirror.example.com/python-build-standalone"
        )
    if kind == "text" and value.lower().startswith(("http://", "https://")):
        urls.split(value, what, ("http", "https"), "http://mirror.example.com/debian")
    if kind == "registry":
        value = value.rstrip("/")
    if kind == "registry" and (not _REGISTRY.fullmatch(value) or ".." in value):
        raise ConfigError(
            f"{what} {untrusted.shown(value)} is not a registry prefix",
            "write host[:port][/path], no scheme, e.g. mirror.example.com:5000/quay",
        )
    return value


# ccache's remote storage attributes a compile_cache URL may carry (`|read-only`); its others (bearer-token ...) are
# refused: they would hold a secret that apexkit.log.mask does not know
CACHE_ATTRIBUTES = re.compile(r"read-only|(connect|operation)-timeout=\d{1,6}|layout=[a-z-]+")


def _compile_cache(value: str, what: str) -> None:
    """A ccache remote storage: redis:// or http(s):// URL, then `|attribute`s ccache knows and apexkit allows."""
    url, *attributes = value.split("|")
    urls.split(url, what, ("redis", "http", "https"), "redis://cache.example.com:6379")
    bad = next((a for a in attributes if not CACHE_ATTRIBUTES.fullmatch(a)), None)
    if bad is not None:
        raise ConfigError(
            f"{what}: the attribute {untrusted.shown(bad.split('=')[0])} is not one apexkit passes to ccache",
            "use read-only, connect-timeout=MS, operation-timeout=MS or layout=NAME, e.g. redis://host:6379|read-only",
        )


def _from_env(setting: Setting, raw: str) -> object:
    """An environment value as apexkit reads it today: a list setting split on whitespace (and commas for
    APEXKIT_INDEX, as the build always took it)."""
    if not setting.is_list:
        return raw.strip()
    sep = r"[\s,]+" if setting.key == "team_indexes" else r"\s+"
    return tuple(v for v in re.split(sep, raw) if v)


@dataclass(frozen=True)
class Config:
    """The two files, read and checked once; `get` resolves a key against flags and an environment."""

    project: dict[str, object]
    user: dict[str, object]
    project_path: Path
    user_path: Path

    def get(
        self,
        key: str,
        environ: Mapping[str, str] | None = None,
        flag: object = None,
        default: object = None,
    ) -> Value:
        """The effective value of `key`: `flag` (a non-empty value the command line gave), else the environment
        variable (a non-empty one: an empty variable counts as unset, as today), else the project file, else
        the user file, else `default` (or the table's default)."""
        setting = BY_KEY[key]
        environ = os.environ if environ is None else environ
        if flag not in (None, "", (), []):
            value = (
                tuple(str(f) for f in flag)  # type: ignore[attr-defined]
                if setting.is_list and not isinstance(flag, str)
                else flag
            )
            return Value(key, value, FLAG, setting.flag)
        if setting.env and environ.get(setting.env, "").strip():
            return Value(key, _from_env(setting, environ[setting.env]), ENV, setting.env)
        if key in self.project and self.project[key] not in ("", ()):
            return Value(key, self.project[key], PROJECT, str(self.project_path))
        if key in self.user and self.user[key] not in ("", ()):
            return Value(key, self.user[key], USER, str(self.user_path))
        if default is None:
            default = (
                ()
                if setting.is_list
                else ("" if setting.default.startswith("matrix") else setting.default)
            )
        return Value(key, default, DEFAULT)

    def all(
        self, environ: Mapping[str, str] | None = None, defaults: Mapping[str, object] | None = None
    ) -> list[Value]:
        return [self.get(s.key, environ, default=(defaults or {}).get(s.key)) for s in SETTINGS]


def load(environ: Mapping[str, str] | None = None, cwd: Path | None = None) -> Config:
    """Read and check the project and the user file (each optional)."""
    environ = os.environ if environ is None else environ
    project_path, user_path = project_file(cwd), user_file(environ)
    return Config(
        project=read_file(project_path, "project"),
        user=read_file(user_path, "user"),
        project_path=project_path,
        user_path=user_path,
    )


def told(key: str, values: Sequence[str], environ: Mapping[str, str] | None = None) -> str:
    """' (from project <path>)' when `values` are what the project file sets for `key` (no flag, no environment
    variable), else the empty string: for `install` and `up` to name the file that redirected them."""
    value = load(environ).get(key, environ)
    return value.told if list(value.items) == list(values) else ""


def effective_with(
    environ: Mapping[str, str] | None = None,
    defaults: Mapping[str, object] | None = None,
    cwd: Path | None = None,
) -> list[Value]:
    """Every setting's effective value (no flags: those belong to one command); `defaults`: the ones kept
    elsewhere (matrix.toml's git URLs)."""
    return load(environ, cwd).all(environ, defaults)


# --- registry prefixes for base images ----------------------------------------------------------------------------


def _registry_of(reference: str) -> tuple[str, str]:
    """('quay.io', 'pypa/manylinux2014_x86_64:tag') / ('docker.io', 'library/ubuntu:22.04'): the registry a
    reference names (Docker Hub when its first part is not a host) and the rest."""
    first, _, rest = reference.partition("/")
    if rest and ("." in first or ":" in first or first == "localhost"):
        if first in ("docker.io", "index.docker.io", "registry-1.docker.io"):
            return "docker.io", rest if "/" in rest else f"library/{rest}"
        return first, rest
    return "docker.io", reference if rest else f"library/{reference}"


def mirrored_base(
    reference: str, environ: Mapping[str, str] | None = None, cfg: Config | None = None
) -> tuple[str, Value | None]:
    """A base image reference with quay.io or Docker Hub replaced by the configured registry prefix; the Value
    that did it (None when the reference is left as it is)."""
    cfg = cfg or load(environ)
    registry, rest = _registry_of(reference)
    for key, default in (("quay_registry", "quay.io"), ("docker_registry", "docker.io")):
        if registry != default:
            continue
        value = cfg.get(key, environ)
        if value.configured and value.value != default:
            return f"{value.value}/{rest}", value
    return reference, None


# --- writing the user file (proxy.setup --write-config) -----------------------------------------------------------


def _toml_string(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def render(table: Mapping[str, object]) -> str:
    """A flat table as TOML, in SETTINGS order, with a header line."""
    lines = ["# apexkit sources (apexkit config.show prints the effective values and their origin)"]
    for setting in SETTINGS:
        if setting.key not in table:
            continue
        value = table[setting.key]
        if isinstance(value, (tuple, list)):
            lines.append(f"{setting.key} = [{', '.join(_toml_string(v) for v in value)}]")
        else:
            lines.append(f"{setting.key} = {_toml_string(str(value))}")
    return "\n".join(lines) + "\n"


def updated_file(path: Path, changes: Mapping[str, object], what: str = "user") -> bytes:
    """The config file's bytes with `changes` set: the file read and checked first (a link, another user's file or
    a bad key is refused before anything is written); the values checked too."""
    table = dict(read_file(path, what))
    for key, value in changes.items():
        table[key] = _typed(BY_KEY[key], list(value) if isinstance(value, tuple) else value, key)
    return render(table).encode()


# --- apexkit config.show ---------------------------------------------------------------------------------------


def rows(values: Sequence[Value]) -> list[dict[str, str]]:
    return [
        {
            "key": v.key,
            "value": v.shown(),
            "origin": log.sanitise(v.origin),
            "env": BY_KEY[v.key].env,
            "flag": BY_KEY[v.key].flag,
        }
        for v in values
    ]


def show(defaults: Mapping[str, object], as_json: bool = False) -> int:
    """`apexkit config.show`: each key, its effective value (credentials masked) and where it came from.
    `defaults`: the ones kept elsewhere (matrix.toml's git URLs), given by the command edge."""
    import json

    cfg = load()
    values = cfg.all(defaults=defaults)
    table = rows(values)
    if as_json:
        sys.stdout.write(
            json.dumps(
                {
                    "project_file": str(cfg.project_path),
                    "user_file": str(cfg.user_path),
                    "settings": table,
                },
                indent=1,
            )
            + "\n"
        )
        return 0
    log.out(f"project file: {cfg.project_path}{'' if cfg.project else ' (none)'}")
    log.out(f"user file:    {cfg.user_path}{'' if cfg.user else ' (none)'}")
    width = max(len(r["key"]) for r in table)
    for r in table:
        log.out(
            f"{r['key']:<{width}}  {r['value'] or '(unset: the tool default)'}  [{r['origin']}]"
        )
    return 0
