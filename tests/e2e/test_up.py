"""Issue 25 item 6: `apexkit up` with its real stages -- apexkit's own commands as child processes given their options
as JSON (issue 39), a real venv, a real (empty) index over HTTP on 127.0.0.1. The install stage is pointed at that
empty index with --no-build, so it fails: the report names the failure and its fix (from install's status file), and
the stages after it are skipped."""

from __future__ import annotations

import functools
import http.server
import json
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import fixture_repos
import pytest
import services
from conftest import ROOT, output


def apexkit(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None):
    return subprocess.run(
        [sys.executable, "-m", "apexkit", *args],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=cwd or ROOT,
    )


@pytest.fixture(scope="module")
def train_venv(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("up") / "train"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True)
    return path


@pytest.fixture(scope="module")
def empty_index(tmp_path_factory):
    """A real PEP 503 index over HTTP on 127.0.0.1 that holds no project."""
    root = tmp_path_factory.mktemp("empty-index")
    (root / "simple").mkdir()
    (root / "simple" / "index.html").write_text("<!DOCTYPE html><html><body></body></html>\n")
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/simple/"
    server.shutdown()


def clean_env(tmp_path: Path) -> dict[str, str]:
    env = {
        k: v for k, v in os.environ.items() if not k.startswith("APEXKIT_") and k != "VIRTUAL_ENV"
    }
    env["APEXKIT_CACHE_DIR"] = str(tmp_path / "cache")
    return env


def test_dry_run_prints_every_stage_and_runs_and_writes_nothing(train_venv, tmp_path):
    report = tmp_path / "report"
    proc = apexkit(
        "up", "--venv", str(train_venv), "--index", "http://127.0.0.1:9/simple/", "--bench",
        "--bench-args", "--model mlp", "--report", str(report), "--dry-run", env=clean_env(tmp_path),
    )  # fmt: skip
    assert proc.returncode == 0, output(proc)
    lines = {
        line.split()[0]: line for line in proc.stdout.splitlines()[1:] if line.startswith("  ")
    }
    assert list(lines) == ["proxy", "doctor", "install", "validate", "bench"]
    assert "skipped: not asked for (--proxy-check)" in lines["proxy"]
    assert f'doctor {{"venv": "{train_venv}", "as_json": true}}' in lines["doctor"]
    assert (
        f'install {{"venv": "{train_venv}"' in lines["install"]
        and '"index": ["http://127.0.0.1:9/simple/"]' in lines["install"]
    )
    assert f'validate {{"interpreter": "{train_venv}/bin/python"' in lines["validate"]
    assert lines["bench"].endswith('"args": ["--model", "mlp"]}')
    assert not report.exists()


def test_invoke_up_is_the_same_command(train_venv, tmp_path):
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "invoke",
            "-r",
            str(ROOT),
            "up",
            "--venv",
            str(train_venv),
            "--dry-run",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=clean_env(tmp_path),
    )
    assert proc.returncode == 0, output(proc)
    assert f'install {{"venv": "{train_venv}", "index": [], "no_build": false' in proc.stdout


def test_no_venv_is_one_line(tmp_path):
    proc = apexkit("up", env=clean_env(tmp_path))
    assert proc.returncode == 2
    assert proc.stderr.strip().startswith("error: no venv given") and proc.stderr.count("\n") == 1
    assert "Traceback" not in output(proc)


def test_offline_and_build_options_reach_install_and_bad_quotes_are_one_line(train_venv, tmp_path):
    argv = ("up", "--venv", str(train_venv), "--dry-run", "--build-options")
    proc = apexkit(*argv, "--jobs 2", "--offline", env=clean_env(tmp_path))
    assert proc.returncode == 0, output(proc)
    assert '"build_options": "--offline --jobs 2"}' in proc.stdout
    bad = apexkit(*argv, '"--wheelhouse x', env=clean_env(tmp_path))
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1, output(bad)
    assert bad.stderr.startswith(
        "error: --build-options '\"--wheelhouse x' cannot be split into words"
    )


def test_install_failing_is_reported_with_its_fix_and_later_stages_are_skipped(
    train_venv, empty_index, tmp_path
):
    report = tmp_path / "report"
    argv = ("up", "--venv", str(train_venv), "--index", empty_index, "--no-build", "--bench")
    argv += ("--device", "cpu", "--report", str(report))
    proc = apexkit(*argv, env=clean_env(tmp_path))
    assert proc.returncode == 1, output(proc)
    assert "Traceback" not in output(proc)
    data = json.loads((report / "up.json").read_text())
    stages = {s["name"]: s for s in data["stages"]}
    assert [s["name"] for s in data["stages"]] == [
        "proxy",
        "doctor",
        "install",
        "validate",
        "bench",
    ]
    assert stages["doctor"]["status"] == "ok" and stages["doctor"]["exit_code"] == 0
    install = stages["install"]
    assert install["status"] == "failed" and install["exit_code"] not in (0, None)
    assert install["first_failure"]["cause"] and install["first_failure"]["fix"]
    assert install["command"] == "install"
    assert install["options"]["index"] == [empty_index] and install["options"]["no_build"] is True
    # the child got exactly these options as JSON (no command line), and answered in its status file
    given = json.loads((report / "logs" / "install.options.json").read_text())
    assert given == {"command": "install", "options": install["options"]}
    status = json.loads((report / "logs" / "install.status.json").read_text())
    assert status["exit_code"] == install["exit_code"]
    assert (
        status["error"]
        == f"{install['first_failure']['cause']} -- next: {install['first_failure']['fix']}"
    )
    install_log = Path(install["log"])
    assert install_log.is_file() and install_log.parent == report / "logs"
    assert install_log.read_text().startswith("+ install {")  # the stage, then its whole output
    for name in ("validate", "bench"):
        assert (stages[name]["status"], stages[name]["detail"]) == ("skipped", "install failed")
    assert data["first_failure"] == {"stage": "install", **install["first_failure"]}
    assert (
        data["facts"]["python"]
        == f"{sys.version_info[0]}.{sys.version_info[1]}.{sys.version_info[2]}"
    )
    assert data["facts"]["apex"] is None
    md = (report / "up.md").read_text()
    assert "| install | failed |" in md and "skipped: install failed" in md
    assert install["first_failure"]["fix"].replace("`", "'") in md
    assert "failed at install" in proc.stdout

    # again: doctor's last run succeeded for this venv and torch -- done, not run; install runs (and fails) again
    before = (report / "logs" / "doctor.log").stat().st_mtime_ns
    again = apexkit(*argv, "--json", env=clean_env(tmp_path))
    assert again.returncode == 1, output(again)
    data = json.loads(again.stdout)
    stages = {s["name"]: s for s in data["stages"]}
    assert stages["doctor"]["status"] == "done"
    assert f"done (from {stages['doctor']['finished']})" in stages["doctor"]["detail"]
    assert (report / "logs" / "doctor.log").stat().st_mtime_ns == before
    assert stages["install"]["status"] == "failed"

    # a corrupt state is ignored with one line, and every stage runs
    (report / "state.json").write_text('{"format": "apexkit-up-state/1", "stages": {"doctor": 5}}')
    third = apexkit(*argv, env=clean_env(tmp_path))
    assert third.returncode == 1, output(third)
    assert sum("ignoring" in line for line in third.stderr.splitlines()) == 1
    data = json.loads((report / "up.json").read_text())
    assert data["stages"][1]["status"] == "ok"


def test_a_link_planted_as_a_stage_log_is_refused_not_followed(train_venv, tmp_path):
    report = tmp_path / "report"
    (report / "logs").mkdir(parents=True)
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me\n")
    (report / "logs" / "doctor.log").symlink_to(victim)
    proc = apexkit(
        "up", "--venv", str(train_venv), "--report", str(report), env=clean_env(tmp_path)
    )
    assert proc.returncode == 2, output(proc)
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "symbolic link" in errors[0], output(proc)
    assert victim.read_text() == "keep me\n" and "Traceback" not in output(proc)


def venv_with_apex(path: Path) -> Path:
    """A bare venv holding a stand-in apex distribution (its metadata and RECORD, no code)."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True)
    info = next(path.glob("lib/python*/site-packages")) / "apex-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: apex\nVersion: 0.1\n")
    (info / "RECORD").write_text("apex-0.1.dist-info/METADATA,,\napex-0.1.dist-info/RECORD,,\n")
    return path


def test_validate_runs_for_real_once_install_is_done_and_names_the_failed_check(
    empty_index, tmp_path
):
    """The state says install is done for exactly this venv (the key up itself computes): validate then runs the
    real bench/validate_env.py in the venv, which holds no torch, and its first failed check is the stage's failure."""
    from apexkit import up

    train_venv = venv_with_apex(
        tmp_path / "train"
    )  # install's claim holds: apex is there (up.undone)
    report = tmp_path / "report"
    argv = ["--venv", str(train_venv), "--index", empty_index, "--no-build", "--device", "cpu"]
    opts = up.make_options(
        venv=str(train_venv),
        index=[empty_index],
        no_build=True,
        device="cpu",
        report=str(report),
        environ={},
    )
    facts = up.probe(opts.target.python)
    key = up.digest(up.stage_inputs("install", facts, opts, {}))
    report.mkdir()
    done = {"install": up.Done(key, "2026-12-02T07:00:00+00:00", 12.5, {"wheel": "apex-x.whl"})}
    (report / "state.json").write_bytes(up.state_bytes(done))
    proc = apexkit("up", *argv, "--bench", "--report", str(report), env=clean_env(tmp_path))
    assert proc.returncode == 1, output(proc)
    data = json.loads((report / "up.json").read_text())
    stages = {s["name"]: s for s in data["stages"]}
    assert stages["install"]["status"] == "done" and stages["install"]["result"] == {
        "wheel": "apex-x.whl"
    }
    assert stages["install"]["detail"] == "done (from 2026-12-02T07:00:00+00:00)"
    validate = stages["validate"]
    assert validate["status"] == "failed" and validate["detail"].startswith("torch: ")
    assert validate["first_failure"] == {
        "cause": "torch: ModuleNotFoundError: No module named 'torch'",
        "fix": "install torch into this venv",
    }
    assert json.loads((report / "validate.json").read_text())["ok"] is False
    assert (stages["bench"]["status"], stages["bench"]["detail"]) == ("skipped", "validate failed")
    state = json.loads((report / "state.json").read_text())["stages"]
    assert set(state) == {"doctor", "install"}  # validate failed: it runs again next time


# --- a whole `up` with an index hit -----------------------------------------------------------------------------

TORCH = services.TORCH
make_torch_venv = services.make_torch_venv


@pytest.fixture(scope="module")
def team_index(repos, shared_cache, tmp_path_factory) -> Path:
    """One fixture build (torch 2.13.0, Python 3.11), published with `invoke publish` into a directory index."""
    from conftest import Runner

    tmp = tmp_path_factory.mktemp("up-team")
    runner = Runner(repos, shared_cache, tmp)
    built = runner.nox("3.11", "--no-smoke-test", "--jobs", "2")
    assert built.returncode == 0, output(built)[-3000:]
    index = tmp / "index"
    published = subprocess.run(
        [
            sys.executable,
            "-m",
            "invoke",
            "-r",
            str(ROOT),
            "publish",
            "--dist",
            str(runner.dist),
            "--index",
            str(index),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert published.returncode == 0, output(published)[-3000:]
    return index


def test_a_whole_up_with_an_index_hit_then_again_with_everything_done(team_index, tmp_path):
    venv = make_torch_venv(tmp_path / "train")
    report = tmp_path / "report"
    argv = (
        "up",
        "--venv",
        str(venv),
        "--index",
        team_index.as_uri(),
        "--no-build",
        "--device",
        "cpu",
    )
    argv += ("--report", str(report))
    proc = apexkit(*argv, env=clean_env(tmp_path))
    assert "Traceback" not in output(proc)
    data = json.loads((report / "up.json").read_text())
    stages = {s["name"]: s for s in data["stages"]}
    assert stages["doctor"]["status"] == "ok", output(proc)
    install = stages["install"]
    assert install["status"] == "ok", output(proc)
    listing = json.loads((team_index / "index.json").read_text())
    published = {f["filename"]: f["sha256"] for f in listing["files"]}
    assert install["result"]["status"] == "installed"
    assert published[install["result"]["wheel"]] == install["result"]["sha256"]
    assert data["facts"]["torch"] == TORCH and data["facts"]["apex"] == "0.1+ascend.torch2.13.0"
    assert stages["validate"]["status"] == "ok" and stages["validate"]["detail"] == "ready", output(
        proc
    )
    assert (
        json.loads((report / "validate.json").read_text())["ok"] is True
    )  # the real validation, in the venv
    assert proc.returncode == 0 and "ready" in proc.stdout.splitlines()[-1]

    # again: every stage is done for this venv, torch and wheel -- none runs, the report says when each was done
    again = apexkit(*argv, "--json", env=clean_env(tmp_path))
    assert again.returncode == 0, output(again)
    data = json.loads(again.stdout)
    statuses = {s["name"]: s["status"] for s in data["stages"]}
    assert statuses == {
        "proxy": "skipped",
        "doctor": "done",
        "install": "done",
        "validate": "done",
        "bench": "skipped",
    }
    assert {s["name"]: s["result"] for s in data["stages"]}["install"] == install["result"]
    assert "▸ install (log" not in again.stderr and "install: done (from " in again.stderr


# --- issue 40 items 3 and 7: what up believes, and its children ------------------------------------------------


def plant(
    venv: Path, report: Path, stages=("doctor", "install", "validate"), device="cpu", **kw
) -> None:
    """A state.json saying `stages` are done, its keys computed with apexkit's own functions for `venv` as it is now
    (review M3's planting script), with the files a done doctor and validate leave."""
    from apexkit import up

    opts = up.make_options(venv=str(venv), device=device, report=str(report), environ={}, **kw)
    facts = up.probe(opts.target.python)
    done = {
        name: up.Done(
            up.digest(up.stage_inputs(name, facts, opts, {})), "2026-12-04T00:00:00+00:00", 1.0
        )
        for name in stages
    }
    (report / "logs").mkdir(parents=True, exist_ok=True)
    (report / "state.json").write_bytes(up.state_bytes(done))
    (report / "logs" / "doctor.json").write_text("[]\n")
    said = {"ok": True, "python": str(opts.target.python), "device": device, "checks": []}
    (report / "validate.json").write_text(json.dumps(said))


@pytest.mark.skipif(
    os.geteuid() != 0, reason="needs root: the report directory belongs to uid 65534"
)
def test_a_state_planted_by_another_user_is_refused_not_ready(train_venv, tmp_path):
    """Review M3 as it was run: another user's report directory holds a state that says every stage is done."""
    report = tmp_path / "reports" / "up" / "train"
    plant(train_venv, report)
    for path in (tmp_path / "reports", tmp_path / "reports" / "up", report):
        os.chown(path, 65534, 65534)
    argv = ("up", "--venv", str(train_venv), "--device", "cpu", "--report", str(report))
    proc = apexkit(*argv, env=clean_env(tmp_path))
    assert proc.returncode == 2, output(proc)
    assert "ready" not in proc.stdout and not (report / "up.json").exists()
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and f"the up report directory {report} is " in errors[0], output(proc)
    assert "--report DIR" in errors[0] and "Traceback" not in output(proc)


def test_a_state_made_for_another_venv_of_that_name_skips_nothing(empty_index, tmp_path):
    """The same path, the same Python and torch, but another venv directory (or node): the state does not match."""
    venv = venv_with_apex(tmp_path / "train")
    report = tmp_path / "report"
    plant(venv, report, index=[empty_index], no_build=True)
    venv.rename(tmp_path / "train.old")
    venv_with_apex(tmp_path / "train")  # same path, same facts, another inode
    argv = ("up", "--venv", str(venv), "--index", empty_index, "--no-build", "--device", "cpu")
    proc = apexkit(*argv, "--report", str(report), env=clean_env(tmp_path))
    assert proc.returncode == 1, output(proc)
    stages = {
        s["name"]: s["status"] for s in json.loads((report / "up.json").read_text())["stages"]
    }
    assert stages["doctor"] == "ok" and stages["install"] == "failed", output(proc)
    assert "done (from" not in proc.stderr and proc.stdout.splitlines()[-1] == "failed at install"


def test_install_claimed_done_with_no_apex_in_the_venv_runs_again(
    train_venv, empty_index, tmp_path
):
    """The state is ours and for this very venv and node, but apex is not installed now: install runs again."""
    report = tmp_path / "report"
    plant(train_venv, report, index=[empty_index], no_build=True)
    argv = (
        "up",
        "--venv",
        str(train_venv),
        "--index",
        empty_index,
        "--no-build",
        "--device",
        "cpu",
    )
    proc = apexkit(*argv, "--report", str(report), env=clean_env(tmp_path))
    assert proc.returncode == 1, output(proc)
    stages = {
        s["name"]: s["status"] for s in json.loads((report / "up.json").read_text())["stages"]
    }
    assert stages == {
        "proxy": "skipped",
        "doctor": "done",
        "install": "failed",
        "validate": "skipped",
        "bench": "skipped",
    }
    said = "▸ install: the state says done, but apex is not installed in the venv now: running it again"
    assert said in proc.stderr.splitlines(), output(proc)


def dead(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def wait_for(what, seconds: float = 120.0) -> bool:
    import time

    deadline = time.monotonic() + seconds
    while not what():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def test_a_stage_child_leaves_nothing_of_its_process_group_behind(tmp_path):
    from apexkit import up

    spawn = "import subprocess, sys; print(subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']).pid)"
    with open(tmp_path / "out", "w") as out:
        assert up._call([sys.executable, "-c", spawn], stdout=out, stdin=subprocess.DEVNULL) == 0
    assert dead(int((tmp_path / "out").read_text()))


@pytest.mark.parametrize("how", ["SIGTERM", "SIGKILL"])
def test_killing_up_kills_its_install_child(tmp_path, how):
    """Review: `up` killed, its install child went on installing. Here install hangs in its probe of the venv (the
    venv's python sleeps when install runs it): up is killed there, and the install child and what it runs die."""
    import signal

    venv = tmp_path / "train"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    python.unlink()
    python.write_text(
        f'#!/bin/sh\nif [ "$1" = -s ]; then echo $$ > {tmp_path}/probe.pid\n'
        f"  exec {sys.executable} -c 'import time; time.sleep(600)'; fi\nexec {sys.executable} \"$@\"\n"
    )
    python.chmod(0o755)
    report = tmp_path / "report"
    plant(venv, report, stages=("doctor",))
    argv = [sys.executable, "-m", "apexkit", "up", "--venv", str(venv), "--report", str(report)]
    proc = subprocess.Popen(
        argv,
        cwd=ROOT,
        env=clean_env(tmp_path),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    pid_file = tmp_path / "probe.pid"
    hanging: list[int] = []
    try:
        assert wait_for(lambda: pid_file.exists() and pid_file.read_text().strip()), (
            "install never probed"
        )
        hanging.append(int(pid_file.read_text()))
        stat = Path(f"/proc/{hanging[0]}/stat").read_text().rsplit(")", 1)[1].split()
        hanging.append(
            int(stat[1])
        )  # its parent: install's child (python -m apexkit.commands FILE)
        assert "apexkit.commands" in Path(f"/proc/{hanging[1]}/cmdline").read_text()
        proc.send_signal(getattr(signal, how))
        out, err = proc.communicate(timeout=120)
        assert wait_for(lambda: all(dead(p) for p in hanging)), f"still running after up: {hanging}"
    finally:
        for pid in hanging:
            if not dead(pid):
                os.kill(pid, signal.SIGKILL)
        if proc.poll() is None:
            proc.kill()
    if how == "SIGTERM":  # up stopped as after Ctrl-C: the report says so
        assert proc.returncode == 130, out + err
        install = json.loads((report / "up.json").read_text())["stages"][2]
        assert install["status"] == "failed" and install["first_failure"]["cause"].startswith(
            "interrupted"
        )


# --- issue 41 item 2: up offline, in a network namespace with no network ---------------------------------------


def _no_network() -> list[str]:
    """`unshare -n` (a network namespace without a network, loopback down) where this user may make one."""
    can = os.geteuid() == 0 and shutil.which("unshare")
    if can and subprocess.run(["unshare", "-n", "true"], capture_output=True).returncode == 0:
        return ["unshare", "-n"]
    return []


WHEELHOUSE = (
    "torch==2.13.0",
    "setuptools>=61",
    "wheel",
)  # the build venv's, for the fixture's Ascend apex


def test_up_offline_builds_from_shallow_mirrors_and_a_wheelhouse_with_no_network(repos, tmp_path):
    """`up --offline --build-options "--wheelhouse W"` with a fresh cache, the sources being mirrors made the
    documented way (shallow, at the pinned commit and the branch) and given as a path and as a file:// URL."""
    house = tmp_path / "wheelhouse"
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "-q", "-d", str(house), *WHEELHOUSE],
        check=True,
        timeout=600,
        capture_output=True,
    )
    mirrors = tmp_path / "mirrors"
    mirrors.mkdir()
    ascend = fixture_repos.shallow_mirror(
        repos.ascend_url, mirrors / "ascend-apex.git", "master:refs/heads/master"
    )
    pin = repos.nvidia_pin
    nvidia = fixture_repos.shallow_mirror(
        repos.nvidia_url, mirrors / "nvidia-apex.git", f"{pin}:refs/tags/pin-{pin}"
    )
    venv = make_torch_venv(tmp_path / "train")
    env = {
        k: v
        for k, v in clean_env(tmp_path).items()
        if not k.lower().endswith("_proxy") and not k.startswith(("PIP_", "UV_"))
    }
    env.update(
        PIP_CONFIG_FILE=os.devnull,  # no index but the wheelhouse
        APEXKIT_ASCEND_APEX_URL=str(ascend),
        APEXKIT_NVIDIA_APEX_URL=nvidia.as_uri(),
        APEXKIT_DIST_DIR=str(tmp_path / "dist"),
        APEXKIT_BUILD_DIR=str(tmp_path / "build"),
    )
    report = tmp_path / "report"
    argv = ["up", "--venv", str(venv), "--offline", "--build-options", f"--wheelhouse {house}"]
    argv += ["--device", "cpu", "--report", str(report)]
    proc = subprocess.run(
        [*_no_network(), sys.executable, "-m", "apexkit", *argv],
        capture_output=True,
        text=True,
        timeout=900,
        env=env,
        cwd=ROOT,
    )
    assert proc.returncode == 0, output(proc)[-4000:]
    stages = {s["name"]: s for s in json.loads((report / "up.json").read_text())["stages"]}
    assert stages["install"]["result"]["status"] == "built-and-installed"
    assert stages["validate"]["status"] == "ok" and stages["validate"]["detail"] == "ready"
    log = (report / "logs" / "install.log").read_text()
    assert '"build_options": "--offline --wheelhouse ' in log.splitlines()[0]
    uv = [line for line in log.splitlines() if line.startswith("+ ") and "uv pip install " in line]
    assert uv and all("--offline" in line for line in uv), uv  # uv never asks an index
    assert "trying pip" not in log and "attempt" not in log
    assert len(list((tmp_path / "cache" / "git").glob("*.git"))) == 2
    wheel = stages["install"]["result"]["wheel"]
    assert stages["install"]["detail"] == f"{wheel}: built"

    # Issue 41: --offline with no wheelhouse needs none when nothing is built. A rerun with --force (apex installed
    # already, its wheel in the wheel cache), then a second venv (a wheel-cache hit): each row names the real source
    def offline_up(venv: Path, report: Path) -> dict:
        argv = ["up", "--venv", str(venv), "--offline", "--device", "cpu", "--force"]
        proc = subprocess.run(
            [*_no_network(), sys.executable, "-m", "apexkit", *argv, "--report", str(report)],
            capture_output=True, text=True, timeout=900, env=env, cwd=ROOT,
        )  # fmt: skip
        assert proc.returncode == 0, output(proc)[-4000:]
        assert "--offline needs --wheelhouse" not in proc.stdout + proc.stderr
        return {s["name"]: s for s in json.loads((report / "up.json").read_text())["stages"]}

    again = offline_up(venv, tmp_path / "report-again")
    assert again["install"]["result"]["status"] == "already-installed"
    assert again["install"]["detail"] == f"{wheel}: installed already"
    hit = offline_up(make_torch_venv(tmp_path / "train2"), tmp_path / "report-hit")
    assert hit["install"]["result"]["status"] == "built-and-installed"
    assert hit["install"]["detail"] == f"{wheel}: wheel cache"
    assert hit["validate"]["detail"] == "ready"


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root: the reports folder belongs to uid 65534")
def test_a_report_dir_others_can_swap_is_refused_before_anything_is_made_there(
    train_venv, tmp_path
):
    """Issue 40 (F2): root's up made reports/up/train/logs in a world-writable folder of uid 65534 before it
    refused it (and chmod-ed through a link swapped in meanwhile). Now it refuses first: nothing is made there."""
    reports = tmp_path / "reports"
    reports.mkdir()
    os.chown(reports, 65534, 65534)
    os.chmod(reports, 0o777)
    report = reports / "up" / "train"
    proc = apexkit(
        "up", "--venv", str(train_venv), "--report", str(report), env=clean_env(tmp_path)
    )
    assert proc.returncode == 2, output(proc)
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and f"the up report directory {report} is inside {reports}" in errors[0]
    assert os.listdir(reports) == [], "made before it was checked"
