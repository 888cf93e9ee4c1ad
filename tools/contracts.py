"""`nox -s contracts` (a maintainer's tool, in a checkout): every name and keyword bench/ uses from torch_npu and
apex, checked against the real torch_npu wheels and Ascend apex trees, without importing them (no CANN, no NPU).

- The uses: bench/*.py scanned with `ast` for attribute chains rooted at `torch_npu`, `torch.npu` and `apex`
  (imports, `from x import y as z`, aliases such as `npu = torch.npu` or `self.backend = torch.npu`,
  `getattr(x, "name", default)`, `__import__("torch_npu")`), with the keywords of each call; plus DECLARED, the
  keywords a call passes through `**kwargs` (amp.initialize(..., combine_grad=True)). A new use in bench/ is
  checked without anyone listing it.
- The sources: a torch_npu wheel read as a zip (members capped, never extracted; downloaded once into the apexkit
  cache, its sha256 checked against the index's), an Ascend apex tree (the generated tree of a build, or one
  generated here from the git mirrors for a ref).
- The check: each dotted name resolved statically: modules and packages, module-level definitions and
  assignments, `from x import y` re-exports and `from x import *` with `__all__`, classes (their body, `self.x =`
  in their methods, their bases), instances of those classes, and function signatures for the keywords.
  `torch.npu.*` is what torch_npu registers as torch's `npu` device module
  (`torch._register_device_module('npu', torch_npu.npu)` in torch_npu/__init__.py). What cannot be decided
  statically (an attribute of a value, a base class from torch) is `unverified`, with the reason, never a drift.
- A drift is one line: the name, the release (or ref), the bench file:line that uses it.

Everything read from a wheel, a tree or the index is untrusted: sizes capped, no links followed, parse errors are
reasons, not tracebacks.
"""

from __future__ import annotations

import argparse
import ast
import datetime
import hashlib
import json
import os
import re
import shutil
import tempfile
import urllib.error
import zipfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from apexkit import fsedit, log, paths, untrusted, venvrun, vocab
from apexkit.errors import ConfigError, SourceError
from tools import run_main, wheelindex

BENCH = paths.BENCH  # the checkout's bench/, or the installed copy (apexkit/_data)
RESULT_FILE = venvrun.CONTRACT_FILE  # next to dist/<target>/manifest.json; validate reads it
SCHEMA = 1

ROOTS = ("torch_npu", "apex", "torch.npu")
MEMBER_MAX = 4 << 20  # one source file read from a wheel or a tree
SOURCE_MAX = 256 << 20  # all source files one check may read
WHEEL_MAX = 1 << 30  # one torch_npu wheel downloaded (the real ones are 20-60 MB)
DEPTH_MAX = 40  # resolution steps for one name (re-export and alias chains; a cycle ends here)
MODULE_ATTRS = (
    "__file__",
    "__name__",
    "__spec__",
    "__path__",
    "__loader__",
    "__package__",
    "__doc__",
)
NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*\Z")


# ---------------------------------------------------------------------------------------------------------------
# The uses: what bench/ takes from torch_npu and apex
# ---------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Declared:
    """A keyword the scan cannot see (passed through **kwargs): `needle` is the text on the line that passes it."""

    name: str
    keyword: str
    file: str
    needle: str


DECLARED = (
    # amp_bench.py builds {"combine_grad": True} and calls amp.initialize(..., **extra): Ascend apex's keyword
    Declared("apex.amp.initialize", "combine_grad", "bench/amp_bench.py", '"combine_grad": True'),
)


@dataclass
class Use:
    name: str  # torch_npu.optim.NpuFusedAdamW, torch.npu.set_compile_mode, apex.amp.initialize
    where: list[str] = field(default_factory=list)  # bench/amp_bench.py:538
    keywords: dict[str, str] = field(default_factory=dict)  # keyword -> first file:line
    base: str = ""  # the longest prefix bench/ imports as a module (import a.b / from a.b import c): found by path
    required: bool = (
        False  # False: every use is getattr(x, "name", default), so bench/ has a fallback
    )

    @property
    def package(self) -> str:
        return "apex" if self.name.split(".")[0] == "apex" else "torch_npu"


def _rooted(chain: str | None) -> bool:
    return bool(chain) and any(chain == r or chain.startswith(r + ".") for r in ROOTS)  # type: ignore[union-attr]


class _Scan:
    """One file: aliases first (imports and assignments, to a fixed point), then every rooted chain. A name bound to
    several chains (`from a import X as f` in one branch, `from b import Y as f` in another) stands for each."""

    def __init__(self, rel: str, tree: ast.AST) -> None:
        self.rel = rel
        self.tree = tree
        self.aliases: dict[str, list[str]] = {}
        self.uses: dict[str, Use] = {}
        self.bases: dict[str, str] = {}  # an alias's chain -> the module its import statement names
        self.fallbacks: set[str] = (
            set()
        )  # chains bound by x = getattr(y, "name", default): uses through x are optional
        self.collecting = True

    def key(self, node: ast.AST) -> str | None:
        """The alias key of an assignment target: a name, or self.attr."""
        if isinstance(node, ast.Name):
            return node.id
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id == "self"
        ):
            return f"self.{node.attr}"
        return None

    def chains(self, node: ast.AST) -> list[str]:
        if isinstance(node, ast.Name):
            if node.id in self.aliases:
                return self.aliases[node.id]
            return ["torch"] if node.id == "torch" else []
        if isinstance(node, ast.Attribute):
            key = self.key(node)
            if key and key in self.aliases:
                return self.aliases[key]
            return [f"{base}.{node.attr}" for base in self.chains(node.value)]
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            args = node.args
            at = 1 if node.func.id == "getattr" else 0
            arg = args[at] if len(args) > at else None
            text = arg.value if isinstance(arg, ast.Constant) else None
            if not isinstance(text, str) or not NAME_RE.match(text):
                return []
            if node.func.id == "__import__":
                return [text]
            if node.func.id == "getattr" and len(args) >= 2:
                return [f"{base}.{text}" for base in self.chains(args[0])]
        return []

    def use(self, name: str, node: ast.AST, optional: bool = False) -> Use | None:
        if not _rooted(name):
            return None
        key = max(
            (k for k in self.bases if name == k or name.startswith(k + ".")), key=len, default=""
        )
        base = self.bases.get(key, "")
        found = self.uses.setdefault(f"{name} {base}", Use(name, base=base))
        where = f"{self.rel}:{getattr(node, 'lineno', 0)}"
        if where not in found.where:
            found.where.append(where)
        optional = optional or any(name == f or name.startswith(f + ".") for f in self.fallbacks)
        found.required = found.required or not optional
        return found

    def alias(self, key: str, value: str) -> None:
        if _rooted(value) or value == "torch":
            bound = self.aliases.setdefault(key, [])
            if value not in bound:
                bound.append(value)

    def _import(self, node: ast.Import) -> None:
        for a in node.names:
            if a.asname:
                self.alias(a.asname, a.name)
                self.bases.setdefault(a.name, a.name)
            else:
                self.alias(a.name.split(".")[0], a.name.split(".")[0])
            if not self.collecting:
                self.use(a.name, node)

    def _import_from(self, node: ast.ImportFrom) -> None:
        if node.level or not node.module:
            return
        for a in node.names:
            if a.name == "*":
                continue
            full = f"{node.module}.{a.name}"
            self.bases.setdefault(full, node.module)
            self.alias(a.asname or a.name, full)
            if not self.collecting:
                self.use(full, node)

    def _assign(self, node: ast.Assign) -> None:
        value_node = node.value
        if (
            isinstance(value_node, ast.Call)
            and isinstance(value_node.func, ast.Name)
            and value_node.func.id == "getattr"
            and len(value_node.args) >= 3
        ):
            self.fallbacks.update(self.chains(value_node))
        for value in self.chains(node.value):
            for target in node.targets:
                key = self.key(target)
                if key:
                    self.alias(key, value)

    def _call(self, node: ast.Call) -> None:
        fallback = (
            isinstance(node.func, ast.Name) and node.func.id == "getattr" and len(node.args) >= 3
        )
        for name in self.chains(node):  # getattr(x, "name"[, default]), __import__("name")
            self.use(name, node, optional=fallback)
        for name in self.chains(node.func):
            found = self.use(name, node)
            if found is not None:
                for kw in node.keywords:
                    if kw.arg:
                        found.keywords.setdefault(kw.arg, f"{self.rel}:{node.lineno}")

    def run(self) -> dict[str, Use]:
        nodes = [
            n
            for n in ast.walk(self.tree)
            if isinstance(n, (ast.Import, ast.ImportFrom, ast.Assign, ast.Call, ast.Attribute))
        ]
        nodes.sort(key=lambda n: (getattr(n, "lineno", 0), getattr(n, "col_offset", 0)))
        for _ in range(3):  # aliases of aliases, to a fixed point
            before = {k: list(v) for k, v in self.aliases.items()}
            for n in nodes:
                if isinstance(n, ast.Import):
                    self._import(n)
                elif isinstance(n, ast.ImportFrom):
                    self._import_from(n)
                elif isinstance(n, ast.Assign):
                    self._assign(n)
            if before == self.aliases:
                break
        self.collecting = False
        for n in nodes:
            if isinstance(n, ast.Import):
                self._import(n)
            elif isinstance(n, ast.ImportFrom):
                self._import_from(n)
            elif isinstance(n, ast.Call):
                self._call(n)
            elif isinstance(n, ast.Attribute):
                for name in self.chains(n):
                    self.use(name, n)
        return self.uses


def scan_file(path: Path, rel: str) -> dict[str, Use]:
    """Uses keyed by 'name base'."""
    return _Scan(rel, ast.parse(path.read_text(), filename=rel)).run()


def _files(bench: Path) -> list[Path]:
    return sorted(bench.glob("*.py")) + sorted(bench.glob("probes/*.py"))


_SCANS: dict[tuple, list[Use]] = {}


def scan(bench: Path = BENCH, declared: Sequence[Declared] = DECLARED) -> list[Use]:
    """Every use of torch_npu / torch.npu / apex in bench/*.py (and bench/probes/*.py), sorted by name; kept for
    this process while no file changed (size and mtime)."""
    files = _files(bench)
    key = (
        str(bench),
        tuple(declared),
        tuple((str(f), f.stat().st_mtime_ns, f.stat().st_size) for f in files),
    )
    if key not in _SCANS:
        _SCANS.clear()
        _SCANS[key] = _scan(bench, files, declared)
    return _SCANS[key]


def _scan(bench: Path, files: list[Path], declared: Sequence[Declared]) -> list[Use]:
    found: dict[str, Use] = {}
    for path in files:
        rel = f"bench/{path.relative_to(bench).as_posix()}"
        for key, use in scan_file(path, rel).items():
            mine = found.setdefault(key, Use(use.name, base=use.base))
            mine.required = mine.required or use.required
            mine.where += [w for w in use.where if w not in mine.where]
            for kw, where in use.keywords.items():
                mine.keywords.setdefault(kw, where)
    for d in declared:
        path = bench.parent / d.file
        line = next(
            (n for n, text in enumerate(path.read_text().splitlines(), 1) if d.needle in text),
            0,
        )
        if not line:
            raise ConfigError(
                f"contracts: {d.file} no longer has {d.needle!r} (declared keyword {d.keyword} of {d.name})",
                "update DECLARED in tools/contracts.py to what bench/ passes now",
            )
        key = next((k for k, u in found.items() if u.name == d.name), f"{d.name} ")
        mine = found.setdefault(key, Use(d.name, [f"{d.file}:{line}"], required=True))
        mine.keywords.setdefault(d.keyword, f"{d.file}:{line}")
    # a chain is also its prefixes (torch_npu.optim.NpuFusedAdamW needs torch_npu.optim): only the longest are kept
    names = {u.name for u in found.values()}
    kept = [
        u
        for u in found.values()
        if u.keywords or not any(other.startswith(u.name + ".") for other in names)
    ]
    return sorted(kept, key=lambda u: (u.name, u.base))


# ---------------------------------------------------------------------------------------------------------------
# Source trees: a wheel read as a zip, a directory
# ---------------------------------------------------------------------------------------------------------------


class Tree:
    """Files by relative posix path; `read` returns text or None (absent), capped."""

    label = ""

    def __init__(self) -> None:
        self.read_bytes = 0
        self._texts: dict[str, str | None] = {}

    def names(self) -> set[str]:
        raise NotImplementedError

    def _raw(self, rel: str) -> bytes:
        raise NotImplementedError

    def read(self, rel: str) -> str | None:
        if rel in self._texts:
            return self._texts[rel]
        text = None
        if rel in self.names():
            data = self._raw(rel)
            self.read_bytes += len(data)
            if self.read_bytes > SOURCE_MAX:
                raise untrusted.Untrusted(
                    f"{self.label}: more than {SOURCE_MAX >> 20} MiB of sources read"
                )
            text = data.decode("utf-8", "replace")
        self._texts[rel] = text
        return text


class ZipTree(Tree):
    def __init__(self, path: Path, label: str) -> None:
        super().__init__()
        self.label = label
        fd = untrusted.open_regular(path)
        self._fh = os.fdopen(fd, "rb")
        try:
            self._zip = zipfile.ZipFile(self._fh)
            self._infos = {
                i.filename: i
                for i in self._zip.infolist()
                if not i.is_dir() and ".." not in i.filename.split("/")
            }
        except (zipfile.BadZipFile, OSError, EOFError, ValueError) as exc:
            self._fh.close()
            raise untrusted.Untrusted(f"{path.name} is not a readable zip ({exc})") from None

    def names(self) -> set[str]:
        return set(self._infos)

    def _raw(self, rel: str) -> bytes:
        info = self._infos[rel]
        if info.file_size > MEMBER_MAX:
            raise untrusted.Untrusted(
                f"{self.label}: member {untrusted.shown(rel)} is larger than {MEMBER_MAX >> 20} MiB"
            )
        try:
            with self._zip.open(info) as member:
                data = member.read(MEMBER_MAX + 1)
        except (zipfile.BadZipFile, OSError, EOFError, ValueError) as exc:
            raise untrusted.Untrusted(
                f"{self.label}: member {untrusted.shown(rel)} cannot be read ({exc})"
            ) from None
        if len(data) > MEMBER_MAX:
            raise untrusted.Untrusted(
                f"{self.label}: member {untrusted.shown(rel)} is larger than {MEMBER_MAX >> 20} MiB"
            )
        return data

    def close(self) -> None:
        self._zip.close()
        self._fh.close()


class DirTree(Tree):
    """A directory (a generated apex tree): regular files only, no link followed, no hidden or build folder."""

    SKIP = frozenset({".git", "build", "dist", "__pycache__", ".eggs"})

    def __init__(self, root: Path, label: str) -> None:
        super().__init__()
        self.root = root
        self.label = label
        self._names: set[str] | None = None

    def names(self) -> set[str]:
        if self._names is None:
            found: set[str] = set()
            for top, dirs, files in os.walk(self.root, followlinks=False):
                dirs[:] = [d for d in dirs if d not in self.SKIP]
                rel_top = Path(top).relative_to(self.root).as_posix()
                for f in files:
                    if f.endswith((".py", ".so", ".pyd")):
                        found.add(f if rel_top == "." else f"{rel_top}/{f}")
                if len(found) > 100_000:
                    raise untrusted.Untrusted(f"{self.label}: more than 100,000 files")
            self._names = found
        return self._names

    def _raw(self, rel: str) -> bytes:
        return untrusted.read_regular(self.root / rel, None, MEMBER_MAX)


# ---------------------------------------------------------------------------------------------------------------
# Static resolution
# ---------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Obj:
    kind: str  # module | class | function | value | compiled | unknown
    module: str  # dotted module it lives in
    node: ast.AST | None = None
    why: str = ""  # for unknown: why it cannot be told
    var: str = (
        ""  # a module-level variable's name (an instance: its attributes may be set from elsewhere)
    )


def _dotted(node: ast.AST | None) -> str | None:
    """a.b.c for a Name / Attribute chain, else None (ast.unparse is Python 3.9+)."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value)
        return f"{base}.{node.attr}" if base else None
    return None


def _module_of(rel: str) -> str:
    """apex/amp/__init__.py -> apex.amp; apex/amp/frontend.py -> apex.amp.frontend."""
    dotted = rel[: -len(".py")].replace("/", ".")
    return dotted[: -len(".__init__")] if dotted.endswith(".__init__") else dotted


def _hook(func: ast.AST, module: str, name: str, what: str) -> Obj:
    """An attribute a __getattr__ answers: known when the hook names it as a string, else unknown."""
    named = any(isinstance(n, ast.Constant) and n.value == name for n in ast.walk(func))
    if named:
        return Obj("value", module, None, why=f"answered by {what}")
    return Obj("unknown", module, why=f"{what} may answer it (not named there)")


class Unresolved(Exception):
    """A name is not there (the message says which part)."""


class Resolver:
    def __init__(self, tree: Tree) -> None:
        self.tree = tree
        self._parsed: dict[str, ast.Module | None] = {}
        self._names = tree.names()
        self._device_module: tuple | None = None

    # --- modules ---------------------------------------------------------------------------------------------
    def module_file(self, dotted: str) -> str | None:
        base = dotted.replace(".", "/")
        for rel in (f"{base}/__init__.py", f"{base}.py"):
            if rel in self._names:
                return rel
        return None

    def compiled(self, dotted: str) -> bool:
        head, _, last = dotted.replace(".", "/").rpartition("/")
        prefix = f"{head}/{last}." if head else f"{last}."
        return any(n.startswith(prefix) and n.endswith((".so", ".pyd")) for n in self._names)

    def is_package(self, dotted: str) -> bool:
        return f"{dotted.replace('.', '/')}/__init__.py" in self._names

    def parse(self, dotted: str) -> ast.Module | None:
        if dotted not in self._parsed:
            rel = self.module_file(dotted)
            text = self.tree.read(rel) if rel else None
            try:
                self._parsed[dotted] = ast.parse(text, filename=rel or dotted) if text else None
            except (SyntaxError, ValueError, RecursionError):
                self._parsed[dotted] = None
        return self._parsed[dotted]

    def module(self, dotted: str) -> Obj | None:
        if self.module_file(dotted):
            return Obj("module", dotted)
        if self.compiled(dotted):
            return Obj("compiled", dotted)
        return None

    # --- statements at module / class level (into if/try/with, never into functions) -------------------------
    @staticmethod
    def statements(body: Iterable[ast.stmt]) -> Iterable[ast.stmt]:
        for stmt in body:
            yield stmt
            if isinstance(stmt, (ast.If, ast.For, ast.While)):
                yield from Resolver.statements(stmt.body)
                yield from Resolver.statements(stmt.orelse)
            elif isinstance(stmt, ast.With):
                yield from Resolver.statements(stmt.body)
            elif isinstance(stmt, ast.Try):
                yield from Resolver.statements(stmt.body)
                for h in stmt.handlers:
                    yield from Resolver.statements(h.body)
                yield from Resolver.statements(stmt.orelse)
                yield from Resolver.statements(stmt.finalbody)

    def _absolute(self, module: str, node: ast.ImportFrom) -> str:
        if not node.level:
            return node.module or ""
        parts = module.split(".")
        if not self.is_package(module):
            parts = parts[:-1]
        parts = parts[: len(parts) - (node.level - 1)] if node.level > 1 else parts
        return ".".join([*parts, *([node.module] if node.module else [])])

    def all_of(self, module: str) -> list[str] | None:
        tree = self.parse(module)
        for stmt in self.statements(tree.body if tree else []):
            if isinstance(stmt, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "__all__" for t in stmt.targets
            ):
                try:
                    value = ast.literal_eval(stmt.value)
                except (ValueError, SyntaxError, TypeError, RecursionError):
                    return None
                return (
                    [v for v in value if isinstance(v, str)]
                    if isinstance(value, (list, tuple))
                    else None
                )
        return None

    def in_module(self, module: str, name: str, depth: int) -> Obj | None:
        """`module.name`, or None when the module does not have it."""
        if depth > DEPTH_MAX:
            return Obj("unknown", module, why="re-export chain too deep (a cycle?)")
        tree = self.parse(module)
        found: Obj | None = None
        stars: list[str] = []
        getattr_hook: ast.AST | None = None
        broken = ""
        for stmt in self.statements(tree.body if tree else []):
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                if stmt.name == name:
                    found = Obj(
                        "class" if isinstance(stmt, ast.ClassDef) else "function", module, stmt
                    )
                if stmt.name == "__getattr__":
                    getattr_hook = stmt
            elif isinstance(stmt, (ast.Assign, ast.AnnAssign)):
                targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
                for t in targets:
                    names = t.elts if isinstance(t, ast.Tuple) else [t]
                    if any(isinstance(n, ast.Name) and n.id == name for n in names):
                        value = stmt.value if not isinstance(t, ast.Tuple) else None
                        found = Obj("value", module, value, var=name)
            elif isinstance(stmt, ast.ImportFrom):
                source = self._absolute(module, stmt)
                for a in stmt.names:
                    if a.name == "*":
                        stars.append(source)
                    elif (a.asname or a.name) == name:
                        if not self._inside(source):
                            found = Obj(
                                "unknown", module, why=f"re-exported from {source}, not in the tree"
                            )
                            continue
                        hit = self.module(f"{source}.{a.name}")
                        if hit is None and source != module:
                            hit = self.get(source, a.name, depth + 1)
                        if hit is None:
                            broken = (
                                f"{module} imports {a.name} from {source}, which has no {a.name}"
                            )
                        else:
                            found = hit
            elif isinstance(stmt, ast.Import):
                for a in stmt.names:
                    if a.asname == name:
                        found = self.module(a.name) or Obj(
                            "unknown", module, why=f"{a.name} is not in the tree"
                        )
        if found is not None:
            return found
        sub = self.module(f"{module}.{name}")
        if sub is not None:
            return sub
        for source in stars:
            allowed = self.all_of(source)
            if (allowed is None and not name.startswith("_")) or (allowed and name in allowed):
                hit = self.get(source, name, depth + 1)
                if hit is not None:
                    return hit
        if getattr_hook is not None:
            return _hook(getattr_hook, module, name, f"{module}.__getattr__")
        if broken:
            raise Unresolved(broken)
        return None

    def _inside(self, dotted: str) -> bool:
        top = dotted.split(".")[0]
        return self.module(top) is not None

    def get(self, module: str, name: str, depth: int) -> Obj | None:
        if self.module(module) is None:
            return None
        if self.module(module).kind == "compiled":  # type: ignore[union-attr]
            return Obj("unknown", module, why=f"{module} is a compiled module")
        return self.in_module(module, name, depth)

    def expr(self, module: str, node: ast.AST | None, depth: int) -> Obj:
        """What an expression in `module` refers to, as far as can be told."""
        if depth > DEPTH_MAX:
            return Obj("unknown", module, why="alias chain too deep")
        if isinstance(node, ast.Name):
            hit = self.in_module(module, node.id, depth + 1)
            return hit or Obj("unknown", module, why=f"{node.id} is not defined in {module}")
        if isinstance(node, ast.Attribute):
            base = self.expr(module, node.value, depth + 1)
            try:
                return self.attribute(base, node.attr, depth + 1)
            except Unresolved as exc:
                return Obj("unknown", module, why=str(exc))
        if isinstance(node, ast.Call):
            func = self.expr(module, node.func, depth + 1)
            if func.kind == "class":
                return Obj("instance", func.module, func.node)
        return Obj("value", module, node)

    def class_attr(self, cls: Obj, name: str, depth: int) -> Obj | None:
        node = cls.node
        assert isinstance(node, ast.ClassDef)
        for stmt in self.statements(node.body):
            if (
                isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                and stmt.name == name
            ):
                return Obj(
                    "class" if isinstance(stmt, ast.ClassDef) else "function", cls.module, stmt
                )
            if isinstance(stmt, (ast.Assign, ast.AnnAssign)):
                targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
                if any(isinstance(t, ast.Name) and t.id == name for t in targets):
                    return Obj("value", cls.module, stmt.value)
        for sub in ast.walk(node):
            if isinstance(sub, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
                targets = sub.targets if isinstance(sub, ast.Assign) else [sub.target]
                for t in targets:
                    if (
                        isinstance(t, ast.Attribute)
                        and t.attr == name
                        and isinstance(t.value, ast.Name)
                        and t.value.id == "self"
                    ):
                        return Obj("value", cls.module, None)
        for stmt in node.body:
            if isinstance(stmt, ast.FunctionDef) and stmt.name in (
                "__getattr__",
                "__getattribute__",
            ):
                return _hook(stmt, cls.module, name, f"{node.name}.{stmt.name}")
        for base in node.bases:
            if depth > DEPTH_MAX:
                break
            parent = self.expr(cls.module, base, depth + 1)
            if parent.kind == "class":
                hit = self.class_attr(parent, name, depth + 1)
                if hit is not None:
                    return hit
            elif not (isinstance(base, ast.Name) and base.id == "object"):
                return Obj(
                    "unknown",
                    cls.module,
                    why=f"inherits from {_dotted(base) or 'an expression'}, not in the tree",
                )
        return None

    def attribute(self, obj: Obj, name: str, depth: int) -> Obj:
        if obj.kind in ("module", "compiled") and name in MODULE_ATTRS:
            return Obj("value", obj.module, None, why="a module attribute")
        if obj.kind == "module":
            hit = self.in_module(obj.module, name, depth)
            if hit is None:
                raise Unresolved(f"{obj.module} has no {name}")
            return hit
        if obj.kind == "compiled":
            return Obj("unknown", obj.module, why=f"{obj.module} is a compiled module")
        if obj.kind in ("class", "instance"):
            hit = self.class_attr(obj, name, depth)
            if hit is None and obj.kind == "instance" and obj.var:
                hit = self.set_elsewhere(obj, name)
            if hit is None:
                cls = obj.node.name  # type: ignore[union-attr]
                raise Unresolved(f"class {obj.module}.{cls} has no {name}")
            return hit
        if obj.kind == "value" and obj.node is not None:
            target = self.expr(obj.module, obj.node, depth + 1)
            if target.kind == "instance":
                target = Obj("instance", target.module, target.node, var=obj.var)
            if target.kind != "value":
                return self.attribute(target, name, depth + 1)
        if obj.kind == "unknown":
            return obj
        return Obj(
            "unknown", obj.module, why=f"an attribute of a {obj.kind} (not checked statically)"
        )

    def set_elsewhere(self, obj: Obj, name: str) -> Obj | None:
        """An attribute of the module-level instance `obj.var` that its package assigns from outside the class
        (`_amp_state.loss_scalers = []` in apex/amp/_initialize.py)."""
        top = obj.module.split(".")[0]
        for rel in sorted(n for n in self._names if n.startswith(f"{top}/") and n.endswith(".py")):
            text = self.tree.read(rel)
            if not text or f"{obj.var}.{name}" not in text:
                continue
            dotted = _module_of(rel)
            tree = self.parse(dotted)
            for node in ast.walk(tree) if tree else []:
                targets = (
                    node.targets
                    if isinstance(node, ast.Assign)
                    else ([node.target] if isinstance(node, (ast.AnnAssign, ast.AugAssign)) else [])
                )
                for t in targets:
                    if (
                        isinstance(t, ast.Attribute)
                        and t.attr == name
                        and _dotted(t.value)
                        and (_dotted(t.value) or "").split(".")[-1] == obj.var
                    ):
                        return Obj(
                            "value", dotted, None, why=f"set in {rel}:{getattr(node, 'lineno', 0)}"
                        )
        return None

    def signature(self, obj: Obj, depth: int = 0) -> tuple[set[str], bool] | None:
        """(keyword names, has **kwargs) of a function or a class's __init__; None when it cannot be told."""
        node = obj.node
        if obj.kind in ("class", "instance"):
            init = self.class_attr(Obj("class", obj.module, node), "__init__", depth)
            if init is None or init.kind != "function":
                return None
            node = init.node
        elif obj.kind == "value" and obj.node is not None and depth < DEPTH_MAX:
            return self.signature(self.expr(obj.module, obj.node, depth + 1), depth + 1)
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            return None
        a = node.args
        names = {x.arg for x in [*a.posonlyargs, *a.args, *a.kwonlyargs]}
        return names, a.kwarg is not None

    # --- torch.npu ---------------------------------------------------------------------------------------------
    def torch_npu_device_module(self) -> tuple[str, str] | None:
        """(what torch_npu installs as torch.npu, file:line): the module named in
        torch._register_device_module('npu', X), setattr(torch, 'npu', X) or torch.npu = X, in torch_npu/__init__.py
        (<= 2.13) or anywhere in the package (2.14 moved it to torch_npu/_init/registry/backend.py)."""
        if self._device_module is not None:
            return self._device_module or None
        rest = sorted(
            n
            for n in self._names
            if n.startswith("torch_npu/") and n.endswith(".py") and n != "torch_npu/__init__.py"
        )
        files = ["torch_npu/__init__.py", *rest]
        for rel in files:
            text = self.tree.read(rel) or ""
            if (
                "_register_device_module" not in text
                and "torch.npu =" not in text
                and "setattr(torch," not in text
            ):
                continue
            tree = self.parse(_module_of(rel))
            for node in ast.walk(tree) if tree else []:
                target: ast.AST | None = None
                if isinstance(node, ast.Call):
                    func = _dotted(node.func)
                    args = node.args
                    if (
                        func in ("torch._register_device_module", "setattr")
                        and len(args) >= 2
                        and isinstance(args[-2], ast.Constant)
                        and args[-2].value == "npu"
                        and (func != "setattr" or _dotted(args[0]) == "torch")
                    ):
                        target = args[-1]
                elif isinstance(node, ast.Assign) and any(
                    _dotted(t) == "torch.npu" for t in node.targets
                ):
                    target = node.value
                text_of = _dotted(target)
                if text_of and text_of.split(".")[0] == "torch_npu":
                    self._device_module = (text_of, f"{rel}:{getattr(node, 'lineno', 0)}")
                    return self._device_module
        self._device_module = ()
        return None

    def resolve(self, dotted: str, base: str = "") -> Obj:
        """The object `dotted` names (Unresolved with the reason when it is not there). `base`: a prefix imported as
        a module (`from apex.amp._amp_state import _amp_state` finds the module by its path, not by attribute)."""
        if base and base != dotted.split(".")[0] and not base.startswith("torch.npu"):
            start = self.module(base)
            if start is None:
                raise Unresolved(f"no module {base} in the tree")
            obj = start
            for i, part in enumerate(
                dotted[len(base) + 1 :].split(".") if dotted != base else [], 1
            ):
                obj = self.attribute(obj, part, i)
                if obj.kind == "unknown":
                    return obj
            return obj
        parts = dotted.split(".")
        if parts[:2] == ["torch", "npu"]:
            registered = self.torch_npu_device_module()
            if registered is None:
                raise Unresolved(
                    "torch_npu does not register torch.npu (no torch._register_device_module('npu', ...))"
                )
            parts = registered[0].split(".") + parts[2:]
        top = self.module(parts[0])
        if top is None:
            raise Unresolved(f"no {parts[0]} package in the tree")
        obj = top
        for i, part in enumerate(parts[1:], 1):
            obj = self.attribute(obj, part, i)
            if obj.kind == "unknown":
                return obj
        return obj


@dataclass
class Finding:
    name: str
    status: str  # ok | drift | absent (bench/ has a fallback) | unverified
    detail: str
    where: str


def check(uses: Sequence[Use], tree: Tree, package: str) -> list[Finding]:
    """Each use of `package` (torch_npu: torch_npu.* and torch.npu.*; apex) resolved in `tree`."""
    resolver = Resolver(tree)
    out: list[Finding] = []
    npu_uses = [u for u in uses if u.name.startswith("torch.npu.")]
    if package == "torch_npu" and npu_uses:
        registered = resolver.torch_npu_device_module()
        if registered is not None:
            out.append(
                Finding(
                    "torch.npu", "ok", f"= {registered[0]} ({registered[1]})", npu_uses[0].where[0]
                )
            )
    for use in uses:
        if use.package != package:
            continue
        where = use.where[0] + (f" (+{len(use.where) - 1} more)" if len(use.where) > 1 else "")
        try:
            obj = resolver.resolve(use.name, use.base)
        except Unresolved as exc:
            if use.required:
                out.append(Finding(use.name, "drift", str(exc), where))
            else:
                out.append(
                    Finding(
                        use.name,
                        "absent",
                        f"{exc} (bench/ falls back: getattr with a default)",
                        where,
                    )
                )
            continue
        except RecursionError:
            out.append(Finding(use.name, "unverified", "resolution too deep", where))
            continue
        if obj.kind == "unknown":
            out.append(Finding(use.name, "unverified", obj.why, where))
            continue
        status, detail = "ok", obj.kind + (f" ({obj.why})" if obj.why else "")
        if use.keywords:
            sig = resolver.signature(obj)
            if sig is None:
                status, detail = (
                    "unverified",
                    f"{obj.kind}: keywords {', '.join(sorted(use.keywords))} not checked "
                    "(no signature in the tree)",
                )
            else:
                names, kwargs = sig
                for kw, kw_where in sorted(use.keywords.items()):
                    if kw not in names and not kwargs:
                        out.append(
                            Finding(f"{use.name}(..., {kw}=)", "drift", "no such keyword", kw_where)
                        )
                        status = ""
                if status:
                    detail = f"{obj.kind}({', '.join(sorted(use.keywords))}{'; **kwargs' if kwargs else ''})"
        if status:
            out.append(Finding(use.name, status, detail, where))
    return out


# ---------------------------------------------------------------------------------------------------------------
# torch_npu wheels: from the index, once, into the cache
# ---------------------------------------------------------------------------------------------------------------


def _pick(wheels: Sequence, release: str):
    """One wheel of `release`: aarch64 first (the stacks' arch), then the lowest CPython tag; not yanked."""
    mine = [w for w in wheels if w.version == release and not w.yanked and not w.refused]
    if not mine:
        return None

    def rank(w) -> tuple:
        tag = re.search(r"-cp(\d)(\d+)-", w.filename)
        return (w.arch != "aarch64", int(tag[2]) if tag else 99, w.filename)

    return sorted(mine, key=rank)[0]


def wheel_cache(env: Mapping[str, str]) -> Path:
    """Where downloaded torch_npu wheels are kept: in the apexkit cache, a private one when others can write it."""
    from apexkit import cachetrust

    return cachetrust.trusted(paths.cache_dir(env)) / "contracts" / "wheels"


def check_release(release: str) -> str:
    """A torch_npu release as given (--torch-npu, matrix.toml): a PEP 440 version, nothing a glob or path reads."""
    from packaging.version import InvalidVersion, Version

    try:
        ok = bool(re.fullmatch(r"[0-9][0-9A-Za-z.]*", release)) and str(Version(release)) == release
    except InvalidVersion:
        ok = False
    if not ok:
        raise ConfigError(
            f"--torch-npu {untrusted.shown(release)} is not a torch_npu release",
            "pass one like 2.7.1.post2 (matrix.toml [torch_npu.versions] lists them)",
        )
    return release


def _cached(folder: Path, release: str) -> tuple[Path, str] | None:
    """A wheel of `release` downloaded earlier, with the sha256 the index gave for it (its .json), re-hashed."""
    for meta in sorted(folder.glob(f"torch_npu-{check_release(release)}-*.whl.json")):
        try:
            data = untrusted.read_json_object(meta, None, 64 << 10)
        except untrusted.Untrusted:
            continue
        sha = data.get("sha256")
        wheel = meta.with_suffix("")
        if not isinstance(sha, str) or not wheel.is_file() or wheel.is_symlink():
            continue
        if untrusted.sha256_file(wheel) == sha:
            return wheel, sha
    return None


def fetch_wheel(
    release: str, env: Mapping[str, str], index_url: str | None, offline: bool
) -> tuple[Path, str]:
    """(path, how) of a torch_npu wheel of `release` in the cache, downloaded when missing."""
    from apexkit.index import client

    folder = wheel_cache(env)
    hit = _cached(folder, release) if folder.is_dir() else None
    if hit is not None:
        return hit[0], "cached"
    if offline:
        raise SourceError(
            f"torch_npu {release} is not in the contracts cache ({folder}) and --offline was given",
            "run nox -s contracts once with the index reachable",
        )
    settings = client.resolve_settings(index_url, env)
    session = client.Client(settings)
    wheel = None
    for index in settings.urls:
        listed = wheelindex.fetch_index(session, index)
        wheel = _pick(listed or [], release)
        if wheel is not None:
            break
    if wheel is None:
        raise SourceError(
            f"no torch_npu {release} wheel on {', '.join(log.mask(u) for u in settings.urls)}",
            "check the release (matrix.toml [stacks]) or pass --index-url",
        )
    if not wheel.sha256:
        raise SourceError(
            f"{wheel.filename}: the index gives no sha256 for it, so a download cannot be checked",
            "use an index that lists hashes (PEP 503 #sha256= / PEP 691 hashes), e.g. https://pypi.org/simple",
        )
    name = untrusted.wheel_name(wheel.filename)
    folder.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".part-")
    digest = hashlib.sha256()
    size = 0
    try:
        with os.fdopen(fd, "wb") as out:
            try:
                response = session.open(wheel.url, what=wheel.url)
            except urllib.error.HTTPError as exc:
                raise SourceError(
                    f"{client.public_url(wheel.url)}: HTTP {exc.code}", client.unreachable_hint()
                ) from None
            with response:
                while True:
                    chunk = response.read(1 << 20)
                    if not chunk:
                        break
                    size += len(chunk)
                    if size > WHEEL_MAX:
                        raise SourceError(
                            f"{name} is larger than {WHEEL_MAX >> 20} MiB: not a torch_npu wheel",
                            "check the index",
                        )
                    digest.update(chunk)
                    out.write(chunk)
        if digest.hexdigest() != wheel.sha256.lower():
            raise SourceError(
                f"{name} does not match its sha256 on the index ({digest.hexdigest()[:16]}… vs {wheel.sha256[:16]}…)",
                "run it again (a broken download); if it repeats, the index or a proxy alters the file",
            )
        untrusted.check_zip(Path(tmp))
        os.chmod(tmp, 0o644)
        os.replace(tmp, folder / name)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    _write(
        folder / f"{name}.json",
        json.dumps(
            {"sha256": digest.hexdigest(), "url": client.public_url(wheel.url), "size": size}
        )
        + "\n",
    )
    return folder / name, f"downloaded {size / 1e6:.1f} MB"


# ---------------------------------------------------------------------------------------------------------------
# Ascend apex trees: a directory given, or generated from the mirrors for a ref
# ---------------------------------------------------------------------------------------------------------------


def generate_tree(
    ref: str, env: Mapping[str, str], offline: bool, work: Path, nvidia_commit: str | None = None
) -> Path:
    """The tree a build of `ref` compiles (NVIDIA apex at the pin + npu.patch + Ascend's src/), under `work`."""
    from apexkit.plan import matrix as matrix_mod
    from apexkit.wheel import sources

    m = matrix_mod.load()
    cache = paths.cache_dir(env)
    retry = sources.RetryPolicy.from_env(env)
    ascend_url = env.get("APEXKIT_ASCEND_APEX_URL") or m.ascend_apex_url
    nvidia_url = env.get("APEXKIT_NVIDIA_APEX_URL") or m.nvidia_apex_url
    mirror = sources.Mirror(ascend_url, cache, retry)
    sha = mirror.resolve(ref, offline)
    ascend = sources.checkout_ascend(mirror, sha, work / "ascend")
    nvidia_sha = nvidia_commit or ascend.pinned_nvidia_commit() or m.nvidia_apex_commit
    nvidia = sources.Mirror(nvidia_url, cache, retry)
    nvidia.ensure_commit(nvidia_sha, offline)
    tree = work / "tree"
    sources.generate_tree(ascend, nvidia, nvidia_sha, tree)
    return tree


# ---------------------------------------------------------------------------------------------------------------
# The command
# ---------------------------------------------------------------------------------------------------------------


def stack_releases() -> list[tuple[str, str]]:
    """(torch_npu release, the stacks naming it) from matrix.toml [stacks], in the order of the file."""
    from apexkit.plan import matrix as matrix_mod

    m = matrix_mod.load()
    found: dict[str, list[str]] = {}
    for name in m.stack_names():
        release = m.stack(name).torch_npu
        if release:
            found.setdefault(release, []).append(name)
    return [(r, ", ".join(s)) for r, s in found.items()]


def known_refs() -> list[str]:
    from apexkit.plan import matrix as matrix_mod

    return list(matrix_mod.load().known_refs())


def _summary(findings: Sequence[Finding]) -> dict:
    drift = [f for f in findings if f.status == "drift"]
    return {
        "ok": not drift,
        "checked": len(findings),
        "drifts": len(drift),
        "unverified": sum(f.status == "unverified" for f in findings),
        "absent": sum(f.status == "absent" for f in findings),
        "findings": [f.__dict__ for f in findings],
    }


def drift_lines(label: str, findings: Sequence[Finding]) -> list[str]:
    return [
        f"drift: {f.name} in {label}: {f.detail} -- used at {f.where}"
        for f in findings
        if f.status == "drift"
    ]


def render_table(releases: Mapping[str, dict], refs: Mapping[str, dict]) -> str:
    """release x ref -> ok / drift: a cell is ok when both the release's and the ref's contract hold. More than six
    refs: columns are numbered, with a legend line (23 ref names do not fit across a terminal)."""
    names = list(refs) or ["-"]
    heads = names if len(names) <= 6 else [str(i) for i in range(1, len(names) + 1)]
    corner = "torch_npu / apex"
    width = max([len(corner), *(len(r) for r in releases)])
    lines = [f"{corner:<{width}}  " + "  ".join(f"{h:<5}" for h in heads).rstrip()]
    for release, result in releases.items():
        cells = [
            "ok" if result["ok"] and refs.get(ref, {"ok": True})["ok"] else "drift" for ref in names
        ]
        lines.append(
            f"{release:<{width}}  "
            + "  ".join(f"{c:<{max(5, len(h))}}" for c, h in zip(cells, heads)).rstrip()
        )
    if not releases:
        lines.append(
            f"{'-':<{width}}  "
            + "  ".join(
                f"{('ok' if refs[r]['ok'] else 'drift'):<{max(5, len(h))}}"
                for r, h in zip(names, heads)
            ).rstrip()
        )
    if heads != names:
        lines.append("apex refs: " + ", ".join(f"{h}={n}" for h, n in zip(heads, names)))
    return "\n".join(lines)


def parser(prog: str = "nox -s contracts --") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=prog,
        description="Check every name and keyword bench/ uses from torch_npu and apex against real torch_npu "
        "wheels and Ascend apex trees (read, never imported): a table release x ref -> ok/drift.",
    )
    p.add_argument(
        "--torch-npu",
        action="append",
        metavar="RELEASE",
        help="a torch_npu release to check (repeatable; default: those of matrix.toml [stacks])",
    )
    p.add_argument(
        "--wheel",
        action="append",
        type=Path,
        metavar="FILE",
        help="a torch_npu wheel file to check",
    )
    p.add_argument(
        "--ref",
        action="append",
        metavar="REF",
        help="an Ascend apex ref whose generated tree is checked (repeatable; default: master; 'all': every known ref)",
    )
    p.add_argument(
        "--apex-tree",
        action="append",
        type=Path,
        metavar="DIR",
        help="a generated apex tree (build/<target>/tree)",
    )
    p.add_argument(
        "--target",
        metavar="ID",
        help="check the wheel dist/ID was built for and write dist/ID/contracts.json",
    )
    p.add_argument("--dist", type=Path, help="the dist directory (default: dist/)")
    p.add_argument("--index-url", help="the package index for torch_npu wheels (default: pip's)")
    p.add_argument(
        "--nvidia-commit",
        metavar="SHA",
        help="the NVIDIA apex commit under the generated trees (default: the ref's scripts/build.sh pin), as for build",
    )
    p.add_argument("--offline", action="store_true", help="use cached wheels and git mirrors only")
    p.add_argument("--json", metavar="PATH", help="also write the results as JSON ('-' for stdout)")
    p.add_argument("--uses", action="store_true", help="list what bench/ uses and exit")
    return p


def _target_facts(dist: Path, target: str) -> tuple[Path, dict]:
    folder = dist / target
    manifest = folder / "manifest.json"
    try:
        data = untrusted.read_json_object(manifest, None, 4 << 20)
    except untrusted.Untrusted as exc:
        raise ConfigError(
            f"--target {untrusted.shown(target)}: cannot read {manifest} ({exc})",
            f"build it first ({vocab.build()}) or pass --dist",
        ) from None
    return folder, data


def main(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> int:
    return run(parser().parse_args(argv), os.environ if env is None else env)


def run(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    uses = scan()
    if args.uses:
        for u in uses:
            kws = f"  keywords: {', '.join(sorted(u.keywords))}" if u.keywords else ""
            print(f"{u.name}  {u.where[0]}{kws}")
        return 0
    releases: list[tuple[str, str]] = []  # (label, release or "")
    wheels: list[tuple[str, Path]] = [(w.name, w) for w in args.wheel or []]
    refs: list[str] = []
    trees: list[tuple[str, Path]] = [(str(t), t) for t in args.apex_tree or []]
    target_folder: Path | None = None
    target_pair: dict = {}
    if args.target:
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._+-]*", args.target):
            raise ConfigError(
                f"--target {untrusted.shown(args.target)} is not a target id",
                "pass the name of a folder in dist/ (e.g. py3.11-torch2.13.0-x86_64-master)",
            )
        dist = args.dist or paths.dist_dir(env)
        target_folder, manifest = _target_facts(dist, args.target)
        facts = manifest.get("target")
        facts = facts if isinstance(facts, dict) else {}
        ref = _text(facts.get("apex_ref"))
        npu = _text(facts.get("torch_npu")) or _torch_npu_for(_text(facts.get("torch")))
        if not npu or not ref:
            raise ConfigError(
                f"dist/{args.target}/manifest.json names no torch_npu release or apex ref",
                "pass --torch-npu and --ref instead of --target",
            )
        target_pair = {"torch_npu": npu, "apex_ref": ref}
        releases.append((npu, npu))
        tree_dir = (args.dist or paths.dist_dir(env)).parent / "build" / args.target / "tree"
        if tree_dir.is_dir():
            trees.append((ref, tree_dir))
        else:
            refs.append(ref)
    for r in args.torch_npu or []:
        releases.append((check_release(r), r))
    if not releases and not wheels and not args.target:
        releases = [(r, r) for r, _ in stack_releases()]
    for r in args.ref or []:
        refs.extend(known_refs() if r == "all" else [r])
    if not refs and not trees and not args.target:
        refs = ["master"]
    results_npu: dict[str, dict] = {}
    results_apex: dict[str, dict] = {}
    lines: list[str] = []
    for label, release in releases:
        path, how = fetch_wheel(release, env, args.index_url, args.offline)
        wheels.append((label, path))
        log.info(f"torch_npu {release}: {path.name} ({how})")
    given = {w for w in args.wheel or []}
    for label, path in wheels:
        hint = (
            "pass a torch_npu wheel file (.whl)"
            if path in given
            else "remove it from the cache; it is downloaded again"
        )
        results_npu[label] = _check_zip(uses, path, label, lines, hint)
    with tempfile.TemporaryDirectory(prefix="apexkit-contracts-") as tmp:
        for ref in dict.fromkeys(refs):
            work = Path(tmp) / re.sub(r"[^A-Za-z0-9._-]", "_", ref)
            tree = generate_tree(ref, env, args.offline, work, args.nvidia_commit)
            results_apex[ref] = _check_dir(uses, tree, ref, lines)
            shutil.rmtree(work, ignore_errors=True)
        for label, tree in trees:
            results_apex[label] = _check_dir(uses, tree, label, lines)
    print(render_table(results_npu, results_apex))
    for line in lines:
        print(line)
    ok = all(r["ok"] for r in [*results_npu.values(), *results_apex.values()])
    data = {
        "schema": SCHEMA,
        "checked": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "ok": ok,
        "uses": len(uses),
        "releases": results_npu,
        "refs": results_apex,
    }
    if target_folder is not None:
        data.update(target_pair)
        _write(target_folder / RESULT_FILE, json.dumps(data, indent=1) + "\n")
        print(f"wrote {target_folder / RESULT_FILE}")
    if args.json == "-":
        print(json.dumps(data, indent=1))
    elif args.json:
        _write(Path(args.json), json.dumps(data, indent=1) + "\n")
    total = sum(r["drifts"] for r in [*results_npu.values(), *results_apex.values()])
    print(f"{len(uses)} names bench/ uses; {'no drift' if ok else f'{total} drift(s)'}")
    return 0 if ok else 1


def _text(value: object) -> str:
    return value if isinstance(value, str) else ""


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fsedit.atomic_write(path, text.encode(), 0o644)


def _torch_npu_for(torch: str) -> str:
    from apexkit.plan import matrix as matrix_mod

    try:
        return matrix_mod.load().torch_npu_for(torch) if torch else ""
    except ConfigError:
        return ""


def _check_zip(
    uses: Sequence[Use],
    path: Path,
    label: str,
    lines: list[str],
    hint: str = "remove it from the cache; it is downloaded again",
) -> dict:
    try:
        tree = ZipTree(path, f"torch_npu {label}")
    except untrusted.Untrusted as exc:
        raise SourceError(f"cannot read {path}: {exc}", hint) from None
    try:
        findings = check(uses, tree, "torch_npu")
    except untrusted.Untrusted as exc:
        raise SourceError(str(exc), "is it a torch_npu wheel?") from None
    finally:
        tree.close()
    lines.extend(drift_lines(f"torch_npu {label}", findings))
    return _summary(findings)


def _check_dir(uses: Sequence[Use], root: Path, label: str, lines: list[str]) -> dict:
    if not (root / "apex").is_dir():
        raise ConfigError(
            f"{root} has no apex/ package: not a generated apex tree", "pass build/<target>/tree"
        )
    try:
        findings = check(uses, DirTree(root, f"apex {label}"), "apex")
    except untrusted.Untrusted as exc:
        raise SourceError(str(exc), "pass a generated apex tree (build/<target>/tree)") from None
    lines.extend(drift_lines(f"apex {label}", findings))
    return _summary(findings)


# `python -m tools.X ARGS` in a checkout: what its nox session runs, with apexkit's exit codes
if __name__ == "__main__":  # pragma: no cover
    run_main(main)
