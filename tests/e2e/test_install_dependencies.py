"""apexkit install adding what a wheel requires, with a real venv and its real pip (pip's --dry-run --report, the
constraints file, the probe before and after) against a folder of tiny wheels standing for the user's index: what
the wheel requires comes in with its own dependencies, and a dependency that would bring torch_npu, replace what the
venv holds, or be too many, is refused with nothing installed."""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import json
import os
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest
from fakes import NOBODY

from apexkit import untrusted
from apexkit.errors import EnvironmentSetupError
from apexkit.install import run
from apexkit.install import target as targets

ROOT = Path(__file__).resolve().parents[2]


def tiny_wheel(
    folder: Path, name: str, version: str, *requires: str, files: dict[str, bytes] | None = None
) -> Path:
    """A pure-Python wheel holding one empty module (and `files`) and its METADATA, RECORD with real hashes (pip
    checks them)."""
    stem = name.replace("-", "_")
    dist_info = f"{stem}-{version}.dist-info"
    files = {
        **(files or {}),
        f"{stem}_mod/__init__.py": b"",
        f"{dist_info}/METADATA": (
            f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
            + "".join(f"Requires-Dist: {r}\n" for r in requires)
        ).encode(),
        f"{dist_info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    rows = [
        f"{path},sha256={base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b'=').decode()},{len(data)}"
        for path, data in files.items()
    ]
    files[f"{dist_info}/RECORD"] = ("\n".join([*rows, f"{dist_info}/RECORD,,"]) + "\n").encode()
    wheel = folder / f"{stem}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        for path, data in files.items():
            zf.writestr(path, data)
    return wheel


@pytest.fixture
def venv(tmp_path):
    """A venv holding a stand-in torch 2.0.0 and numpy 2.0, its pip reaching only `links` (the user's index)."""
    links = tmp_path / "links"
    links.mkdir()
    for name, version, *requires in [
        ("torch", "2.0.0"),
        ("numpy", "2.0"),
        ("numpy", "3.0"),
        ("torch-npu", "2.0.0"),
        ("foo", "1.0", "bar>=1"),
        ("bar", "1.0"),
        ("wantsnpu", "1.0", "torch-npu"),
        ("wantsnumpy", "1.0", "numpy>=3"),
        ("many", "1.0", *(f"d{i}" for i in range(9))),
        *((f"d{i}", "1.0") for i in range(9)),
    ]:
        tiny_wheel(links, name, version, *requires)
    ran = tmp_path / "ran"  # what a file of a refused package leaves when it runs
    for name, files in [
        ("overtorch", {"torch_mod/__init__.py": b"import os\nos.system('id > %s')\n" % bytes(ran)}),
        ("intotorch", {"torch_mod/extra.py": b""}),
        ("twodists", {"twodists-1.0.data/purelib/zzz-1.0.dist-info/METADATA": b"Name: zzz\n"}),
        ("haspth", {"haspth.pth": b"import os; os.system('id > %s')\n" % bytes(ran)}),
        ("customize", {"sitecustomize.py": b""}),
        ("overpip", {"overpip-1.0.data/scripts/pip": b"#!/bin/sh\n"}),
        # review 3, F3: startup code in any form, F4: under another's top-level name (apex's own included)
        (
            "scpackage",
            {"sitecustomize/__init__.py": b"import os\nos.system('id > %s')\n" % bytes(ran)},
        ),
        ("scdata", {"scdata-1.0.data/purelib/usercustomize/__init__.py": b""}),
        ("scpyc", {"sitecustomize.pyc": b""}),
        ("scext", {"usercustomize.cpython-311-x86_64-linux-gnu.so": b""}),
        ("pth_dir", {"x.pth/y.py": b""}),
        ("oversix", {"six/__init__.py": b"X = 'not six'\n"}),
        ("intoapex", {"apex_mod/zz_other.py": b""}),  # the test apex wheel's package
        ("twin1", {"shared/a.py": b""}),
        ("twin2", {"shared/b.py": b""}),
        # review 4, F2: bytecode `import six` runs (no six.opt-2 .pyc there yet); F3: a script over bin/python3
        ("pycsix", {f"__pycache__/six.{sys.implementation.cache_tag}.opt-2.pyc": b""}),
        (
            "eppython",
            {"eppython-1.0.dist-info/entry_points.txt": b"[console_scripts]\npython3 = x:y\n"},
        ),
    ]:
        tiny_wheel(links, name, "1.0", files=files)
    path = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(path)], check=True, timeout=300)
    env = {
        "PATH": os.environ["PATH"],
        "HOME": str(tmp_path),
        "PIP_CONFIG_FILE": os.devnull,
        "PIP_NO_INDEX": "1",
        "PIP_FIND_LINKS": str(links),
    }
    tiny_wheel(
        links, "six", "1.16", files={"six.py": b"X = 'six'\n"}
    )  # a single-module distribution
    pip = [str(path / "bin" / "python"), "-m", "pip", "install", "-q", "torch==2.0.0", "numpy==2.0"]
    pip.append("six==1.16")
    made = subprocess.run(pip, env=env, capture_output=True, text=True, timeout=300)
    assert made.returncode == 0, made.stderr[-2000:]
    return path, env


def install(venv, tmp_path, *requires: str) -> tuple[run.Result | None, str, dict]:
    """run._install of an apex wheel requiring torch==2.0.0 and `requires` (the real probe, the real pip); returns
    (the result or None, the error line or "", the venv's distributions after)."""
    path, env = venv
    folder = tmp_path / "apex"
    folder.mkdir(exist_ok=True)
    wheel = tiny_wheel(folder, "apex", "0.1+ascend.torch2.0.0", "torch==2.0.0", *requires)
    named = f"--venv {path}"
    before = targets.probe(str(path / "bin" / "python"), named, env)
    result = run.Result("would-install", None, None, "file:///index", before.venv, None, None, None)
    sha = untrusted.sha256_file(wheel)
    try:
        done, error = run._install(before, named, wheel, sha, result, "installed", env), ""
    except run.InstallError as exc:
        done, error = None, str(exc)
    return done, error, listed(venv)


def listed(venv) -> dict[str, str]:
    """The venv's distributions as its pip lists them: {name: version}."""
    path, env = venv
    proc = subprocess.run(
        [str(path / "bin" / "python"), "-m", "pip", "list", "--format", "json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    return {d["name"].lower(): d["version"] for d in json.loads(proc.stdout)}


def test_a_dependency_comes_with_its_own_and_both_are_named(venv, tmp_path):
    done, error, after = install(venv, tmp_path, "foo")
    assert done is not None, error
    assert sorted(done.added) == ["bar==1.0", "foo==1.0"]  # bar: foo's, not the wheel's
    assert (after["foo"], after["bar"], after["apex"]) == ("1.0", "1.0", "0.1+ascend.torch2.0.0")
    assert (after["torch"], after["numpy"]) == ("2.0.0", "2.0")


@pytest.mark.parametrize(
    ("requires", "why"),
    [
        (
            "wantsnpu",
            "could not add them",
        ),  # torch_npu in a venv without it: `import torch` would load it
        ("wantsnumpy", "could not add them"),  # numpy 2.0 -> 3.0: the constraints hold it
        ("many", "install 10 packages (at most 8 are added)"),
    ],
)
def test_a_dependency_that_would_change_the_venv_is_refused_nothing_installed(
    venv, tmp_path, requires, why
):
    before = listed(venv)
    done, error, after = install(venv, tmp_path, requires)
    assert done is None and why in error and "nothing installed" in error, error
    assert "\n" not in error and "Traceback" not in error
    assert after == before  # not apex, not what the wheel requires, not theirs


def test_a_file_other_than_the_one_pips_dry_run_chose_is_not_installed(venv, tmp_path, monkeypatch):
    """The second pip call installs by the sha256 of the file the dry run chose (--require-hashes): an index that
    serves another build of foo 1.0 in between is refused by pip itself, nothing installed."""
    monkeypatch.setattr(run, "_sha256_of", lambda info: "0" * 64)
    before = listed(venv)
    done, error, after = install(venv, tmp_path, "foo")
    assert done is None and "nothing installed" in error and "HASHES" in error, error
    assert after == before


def site_files(venv) -> dict[str, bytes]:
    """Every file of the venv's lib/ and bin/ (no __pycache__) and its bytes."""
    path, _ = venv
    return {
        str(p.relative_to(path)): p.read_bytes()
        for top in ("lib", "bin")
        for p in sorted((path / top).rglob("*"))
        if p.is_file() and not p.is_symlink() and "__pycache__" not in p.parts
    }


@pytest.mark.parametrize(
    ("requires", "why"),
    [
        ("overtorch", "site-packages/torch_mod/__init__.py', which torch installed"),  # review M1
        ("intotorch", "inside the package torch_mod of torch"),
        (
            "twodists",
            "another distribution's metadata ('twodists-1.0.data/purelib/zzz-1.0.dist-info",
        ),
        ("haspth", "'haspth.pth', which every start of the venv's python runs"),
        ("customize", "'sitecustomize.py', which every start of the venv's python runs"),
        ("overpip", "would write 'bin/pip', which pip installed"),
        ("scpackage", "'sitecustomize/__init__.py', which every start of the venv's python runs"),
        ("scdata", "'usercustomize/__init__.py', which every start of the venv's python runs"),
        ("scpyc", "'sitecustomize.pyc', which every start of the venv's python runs"),
        (
            "scext",
            "usercustomize.cpython-311-x86_64-linux-gnu.so', which every start of the venv's",
        ),
        ("pth_dir", "'x.pth/y.py', which every start of the venv's python runs"),
        ("oversix", "site-packages/six/__init__.py', inside the package six of six"),
        ("intoapex", "site-packages/apex_mod/zz_other.py', inside the package apex_mod of apex"),
        ("twin1 twin2", "site-packages/shared/b.py', inside the package shared of twin1"),
        ("pycsix", ".opt-2.pyc', inside the package six of six"),
        ("eppython", "would write 'bin/python3', which no distribution lists"),
    ],
)
def test_a_dependency_writing_outside_its_own_names_is_refused_before_anything_runs(
    venv, tmp_path, requires, why
):
    """Review M1: the files of each package pip would add are read before it is installed (zip members and RECORD):
    one that would write torch's files (or into torch's package, a .pth, a sitecustomize, another distribution's
    metadata, a script of pip) is refused, nothing installed, torch's files intact, nothing of it run."""
    before, files = listed(venv), site_files(venv)
    done, error, after = install(venv, tmp_path, *requires.split())
    assert done is None and why in error and "; nothing installed --" in error, error
    assert "\n" not in error and "Traceback" not in error
    assert after == before and site_files(venv) == files
    assert not (tmp_path / "ran").exists()


def test_the_undo_removes_only_what_this_run_installed(venv, tmp_path):
    """Review M2: another user installs d0 (and moves numpy) after apexkit's first probe; apexkit's install then
    fails its check (numpy moved) and takes apex back -- and only apex: d0 stays."""
    path, env = venv
    folder = tmp_path / "apex"
    folder.mkdir()
    wheel = tiny_wheel(folder, "apex", "0.1+ascend.torch2.0.0", "torch==2.0.0")
    named = f"--venv {path}"
    before = targets.probe(str(path / "bin" / "python"), named, env)
    meanwhile = [
        str(path / "bin" / "python"),
        "-m",
        "pip",
        "install",
        "-q",
        "d0==1.0",
        "numpy==3.0",
    ]
    subprocess.run(meanwhile, env=env, check=True, capture_output=True, timeout=300)
    result = run.Result("would-install", None, None, "x", before.venv, None, None, None)
    with pytest.raises(run.InstallError) as err:
        run._install(before, named, wheel, untrusted.sha256_file(wheel), result, "installed", env)
    assert "numpy 2.0 -> 3.0" in err.value.cause and "apex uninstalled again" in err.value.cause
    after = listed(venv)
    assert after.get("d0") == "1.0" and "apex" not in after


def test_an_install_killed_while_pip_writes_is_repaired_by_the_next_run(venv, tmp_path):
    """Item 7: apexkit killed -9 while pip writes apex into the venv: pip dies with it; the next run says so in one
    line and takes back what was written (files with no dist-info), the venv as it was; no copy of the wheel left,
    in /tmp or in the cache. That next run, failing (--no-build, no index), prints one JSON object (review F4)."""
    path, env = venv
    folder = tmp_path / "apex"
    folder.mkdir()
    extra = {f"apex/m{i}.py": b"x = %d\n" % i for i in range(6)}
    wheel = tiny_wheel(folder, "apex", "0.1+ascend.torch2.0.0", "torch==2.0.0", files=extra)
    before, files = listed(venv), site_files(venv)
    paused, tmpdir = tmp_path / "paused", tmp_path / "tmp"
    tmpdir.mkdir()
    env = {**env, "APEXKIT_CACHE_DIR": str(tmp_path / "cache"), "TMPDIR": str(tmpdir)}
    env["APEXKIT_TEST_PIP_PAUSED"] = str(paused)
    script = Path(__file__).with_name("pause_in_pip.py")
    proc = subprocess.Popen([sys.executable, str(script), "3", str(path), str(wheel)], env=env)
    try:
        for _ in range(1200):
            if paused.exists() or proc.poll() is not None:
                break
            time.sleep(0.1)
        assert paused.exists(), "pip never paused"
        pip = int(paused.read_text())
        left = [p for p in (path / "lib").rglob("apex/*.py")]
        assert left, "pip wrote nothing of apex"
    finally:
        proc.kill()
        proc.wait()
    for _ in range(300):  # pip dies with it (PR_SET_PDEATHSIG), reaped by init
        if not _alive(pip):
            break
        time.sleep(0.1)
    assert not _alive(pip)
    again = subprocess.run(
        [sys.executable, "-m", "apexkit", "install", "--venv", str(path), "--no-build", "--json"],
        env={**{k: v for k, v in env.items() if not k.startswith("PIP_")}, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
    )
    assert again.returncode == 1, again.stderr
    assert "an earlier apexkit install into" in again.stderr and "was interrupted" in again.stderr
    assert "removed" in again.stderr and "repaired" in again.stderr, again.stderr
    out = json.loads(again.stdout)  # one object, nothing else on stdout
    assert out["status"] == "failed" and "no wheel fits" in out["error"] and out["hint"]
    assert listed(venv) == before and site_files(venv) == files
    assert not list(tmpdir.glob("apexkit-install-*"))
    assert not list((tmp_path / "cache").rglob("apexkit-install-*"))


def _alive(pid: int) -> bool:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    return "State:\tZ" not in status


def test_the_probe_runs_no_startup_code_of_the_venv(venv, tmp_path):
    """Review 3, F3: the probe (before and after each pip call) runs with site processing off: a sitecustomize or a
    .pth `import` line in the venv runs nothing, and the probe still sees what the venv holds (a .pth's folder too)."""
    path, env = venv
    site = next((path / "lib").glob("python*/site-packages"))
    ran = tmp_path / "ran"
    (site / "sitecustomize.py").write_text(f"open({str(ran)!r}, 'a').write('sitecustomize')\n")
    extra = tmp_path / "extra"
    (extra / "other-1.0.dist-info").mkdir(parents=True)
    (extra / "other-1.0.dist-info" / "METADATA").write_text("Name: other\nVersion: 1.0\n")
    (site / "x.pth").write_text(f"{extra}\nimport os; open({str(ran)!r}, 'a').write('pth')\n")
    found = targets.probe(str(path / "bin" / "python"), f"--venv {path}", env)
    assert not ran.exists(), ran.read_text()
    assert (found.torch, found.dists["numpy"], found.seen["other"]) == ("2.0.0", "2.0", "1.0")
    assert found.is_venv and found.venv == str(path) and str(site) in found.site_dirs


def test_ups_probe_runs_no_startup_code_and_reports_the_same(venv, tmp_path):
    """Review 4: `apexkit up`'s probe runs with site processing off as install's does (a .pth `import` line of the
    venv runs nothing), and reports what it did with site processing on (python -I)."""
    from apexkit import up

    path, _ = venv
    site = next((path / "lib").glob("python*/site-packages"))
    ran = tmp_path / "ran"
    extra = tmp_path / "extra" / "apex-0.1.dist-info"  # a folder a .pth line names: still seen
    extra.mkdir(parents=True)
    (extra / "METADATA").write_text("Name: apex\nVersion: 0.1\n")
    (extra / "RECORD").write_text("apex-0.1.dist-info/METADATA,,\n")
    (site / "x.pth").write_text(
        f"{extra.parent}\nimport os; open({str(ran)!r}, 'a').write('pth')\n"
    )
    found = up.probe(path / "bin" / "python")
    assert not ran.exists(), ran.read_text()
    old = subprocess.run([str(path / "bin" / "python"), "-I", "-c", up._PROBE], capture_output=True)
    assert ran.exists()  # the .pth runs with site processing on: what the probe no longer does
    assert found == dataclasses.replace(up.parse_facts(json.loads(old.stdout)), node=found.node)
    assert (found.prefix, found.torch, found.apex) == (
        str(path),
        "2.0.0",
        "0.1",
    ) and found.apex_record


def _journal(venv, tmp_path, monkeypatch, dists, records, venv_id=None) -> Path:
    """A journal as a killed run into `venv` leaves, in a cache of this test (0600, ours): `records` names the
    distributions whose RECORD that run's pip wrote (their RECORDs as they are now: device, inode, size, mtime,
    sha256)."""
    path, _ = venv
    monkeypatch.setenv("APEXKIT_CACHE_DIR", str(tmp_path / "cache"))
    journal = run._lock_path(str(path / "bin" / "python"), ".journal")
    journal.parent.mkdir(parents=True, mode=0o700, exist_ok=True)
    written = {}
    for record in (path / "lib").glob("python*/site-packages/*.dist-info/RECORD"):
        name = record.parent.name.split("-")[0].lower()
        if name in records:
            st, data = record.stat(), record.read_bytes()
            written[name] = [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns]
            written[name].append(hashlib.sha256(data).hexdigest())
    st = path.stat()
    data = {"venv": venv_id or [st.st_dev, st.st_ino], "paths": [], "dists": dists}
    journal.write_text(json.dumps({**data, "records": written}))
    journal.chmod(0o600)
    return journal


def test_a_repair_uninstalls_what_that_runs_pip_wrote_never_torch(venv, tmp_path, monkeypatch):
    """Review 3, F5: a journal names torch and numpy, their RECORDs as pip wrote them: the repair takes back numpy
    (as it would a dependency that run added) and never torch."""
    path, env = venv
    journal = _journal(
        venv, tmp_path, monkeypatch, {"torch": "1.0", "numpy": None}, ["torch", "numpy"]
    )
    run._repair(str(path / "bin" / "python"), f"--venv {path}", env)
    after = listed(venv)
    assert after["torch"] == "2.0.0" and "numpy" not in after
    assert not journal.exists()


def test_a_journal_of_another_venv_or_a_dry_run_undoes_nothing(venv, tmp_path, monkeypatch):
    """Review 3, F5: a journal of the venv once at this path (another directory inode) is dropped, nothing
    undone; with --dry-run the repair is only said, the venv and the journal left as they are."""
    path, env = venv
    python, named, before = str(path / "bin" / "python"), f"--venv {path}", listed(venv)
    journal = _journal(venv, tmp_path, monkeypatch, {"numpy": None}, ["numpy"])
    dry = subprocess.run(
        [
            sys.executable,
            "-m",
            "apexkit",
            "install",
            "--venv",
            str(path),
            "--no-build",
            "--dry-run",
        ],
        env={**env, "APEXKIT_CACHE_DIR": str(tmp_path / "cache"), "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
    )
    assert "numpy would be uninstalled" in dry.stderr, dry.stderr
    assert listed(venv) == before and journal.exists()
    journal = _journal(venv, tmp_path, monkeypatch, {"numpy": None}, ["numpy"], venv_id=[1, 2])
    run._repair(python, named, env)
    assert listed(venv) == before and not journal.exists()


def test_a_journal_another_user_can_write_is_refused(venv, tmp_path, monkeypatch):
    """Review 3, F5: the journal is acted on only when it is ours and nobody else can write it."""
    path, env = venv
    before = listed(venv)
    journal = _journal(venv, tmp_path, monkeypatch, {"numpy": None}, ["numpy"])
    os.chown(journal, NOBODY, NOBODY)
    with pytest.raises(EnvironmentSetupError) as err:
        run._repair(str(path / "bin" / "python"), f"--venv {path}", env)
    assert "belongs to" in err.value.cause and "nothing was changed" in err.value.cause
    assert listed(venv) == before


def test_a_stale_journal_leaves_what_the_user_installed_since(venv, tmp_path):
    """Review 3, F5: apexkit killed -9 while pip writes apex; the venv's owner then installs that apex by hand. The
    next run (a dry run, then a real one) leaves that apex in place: it is not what the killed run's pip wrote."""
    path, env = venv
    folder = tmp_path / "apex"
    folder.mkdir()
    extra = {f"apex/m{i}.py": b"x = %d\n" % i for i in range(6)}
    wheel = tiny_wheel(folder, "apex", "0.1+ascend.torch2.0.0", "torch==2.0.0", files=extra)
    paused = tmp_path / "paused"
    env = {
        **env,
        "APEXKIT_CACHE_DIR": str(tmp_path / "cache"),
        "APEXKIT_TEST_PIP_PAUSED": str(paused),
    }
    script = Path(__file__).with_name("pause_in_pip.py")
    proc = subprocess.Popen([sys.executable, str(script), "3", str(path), str(wheel)], env=env)
    try:
        for _ in range(1200):
            if paused.exists() or proc.poll() is not None:
                break
            time.sleep(0.1)
        assert paused.exists(), "pip never paused"
    finally:
        proc.kill()
        proc.wait()
    pip = [
        str(path / "bin" / "python"),
        "-m",
        "pip",
        "install",
        "-q",
        "--force-reinstall",
        "--no-deps",
    ]
    subprocess.run([*pip, str(wheel)], env=env, check=True, capture_output=True, timeout=300)
    by_hand = listed(venv)
    assert by_hand["apex"] == "0.1+ascend.torch2.0.0"
    for flags in (["--dry-run"], []):
        again = subprocess.run(
            [sys.executable, "-m", "apexkit", "install", "--venv", str(path), "--no-build", *flags],
            env={
                **{k: v for k, v in env.items() if not k.startswith("PIP_")},
                "PYTHONPATH": str(ROOT),
            },
            capture_output=True,
            text=True,
            timeout=600,
            cwd=ROOT,
        )
        assert again.returncode == 1 and "was interrupted" in again.stderr, again.stderr
        assert "apex left as found" in again.stderr and "uninstall" not in again.stderr, (
            again.stderr
        )
        assert listed(venv) == by_hand
