"""Proxies (and their fallbacks: mirrors, a corporate CA) in all three layers that need them.

    shell      a managed block in ~/.bashrc (or --profile, or /etc/profile.d with --system): curl, git, pip
    daemon     systemd drop-ins docker.service.d/http-proxy.conf + https-proxy.conf, or daemon.json "proxies"
               (Docker >= 23): image pulls -- the daemon is a service and never sees the shell's variables
    container  ~/.docker/config.json "proxies.default": `docker run` / `docker build` steps (pip, apt inside)
    pip        a pip index mirror in pip.conf, for the no-proxy path (registry mirrors go to daemon.json)

`setup` describes the whole wanted state of the layers it is given: a file apexkit wrote before and that the new
settings no longer need is undone. Every write goes through `fsedit` (diffs, preflight, atomic, backups).
Credentials are masked in every output; files that hold them are 0600.
"""

from __future__ import annotations

import dataclasses
import functools
import ipaddress
import os
import re
import shlex
import shutil
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit

from apexkit import fsedit, log, netenv, urls, vocab
from apexkit.errors import ApexkitError, ConfigError, EnvironmentSetupError

OWNER = "proxy"
LAYERS = ("shell", "daemon", "container", "pip")
DEFAULT_NO_PROXY = ("localhost", "127.0.0.0/8", "::1")
PROXY_SCHEMES = ("http", "https", "socks5", "socks5h", "socks4")
DAEMON_MODES = ("auto", "systemd", "daemon-json")
SYSTEM_CA_BUNDLES = (
    "/etc/ssl/certs/ca-certificates.crt",
    "/etc/pki/tls/certs/ca-bundle.crt",
    "/etc/ssl/ca-bundle.pem",
    "/etc/ssl/cert.pem",
)
CONTAINER_CA_PATH = "/etc/ssl/certs/apexkit-ca-bundle.pem"
BLOCK = fsedit.Block("apexkit proxy")
BLOCK_COMMENT = "managed by `invoke proxy.setup`; `invoke proxy.remove` takes it out again"
FILE_HEADER = "# managed by apexkit (`invoke proxy.setup`); `invoke proxy.remove` deletes it\n"
DAEMON_JSON_MIN_VERSION = (23, 0)

# ---------------------------------------------------------------------------------------------------------------
# Settings
# ---------------------------------------------------------------------------------------------------------------


def parse_proxy_url(value: str, option: str) -> str:
    """Validate and normalise a proxy URL: scheme (http:// added when missing), host, port; credentials kept.
    An error quotes only the scheme and host (see `urls`)."""
    return urls.proxy_url(value, option, PROXY_SCHEMES)


def merge_no_proxy(*sources: str | Sequence[str] | None) -> tuple[str, ...]:
    """localhost, 127.0.0.0/8 and ::1 first, then every other entry once, in the order given."""
    seen: dict[str, str] = {}
    for source in (DEFAULT_NO_PROXY, *sources):
        if not source:
            continue
        for item in re.split(r"[,\s]+", source) if isinstance(source, str) else source:
            item = item.strip()
            if item and item.lower() not in seen:
                if re.search(r"[\x00-\x1f\x7f-\x9f\"'\\]", item):
                    raise ConfigError(
                        f"--no-proxy entry {log.sanitise(item)!r} holds a control character or a quote",
                        "use entries like .corp.example.com,10.0.0.0/8",
                    )
                if "://" in item or ("/" in item and not _is_cidr(item)):
                    raise ConfigError(
                        f"--no-proxy entry {item!r} is not a host, domain, IP or CIDR",
                        "use entries like .corp.example.com,10.0.0.0/8",
                    )
                seen[item.lower()] = item
    return tuple(seen.values())


def _is_cidr(item: str) -> bool:
    try:
        ipaddress.ip_network(item, strict=False)
        return True
    except ValueError:
        return False


def host_port(url: str | None) -> str:
    if not url:
        return ""
    parts = urlsplit(url if "://" in url else "http://" + url)
    try:
        port = parts.port
    except ValueError:
        port = None
    return f"{parts.hostname}:{port}" if parts.hostname else ""


@dataclass(frozen=True)
class ProxySettings:
    http: str | None = None
    https: str | None = None
    no_proxy: tuple[str, ...] = DEFAULT_NO_PROXY
    ca_bundle: str | None = None  # the bundle apexkit exports (system CAs + the corporate CA)
    pip_index: str | None = None
    registry_mirrors: tuple[str, ...] = ()

    @property
    def no_proxy_text(self) -> str:
        return ",".join(self.no_proxy)

    def environment(self) -> dict[str, str]:
        """The variables for a shell or a container, lower and upper case (tools disagree on which they read)."""
        env = netenv.proxy_environment(
            self.http, self.https, self.no_proxy_text if self.http or self.https else None
        )
        if self.ca_bundle:
            env.update(dict.fromkeys(netenv.CA_VARIABLES, self.ca_bundle))
        return env

    def to_json(self) -> dict:
        return {
            **asdict(self),
            "no_proxy": list(self.no_proxy),
            "registry_mirrors": list(self.registry_mirrors),
        }

    def validated(self) -> ProxySettings:
        """The same settings, each URL through the one validator (saved settings are read back from a file)."""
        return make_settings(
            http=self.http,
            https=self.https,
            no_proxy=",".join(self.no_proxy),
            ca_bundle=self.ca_bundle,
            pip_index=self.pip_index,
            registry_mirrors=self.registry_mirrors,
            environ={},
        )


def _from_environment(environ: Mapping[str, str], name: str) -> str | None:
    lower, upper = netenv.cases(environ, name)
    if lower and upper and lower != upper:
        log.warn(
            f"{name} and {name.upper()} differ in this environment; using {name} (lower case, as curl does)"
        )
    return netenv.proxy(environ, name)


def make_settings(
    http: str | None = None,
    https: str | None = None,
    no_proxy: str | None = None,
    ca_bundle: str | None = None,
    pip_index: str | None = None,
    registry_mirrors: Sequence[str] = (),
    environ: Mapping[str, str] | None = None,
) -> ProxySettings:
    """Options first, then the current environment (lower case wins, as in curl); https defaults to http."""
    environ = os.environ if environ is None else environ
    http_value = http or _from_environment(environ, "http_proxy")
    env_https = None if https else _from_environment(environ, "https_proxy")
    https_value = https or env_https or http_value
    http_option = "--http" if http else "http_proxy (from the environment)"
    https_option = (
        "--https" if https else "https_proxy (from the environment)" if env_https else http_option
    )
    http_url = parse_proxy_url(http_value, http_option) if http_value else None
    https_url = parse_proxy_url(https_value, https_option) if https_value else None
    if not http_url and not https_url and not pip_index and not registry_mirrors:
        raise ConfigError(
            "no proxy given and none set in this environment (http_proxy/https_proxy)",
            "pass --http http://proxy:3128 (or --pip-index / --registry-mirror for the no-proxy path)",
        )
    return ProxySettings(
        http=http_url,
        https=https_url,
        no_proxy=merge_no_proxy(
            no_proxy if no_proxy is not None else _from_environment(environ, "no_proxy")
        ),
        ca_bundle=ca_bundle,
        pip_index=urls.index_url(pip_index, "--pip-index") if pip_index else None,
        registry_mirrors=tuple(
            urls.registry_mirror(m, "--registry-mirror") for m in registry_mirrors
        ),
    )


def shell_exports(env: Mapping[str, str]) -> str:
    return "".join(f"export {name}={shlex.quote(value)}\n" for name, value in env.items())


# ---------------------------------------------------------------------------------------------------------------
# Where things live
# ---------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Paths:
    """Every path a layer touches; with --root, all of them (home included) live under that directory."""

    root: Path = Path("/")
    environ: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))
    profile: str | None = None
    system: bool = False

    @property
    def home(self) -> str:
        return self.environ.get("HOME") or str(Path.home())

    def real(self, display: str) -> Path:
        return self.root / display.lstrip("/") if str(self.root) != "/" else Path(display)

    def _config_home(self) -> str:
        return self.environ.get("XDG_CONFIG_HOME") or f"{self.home}/.config"

    @property
    def shell_profile(self) -> str:
        if self.profile:
            return (
                str(Path(self.profile).expanduser().absolute())
                if str(self.root) == "/"
                else self.profile
            )
        return "/etc/profile.d/apexkit-proxy.sh" if self.system else f"{self.home}/.bashrc"

    dropin_dir = "/etc/systemd/system/docker.service.d"
    daemon_json = "/etc/docker/daemon.json"

    @property
    def dropins(self) -> dict[str, str]:
        return {
            "http": f"{self.dropin_dir}/http-proxy.conf",
            "https": f"{self.dropin_dir}/https-proxy.conf",
        }

    @property
    def docker_config(self) -> str:
        return f"{self.environ.get('DOCKER_CONFIG') or self.home + '/.docker'}/config.json"

    @property
    def pip_conf(self) -> str:
        return "/etc/pip.conf" if self.system else f"{self._config_home()}/pip/pip.conf"

    @property
    def state_dir(self) -> str:
        return f"{self._config_home()}/apexkit"

    @property
    def settings_file(self) -> str:
        return f"{self.state_dir}/proxy.json"

    @property
    def ca_bundle(self) -> str:
        return f"{self.state_dir}/ca-bundle.pem"

    def managed(self) -> dict[str, str]:
        """Every file a layer may write, as the user knows it -> its layer. Undo records name files by these display
        names; the real path is always derived from here (and --root), never read back from a record."""
        return {
            self.shell_profile: "shell",
            **dict.fromkeys(self.dropins.values(), "daemon"),
            self.daemon_json: "daemon",
            self.docker_config: "container",
            self.pip_conf: "pip",
            self.settings_file: "state",
            self.ca_bundle: "state",
        }

    @property
    def within(self) -> Path | None:
        """The tree a symbolic link may lead into: the --root (None: the whole system)."""
        return None if str(self.root) == "/" else self.root

    def in_home(self, display: str) -> bool:
        """Whether `display` is a file of the home's owner in that home: its path (with '..' taken out) lies in the
        home, and its real path (links followed) in the real home -- or, through the owner's own link, in a folder
        of that owner (a dotfiles checkout elsewhere). A root-made link out of the home does not count."""
        home, name = os.path.normpath(self.home), os.path.normpath(display)
        if (
            not self.home.startswith("/")
            or home == "/"
            or not (name == home or name.startswith(home + "/"))
        ):
            return False
        real_home = Path(os.path.realpath(self.real(home)))
        real = Path(os.path.realpath(self.real(name)))
        return (
            real == real_home
            or real_home in real.parents
            or ((owner := self.home_owner()) is not None and fsedit.nearest_owner(real) == owner[0])
        )

    def home_owner(self) -> tuple[int, int] | None:
        """(uid, gid) of the home when it is not root's: what root creates there is given to them (sudo -E)."""
        try:
            st = os.stat(self.real(self.home))
        except OSError:
            return None
        return (st.st_uid, st.st_gid) if st.st_uid != 0 else None

    def backups(self) -> fsedit.BackupStore:
        managed = self.managed()
        private = {
            self.docker_config,
            self.settings_file,
        }  # they hold credentials whatever the settings
        return fsedit.BackupStore(
            self.real(f"{self.state_dir}/backups"),
            resolve=lambda display: self.real(display) if display in managed else None,
            private=lambda display: display in private,
            home_owner=self.home_owner() if self.in_home(self.state_dir) else None,
            in_home=self.in_home,
            within=self.within,
        )

    def layer_of(self, display: str) -> str:
        """The layer that writes `display`; "" for a file no layer manages."""
        return self.managed().get(display, "")


# ---------------------------------------------------------------------------------------------------------------
# Docker daemon specifics
# ---------------------------------------------------------------------------------------------------------------


def engine_version() -> tuple[int, int] | None:
    """The installed Docker engine's version (dockerd --version works while the daemon is down)."""
    for command in (
        ["dockerd", "--version"],
        ["docker", "version", "--format", "{{.Server.Version}}"],
    ):
        if shutil.which(command[0]) is None:
            continue
        try:
            out = subprocess.run(command, capture_output=True, text=True, timeout=20).stdout
        except (OSError, subprocess.SubprocessError):
            continue
        match = re.search(r"(\d+)\.(\d+)", out)
        if match:
            return int(match[1]), int(match[2])
    return None


def resolve_daemon_mode(mode: str, version: tuple[int, int] | None) -> tuple[str, str]:
    """(mode, why). daemon.json "proxies" needs Docker >= 23; drop-ins work with any version under systemd."""
    if mode not in DAEMON_MODES:
        raise ConfigError(
            f"--daemon-mode {mode!r} is not one of {', '.join(DAEMON_MODES)}",
            "use auto, systemd or daemon-json",
        )
    if mode != "auto":
        if mode == "daemon-json" and version and version < DAEMON_JSON_MIN_VERSION:
            raise ConfigError(
                f'daemon.json "proxies" needs Docker >= 23; this engine is {version[0]}.{version[1]}',
                "use --daemon-mode systemd (drop-ins) or upgrade Docker",
            )
        return mode, "chosen with --daemon-mode"
    if version is None:
        return "systemd", "no Docker engine found: systemd drop-ins work with every version"
    if version >= DAEMON_JSON_MIN_VERSION:
        return "daemon-json", f"Docker {version[0]}.{version[1]} reads proxies from daemon.json"
    return (
        "systemd",
        f"Docker {version[0]}.{version[1]} < 23 takes proxies only from its environment",
    )


def systemd_running() -> bool:
    return Path("/run/systemd/system").is_dir()


def render_dropin(variables: Mapping[str, str]) -> bytes:
    # In unit files "%" starts a specifier and the value sits in double quotes: a percent-encoded password
    # (p%40ss) would be mangled without the quoting.
    quoted = {
        name: value.replace("\\", "\\\\").replace('"', '\\"').replace("%", "%%")
        for name, value in variables.items()
    }
    lines = [
        FILE_HEADER.rstrip("\n"),
        "[Service]",
        *(f'Environment="{name}={value}"' for name, value in quoted.items()),
    ]
    return ("\n".join(lines) + "\n").encode()


def dropin_environment(text: str) -> dict[str, str]:
    """The environment a systemd drop-in gives the service (what dockerd will see)."""
    env: dict[str, str] = {}
    for line in text.splitlines():
        match = re.match(r"^\s*Environment\s*=\s*(.*)$", line)
        if not match:
            continue
        for item in re.findall(r'"((?:[^"\\]|\\.)*)"|(\S+)', match[1]):
            assignment = re.sub(r"\\(.)", r"\1", item[0] or item[1]).replace("%%", "%")
            name, _, value = assignment.partition("=")
            env[name] = value
    return env


def daemon_environment(paths: Paths) -> dict[str, str]:
    """The proxy environment our drop-ins give dockerd (empty when none are written)."""
    env: dict[str, str] = {}
    for display in paths.dropins.values():
        env.update(dropin_environment(fsedit.decode(_peek(paths, display))))
    return env


# ---------------------------------------------------------------------------------------------------------------
# Planning: the wanted content of every file
# ---------------------------------------------------------------------------------------------------------------


def _has_userinfo(*values: str | None) -> bool:
    return any(urls.has_userinfo(u) for u in values)


_MISSING = object()


def _get_path(data: dict, key_path: tuple[str, ...]):
    for key in key_path:
        if not isinstance(data, dict) or key not in data:
            return _MISSING
        data = data[key]
    return data


def _set_path(data: dict, key_path: Sequence[str], value) -> None:
    """Set a nested key; with _MISSING, delete it and drop the parents that became empty."""
    key, *rest = key_path
    if not rest:
        if value is _MISSING:
            data.pop(key, None)
        else:
            data[key] = value
        return
    if not isinstance(data.get(key), dict):
        if value is _MISSING:
            return
        data[key] = {}
    _set_path(data[key], rest, value)
    if not data[key]:
        data.pop(key)


def _undo(paths: Paths, display: str, current: bytes, original: bytes | None, record: dict):
    """Undo for a file edited since apexkit wrote it: only apexkit's part goes (the shell block; the JSON keys and
    pip.conf keys apexkit manages, back to their original values or away); a file of apexkit's own goes back whole.
    A file left empty that did not exist before is deleted (None)."""
    layer = paths.layer_of(display)
    if layer == "shell":
        text = BLOCK.strip(fsedit.decode(current), record.get("added_newline", False), display)
        return None if not text and original is None else fsedit.encode(text)
    if layer == "pip":
        text, old = fsedit.decode(current), fsedit.decode(original)
        for key in ("index-url", "trusted-host"):
            text = fsedit.ini_set(text, "global", key, fsedit.ini_get(old, "global", key))
        empty = not re.sub(r"\[global\]\s*", "", text).strip()  # nothing but our section's header
        return None if empty and original is None else fsedit.encode(text)
    json_keys: dict[str, list[tuple[str, ...]]] = {
        paths.daemon_json: [("proxies",), ("registry-mirrors",)],
        paths.docker_config: [("proxies", "default")],
    }
    keys = json_keys.get(display)
    if keys is None:
        return original
    now = fsedit.load_json_object(Path(display), display, current)
    before = fsedit.load_json_object(Path(display), display, original)
    for key_path in keys:
        _set_path(now, key_path, _get_path(before, key_path))
    return (
        None
        if not now and original is None
        else fsedit.dump_json(now, 2 if display == paths.daemon_json else "\t")
    )


def _change(
    paths: Paths,
    display: str,
    new: bytes | None,
    secret: bool = False,
    note: str = "",
    mode: int | None = None,
    extra: dict | None = None,
) -> fsedit.Change:
    """The change of one layer file: 0600 when it holds credentials, else the mode it has (new: 0644)."""
    if mode is None:
        current = fsedit.file_mode(paths.real(display))
        mode = 0o600 if secret else 0o644 if current is None else current
    return fsedit.Change(
        display,
        paths.real(display),
        new,
        mode=mode,
        note=note or ("holds credentials: 0600" if secret else ""),
        extra=extra or {},
        within=paths.within,
        # as root, a new file (and its new folders) in a user's home is theirs; elsewhere root's
        new_owner=paths.home_owner() if paths.in_home(display) else None,
    )


def _read(paths: Paths, display: str) -> bytes | None:
    """A layer's file as it is now (through a symbolic link), checked as a write would check it before a byte is
    read: a link out of --root or (as root) into somebody else's files, a directory, a named pipe, a device, a
    file over 16 MiB or an unreadable file is one line."""
    real = paths.real(display)
    return fsedit.read_target(fsedit.write_target(real, display, paths.within), display)


def _read_json(paths: Paths, display: str) -> dict:
    return fsedit.load_json_object(paths.real(display), display, _read(paths, display))


def plan_shell(settings: ProxySettings, paths: Paths, mode: str) -> list[fsedit.Change]:
    display = paths.shell_profile
    current = fsedit.decode(_read(paths, display))
    env = settings.environment()
    if not env:
        return []
    appended = BLOCK.find(current, display) is None
    text, added_newline = BLOCK.put(
        current, BLOCK.render(shell_exports(env).splitlines(), BLOCK_COMMENT), display
    )
    # whether a newline was added before the block is known only when it is appended: a block replaced in place
    # keeps what the record says
    extra = {"added_newline": added_newline} if appended else {}
    return [
        _change(
            paths,
            display,
            fsedit.encode(text),
            _has_userinfo(settings.http, settings.https, settings.pip_index),
            extra=extra,
        )
    ]


def plan_daemon(settings: ProxySettings, paths: Paths, mode: str) -> list[fsedit.Change]:
    secret = _has_userinfo(settings.http, settings.https)
    changes = [
        _change(
            paths,
            display,
            render_dropin({f"{kind.upper()}_PROXY": url, "NO_PROXY": settings.no_proxy_text}),
            secret,
            mode=0o600 if secret else 0o644,
        )
        for kind, display in paths.dropins.items()
        if mode == "systemd" and (url := getattr(settings, kind))
    ]
    json_proxies = mode == "daemon-json" and bool(settings.http or settings.https)
    if json_proxies or settings.registry_mirrors:
        data = _read_json(paths, paths.daemon_json)
        if json_proxies:
            given = (("http-proxy", settings.http), ("https-proxy", settings.https))
            data["proxies"] = {**{k: v for k, v in given if v}, "no-proxy": settings.no_proxy_text}
        if settings.registry_mirrors:
            data["registry-mirrors"] = list(settings.registry_mirrors)
        changes.append(
            _change(paths, paths.daemon_json, fsedit.dump_json(data), secret and json_proxies)
        )
    return changes


def plan_container(settings: ProxySettings, paths: Paths, mode: str) -> list[fsedit.Change]:
    if not (settings.http or settings.https):
        return []
    data = _read_json(paths, paths.docker_config)
    given = (("httpProxy", settings.http), ("httpsProxy", settings.https))
    proxies = found if isinstance(found := data.get("proxies"), dict) else {}
    data["proxies"] = {
        **proxies,
        "default": {**{k: v for k, v in given if v}, "noProxy": settings.no_proxy_text},
    }
    # the docker CLI writes config.json 0600 with tab indentation; keep both
    new = fsedit.dump_json(data, "\t")
    return [
        _change(paths, paths.docker_config, new, note="0600, like the docker CLI's own", mode=0o600)
    ]


def plan_pip(settings: ProxySettings, paths: Paths, mode: str) -> list[fsedit.Change]:
    if not settings.pip_index:
        return []
    text = fsedit.decode(_read(paths, paths.pip_conf))
    text = fsedit.ini_set(text, "global", "index-url", settings.pip_index)
    parts = urlsplit(settings.pip_index)
    if parts.scheme == "http":  # pip refuses plain-http indexes unless the host is trusted
        text = fsedit.ini_set(text, "global", "trusted-host", parts.hostname)
    return [_change(paths, paths.pip_conf, fsedit.encode(text), _has_userinfo(settings.pip_index))]


PLANNERS = {
    "shell": plan_shell,
    "daemon": plan_daemon,
    "container": plan_container,
    "pip": plan_pip,
}


def state_layers(
    settings: ProxySettings, paths: Paths, layers: Sequence[str], daemon_mode: str
) -> dict[str, SavedLayer]:
    """The settings of every layer after this run: the layers it is given get these settings (or none, when the
    settings give them nothing to write), every other layer keeps the settings of the run that set it up."""
    saved = {name: entry for name, entry in load_saved(paths).items() if name not in layers}
    proxied = bool(settings.http or settings.https)
    uses = {
        "shell": bool(settings.environment()),
        "daemon": proxied or bool(settings.registry_mirrors),
        "container": proxied,
        "pip": bool(settings.pip_index),
    }
    for layer in (layer for layer in layers if uses[layer]):
        saved[layer] = SavedLayer(
            settings,
            daemon_mode if layer == "daemon" else None,
            paths.shell_profile if layer == "shell" else None,
        )
    return {name: saved[name] for name in LAYERS if name in saved}


def _settings_change(paths: Paths, saved: Mapping[str, SavedLayer]) -> fsedit.Change:
    state = {"version": 2, "layers": {name: entry.to_json() for name, entry in saved.items()}}
    return _change(
        paths,
        paths.settings_file,
        fsedit.dump_json(state),
        note="holds the settings: 0600",
        mode=0o600,
    )


def build_ca_bundle(ca_cert: str, system_bundles: Sequence[str] = SYSTEM_CA_BUNDLES) -> bytes:
    """The system's CA bundle plus the given certificate(s), each certificate once."""
    try:  # a regular file of at most 16 MiB, read without blocking (not a named pipe, not /dev/zero)
        data = fsedit.read_regular(
            Path(ca_cert).expanduser(),
            f"--ca-cert {ca_cert}",
            ConfigError,
            "pass the PEM file of your proxy's CA",
        )
        if data is None:
            raise FileNotFoundError(ca_cert)
        extra = data.decode()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(
            f"--ca-cert {ca_cert}: cannot read it ({exc.__class__.__name__})",
            "pass the PEM file of your proxy's CA",
        ) from None
    pem = re.compile(r"-----BEGIN CERTIFICATE-----\s.*?-----END CERTIFICATE-----", re.S)
    certificates = pem.findall(extra)
    if not certificates:
        raise ConfigError(
            f"--ca-cert {ca_cert} holds no PEM certificate (-----BEGIN CERTIFICATE-----)",
            "export the CA as PEM (openssl x509 -inform der -in ca.cer -out ca.pem)",
        )
    system = next((Path(b) for b in system_bundles if Path(b).is_file()), None)
    existing = pem.findall(system.read_text()) if system else []
    # each certificate once
    return ("\n".join(dict.fromkeys([*existing, *certificates])) + "\n").encode()


@dataclass
class Plan:
    settings: ProxySettings
    paths: Paths
    layers: tuple[str, ...]
    daemon_mode: str
    daemon_mode_why: str
    changes: list[fsedit.Change]
    stale: list[fsedit.Change]  # files apexkit wrote before that these settings no longer need

    @property
    def all_changes(self) -> list[fsedit.Change]:
        return [*self.changes, *self.stale]


def _stale_changes(paths: Paths, layers: Sequence[str], wanted: set[str]) -> list[fsedit.Change]:
    """Files of the selected layers that an earlier setup wrote and the new plan does not cover: undo them."""
    store = paths.backups()
    stale = []
    for display, path, record in store.managed(store.load()):
        if (
            record.get("owner") != OWNER
            or display in wanted
            or paths.layer_of(display) not in layers
        ):
            continue
        undo = functools.partial(_undo, paths)
        change, _ = fsedit.undo_change(store, display, path, record, undo, paths.within)
        change.note = "no longer needed"
        stale.append(change)
    return stale


def make_plan(
    settings: ProxySettings,
    paths: Paths,
    layers: Sequence[str] = LAYERS,
    daemon_mode: str = "auto",
    ca_cert: str | None = None,
    version: tuple[int, int] | Literal[False] | None = False,
) -> Plan:
    unknown = [layer for layer in layers if layer not in LAYERS]
    if unknown:
        raise ConfigError(f"unknown layer {unknown[0]!r}", f"choose from {', '.join(LAYERS)}")
    if (
        version is False
    ):  # under --root the local engine says nothing about the system being prepared
        version = engine_version() if str(paths.root) == "/" else None
    mode, why = resolve_daemon_mode(daemon_mode, version)
    ca_bytes = build_ca_bundle(ca_cert) if ca_cert else None
    if ca_bytes is not None:
        settings = dataclasses.replace(settings, ca_bundle=paths.ca_bundle)
    changes = [
        c for layer in LAYERS if layer in layers for c in PLANNERS[layer](settings, paths, mode)
    ]
    saved = state_layers(settings, paths, layers, mode)
    wanted = {c.display for c in changes}
    if any(entry.settings.ca_bundle == paths.ca_bundle for entry in saved.values()):
        wanted.add(paths.ca_bundle)  # a layer (set up now or earlier) still exports the bundle
    changes += [_settings_change(paths, saved)] if saved else []
    if ca_bytes is not None:
        changes.append(
            _change(paths, paths.ca_bundle, ca_bytes, note="system CAs + the given CA", mode=0o644)
        )
        changes[
            -1
        ].summary = f"{ca_bytes.count(b'-----BEGIN CERTIFICATE-----')} certificates (the system bundle plus --ca-cert)"
    wanted |= {c.display for c in changes}
    stale = _stale_changes(paths, [*layers, "state"], wanted)
    return Plan(settings, paths, tuple(layers), mode, why, changes, stale)


# ---------------------------------------------------------------------------------------------------------------
# Reading back: what each layer holds now
# ---------------------------------------------------------------------------------------------------------------


@dataclass
class LayerState:
    layer: str
    files: list[str]
    values: dict[
        str, str
    ]  # variable -> value, as found in the files (unmasked: mask when printing)

    @property
    def configured(self) -> bool:
        return bool(self.values)


def _peek(paths: Paths, display: str) -> bytes | None:
    """A layer's file for reading back; one that cannot be read counts as empty (setup and remove say why)."""
    try:
        return _read(paths, display)
    except fsedit.TargetError:
        return None


def _peek_json(paths: Paths, display: str) -> dict:
    """A layer's JSON file for reading back (`_peek`); a corrupt one counts as empty."""
    try:
        return fsedit.load_json_object(paths.real(display), display, _peek(paths, display))
    except fsedit.CorruptFileError:
        return {}


def read_state(paths: Paths) -> dict[str, LayerState]:
    try:
        block = BLOCK.find(fsedit.decode(_peek(paths, paths.shell_profile))) or ""
    except fsedit.MarkerError:
        block = ""  # setup and remove say what is wrong; show reports the layer as not configured
    exports = (
        re.match(r"^export ([A-Za-z_][A-Za-z0-9_]*)=(.*)$", line) for line in block.splitlines()
    )
    shell = {match[1]: (shlex.split(match[2]) or [""])[0] for match in exports if match}
    daemon_values = daemon_environment(paths)
    daemon_files = [d for d in paths.dropins.values() if paths.real(d).exists()]
    daemon_json = _peek_json(paths, paths.daemon_json)
    proxies = found if isinstance(found := daemon_json.get("proxies"), dict) else {}
    daemon_values.update(
        {
            f"daemon.json {n}": proxies[k]
            for k, n in (
                ("http-proxy", "HTTP_PROXY"),
                ("https-proxy", "HTTPS_PROXY"),
                ("no-proxy", "NO_PROXY"),
            )
            if proxies.get(k)
        }
    )
    mirrors = daemon_json.get("registry-mirrors")
    if mirrors:
        daemon_values["registry-mirrors"] = (
            ",".join(map(str, mirrors)) if isinstance(mirrors, list) else str(mirrors)
        )
    if proxies or mirrors:
        daemon_files.append(paths.daemon_json)
    default = _get_path(_peek_json(paths, paths.docker_config), ("proxies", "default"))
    pip_text = fsedit.decode(_peek(paths, paths.pip_conf))
    return {
        "shell": LayerState("shell", [paths.shell_profile], shell),
        "daemon": LayerState("daemon", daemon_files, daemon_values),
        "container": LayerState(
            "container", [paths.docker_config], dict(default) if isinstance(default, dict) else {}
        ),
        "pip": LayerState(
            "pip",
            [paths.pip_conf],
            {
                k: v
                for k in ("index-url", "trusted-host")
                if (v := fsedit.ini_get(pip_text, "global", k))
            },
        ),
    }


@dataclass(frozen=True)
class SavedLayer:
    """One layer's settings as the run that set it up gave them (proxy.json keeps one per layer)."""

    settings: ProxySettings
    daemon_mode: str | None = None  # daemon layer: systemd or daemon-json
    profile: str | None = None  # shell layer: the file holding the block

    def to_json(self) -> dict:
        data = (
            ("settings", self.settings.to_json()),
            ("daemon_mode", self.daemon_mode),
            ("profile", self.profile),
        )
        return {key: value for key, value in data if value}


def _json_kind(value: object) -> str:
    return {
        dict: "an object",
        list: "a list",
        str: "a string",
        bool: "a boolean",
        int: "a number",
        float: "a number",
        type(None): "null",
    }.get(type(value), type(value).__name__)


def _bad_state(paths: Paths, where: str, what: str) -> ConfigError:
    return ConfigError(
        f"{paths.settings_file} is not what apexkit writes: {where} {what}; nothing was changed",
        f"fix it, or move it away (mv {paths.settings_file} {paths.settings_file}.bad) "
        "and run invoke proxy.setup again",
    )


def _settings_from_json(paths: Paths, data: object, where: str) -> ProxySettings:
    if not isinstance(data, dict):
        raise _bad_state(paths, where, f"is {_json_kind(data)}, not an object")
    for key in ("http", "https", "ca_bundle", "pip_index", "no_proxy", "registry_mirrors"):
        value, listed = data.get(key), key in ("no_proxy", "registry_mirrors")
        strings = isinstance(value, list) and all(isinstance(v, str) for v in value)
        if value is not None and not (strings if listed else isinstance(value, str)):
            what = "a list of strings" if listed else "a string"
            raise _bad_state(paths, f"{where}.{key}", f"is {_json_kind(value)}, not {what}")
    return ProxySettings(
        http=data.get("http"),
        https=data.get("https"),
        no_proxy=tuple(data.get("no_proxy") or DEFAULT_NO_PROXY),
        ca_bundle=data.get("ca_bundle"),
        pip_index=data.get("pip_index"),
        registry_mirrors=tuple(data.get("registry_mirrors") or ()),
    )


def load_saved(paths: Paths) -> dict[str, SavedLayer]:
    """Each layer's saved settings (empty when none are saved). proxy.json is apexkit's state: read without
    following a link, and anything not shaped as apexkit writes it is one line naming the field. The first format
    (one "settings" for the "layers" list of the last run) is read too."""
    real = paths.real(paths.settings_file)
    # as root: not root's own settings through a user's ~/.config link
    fsedit.check_links(real, paths.settings_file)
    data = fsedit.read_private(real, "the saved proxy settings")
    if not data or not data.strip():
        return {}
    raw = fsedit.load_json_object(real, paths.settings_file, data)
    saved = {
        name: _saved_layer(paths, name, entry) for name, entry in _layer_entries(paths, raw).items()
    }
    return {name: saved[name] for name in LAYERS if name in saved}


def _layer_entries(paths: Paths, raw: dict) -> dict:
    """proxy.json's "layers" object; the first format (a "layers" list and one "settings") made into one."""
    layers = raw.get("layers")
    if layers is None and "settings" in raw:
        # the first format, without its list of layers: the settings stood for all
        layers = list(LAYERS)
    if isinstance(layers, list):
        if not all(isinstance(name, str) for name in layers):
            raise _bad_state(paths, "layers", "holds something that is not a layer name")
        layers = {
            name: {k: raw.get(k) for k in ("settings", "daemon_mode", "profile")} for name in layers
        }
    if not isinstance(layers, dict):
        raise _bad_state(paths, "layers", f"is {_json_kind(layers)}, not an object")
    return layers


def _saved_layer(paths: Paths, name: str, entry: object) -> SavedLayer:
    """One entry of proxy.json's "layers", checked field by field."""
    where = f"layers.{name}"
    if name not in LAYERS:
        raise _bad_state(paths, where, f"is not a layer (one of {', '.join(LAYERS)})")
    if not isinstance(entry, dict):
        raise _bad_state(paths, where, f"is {_json_kind(entry)}, not an object")
    settings = _settings_from_json(paths, entry.get("settings"), f"{where}.settings")
    mode, profile = entry.get("daemon_mode"), entry.get("profile")
    if mode is not None and mode not in DAEMON_MODES:
        raise _bad_state(paths, f"{where}.daemon_mode", f"is not one of {', '.join(DAEMON_MODES)}")
    if profile is not None and not isinstance(profile, str):
        raise _bad_state(paths, f"{where}.profile", f"is {_json_kind(profile)}, not a string")
    return SavedLayer(
        settings, mode if name == "daemon" else None, profile if name == "shell" else None
    )


def combined_settings(saved: Mapping[str, SavedLayer]) -> ProxySettings | None:
    """One view of every layer's settings (for `env`, images, doctor): the proxy of the shell layer (else the
    container's, the daemon's), the pip layer's index, the daemon layer's registry mirrors."""
    order = [name for name in ("shell", "container", "daemon", "pip") if name in saved]
    if not order:
        return None
    base = saved[order[0]].settings

    def first(attribute: str, names: Sequence[str]):
        for name in names:
            if name in saved and getattr(saved[name].settings, attribute):
                return getattr(saved[name].settings, attribute)
        return getattr(base, attribute)

    return dataclasses.replace(
        base,
        ca_bundle=first("ca_bundle", order),
        pip_index=first("pip_index", ["pip", *order]),
        registry_mirrors=first("registry_mirrors", ["daemon", *order]),
    )


def verify(plan: Plan) -> list[str]:
    """After writing: read every layer back and list what does not hold the settings."""
    states, s, paths = read_state(plan.paths), plan.settings, plan.paths
    values = {name: state.values for name, state in states.items()}
    prefix = "daemon.json " if plan.daemon_mode == "daemon-json" else ""
    container = values["container"].get("httpsProxy", values["container"].get("httpProxy"))
    checked: dict[
        str, list[tuple[str, object, object]]
    ] = {  # layer -> (what is named, what the files hold, what they should hold)
        "shell": [
            (f"{paths.shell_profile}: {k}", values["shell"].get(k), v)
            for k, v in s.environment().items()
        ],
        "daemon": [
            (f"daemon: {name}", values["daemon"].get(prefix + name), value)
            for name, value in (("HTTP_PROXY", s.http), ("HTTPS_PROXY", s.https))
            if value
        ],
        "container": [(f"{paths.docker_config}: proxies.default", container, s.https or s.http)]
        if s.http or s.https
        else [],
        "pip": [(f"{paths.pip_conf}: index-url", values["pip"].get("index-url"), s.pip_index)]
        if s.pip_index
        else [],
    }
    return [
        what
        for layer, rows in checked.items()
        if layer in plan.layers
        for what, got, want in rows
        if got != want
    ]


# ---------------------------------------------------------------------------------------------------------------
# Acting
# ---------------------------------------------------------------------------------------------------------------


def daemon_next_steps(plan: Plan, restart: bool) -> list[list[str]]:
    """The commands that make dockerd read the new settings; run here when systemd manages docker."""
    if not any(plan.paths.layer_of(c.display) == "daemon" and c.changed for c in plan.all_changes):
        return []
    reload = [["systemctl", "daemon-reload"]] if plan.daemon_mode != "daemon-json" else []
    commands = [*reload, ["systemctl", "restart", "docker"]]
    if restart and str(plan.paths.root) == "/" and systemd_running() and shutil.which("systemctl"):
        for argv in commands:
            log.echo_command(argv)
            result = subprocess.run(argv, capture_output=True, text=True)
            if result.returncode != 0:
                raise EnvironmentSetupError(
                    f"{shlex.join(argv)} failed: {log.mask(result.stderr.strip()[:300])}",
                    "check `systemctl status docker` and `journalctl -u docker`",
                )
        return []
    return commands


def _check_written(plan: Plan, after_write: Callable[[], None] | None = None) -> None:
    if after_write is not None:
        after_write()
    problems = verify(plan)
    if problems:
        raise EnvironmentSetupError(
            f"read-back after writing found differences: {'; '.join(problems)}; "
            "every file was put back as it was",
            "run `invoke proxy.setup --dry-run` to see the plan, and report this as a bug",
        )


def setup(
    plan: Plan,
    dry_run: bool = False,
    restart: bool = True,
    after_write: Callable[[], None] | None = None,
) -> int:
    """status -> act -> check again. Returns the number of files written (or that would be). A failed read-back puts
    every file back as it was. `after_write` runs between the writes and the read-back (tests use it to change a
    file in that window, as another process could)."""
    changed = [c for c in plan.all_changes if c.changed]
    log.info(f"daemon mode: {plan.daemon_mode} ({plan.daemon_mode_why})")
    if dry_run:
        for change in changed:
            note = f"  ({change.note})" if change.note else ""
            log.info(f"=== {change.display}{note}")
            log.console.print(change.diff(), markup=False, highlight=False, end="")
        log.info(
            f"dry run: {len(changed)} file(s) would change, {len(plan.all_changes) - len(changed)} already up to "
            "date; nothing written"
        )
        return len(changed)
    fsedit.preflight(
        changed, "run with sudo for the daemon layer, or limit the layers: --layers shell,container"
    )
    written = fsedit.apply(
        plan.all_changes,
        plan.paths.backups(),
        OWNER,
        check=lambda: _check_written(plan, after_write),
    )
    for change in written:
        note = f" ({change.note})" if change.note else ""
        log.info(f"{'removed' if change.new is None else 'wrote'} {change.display}{note}")
    if not written:
        log.info("every layer already holds these settings; nothing written")
        problems = verify(plan)
        if problems:
            raise EnvironmentSetupError(
                f"read-back found differences: {'; '.join(problems)}",
                "run `invoke proxy.show` and report this as a bug",
            )
    commands = daemon_next_steps(plan, restart)
    if commands:
        why = (
            "systemd is not running here" if not systemd_running() else "--no-restart/--root given"
        )
        log.warn(f"the Docker daemon reads the new settings only after a restart ({why}); run:")
        for argv in commands:
            log.info(f"    sudo {shlex.join(argv)}")
        if not systemd_running():
            log.info(
                "    (no systemd: restart dockerd the way it was started, e.g. `sudo service docker restart`)"
            )
    return len(written)


def remove(
    paths: Paths, dry_run: bool = False, layers: Sequence[str] = LAYERS
) -> list[fsedit.Restore]:
    """Undo the files of `layers`, each on its own (one broken file does not stop the others), then the saved
    settings: proxy.json keeps the layers still set up (those not removed, and those whose undo failed), and goes
    away with the CA bundle -- and the state folders apexkit made -- once none is left. A failure is raised at
    the end, after everything else was done."""
    store = paths.backups()
    undo = functools.partial(_undo, paths)
    try:
        saved: dict[str, SavedLayer] | None = load_saved(paths)
    except ApexkitError as exc:
        log.warn(
            f"{exc.cause}; the saved settings are left as they are until every layer is removed"
        )
        saved = None
    failure: fsedit.UndoError | None = None
    try:
        results, changes = fsedit.undo_all(
            store,
            OWNER,
            undo,
            only=lambda d: paths.layer_of(d) in layers,
            dry_run=dry_run,
            within=paths.within,
        )
    except fsedit.UndoError as exc:
        failure, results, changes = exc, exc.results, []
    failed = {paths.layer_of(r.display) for r in results if r.how.startswith("failed")}
    remaining = (
        {} if saved is None else {n: s for n, s in saved.items() if n not in layers or n in failed}
    )
    if not remaining and not failed and (saved is not None or set(layers) == set(LAYERS)):
        more, more_changes = fsedit.undo_all(
            store,
            OWNER,
            undo,
            only=lambda d: paths.layer_of(d) == "state",
            dry_run=dry_run,
            within=paths.within,
        )
        results, changes = [*results, *more], [*changes, *more_changes]
    elif saved is not None and remaining != saved:
        change = _settings_change(paths, remaining)
        if not dry_run:
            fsedit.apply([change], store, OWNER)
        results.append(
            fsedit.Restore(
                paths.settings_file, "kept for the layers still set up: " + ", ".join(remaining)
            )
        )
        changes.append(change)
    for change in changes:
        if dry_run and change.changed:
            log.info(f"=== {change.display}")
            log.console.print(change.diff(), markup=False, highlight=False, end="")
    if failure is not None:
        failure.results = results
        raise failure
    return results


def describe(paths: Paths) -> dict:
    """What `proxy.show` prints: the saved settings and what each layer's files hold now (masked)."""
    saved = load_saved(paths)
    states = read_state(paths)
    return {
        "settings_file": paths.settings_file if saved else None,
        "saved": {name: _mask_tree(entry.to_json()) for name, entry in saved.items()} or None,
        "layers": {
            name: {"files": s.files, "configured": s.configured, "values": _mask_tree(s.values)}
            for name, s in states.items()
        },
    }


def _mask_tree(value):
    if isinstance(value, str):
        return log.mask(value)
    if isinstance(value, dict):
        return {k: _mask_tree(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_mask_tree(v) for v in value]
    return value


def current_settings(
    paths: Paths, environ: Mapping[str, str] | None = None
) -> ProxySettings | None:
    """The saved settings, else the ones in the environment, else None."""
    saved = combined_settings(load_saved(paths))
    if saved is not None:
        try:
            return saved.validated()
        except ConfigError as exc:
            log.warn(
                f"saved proxy settings ({paths.settings_file}) ignored: {exc.cause}; run {vocab.command('proxy.setup')} again"
            )
    try:
        return make_settings(environ=environ)
    except ConfigError:
        return None
