"""The build's smoke test, in a fresh venv holding only the wheel and torch (apexkit.wheel.builder
Builder._smoke_test):

    python smoke.py MODULE[,MODULE...] [CPU_TIER_SCRIPT]

imports torch (torch_npu auto-loading off: apexkit runs it with TORCH_DEVICE_BACKEND_AUTOLOAD=0, and LD_BIND_NOW=1 so
every undefined symbol of a compiled module is bound at import), then each compiled module, apex_C.flatten against
torch.cat, torch_npu and apex as far as they import without the CANN runtime. Prints one line,
"APEXKIT-SMOKE " + JSON (python, torch, modules {name: {ok, file | error}}, apex, op, torch_npu, autoload, checked,
needs_cann), which the builder reads. With a second argument (bench/cpu_tier.py) that script then runs in this same
process: one `import torch` (seconds) instead of two; its JSON report is the last line of stdout.
"""

import importlib
import importlib.util
import json
import os
import sys
import warnings

warnings.simplefilter("ignore")
CANN_LIBS = (
    "libhccl",
    "libascendcl",
    "libascend_hal",
    "libge_runner",
    "libacl_op_compiler",
    "set_env.sh",
)
out = {
    "python": sys.version.split()[0],
    "modules": {},
    "apex": None,
    "op": None,
    "torch_npu": None,
    "autoload": os.environ.get("TORCH_DEVICE_BACKEND_AUTOLOAD"),
    "checked": [],
    "needs_cann": [],
}
import torch  # noqa: E402 (after the warnings filter)

out["torch"] = torch.__version__
out["checked"].append("import torch (torch_npu auto-loading off)")
for name in sys.argv[1].split(","):
    try:
        mod = importlib.import_module(name)
        out["modules"][name] = {"ok": True, "file": getattr(mod, "__file__", "")}
    except Exception as exc:
        out["modules"][name] = {"ok": False, "error": "%s: %s" % (type(exc).__name__, exc)}
out["checked"].append("import " + ", ".join(out["modules"]))
apex_C = sys.modules.get("apex_C")
if apex_C is not None and hasattr(apex_C, "flatten"):
    ts = [torch.arange(3.0), torch.ones(2, 2)]
    flat = apex_C.flatten(ts)
    out["op"] = (
        "apex_C.flatten ok"
        if torch.equal(flat, torch.cat([t.reshape(-1) for t in ts]))
        else "apex_C.flatten WRONG"
    )
    out["checked"].append("apex_C.flatten == torch.cat on CPU tensors")


def needs_cann(exc):
    return any(lib in str(exc) for lib in CANN_LIBS)


if importlib.util.find_spec("torch_npu") is not None:
    try:
        import torch_npu

        out["torch_npu"] = "imported %s" % torch_npu.__version__
        out["checked"].append("import torch_npu")
    except Exception as exc:
        first = (str(exc).splitlines() or [""])[0][:160]
        if needs_cann(exc):
            out["torch_npu"] = "installed; import needs the CANN runtime (%s)" % first
            out["needs_cann"].append("import torch_npu")
        else:
            out["torch_npu"] = "error: %s: %s" % (type(exc).__name__, first)
try:
    import apex  # noqa: F401

    out["apex"] = "imported"
    out["checked"].append("import apex")
except ModuleNotFoundError as exc:
    out["apex"] = (
        "needs NPU runtime (torch_npu + CANN): %s" % exc
        if "torch_npu" in str(exc)
        else "error: %s" % exc
    )
    if "torch_npu" in str(exc):
        out["needs_cann"].append("import apex (imports torch_npu)")
except Exception as exc:
    if needs_cann(exc):
        out["apex"] = (
            "needs NPU runtime (torch_npu + CANN): %s" % (str(exc).splitlines() or [""])[0][:160]
        )
        out["needs_cann"].append("import apex (imports torch_npu)")
    else:
        out["apex"] = "error: %s: %s" % (type(exc).__name__, exc)
if out["needs_cann"]:
    out["needs_cann"].append("NPU kernels (nox -s validate -- --device npu, on a node with CANN)")
print("APEXKIT-SMOKE " + json.dumps(out), flush=True)
if (
    len(sys.argv) > 2
):  # the CPU test tier in the same process: one `import torch` (seconds) instead of two
    import runpy

    sys.argv = [sys.argv[2]]
    runpy.run_path(sys.argv[0], run_name="__main__")
