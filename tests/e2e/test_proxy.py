"""invoke proxy.*: validation, the files each layer writes, idempotency, byte-identical removal, modes, masking.

Everything here writes under a --root test directory (standing for /), through the real `invoke` command line.
The live checks (tinyproxy, dockerd, containers) are in test_proxy_live.py.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT
from proxyroot import PASSWORD, PROXY, invoke, paths, snapshot

from apexkit import fsedit
from apexkit.proxy import layers


def user_files(root: Path) -> dict[str, tuple[bytes, int]]:
    """Everything but apexkit's own state directory."""
    return {k: v for k, v in snapshot(root).items() if "/.config/apexkit/" not in "/" + k}


def test_bad_url_error_is_one_line_exit_2_and_masked(fsroot):
    result = invoke(
        "proxy.setup", "--http", f"ftp://alice:{PASSWORD}@proxy:21", "--root", str(fsroot)
    )
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0 and "next:" in result.stderr
    assert PASSWORD not in result.stderr + result.stdout
    assert snapshot(fsroot) == {}


# --- dry run ----------------------------------------------------------------------------------------------------


def test_dry_run_prints_the_three_layers_diffs_and_writes_nothing(fsroot):
    result = invoke("proxy.setup", "--http", PROXY, "--dry-run", "--root", str(fsroot))
    assert result.returncode == 0, result.stderr
    out = result.stderr
    for path in (
        "/home/alice/.bashrc",
        "/etc/systemd/system/docker.service.d/http-proxy.conf",
        "/etc/systemd/system/docker.service.d/https-proxy.conf",
        "/home/alice/.docker/config.json",
    ):
        assert f"+++ {path}" in out
    assert "+export https_proxy=http://alice:***@proxy.corp.example:3128" in out
    assert "dry run:" in out and "nothing written" in out
    assert PASSWORD not in out + result.stdout
    assert snapshot(fsroot) == {}


# --- writing, idempotency, modes ------------------------------------------------------------------------------


def test_setup_writes_every_layer_and_a_second_run_changes_no_byte(fsroot):
    bashrc = fsroot / "home/alice/.bashrc"
    bashrc.write_text("# my bashrc\nalias ll='ls -l'\n")
    bashrc.chmod(0o644)
    args = [
        "proxy.setup",
        "--http",
        PROXY,
        "--no-proxy",
        ".corp.example",
        "--root",
        str(fsroot),
        "--daemon-mode",
        "systemd",
    ]
    first = invoke(*args)
    assert first.returncode == 0, first.stderr
    after_first = snapshot(fsroot)
    second = invoke(*args)
    assert second.returncode == 0, second.stderr
    assert "nothing written" in second.stderr
    assert snapshot(fsroot) == after_first

    text = bashrc.read_text()
    assert text.startswith("# my bashrc\nalias ll='ls -l'\n# >>> apexkit proxy >>>\n")
    for name in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY"):
        assert f"export {name}={PROXY}\n" in text
    assert "export no_proxy=localhost,127.0.0.0/8,::1,.corp.example\n" in text

    dropin = (fsroot / "etc/systemd/system/docker.service.d/http-proxy.conf").read_text()
    assert "[Service]" in dropin and f'Environment="HTTP_PROXY={PROXY}"' in dropin
    assert layers.daemon_environment(paths(fsroot)) == {
        "HTTP_PROXY": PROXY,
        "HTTPS_PROXY": PROXY,
        "NO_PROXY": "localhost,127.0.0.0/8,::1,.corp.example",
    }
    config = json.loads((fsroot / "home/alice/.docker/config.json").read_text())
    assert config["proxies"]["default"] == {
        "httpProxy": PROXY,
        "httpsProxy": PROXY,
        "noProxy": "localhost,127.0.0.0/8,::1,.corp.example",
    }
    # every file holding the password is 0600
    for relative, (data, mode) in after_first.items():
        if PASSWORD.encode() in data:
            assert mode == 0o600, relative
    # nothing printed holds the password
    assert PASSWORD not in first.stdout + first.stderr + second.stdout + second.stderr


def test_without_credentials_the_profile_keeps_its_mode(fsroot):
    bashrc = fsroot / "home/alice/.bashrc"
    bashrc.write_text("x=1\n")
    bashrc.chmod(0o644)
    assert (
        invoke(
            "proxy.setup", "--http", "http://proxy:3128", "--layers", "shell", "--root", str(fsroot)
        ).returncode
        == 0
    )
    assert stat.S_IMODE(bashrc.stat().st_mode) == 0o644


# --- merging into files the user already has ------------------------------------------------------------------


def test_existing_json_keys_are_kept_and_restored_exactly(fsroot):
    config = fsroot / "home/alice/.docker/config.json"
    config.parent.mkdir(parents=True)
    original_config = (
        b'{\n\t"auths": {\n\t\t"registry.corp": {\n\t\t\t"auth": "c2VjcmV0"\n\t\t}\n\t}\n}'
    )
    config.write_bytes(original_config)
    config.chmod(0o600)
    daemon_json = fsroot / "etc/docker/daemon.json"
    daemon_json.parent.mkdir(parents=True)
    original_daemon = b'{"log-driver": "json-file", "data-root": "/srv/docker"}\n'
    daemon_json.write_bytes(original_daemon)
    before = user_files(fsroot)

    result = invoke(
        "proxy.setup",
        "--http",
        PROXY,
        "--daemon-mode",
        "daemon-json",
        "--registry-mirror",
        "https://mirror.corp.example",
        "--root",
        str(fsroot),
    )
    assert result.returncode == 0, result.stderr
    merged = json.loads(config.read_text())
    assert merged["auths"] == {"registry.corp": {"auth": "c2VjcmV0"}}
    assert merged["proxies"]["default"]["httpsProxy"] == PROXY
    daemon = json.loads(daemon_json.read_text())
    assert daemon["log-driver"] == "json-file" and daemon["data-root"] == "/srv/docker"
    assert daemon["proxies"] == {
        "http-proxy": PROXY,
        "https-proxy": PROXY,
        "no-proxy": "localhost,127.0.0.0/8,::1",
    }
    assert daemon["registry-mirrors"] == ["https://mirror.corp.example"]
    assert stat.S_IMODE(daemon_json.stat().st_mode) == 0o600  # it holds the password now
    assert not (fsroot / "etc/systemd/system/docker.service.d").exists()

    removed = invoke("proxy.remove", "--root", str(fsroot))
    assert removed.returncode == 0, removed.stderr
    assert user_files(fsroot) == before


@pytest.mark.parametrize("display", ["/etc/docker/daemon.json", "/home/alice/.docker/config.json"])
def test_corrupt_json_is_a_clear_error_and_nothing_is_written(fsroot, display):
    target = fsroot / display.lstrip("/")
    target.parent.mkdir(parents=True)
    target.write_text('{"log-driver": "json-file",,}')
    (fsroot / "home/alice/.bashrc").write_text("keep me\n")
    before = snapshot(fsroot)
    result = invoke(
        "proxy.setup", "--http", PROXY, "--daemon-mode", "daemon-json", "--root", str(fsroot)
    )
    assert result.returncode == 2
    assert f"{display} is not valid JSON (line 1" in result.stderr
    assert "nothing was changed" in result.stderr
    assert snapshot(fsroot) == before


def test_remove_is_byte_identical_around_our_block_even_after_the_user_edits(fsroot):
    bashrc = fsroot / "home/alice/.bashrc"
    bashrc.write_bytes(
        b"# before\nexport A=1"
    )  # no trailing newline: we add one, and take it away again
    bashrc.chmod(0o640)
    assert (
        invoke(
            "proxy.setup", "--http", PROXY, "--layers", "shell", "--root", str(fsroot)
        ).returncode
        == 0
    )
    # the user appends to the file after our block: removal must keep their new line and drop only our block
    with open(bashrc, "ab") as handle:
        handle.write(b"alias gs='git status'\n")
    result = invoke("proxy.remove", "--root", str(fsroot))
    assert result.returncode == 0, result.stderr
    assert "only our part removed" in result.stderr
    assert bashrc.read_bytes() == b"# before\nexport A=1\nalias gs='git status'\n"

    # untouched since setup: the original bytes and mode come back exactly
    bashrc.write_bytes(b"# before\nexport A=1")
    bashrc.chmod(0o640)
    assert (
        invoke(
            "proxy.setup", "--http", PROXY, "--layers", "shell", "--root", str(fsroot)
        ).returncode
        == 0
    )
    assert stat.S_IMODE(bashrc.stat().st_mode) == 0o600
    assert invoke("proxy.remove", "--root", str(fsroot)).returncode == 0
    assert bashrc.read_bytes() == b"# before\nexport A=1"
    assert stat.S_IMODE(bashrc.stat().st_mode) == 0o640


def test_switching_daemon_mode_undoes_the_files_no_longer_needed(fsroot):
    base = ["proxy.setup", "--http", PROXY, "--layers", "daemon", "--root", str(fsroot)]
    assert invoke(*base, "--daemon-mode", "systemd").returncode == 0
    dropins = fsroot / "etc/systemd/system/docker.service.d"
    assert sorted(p.name for p in dropins.iterdir()) == ["http-proxy.conf", "https-proxy.conf"]
    result = invoke(*base, "--daemon-mode", "daemon-json")
    assert result.returncode == 0, result.stderr
    assert list(dropins.iterdir()) == []
    assert (
        json.loads((fsroot / "etc/docker/daemon.json").read_text())["proxies"]["http-proxy"]
        == PROXY
    )


def test_without_systemd_setup_prints_the_restart_commands(fsroot):
    result = invoke(
        "proxy.setup",
        "--http",
        PROXY,
        "--layers",
        "daemon",
        "--daemon-mode",
        "systemd",
        "--root",
        str(fsroot),
    )
    assert result.returncode == 0
    assert (
        "sudo systemctl daemon-reload" in result.stderr
        and "sudo systemctl restart docker" in result.stderr
    )


def test_pip_mirror_is_merged_into_pip_conf_and_removed_again(fsroot):
    conf = fsroot / "home/alice/.config/pip/pip.conf"
    conf.parent.mkdir(parents=True)
    original = "# corporate defaults\n[global]\ntimeout = 60\n\n[install]\nno-compile = true\n"
    conf.write_text(original)
    result = invoke(
        "proxy.setup",
        "--pip-index",
        "http://pypi.mirror.lan:8080/simple",
        "--layers",
        "pip",
        "--root",
        str(fsroot),
    )
    assert result.returncode == 0, result.stderr
    text = conf.read_text()
    assert fsedit.ini_get(text, "global", "index-url") == "http://pypi.mirror.lan:8080/simple/"
    assert (
        fsedit.ini_get(text, "global", "trusted-host") == "pypi.mirror.lan"
    )  # plain http needs it
    assert (
        fsedit.ini_get(text, "global", "timeout") == "60"
        and "[install]\nno-compile = true\n" in text
    )
    conf.write_text(text + "\n[list]\nformat = columns\n")  # edited since: only our keys go
    assert invoke("proxy.remove", "--root", str(fsroot)).returncode == 0
    assert conf.read_text() == original + "\n[list]\nformat = columns\n"


def test_ca_bundle_is_the_system_bundle_plus_the_given_ca(fsroot, tmp_path):
    system = tmp_path / "system.pem"
    cert_a = "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----"
    cert_b = "-----BEGIN CERTIFICATE-----\nBBBB\n-----END CERTIFICATE-----"
    system.write_text(cert_a + "\n")
    corp = tmp_path / "corp.pem"
    corp.write_text(f"subject=corp\n{cert_b}\n{cert_a}\n")
    assert layers.build_ca_bundle(str(corp), [str(system)]) == f"{cert_a}\n{cert_b}\n".encode()
    bad = tmp_path / "bad.pem"
    bad.write_text("not a certificate")
    with pytest.raises(layers.ConfigError, match="holds no PEM certificate"):
        layers.build_ca_bundle(str(bad))

    result = invoke(
        "proxy.setup",
        "--http",
        PROXY,
        "--layers",
        "shell",
        "--ca-cert",
        "/etc/ssl/certs/ca-certificates.crt",
        "--root",
        str(fsroot),
    )
    assert result.returncode == 0, result.stderr
    bundle = "/home/alice/.config/apexkit/ca-bundle.pem"
    text = (fsroot / "home/alice/.bashrc").read_text()
    for name in ("SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "PIP_CERT", "GIT_SSL_CAINFO"):
        assert f"export {name}={bundle}\n" in text
    assert (fsroot / bundle.lstrip("/")).read_bytes().count(b"BEGIN CERTIFICATE") > 10


def test_unwritable_target_fails_before_anything_is_written(fsroot):
    (fsroot / "etc/systemd/system").mkdir(parents=True)
    (fsroot / "etc/systemd/system/docker.service.d").write_text("a file where a directory belongs")
    (fsroot / "home/alice/.bashrc").write_text("keep\n")
    before = snapshot(fsroot)
    result = invoke(
        "proxy.setup", "--http", PROXY, "--daemon-mode", "systemd", "--root", str(fsroot)
    )
    assert result.returncode == 6
    assert "cannot write /etc/systemd/system/docker.service.d/http-proxy.conf" in result.stderr
    assert "--layers shell,container" in result.stderr
    assert snapshot(fsroot) == before


# --- show / env ---------------------------------------------------------------------------------------------------


def test_show_and_env(fsroot):
    assert (
        invoke(
            "proxy.setup", "--http", PROXY, "--root", str(fsroot), "--daemon-mode", "systemd"
        ).returncode
        == 0
    )
    shown = invoke("proxy.show", "--root", str(fsroot))
    assert shown.returncode == 0
    assert "shell: configured" in shown.stdout and "daemon: configured" in shown.stdout
    assert "http://alice:***@proxy.corp.example:3128" in shown.stdout
    data = json.loads(invoke("proxy.show", "--json", "--root", str(fsroot)).stdout)
    assert (
        data["layers"]["container"]["configured"] is True
        and data["layers"]["pip"]["configured"] is False
    )
    # piped (for eval): the real values; the lines are valid shell
    exported = invoke("proxy.env", "--root", str(fsroot))
    assert f"export https_proxy={PROXY}\n" in exported.stdout
    shell = subprocess.run(
        ["bash", "-c", exported.stdout + 'printf %s "$HTTPS_PROXY|$no_proxy"'],
        capture_output=True,
        text=True,
    )
    assert shell.stdout == f"{PROXY}|localhost,127.0.0.0/8,::1"
    assert PASSWORD not in shown.stdout + shown.stderr


def test_env_masks_passwords_on_a_terminal(fsroot):
    import pty

    assert (
        invoke(
            "proxy.setup", "--http", PROXY, "--layers", "shell", "--root", str(fsroot)
        ).returncode
        == 0
    )
    primary, secondary = pty.openpty()
    env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
    env.update(HOME="/home/alice")
    process = subprocess.Popen(
        [sys.executable, "-m", "invoke", "-r", str(ROOT), "proxy.env", "--root", str(fsroot)],
        stdout=secondary,
        stderr=subprocess.DEVNULL,
        env=env,
    )
    os.close(secondary)
    chunks = []
    while True:
        try:
            chunk = os.read(primary, 4096)
        except OSError:
            break
        if not chunk:
            break
        chunks.append(chunk)
    process.wait(60)
    os.close(primary)
    output = b"".join(chunks).decode()
    assert "export https_proxy=http://alice:***@proxy.corp.example:3128" in output
    assert PASSWORD not in output


def test_remove_without_setup_says_so(fsroot):
    result = invoke("proxy.remove", "--root", str(fsroot))
    assert result.returncode == 0 and "nothing to remove" in result.stderr


def test_invoke_list_shows_the_proxy_tasks_with_help():
    result = invoke("--list")
    for name in ("proxy.setup", "proxy.check", "proxy.show", "proxy.env", "proxy.remove"):
        assert name in result.stdout
    assert "--dry-run" in invoke("--help", "proxy.setup").stdout


def test_check_without_a_docker_daemon_skips_those_layers_with_the_reason(fsroot, tmp_path):
    assert (
        invoke(
            "proxy.setup",
            "--http",
            "http://127.0.0.1:9",
            "--layers",
            "daemon,container",
            "--root",
            str(fsroot),
        ).returncode
        == 0
    )
    result = invoke(
        "proxy.check",
        "--layers",
        "daemon,container",
        "--json",
        "--root",
        str(fsroot),
        env={"DOCKER_HOST": f"unix://{tmp_path}/no-such.sock"},
    )
    rows = {row["layer"]: row for row in json.loads(result.stdout)}
    assert result.returncode == 0
    for layer in ("daemon", "container"):
        assert rows[layer]["status"] == "skip"
        assert (
            "Docker daemon is not reachable" in rows[layer]["probe"]
            and "start dockerd" in rows[layer]["hint"]
        )
    assert rows["container"]["configured"] == "/home/alice/.docker/config.json proxies.default"
