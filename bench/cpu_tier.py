"""The CPU test tier of an installed Apex for Ascend wheel: runs in the wheel's venv (standard library + torch), on any
machine, no NPU and no CANN.

    python bench/cpu_tier.py [--json out.json] [--junit out.xml]

Checks (each ok / fail / skip with the reason):
- change_data_ptr round trip: one tensor's storage pointed into another's at an offset, fp32 and fp16; the values
  read through it and a write through it are checked against the source tensor.
- change_data_ptr bound: dst of 10 into src of 100 works at offset 90 (the largest valid one) and is refused at 91
  with the kernel's own "Offsets overflow" error, fp32 and fp16 (an offset accepted past the end is a failure,
  reported with where the data pointer landed; upstream master's check accepts it: patches/0006).
- edge cases of each compiled function: change_data_ptr at offset 0 and the largest valid offset, an empty and a
  non-contiguous dst, mixed/unsupported dtypes and a negative offset refused; apex_C.flatten/unflatten of empty and
  non-contiguous tensors against torch's (in a --sanitize build all of it runs under ASan/UBSan).
- apex_C.flatten / apex_C.unflatten against torch's own _flatten_dense_tensors / _unflatten_dense_tensors.
- every module of the installed apex package byte-compiles (compiled in memory; nothing written).
- the Python side, imported as far as it goes without the CANN runtime: `import apex` and the modules apexkit knows,
  each reported with where it stops and why (Ascend's apex imports torch_npu, which needs CANN). Nothing fakes
  torch_npu.
Exit status 1 when a check fails (a skip is not a failure). Never imports apexkit.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import os
import sys
import time
import traceback
import warnings
import xml.etree.ElementTree as ET

# appended, not first: the build's smoke test runs this file in the venv it checks, where the wheel's modules win
sys.path.append(os.path.dirname(os.path.abspath(__file__)))
import targetenv

targetenv.no_autoload()  # torch >= 2.5 would import torch_npu (needs CANN)
warnings.simplefilter("ignore")

PYTHON_SIDE = ("apex", "apex.amp", "apex.optimizers", "apex.contrib.combine_tensors")


class Tier:
    def __init__(self) -> None:
        self.results: list[dict] = []

    def add(self, name: str, status: str, detail: str, seconds: float = 0.0) -> None:
        self.results.append(
            {"name": name, "status": status, "detail": detail, "seconds": round(seconds, 3)}
        )
        print(f"  {status.upper():<4} {name}: {detail}", file=sys.stderr)

    def run(self, name: str, fn) -> None:
        started = time.monotonic()
        try:
            status, detail = fn()
        except Exception as exc:  # a check that crashes is a failure with its reason
            status, detail = (
                "fail",
                f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:200]}",
            )
        self.add(name, status, detail, time.monotonic() - started)

    def failed(self) -> bool:
        return any(r["status"] == "fail" for r in self.results)


def _change_data_ptr():
    """(the compiled change_data_ptr(), None), or (None, the check's result): the module does not import (fail), or
    it has no change_data_ptr() (skip: not Ascend's source)."""
    try:
        mod = importlib.import_module("change_data_ptr")
    except ImportError as exc:
        return None, ("fail", f"import change_data_ptr: {exc}")
    fn = getattr(mod, "change_data_ptr", None)
    if fn is None:
        return None, (
            "skip",
            "this change_data_ptr module has no change_data_ptr() (not Ascend's source)",
        )
    return fn, ("ok", "")


def change_data_ptr_round_trip(torch):
    def check():
        fn, result = _change_data_ptr()
        if fn is None:
            return result
        done = []
        for dtype in (torch.float32, torch.float16):
            src = torch.arange(16, dtype=dtype)
            dst = torch.zeros(4, dtype=dtype)
            fn(dst, src, 4)  # offset in elements of src
            if not torch.equal(dst, src[4:8]):
                return "fail", f"{dtype}: dst reads {dst.tolist()}, expected {src[4:8].tolist()}"
            dst.fill_(-1)
            if src[4:8].tolist() != [-1.0] * 4 or src[3].item() != 3 or src[8].item() != 8:
                return "fail", f"{dtype}: a write through dst reached {src.tolist()}"
            done.append(str(dtype).replace("torch.", ""))
        try:
            fn(torch.zeros(4), torch.zeros(4, dtype=torch.float16), 0)
            return "fail", "a dtype mismatch was accepted"
        except RuntimeError:
            pass
        return (
            "ok",
            f"{', '.join(done)}: dst points into src at offset 4, reads and writes match; dtype mismatch refused",
        )

    return check


OVERFLOW = (
    "Offsets overflow in change_data_ptr"  # the kernel's own refusal (Ascend master's message)
)


def change_data_ptr_bound(torch):
    """The bound: dst (10 elements) into src (100) works up to offset 90, the largest valid one (dst then reads
    src[90:100]), and offset 91 is refused with the kernel's own error. Upstream master adds the offset in elements to
    a size in bytes (src/csrc/combine_tensors/change_dataptr.cpp:38), so it accepts 91 and more: the data pointer of
    dst then lies past src's end (reported, never read through)."""

    def check():
        fn, result = _change_data_ptr()
        if fn is None:
            return result
        done = []
        for dtype in (torch.float32, torch.float16):
            name = str(dtype).replace("torch.", "")
            src = torch.arange(100, dtype=dtype)
            size = src.numel() * src.element_size()
            largest = src.numel() - 10
            dst = torch.zeros(10, dtype=dtype)
            fn(dst, src, largest)
            if not torch.equal(dst, src[largest:]):
                return "fail", f"{name}: offset {largest} (the largest valid) reads {dst.tolist()}"
            accepted = []
            # one past the largest valid offset, and the largest one the byte/element mix lets through
            for offset in (largest + 1, size - 10 * src.element_size()):
                probe = torch.zeros(10, dtype=dtype)
                try:
                    fn(probe, src, offset)
                except RuntimeError as exc:
                    if OVERFLOW not in str(exc):
                        return (
                            "fail",
                            f"{name}: offset {offset} refused, but not by the bound: {exc}",
                        )
                    continue
                start = (
                    probe.data_ptr() - src.data_ptr()
                )  # where dst now points; never read through
                accepted.append(
                    f"offset {offset} accepted: dst covers bytes {start}..{start + 10 * src.element_size()}"
                    f" of a {size}-byte src"
                )
            if accepted:
                return "fail", f"{name}: out-of-bounds " + "; ".join(accepted)
            done.append(name)
        return (
            "ok",
            f"{', '.join(done)}: src 100, dst 10: offset 90 (the largest valid) reads src[90:100], "
            f"offset 91 refused ({OVERFLOW})",
        )

    return check


def edge_cases(torch):
    """Each compiled function on its edges (what a sanitizer build runs instrumented): change_data_ptr at offset 0,
    the largest valid offset, an empty dst at the end, a non-contiguous dst (its storage is pointed, strides kept),
    mixed and unsupported dtypes and a negative offset refused; apex_C.flatten/unflatten of empty and
    non-contiguous tensors against torch's own."""

    def check():
        done = []
        fn, result = _change_data_ptr()
        if result[0] == "fail":
            return result
        if fn is not None:
            src = torch.arange(100, dtype=torch.float32)
            dst = torch.zeros(10)
            fn(dst, src, 0)
            if not torch.equal(dst, src[:10]):
                return "fail", f"change_data_ptr offset 0 reads {dst.tolist()}"
            dst = torch.zeros(10)
            fn(dst, src, 90)
            if not torch.equal(dst, src[90:]):
                return "fail", f"change_data_ptr offset 90 (largest valid) reads {dst.tolist()}"
            empty = torch.zeros(0)
            fn(empty, src, 100)  # nothing to point at, nothing past the end
            strided = torch.zeros(20)[::2]  # 10 elements over a 19-element span
            fn(strided, src, 0)
            if not torch.equal(strided, src[0:20:2]):
                return "fail", f"change_data_ptr non-contiguous dst reads {strided.tolist()}"
            refused = []
            for label, args in (
                ("fp32 dst, fp16 src", (torch.zeros(4), torch.zeros(8, dtype=torch.float16), 0)),
                (
                    "int64",
                    (torch.zeros(4, dtype=torch.int64), torch.zeros(8, dtype=torch.int64), 0),
                ),
                ("offset -1", (torch.zeros(4), torch.zeros(8), -1)),
            ):
                try:
                    fn(*args)
                except RuntimeError:
                    refused.append(label)
                    continue
                return "fail", f"change_data_ptr accepted {label}"
            done.append(
                "change_data_ptr: offset 0, 90, empty dst, non-contiguous dst; refused "
                + ", ".join(refused)
            )
        try:
            apex_C = importlib.import_module("apex_C")
        except ImportError as exc:
            return "fail", f"import apex_C: {exc}"
        if hasattr(apex_C, "flatten"):
            from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

            for label, tensors in (
                ("empty", [torch.zeros(0), torch.ones(3), torch.zeros(0, 4)]),
                ("non-contiguous", [torch.arange(12.0).reshape(3, 4).t(), torch.arange(10.0)[::3]]),
            ):
                flat = apex_C.flatten(tensors)
                if not torch.equal(flat, _flatten_dense_tensors(tensors)):
                    return "fail", f"apex_C.flatten of {label} tensors differs from torch's"
                if hasattr(apex_C, "unflatten"):
                    back = apex_C.unflatten(flat, tensors)
                    ref = _unflatten_dense_tensors(flat, tensors)
                    if not all(torch.equal(a, b) and a.shape == b.shape for a, b in zip(back, ref)):
                        return "fail", f"apex_C.unflatten of {label} tensors differs from torch's"
            done.append("apex_C flatten/unflatten: empty and non-contiguous == torch's")
        if not done:
            return "skip", "neither module is Ascend's source"
        return "ok", "; ".join(done)

    return check


def flatten_unflatten(torch):
    def check():
        apex_C = importlib.import_module("apex_C")
        if not hasattr(apex_C, "flatten"):
            return "skip", "this apex_C has no flatten() (not Ascend's source)"
        from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

        tensors = [torch.arange(6.0).reshape(2, 3), torch.ones(4), torch.full((1, 2), 7.0)]
        flat = apex_C.flatten(tensors)
        if not torch.equal(flat, _flatten_dense_tensors(tensors)):
            return "fail", "apex_C.flatten differs from torch._utils._flatten_dense_tensors"
        if not hasattr(apex_C, "unflatten"):
            return "ok", "flatten == torch's (this apex_C has no unflatten)"
        back = apex_C.unflatten(flat, tensors)
        ref = _unflatten_dense_tensors(flat, tensors)
        if len(back) != len(ref) or not all(
            torch.equal(a, b) and a.shape == b.shape for a, b in zip(back, ref)
        ):
            return "fail", "apex_C.unflatten differs from torch._utils._unflatten_dense_tensors"
        return "ok", f"flatten and unflatten of {len(tensors)} tensors == torch's"

    return check


def byte_compile():
    spec = importlib.util.find_spec("apex")
    if spec is None or not spec.submodule_search_locations:
        return "fail", "no apex package installed"
    root = next(iter(spec.submodule_search_locations))
    count, bad = 0, []
    for folder, _dirs, files in os.walk(root):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                with open(path, "rb") as fh:
                    source = fh.read()
                try:
                    compile(source, path, "exec", dont_inherit=True)
                except (SyntaxError, ValueError) as exc:
                    bad.append(f"{os.path.relpath(path, root)}: {exc}")
                count += 1
    if bad:
        return (
            "fail",
            f"{len(bad)} of {count} modules do not compile on Python {sys.version.split()[0]}: {bad[0]}",
        )
    return "ok", f"{count} modules compile on Python {sys.version.split()[0]}"


def import_as_far_as_it_goes(name: str):
    def check():
        try:
            importlib.import_module(name)
            return "ok", f"import {name}"
        except Exception as exc:
            frames = [
                f
                for f in traceback.extract_tb(exc.__traceback__)
                if f"{os.sep}apex{os.sep}" in f.filename
            ]
            where = (
                f"{frames[-1].filename.split(os.sep + 'apex' + os.sep, 1)[-1]}:{frames[-1].lineno}"
                if frames
                else "?"
            )
            reason = f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:160]}"
            if "torch_npu" in str(exc) or "libhccl" in str(exc) or "libascendcl" in str(exc):
                return (
                    "skip",
                    f"stops at apex/{where} ({reason}): needs torch_npu + the CANN runtime",
                )
            return "fail", f"stops at apex/{where}: {reason}"

    return check


def write_junit(path: str, suite: str, results: list[dict]) -> None:
    root = ET.Element(
        "testsuite",
        name=suite,
        tests=str(len(results)),
        failures=str(sum(r["status"] == "fail" for r in results)),
        skipped=str(sum(r["status"] == "skip" for r in results)),
    )
    for r in results:
        case = ET.SubElement(
            root, "testcase", classname=suite, name=r["name"], time=str(r["seconds"])
        )
        if r["status"] == "fail":
            ET.SubElement(case, "failure", message=r["detail"])
        elif r["status"] == "skip":
            ET.SubElement(case, "skipped", message=r["detail"])
    ET.ElementTree(root).write(path, encoding="utf-8", xml_declaration=True)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        description="CPU test tier of an installed Apex for Ascend wheel"
    )
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--junit", help="write JUnit XML here")
    args = parser.parse_args(argv)
    import torch

    tier = Tier()
    tier.run("change_data_ptr round trip (fp32, fp16)", change_data_ptr_round_trip(torch))
    tier.run("change_data_ptr bound (largest valid offset, one past)", change_data_ptr_bound(torch))
    tier.run("apex_C.flatten/unflatten vs torch", flatten_unflatten(torch))
    tier.run(
        "edge cases (empty, offset 0, largest offset, non-contiguous, dtypes)", edge_cases(torch)
    )
    tier.run("every apex module byte-compiles", byte_compile)
    for name in PYTHON_SIDE:
        tier.run(f"import {name}", import_as_far_as_it_goes(name))
    report = {
        "tier": "cpu",
        "torch": torch.__version__,
        "python": sys.version.split()[0],
        "results": tier.results,
        "ok": not tier.failed(),
    }
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(report, fh, indent=1)
    if args.junit:
        write_junit(args.junit, "apex-cpu-tier", tier.results)
    print(json.dumps(report))
    return 1 if tier.failed() else 0


if __name__ == "__main__":
    sys.exit(main())
