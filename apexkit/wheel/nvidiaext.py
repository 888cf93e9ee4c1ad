"""Which extensions an NVIDIA apex checkout can build, read from its own setup.py, and the setup.py flags for the
ones asked (`--cuda-ext`): `core` (upstream's --cpp_ext --cuda_ext: apex_C, amp_C, syncbn, fused_layer_norm_cuda,
...) by default, contrib extensions by name (`xentropy`, `fast_layer_norm`, `distributed_adam`, ...).

The set changes with the ref (master dropped multihead_attn, fmha and gpu_direct_storage in 2026; 2020's 4ef930c
had pyprof and fast_multihead_attn), so it is read from the tree being built, never kept in a table here. Both
eras are understood: master's `ENV_TO_FLAG = {"APEX_CPP_EXT": "--cpp_ext", ...}` with `has_flag("--x", "APEX_X")`,
and older refs' `if "--x" in sys.argv:`. The flags are passed on setup.py's command line, which every ref reads
(master's has_flag looks at sys.argv before the environment).

setup.py is parsed with `ast`, never run: it imports torch and probes CUDA at import time.
"""

from __future__ import annotations

import ast
import re

from apexkit.errors import ConfigError

CORE = ("cpp_ext", "cuda_ext")
_FLAG = re.compile(r"^--[a-z][a-z0-9_]{0,63}\Z")
MAX_SETUP = 1 << 20  # upstream's setup.py is ~40 KB
# setup.py options that are not extensions
NOT_EXTENSIONS = frozenset(
    {"pyprof", "user", "parallel"}
)  # master: --parallel N builds extensions at once


def _is_argv(node: ast.AST) -> bool:
    return (
        isinstance(node, ast.Attribute) and node.attr == "argv" and isinstance(node.value, ast.Name)
    )


def _flag(node: ast.AST) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str) and _FLAG.match(node.value):
        return node.value[2:]
    return None


def available(setup_py: str) -> tuple[str, ...]:
    """The extension flags (without dashes) this setup.py reads, in the order it names them."""
    if len(setup_py) > MAX_SETUP:
        raise ConfigError(
            f"setup.py is {len(setup_py)} bytes (limit {MAX_SETUP}): not NVIDIA apex's",
            "check --nvidia-url / the NVIDIA apex checkout",
        )
    try:
        tree = ast.parse(setup_py)
    except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
        raise ConfigError(
            f"NVIDIA apex's setup.py does not parse ({type(exc).__name__} at line {getattr(exc, 'lineno', '?')})",
            "check --nvidia-commit / the checkout",
        ) from None
    named = (_flag(e) for node in ast.walk(tree) for e in _naming(node))
    found = [n for n in dict.fromkeys(named) if n is not None and n not in NOT_EXTENSIONS]
    ordered = [n for n in CORE if n in found] + sorted(n for n in found if n not in CORE)
    return tuple(ordered)


def _naming(node: ast.AST) -> list[ast.expr]:
    """The expressions in `node` that may name an extension flag: X in `X in sys.argv`, has_flag(X), and the
    values of ENV_TO_FLAG = {...}."""
    if isinstance(node, ast.Compare) and any(isinstance(op, ast.In) for op in node.ops):
        return [node.left] if any(_is_argv(c) for c in node.comparators) else []
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id == "has_flag"
    ):
        return node.args[:1]
    if (
        isinstance(node, ast.Assign)
        and isinstance(node.value, ast.Dict)
        and any(isinstance(t, ast.Name) and t.id == "ENV_TO_FLAG" for t in node.targets)
    ):
        return list(node.value.values)
    return []


def parse_asked(text: str) -> tuple[str, ...]:
    """`--cuda-ext core,xentropy` → ("core", "xentropy"); names are checked against the tree later (`flags`)."""
    names = tuple(dict.fromkeys(part.strip() for part in text.split(",") if part.strip()))
    if not names:
        raise ConfigError(
            "--cuda-ext is empty",
            "give core, or core plus contrib names, e.g. --cuda-ext core,xentropy",
        )
    for name in names:
        if not re.fullmatch(r"[a-z][a-z0-9_]{0,63}", name):
            shown = repr(name[:20]) + ("…" if len(name) > 20 else "")
            raise ConfigError(
                f"--cuda-ext {shown} is not an extension name",
                "names are lower-case words such as core, xentropy, fast_layer_norm",
            )
    return names


def flags(asked: tuple[str, ...], setup_py: str, ref: str) -> tuple[str, ...]:
    """setup.py's flags for the extensions asked, refused with the ones this ref has when a name is unknown."""
    have = available(setup_py)
    missing_core = [n for n in CORE if n not in have]
    if missing_core:
        raise ConfigError(
            f"NVIDIA apex {ref}'s setup.py reads no --{' --'.join(missing_core)}: not an apex tree this kit knows",
            "check --nvidia-apex-url and --apex-ref",
        )
    out: list[str] = []
    for name in asked:
        if name == "core":
            out.extend(CORE)
        elif name in have:
            out.append(name)
        else:
            names = [n for n in have if n not in CORE]
            contrib = ", ".join(names[:40]) + (
                f" and {len(names) - 40} more" if len(names) > 40 else ""
            )
            raise ConfigError(
                f"NVIDIA apex {ref} has no extension {name!r}",
                f"choose core and any of: {contrib or 'none (this ref has no contrib extension)'}",
            )
    return tuple(f"--{n}" for n in dict.fromkeys(out))
