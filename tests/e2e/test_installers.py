"""Issue 19: venvs and installs with uv where it serves, virtualenv + pip otherwise -- and whatever the user configured
for pip (a pip.conf with an index on 127.0.0.1, trusted-host, a proxy; an offline wheelhouse) reaches uv too.

Real components: a PEP 503 index served over HTTP on 127.0.0.1, the real tinyproxy (its log read back), real uv and
real virtualenv + pip, a real interpreter. A tiny pure-Python wheel keeps each install to seconds."""

from __future__ import annotations

import base64
import hashlib
import http.server
import os
import stat
import subprocess
import threading
import zipfile
from pathlib import Path

import pytest

from apexkit import pipconfig
from apexkit.errors import EnvironmentSetupError
from apexkit.wheel import interpreters, uvtools, venvs

PROBE = "apexkit_probe-1.0-py3-none-any.whl"


def _wheel(directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    files = {
        "apexkit_probe/__init__.py": b"VALUE = 'probe 1.0'\n",
        "apexkit_probe-1.0.dist-info/METADATA": b"Metadata-Version: 2.1\nName: apexkit-probe\nVersion: 1.0\n",
        "apexkit_probe-1.0.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
        b"Tag: py3-none-any\n",
    }
    record = []
    for name, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{name},sha256={digest},{len(data)}")
    record.append("apexkit_probe-1.0.dist-info/RECORD,,")
    path = directory / PROBE
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in files.items():
            zf.writestr(name, data)
        zf.writestr("apexkit_probe-1.0.dist-info/RECORD", "\n".join(record) + "\n")
    return path


@pytest.fixture(scope="module")
def index(tmp_path_factory):
    """http://127.0.0.1:<port>/simple/apexkit-probe/ serving the probe wheel."""
    root = tmp_path_factory.mktemp("index")
    project = root / "simple" / "apexkit-probe"
    wheel = _wheel(project)
    sha = hashlib.sha256(wheel.read_bytes()).hexdigest()
    (project / "index.html").write_text(f'<a href="{PROBE}#sha256={sha}">{PROBE}</a>\n')
    (root / "simple" / "index.html").write_text('<a href="apexkit-probe/">apexkit-probe</a>\n')

    class Handler(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, directory=str(root), **kwargs)

        def log_message(self, *args):  # quiet
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/simple/"
    server.shutdown()


@pytest.fixture
def clean_env(monkeypatch, tmp_path):
    """Only the pip configuration the test writes: no machine-wide pip.conf, PIP_* or proxy variables."""
    for name in list(os.environ):
        if name.startswith(("PIP_", "UV_")) or name.lower() in (
            "http_proxy",
            "https_proxy",
            "no_proxy",
            "all_proxy",
        ):
            monkeypatch.delenv(name)
    monkeypatch.setenv("PIP_CONFIG_FILE", str(tmp_path / "pip.conf"))
    monkeypatch.setenv("XDG_CONFIG_DIRS", str(tmp_path / "no-xdg"))  # hides /etc/xdg/pip/pip.conf
    monkeypatch.setenv("VIRTUALENV_OVERRIDE_APP_DATA", str(tmp_path / "venv-app-data"))
    return tmp_path


def python311() -> str:
    return interpreters.find("3.11", os.environ).path


def probe(venv: venvs.Venv) -> str:
    return subprocess.run(
        [str(venv.python), "-c", "import apexkit_probe; print(apexkit_probe.VALUE)"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()


def made_by(venv: venvs.Venv) -> str:
    cfg = (venv.path / "pyvenv.cfg").read_text()
    return "uv" if "uv = " in cfg else "virtualenv" if "virtualenv = " in cfg else "?"


@pytest.mark.parametrize("installer", ["uv", "pip"])
def test_pip_conf_index_trusted_host_and_proxy_reach_either_installer(
    installer, index, tinyproxy, clean_env, monkeypatch
):
    """The only way to the index is what pip.conf says (index-url, trusted-host, proxy with credentials): the
    install works with uv as with pip, and tinyproxy saw the request."""
    monkeypatch.setenv("APEXKIT_INSTALLER", installer)
    (clean_env / "pip.conf").write_text(
        f"[global]\nindex-url = {index}\ntrusted-host = 127.0.0.1\nproxy = {tinyproxy.url}\n"
    )
    mark = tinyproxy.log_size()
    log = clean_env / "install.log"
    venv = venvs.create(python311(), clean_env / "venv", log)
    venvs.pip_install(venv, ["apexkit-probe==1.0"], venvs.IndexOptions(), log)
    assert probe(venv) == "probe 1.0"
    assert made_by(venv) == ("uv" if installer == "uv" else "virtualenv")
    assert ("uv pip install" in log.read_text()) == (installer == "uv")
    seen = tinyproxy.log_since(mark)
    assert "/simple/apexkit-probe/" in seen, seen[-2000:]
    assert tinyproxy.PASSWORD not in log.read_text()  # the proxy's password never reaches the log


@pytest.mark.parametrize("installer", ["uv", "pip"])
def test_offline_wheelhouse_with_either_installer(installer, clean_env, monkeypatch):
    """--offline --wheelhouse: nothing but the wheelhouse (pip.conf names an index nobody listens on)."""
    monkeypatch.setenv("APEXKIT_INSTALLER", installer)
    (clean_env / "pip.conf").write_text("[global]\nindex-url = http://127.0.0.1:9/simple/\n")
    options, log = _offline(clean_env)
    venv = venvs.create(python311(), clean_env / "venv", log)
    venvs.pip_install(venv, ["apexkit-probe"], options, log)
    assert probe(venv) == "probe 1.0"
    if installer == "uv":
        assert "--offline" in log.read_text() and "--no-index" in log.read_text()


@pytest.mark.parametrize("installer", ["auto", "pip"])
def test_offline_a_wheelhouse_without_a_build_requirement_names_it_and_the_download(
    installer, clean_env, monkeypatch
):
    """issue 41 B: a wheelhouse without the build requirements failed with pip's line and proxy advice; offline
    there is no index and no proxy: one line naming what is missing and the pip download that fills the wheelhouse."""
    monkeypatch.setenv("APEXKIT_INSTALLER", installer)
    options, log = _offline(clean_env)
    venv = venvs.create(python311(), clean_env / "venv", log, index=options)
    with pytest.raises(EnvironmentSetupError) as err:
        venvs.pip_install(venv, ["apexkit-probe", "apexkit-absent>=61"], options, log)
    house = options.wheelhouses[0]
    assert err.value.format() == (
        f"apexkit-absent>=61 is not in the wheelhouse ({house}) and the build is offline -- next: on a host "
        f"with network: pip download apexkit-probe 'apexkit-absent>=61' -d {house}"
    )


def test_offline_by_pip_conf_never_shows_a_find_links_password(clean_env, monkeypatch):
    """pip.conf's no-index + an https://user:token@ find-links makes the install offline with no --wheelhouse: the
    line names the find-links masked, and the download goes to a folder, never to that URL."""
    monkeypatch.setenv("APEXKIT_INSTALLER", "pip")
    (clean_env / "pip.conf").write_text(
        "[global]\nno-index = true\nfind-links = https://ci:s3cret@127.0.0.1:9/wheels/\nretries = 0\n"
    )
    log = clean_env / "install.log"
    venv = venvs.create(python311(), clean_env / "venv", log)
    with pytest.raises(EnvironmentSetupError) as err:
        venvs.pip_install(venv, ["apexkit-absent"], venvs.IndexOptions(), log)
    shown = err.value.format()
    assert "s3cret" not in shown and "https://ci:***@127.0.0.1:9/wheels/" in shown, shown
    assert shown.endswith("pip download apexkit-absent -d DIR"), shown


def test_an_unreachable_index_is_said_once_without_pips_retries(clean_env, monkeypatch):
    """issue 41 D: uv could not resolve the index's host (its real output under `unshare -n`,
    tests/data/installer-logs/uv-dns-error.log); pip retried the same index for ~42 s and then blamed a requirement.
    Now: the index host is unreachable, one line, and pip is never started."""
    from conftest import DATA

    recorded = DATA / "installer-logs" / "uv-dns-error.log"
    uv = clean_env / "uv-dns"
    uv.write_text(
        "#!/bin/sh\nif [ \"$1\" = --version ]; then echo 'uv 0.13.9'; exit 0; fi\n"
        f"cat '{recorded}' >&2; exit 2\n"
    )
    uv.chmod(uv.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("APEXKIT_UV", str(uv))
    log = clean_env / "install.log"
    options = venvs.IndexOptions(index_url="https://pypi.example.org/simple")
    venv = venvs.create(python311(), clean_env / "venv", log, index=options)
    with pytest.raises(EnvironmentSetupError) as err:
        venvs.pip_install(venv, ["setuptools>=61", "wheel"], options, log)
    assert err.value.format() == (
        "the package index pypi.example.org is unreachable (error resolving DNS) -- next: set index_url to "
        "your mirror, or --offline --wheelhouse DIR"
    )
    assert " -m pip install" not in log.read_text()


def test_with_no_network_the_real_uv_failure_is_one_line_and_pip_never_runs(clean_env):
    """The same with the real uv in a network namespace without a network (`unshare -n`; loopback down, so the
    index on 127.0.0.1 cannot be reached)."""
    import shutil
    import sys
    import time

    if not (
        os.geteuid() == 0
        and shutil.which("unshare")
        and subprocess.run(["unshare", "-n", "true"], capture_output=True).returncode == 0
    ):
        pytest.skip("needs a network namespace (root and unshare -n)")
    code = (
        "import sys; from pathlib import Path; from apexkit.wheel import venvs\n"
        "from apexkit.errors import EnvironmentSetupError\n"
        "o = venvs.IndexOptions(index_url='http://127.0.0.1:9/simple/'); d = Path(sys.argv[1])\n"
        "v = venvs.create(sys.argv[2], d / 'venv', d / 'install.log', index=o)\n"
        "try: venvs.pip_install(v, ['setuptools>=61', 'wheel'], o, d / 'install.log')\n"
        "except EnvironmentSetupError as e: print(e.format())\n"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(venvs.__file__).parents[2])}
    env.pop("APEXKIT_INSTALLER", None)
    started = time.monotonic()
    proc = subprocess.run(
        ["unshare", "-n", sys.executable, "-c", code, str(clean_env), python311()],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    said = (proc.stdout.strip().splitlines() or [""])[-1]
    assert said.startswith("the package index 127.0.0.1:9 is unreachable ("), (
        proc.stdout + proc.stderr[-2000:]
    )
    assert proc.stdout.strip().endswith(
        "-- next: set index_url to your mirror, or --offline --wheelhouse DIR"
    )
    assert " -m pip install" not in (clean_env / "install.log").read_text()
    assert time.monotonic() - started < 120


def _offline(clean_env: Path) -> tuple[venvs.IndexOptions, Path]:
    """--offline --wheelhouse holding the probe wheel, and the install log."""
    house = clean_env / "wheelhouse"
    _wheel(house)
    return venvs.IndexOptions(wheelhouses=(house,), offline=True), clean_env / "install.log"


def _fake_uv(directory: Path, version: str, works: bool) -> str:
    """A uv binary that reports `version` and then fails every command: a broken or half-installed uv."""
    script = directory / f"uv-{version}-{'ok' if works else 'broken'}"
    script.write_text(
        f"#!/bin/sh\nif [ \"$1\" = --version ]; then echo 'uv {version}'; exit 0; fi\n"
        "echo 'error: this uv is broken' >&2; exit 2\n"
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return str(script)


def test_a_uv_that_fails_falls_back_to_virtualenv_and_pip_with_one_line(
    clean_env, monkeypatch, capfd
):
    options, log = _offline(clean_env)
    monkeypatch.setenv("APEXKIT_UV", _fake_uv(clean_env, "0.13.9", works=False))
    venv = venvs.create(python311(), clean_env / "venv", log)
    venvs.pip_install(venv, ["apexkit-probe"], options, log)
    assert probe(venv) == "probe 1.0" and made_by(venv) == "virtualenv"
    err = capfd.readouterr().err
    assert "uv venv failed (error: this uv is broken): making it with virtualenv instead" in err
    assert "uv could not install apexkit-probe (error: this uv is broken): trying pip" in err
    # asked for uv explicitly: no silent fallback, one line
    monkeypatch.setenv("APEXKIT_INSTALLER", "uv")
    with pytest.raises(EnvironmentSetupError, match="uv could not create a venv with"):
        venvs.create(python311(), clean_env / "venv2", log)


def test_a_uv_too_old_or_missing_means_virtualenv(clean_env, monkeypatch, capfd):
    monkeypatch.setenv("APEXKIT_UV", _fake_uv(clean_env, "0.1.0", works=True))
    assert uvtools.find() is None
    assert "is older than 0.5.0: making venvs with virtualenv + pip" in capfd.readouterr().err
    monkeypatch.setenv("APEXKIT_UV", str(clean_env / "no-such-uv"))
    assert uvtools.find() is None
    assert "does not run: making venvs with virtualenv + pip" in capfd.readouterr().err
    monkeypatch.setenv("APEXKIT_UV", "")
    monkeypatch.setenv("APEXKIT_INSTALLER", "pip")
    assert uvtools.find() is None


def test_a_damaged_uv_cache_entry_is_found_by_record_and_installed_again(
    clean_env, monkeypatch, capfd
):
    """uv links installed files out of its cache: a cache entry damaged after it was written would be installed as
    it is. The install is checked against each wheel's RECORD; a mismatch cleans that entry and installs again."""
    monkeypatch.setenv("APEXKIT_INSTALLER", "uv")
    monkeypatch.setenv("APEXKIT_CACHE_DIR", str(clean_env / "cache"))
    options, log = _offline(clean_env)
    first = venvs.create(python311(), clean_env / "venv-a", log)
    venvs.pip_install(first, ["apexkit-probe"], options, log)
    cached = [p for p in (clean_env / "cache" / "uv").rglob("apexkit_probe/__init__.py")]
    assert cached, "uv keeps the unpacked wheel in its cache"
    for (
        path
    ) in cached:  # damage it in place (a hard link shares it with venv-a: that one is damaged too)
        path.chmod(0o644)
        path.write_bytes(b"VALUE = 'damaged'\n")
    capfd.readouterr()
    second = venvs.create(python311(), clean_env / "venv-b", log)
    venvs.pip_install(second, ["apexkit-probe"], options, log)
    assert probe(second) == "probe 1.0"
    err = " ".join(capfd.readouterr().err.split())  # the terminal may wrap the line
    assert (
        "uv installed apexkit_probe with files that differ from their RECORD (apexkit_probe/__init__.py ("
        in err
    )
    assert "cleaning those uv cache entries and installing again" in err
    text = log.read_text()
    assert (
        'RECORD mismatches after uv install: {"apexkit_probe-1.0.dist-info": ["apexkit_probe/__init__.py'
        in text
    )
    assert text.count("--reinstall-package=apexkit_probe") == 1
    dist = next((second.path).glob("lib/python*/site-packages/apexkit_probe-1.0.dist-info"))
    assert venvs.record_problems(dist) == []


def _odd_wheel(directory: Path, name: str, lie_about: str) -> Path:
    """A wheel whose RECORD disagrees with one of its own files (as some vendor wheels ship)."""
    directory.mkdir(parents=True, exist_ok=True)
    files = {
        f"{name}/__init__.py": b"VALUE = 'odd'\n",
        f"{name}-1.0.dist-info/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n".encode(),
        f"{name}-1.0.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = []
    for member, data in files.items():
        recorded = data + b"# rewritten after RECORD\n" if member.endswith(lie_about) else data
        digest = base64.urlsafe_b64encode(hashlib.sha256(recorded).digest()).rstrip(b"=").decode()
        record.append(f"{member},sha256={digest},{len(recorded)}")
    record.append(f"{name}-1.0.dist-info/RECORD,,")
    path = directory / f"{name}-1.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        for member, data in files.items():
            zf.writestr(member, data)
        zf.writestr(f"{name}-1.0.dist-info/RECORD", "\n".join(record) + "\n")
    return path


def test_a_wheel_whose_own_record_disagrees_installs_as_pip_would(clean_env, monkeypatch, capfd):
    """torch_npu 2.5.1.post1 (aarch64) ships a METADATA that differs from its RECORD: dist-info files are not
    checked; a module file that differs even from a clean cache is noted in one line and installed, as pip does."""
    monkeypatch.setenv("APEXKIT_INSTALLER", "uv")
    monkeypatch.setenv("APEXKIT_CACHE_DIR", str(clean_env / "cache"))
    house = clean_env / "wheelhouse"
    _odd_wheel(house, "odd_metadata", "METADATA")
    _odd_wheel(house, "odd_module", "__init__.py")
    options = venvs.IndexOptions(wheelhouses=(house,), offline=True)
    log = clean_env / "install.log"
    venv = venvs.create(python311(), clean_env / "venv", log)
    capfd.readouterr()
    venvs.pip_install(venv, ["odd-metadata"], options, log)
    assert "RECORD" not in capfd.readouterr().err
    venvs.pip_install(venv, ["odd-module"], options, log)
    err = " ".join(capfd.readouterr().err.split())
    assert (
        "odd_module-1.0.dist-info: the wheel's own RECORD disagrees with its files (odd_module/__init__.py (size))"
        in err
    )
    assert "installed from a clean cache, as pip would" in err


def test_pips_proxy_option_wins_over_the_exported_variables_and_the_users_ca_wins(
    monkeypatch, tmp_path
):
    """As in pip: PipSession passes its proxy option with every request (the environment fills in only what is
    unset), so uv gets pip.conf's proxy in both cases even where the user exported another; a CA bundle the user
    exported stays theirs."""
    monkeypatch.setenv("https_proxy", "http://exported:3128")
    monkeypatch.setenv("HTTP_PROXY", "http://exported:3128")
    monkeypatch.setenv("SSL_CERT_FILE", "/exported/ca.pem")
    monkeypatch.delenv("http_proxy", raising=False)
    monkeypatch.delenv("HTTPS_PROXY", raising=False)
    config = pipconfig.parse("global.proxy='http://pip-conf:3128'\nglobal.cert='/pip-conf/ca.pem'")
    _, extra = uvtools.install_options(config, uvtools.Sources())
    env = uvtools.environment(tmp_path, extra)
    assert {
        name: env[name] for name in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY")
    } == dict.fromkeys(
        ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY"), "http://pip-conf:3128"
    )
    assert env["SSL_CERT_FILE"] == "/exported/ca.pem"
    # without a proxy in pip's config, the exported ones are what uv gets
    env = uvtools.environment(
        tmp_path, uvtools.install_options(pipconfig.parse(""), uvtools.Sources())[1]
    )
    assert (
        env["https_proxy"] == env["HTTP_PROXY"] == "http://exported:3128"
        and "HTTPS_PROXY" not in env
    )


SECRET = "s3cret-ARGV-7f"  # the index password: in no process's command line, ever


@pytest.fixture
def login_index(tmp_path):
    """The probe wheel behind Basic auth (user:SECRET) at /simple/ and /extra/; `authorized` counts the requests
    that brought the password."""
    root = tmp_path / "login-index"
    project = root / "simple" / "apexkit-probe"
    wheel = _wheel(project)
    sha = hashlib.sha256(wheel.read_bytes()).hexdigest()
    (project / "index.html").write_text(f'<a href="{PROBE}#sha256={sha}">{PROBE}</a>\n')
    (root / "extra").symlink_to(root / "simple")
    login = "Basic " + base64.b64encode(f"user:{SECRET}".encode()).decode()
    authorized: list[str] = []

    class Handler(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, directory=str(root), **kwargs)

        def send_head(self):
            if self.headers.get("Authorization") != login:
                self.send_response(401)
                self.send_header("WWW-Authenticate", 'Basic realm="index"')
                self.send_header("Content-Length", "0")
                self.end_headers()
                return None
            authorized.append(self.path)
            return super().send_head()

        def log_message(self, *args):  # quiet
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://user:{SECRET}@127.0.0.1:{server.server_address[1]}", authorized
    server.shutdown()


def _watch_command_lines(seen: set[str], stop: threading.Event) -> None:
    """Every process's command line, as any user on the node reads it (ps, /proc/PID/cmdline), until `stop`."""
    while not stop.is_set():
        for entry in os.scandir("/proc"):
            if entry.name.isdigit():
                try:
                    with open(f"/proc/{entry.name}/cmdline", "rb") as fh:
                        seen.add(fh.read().replace(b"\0", b" ").decode(errors="replace"))
                except OSError:
                    pass


@pytest.mark.parametrize("installer", ["uv", "pip"])
def test_index_passwords_reach_the_installer_but_no_command_line(
    installer, login_index, clean_env, monkeypatch
):
    """apexkit's --index-url and pip.conf's extra-index-url, both with user:SECRET@: the installer logs in (the
    index saw the password, the probe is installed), and no process's command line ever held SECRET -- neither
    uv venv nor uv/pip install; the install log names the index with the password masked."""
    base, authorized = login_index
    real_uv = uvtools.find()
    assert real_uv is not None
    monkeypatch.setenv("APEXKIT_INSTALLER", installer)
    monkeypatch.setenv("APEXKIT_CACHE_DIR", str(clean_env / "cache"))
    monkeypatch.setenv("PIP_NO_INPUT", "1")
    (clean_env / "pip.conf").write_text(f"[global]\nextra-index-url = {base}/extra/\n")
    wrapper = (
        clean_env / "uv-wrapper"
    )  # uv may finish between two reads of /proc: it also writes its argv down
    wrapper.write_text(
        f'#!/bin/sh\nprintf "%s\\n" "$*" >> {clean_env}/uv-argv\nexec {real_uv.binary} "$@"\n'
    )
    wrapper.chmod(0o755)
    monkeypatch.setenv("APEXKIT_UV", str(wrapper))
    seen: set[str] = set()
    stop = threading.Event()
    watcher = threading.Thread(target=_watch_command_lines, args=(seen, stop), daemon=True)
    watcher.start()
    options = venvs.IndexOptions(index_url=f"{base}/simple/")
    log = clean_env / "install.log"
    try:
        venv = venvs.create(python311(), clean_env / "venv", log, index=options)
        venvs.pip_install(venv, ["apexkit-probe==1.0"], options, log)
    finally:
        stop.set()
        watcher.join()
    assert probe(venv) == "probe 1.0"
    assert any("/apexkit-probe/" in path for path in authorized), authorized
    if installer == "uv":
        seen |= set((clean_env / "uv-argv").read_text().splitlines())
    installs = [line for line in seen if " install " in line and ("pip" in line or "uv" in line)]
    assert installs, "the watcher saw the install's command line"
    assert not [line for line in seen if SECRET in line]
    text = log.read_text()
    assert SECRET not in text and "user:***@127.0.0.1" in text
