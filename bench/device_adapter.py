"""The one place that knows npu / cuda / cpu: device string, synchronize, peak memory, autocast, GradScaler,
and what the installed torch and the device can do (probed by trying, not by version tables).

NPU names follow torch_npu's documentation (torch_npu.npu.* mirrors torch.cuda.*: synchronize,
max_memory_allocated, reset_peak_memory_stats, get_device_name, device_count, current_device;
torch.autocast(device_type="npu") or torch.npu.amp.autocast, and torch_npu.npu.amp.GradScaler).
Runs on Python 3.8+ and torch 2.1+. Standard library + torch only.
"""

from __future__ import annotations

import contextlib
import os
import platform
import resource
import time
import warnings

import targetenv

# torch >= 2.5 imports every installed device backend at `import torch`; torch_npu then needs CANN's libraries
# (libhccl.so) even for a CPU run on a build host. torch_npu is imported explicitly below when the device needs it.
targetenv.no_autoload()

import torch  # noqa: E402

KINDS = ("npu", "cuda", "cpu")
AUTOCAST_DTYPES = (torch.float16, torch.bfloat16)


def torch_version() -> str:
    """torch's release without the local build tag: 2.1.0+cu121 -> 2.1.0."""
    return torch.__version__.split("+")[0]


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{exc.__class__.__name__}: {text[0]}" if text else exc.__class__.__name__


def import_torch_npu():
    """torch_npu, or the ImportError text (it needs CANN's set_env.sh sourced)."""
    try:
        import torch_npu

        return torch_npu, ""
    except Exception as exc:  # ImportError, OSError (libascendcl.so), RuntimeError from CANN init
        return None, f"{exc.__class__.__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"


def detect(requested: str = "auto") -> str:
    """auto: npu > cuda > cpu (`pick`)."""
    return pick()[0] if requested == "auto" else requested


def pick() -> tuple[str, str]:
    """(the device this torch finds, why in a few words): npu where torch_npu imports and a CANN runtime answers
    (torch.npu.is_available()), cuda where a CUDA torch sees a GPU (torch.cuda.is_available()), else cpu."""
    npu, why = import_torch_npu()
    if npu is not None and torch.npu.is_available():
        return (
            "npu",
            f"torch_npu {npu.__version__} imports and a CANN runtime answers (torch.npu.is_available())",
        )
    if npu is not None:
        no_npu = "torch_npu imports but no NPU answers (torch.npu.is_available() is False)"
    elif why.startswith("ModuleNotFoundError: No module named 'torch_npu'"):
        no_npu = "torch_npu is not installed"
    else:
        no_npu = f"torch_npu does not import ({why})"
    if torch.cuda.is_available():
        return (
            "cuda",
            f"torch {torch.__version__} sees {torch.cuda.device_count()} CUDA GPU(s); {no_npu}",
        )
    return "cpu", f"{no_npu} and torch sees no CUDA GPU"


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
                raise RuntimeError(
                    f"torch_npu not importable ({why}); source the CANN set_env.sh and install torch_npu"
                )
            self.backend = torch.npu
        elif kind == "cuda":
            self.backend = torch.cuda
        else:
            self.backend = None
        if self.backend is not None and index is None:
            index = int(os.environ.get("LOCAL_RANK", self.backend.current_device()))
        self.index = index
        self._autocast_probes: dict = {}
        self._scaler_probe: dict | None = None

    # --- identity ----------------------------------------------------------------------------------------------
    @property
    def torch_device(self) -> torch.device:
        return (
            torch.device("cpu") if self.kind == "cpu" else torch.device(f"{self.kind}:{self.index}")
        )

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

    def peak_memory_reserved_bytes(self) -> int | None:
        """Peak memory the caching allocator held (None on CPU: there is no caching allocator to ask)."""
        reserved = getattr(self.backend, "max_memory_reserved", None)
        return None if reserved is None else int(reserved(self.index))

    @property
    def memory_kind(self) -> str:
        return "peak RSS (process)" if self.backend is None else f"{self.kind} max_memory_allocated"

    # --- mixed precision ----------------------------------------------------------------------------------------
    def _autocast_candidates(self, dtype: torch.dtype) -> list:
        """(name, context factory) in the order tried: the generic API, then the device's own (older torch)."""
        kind = self.kind
        found = [
            (f"torch.autocast({kind!r})", lambda: torch.autocast(device_type=kind, dtype=dtype))
        ]
        own = getattr(
            getattr(self.backend, "amp", None), "autocast", None
        )  # torch.cuda.amp / torch.npu.amp
        if own is not None:
            found.append((f"torch.{kind}.amp.autocast", lambda: own(dtype=dtype)))
        return found

    def autocast_support(self, dtype: torch.dtype) -> dict:
        """{"ok", "via", "reason"}: whether a Linear forward + backward under autocast(dtype) runs in dtype here."""
        if dtype in self._autocast_probes:
            return self._autocast_probes[dtype]
        errors = []
        result = None
        for via, factory in self._autocast_candidates(dtype):
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                try:
                    layer = torch.nn.Linear(8, 8).to(self.torch_device)
                    with factory():
                        out = layer(torch.ones(2, 8, device=self.torch_device))
                    out.float().sum().backward()
                except Exception as exc:
                    errors.append(first_line(exc))
                    continue
            if out.dtype == dtype:
                result = {"ok": True, "via": via, "reason": ""}
                break
            said = [str(w.message).splitlines()[0] for w in caught]
            errors.append(
                said[0]
                if said
                else f"a Linear ran in {_dtype_name(out.dtype)}, not {_dtype_name(dtype)}"
            )
        if result is None:
            result = {
                "ok": False,
                "via": None,
                "reason": errors[0] if errors else "no autocast API for this device",
            }
        self._autocast_probes[dtype] = result
        return result

    def autocast(self, dtype: torch.dtype | None):
        if dtype is None:
            return contextlib.nullcontext()
        support = self.autocast_support(dtype)
        if not support["ok"]:
            raise RuntimeError(self.unsupported_autocast(dtype))
        return dict(self._autocast_candidates(dtype))[support["via"]]()

    def unsupported_autocast(self, dtype: torch.dtype) -> str:
        """One line: e.g. 'torch 2.1.0 CPU autocast supports bfloat16 only (RuntimeError: ...)'."""
        others = [
            _dtype_name(d) for d in AUTOCAST_DTYPES if d != dtype and self.autocast_support(d)["ok"]
        ]
        what = (
            f"supports {', '.join(others)} only" if others else f"does not run {_dtype_name(dtype)}"
        )
        return f"torch {torch_version()} {self.kind.upper()} autocast {what} ({self.autocast_support(dtype)['reason']})"

    def _scaler_candidates(self) -> list:
        kind = self.kind
        found = []
        if hasattr(torch, "amp") and hasattr(torch.amp, "GradScaler"):  # torch >= 2.3
            found.append((f"torch.amp.GradScaler({kind!r})", lambda: torch.amp.GradScaler(kind)))
        if kind == "npu":
            found.append(
                (
                    "torch_npu.npu.amp.GradScaler",
                    lambda: __import__("torch_npu").npu.amp.GradScaler(),
                )
            )
        elif kind == "cuda":
            found.append(("torch.cuda.amp.GradScaler", lambda: torch.cuda.amp.GradScaler()))
        return found

    def grad_scaler_support(self) -> dict:
        """{"ok", "via", "reason"}: whether a GradScaler for this device scales, unscales and steps here."""
        if self._scaler_probe is not None:
            return self._scaler_probe
        errors = []
        result = None
        for via, factory in self._scaler_candidates():
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                try:
                    scaler = factory()
                    if not scaler.is_enabled():
                        said = [str(w.message).splitlines()[0] for w in caught]
                        errors.append(said[0] if said else f"{via} disabled itself")
                        continue
                    param = torch.nn.Parameter(torch.ones(4, device=self.torch_device))
                    optimizer = torch.optim.SGD([param], lr=0.1)
                    scaler.scale(param.sum()).backward()
                    scaler.step(optimizer)
                    scaler.update()
                except Exception as exc:
                    errors.append(f"{via}: {first_line(exc)}")
                    continue
            result = {"ok": True, "via": via, "reason": ""}
            break
        if result is None:
            why = errors[0] if errors else "torch.amp.GradScaler(device) is torch 2.3+"
            result = {
                "ok": False,
                "via": None,
                "reason": f"torch {torch_version()} has no GradScaler for {self.kind.upper()} ({why})",
            }
        self._scaler_probe = result
        return result

    def grad_scaler(self, enabled: bool):
        if not enabled:
            return None
        support = self.grad_scaler_support()
        if not support["ok"]:
            raise RuntimeError(support["reason"])
        return dict(self._scaler_candidates())[support["via"]]()

    # --- distributed --------------------------------------------------------------------------------------------
    @property
    def distributed_backend(self) -> str:
        return {"cpu": "gloo", "cuda": "nccl", "npu": "hccl"}[self.kind]

    def distributed_support(self) -> dict:
        """{"ok", "backend", "reason"}: whether torch.distributed has this device's backend."""
        backend = self.distributed_backend
        dist = getattr(torch, "distributed", None)
        if dist is None or not dist.is_available():
            return {
                "ok": False,
                "backend": backend,
                "reason": f"torch {torch_version()} was built without torch.distributed",
            }
        available = {
            "gloo": getattr(dist, "is_gloo_available", lambda: False),
            "nccl": getattr(dist, "is_nccl_available", lambda: False),
        }.get(backend)
        if available is not None and not available():
            return {
                "ok": False,
                "backend": backend,
                "reason": f"torch {torch_version()} was built without the {backend} backend",
            }
        return {"ok": True, "backend": backend, "reason": ""}

    def capabilities(self) -> dict:
        """What this torch on this device can do, for the reports (every entry probed by trying)."""
        caps = {
            "torch": torch.__version__,
            "autocast": {_dtype_name(d): self.autocast_support(d) for d in AUTOCAST_DTYPES},
            "grad_scaler": self.grad_scaler_support(),
            "distributed": self.distributed_support(),
            "scaled_dot_product_attention": hasattr(
                torch.nn.functional, "scaled_dot_product_attention"
            ),
        }
        return caps

    def describe(self) -> dict:
        return {
            "kind": self.kind,
            "index": self.index,
            "name": self.name(),
            "count": self.count(),
            "memory": self.memory_kind,
        }
