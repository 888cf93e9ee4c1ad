"""tools/contracts.py (`nox -s contracts`) on small synthetic torch_npu wheels and apex trees: the uses come from the
real bench/ scan, the sources are written here (no upstream code), read from a zip without extracting it. The reader
of its result that validate uses is apexkit.venvrun.contract_line."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import pytest

from apexkit import venvrun
from tools import contracts

NPU = {
    "torch_npu/__init__.py": (
        "import torch\nimport torch_npu.npu\nimport torch_npu.optim\nfrom .version import __version__\n"
        "torch._register_device_module('npu', torch_npu.npu)\n"
    ),
    "torch_npu/version.py": "__version__ = '9.9.9'\n",
    "torch_npu/_C.cpython-311-aarch64-linux-gnu.so": "",
    "torch_npu/npu/__init__.py": (
        "from .utils import current_device, device_count, get_device_name, is_available, set_device, synchronize\n"
        "from .memory import *\nfrom . import amp\n"
        "from .npu_config import matmul, conv, set_compile_mode, is_jit_compile_false\n"
    ),
    "torch_npu/npu/utils.py": "".join(
        f"def {n}(*args):\n    pass\n"
        for n in (
            "current_device",
            "device_count",
            "get_device_name",
            "is_available",
            "set_device",
            "synchronize",
        )
    ),
    "torch_npu/npu/memory.py": (
        "__all__ = ['max_memory_allocated', 'max_memory_reserved', 'reset_peak_memory_stats']\n"
        "def max_memory_allocated(device=None):\n    pass\ndef max_memory_reserved(device=None):\n    pass\n"
        "def reset_peak_memory_stats(device=None):\n    pass\ndef hidden():\n    pass\n"
    ),
    "torch_npu/npu/npu_config.py": (
        "class _Hf32:\n    def __getattr__(self, name):\n        if name == 'allow_hf32':\n            return False\n"
        "matmul = _Hf32()\nconv = _Hf32()\n"
        "def set_compile_mode(jit_compile=True):\n    pass\ndef is_jit_compile_false():\n    return True\n"
    ),
    "torch_npu/npu/amp/__init__.py": "from .autocast_mode import autocast\nfrom .grad_scaler import GradScaler\n",
    "torch_npu/npu/amp/autocast_mode.py": (
        "class autocast:\n    def __init__(self, enabled=True, dtype=None, cache_enabled=True):\n        pass\n"
    ),
    "torch_npu/npu/amp/grad_scaler.py": "class GradScaler:\n    pass\n",
    "torch_npu/optim/__init__.py": (
        "from .npu_fused_adam import NpuFusedAdam\nfrom .npu_fused_adamw import NpuFusedAdamW\n"
    ),
    "torch_npu/optim/npu_fused_adam.py": (
        "class NpuFusedAdam:\n    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999)):\n        pass\n"
    ),
    "torch_npu/optim/npu_fused_adamw.py": (
        "class NpuFusedAdamW(object):\n    def __init__(self, params, lr=1e-3):\n        pass\n"
    ),
}

APEX = {
    "apex/__init__.py": "import torch\nfrom . import amp\nfrom . import optimizers\n",
    "apex/amp/__init__.py": (
        "from .frontend import initialize\nfrom .handle import scale_loss\nfrom ._amp_state import _amp_state\n"
    ),
    "apex/amp/_amp_state.py": (
        "class AmpState:\n    def __init__(self):\n        self.hard_override = False\n_amp_state = AmpState()\n"
    ),
    "apex/amp/_initialize.py": "from ._amp_state import _amp_state\ndef _initialize():\n    _amp_state.loss_scalers = []\n",
    "apex/amp/frontend.py": (
        "def initialize(models, optimizers=None, enabled=True, opt_level='O1', loss_scale=None, verbosity=1,"
        " combine_grad=None):\n    return models, optimizers\n"
    ),
    "apex/amp/handle.py": "def scale_loss(loss, optimizers):\n    pass\n",
    "apex/optimizers/__init__.py": "from .npu_fused_adam import NpuFusedAdam\n",
    "apex/optimizers/npu_fused_adam.py": (
        "class NpuFusedAdam:\n    def __init__(self, params, lr=1e-3, **kwargs):\n        pass\n"
    ),
}


def _wheel(tmp_path: Path, files: dict[str, str]) -> Path:
    path = tmp_path / "torch_npu-9.9.9-cp311-cp311-manylinux_2_28_aarch64.whl"
    with zipfile.ZipFile(path, "w") as zf:
        for name, text in files.items():
            zf.writestr(name, text)
    return path


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (tmp_path / "tree" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "tree" / name).write_text(text)
    return tmp_path / "tree"


def _check_wheel(tmp_path: Path, files: dict[str, str]) -> list[str]:
    lines: list[str] = []
    contracts._check_zip(contracts.scan(), _wheel(tmp_path, files), "9.9.9", lines)
    return lines


def test_the_scan_finds_what_bench_uses_with_the_file_and_line():
    uses = {u.name: u for u in contracts.scan()}
    # attribute chains, from-imports, aliases (npu = torch.npu, self.backend = torch.npu), getattr, __import__
    for name in (
        "torch_npu.optim.NpuFusedAdamW",
        "torch.npu.set_compile_mode",
        "torch.npu.matmul.allow_hf32",
        "torch.npu.synchronize",
        "torch_npu.npu.amp.GradScaler",
        "apex.optimizers.NpuFusedAdam",
        "apex.amp.initialize",
    ):
        assert name in uses, name
    assert uses["torch.npu.set_compile_mode"].keywords == {
        "jit_compile": uses["torch.npu.set_compile_mode"].keywords["jit_compile"]
    }
    # the declared keyword, where amp_bench.py builds it
    where = uses["apex.amp.initialize"].keywords["combine_grad"]
    file, line = where.split(":")
    assert (
        '"combine_grad": True'
        in (contracts.BENCH.parent / file).read_text().splitlines()[int(line) - 1]
    )


def test_a_synthetic_wheel_with_every_name_has_no_drift(tmp_path):
    assert _check_wheel(tmp_path, NPU) == []


def test_a_renamed_class_is_one_drift_line_with_the_release_and_bench_file_line(tmp_path):
    files = dict(NPU)
    files["torch_npu/optim/npu_fused_adamw.py"] = files[
        "torch_npu/optim/npu_fused_adamw.py"
    ].replace("NpuFusedAdamW", "NpuFusedAdamW2")
    files["torch_npu/optim/__init__.py"] = files["torch_npu/optim/__init__.py"].replace(
        "NpuFusedAdamW", "NpuFusedAdamW2"
    )
    lines = _check_wheel(tmp_path, files)
    use = next(u for u in contracts.scan() if u.name == "torch_npu.optim.NpuFusedAdamW")
    assert len(lines) == 1
    assert lines[0].startswith(
        f"drift: torch_npu.optim.NpuFusedAdamW in torch_npu 9.9.9: torch_npu.optim has no NpuFusedAdamW "
        f"-- used at {use.where[0]}"
    )
    assert use.where[0].startswith("bench/amp_bench.py:")


def test_a_renamed_keyword_is_a_drift_naming_the_keyword(tmp_path):
    files = dict(NPU)
    files["torch_npu/npu/npu_config.py"] = files["torch_npu/npu/npu_config.py"].replace(
        "jit_compile=True", "jit=True"
    )
    lines = _check_wheel(tmp_path, files)
    assert len(lines) == 1
    assert lines[0].startswith(
        "drift: torch.npu.set_compile_mode(..., jit_compile=) in torch_npu 9.9.9: "
    )
    assert "-- used at bench/amp_bench.py:" in lines[0]


def test_torch_npu_follows_the_device_module_torch_npu_registers(tmp_path):
    files = dict(NPU)
    files["torch_npu/__init__.py"] = files["torch_npu/__init__.py"].replace(
        "torch._register_device_module('npu', torch_npu.npu)\n", ""
    )
    # torch_npu 2.14 registers it from torch_npu/_init/registry/backend.py: still found
    files["torch_npu/_init/__init__.py"] = ""
    files["torch_npu/_init/backend.py"] = (
        "import torch\nimport torch_npu\ndef register():\n    torch._register_device_module('npu', torch_npu.npu)\n"
    )
    assert _check_wheel(tmp_path, files) == []
    del files["torch_npu/_init/backend.py"]
    lines = _check_wheel(tmp_path, files)
    assert lines and all("torch_npu does not register torch.npu" in line for line in lines)
    assert all(line.startswith("drift: torch.npu.") for line in lines)


def test_a_star_import_respects_all_and_a_getattr_fallback_is_not_a_drift(tmp_path):
    files = dict(NPU)
    files["torch_npu/npu/memory.py"] = files["torch_npu/npu/memory.py"].replace(
        "'max_memory_allocated', ", ""
    )
    lines = _check_wheel(tmp_path, files)
    assert [line.split(":")[1].split(" in ")[0].strip() for line in lines] == [
        "torch.npu.max_memory_allocated"
    ]
    # device_adapter reads max_memory_reserved with getattr(backend, "max_memory_reserved", None): absent, not a drift
    files["torch_npu/npu/memory.py"] = NPU["torch_npu/npu/memory.py"].replace(
        "'max_memory_reserved', ", ""
    )
    result = contracts._check_zip(contracts.scan(), _wheel(tmp_path, files), "9.9.9", lines := [])
    assert lines == [] and result["ok"] and result["absent"] == 1


def test_apex_tree_keyword_and_instance_attributes(tmp_path):
    lines: list[str] = []
    result = contracts._check_dir(contracts.scan(), _tree(tmp_path, APEX), "master", lines)
    assert lines == [] and result["ok"]
    by_name = {f["name"]: f for f in result["findings"]}
    # amp_bench.py reads _amp_state.handle with getattr(..., None): absent here, not a drift
    assert by_name["apex.amp._amp_state._amp_state.handle._deactivate"]["status"] == "absent"
    assert (
        "set in apex/amp/_initialize.py:3" in by_name["apex.amp._amp_state.loss_scalers"]["detail"]
    )
    # Ascend's keyword removed: one drift line, at the line of amp_bench.py that passes it
    files = dict(APEX)
    files["apex/amp/frontend.py"] = files["apex/amp/frontend.py"].replace(", combine_grad=None", "")
    lines = []
    contracts._check_dir(contracts.scan(), _tree(tmp_path / "b", files), "v9", lines)
    assert len(lines) == 1
    assert lines[0].startswith(
        "drift: apex.amp.initialize(..., combine_grad=) in apex v9: no such keyword -- used at bench/amp_bench.py:"
    )


def test_unreadable_or_hostile_sources_are_one_line_errors(tmp_path):
    not_zip = tmp_path / "torch_npu-1-cp311-cp311-linux_aarch64.whl"
    not_zip.write_bytes(b"not a zip")
    with pytest.raises(contracts.SourceError, match="cannot read"):
        contracts._check_zip(contracts.scan(), not_zip, "1", [])
    link = tmp_path / "link.whl"
    link.symlink_to(_wheel(tmp_path, NPU))
    with pytest.raises(contracts.SourceError):
        contracts._check_zip(contracts.scan(), link, "1", [])
    big = dict(NPU)
    big["torch_npu/npu/utils.py"] += "#" * (contracts.MEMBER_MAX + 1)
    (tmp_path / "big").mkdir()
    with pytest.raises(contracts.SourceError, match="larger than"):
        _check_wheel(tmp_path / "big", big)
    with pytest.raises(contracts.ConfigError, match="no apex/ package"):
        contracts._check_dir(contracts.scan(), tmp_path, "x", [])


def test_contract_line_reads_the_result_file_as_untrusted(tmp_path):
    assert venvrun.contract_line(tmp_path).startswith("contract: not checked")
    (tmp_path / contracts.RESULT_FILE).write_text(
        json.dumps(
            {
                "torch_npu": "2.7.1.post2",
                "apex_ref": "master",
                "ok": True,
                "checked": "2026-12-02T16:40:00Z",
            }
        )
    )
    assert venvrun.contract_line(tmp_path) == (
        "contract: torch_npu 2.7.1.post2 + apex master passed (nox -s contracts, 2026-12-02T16:40:00Z)"
    )
    (tmp_path / contracts.RESULT_FILE).write_text(json.dumps({"torch_npu": ["x"], "ok": "yes"}))
    assert "not a contracts result" in venvrun.contract_line(tmp_path)
    (tmp_path / contracts.RESULT_FILE).write_text(
        json.dumps({"torch_npu": "2.7\x1b[31m", "apex_ref": "m", "ok": False})
    )
    line = venvrun.contract_line(tmp_path)
    assert "\x1b" not in line and "DRIFTED" in line


def test_the_table_is_release_by_ref():
    ok = {"ok": True}
    bad = {"ok": False}
    table = contracts.render_table(
        {"2.7.1.post2": ok, "2.14.0": bad}, {"master": ok, "5.0.rc3": ok}
    )
    rows = table.splitlines()
    assert rows[0].split()[-2:] == ["master", "5.0.rc3"]
    assert rows[1].split() == ["2.7.1.post2", "ok", "ok"]
    assert rows[2].split() == ["2.14.0", "drift", "drift"]
    many = {f"r{i}": ok for i in range(8)}
    assert "apex refs: 1=r0, 2=r1" in contracts.render_table({"2.1.0": ok}, many)


def test_a_release_or_target_that_is_not_one_is_refused_before_anything_is_read(tmp_path):
    for bad in ("*", "2.7.1.post2/../x", "2.7.1-post2", "", "2.7.1 "):
        with pytest.raises(contracts.ConfigError, match="is not a torch_npu release"):
            contracts.check_release(bad)
    assert contracts.check_release("2.7.1.post2") == "2.7.1.post2"
    with pytest.raises(contracts.ConfigError, match="is not a target id"):
        contracts.main(
            ["--target", "../../etc", "--dist", str(tmp_path)], {"APEXKIT_CACHE_DIR": str(tmp_path)}
        )


def test_contract_hint_names_the_maintainers_session_and_the_target(tmp_path, monkeypatch):
    """The check is a maintainers' nox session (tools/ is not installed): the hint names it in every door."""
    folder = tmp_path / "py3.11-torch2.13.0-x86_64-master"
    folder.mkdir()
    for door in ("invoke", "apexkit"):
        monkeypatch.setitem(venvrun.vocab.ENTRY, "name", door)
        assert venvrun.contract_line(folder) == (
            "contract: not checked -- nox -s contracts -- --target py3.11-torch2.13.0-x86_64-master"
        )
    renamed = tmp_path / "my wheel; rm -rf ~"
    renamed.mkdir()
    assert venvrun.contract_line(renamed).endswith("-- nox -s contracts -- --target ID")
