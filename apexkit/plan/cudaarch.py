"""A CUDA build's architecture list (TORCH_CUDA_ARCH_LIST), parsed once for the options, the matrix and the binary
checks (apexkit.wheel.cudabin compares it with what a module embeds). Pure."""

from __future__ import annotations

import re
from dataclasses import dataclass

from apexkit.errors import ConfigError

_ARCH = re.compile(r"^(?P<major>\d{1,2})\.(?P<minor>\d)(?P<suffix>[af]?)(?P<ptx>\+PTX)?$")


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
    found = []
    for entry in entries:
        m = _ARCH.match(entry)
        if m is None:
            shown = entry if len(entry) <= 20 and entry.isprintable() else f"{entry[:20]!r}…"
            raise ConfigError(
                f"CUDA arch {shown!r} is not a compute capability such as 8.0, 9.0a or 9.0+PTX",
                'give numbers separated by ";", e.g. --cuda-arch "8.0;9.0+PTX"',
            )
        found.append(Arch(entry, int(m["major"]) * 10 + int(m["minor"]), bool(m["ptx"])))
    return tuple(found)
