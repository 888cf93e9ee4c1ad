"""A CUDA build's architecture list (TORCH_CUDA_ARCH_LIST), parsed once for the options, the matrix and the binary
checks (apexkit.wheel.cudabin compares it with what a module embeds). Pure."""

from __future__ import annotations

import re
from dataclasses import dataclass

from apexkit.errors import ConfigError

_ARCH = re.compile(r"^(?P<major>[0-9]{1,2})\.(?P<minor>[0-9])(?P<suffix>[af]?)(?P<ptx>\+PTX)?\Z")
MAX_ARCHES = 32  # upstream's own CUDA 13 default is seven; more is a typo or a crafted list


@dataclass(frozen=True)
class Arch:
    text: str  # as given: "9.0+PTX"
    number: int  # 90
    ptx: bool


def parse_arch_list(text: str) -> tuple[Arch, ...]:
    """TORCH_CUDA_ARCH_LIST as torch's cpp_extension reads it: entries separated by ';' or spaces, each `M.m`,
    optionally with an arch-specific suffix (`9.0a`, `10.0f`) and `+PTX` (PTX too, for GPUs newer than the list).
    Torch's named lists (`Ampere`, `Hopper`) are refused here: the check needs numbers, and the plan prints them."""
    entries = [part for part in re.split(r"[;\s]+", text.strip()) if part]
    if not entries:
        raise ConfigError(
            "the CUDA arch list is empty",
            'give compute capabilities, e.g. --cuda-arch "8.0;9.0" (9.0 is H100/H200, 8.0 is A100)',
        )
    found: list[Arch] = []
    for entry in entries:
        m = _ARCH.match(entry)
        if m is None:
            shown = repr(entry[:20]) + ("…" if len(entry) > 20 else "")
            raise ConfigError(
                f"CUDA arch {shown} is not a compute capability such as 8.0, 9.0a or 9.0+PTX",
                'give numbers separated by ";", e.g. --cuda-arch "8.0;9.0+PTX"',
            )
        text = f"{int(m['major'])}.{m['minor']}{m['suffix']}{m['ptx'] or ''}"  # 08.0 is 8.0
        if any(a.text == text for a in found):
            raise ConfigError(
                f"CUDA arch {text} is listed twice", 'give each architecture once, e.g. "8.0;9.0"'
            )
        found.append(Arch(text, int(m["major"]) * 10 + int(m["minor"]), bool(m["ptx"])))
        if len(found) > MAX_ARCHES:
            raise ConfigError(
                f"the CUDA arch list has more than {MAX_ARCHES} entries",
                'give the GPUs you run on, e.g. --cuda-arch "8.0;9.0"',
            )
    return tuple(found)
