"""The import graph of ``interp``: no circles, and every import runs down a declared ladder of layers.

Read from the source with :mod:`ast`, without importing anything. An edge is an ``import`` or
``from ... import`` statement anywhere in a module (top level, inside a function, a lazy one), except
under ``if TYPE_CHECKING:``, which never runs. Its target is the deepest ``interp`` module the
statement names: ``from interp.sinks import stats`` is ``interp.sinks.stats``, ``from interp.sinks
import sink_scores`` is the package's ``__init__`` (``interp.sinks``). Names a package ``__init__``
hands out lazily by string (``__getattr__`` over a table of module names) are not imports and do not
count. The facade ``interp/__init__.py`` is exempt: it names the whole public API and imports
nothing at import time.

``LAYERS`` declares each top-level module or package's floor; an import must go to a lower floor,
or stay inside its own package (those edges are still checked for circles).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from functools import cache
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "interp"
FACADE = "interp"

# the floor of each module or package under interp/, by its dotted name below interp (the longest
# name that matches counts): an import must go to a strictly lower floor or stay in its own package
LAYERS: dict[str, float] = {
    # entry points: `python -m interp`, `python -m interp.ablate`, ...
    "__main__": 13,
    "ablate": 13,
    "patch": 13,
    "induction": 13,
    "patterns": 13,
    "roles.__main__": 13,
    "qk": 13,
    "circuit": 13,
    "report.__main__": 13,
    "sinks.__main__": 13,
    "retrieval.__main__": 13,
    "checkpoints.__main__": 13,
    # the command lines
    "cli": 12,
    # scores over training: a loop over models around the analyses (it reads the atlas's roles)
    "checkpoints": 11.5,
    # the atlas: it reads every analysis
    "report": 11,
    # the analyses as parts, one registry the atlas, the checkpoint sweep and `interp roles` loop over
    "parts": 10.75,
    # what heads write and read: reuses the head scores' registry and reductions
    "roles": 10.5,
    # the analyses
    "heads": 10,
    "sinks": 10,
    "ablation": 10,
    "retrieval": 10,
    # the retrieval roles checked by ablating their heads (window ablation), beside the scores
    "retrieval.check": 10.25,
    # task analyses built on the ablation replay (patching is an ablation kind run on task pairs)
    "patching": 10.5,
    # circuits as graphs of edges: read the task probes, the metrics and the adapters, and patching's setup
    "circuits": 10.55,
    # the long-context machinery the analyses run on: capture, blockwise passes, driver, budget
    "stream": 9,
    # what the analyses run on: probes, and the texts they are drawn from
    "probes": 8,
    "texts": 7,
    # models: loading them, the adapters behind one interface, the bundled toy (it draws its training)
    "models": 6,
    # model files that are not Hugging Face folders: GGUF files, models that packages ship
    "model_files": 5.5,
    "adapters": 5,
    "toy": 4,
    # result tables (each draws its own figure), the figures they draw (from data, never naming a
    # result class), and the kernels
    "scores": 3,
    "plots": 2,
    # the one result shape (a tidy table, its meta, save / load) and the per-head table's facts that
    # results and figures both read
    "results": 1.5,
    "kernels": 2,
    # plumbing every layer may use
    "hooks": 1,
    "names": 1,
    "_io": 1,
    "registry": 1,
    "config": 1,
    "distributed": 1,
    "browser": 1,
    "interrupts": 0,
    "_lazy": 1,
    "_version": 0,
    "lock": 1,
    "saving": 1,
    "progress": 1,
    "threads": 1,
    "memory": 1,
    "journal": 2,
    "errors": 0,
}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@cache
def modules() -> dict[str, Path]:
    """Every module of the package by dotted name (a package by its ``__init__``)."""
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def statements(node: ast.AST, annotations: bool = False) -> Iterator[ast.Import | ast.ImportFrom]:
    """The import statements under ``node`` at any depth, skipping ``if TYPE_CHECKING:`` bodies
    unless ``annotations`` (then those count too)."""
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        yield node
        return
    if isinstance(node, ast.If) and is_type_checking(node.test) and not annotations:
        children = node.orelse
    else:
        children = list(ast.iter_child_nodes(node))
    for child in children:
        yield from statements(child, annotations)


def resolve(dotted: str) -> str | None:
    """The deepest package module ``dotted`` names (``interp.sinks.sink_scores`` -> ``interp.sinks``)."""
    parts = dotted.split(".")
    for n in range(len(parts), 0, -1):
        name = ".".join(parts[:n])
        if name in modules():
            return name
    return None


def targets(name: str, stmt: ast.Import | ast.ImportFrom) -> Iterator[str]:
    if isinstance(stmt, ast.Import):
        dotted = [alias.name for alias in stmt.names]
    else:
        base = stmt.module or ""
        if stmt.level:  # relative: from the module's own package, up level - 1 packages
            package = name.split(".") if modules()[name].name == "__init__.py" else name.split(".")[:-1]
            anchor = package[: len(package) - (stmt.level - 1)]
            base = ".".join([*anchor, *([base] if base else [])])
        dotted = [f"{base}.{alias.name}" for alias in stmt.names]
    for d in dotted:
        target = resolve(d)
        if target is not None:
            yield target


@cache
def graph(annotations: bool = False) -> dict[str, set[str]]:
    """module -> the package modules it imports (the facade's edges, in or out, left out);
    ``annotations``: the imports under ``if TYPE_CHECKING:`` too."""
    edges: dict[str, set[str]] = {}
    for name, path in modules().items():
        if name == FACADE:
            continue
        tree = ast.parse(path.read_text(), filename=str(path))
        found = {t for stmt in statements(tree, annotations) for t in targets(name, stmt)}
        edges[name] = found - {name, FACADE}
    return edges


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each as a closed walk."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(walk(sorted(component), edges))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def walk(component: list[str], edges: dict[str, set[str]]) -> list[str]:
    """A shortest circle through the component's first module, inside the component (breadth first)."""
    start, members = component[0], set(component)
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(edges[v] & members):
                if w == start:
                    return [*paths[v], start]
                if w not in paths:
                    paths[w] = [*paths[v], w]
                    nxt.append(w)
        frontier = nxt
    return component  # unreachable for a strongly connected component


def top(name: str) -> str:
    """The module or package directly under ``interp`` that ``name`` belongs to."""
    return name.split(".")[1]


def layer(name: str) -> int | None:
    """``name``'s floor: the longest of its dotted prefixes (below ``interp``) that LAYERS lists."""
    parts = name.split(".")[1:]
    for n in range(len(parts), 0, -1):
        found = LAYERS.get(".".join(parts[:n]))
        if found is not None:
            return found
    return None


def climbs(edges: dict[str, set[str]]) -> list[tuple[str, str]]:
    """Edges that leave their own package for a floor that is not strictly lower."""
    return sorted((a, b) for a, bs in edges.items() for b in bs if top(a) != top(b) and layer(b) >= layer(a))


def floor(name: str) -> str:
    return f"{name} (floor {layer(name)})"


def test_every_module_has_a_floor():
    missing = sorted(n for n in modules() if n != FACADE and layer(n) is None)
    assert not missing, f"add these to LAYERS in {Path(__file__).name}: {missing}"


def test_the_graph_sees_lazy_imports_and_skips_type_checking(tmp_path):
    """The walker itself: a lazy import counts, one under TYPE_CHECKING does not, relative ones resolve."""
    source = (
        "from typing import TYPE_CHECKING\n"
        "from . import tables\n"
        "if TYPE_CHECKING:\n"
        "    from interp.report import atlas\n"
        "else:\n"
        "    import interp.errors\n"
        "def f():\n"
        "    from ..models import describe\n"
        "    from interp.sinks import sink_scores\n"
    )
    tree = ast.parse(source)
    found = {t for stmt in statements(tree) for t in targets("interp.sinks.stats", stmt)}
    assert found == {"interp.sinks.tables", "interp.errors", "interp.models", "interp.sinks"}


def test_no_import_cycles_and_every_import_runs_down():
    edges = graph()
    lines = []
    found = cycles(edges)
    if found:
        lines.append("import cycles among interp modules:")
        for c in found:
            inside = sorted((a, b) for a in set(c) for b in edges[a] if b in c)
            lines.append("  " + " -> ".join(c))
            lines.append("    its edges: " + ", ".join(f"{a} -> {b}" for a, b in inside))
    up = climbs(edges)
    if up:
        lines.append("imports that do not run down the layers (LAYERS in this file):")
        lines += [f"  {floor(a)} -> {floor(b)}" for a, b in up]
    assert not lines, "\n".join(lines)


# circles closed only by an annotation-only import (a result naming its renderer's module, the renderer
# naming the result class for checkers) that are still to be cut: a renderer takes data, not the result.
# Each is the shortest circle through the first module of its component (sinks.summary, which names
# SinkReport too, sits in the sinks one)
def test_no_import_cycles_even_through_annotations():
    """No circle, counting the imports under ``if TYPE_CHECKING:`` as edges: a renderer takes data (or
    a protocol of what it reads), never the class of the result it draws."""
    found = cycles(graph(annotations=True))
    assert not found, "import cycles through annotations: " + "; ".join(" -> ".join(c) for c in found)


def test_the_annotation_graph_sees_type_checking_imports():
    tree = ast.parse("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from interp.scores import HeadScores\n")
    assert {t for stmt in statements(tree) for t in targets("interp.plots.grid", stmt)} == set()
    found = {t for stmt in statements(tree, annotations=True) for t in targets("interp.plots.grid", stmt)}
    assert found == {"interp.scores"}
