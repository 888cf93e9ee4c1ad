"""A target's identity, one scheme for all of apexkit: the versions it may name (`check_version`), the target id
(dist/<target-id>/, index.json, --target of validate/bench/fleet/publish), parsed back by `target_facts`; the version
label and the Requires-Dist pins the wheel carries. Pure."""

from __future__ import annotations

import hashlib
import re

from packaging.version import InvalidVersion, Version

from apexkit import vocab
from apexkit.errors import ConfigError


def check_version(value: object, what: str, hint: str) -> str:
    """`value` as a torch or torch_npu version, checked before it becomes part of a target id, a path (build/<target>,
    dist/<target>), a session name or a pin: a PEP 440 version (packaging) in its normalised spelling, so that one
    release has one target directory and publish accepts what the build wrote, and without an epoch (no torch release
    has one, and `!` does not belong in a path). Pre-, post- and dev-releases and a local label (+cpu) pass.
    Returns `value`; anything else is one ConfigError whose cause starts with `what`."""
    try:
        if (
            not isinstance(value, str) or value != value.strip()
        ):  # packaging strips what a path would keep
            raise InvalidVersion(repr(value))
        version = Version(value)
    except InvalidVersion:
        raise ConfigError(f"{what} {value!r} is not a version (PEP 440)", hint) from None
    if version.epoch:
        raise ConfigError(
            f"{what} {value!r} has an epoch ({version.epoch}!), which no torch release has", hint
        )
    if (
        str(version) != value
    ):  # v2.13, 2.13.0.RC1, 2.1-post1: valid, but not the spelling a directory gets
        raise ConfigError(
            f"{what} {value!r} is not a normalised version (PEP 440: {version})", hint
        )
    return value


def _id_text(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("._-") or "_"


def target_id(python: str, torch: str, arch: str, ref: str, identity: dict | None = None) -> str:
    """dist/<target-id>: py3.11-torch2.13.0-x86_64-master, and for non-default inputs one `+part` each, e.g.
    ...-master+npu2.13.0+skip-cxx11-abi+nvidia-4ef930c1abcd+flags-cpp_ext+system-torch, so a diagnosis build never
    replaces the good wheel. What a part cannot tell apart (two --apex-src checkouts, two flag sets that read alike)
    the manifest's identity does: `check_overwrite` refuses to replace a target built from other inputs."""
    base = f"py{python}-torch{torch.split('+')[0]}-{arch}-{_id_text(ref)}"
    identity = identity or {}
    parts = []
    if identity.get("backend") == "cuda":  # +cuda.sm80.sm90: NVIDIA apex, and the GPUs it runs on
        arches = [a for a in re.split(r"[;\s]+", str(identity.get("cuda_arch") or "")) if a]
        parts.append(
            "cuda." + _short(".".join(_id_text("sm" + a.replace(".", "")) for a in arches))
        )
        if identity.get("cuda_ext"):
            parts.append("ext-" + _short(".".join(_id_text(e) for e in identity["cuda_ext"])))
    if identity.get("torch_npu"):
        parts.append(f"npu{_id_text(identity['torch_npu'])}")
    if identity.get("skip_patches"):
        parts.append("skip-" + ".".join(_id_text(p) for p in identity["skip_patches"]))
    if identity.get("sanitize"):
        parts.append("asan")  # a sanitizer diagnosis build (--sanitize): never published
    if identity.get("nvidia_commit"):
        parts.append(f"nvidia-{_id_text(identity['nvidia_commit'][:12])}")
    if identity.get("setup_flags") is not None:
        flags = ".".join(_id_text(f.lstrip("-")) for f in identity["setup_flags"]) or "none"
        parts.append(
            "flags-"
            + (
                flags
                if len(flags) <= 40
                else hashlib.sha256(" ".join(identity["setup_flags"]).encode()).hexdigest()[:12]
            )
        )
    if identity.get("system_torch"):
        parts.append("system-torch")
    return "+".join([base, *parts])


def _short(part: str, limit: int = 40) -> str:
    """A target id part as it is, or its sha256 prefix when longer than `limit` (a path component has 255 bytes)."""
    return part if len(part) <= limit else hashlib.sha256(part.encode()).hexdigest()[:12]


BASE_VERSION = (
    "0.1+ascend"  # what the pep440-version patch makes of upstream's 0.1-ascend / 0.1+ascend
)


def version_label(torch: str, torch_npu: str | None = None) -> str:
    """The build tuple appended to the wheel's local version label: `.torch2.13.0`, `.torch2.7.1.npu2.7.1.post8`.

    PEP 440 local labels are dot-separated alphanumerics, so normalised public versions fit as they are; a torch's
    own local label (+cpu, +cu121) is left out: it names the build of torch, not its ABI, and pip's `==2.13.0`
    matches every one of them."""
    label = f".torch{Version(torch).public}"
    if torch_npu:
        label += f".npu{Version(torch_npu).public}"
    full = BASE_VERSION + label
    if (
        str(Version(full)) != full
    ):  # cannot happen for parsed versions; the guard keeps the scheme honest
        raise ConfigError(f"version {full} is not a normalised PEP 440 version", "report this")
    return label


NVIDIA_BASE_VERSION = "0.1"  # upstream NVIDIA apex's setup.py version, every ref since 2018


def cuda_tag(torch_cuda: str) -> str:
    """torch.version.cuda as PyTorch's index tags it: "13.0" → "cu130", "12.8" → "cu128"."""
    m = re.fullmatch(r"(\d{1,3})\.(\d{1,2})(?:\.\d+)?", torch_cuda)
    if m is None:
        raise ConfigError(
            f"torch.version.cuda {torch_cuda[:20]!r} is not a CUDA release such as 13.0",
            "check the build venv's torch (a CUDA build reports e.g. 13.0)",
        )
    return f"cu{m[1]}{m[2]}"


def cuda_version(torch: str, torch_cuda: str) -> str:
    """The version of an NVIDIA apex wheel built for CUDA: `0.1+cu130.torch2.14.1`. The CUDA release comes first
    because it decides which machines can load the wheel (libcudart.so.13), the torch release because the ABI of
    libtorch changes with each one; pip's `torch==2.14.1` pin (runtime_requires) then accepts 2.14.1+cu130."""
    full = f"{NVIDIA_BASE_VERSION}+{cuda_tag(torch_cuda)}.torch{Version(torch).public}"
    if str(Version(full)) != full:
        raise ConfigError(f"version {full} is not a normalised PEP 440 version", "report this")
    return full


def runtime_requires(torch: str, torch_npu: str | None, links_torch_npu: bool) -> list[str]:
    """Requires-Dist pins, as strict as the ABI needs: the extensions link libtorch/libc10, whose C++ symbols change
    with every torch release, so torch is pinned to the exact release (`==2.13.0` accepts 2.13.0+cpu). torch_npu's
    post releases are rebuilds of one torch_npu for newer CANN: pinned to its release series (`==2.7.1.*`) unless
    the extensions link libtorch_npu itself (refs built with --npu_float_status), then exactly."""
    reqs = [f"torch=={Version(torch).public}"]
    if torch_npu:
        v = Version(torch_npu)
        series = ".".join(str(n) for n in v.release)
        reqs.append(f"torch_npu=={v.public}" if links_torch_npu else f"torch_npu=={series}.*")
    return reqs


_TARGET = re.compile(r"^py(?P<python>3\.\d+)-torch(?P<torch>[^-]+)-(?P<arch>[^-]+)-")


def target_facts(target: str) -> dict[str, str | None]:
    """python, torch, arch and torch_npu read off a target id (py3.11-torch2.13.0-x86_64-master+npu2.13.0)."""
    found = _TARGET.match(target)
    if not found:
        raise ConfigError(
            f"target {target!r} is not an apexkit target id (py3.X-torchV-ARCH-REF[+...])",
            f"copy one from the index's index.json ({vocab.command('publish')} prints them)",
        )
    npu = next((part[3:] for part in target.split("+")[1:] if part.startswith("npu")), None)
    return {
        "python": found["python"],
        "torch": found["torch"],
        "arch": found["arch"],
        "torch_npu": npu,
    }
