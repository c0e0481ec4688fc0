"""The package's layers: no import circle, no import from a lower layer to a higher one.

The layer order is declared once, in docs/architecture.md (the fenced block under
"Layers"), top floor first. Every import in `mpiemu/` counts: module-level, inside a
function, under `TYPE_CHECKING`. A room may import its own layer and the layers below it.
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "mpiemu"
ARCH = ROOT / "docs" / "architecture.md"


def declared_layers(text: str) -> list[list[str]]:
    """The layers of docs/architecture.md, bottom first: each a list of top-level rooms."""
    m = re.search(r"^## Layers\b.*?^```text\n(.*?)^```", text, re.S | re.M)
    assert m, "docs/architecture.md has no ```text block under '## Layers'"
    rows = [line.split("#")[0].split() for line in m.group(1).splitlines()]
    return [r for r in rows if r][::-1]


def module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _resolve(mod: str, is_pkg: bool, node: ast.ImportFrom) -> str:
    """The absolute module an ImportFrom names (before its imported names)."""
    if node.level == 0:
        return node.module or ""
    base = mod.split(".") if is_pkg else mod.split(".")[:-1]
    base = base[:len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def imports_of(path: Path, modules: set[str]) -> set[str]:
    """The modules of ours that a file imports (a `from pkg import name` of a submodule
    counts as importing that submodule)."""
    mod, is_pkg = module_name(path), path.name == "__init__.py"
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = _resolve(mod, is_pkg, node)
            subs = [f"{base}.{a.name}" for a in node.names]
            targets = [s for s in subs if s in modules] or [base]
        else:
            continue
        for t in targets:
            while t and t not in modules:        # `import a.b.c` of a name, not a module
                t = t.rpartition(".")[0]
            if t.startswith("mpiemu") and t != mod:
                out.add(t)
    return out


def import_graph() -> dict[str, set[str]]:
    files = sorted(PKG.rglob("*.py"))
    modules = {module_name(f) for f in files}
    return {module_name(f): imports_of(f, modules) for f in files}


def room(mod: str) -> str:
    """The top-level room a module lives in (`mpiemu.comm.ring` -> `comm`)."""
    parts = mod.split(".")
    return parts[1] if len(parts) > 1 else ""


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def upward(graph: dict[str, set[str]], layers: list[list[str]]) -> list[str]:
    """Imports from a room to a room of a higher layer ('a -> b')."""
    floor = {r: i for i, rooms in enumerate(layers) for r in rooms}
    return sorted(f"{a} -> {b}" for a, deps in graph.items() for b in deps
                  if room(a) and room(b) and floor[room(a)] < floor[room(b)])


def test_the_layer_order_names_every_room_once() -> None:
    layers = declared_layers(ARCH.read_text())
    named = [r for rooms in layers for r in rooms]
    assert len(named) == len(set(named)), f"a room named twice: {named}"
    rooms = {room(m) for m in import_graph()} - {""}
    assert rooms == set(named), (f"rooms without a layer: {sorted(rooms - set(named))}; "
                                 f"layers without a room: {sorted(set(named) - rooms)}")


def test_no_import_circle() -> None:
    found = circles(import_graph())
    assert not found, "import circles:\n" + "\n".join(" <-> ".join(c) for c in found)


def test_no_import_runs_up_a_layer() -> None:
    bad = upward(import_graph(), declared_layers(ARCH.read_text()))
    assert not bad, "imports from a lower layer to a higher one:\n" + "\n".join(bad)


@pytest.mark.parametrize("graph, found", [
    ({"mpiemu.a.x": {"mpiemu.b.y"}, "mpiemu.b.y": {"mpiemu.a.x"}}, 1),
    ({"mpiemu.a.x": {"mpiemu.b.y"}, "mpiemu.b.y": set()}, 0),
])
def test_the_circle_finder_finds_circles(graph: dict[str, set[str]], found: int) -> None:
    assert len(circles(graph)) == found


def test_an_upward_import_is_caught() -> None:
    layers = [["b"], ["a"]]                                  # bottom first: b, then a above
    assert upward({"mpiemu.b.y": {"mpiemu.a.x"}, "mpiemu.a.x": set()}, layers) == \
        ["mpiemu.b.y -> mpiemu.a.x"]
    assert upward({"mpiemu.a.x": {"mpiemu.b.y"}, "mpiemu.b.y": set()}, layers) == []
