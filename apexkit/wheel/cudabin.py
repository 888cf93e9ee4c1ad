"""The GPU code a CUDA extension carries: the SASS (cubin) and PTX architectures in its `.nv_fatbin` section, and
the arch list (TORCH_CUDA_ARCH_LIST) it was asked to carry.

A CUDA wheel built for `8.0;9.0` that embeds only sm_80 loads everywhere and then fails on an H100 with "no kernel
image is available for execution on the device"; nothing in the wheel's name or metadata shows it. So the binary
checks read what is embedded and compare it with what was asked.

Hand-rolled, with the reason: no maintained Python library reads fatbins, and `cuobjdump` is neither in the toolkit
installed here (nvcc, ptxas, fatbinary, nvlink only) nor in torch's CUDA wheels (it is a separate wheel,
nvidia-cuda-cuobjdump). The container layout, as nvcc 13.0 writes it (seen here for sm_80, sm_90 and compute_90):
the section holds one or more blobs, each a 16-byte header (magic 0xBA55ED50, u16 version, u16 header size, u64
size of the entries that follow), then entries, each with its own header: u16 kind (1 PTX, 2 ELF/SASS), u16, u32
header size, u64 payload size, ... and at offset 28 a u32 architecture (90 for sm_90). Only those fields are read.
The section is untrusted input (a wheel may come from anywhere): sizes are capped and every offset is bounded.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

from elftools.common.exceptions import ELFError
from elftools.elf.elffile import ELFFile

from apexkit.plan.cudaarch import Arch, parse_arch_list

__all__ = [
    "Arch",
    "Embedded",
    "FatbinError",
    "embedded",
    "parse_arch_list",
    "parse_fatbin",
    "problems",
    "wanted",
]

FATBIN_MAGIC = 0xBA55ED50
SECTION = ".nv_fatbin"
MAX_SECTION = 1 << 30  # 1 GiB: amp_C for seven architectures is tens of MB
MAX_ENTRIES = 4096  # a blob per architecture per source file; far more is a crafted file
KIND_PTX, KIND_SASS = 1, 2
_BLOB = struct.Struct("<IHHQ")  # magic, version, header size, entries size
_ENTRY = struct.Struct("<HHIQ")  # kind, (flags), header size, payload size
_ARCH_AT = 28  # the entry header's u32 architecture
_BLOB_ALIGN = 8


class FatbinError(ValueError):
    """The section is not a fatbin this reader understands: a damaged or crafted file."""


@dataclass(frozen=True)
class Embedded:
    """Architectures as numbers: 80 for sm_80 / compute_80, 90 for sm_90 and sm_90a."""

    sass: frozenset[int]
    ptx: frozenset[int]

    def describe(self) -> str:
        parts = [f"sm_{n}" for n in sorted(self.sass)] + [
            f"compute_{n} (PTX)" for n in sorted(self.ptx)
        ]
        return ", ".join(parts) or "no GPU code"


def parse_fatbin(data: bytes) -> Embedded:
    """The architectures of every entry in a `.nv_fatbin` section's bytes."""
    found: dict[int, set[int]] = {
        KIND_SASS: set(),
        KIND_PTX: set(),
    }  # entry kind -> its architectures
    pos, count = 0, 0
    while pos + _BLOB.size <= len(data):
        magic, _version, header, size = _BLOB.unpack_from(data, pos)
        if magic != FATBIN_MAGIC:
            if any(
                data[pos : pos + _BLOB_ALIGN]
            ):  # blobs are padded with zeros to 8 bytes; anything else is not ours
                raise FatbinError(f"no fatbin header at byte {pos}")
            pos += _BLOB_ALIGN
            continue
        end = pos + header + size
        if header < _BLOB.size or end > len(data):
            raise FatbinError(
                f"the fatbin at byte {pos} claims {size} bytes past the section's end"
            )
        off = pos + header
        while off < end:
            if off + _ARCH_AT + 4 > end:
                raise FatbinError(f"an entry header at byte {off} is cut off")
            kind, _flags, entry_header, payload = _ENTRY.unpack_from(data, off)
            if entry_header < _ARCH_AT + 4 or off + entry_header + payload > end:
                raise FatbinError(
                    f"the entry at byte {off} claims more bytes than its fatbin holds"
                )
            (arch,) = struct.unpack_from("<I", data, off + _ARCH_AT)
            if kind not in found:
                raise FatbinError(f"the entry at byte {off} is of unknown kind {kind}")
            found[kind].add(arch)
            count += 1
            if count > MAX_ENTRIES:
                raise FatbinError(f"more than {MAX_ENTRIES} entries")
            off += entry_header + payload
        pos = end
    return Embedded(frozenset(found[KIND_SASS]), frozenset(found[KIND_PTX]))


def embedded(path: Path) -> Embedded | None:
    """What the shared object at `path` embeds; None when it has no GPU code (a C++-only extension such as apex_C).
    Raises FatbinError for a file that is not an ELF or whose section cannot be read."""
    try:
        with open(path, "rb") as fh:
            section = ELFFile(fh).get_section_by_name(SECTION)
            if section is None:
                return None
            if section.data_size > MAX_SECTION:
                raise FatbinError(
                    f"its {SECTION} section is {section.data_size} bytes (limit {MAX_SECTION})"
                )
            return parse_fatbin(section.data())
    except (ELFError, struct.error, OSError) as exc:
        raise FatbinError(f"not a readable ELF file ({type(exc).__name__})") from None


# --- what was asked ---------------------------------------------------------------------------------------------


def wanted(arches: tuple[Arch, ...]) -> Embedded:
    """What a build of `arches` must embed: SASS for each, PTX for those marked +PTX (torch's -gencode flags)."""
    return Embedded(
        frozenset(a.number for a in arches), frozenset(a.number for a in arches if a.ptx)
    )


def problems(found: Embedded | None, asked: Embedded, shown: str) -> list[str]:
    """One line per difference between what the module `shown` embeds and what was asked."""
    if found is None:
        return [f"{shown}: no GPU code ({SECTION} missing), asked for {asked.describe()}"]
    out = []
    missing = Embedded(asked.sass - found.sass, asked.ptx - found.ptx)
    extra = Embedded(found.sass - asked.sass, found.ptx - asked.ptx)
    if missing.sass or missing.ptx:
        out.append(f"{shown}: lacks {missing.describe()} (embeds {found.describe()})")
    if extra.sass or extra.ptx:
        out.append(f"{shown}: embeds {extra.describe()} that the arch list did not ask for")
    return out
