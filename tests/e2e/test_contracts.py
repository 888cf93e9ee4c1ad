"""`nox -s contracts` (tools/contracts.py) as a maintainer runs it, and validate's apex rows with MindSpeed's
stand-ins, a broken apex, no apex.

- the real torch_npu wheels of every matrix.toml stack (network: the package index; downloaded once per session into
  the session's cache) against the fixture Ascend apex trees generated from the `repos` fixture;
- a 127.0.0.1 index serving a wheel made here: downloaded once, the sha256 checked against the index's, cached;
- bench/validate_env.py in a real venv with torch, with a MindSpeed-shaped package (written here, no MindSpeed code)
  whose adaptor puts apex stand-ins into sys.modules the way MindSpeed >= 2.2 does.
"""

from __future__ import annotations

import hashlib
import http.server
import json
import os
import subprocess
import sys
import threading
import zipfile
from pathlib import Path

import pytest
import services
from conftest import ROOT

from apexkit.plan import matrix

BENCH = ROOT / "bench"


def contracts(*args: str, env: dict[str, str], timeout: float = 600) -> subprocess.CompletedProcess:
    """`python -m tools.contracts`: what the session runs, with apexkit's one-line errors and exit codes (nox maps
    every failure to 1)."""
    return subprocess.run(
        [sys.executable, "-m", "tools.contracts", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


# --- the real wheels of the stacks ------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def wheel_cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("contracts-cache")


@pytest.mark.network
def test_every_stacks_torch_npu_release_against_the_fixture_refs(repos, wheel_cache, tmp_path):
    env = {**os.environ, **repos.env(wheel_cache), "APEXKIT_CACHE_DIR": str(wheel_cache)}
    releases = []
    m = matrix.load()
    for name in m.stack_names():
        release = m.stack(name).torch_npu
        if release and release not in releases:
            releases.append(release)
    out = tmp_path / "contracts.json"
    proc = contracts("--ref", "master", "--json", str(out), env=env)
    text = proc.stdout + proc.stderr
    data = json.loads(out.read_text())
    # every stack's release checked, from the real wheel; torch_npu's side holds for each
    assert list(data["releases"]) == releases, text
    for release in releases:
        result = data["releases"][release]
        assert result["ok"] and result["drifts"] == 0, text
        names = {f["name"]: f for f in result["findings"]}
        assert names["torch.npu"]["detail"].startswith("= torch_npu.npu ("), names["torch.npu"]
        assert names["torch_npu.optim.NpuFusedAdamW"]["status"] == "ok"
        assert names["torch.npu.set_compile_mode"]["detail"] == "function(jit_compile)"
    # the fixture tree is not Ascend's apex: what bench/ needs and it lacks is one line each, exit 1
    assert proc.returncode == 1, text
    drift = [line for line in proc.stdout.splitlines() if line.startswith("drift: ")]
    assert any(
        line.startswith("drift: apex.optimizers.NpuFusedAdam in apex master: ")
        and "-- used at bench/amp_bench.py:" in line
        for line in drift
    ), text
    assert any(
        "apex.amp.initialize(..., combine_grad=) in apex master: no such keyword" in line
        for line in drift
    ), text
    assert "Traceback" not in text
    # the table: one row per release, the ref's column says drift
    table = proc.stdout.split("\n")
    assert table[0].split()[-1] == "master"
    assert [row.split()[0] for row in table[1 : 1 + len(releases)]] == releases
    # a second run downloads nothing
    again = contracts(
        "--torch-npu", releases[0], "--apex-tree", str(tmp_path), "--offline", env=env
    )
    assert (
        f"torch_npu {releases[0]}: " in again.stderr + again.stdout
        and "(cached)" in again.stderr + again.stdout
    )


def test_the_nox_session_lists_what_bench_uses():
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "nox",
            "-f",
            str(ROOT / "noxfile.py"),
            "-s",
            "contracts",
            "--",
            "--uses",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "torch_npu.optim.NpuFusedAdamW  bench/" in proc.stdout, proc.stdout[-2000:]


# --- a local index: download once, sha256 checked, cached --------------------------------------------------------


def _wheel_bytes(tmp_path: Path) -> bytes:
    path = tmp_path / "w.zip"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("torch_npu/__init__.py", "import torch\nimport torch_npu.optim\n")
        zf.writestr("torch_npu/optim/__init__.py", "class NpuFusedAdam:\n    pass\n")
        zf.writestr("torch_npu-7.7.7.dist-info/METADATA", "Name: torch_npu\nVersion: 7.7.7\n")
    return path.read_bytes()


class Index:
    def __init__(self, body: bytes, sha: str) -> None:
        self.requests: list[str] = []
        name = "torch_npu-7.7.7-cp311-cp311-manylinux_2_28_aarch64.whl"
        page = f'<html><body><a href="/files/{name}#sha256={sha}">{name}</a></body></html>'.encode()
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                outer.requests.append(self.path)
                data = page if self.path.startswith("/simple/") else body
                kind = (
                    "text/html" if self.path.startswith("/simple/") else "application/octet-stream"
                )
                self.send_response(200)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/simple"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _local_env(cache: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.lower().endswith("_proxy")}
    env.update(APEXKIT_CACHE_DIR=str(cache), PIP_CONFIG_FILE=os.devnull, NO_PROXY="127.0.0.1")
    return env


def test_a_wheel_from_the_index_is_downloaded_once_and_checked_against_its_sha256(tmp_path):
    body = _wheel_bytes(tmp_path)
    index = Index(body, hashlib.sha256(body).hexdigest())
    env = _local_env(tmp_path / "cache")
    tree = tmp_path / "tree"
    (tree / "apex").mkdir(parents=True)
    try:
        first = contracts(
            "--torch-npu",
            "7.7.7",
            "--apex-tree",
            str(tree),
            "--index-url",
            index.url,
            env=env,
            timeout=60,
        )
        assert "(downloaded" in first.stderr, first.stdout + first.stderr
        assert (
            "drift: apex.amp.initialize in apex" in first.stdout
        )  # an empty apex/ has none of bench's names
        assert (
            "drift: torch.npu.set_device in torch_npu 7.7.7: torch_npu does not register torch.npu"
            in first.stdout
        )
        assert "drift: torch_npu.optim.NpuFusedAdam in" not in first.stdout
        wheels = [r for r in index.requests if r.startswith("/files/")]
        assert len(wheels) == 1
        second = contracts(
            "--torch-npu",
            "7.7.7",
            "--apex-tree",
            str(tree),
            "--index-url",
            index.url,
            env=env,
            timeout=60,
        )
        assert "(cached)" in second.stderr
        assert [
            r for r in index.requests if r.startswith("/files/")
        ] == wheels  # not downloaded again
    finally:
        index.close()


def test_a_wheel_that_does_not_match_the_indexs_sha256_is_refused_and_not_kept(tmp_path):
    body = _wheel_bytes(tmp_path)
    index = Index(body, "0" * 64)
    env = _local_env(tmp_path / "cache")
    try:
        proc = contracts(
            "--torch-npu", "7.7.7", "--ref", "master", "--index-url", index.url, env=env, timeout=60
        )
    finally:
        index.close()
    assert proc.returncode != 0
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert (
        len(errors) == 1
        and "does not match its sha256 on the index" in errors[0]
        and " -- next: " in errors[0]
    )
    assert "Traceback" not in proc.stderr
    folder = tmp_path / "cache" / "contracts" / "wheels"
    assert not folder.exists() or list(folder.iterdir()) == []


# --- validate: MindSpeed's stand-ins, a broken apex, no apex --------------------------------------------------------

ADAPTOR = '''"""Shaped like MindSpeed >= 2.2's adaptor: importing it puts apex stand-ins into sys.modules."""
import importlib.machinery
import sys
import types


def _stand_in(dotted, attr, value):
    parts = dotted.split(".")
    for i in range(1, len(parts) + 1):
        path = ".".join(parts[:i])
        if path not in sys.modules:
            module = types.ModuleType(path)
            module.__file__ = "mindspeed.dummy_module.py"
            module.__spec__ = importlib.machinery.ModuleSpec(path, None)
            sys.modules[path] = module
            if i > 1:
                setattr(sys.modules[".".join(parts[: i - 1])], parts[i - 1], module)
    setattr(sys.modules[dotted], attr, value)


def fused_adam(*args, **kwargs):
    return None


_stand_in("apex.optimizers", "FusedAdam", fused_adam)
_stand_in("apex.multi_tensor_apply", "multi_tensor_applier", fused_adam)
'''


@pytest.fixture(scope="module")
def torch_venv(tmp_path_factory) -> Path:
    return services.make_torch_venv(tmp_path_factory.mktemp("contracts-venv") / "venv")


def _site(venv: Path) -> Path:
    return next((venv / "lib").glob("python3.*/site-packages"))


ROWS = """
import json, sys
sys.path.insert(0, sys.argv[1])
import validate_env
report = validate_env.Report(sys.argv[2])
validate_env.check_apex(report)
validate_env.check_contract(report)
print(json.dumps({"checks": report.checks, "ok": report.ok}))
"""


def _apex_rows(venv: Path, device: str, extra: dict[str, str] | None = None) -> dict:
    """validate_env's apex and contract rows only, in the venv (the whole table probes torch for ~20 s)."""
    env = {**os.environ, **(extra or {})}
    env.pop("PYTHONPATH", None)
    proc = subprocess.run(
        [str(venv / "bin" / "python"), "-c", ROWS, str(BENCH), device],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    data = json.loads(proc.stdout.strip().splitlines()[-1])
    data["rows"] = {c["check"]: c for c in data["checks"]}
    return data


def _validate(venv: Path, device: str, extra: dict[str, str] | None = None) -> dict:
    env = {**os.environ, **(extra or {})}
    env.pop("PYTHONPATH", None)
    proc = subprocess.run(
        [
            str(venv / "bin" / "python"),
            str(BENCH / "validate_env.py"),
            "--device",
            device,
            "--json",
            "-",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert "Traceback" not in proc.stderr, proc.stderr
    data = json.loads(proc.stdout)
    data["rows"] = {c["check"]: c for c in data["checks"]}
    data["rc"] = proc.returncode
    return data


def test_validate_tells_mindspeed_stand_ins_apart_from_a_broken_or_missing_apex(torch_venv):
    site = _site(torch_venv)
    # no apex, no MindSpeed: apex is missing (a failure for --device npu)
    row = _apex_rows(torch_venv, "npu")["rows"]["import apex"]
    assert row["status"] == "fail" and row["detail"] == "apex is not installed" and row["required"]
    (site / "mindspeed").mkdir()
    try:
        (site / "mindspeed" / "__init__.py").write_text("")
        (site / "mindspeed" / "megatron_adaptor.py").write_text(ADAPTOR)
        data = _apex_rows(torch_venv, "npu")
        row = data["rows"]["import apex"]
        assert row["status"] == "ok" and not row["required"], row
        assert row["detail"].startswith("apex absent, MindSpeed stand-ins in place"), row
        assert "apex.optimizers.FusedAdam" in row["detail"]
        assert data["ok"]  # for --device npu too: the stand-ins are no failure of the validation
        assert data["rows"]["apex compiled module apex_C"]["status"] == "skip"
        # a broken apex next to MindSpeed: apex is there, so it is the broken apex that is reported
        (site / "apex" / "amp").mkdir(parents=True)
        (site / "apex" / "__init__.py").write_text("from . import amp\n")
        (site / "apex" / "amp" / "__init__.py").write_text("from .frontend import initialize\n")
        row = _apex_rows(torch_venv, "npu")["rows"]["import apex"]
        assert row["status"] == "fail" and row["required"]
        assert row["detail"].startswith(
            "apex is broken: ModuleNotFoundError: No module named 'apex.amp.frontend'"
        )
        assert row["detail"].endswith("(at apex/amp/__init__.py:1)")
        assert _apex_rows(torch_venv, "cpu")["rows"]["import apex"]["status"] == "warn"
    finally:
        import shutil

        shutil.rmtree(site / "mindspeed", ignore_errors=True)
        shutil.rmtree(site / "apex", ignore_errors=True)


def test_the_whole_validation_with_the_stand_ins_skips_apex_amp_and_is_ready_on_cpu(torch_venv):
    site = _site(torch_venv)
    (site / "mindspeed").mkdir()
    try:
        (site / "mindspeed" / "__init__.py").write_text("")
        (site / "mindspeed" / "megatron_adaptor.py").write_text(ADAPTOR)
        full = _validate(torch_venv, "cpu")
    finally:
        import shutil

        shutil.rmtree(site / "mindspeed", ignore_errors=True)
    assert full["rows"]["import apex"]["detail"].startswith(
        "apex absent, MindSpeed stand-ins in place"
    )
    step = full["rows"]["apex amp O1 step"]
    assert (
        step["status"] == "skip"
        and "MindSpeed stand-ins" in step["detail"]
        and not step["required"]
    )
    assert full["ok"] and full["rc"] == 0


def test_validate_names_the_contract_it_was_checked_against(torch_venv):
    line = "contract: torch_npu 2.7.1.post2 + apex master passed (nox -s contracts, 2026-12-02T16:40:00Z)"
    rows = _apex_rows(torch_venv, "cpu", {"APEXKIT_CONTRACT": line})["rows"]
    row = rows["API contract (nox -s contracts)"]
    assert row["status"] == "ok" and row["detail"].startswith(
        "torch_npu 2.7.1.post2 + apex master passed"
    )
    row = _apex_rows(torch_venv, "cpu")["rows"]["API contract (nox -s contracts)"]
    assert row["status"] == "skip" and row["detail"].startswith("not checked")
