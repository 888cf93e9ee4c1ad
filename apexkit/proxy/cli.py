"""The `proxy.*` commands: each one's options (apexkit.declare) and the function that runs it."""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import stat
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from apexkit import fsedit, locks, log, netenv, vocab
from apexkit.declare import json_option, option
from apexkit.errors import ApexkitError, ConfigError, EnvironmentSetupError
from apexkit.proxy import check as proxycheck
from apexkit.proxy import layers as proxy


@dataclass(frozen=True)
class Where:
    """The files a proxy command reads and writes."""

    profile: str | None = option(
        None,
        "shell file for the block (default ~/.bashrc; with --system /etc/profile.d/apexkit-proxy.sh)",
    )
    system: bool = option(
        False, "system-wide files: /etc/profile.d/apexkit-proxy.sh and /etc/pip.conf"
    )
    root: str | None = option(
        None,
        "prefix for every path written or read (a test root standing for /); nothing is restarted",
    )


@dataclass(frozen=True)
class Setup(Where):
    """Configure the proxy in all three layers (shell, Docker daemon, containers) plus mirrors and a CA."""

    http: str | None = option(
        None,
        "proxy for http:// URLs, e.g. http://user:password@proxy:3128 (default: $http_proxy/$HTTP_PROXY)",
    )
    https: str | None = option(
        None, "proxy for https:// URLs (default: $https_proxy/$HTTPS_PROXY, else --http)"
    )
    no_proxy: str | None = option(
        None,
        "extra hosts/domains/CIDRs that bypass the proxy; localhost,127.0.0.0/8,::1 are always added",
    )
    ca_cert: str | None = option(
        None,
        "PEM file of a TLS-intercepting proxy's CA: a bundle (system CAs + it) is exported as "
        + ", ".join(netenv.CA_VARIABLES),
    )
    pip_index: str | None = option(None, "pip index mirror written to pip.conf (the no-proxy path)")
    registry_mirror: list[str] = option(
        None,
        "registry mirror for the Docker daemon (daemon.json registry-mirrors); repeat for several",
        repeat=True,
    )
    layers: str | None = option(
        None, "comma-separated layers to touch: shell,daemon,container,pip (default: all)"
    )
    daemon_mode: str = option(
        "auto", "auto (from the engine version), systemd (drop-ins) or daemon-json (Docker >= 23)"
    )
    dry_run: bool = option(False, "print the unified diff of every file; write nothing")
    write_config: bool = option(
        False,
        "also record --pip-index as index_url in the user config file (~/.config/apexkit/config.toml, "
        "mode 0600), so builds and image.build use it",
    )
    restart: bool = option(
        True,
        "restart the Docker daemon under systemd after a daemon change (--no-restart: print the commands)",
    )


@dataclass(frozen=True)
class Check(Where):
    """Check every layer: configured? effective? a real request through the proxy. Exit 1 when one fails."""

    index_url: str | None = option(
        None,
        "URL for the HTTPS probe (default: the pip mirror, $PIP_INDEX_URL, else https://pypi.org/simple/)",
    )
    image: str | None = option(
        None, "local image for the container probe (needs bash; default: the first apexkit/* image)"
    )
    layers: str | None = option(None, "comma-separated layers: shell,daemon,container,sources")
    probe_defaults: bool = option(
        False,
        "also probe the sources left at their default (gitcode.com, github.com, quay.io, ...), not only "
        "the ones configured (apexkit config.show)",
    )
    as_json: bool = json_option()


@dataclass(frozen=True)
class Show(Where):
    """Show the saved settings and what each layer's files hold (passwords masked)."""

    as_json: bool = json_option()


@dataclass(frozen=True)
class Env(Where):
    """Print export lines for the current shell, to eval there (eval "$(... proxy.env)" in bash)."""

    reveal: bool = option(False, "print passwords even on a terminal")
    unset: bool = option(False, "print unset lines instead")


@dataclass(frozen=True)
class Remove(Where):
    """Undo proxy.setup: files restored from backups, your own content byte-identical; the index_url --write-config
    recorded taken out of the user config file."""

    layers: str | None = option(None, "comma-separated layers to undo (default: all)")
    dry_run: bool = option(False, "print the diffs; write nothing")


def _paths(o: Where) -> proxy.Paths:
    base = Path(o.root).absolute() if o.root else Path("/")
    if o.root and not base.is_dir():
        raise ConfigError(
            f"--root {o.root} is not a directory", "create it first (it stands for /)"
        )
    return proxy.Paths(root=base, profile=o.profile, system=o.system)


def _layers(only: str | None, known: tuple[str, ...] = proxy.LAYERS) -> tuple[str, ...]:
    if only is None:
        return known
    layers = tuple(item.strip() for item in only.split(",") if item.strip())
    if not layers:  # `--layers ''` (an unset shell variable, say) is not "every layer"
        raise ConfigError(
            f"--layers {only!r} names no layer",
            f"name them (--layers {','.join(known)}), or leave --layers out for every layer",
        )
    for layer in layers:
        if layer not in known:
            raise ConfigError(
                f"--layers {layer!r} is not a layer", f"choose from {','.join(known)}"
            )
    return layers


@contextlib.contextmanager
def _serialised(paths: proxy.Paths, dry_run: bool) -> Iterator[None]:
    """One proxy setup or remove at a time per backups store, from reading the files and the store (the plan) to the
    last write and read-back. The second one waits, saying "waiting for the lock on ... held by pid N", then plans
    from what the first one left: two setups end as if run one after the other (the later one's settings), never
    with one's put-back undoing the other's files. Waiting rather than failing fast: two setups at once are a
    fleet script or two terminals, and the one that runs second would only be run again by hand. A dry run writes
    nothing and takes no lock.

    The lock lives in this user's private folder, outside every home and --root tree (a lock file there would be
    left behind by remove, and as root it would be a file root creates in a folder the user controls)."""
    if dry_run:
        yield
        return
    directory = Path(tempfile.gettempdir()) / f"apexkit-locks-{os.geteuid()}"
    with contextlib.suppress(FileExistsError):
        os.mkdir(directory, 0o700)
    st = os.lstat(directory)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077:
        raise EnvironmentSetupError(
            f"the lock folder {directory} is not a private folder of uid {os.geteuid()} (a link, another "
            "user's, or open to others); nothing was changed",
            f"remove it (rm -r {directory}) and run again",
        )
    store = os.path.realpath(paths.real(f"{paths.state_dir}/backups"))
    name = "proxy-" + hashlib.sha256(os.fsencode(store)).hexdigest()[:16]
    with locks.hold(directory / name, f"the proxy backups {store}"):
        yield


def setup(o: Setup) -> int:
    from apexkit import config

    paths, write_config = _paths(o), None
    if o.write_config:
        if not o.pip_index:
            raise ConfigError(
                "--write-config records the mirror keys of this setup, and none was given",
                "add --pip-index URL (written as index_url to the user config file)",
            )
        # index_url set in the user config file (apexkit.config), under --root when given: the file and the value
        # are checked now, before anything is written; it is written (0600: an index URL may hold a password) last
        display = str(config.user_file(paths.environ))
        after = config.updated_file(paths.real(display), {"index_url": o.pip_index})
        write_config = _config_writer(paths, display, after, o.dry_run)
    settings = proxy.make_settings(
        http=o.http,
        https=o.https,
        no_proxy=o.no_proxy,
        pip_index=o.pip_index,
        registry_mirrors=list(o.registry_mirror or ()),
    )
    with _serialised(paths, o.dry_run):
        saved = proxy.load_saved(paths) if not o.ca_cert else {}
        layers = _layers(o.layers)
        if any(
            entry.settings.ca_bundle == paths.ca_bundle
            for name, entry in saved.items()
            if name in layers
        ):
            # keep the earlier --ca-cert
            settings = dataclasses.replace(settings, ca_bundle=paths.ca_bundle)
        plan = proxy.make_plan(settings, paths, layers, o.daemon_mode, o.ca_cert)
        before = proxy.read_state(paths)
        log.info(
            "now: "
            + ", ".join(
                f"{name} {'configured' if s.configured else 'not configured'}"
                for name, s in before.items()
                if name in plan.layers
            )
        )
        proxy.setup(plan, dry_run=o.dry_run, restart=o.restart)
    if not o.dry_run:
        log.info(f"check every layer with: {vocab.command('proxy.check')}")
    if write_config:
        write_config()
    return 0


def _config_writer(
    paths: proxy.Paths, display: str, after: bytes, dry_run: bool
) -> Callable[[], None]:
    """Show the user config file's diff, then write it atomically (mode 0600), unless --dry-run."""
    # as root in a user's home, a new file belongs to the home's owner
    change = fsedit.Change(
        display,
        paths.real(display),
        after,
        0o600,
        within=paths.within,
        new_owner=paths.home_owner(),
    )

    def write() -> None:
        if not change.changed:
            log.info(f"unchanged: {display}")
            return
        sys.stdout.write(change.diff())
        if dry_run:
            log.info(f"would write: {display} (mode 0600)")
            return
        fsedit.check_again(change)  # the links on the way still lead where they did
        fsedit.atomic_write(change.target, after, 0o600, owner=change.new_owner, nofollow=True)
        log.info(
            f"written: {display} (mode 0600; {vocab.command('config.show')} lists the effective values)"
        )

    return write


def _forget_index_url(
    paths: proxy.Paths, layers: tuple[str, ...], dry_run: bool
) -> Callable[[], None] | None:
    """What undoes `proxy.setup --write-config` when the pip layer is removed: the user config file's index_url taken
    out while it still holds the mirror that setup saved; another value is kept, with one line saying so."""
    from apexkit import config

    try:  # a state or config file apexkit cannot read never stops the undo of the layers themselves
        saved = proxy.load_saved(paths).get("pip")
        mirror = saved.settings.pip_index if saved is not None and "pip" in layers else None
        display = str(config.user_file(paths.environ))
        table = config.read_file(paths.real(display), "user") if mirror else {}
    except ApexkitError:
        return None
    if "index_url" not in table:
        return None
    if table["index_url"] != mirror:
        log.info(
            f"kept: index_url in {display} (not the mirror proxy.setup wrote; edit the file to remove it)"
        )
        return None
    return _config_writer(
        paths,
        display,
        config.render({k: v for k, v in table.items() if k != "index_url"}).encode(),
        dry_run,
    )


def remove(o: Remove) -> int:
    paths, dry_run, layers = _paths(o), o.dry_run, _layers(o.layers)
    forget = _forget_index_url(paths, layers, dry_run)  # checked before anything is undone
    try:
        with _serialised(paths, dry_run):
            results = proxy.remove(paths, dry_run=dry_run, layers=layers)
    except fsedit.UndoError as exc:
        for item in exc.results:  # what happened to the other files, then the one error line
            log.info(
                f"{item.how}: {item.display}"
                if not item.how.startswith("failed")
                else f"not undone: {item.display}"
            )
        raise
    if not results:
        log.info("nothing to remove: apexkit has not written any proxy file here")
    for item in results:
        log.info(f"{'would be ' if dry_run else ''}{item.how}: {item.display}")
    if forget is not None:
        forget()
    if results and not dry_run:
        log.info(
            "shells that already ran the block keep the variables until they exit; "
            "the Docker daemon keeps its proxy until it is restarted"
        )
    return 0


def show(o: Show) -> int:
    data = proxy.describe(_paths(o))
    if o.as_json:
        print(json.dumps(data, indent=2))
        return 0
    saved = data["saved"]
    if saved:
        print(f"settings ({data['settings_file']}), per layer:")
        for name, entry in saved.items():
            s = entry["settings"]
            extra = entry.get("profile") or entry.get("daemon_mode")
            print(f"  {name}{f' ({extra})' if extra else ''}:")
            shown = {
                **{k: s.get(k) for k in ("http", "https", "ca_bundle", "pip_index")},
                "no_proxy": ",".join(s.get("no_proxy") or [])
                if s.get("http") or s.get("https")
                else "",
                "registry_mirrors": ",".join(s.get("registry_mirrors") or []),
            }
            print(
                "".join(f"    {key:<16} {value}\n" for key, value in shown.items() if value), end=""
            )
    else:
        print("settings: none saved (invoke proxy.setup has not run here)")
    for name, layer in data["layers"].items():
        state = "configured" if layer["configured"] else "not configured"
        print(f"{name}: {state} ({', '.join(layer['files']) or '-'})")
        for key, value in layer["values"].items():
            print(f"  {key}={value}")
    return 0


def env(o: Env) -> int:
    """Print `export` lines for eval. On a terminal passwords are masked (use --reveal); piped, they are real."""
    settings = proxy.current_settings(_paths(o))
    if settings is None:
        raise ConfigError(
            "no proxy settings saved and none in the environment",
            "run invoke proxy.setup --http http://proxy:port first",
        )
    variables = settings.environment()
    if o.unset:
        sys.stdout.write("".join(f"unset {name}\n" for name in variables))
        return 0
    text = proxy.shell_exports(variables)
    if sys.stdout.isatty() and not o.reveal:
        text = log.mask(text)
        log.info(
            '(passwords masked on a terminal; eval "$(invoke proxy.env)" gets the real values)'
        )
    sys.stdout.write(text)
    return 0


def check(o: Check) -> int:
    from apexkit import checks

    paths = _paths(o)
    settings = proxy.current_settings(paths, environ=os.environ)
    wanted = _layers(o.layers, (*proxy.LAYERS, SOURCES))
    layers = [layer for layer in wanted if layer not in ("pip", SOURCES)]
    rows = proxycheck.check(paths, settings, index_url=o.index_url, image=o.image, layers=layers)
    if SOURCES in wanted:  # each configured source, through this proxy (apexkit.proxy.sources)
        rows += proxycheck.check_sources(settings, o.probe_defaults)
    return checks.report(rows, o.as_json, legacy=proxycheck.legacy_json)


SOURCES = "sources"  # proxy.check's pseudo-layer: the configured sources, probed through the proxy
