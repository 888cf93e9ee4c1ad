"""The one place that knows npu / cuda / cpu: device string, synchronize, peak memory, autocast, GradScaler.

NPU names follow torch_npu's documentation (torch_npu.npu.* mirrors torch.cuda.*: synchronize,
max_memory_allocated, reset_peak_memory_stats, get_device_name, device_count, current_device;
torch.autocast(device_type="npu") and torch_npu.npu.amp.GradScaler). Standard library + torch only.
"""

from __future__ import annotations

import contextlib
import os
import platform
import resource
import time

import torch

KINDS = ("npu", "cuda", "cpu")


def import_torch_npu():
    """torch_npu, or the ImportError text (it needs CANN's set_env.sh sourced)."""
    try:
        import torch_npu

        return torch_npu, ""
    except Exception as exc:  # ImportError, OSError (libascendcl.so), RuntimeError from CANN init
        return None, f"{exc.__class__.__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"


def detect(requested: str = "auto") -> str:
    """auto: npu > cuda > cpu."""
    if requested != "auto":
        return requested
    npu, _ = import_torch_npu()
    if npu is not None and torch.npu.is_available():
        return "npu"
    if torch.cuda.is_available():
        return "cuda"
    return "cpu"


def _proc_field(path: str, prefix: str) -> str | None:
    with contextlib.suppress(OSError), open(path) as handle:
        for line in handle:
            if line.startswith(prefix):
                return line.split(":", 1)[1].strip()
    return None


def cpu_name() -> str:
    return _proc_field("/proc/cpuinfo", "model name") or platform.processor() or platform.machine()


class Device:
    def __init__(self, kind: str, index: int | None = None, backend=None) -> None:
        if kind not in KINDS:
            raise ValueError(f"unknown device {kind!r}; choose one of {', '.join(KINDS)}")
        self.kind = kind
        if backend is not None:
            self.backend = backend  # a test can pass its own recorder
        elif kind == "npu":
            npu, why = import_torch_npu()
            if npu is None:
                raise RuntimeError(f"torch_npu not importable ({why}); source the CANN set_env.sh and install torch_npu")
            self.backend = torch.npu
        elif kind == "cuda":
            self.backend = torch.cuda
        else:
            self.backend = None
        if self.backend is not None and index is None:
            index = int(os.environ.get("LOCAL_RANK", self.backend.current_device()))
        self.index = index

    # --- identity ----------------------------------------------------------------------------------------------
    @property
    def torch_device(self) -> torch.device:
        return torch.device("cpu") if self.kind == "cpu" else torch.device(f"{self.kind}:{self.index}")

    def set_current(self) -> None:
        if self.backend is not None:
            self.backend.set_device(self.index)

    def name(self) -> str:
        return cpu_name() if self.backend is None else self.backend.get_device_name(self.index)

    def count(self) -> int:
        return (os.cpu_count() or 1) if self.backend is None else self.backend.device_count()

    # --- timing and memory -------------------------------------------------------------------------------------
    def synchronize(self) -> None:
        """Wait for queued device work; CPU kernels are synchronous, so there is nothing to wait for."""
        if self.backend is not None:
            self.backend.synchronize(self.index)

    def now(self) -> float:
        """A timestamp taken after everything queued so far has finished."""
        self.synchronize()
        return time.perf_counter()

    def reset_peak_memory(self) -> None:
        if self.backend is not None:
            self.backend.reset_peak_memory_stats(self.index)
            return
        # Linux: writing 5 to clear_refs resets the peak RSS (VmHWM) of this process
        with contextlib.suppress(OSError), open("/proc/self/clear_refs", "w") as handle:
            handle.write("5")

    def peak_memory_bytes(self) -> int:
        if self.backend is not None:
            return int(self.backend.max_memory_allocated(self.index))
        peak = _proc_field("/proc/self/status", "VmHWM")  # "123456 kB"
        if peak:
            return int(peak.split()[0]) * 1024
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

    @property
    def memory_kind(self) -> str:
        return "peak RSS (process)" if self.backend is None else f"{self.kind} max_memory_allocated"

    # --- mixed precision ----------------------------------------------------------------------------------------
    def autocast(self, dtype: torch.dtype | None):
        if dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.kind, dtype=dtype)

    def grad_scaler(self, enabled: bool):
        if not enabled:
            return None
        if hasattr(torch, "amp") and hasattr(torch.amp, "GradScaler"):
            with contextlib.suppress(Exception):
                return torch.amp.GradScaler(self.kind)
        if self.kind == "npu":
            import torch_npu

            return torch_npu.npu.amp.GradScaler()
        return torch.cuda.amp.GradScaler(enabled=self.kind == "cuda")

    def describe(self) -> dict:
        return {"kind": self.kind, "index": self.index, "name": self.name(), "count": self.count(),
                "memory": self.memory_kind}
