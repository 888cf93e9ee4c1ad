"""A target's identity, one codec for all of apexkit: the `Target` value (python, torch, torch_npu, arch, ref,
backend, CUDA release; versions parsed once) is the only writer of target ids (dist/<target-id>/, index.json, --target
of validate/bench/fleet/publish), matrix cell ids, wheel version labels and Requires-Dist pins, and the only reader of
them (`Target.from_id`, `read_version`), for both backends. Readers accept every label written so far. Pure."""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field

from packaging.version import InvalidVersion, Version

from apexkit import untrusted, vocab
from apexkit.errors import ConfigError

BASE_VERSION = (
    "0.1+ascend"  # what the pep440-version patch makes of upstream's 0.1-ascend / 0.1+ascend
)
NVIDIA_BASE_VERSION = "0.1"  # upstream NVIDIA apex's setup.py version, every ref since 2018
SANITIZED = "asan"  # target id +asan, wheel version ...+ascend.torchX.asan: a diagnosis build, never published


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
    except ValueError:  # InvalidVersion, or a number past int's digit limit (untrusted index.json)
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


def _short(part: str, limit: int = 40) -> str:
    """A target id part as it is, or its sha256 prefix when longer than `limit` (a path component has 255 bytes)."""
    return part if len(part) <= limit else hashlib.sha256(part.encode()).hexdigest()[:12]


def _arches(cuda_arch: str | None) -> list[str]:
    return [a for a in re.split(r"[;\s]+", cuda_arch or "") if a]


def _identity_parts(t: Target) -> list[str]:
    """The `+part`s of a target id for the non-default inputs of a build (see `Target.id`)."""
    parts, identity = [], t.identity
    if t.backend == "cuda":  # +cuda.sm80.sm90: NVIDIA apex, and the GPUs it runs on
        arches = ".".join(
            _id_text("sm" + a.replace(".", "")) for a in _arches(identity.get("cuda_arch"))
        )
        parts.append("cuda." + _short(arches))
        if identity.get("cuda_ext"):
            parts.append("ext-" + _short(".".join(_id_text(e) for e in identity["cuda_ext"])))
    if t.torch_npu:
        parts.append(f"npu{_id_text(str(t.torch_npu))}")
    if identity.get("skip_patches"):
        parts.append("skip-" + ".".join(_id_text(p) for p in identity["skip_patches"]))
    if identity.get("sanitize"):
        parts.append(SANITIZED)
    if identity.get("nvidia_commit"):
        parts.append(f"nvidia-{_id_text(identity['nvidia_commit'][:12])}")
    if identity.get("setup_flags") is not None:
        flags = ".".join(_id_text(f.lstrip("-")) for f in identity["setup_flags"]) or "none"
        if len(flags) > 40:
            flags = hashlib.sha256(" ".join(identity["setup_flags"]).encode()).hexdigest()[:12]
        parts.append("flags-" + flags)
    if identity.get("system_torch"):
        parts.append("system-torch")
    return parts


def cuda_tag(torch_cuda: str) -> str:
    """torch.version.cuda as PyTorch's index tags it: "13.0" → "cu130", "12.8" → "cu128"."""
    m = re.fullmatch(r"(\d{1,3})\.(\d{1,2})(?:\.\d+)?", torch_cuda)
    if m is None:
        raise ConfigError(
            f"torch.version.cuda {torch_cuda[:20]!r} is not a CUDA release such as 13.0",
            "check the build venv's torch (a CUDA build reports e.g. 13.0)",
        )
    return f"cu{m[1]}{m[2]}"


def _version(value: str | Version, what: str) -> Version:
    if isinstance(value, Version):
        return value
    try:
        return Version(value)
    except ValueError:  # InvalidVersion, or a number past int's digit limit
        raise ConfigError(
            f"cannot name the wheel after {what} {value!r}: not a PEP 440 version",
            "use a torch (and torch_npu) with a PEP 440 version",
        ) from None


@dataclass(frozen=True)
class Target:
    """One build tuple. `identity` holds the non-default inputs of a build (buildplan.identity), which the target id
    names; `cuda` is torch.version.cuda of a CUDA build's torch (None until it is known)."""

    python: str
    torch: Version
    arch: str
    ref: str = "master"
    torch_npu: Version | None = None
    backend: str = "ascend"
    cuda: str | None = None
    identity: dict = field(default_factory=dict, compare=False)

    @classmethod
    def of(
        cls, python: str, torch: str | Version, arch: str, ref: str = "master", **more
    ) -> Target:
        """The value from the strings a matrix, an options file or a plan holds: torch and torch_npu parsed here,
        once (a ConfigError names one that is not a version)."""
        npu = more.pop("torch_npu", None)
        return cls(
            python,
            _version(torch, "torch"),
            arch,
            ref,
            torch_npu=_version(npu, "torch_npu") if npu else None,
            **more,
        )

    @property
    def id(self) -> str:
        """dist/<target-id>: py3.11-torch2.13.0-x86_64-master, and for non-default inputs one `+part` each, e.g.
        ...-master+npu2.13.0+skip-cxx11-abi+nvidia-4ef930c1abcd+flags-cpp_ext+system-torch, so a diagnosis build
        never replaces the good wheel. What a part cannot tell apart (two --apex-src checkouts, two flag sets that
        read alike) the manifest's identity does: `check_overwrite` refuses to replace a target built from other
        inputs."""
        base = f"py{self.python}-torch{self.torch.public}-{self.arch}-{_id_text(self.ref)}"
        return "+".join([base, *_identity_parts(self)])

    def cell_id(self, default_ref: str, default_cuda_arch: str | None) -> str:
        """The matrix's short name of this combination: py3.11-torch2.13.0-x86_64[-cuda[-sm90]][-REF]."""
        suffix = (
            ""
            if self.ref == default_ref
            else "-" + "".join(c if c.isalnum() or c in "._" else "_" for c in self.ref)
        )
        cuda = ""
        arch_list = self.identity.get("cuda_arch")
        if self.backend == "cuda":  # -cuda, and the arches when not [cuda] default_arch_list's
            cuda = "-cuda"
            if arch_list != default_cuda_arch:
                cuda += "".join(
                    f"-sm{a.replace('.', '').replace('+', '')}" for a in _arches(arch_list)
                )
        return f"py{self.python}-torch{self.torch}-{self.arch}{cuda}{suffix}"

    @property
    def label(self) -> str:
        """The wheel version's local part after the base, as the version patches read it (APEXKIT_VERSION_LABEL):
        Ascend `.torch2.13.0`, `.torch2.7.1.npu2.7.1.post8` (`.asan` for a sanitizer build), CUDA `+cu130.torch2.14.1`.

        PEP 440 local labels are dot-separated alphanumerics, so normalised public versions fit as they are; a torch's
        own local label (+cpu, +cu121) is left out: it names the build of torch, not its ABI, and pip's `==2.13.0`
        matches every one of them. The CUDA release comes first in a CUDA label because it decides which machines
        can load the wheel (libcudart.so.13)."""
        if self.backend == "cuda":
            if not self.cuda:
                raise ConfigError(
                    f"torch {self.torch} is a build without CUDA: a CUDA build of apex needs a CUDA torch",
                    "pass --torch-index-url with a CUDA build of torch, or drop --backend cuda",
                )
            label = f"+{cuda_tag(self.cuda)}.torch{self.torch.public}"
        else:
            label = f".torch{self.torch.public}" + (
                f".npu{self.torch_npu.public}" if self.torch_npu else ""
            )
        return label + (f".{SANITIZED}" if self.identity.get("sanitize") else "")

    @property
    def version(self) -> str:
        """The wheel's whole version: 0.1+ascend.torch2.13.0, 0.1+cu130.torch2.14.1."""
        full = (NVIDIA_BASE_VERSION if self.backend == "cuda" else BASE_VERSION) + self.label
        if (
            str(Version(full)) != full
        ):  # cannot happen for parsed versions; the guard keeps the scheme honest
            raise ConfigError(f"version {full} is not a normalised PEP 440 version", "report this")
        return full

    def requires(self, links_torch_npu: bool) -> list[str]:
        """Requires-Dist pins, as strict as the ABI needs: the extensions link libtorch/libc10, whose C++ symbols
        change with every torch release, so torch is pinned to the exact release (`==2.13.0` accepts 2.13.0+cpu).
        torch_npu's post releases are rebuilds of one torch_npu for newer CANN: pinned to its release series
        (`==2.7.1.*`) unless the extensions link libtorch_npu itself (refs built with --npu_float_status)."""
        reqs = [f"torch=={self.torch.public}"]
        if self.torch_npu:
            series = ".".join(str(n) for n in self.torch_npu.release)
            reqs.append(
                f"torch_npu=={self.torch_npu.public}"
                if links_torch_npu
                else f"torch_npu=={series}.*"
            )
        return reqs

    def facts(self) -> dict[str, str | None]:
        """python, torch, torch_npu and arch as strings, as index.json and the reports spell them."""
        npu = str(self.torch_npu) if self.torch_npu else None
        return {
            "python": self.python,
            "torch": str(self.torch),
            "torch_npu": npu,
            "arch": self.arch,
        }

    @classmethod
    def from_id(cls, target: str) -> Target:
        """python, torch, arch and torch_npu read off a target id (py3.11-torch2.13.0-x86_64-master+npu2.13.0); the
        ref is the id's ref part as written."""
        found = _TARGET.match(target)
        npu = next((part[3:] for part in target.split("+")[1:] if part.startswith("npu")), None)
        try:
            if found:
                return cls.of(
                    found["python"], found["torch"], found["arch"], found["ref"], torch_npu=npu
                )
        except ConfigError:
            pass  # a torch or torch_npu part that is no version: not an id apexkit wrote
        raise ConfigError(
            f"target {untrusted.shown(target)} is not an apexkit target id (py3.X-torchV-ARCH-REF[+...])",
            f"copy one from the index's index.json ({vocab.command('publish')} prints them)",
        )


_TARGET = re.compile(r"^py(?P<python>3\.\d+)-torch(?P<torch>[^-]+)-(?P<arch>[^-]+)-(?P<ref>[^+]*)")


@dataclass(frozen=True)
class Label:
    """What an apexkit wheel's version says of its build (`read_version`)."""

    backend: str
    torch: str | None
    torch_npu: str | None = None
    cuda: str | None = None  # major.minor


_V = r"\d[0-9a-z]*(?:\.(?:\d[0-9a-z]*|post\d+|dev\d+))*"  # a public version as a label holds it
_MORE = r"(?:\.[a-z][0-9a-z.]*)?"  # .asan, and what a later apexkit may add
_ASCEND_LABEL = re.compile(rf"ascend(?:\.torch(?P<torch>{_V}))?(?:\.npu(?P<npu>{_V}))?{_MORE}")
_CUDA_LABEL = re.compile(rf"cu(?P<cuda>\d{{2,4}})\.torch(?P<torch>{_V}){_MORE}")


def read_version(version: str | Version) -> Label | None:
    """The reverse of `Target.version`: backend, torch, torch_npu and CUDA release off a wheel version, for every
    label written so far (0.1+ascend, 0.1+ascend.torch2.13.0, ...npu2.7.1.post8, ....asan, 0.1+cu130.torch2.14.1);
    None for a version no apexkit build wrote."""
    try:
        local = (Version(str(version)).local or "").lower()
    except ValueError:  # InvalidVersion, or a number past int's digit limit
        return None
    found = _ASCEND_LABEL.fullmatch(local)
    if found:
        return Label("ascend", found["torch"], found["npu"])
    found = _CUDA_LABEL.fullmatch(local)
    if found:
        digits = found["cuda"]
        return Label("cuda", found["torch"] or None, cuda=f"{digits[:-1]}.{digits[-1]}")
    return None
