#!/usr/bin/env python3
"""Is this environment ready to train with Apex for Ascend? A table of checks (+ JSON), exit 0 only when every
check required for --device passes.

    python bench/validate_env.py --device npu --json report.json
    python bench/validate_env.py --device cpu          # apex/NPU checks reported as skipped, with the reason
    python bench/validate_env.py                       # the device this torch finds (probes/found_device.py)

Without --device: the device this torch finds (npu, cuda, else cpu), said with why; --device npu or cuda on a host
whose torch finds another names the flag for the one there is in the first failed check's hint.
Checks: torch; torch_npu (or its import error); CANN version and whether set_env.sh was sourced; the driver
(npu-smi info); apex and its compiled modules (apex_C, change_data_ptr); the device (available, count, current,
name); what this torch can do on the device (autocast dtypes, GradScaler, distributed backend: probed by trying);
a torch.autocast step in a dtype the device supports; one apex amp.initialize(O1) + scaled backward + optimizer
step; the fused optimizer apex.optimizers.NpuFusedAdam on NPU. A check this torch or device cannot run is skipped
with its reason. Runs inside the target venv (Python 3.8+, torch 2.1+): standard library + torch (+ torch_npu, apex).
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import importlib
import importlib.util
import io
import json
import os
import platform
import shutil
import subprocess
import sys
import types
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parent / "probes"))
import found_device
import targetenv

# torch >= 2.5 imports installed device backends at `import torch`, and torch_npu needs CANN for that; the torch_npu
# check below imports it explicitly, so a host without CANN still gets its table (device_adapter does the same).
targetenv.no_autoload()

SET_ENV_HINT = targetenv.SET_ENV_HINT


class Report:
    def __init__(self, device: str) -> None:
        self.device = device
        self.why = ""  # why this device, when it was picked (no --device)
        self.checks: list[dict] = []
        self.standins: dict | None = (
            None  # apex stand-ins MindSpeed put in place, when apex itself is absent
        )

    def add(
        self,
        name: str,
        status: str,
        detail: str,
        hint: str = "",
        required_for=("npu", "cuda", "cpu"),
    ) -> None:
        self.checks.append(
            {
                "check": name,
                "status": status,
                "detail": detail,
                "hint": hint,
                "required": self.device in required_for,
            }
        )

    @property
    def ok(self) -> bool:
        return all(c["status"] == "ok" for c in self.checks if c["required"])


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{exc.__class__.__name__}: {text[0]}" if text else exc.__class__.__name__


def cann_info(environ=os.environ) -> dict:
    """CANN version from the toolkit's install.info files (<=8.3: ascend-toolkit/latest/<arch>-linux, 8.5+: cann/)."""
    home = targetenv.sourced_home(environ)
    roots = [home] if home else []
    roots += targetenv.CANN_HOMES
    for root in roots:
        for info in sorted(
            glob.glob(os.path.join(root, "*-linux", "ascend_toolkit_install.info"))
            + glob.glob(os.path.join(root, "ascend_toolkit_install.info"))
        ):
            for line in Path(info).read_text(errors="replace").splitlines():
                if line.startswith("version="):
                    return {"version": line.split("=", 1)[1].strip(), "file": info, "home": home}
    return {"version": None, "file": None, "home": home}


def check_torch(report: Report):
    try:
        import torch
    except Exception as exc:
        report.add("torch", "fail", _first_line(exc), "install torch into this venv")
        return None
    report.add("torch", "ok", f"{torch.__version__} (python {platform.python_version()})")
    return torch


def check_torch_npu(report: Report):
    try:
        import torch_npu
    except Exception as exc:
        text = _first_line(exc)
        hint = (
            SET_ENV_HINT
            if any(s in text for s in ("libascendcl", "libhccl", "set_env", ".so"))
            else "pip install torch-npu matching torch (see matrix.toml), then " + SET_ENV_HINT
        )
        status = "fail" if report.device == "npu" else "skip"
        report.add("torch_npu", status, f"not importable: {text}", hint, required_for=("npu",))
        return None
    report.add("torch_npu", "ok", torch_npu.__version__, required_for=("npu",))
    return torch_npu


def check_cann(report: Report) -> None:
    info = cann_info()
    sourced = bool(info["home"]) and info["home"] in os.environ.get("LD_LIBRARY_PATH", "")
    status = "ok" if info["version"] and sourced else ("fail" if report.device == "npu" else "skip")
    if info["version"]:
        detail = f"CANN {info['version']} ({info['file']}); set_env.sh {'sourced' if sourced else 'NOT sourced'}"
    else:
        detail = "no CANN toolkit found (ASCEND_HOME_PATH unset, nothing under /usr/local/Ascend)"
    report.add(
        "CANN", status, detail, "" if status == "ok" else SET_ENV_HINT, required_for=("npu",)
    )
    if shutil.which("npu-smi"):
        result = subprocess.run(["npu-smi", "info"], capture_output=True, text=True, timeout=60)
        first = next(
            (
                line.strip("| ").strip()
                for line in result.stdout.splitlines()
                if "npu-smi" in line.lower()
            ),
            "",
        )
        status = "ok" if result.returncode == 0 else "fail"
        report.add(
            "driver (npu-smi info)",
            status,
            first or result.stderr.strip()[:200],
            required_for=("npu",),
        )
    else:
        report.add(
            "driver (npu-smi info)",
            "fail" if report.device == "npu" else "skip",
            "npu-smi not found",
            "install the Ascend driver (npu-smi comes with it)",
            required_for=("npu",),
        )


# MindSpeed >= 2.2 installs no apex: its patch manager (mindspeed/patch_utils.py, applied when
# mindspeed.megatron_adaptor is imported) puts a types.ModuleType into sys.modules for each apex module Megatron
# imports (apex.optimizers, apex.multi_tensor_apply, apex.normalization.fused_layer_norm, ...), with this __file__
# and a ModuleSpec without loader or origin, and sets the stand-in functions/classes on it.
STANDIN_FILE = "mindspeed.dummy_module.py"
MINDSPEED_ADAPTOR = "mindspeed.megatron_adaptor"
STANDIN_TIMEOUT = (
    300  # seconds for the child that imports MindSpeed's adaptor (it imports torch_npu, megatron)
)


def standins(modules=None) -> dict:
    """apex modules in `modules` (default sys.modules) that are stand-ins, not files: name -> its public names."""
    found = {}
    for name, module in list((sys.modules if modules is None else modules).items()):
        if name != "apex" and not name.startswith("apex."):
            continue
        spec = getattr(module, "__spec__", None)
        no_file = (
            spec is not None
            and getattr(spec, "origin", None) is None
            and getattr(spec, "loader", None) is None
            and not getattr(module, "__path__", None)
        )
        if getattr(module, "__file__", None) == STANDIN_FILE or no_file:
            found[name] = sorted(
                n
                for n, v in vars(module).items()
                if not n.startswith("_") and not isinstance(v, types.ModuleType)
            )[:50]
    return found


_STANDIN_CHILD = """
import json, sys
sys.argv = [sys.argv[0]]
import importlib
import importlib.util
importlib.import_module(%r)
sys.path.insert(0, %r)
import validate_env
print("APEXKIT-STANDINS " + json.dumps(validate_env.standins()))
"""


def mindspeed_standins(timeout: float = STANDIN_TIMEOUT) -> tuple:
    """(stand-ins MindSpeed installs, "") from importing its adaptor in a child interpreter (this process stays as
    it was: the adaptor also patches torch for the NPU), or (None, why) when MindSpeed is not installed or its
    adaptor does not import here."""
    try:
        if importlib.util.find_spec("mindspeed") is None:
            return None, "MindSpeed is not installed"
    except (ImportError, ValueError) as exc:
        return None, f"MindSpeed cannot be looked up: {_first_line(exc)}"
    code = _STANDIN_CHILD % (MINDSPEED_ADAPTOR, str(Path(__file__).resolve().parent))
    try:
        proc = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout
        )
    except subprocess.TimeoutExpired:
        return None, f"import {MINDSPEED_ADAPTOR} took more than {timeout:.0f} s"
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith("APEXKIT-STANDINS "):
            try:
                data = json.loads(line.split(" ", 1)[1])
            except ValueError:
                break
            if isinstance(data, dict):
                return data, ""
    last = (proc.stderr.strip().splitlines() or ["no output"])[-1][:200]
    return None, f"import {MINDSPEED_ADAPTOR} failed: {last}"


def _inside_apex(exc: BaseException) -> str:
    """Where in apex's own files an import stopped: 'apex/amp/frontend.py:12', or ''."""
    where = ""
    tb = exc.__traceback__
    while tb is not None:
        name = tb.tb_frame.f_code.co_filename
        marker = f"{os.sep}apex{os.sep}"
        if marker in name:
            where = f"apex{os.sep}{name.rsplit(marker, 1)[-1]}:{tb.tb_lineno}"
        tb = tb.tb_next
    return where


def _apex_absent() -> bool:
    """No apex package here: neither in sys.modules nor findable."""
    if "apex" in sys.modules:
        return False
    try:
        return importlib.util.find_spec("apex") is None
    except (ImportError, ValueError):
        return False


def _standin_rows(report: Report, found: dict, how: str) -> None:
    names = ", ".join(f"{m}.{n}" for m in sorted(found) for n in found[m][:4]) or ", ".join(
        sorted(found)
    )
    report.add(
        "import apex",
        "ok",
        f"apex absent, MindSpeed stand-ins in place ({how}): {names[:300]}",
        required_for=(),
    )
    why = "apex absent, MindSpeed stand-ins in place (no compiled apex modules to load)"
    for module in ("apex_C", "change_data_ptr"):
        report.add(f"apex compiled module {module}", "skip", why, required_for=())


def check_apex(report: Report) -> bool:
    """The apex rows. Three cases told apart: apex installed (its compiled modules load, it imports, or where in
    apex the import broke); apex absent with MindSpeed's stand-ins in place (not a failure); apex absent."""
    report.standins = None
    found = standins()
    if found and "apex" in found:
        report.standins = found
        _standin_rows(report, found, "in this process")
        return False
    if _apex_absent():
        found, why = mindspeed_standins()
        if found:
            report.standins = found
            _standin_rows(report, found, f"import {MINDSPEED_ADAPTOR}")
            return False
        status = "fail" if report.device == "npu" else "skip"
        detail = "apex is not installed" + (
            "" if why == "MindSpeed is not installed" else f"; {why}"
        )
        hint = "install the apexkit wheel into this venv"
        for module in ("apex_C", "change_data_ptr"):
            report.add(
                f"apex compiled module {module}", status, detail, hint, required_for=("npu",)
            )
        report.add("import apex", status, detail, hint, required_for=("npu",))
        return False
    compiled = []
    for module in ("apex_C", "change_data_ptr"):
        try:
            importlib.import_module(module)
            compiled.append(module)
        except Exception as exc:
            status = "fail" if report.device == "npu" else "skip"
            report.add(
                f"apex compiled module {module}",
                status,
                _first_line(exc),
                "install the apexkit wheel (nox -s build-3.X) into this venv",
                required_for=("npu",),
            )
    for module in compiled:
        report.add(f"apex compiled module {module}", "ok", "loads", required_for=("npu",))
    try:
        import apex
    except Exception as exc:
        text = _first_line(exc)
        where = _inside_apex(exc)
        needs_npu = "torch_npu" in text or getattr(exc, "name", None) == "torch_npu"
        if needs_npu:
            status = "fail" if report.device == "npu" else "skip"
            hint = "install torch_npu + CANN (Ascend apex imports torch_npu)"
        else:  # an error inside apex itself: apex is broken, not missing
            status = "fail" if report.device == "npu" else "warn"
            text = f"apex is broken: {text}" + (f" (at {where})" if where else "")
            hint = "reinstall the apexkit wheel (pip install --force-reinstall), or rebuild it"
        report.add("import apex", status, text, hint, required_for=("npu",))
        return False
    report.add(
        "import apex", "ok", getattr(apex, "__file__", "") or "importable", required_for=("npu",)
    )
    return True


def check_contract(report: Report, environ=os.environ) -> None:
    """Which API contract this wheel passed (`nox -s contracts`): the line apexkit validate passes in, else why
    there is none. Informational: the contract is checked on the host, not here."""
    line = environ.get("APEXKIT_CONTRACT", "").strip().splitlines()
    text = (
        line[0][:300]
        if line
        else "contract: not checked (run through apexkit validate, after nox -s contracts -- --target ID)"
    )
    status = "ok" if " passed " in text else "skip"
    report.add("API contract (nox -s contracts)", status, text.split(": ", 1)[-1], required_for=())


def check_device(report: Report, torch) -> object | None:
    import device_adapter

    try:
        device = device_adapter.Device(report.device)
    except Exception as exc:
        report.add(
            f"device {report.device}",
            "fail",
            _first_line(exc),
            SET_ENV_HINT if report.device == "npu" else "",
        )
        return None
    if device.backend is not None and not device.backend.is_available():
        report.add(
            f"device {report.device}",
            "fail",
            f"torch.{report.device}.is_available() is False",
            "check the driver (npu-smi info / nvidia-smi) and ASCEND_RT_VISIBLE_DEVICES/CUDA_VISIBLE_DEVICES",
        )
        return None
    current = "-" if device.index is None else device.index
    report.add(
        f"device {report.device}",
        "ok",
        f"{device.count()} available, current {current}, {device.name()}",
    )
    return device


def check_capabilities(report: Report, device) -> None:
    """What this torch can do on the device, as probed: informational, the steps below depend on it."""
    caps = device.capabilities()
    autocast = ", ".join(
        f"{name} {'yes' if c['ok'] else 'no'}" for name, c in caps["autocast"].items()
    )
    scaler = caps["grad_scaler"]["via"] or "none"
    dist = caps["distributed"]
    detail = (
        f"torch {caps['torch']} on {device.kind}: autocast {autocast}; GradScaler {scaler}; "
        f"distributed {dist['backend']} {'yes' if dist['ok'] else 'no'}"
    )
    report.add("torch capabilities", "ok", detail, required_for=())


def autocast_dtype(torch, device) -> tuple[object, str]:
    """The dtype the autocast step uses here (fp16 with a GradScaler where there is one, else bf16), or why none."""
    preferred = (
        (torch.bfloat16, torch.float16) if device.kind == "cpu" else (torch.float16, torch.bfloat16)
    )
    reasons = []
    for dtype in preferred:
        if not device.autocast_support(dtype)["ok"]:
            reasons.append(device.unsupported_autocast(dtype))
            continue
        if dtype == torch.float16 and not device.grad_scaler_support()["ok"]:
            reasons.append(device.grad_scaler_support()["reason"])
            continue
        return dtype, ""
    return None, "; ".join(reasons)


def check_autocast_step(report: Report, torch, device) -> None:
    dtype, why = autocast_dtype(torch, device)
    if dtype is None:
        status = "fail" if device.kind == "npu" else "skip"
        report.add(
            "torch.autocast step",
            status,
            why,
            "install a torch (+ torch_npu) whose autocast runs on this device",
            required_for=("npu",),
        )
        return
    try:
        model = torch.nn.Linear(16, 4).to(device.torch_device)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        scaler = device.grad_scaler(dtype == torch.float16)
        x = torch.randn(8, 16, device=device.torch_device)
        with device.autocast(dtype):
            loss = model(x).float().pow(2).mean()
        if scaler is not None:
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
        else:
            loss.backward()
            optimizer.step()
        device.synchronize()
        name = str(dtype).replace("torch.", "")
        report.add(
            "torch.autocast step", "ok", f"{name} forward, backward, step; loss {loss.item():.4f}"
        )
    except Exception as exc:
        report.add("torch.autocast step", "fail", _first_line(exc))


def check_apex_amp(report: Report, torch, device, apex_ok: bool) -> None:
    required = ("npu",)
    if report.standins is not None:  # MindSpeed's stand-ins: there is no apex.amp to step with
        why = "apex absent, MindSpeed stand-ins in place (they replace what Megatron imports, not apex.amp)"
        report.add("apex amp O1 step", "skip", why, required_for=())
        if report.device == "npu":
            report.add("NpuFusedAdam step", "skip", why, required_for=())
        return
    if device is None or device.kind == "cpu" or not apex_ok:
        if device is None:
            why = f"no usable {report.device} device (see above)"
        else:
            why = (
                "apex.amp runs on NPU/GPU"
                if device.kind == "cpu"
                else "apex not importable (see above)"
            )
        status = "fail" if report.device == "npu" else "skip"
        report.add("apex amp O1 step", status, why, required_for=required)
        if report.device == "npu" or device is None or device.kind == "npu":
            report.add("NpuFusedAdam step", status, why, required_for=required)
        return
    try:
        from apex import amp

        model = torch.nn.Linear(16, 4).to(device.torch_device)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        model, optimizer = amp.initialize(model, optimizer, opt_level="O1", verbosity=0)
        loss = model(torch.randn(8, 16, device=device.torch_device)).float().pow(2).mean()
        with amp.scale_loss(loss, optimizer) as scaled:
            scaled.backward()
        optimizer.step()
        device.synchronize()
        report.add(
            "apex amp O1 step",
            "ok",
            f"initialize(O1) + scaled backward + step; loss {loss.item():.4f}",
            required_for=required,
        )
    except Exception as exc:
        report.add("apex amp O1 step", "fail", _first_line(exc), required_for=required)
    if device.kind != "npu":
        return
    try:
        from apex.optimizers import NpuFusedAdam

        model = torch.nn.Linear(16, 4).to(device.torch_device)
        optimizer = NpuFusedAdam(model.parameters(), lr=1e-3)
        model(torch.randn(8, 16, device=device.torch_device)).pow(2).mean().backward()
        optimizer.step()
        device.synchronize()
        report.add("NpuFusedAdam step", "ok", "fused Adam step on the NPU", required_for=required)
    except Exception as exc:
        report.add("NpuFusedAdam step", "fail", _first_line(exc), required_for=required)


def name_the_device_found(report: Report, asked: str, found: tuple) -> None:
    """--device npu or cuda on a host whose torch finds another device: the first failed check's hint (what `apexkit
    up` shows as the fix) starts with the flag for the device there is."""
    kind, why = found
    failed = next((c for c in report.checks if c["required"] and c["status"] != "ok"), None)
    if asked in (kind, "cpu") or failed is None or failed["check"] == "torch":
        return
    hint = f"this host has {kind} ({why}): --device {kind} validates for it"
    failed["hint"] = hint + (f"; or {failed['hint']}" if failed["hint"] else "")


def run(device: str) -> Report:
    report = Report(device)
    torch = check_torch(report)
    if torch is None:
        return report
    check_torch_npu(report)
    check_cann(report)
    apex_ok = check_apex(report)
    check_contract(report)
    dev = check_device(report, torch)
    if dev is not None:
        check_capabilities(report, dev)
        check_autocast_step(report, torch, dev)
    check_apex_amp(report, torch, dev, apex_ok)
    return report


def render(report: Report) -> str:
    width = max(len(c["check"]) for c in report.checks)
    lines = [f"environment for --device {report.device}:"]
    if report.why:  # picked, not asked for
        lines.insert(0, f"device {report.device}: {report.why} (--device npu|cuda|cpu forces one)")
    for c in report.checks:
        mark = {"ok": "ok  ", "fail": "FAIL", "skip": "skip", "warn": "warn"}[c["status"]]
        needed = "" if c["required"] else " (not required)"
        lines.append(f"  {mark}  {c['check']:<{width}}  {c['detail']}{needed}")
        if c["hint"] and c["status"] != "ok":
            lines.append(f"        {'':<{width}}  -> {c['hint']}")
    verdict = (
        "ready"
        if report.ok
        else "NOT ready: "
        + ", ".join(c["check"] for c in report.checks if c["required"] and c["status"] != "ok")
    )
    lines.append(f"verdict: {verdict}")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--device",
        choices=("npu", "cuda", "cpu"),
        help="the device the environment must be ready for (default: the one this torch finds -- npu where "
        "torch_npu imports and a CANN runtime answers, cuda where a CUDA torch sees a GPU, else cpu)",
    )
    p.add_argument("--json", metavar="PATH", help="also write the report as JSON ('-' for stdout)")
    p.add_argument(
        "--tests",
        metavar="TREE",
        default=os.environ.get("APEXKIT_APEX_TREE"),
        help="--device npu: the source tree the wheel was built from (build/<target>/tree), whose Ascend "
        "test suites the NPU tier runs (bench/npu_tier.py)",
    )
    p.add_argument(
        "--junit", metavar="PATH", help="--device npu: write the NPU tier's JUnit XML here"
    )
    args = p.parse_args(argv)
    found = found_device.found()
    report = run(args.device or found[0])
    report.why = "" if args.device else found[1]
    if (
        report.device == "npu"
    ):  # the NPU test tier: Ascend's own suites + equivalence checks, or what it needs
        import npu_tier

        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            npu_tier.main(
                (["--tests", args.tests] if args.tests else [])
                + (["--junit", args.junit] if args.junit else [])
            )
        tier = json.loads(out.getvalue().strip().splitlines()[-1])
        failed = [r["name"] for r in tier["results"] if r["status"] == "fail"]
        detail = (
            "needs an NPU: " + "; ".join(tier["needs"])
            if tier["needs"]
            else f"{len(tier['results']) - len(failed)} of {len(tier['results'])} passed"
            + (f"; failed: {', '.join(failed)}" if failed else "")
        )
        report.add(
            "NPU test tier (bench/npu_tier.py)",
            "ok" if tier["ok"] else "fail",
            detail,
            required_for=("npu",),
        )
    name_the_device_found(report, args.device or found[0], found)
    data = {
        "device": report.device,
        "found": {"device": found[0], "why": found[1]},
        "ok": report.ok,
        "checks": report.checks,
        "python": sys.executable,
        "platform": platform.platform(),
    }
    if args.json == "-":
        print(json.dumps(data, indent=2))
        print(render(report), file=sys.stderr)
    else:
        print(render(report))
        if args.json:
            Path(args.json).parent.mkdir(parents=True, exist_ok=True)
            Path(args.json).write_text(json.dumps(data, indent=2) + "\n")
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
