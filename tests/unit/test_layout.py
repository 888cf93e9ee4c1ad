"""The package reads like the data flow: no import cycle between modules, no two packages importing each other, and
the walls of the design hold.

Every import of an apexkit module is read with `ast`, module level and inside functions alike (a lazy import inside a
function still ties the two modules together). A *unit* is a package (apexkit/wheel/) or a flat module (apexkit/log.py);
the unit graph must have no two-way tie and no cycle, the shared modules must not reach into the packages, nothing but
the command edge imports the edge, and the walls: the wheel build knows nothing of images, indexes, clusters or proxies;
the plan is pure; bench/ never imports apexkit; apexkit never imports torch; apexkit never imports the dev tools."""

from __future__ import annotations

import ast
from pathlib import Path

from conftest import ROOT

PACKAGE = ROOT / "apexkit"
PACKAGES = {"plan", "wheel", "images", "proxy", "index", "fleet", "doctor", "install"}
# the small shared modules everything may use; they import only each other
SHARED = {
    "errors",
    "log",
    "proc",
    "fsedit",
    "paths",
    "locks",
    "urls",
    "config",
    "untrusted",
    "cachetrust",
    "checks",
    "vocab",
    "cann",
    "dockerclient",
    "statusfile",
    "pipconfig",
    "netenv",
    "envvars",
    "declare",
}
CONCERNS = {
    "venvrun",
    "up",
}  # concerns that are one module (validate/bench in the wheel's venv; apexkit up)
EDGE = {
    "cli",
    "commands",
    "exits",
    "noxrun",  # the nox sessions' door: one invocation's sessions agree on the wheel and share -- ARGS
    "__main__",
    "__init__",
}  # the command edge: dispatches to every package
# what each unit must never import (DESIGN.md, Boundaries)
NEVER = {
    "plan": PACKAGES - {"plan"} | CONCERNS | EDGE,
    "wheel": {"images", "proxy", "index", "fleet", "doctor", "install"} | CONCERNS | EDGE,
    "proxy": {"wheel", "images", "index", "fleet", "doctor", "install"} | CONCERNS | EDGE,
    "index": {"images", "proxy", "fleet", "doctor", "install"} | CONCERNS | EDGE,
    # apexkit install: a venv, an index, a build through the edge's build_wheel (passed in), never a container
    "install": {"images", "proxy", "fleet", "doctor"} | CONCERNS | EDGE,
}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py")) if "_data" not in p.parts}


def imported(path: Path) -> set[str]:
    """Every module name an import statement in `path` names (`from a.b import c` gives a.b and a.b.c)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names)
    return found


def graph() -> dict[str, set[str]]:
    mods = modules()
    return {
        name: {i for i in imported(path) if i in mods and i not in (name, "apexkit")}
        for name, path in mods.items()
    }


def unit(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def unit_graph(g: dict[str, set[str]]) -> dict[str, set[str]]:
    units: dict[str, set[str]] = {}
    for name, targets in g.items():
        units.setdefault(unit(name), set()).update(
            unit(t) for t in targets if unit(t) != unit(name)
        )
    return units


def two_way_ties(g: dict[str, set[str]]) -> list[tuple[str, str]]:
    return sorted(
        {tuple(sorted((a, b))) for a, targets in g.items() for b in targets if a in g.get(b, set())}
    )


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    found, state, stack = [], {}, []

    def visit(node: str) -> None:
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(g.get(node, ())):
            if state.get(nxt) == "open":
                found.append([*stack[stack.index(nxt) :], nxt])
            elif nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = "done"

    for node in sorted(g):
        if node not in state:
            visit(node)
    return found


def test_the_module_graph_has_no_cycle():
    g = graph()
    assert len(g) > 50  # every module was read
    assert cycles(g) == [], "import cycles: " + "; ".join(" -> ".join(c) for c in cycles(g))


def test_no_two_packages_import_each_other_and_the_packages_form_no_cycle():
    units = unit_graph(graph())
    assert set(units) >= PACKAGES
    assert two_way_ties(units) == []
    assert cycles(units) == [], "package cycles: " + "; ".join(
        " -> ".join(c) for c in cycles(units)
    )


def test_the_finders_find_what_they_look_for():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == [["a", "b", "c", "a"]]
    assert cycles({"a": {"b"}, "b": set()}) == []
    assert two_way_ties({"a": {"b"}, "b": {"a", "c"}, "c": set()}) == [("a", "b")]
    # a lazy import inside a function ties two packages as a module-level one does
    assert unit_graph(
        {
            "apexkit.wheel.builder": {"apexkit.images.container"},
            "apexkit.images.container": {"apexkit.wheel.options"},
        }
    ) == {"wheel": {"images"}, "images": {"wheel"}}


def test_flat_modules_are_the_shared_ones_the_edge_or_a_named_concern():
    flat = {p.stem for p in PACKAGE.glob("*.py")}
    assert flat == SHARED | EDGE | CONCERNS, (
        f"a flat module that belongs in a package: {sorted(flat - SHARED - EDGE)}"
    )
    folders = {p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").is_file()}
    assert folders == PACKAGES


def test_shared_modules_import_only_shared_ones():
    for name, targets in graph().items():
        if unit(name) in SHARED:
            into = sorted(t for t in targets if unit(t) not in SHARED)
            assert not into, f"{name} (shared) imports {into}"


def test_only_the_edge_imports_the_edge():
    for name, targets in graph().items():
        if unit(name) not in EDGE:
            into = sorted(t for t in targets if unit(t) in EDGE - {"__init__"})
            assert not into, f"{name} imports the command edge {into}"


def test_the_walls_of_the_design():
    units = unit_graph(graph())
    for name, never in NEVER.items():
        assert not units[name] & never, f"apexkit/{name} imports {sorted(units[name] & never)}"
    for path in sorted(PACKAGE.rglob("*.py")):
        names = {n.split(".")[0] for n in imported(path)}
        assert not names & {"torch", "torch_npu", "apex", "tools"}, (
            f"{path.relative_to(ROOT)} imports {names}"
        )
    for path in sorted((ROOT / "bench").rglob("*.py")):  # bench/probes too
        assert "apexkit" not in {n.split(".")[0] for n in imported(path)}, (
            f"{path.relative_to(ROOT)} imports apexkit"
        )


def test_every_apexkit_dotted_name_the_docs_give_exists():
    """After the house move, a doc that names `apexkit.matrix.refresh.read_metadata` sends a reader (or their
    `python -c "from ..."`) to a module that is gone: every apexkit.x.y a Markdown file names imports, or is an
    attribute of a module that does."""
    import importlib
    import re

    skip = {".git", ".nox", ".venv", "build", "dist", "node_modules"}
    missing = []
    for doc in sorted(PACKAGE.parent.rglob("*.md")):
        if skip & set(doc.relative_to(PACKAGE.parent).parts):
            continue
        for name in set(re.findall(r"\bapexkit(?:\.[A-Za-z_][A-Za-z0-9_]*)+", doc.read_text())):
            if name == "apexkit.toml":  # the project config file (apexkit.config), not a module
                continue
            parts = name.split(".")
            for cut in range(len(parts), 0, -1):
                try:
                    found: object = importlib.import_module(".".join(parts[:cut]))
                except ImportError:
                    continue
                try:
                    for attr in parts[cut:]:
                        found = getattr(found, attr)
                except AttributeError:
                    missing.append(f"{doc.relative_to(PACKAGE.parent)}: {name}")
                break
            else:
                missing.append(f"{doc.relative_to(PACKAGE.parent)}: {name}")
    assert missing == []
