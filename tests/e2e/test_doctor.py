"""`invoke doctor`: each check compared with what independent commands say about this machine, and every known
failure signature against a real log (tests/data/failure-logs, plus live reproductions where they are cheap)."""

from __future__ import annotations

import json
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from conftest import DATA, ROOT, output

from apexkit.wheel import known_failures

LOGS = DATA / "failure-logs"


def invoke(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "invoke", "-r", str(ROOT), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )


def doctor_json(env: dict[str, str] | None = None) -> tuple[int, dict[tuple[str, str], dict]]:
    proc = invoke("doctor", "--json", env=env)
    rows = json.loads(proc.stdout)
    return proc.returncode, {(r["area"], r["name"]): r for r in rows}


def test_doctor_log_names_cause_fix_and_line():
    proc = invoke("doctor", "--log", str(LOGS / "hardcoded-site-packages.log"))
    assert proc.returncode == 0, output(proc)
    text = output(proc)
    lines = (LOGS / "hardcoded-site-packages.log").read_text().splitlines()
    m = re.search(r"hardcoded-site-packages\s+line (\d+): (.*)", text)
    assert m and "No such file or directory" in lines[int(m.group(1)) - 1]
    assert (
        "cause: setup.py looked for torch under sys.prefix/lib" in text
        and "fix:   build without --skip-patch" in text
    )
    as_json = json.loads(invoke("doctor", "--log", str(LOGS / "daemon-proxy.log"), "--json").stdout)
    assert [h["id"] for h in as_json] == ["daemon-proxy"] and "proxyconnect tcp" in as_json[0][
        "text"
    ]


def test_doctor_log_without_a_known_failure_and_missing_file(tmp_path):
    plain = tmp_path / "ok.log"
    plain.write_text("compiling\nall good\n")
    proc = invoke("doctor", "--log", str(plain))
    assert (
        proc.returncode == 1
        and "no known failure in" in output(proc)
        and "all good" in output(proc)
    )
    missing = invoke("doctor", "--log", str(tmp_path / "nope.log"))
    assert missing.returncode == 2
    assert [x for x in missing.stderr.splitlines() if x.startswith("error: ")] == [
        f"error: --log {tmp_path / 'nope.log'}: no such file -- next: pass a build log, e.g. build/<target-id>/build.log"
    ]


def test_live_reproductions_match(tmp_path):
    """The cheap ones again, for real, on this machine."""
    found = {}
    bash = subprocess.run(
        ["env", "-i", "PATH=/usr/bin:/bin", "bash", "-c", "python setup.py --cpp_ext"],
        capture_output=True,
        text=True,
    )
    found["python-not-found"] = bash.stderr
    src = tmp_path / "npu_float_status.cpp"
    src.write_text('#include "acl/acl.h"\nint main() { return 0; }\n')
    gxx = subprocess.run(
        ["g++", "-std=c++17", "-c", str(src), "-o", str(tmp_path / "x.o")],
        capture_output=True,
        text=True,
    )
    found["acl-headers-missing"] = gxx.stderr
    found["exec-format-error"] = run_foreign_elf(tmp_path)
    for failure_id, text in found.items():
        assert [f.id for f in known_failures.match(text)] == [failure_id], text


def run_foreign_elf(tmp_path: Path) -> str:
    """Execute a minimal aarch64 ELF on an x86_64 host with no binfmt handler: the kernel says ENOEXEC."""
    if os.uname().machine != "x86_64":
        pytest.skip("needs an x86_64 host")
    header = (
        b"\x7fELF"
        + bytes([2, 1, 1, 0])
        + bytes(8)
        + struct.pack("<HHIQQQIHHHHHH", 2, 0xB7, 1, 0x400078, 64, 0, 0, 64, 56, 1, 0, 0, 0)
    )
    program = struct.pack("<IIQQQQQQ", 1, 5, 0, 0x400000, 0x400000, 0x80, 0x80, 0x1000)
    binary = tmp_path / "apex-build-aarch64"
    binary.write_bytes(header + program + bytes(8))
    binary.chmod(0o755)
    entry = Path("/proc/sys/fs/binfmt_misc/qemu-aarch64")
    was_enabled = entry.is_file() and entry.read_text().startswith("enabled")
    if was_enabled:
        if os.geteuid() != 0:
            pytest.skip("QEMU aarch64 is registered and only root can switch it off for this test")
        entry.write_text("0")  # off for the duration of one exec, on again below
    try:
        return subprocess.run(["bash", "-c", str(binary)], capture_output=True, text=True).stderr
    finally:
        if was_enabled:
            entry.write_text("1")


def test_failed_fixture_build_prints_the_hint_and_doctor_agrees(runner):
    proc = runner.nox("3.11", "--skip-patch", "pep440-version", "--no-smoke-test")
    assert proc.returncode != 0
    text = output(proc)
    assert (
        "! known failure 'invalid-version': setuptools >= 66 refuses the version string '0.1-ascend'"
        in text
    )
    assert (
        "known failure 'invalid-version': keep the pep440-version patch" in text
    )  # in the one-line error too
    build_log = runner.build / "py3.11-torch2.13.0-x86_64-master+skip-pep440-version" / "build.log"
    explained = invoke("doctor", "--log", str(build_log))
    assert explained.returncode == 0 and "invalid-version" in output(explained)


# --- doctor on this machine ----------------------------------------------------------------------------------------------


def first_line(argv: list[str]) -> str:
    return subprocess.run(argv, capture_output=True, text=True).stdout.strip().splitlines()[0]


def test_doctor_matches_independent_commands():
    code, rows = doctor_json()
    assert code in (0, 1)
    assert rows[("compiler", "gcc")]["data"]["version"] == first_line(["gcc", "-dumpfullversion"])
    assert rows[("compiler", "g++")]["data"]["version"] == first_line(["g++", "-dumpfullversion"])
    assert rows[("compiler", "C++17")]["status"] == "ok"
    assert first_line(["python3", "--version"]) in rows[("python", "python3")]["found"]
    py311 = rows[("python", "python3.11")]
    version = first_line(
        [py311["data"]["path"], "-c", "import platform; print(platform.python_version())"]
    )
    assert f" {version} " in py311["found"] and py311["data"]["layout"] == "lib"
    if shutil.which("docker"):
        assert first_line(["docker", "--version"]) in rows[("docker", "client")]["found"]
    for key, row in rows.items():
        if key[0] == "disk":
            anchor = row["found"].rsplit(" at ", 1)[1]
            avail = (
                int(
                    subprocess.run(
                        ["df", "-B1", "--output=avail", anchor], capture_output=True, text=True
                    ).stdout.split()[-1]
                )
                / 2**30
            )
            assert abs(row["data"]["free_gib"] - avail) < 1.0
    binfmt = Path("/proc/sys/fs/binfmt_misc/qemu-aarch64")
    usable = (
        binfmt.is_file()
        and binfmt.read_text().startswith("enabled")
        and "F" in re.search(r"flags: (\S*)", binfmt.read_text()).group(1)
    )
    assert (rows[("docker", "aarch64 containers")]["status"] == "ok") == usable
    assert (("ascend", "CANN toolkit") in rows) and (
        rows[("ascend", "CANN toolkit")]["status"] == "skip"
    ) == (not Path("/usr/local/Ascend").exists() and not os.environ.get("ASCEND_HOME_PATH"))
    verdicts = [key for key in rows if key[0] == "apex" and key[1].startswith("verdict")]
    assert verdicts, "no apex verdict"
    if verdicts == [
        ("apex", "verdict")
    ]:  # no interpreter here has MindSpeed / ModelLink / apex: one verdict for all
        looked = ", ".join(
            k[1]
            for k, r in rows.items()
            if k[0] == "python" and k[1].startswith("python3.") and r["status"] == "ok"
        )
        assert rows[("apex", "verdict")]["status"] == "skip"
        assert rows[("apex", "verdict")]["found"].endswith(f"(looked at {looked})")


def test_doctor_sees_environment_problems(tmp_path):
    toolkit = tmp_path / "Ascend" / "ascend-toolkit" / "latest"
    (toolkit / "x86_64-linux").mkdir(parents=True)
    (toolkit / "x86_64-linux" / "ascend_toolkit_install.info").write_text(
        "package_name=Ascend-cann-toolkit\nversion=8.0.RC1\narch=x86_64\n"
    )
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3").symlink_to(
        sys.executable
    )  # python3 but no python, as on Debian/openEuler images
    for tool in ("gcc", "g++", "git", "patch", "readelf", "du", "df", "bash", "env"):
        if shutil.which(tool):
            (bin_dir / tool).symlink_to(shutil.which(tool))
    env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
    env.update(
        PATH=str(bin_dir),
        ASCEND_HOME_PATH=str(toolkit),
        LD_LIBRARY_PATH="/usr/lib",
        http_proxy="http://127.0.0.1:3128",
        HTTP_PROXY="http://127.0.0.1:8080",
        https_proxy="http://127.0.0.1:3128",
        SSL_CERT_FILE=str(tmp_path / "missing.pem"),
        APEXKIT_CACHE_DIR=str(tmp_path / "cache"),
    )
    code, rows = doctor_json(env)
    assert code == 1  # a failing check
    assert (
        rows[("python", "python")]["status"] == "warn"
        and "call python3" in rows[("python", "python")]["fix"]
    )
    assert rows[("ascend", "CANN toolkit")]["found"] == f"{toolkit} (version 8.0.RC1)"
    assert rows[("ascend", "set_env.sh sourced")]["status"] == "fail"
    assert (
        rows[("proxy", "http_proxy")]["status"] == "warn"
        and "HTTP_PROXY=" in rows[("proxy", "http_proxy")]["found"]
    )
    assert "only https_proxy is set" in rows[("proxy", "https_proxy")]["found"]
    assert rows[("proxy", "no_proxy localhost")]["status"] == "warn"
    assert rows[("ca", "SSL_CERT_FILE")]["status"] == "fail"
    env["LD_LIBRARY_PATH"] = f"{toolkit}/lib64"
    _, rows = doctor_json(env)
    assert rows[("ascend", "set_env.sh sourced")]["status"] == "ok"


def test_doctor_human_output_lists_every_area():
    proc = invoke("doctor")
    text = output(proc)
    for area in (
        "python",
        "torch",
        "apex",
        "compiler",
        "build",
        "ascend",
        "docker",
        "disk",
        "cache",
        "proxy",
        "ca",
    ):
        assert re.search(rf"^{area}$", text, re.M), area
    assert re.search(r"\d+ ok, \d+ warn, \d+ fail, \d+ skip", text)


# --- does the training environment need Apex for Ascend? (apex_need.toml) ------------------------------------------------


def make_env(
    root: Path,
    dists: dict[str, str],
    editable: dict[str, Path] | None = None,
    python: str = sys.executable,
) -> Path:
    """A real venv (no pip: fast) whose site-packages holds real installed distributions: each a .dist-info as pip
    writes it (METADATA, INSTALLER, RECORD, direct_url.json for an editable install), visible to importlib.metadata."""
    subprocess.run(
        [python, "-m", "venv", "--without-pip", str(root)], check=True, capture_output=True
    )
    purelib = Path(
        subprocess.run(
            [
                str(root / "bin" / "python"),
                "-c",
                "import sysconfig; print(sysconfig.get_paths()['purelib'])",
            ],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    )
    for name, version in dists.items():
        info = purelib / f"{name.replace('-', '_')}-{version}.dist-info"
        info.mkdir(parents=True)
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
        (info / "INSTALLER").write_text("pip\n")
        (info / "RECORD").write_text(
            f"{info.name}/METADATA,,\n{info.name}/INSTALLER,,\n{info.name}/RECORD,,\n"
        )
        if editable and name in editable:
            (info / "direct_url.json").write_text(
                json.dumps({"url": editable[name].as_uri(), "dir_info": {"editable": True}})
            )
    return root


def make_checkout(
    root: Path, package: str, version: str, branch: str, files: dict[str, str] | None = None
) -> Path:
    """A git checkout shaped like MindSpeed / MindSpeed-LLM at a release branch (setup.py + the package directory)."""
    (root / package).mkdir(parents=True)
    (root / package / "__init__.py").write_text("")
    (root / "setup.py").write_text(
        f"import setuptools\n__version__ = '{version}'\n__package_name__ = '{package}'\n"
    )
    for rel, text in (files or {}).items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    git = ["git", "-C", str(root), "-c", "user.email=t@example.com", "-c", "user.name=t"]
    subprocess.run(["git", "init", "-q", "-b", branch, str(root)], check=True)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-qm", "release"], check=True)
    return root


# An in-tree PEP 517 backend: `pip install -e` of a generated checkout works offline and writes what pip writes for
# MindSpeed's `pip install -e .` (a .dist-info with direct_url.json {"dir_info": {"editable": true}, "url": ...}).
BACKEND_PY = """import base64, hashlib, os, zipfile

NAME, VERSION = {name!r}, {version!r}


def _wheel(directory, editable):
    dist = "%s-%s.dist-info" % (NAME, VERSION)
    files = {{dist + "/METADATA": "Metadata-Version: 2.1\\nName: %s\\nVersion: %s\\n" % (NAME, VERSION),
             dist + "/WHEEL": "Wheel-Version: 1.0\\nGenerator: apexkit-test\\nRoot-Is-Purelib: true\\nTag: py3-none-any\\n"}}
    if editable:
        files["__editable__.%s.pth" % NAME] = os.path.abspath(".") + "\\n"
    else:
        files[NAME + "/__init__.py"] = ""
    name = "%s-%s-py3-none-any.whl" % (NAME, VERSION)
    record = []
    with zipfile.ZipFile(os.path.join(directory, name), "w") as z:
        for path, text in files.items():
            data = text.encode()
            z.writestr(path, data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            record.append("%s,sha256=%s,%d" % (path, digest, len(data)))
        record.append(dist + "/RECORD,,")
        z.writestr(dist + "/RECORD", "\\n".join(record) + "\\n")
    return name


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    return _wheel(wheel_directory, False)


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    return _wheel(wheel_directory, True)
"""


def pip_installable(package: str, version: str) -> dict[str, str]:
    """Files that make a generated checkout installable by pip without any index (see BACKEND_PY)."""
    return {
        "pyproject.toml": '[build-system]\nrequires = []\nbuild-backend = "backend"\nbackend-path = ["."]\n',
        "backend.py": BACKEND_PY.format(name=package, version=version),
    }


def pip_install_editable(venv: Path, checkout: Path) -> None:
    """pip install -e CHECKOUT into the venv, with this Python's pip (--python: the venv needs no pip of its own)."""
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(venv / "bin" / "python"),
            "install",
            "-q",
            "--no-index",
            "--no-cache-dir",
            "-e",
            str(checkout),
        ],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, output(proc)


TRAIN_PY = """import torch
from apex import amp

model, optimizer = build()
# amp.initialize(model, optimizer) in a comment is not a call
model, optimizer = amp.initialize(model, optimizer, opt_level="O2", combine_grad=True)
optimizer = apex.optimizers.NpuFusedAdamW(model.parameters(), lr=1e-4)
"""


def assess(env_dir: Path | None, scripts: Path | None = None):
    from apexkit.doctor import apexneed
    from apexkit.plan import matrix

    env = apexneed.read_environment(str(env_dir / "bin" / "python")) if env_dir else None
    return apexneed.assess(env, scripts, apexneed.load(), matrix.load().data.get("stacks", {}))


def apex_rows(proc: subprocess.CompletedProcess) -> dict[str, dict]:
    assert proc.returncode in (0, 1), output(proc)
    return {r["name"]: r for r in json.loads(proc.stdout) if r["area"] == "apex"}


def test_apex_not_needed_for_mindspeed_llm_2_3(tmp_path):
    """MindSpeed-LLM 2.3.0 installed (the 2.3.0 branch's setup.py says 2.3.0) and MindSpeed installed by pip -e from
    its 2.3.0_core_r0.12.1 branch (its version, 0.12.1, is Megatron's): both say apex is not needed."""
    mindspeed = make_checkout(
        tmp_path / "MindSpeed",
        "mindspeed",
        "0.12.1",
        "2.3.0_core_r0.12.1",
        pip_installable("mindspeed", "0.12.1"),
    )
    venv = make_env(
        tmp_path / "train", {"mindspeed_llm": "2.3.0", "torch": "2.7.1", "torch_npu": "2.7.1.post2"}
    )
    pip_install_editable(venv, mindspeed)
    rows = apex_rows(invoke("doctor", "--json", "--venv", str(venv)))
    verdict = next(r for name, r in rows.items() if name.startswith("verdict"))
    assert verdict["status"] == "ok" and verdict["data"]["verdict"] == "not-needed"
    assert verdict["found"].startswith(
        "apex not needed: mindspeed-llm 2.3.0 = MindSpeed-LLM 2.3.0: >= 2.2.0 does not install apex"
    )
    assert "source: Ascend/MindSpeed-LLM docs/pytorch/install_guide.md" in verdict["found"]
    assert verdict["data"]["target"] == str(venv / "bin" / "python3")
    assert rows["mindspeed"]["found"] == (
        f"mindspeed 0.12.1 (from {mindspeed}) = MindSpeed 2.3.0 (git "
        "2.3.0_core_r0.12.1): >= 2.2.0 does not install apex (MindSpeed's stand-ins "
        "replace it)"
    )
    assert "add --scripts DIR" in verdict["fix"]


def test_apex_needed_for_older_mindspeed_pins(tmp_path):
    """The same MindSpeed version (0.12.1) on the 2.1.0 branch needs apex; 0.8.0 is 2.0.0/2.1.0 whatever the checkout."""
    old = make_checkout(tmp_path / "MindSpeed", "mindspeed", "0.12.1", "2.1.0_core_r0.12.1")
    verdict = assess(
        make_env(
            tmp_path / "a", {"mindspeed": "0.12.1", "torch": "2.1.0"}, editable={"mindspeed": old}
        )
    )
    assert verdict.verdict == "needed" and verdict.reasons[0].what.startswith(
        "= MindSpeed 2.1.0 (git 2.1.0_core_r0.12.1)"
    )
    # the build matrix.toml names for this venv's Python (the host's) and torch 2.1.0: its stack if one matches
    # (field-report on a 3.8 host), else the plain --torch build
    from apexkit.plan import matrix

    minor = f"{sys.version_info[0]}.{sys.version_info[1]}"
    stacks = [
        name
        for name, stack in matrix.load().data.get("stacks", {}).items()
        if str(stack.get("python")) == minor and stack.get("torch") == "2.1.0"
    ]
    assert verdict.next_step.startswith(
        f"build it: apexkit build {minor} "
        + (f"--stack {stacks[0]}" if stacks else "--torch 2.1.0")
    )
    verdict = assess(make_env(tmp_path / "b", {"mindspeed": "0.8.0"}))
    assert verdict.verdict == "needed" and "MindSpeed 2.0.0 / 2.1.0" in verdict.reasons[0].what
    # 0.12.1 without a checkout cannot tell 2.1.0 from 2.2.0+: unknown, and how to find out
    verdict = assess(make_env(tmp_path / "c", {"mindspeed": "0.12.1"}))
    assert (
        verdict.verdict == "unknown"
        and "could be MindSpeed 2.1.0 / 2.2.0" in verdict.reasons[0].what
    )
    assert "pip install -e DIR" in verdict.next_step


def test_apex_unknown_without_a_stack(tmp_path):
    verdict = assess(make_env(tmp_path / "plain", {"numpy": "2.0.0"}))
    assert verdict.verdict == "unknown" and verdict.reasons == [] and verdict.evidence == []
    assert (
        verdict.summary()
        == "apex optional / unknown: nothing found that needs apex, nothing known that replaces it"
    )
    assert "apexkit doctor --venv DIR --scripts DIR" in verdict.next_step


def test_apex_needed_by_a_combine_grad_script_even_with_mindspeed_2_3(tmp_path):
    """A script wins over the stack: MindSpeed's stand-ins do not cover apex.amp. file:line for each hit."""
    venv = make_env(
        tmp_path / "train", {"mindspeed-llm": "2.3.0", "torch": "2.13.0", "torch-npu": "2.13.0"}
    )
    scripts = tmp_path / "scripts"
    (scripts / ".git").mkdir(parents=True)
    (scripts / ".git" / "hook.py").write_text(
        "amp.initialize(x, combine_grad=True)\n"
    )  # never scanned
    make_env(scripts / "venv-inside", {})  # a venv in the tree: skipped
    (scripts / "venv-inside" / "lib" / "x.py").write_text("import apex\n")
    (scripts / "train.py").write_text(TRAIN_PY)
    proc = invoke("doctor", "--venv", str(venv), "--scripts", str(scripts))
    text = output(proc)
    assert proc.returncode in (0, 1), text
    assert (
        f"apex needed: {scripts}/train.py:6 amp.initialize(..., combine_grad=True): Ascend apex's fused-gradient "
        "AMP (apex.amp has no stand-in) (+2 more)"
    ) in " ".join(text.split())
    rows = apex_rows(invoke("doctor", "--json", "--venv", str(venv), "--scripts", str(scripts)))
    verdict = rows[f"verdict (python{sys.version_info[0]}.{sys.version_info[1]})"]
    assert verdict["status"] == "warn" and verdict["data"]["verdict"] == "needed"
    assert [(h["pattern"], h["line"]) for h in verdict["data"]["hits"]] == [
        ("import-apex", 2),
        ("combine-grad", 6),
        ("npu-fused-optimizer", 7),
    ]
    assert rows["npu-fused-optimizer"]["fix"].startswith(
        "torch_npu.optim.NpuFusedAdamW: torch_npu ships it"
    )
    assert rows["mindspeed-llm"]["status"] == "ok"  # the stack alone would not need it
    assert verdict["fix"].startswith("build it: invoke build --python ")  # the door in use
    assert rows["scripts"]["found"] == f"scanned 1 file(s) under {scripts}"


def test_apex_standin_imports_depend_on_mindspeed(tmp_path):
    """`from apex.optimizers import FusedAdam` (Megatron style) is covered by MindSpeed's stand-ins, needs apex without."""
    script = tmp_path / "opt.py"
    script.write_text(
        "from apex.optimizers import FusedAdam as Adam\nfrom apex.multi_tensor_apply import "
        "multi_tensor_applier\n"
    )
    alone = assess(make_env(tmp_path / "a", {}), script)
    assert alone.verdict == "needed" and alone.reasons[0].where == f"{script}:1, {script}:2"
    old = make_checkout(tmp_path / "MindSpeed", "mindspeed", "0.12.1", "2.2.0_core_r0.12.1")
    covered = assess(
        make_env(tmp_path / "b", {"mindspeed": "0.12.1"}, editable={"mindspeed": old}), script
    )
    assert covered.verdict == "not-needed"
    assert [e.effect for e in covered.evidence] == ["replaces", "info"]


def test_apex_verdict_from_a_mindspeed_llm_checkout(tmp_path):
    """MindSpeed-LLM's guides run it from its checkout (not pip-installed; setup.py said 0.0.1 up to 2.3.0): the
    checkout given as --scripts names the release by its branch."""
    llm = make_checkout(
        tmp_path / "MindSpeed-LLM",
        "mindspeed_llm",
        "0.0.1",
        "2.1.0",
        {
            "mindspeed_llm/core/optimizer/__init__.py": "from apex.optimizers import FusedAdam as Adam\n"
        },
    )
    verdict = assess(make_env(tmp_path / "a", {}), llm / "mindspeed_llm")
    assert verdict.verdict == "needed"
    assert verdict.reasons[0].where == f"mindspeed-llm 0.0.1 (checkout {llm})"
    assert verdict.reasons[0].what.startswith("= MindSpeed-LLM 2.1.0 (git 2.1.0)")


def test_apex_target_on_python_3_8(tmp_path):
    """The probe runs in the target interpreter: a Python 3.8 training venv (ModelLink: every release needs apex)."""
    from apexkit.wheel import interpreters

    try:
        py38 = interpreters.find("3.8", dict(os.environ))
    except Exception as exc:
        pytest.skip(f"no python3.8 here: {exc}")
    venv = make_env(tmp_path / "v38", {"ModelLink": "0.0.1"}, python=py38.path)
    verdict = assess(venv)
    assert verdict.verdict == "needed" and verdict.next_step.startswith(
        "build it: apexkit build 3.8"
    )
    assert "move to MindSpeed-LLM >= 2.2.0" in verdict.next_step


def test_apex_bad_input_is_one_line(tmp_path):
    not_env = tmp_path / "not-a-venv"
    not_env.mkdir()
    cases = {
        (
            "--venv",
            str(not_env),
        ): f"error: --venv {not_env} is not a Python environment (no bin/python3 in it) -- next: "
        "pass the venv or conda env directory, or its interpreter with --interpreter PATH",
        (
            "--venv",
            str(tmp_path / "nope"),
        ): f"error: --venv {tmp_path / 'nope'}: no such directory -- next: pass the "
        "training environment's directory (the sys.prefix of its python)",
        (
            "--scripts",
            str(tmp_path / "missing"),
        ): f"error: --scripts {tmp_path / 'missing'}: no such file or directory "
        "-- next: pass the directory (or the file) holding the training scripts",
        (
            "--venv",
            str(not_env),
            "--interpreter",
            sys.executable,
        ): "error: --venv and --interpreter both name a "
        "training environment -- next: pass one of them",
    }
    for args, line in cases.items():
        proc = invoke("doctor", *args)
        assert proc.returncode == 2 and proc.stdout == "" and "Traceback" not in proc.stderr, (
            output(proc)
        )
        assert proc.stderr.strip().splitlines() == [line]
    broken = tmp_path / "broken" / "bin"
    broken.mkdir(parents=True)
    (broken / "python3").write_text(
        "#!/bin/sh\necho 'cannot execute: no libpython' >&2\nexit 127\n"
    )
    (broken / "python3").chmod(0o755)
    proc = invoke("doctor", "--venv", str(broken.parent))
    assert proc.returncode == 2 and "Traceback" not in output(proc)
    assert [x for x in proc.stderr.splitlines() if x.startswith("error: ")] == [
        f"error: {broken / 'python3'} cannot list its packages (cannot execute: no libpython) -- next: pass a Python "
        "3.8+ interpreter of the training environment (--venv DIR or --interpreter PATH)"
    ]


def test_apex_mindspeed_release_from_the_paired_mindspeed_llm(tmp_path):
    """MindSpeed 0.12.1 alone leaves 2.1.0 ... 26.x open; next to MindSpeed-LLM 2.3.0 it is MindSpeed 2.3.0."""
    verdict = assess(
        make_env(
            tmp_path / "a", {"mindspeed-llm": "2.3.0", "mindspeed": "0.12.1", "apex": "0.1+ascend"}
        )
    )
    assert verdict.verdict == "not-needed" and [e.release for e in verdict.evidence] == [
        "2.3.0",
        "2.3.0",
    ]
    assert "MindSpeed 2.3.0 (paired with mindspeed-llm 2.3.0)" in verdict.evidence[1].what
    assert verdict.next_step.startswith("apex 0.1+ascend is installed but nothing found needs it")


def test_apex_imports_inside_try_except_are_optional(tmp_path):
    script = tmp_path / "rope.py"
    script.write_text(
        "try:\n    from apex.transformer.functional import fused_apply_rotary_pos_emb\n"
        "    HAVE_APEX = True\nexcept ImportError:\n    HAVE_APEX = False\n\nimport apex.amp\n"
    )
    verdict = assess(make_env(tmp_path / "a", {}), script)
    assert verdict.verdict == "needed" and [(e.effect, e.where) for e in verdict.evidence] == [
        ("info", f"{script}:2"),
        ("needs", f"{script}:7"),
    ]
    script.write_text(script.read_text().replace("import apex.amp\n", ""))
    assert assess(make_env(tmp_path / "b", {}), script).verdict == "unknown"


SCAN_PY = """import json, sys
from pathlib import Path
from apexkit.doctor import apexneed
hits, notes = apexneed.scan_scripts(Path(sys.argv[1]), apexneed.load())
print(json.dumps({"hits": [[h.file, h.line] for h in hits], "notes": notes}))
"""


def scan_elsewhere(root: Path, *as_user: str) -> dict:
    """scan_scripts in its own process (optionally run as another user): a scan that hangs fails by the timeout
    instead of hanging the test run."""
    proc = subprocess.run(
        [*as_user, sys.executable, "-c", SCAN_PY, str(root)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=120,
    )
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, output(proc)
    return json.loads(proc.stdout)


def test_apex_scan_never_opens_fifos_or_devices(tmp_path):
    """A FIFO named train.py would block the read forever, a device never ends: stat, and skip what is not a regular
    file, with a note. A symlink to a regular file is still read."""
    scripts = tmp_path / "s2"
    scripts.mkdir()
    os.mkfifo(scripts / "train.py")
    (scripts / "dev.py").symlink_to("/dev/zero")
    (scripts / "real.py").write_text("import apex\n")
    (scripts / "link.py").symlink_to(scripts / "real.py")
    found = scan_elsewhere(scripts)
    assert found["hits"] == [[f"{scripts}/link.py", 1], [f"{scripts}/real.py", 1]]
    assert found["notes"] == [
        f"scanned 2 file(s) under {scripts}",
        "skipped 2 file(s) that are not regular files "
        f"(FIFO, device, socket): {scripts}/dev.py, {scripts}/train.py",
    ]
    alone = scan_elsewhere(scripts / "train.py")  # the FIFO named as --scripts itself
    assert (
        alone["hits"] == []
        and alone["notes"][0] == f"scanned 0 file(s) under {scripts / 'train.py'}"
    )
    proc = subprocess.run(
        [sys.executable, "-m", "apexkit", "doctor", "--json", "--scripts", str(scripts)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )
    rows = apex_rows(proc)
    assert [h["file"] for h in rows["verdict"]["data"]["hits"]] == [
        f"{scripts}/link.py",
        f"{scripts}/real.py",
    ]
    assert f"{scripts}/train.py" in rows["scripts"]["found"]


def test_apex_scan_notes_directories_it_cannot_list():
    """Another user's 0700 directory (or /proc/1/fd) is EACCES for a non-root user, for listing it and for stat-ing a
    pyvenv.cfg in it: a note, never a traceback. Root reads everything, so the scan runs as uid 65534 (setpriv)."""
    with tempfile.TemporaryDirectory(
        prefix="apexkit-scan-"
    ) as top:  # not under pytest's 0700 tmp: uid 65534 reads it
        scripts = Path(top) / "scripts"
        for sub in ("", "root-only", "nobody-only"):
            (scripts / sub).mkdir(exist_ok=True)
            (scripts / sub / "train.py").write_text("import apex\n")
        os.chmod(top, 0o755)
        os.chmod(scripts, 0o755)
        (scripts / "root-only").chmod(0o700)
        if (
            os.geteuid() != 0
        ):  # this user cannot read a 000 directory: the same path without setpriv
            (scripts / "root-only").chmod(0o000)
            try:
                found = scan_elsewhere(scripts)
            finally:
                (scripts / "root-only").chmod(0o700)
            assert [f for f, _ in found["hits"]] == [
                f"{scripts}/train.py",
                f"{scripts}/nobody-only/train.py",
            ]
            assert (
                found["notes"][-1]
                == f"could not list 1 directory(ies): {scripts}/root-only (Permission denied)"
            )
            return
        setpriv = shutil.which("setpriv")
        if setpriv is None:
            pytest.skip("no setpriv to run the scan as a non-root user")
        nobody = [setpriv, "--reuid", "65534", "--regid", "65534", "--clear-groups"]
        usable = subprocess.run(
            [*nobody, sys.executable, "-c", "import apexkit.doctor.apexneed"],
            cwd=ROOT,
            capture_output=True,
            text=True,
        )
        if usable.returncode != 0:
            pytest.skip(
                f"uid 65534 cannot run {sys.executable} with apexkit's dependencies (a 0700 venv?): "
                f"{usable.stderr.strip().splitlines()[-1:]}"
            )
        os.chown(scripts / "nobody-only", 65534, 65534)
        (scripts / "nobody-only").chmod(0o700)
        as_root = scan_elsewhere(scripts)  # root lists both 0700 directories
        assert len(as_root["hits"]) == 3 and as_root["notes"] == [
            f"scanned 3 file(s) under {scripts}"
        ]
        found = scan_elsewhere(scripts, *nobody)
        assert [f for f, _ in found["hits"]] == [
            f"{scripts}/train.py",
            f"{scripts}/nobody-only/train.py",
        ]
        assert found["notes"] == [
            f"scanned 2 file(s) under {scripts}",
            f"could not list 1 directory(ies): {scripts}/root-only (Permission denied)",
        ]
        proc_fs = scan_elsewhere(
            Path("/proc"), *nobody
        )  # the reviewer's reproduction: /proc/1/fd is root's
        assert proc_fs["notes"][0] == "scanned 0 file(s) under /proc"
        assert (
            proc_fs["notes"][-1].startswith("could not list ")
            and "(Permission denied)" in proc_fs["notes"][-1]
        )


def test_apex_probe_output_that_is_not_json_is_one_line(tmp_path):
    """An interpreter (a wrapper, a fake) that prints a cut-off probe line: one error line, exit 2, no traceback."""
    for name, printed in (("cut", "APEXKIT-PROBE {"), ("list", "APEXKIT-PROBE []")):
        fake = tmp_path / name / "python3"
        fake.parent.mkdir()
        fake.write_text(f"#!/bin/sh\necho '{printed}'\n")
        fake.chmod(0o755)
        proc = invoke("doctor", "--interpreter", str(fake))
        assert proc.returncode == 2 and "Traceback" not in output(proc), output(proc)
        errors = [x for x in proc.stderr.splitlines() if x.startswith("error: ")]
        assert len(errors) == 1 and errors[0].startswith(
            f"error: {fake} printed an unreadable package list ("
        ), errors
        assert errors[0].endswith(
            "-- next: pass the training environment's real Python 3.8+ interpreter (--venv DIR "
            "or --interpreter PATH)"
        )


def test_doctor_report_goes_to_stdout_so_it_can_be_redirected(tmp_path):
    """Issue 15: `invoke doctor > report.txt` holds the report; progress stays on stderr."""
    report = tmp_path / "report.txt"
    with open(report, "w") as fh:
        proc = subprocess.run(
            [sys.executable, "-m", "apexkit", "doctor"],
            cwd=ROOT,
            stdout=fh,
            stderr=subprocess.PIPE,
            text=True,
            timeout=600,
        )
    text = report.read_text()
    assert proc.returncode in (0, 1) and " ok, " in text and " fail, " in text and "python" in text
    assert " ok, " not in proc.stderr


def test_doctor_log_streams_a_large_log_once(tmp_path):
    """A 40 MB build log is read in one streamed pass: the known failure near its end is found with its line number
    (across 1 MB blocks), and the CLI's peak memory stays near its 30 MB baseline (before: the whole log read twice,
    131 MB peak for this log, 1.2 GB for a 500 MB one)."""
    import subprocess
    import sys

    from conftest import ROOT

    big = tmp_path / "build.log"
    filler = "g++ -pthread -B /opt/compiler -fno-strict-overflow -Wsign-compare -DNDEBUG -g -O2 -Wall -fPIC x.cpp\n"
    lines = 40 * 2**20 // len(filler)
    with open(big, "w") as fh:
        block = filler * 10000
        for _ in range(lines // 10000):
            fh.write(block)
        fh.write("x.cpp:2:10: fatal error: torch/extension.h: No such file or directory\n")
        fh.write("\x1b[2Jthe last line\n")
    expected_line = (lines // 10000) * 10000 + 1
    with open(big) as fh:
        hits, tail = known_failures.scan(fh, block=1 << 20)
    assert [(h.failure.id, h.line_no) for h in hits] == [("hardcoded-site-packages", expected_line)]
    assert tail[-1] == "\x1b[2Jthe last line" and len(tail) == 10
    probe = (
        "import resource, subprocess, sys; p = subprocess.run(sys.argv[1:], capture_output=True, text=True); "
        "print(p.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss); print(p.stderr)"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe, sys.executable, "-m", "apexkit", "doctor", "--log", str(big)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    code, max_rss_kib = (int(x) for x in out.split("\n", 1)[0].split())
    assert code == 0 and f"hardcoded-site-packages  line {expected_line}:" in out
    assert max_rss_kib < 80 * 1024, f"peak RSS {max_rss_kib} KiB for a 40 MB log"
