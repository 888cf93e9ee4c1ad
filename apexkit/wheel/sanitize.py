"""`build --sanitize address,undefined`: a diagnosis build compiled with AddressSanitizer / UBSan.

Its own target (`+asan`) and wheel version label (`.asan`), its own cache key, never published; its smoke test and
CPU tier run with the sanitizer runtimes preloaded (the interpreter itself is not instrumented, so the runtime must
come first: LD_PRELOAD of the libasan/libubsan that gcc links, found with `gcc -print-file-name`). A finding stops
the build with its kind and first frames; the whole report goes to the build log.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

from apexkit.errors import ConfigError

KNOWN = ("address", "undefined")
RUNTIMES = {"address": "libasan.so", "undefined": "libubsan.so"}
_FINDING = re.compile(r"ERROR: AddressSanitizer: (\S+)|runtime error: (.*)")
_FRAME = re.compile(r"^\s*#\d+ 0x[0-9a-f]+ .*$")


def parse(value: str) -> tuple[str, ...]:
    """`address,undefined` -> ('address', 'undefined'); anything else is one line naming the known ones."""
    names = tuple(dict.fromkeys(n.strip() for n in value.split(",") if n.strip()))
    unknown = [n for n in names if n not in KNOWN]
    if not names or unknown:
        raise ConfigError(
            f"--sanitize {value!r}: {'unknown sanitizer ' + ', '.join(unknown) if unknown else 'nothing named'}",
            f"use --sanitize {','.join(KNOWN)} (or one of them)",
        )
    return tuple(n for n in KNOWN if n in names)


def flags(names: tuple[str, ...]) -> str:
    return f"-fsanitize={','.join(names)} -fno-omit-frame-pointer -fno-sanitize-recover=all -g"


def runtime_env(names: tuple[str, ...], env: dict[str, str]) -> dict[str, str]:
    """LD_PRELOAD of the sanitizer runtimes gcc links, and options that make a finding fatal and keep CPython's own
    leaks out of the report."""
    gcc = env.get("CC", "").split()[-1:] or ["gcc"]
    compiler = shutil.which(gcc[0]) or shutil.which("gcc")
    if compiler is None:
        raise ConfigError(
            "--sanitize: no gcc on PATH to find the sanitizer runtime",
            "install gcc (libasan, libubsan)",
        )
    preload = []
    for name in names:
        out = subprocess.run(
            [compiler, f"-print-file-name={RUNTIMES[name]}"], capture_output=True, text=True
        ).stdout.strip()
        path = Path(out)
        if not path.is_absolute() or not path.exists():
            raise ConfigError(
                f"--sanitize {name}: gcc has no {RUNTIMES[name]} ({compiler} -print-file-name)",
                "install the runtime (Debian: libasan8 / libubsan1, with gcc)",
            )
        preload.append(str(path.resolve()))
    return {
        "LD_PRELOAD": " ".join(preload + env.get("LD_PRELOAD", "").split()),
        "ASAN_OPTIONS": "detect_leaks=0:abort_on_error=0:halt_on_error=1",
        "UBSAN_OPTIONS": "print_stacktrace=1:halt_on_error=1",
    }


def finding(stderr: str, frames: int = 6) -> str | None:
    """The first sanitizer report in `stderr`: its kind and first frames, one line; None when clean."""
    lines = stderr.splitlines()
    for i, line in enumerate(lines):
        found = _FINDING.search(line)
        if found:
            kind = found.group(1) or f"undefined behaviour: {found.group(2).strip()}"
            stack = [lines[j].strip() for j in range(i + 1, len(lines)) if _FRAME.match(lines[j])]
            return f"{kind[:200]}; stack: {' | '.join(stack[:frames]) or '(no frames)'}"
    return None
