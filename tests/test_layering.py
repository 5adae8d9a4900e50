"""The import graph under ``interp/``: the engine machinery and the model adapters sit below the
analyses, with no circle among them.

Imports are read with ``ast`` (module level, function bodies included; ``if TYPE_CHECKING:`` blocks
excluded, as they never run). ``interp/stream`` and ``interp/adapters`` may import only modules
below them, never an analysis, and no import circle may pass through either package.
"""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "interp"
LOW = ("interp.stream", "interp.adapters")
ALLOWED_BELOW = (  # what the machinery may use
    "interp.stream",
    "interp.adapters",
    "interp.errors",
    "interp.hooks",
    "interp.models",
    "interp.kernels",
    "interp.config",
    "interp.registry",
    "interp.toy",
)


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def imports_of(path: Path, modules: set[str]) -> set[str]:
    """The ``interp`` modules ``path`` imports (a ``from pkg import sub`` counts ``pkg.sub``)."""
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names if f"{node.module}.{a.name}" in modules)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text()))
    return {m for m in found if m in modules}


def graph() -> dict[str, set[str]]:
    paths = {module_name(p): p for p in ROOT.rglob("*.py")}
    return {name: imports_of(path, set(paths)) - {name} for name, path in paths.items()}


def cycles_through(g: dict[str, set[str]], start: str) -> list[list[str]]:
    """Import circles that pass through ``start`` (a parent package importing its own submodule
    and that submodule importing a sibling through the package is how packages load; skipped)."""
    found, stack = [], [(start, [start])]
    while stack:
        node, path = stack.pop()
        for nxt in g.get(node, ()):
            if nxt == start and not path[-1].startswith(start + "."):
                found.append(path + [start])
            elif nxt not in path and not nxt.startswith(start + ".") and len(path) < 12:
                stack.append((nxt, path + [nxt]))
    return found


def test_machinery_imports_only_downward():
    g = graph()
    for name, deps in g.items():
        if name.startswith(LOW):
            upward = sorted(d for d in deps if not d.startswith(ALLOWED_BELOW))
            assert not upward, f"{name} imports {upward}: the engine and adapters must not reach up"


def test_no_import_circle_through_the_machinery():
    g = graph()
    for name in g:
        if name.startswith(LOW):
            assert not cycles_through(g, name), (name, cycles_through(g, name)[:3])
