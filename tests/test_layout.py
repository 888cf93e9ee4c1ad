"""Issue 15: the package reads like the data flow, and its import graph has no cycle.

Each module's imports of other apexkit modules are read with `ast` (module level and inside functions alike: a lazy
import inside a function still ties the two modules together); the graph must be acyclic, the shared modules at the top
of apexkit/ must not reach into the concern packages, and every flat module is one of the shared ones."""

from __future__ import annotations

import ast
from pathlib import Path

from conftest import ROOT

PACKAGE = ROOT / "apexkit"
PACKAGES = {"build", "proxy", "images", "matrix", "doctor", "validate"}
# the small shared modules everything may use; they import only each other
SHARED = {"errors", "log", "proc", "fsedit", "paths", "locks", "urls", "untrusted", "checks", "vocab", "pins", "cann",
          "systools", "testtools", "exits"}
EDGE = {"cli", "commands", "__main__", "__init__"}  # the command edge: dispatches to every package


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py")) if "_data" not in p.parts}


def imports(path: Path, known: set[str]) -> set[str]:
    """The apexkit modules `path` imports (`from apexkit.x import y` counts as apexkit.x.y when that is a module)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("apexkit."))
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "apexkit" \
                and node.level == 0:
            for alias in node.names:
                child = f"{node.module}.{alias.name}"
                found.add(child if child in known else node.module)
    return found - {"apexkit"}


def graph() -> dict[str, set[str]]:
    mods = modules()
    known = set(mods)
    return {name: {i for i in imports(path, known) if i in known and i != name} for name, path in mods.items()}


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    found, state, stack = [], {}, []

    def visit(node: str) -> None:
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(g.get(node, ())):
            if state.get(nxt) == "open":
                found.append([*stack[stack.index(nxt):], nxt])
            elif nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = "done"

    for node in sorted(g):
        if node not in state:
            visit(node)
    return found


def test_the_import_graph_has_no_cycle():
    g = graph()
    assert len(g) > 40  # every module was read
    assert cycles(g) == [], "import cycles: " + "; ".join(" -> ".join(c) for c in cycles(g))


def test_the_cycle_finder_finds_one():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == [["a", "b", "c", "a"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_flat_modules_are_the_shared_ones_and_packages_are_the_concerns():
    flat = {p.stem for p in PACKAGE.glob("*.py")}
    assert flat == SHARED | EDGE, f"a flat module that belongs in a package: {sorted(flat - SHARED - EDGE)}"
    folders = {p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").is_file()}
    assert folders == PACKAGES


def test_shared_modules_do_not_reach_into_the_concern_packages():
    g = graph()
    for name, targets in g.items():
        if name.count(".") == 1 and name.split(".")[1] in SHARED:
            into = sorted(t for t in targets if t.count(".") >= 2 or t.split(".")[1] in PACKAGES)
            assert not into, f"{name} (shared) imports {into}"
