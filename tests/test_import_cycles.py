"""No import cycles anywhere in `exploration_trl`, and no module longer than one can keep in mind.

The graph is read from the source with `ast`, so it counts every import statement, also the ones inside
functions (a lazy import still makes two modules depend on each other). Importing a submodule runs its
package's `__init__` first; that implicit step is not an edge, but an explicit import of the package from one
of its own modules is.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE_ROOT = Path(__file__).resolve().parents[1] / "exploration_trl"
#: Longest module allowed (issue 23: one screen per job; new modules aim at ~400 lines).
MAX_MODULE_LINES = 600


def _modules(package: str, root: Path) -> dict[str, Path]:
    """`{dotted module name: file}` for the package and its submodules (`__init__` is the package itself);
    `package=""` is the whole of `exploration_trl`."""
    root = root / package if package else root
    prefix = f"exploration_trl.{package}" if package else "exploration_trl"
    out = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join([prefix, *parts])] = path
    return out


def _resolve(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".")
    base = base if is_package else base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def import_graph(package: str = "", root: Path = PACKAGE_ROOT) -> dict[str, set[str]]:
    """Edges between the modules of `exploration_trl.<package>` (default: all of it) under `root`:
    `{importer: {imported, ...}}`."""
    modules = _modules(package, root)
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        is_package = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
            targets = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = _resolve(name, is_package, node)
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
            graph[name].update(t for t in targets if t in modules and t != name)
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle as `[a, b, ..., a]`, or None when the graph is acyclic."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (cycle := visit(start)):
            return cycle
    return None


def test_no_import_cycles_in_the_whole_package():
    graph = import_graph()
    assert len(graph) > 50, "the package's modules were not found"
    assert "exploration_trl.trainers.base" in graph and "exploration_trl.experiments.demo" in graph
    cycle = find_cycle(graph)
    assert cycle is None, f"import cycle in exploration_trl: {' -> '.join(cycle)}"


def test_no_module_is_longer_than_the_limit():
    too_long = {
        str(path.relative_to(PACKAGE_ROOT.parent)): n
        for path in sorted(PACKAGE_ROOT.rglob("*.py"))
        if (n := len(path.read_text(encoding="utf-8").splitlines())) > MAX_MODULE_LINES
    }
    assert not too_long, f"modules over {MAX_MODULE_LINES} lines (split them by job): {too_long}"


def test_cycle_finder_sees_lazy_and_relative_imports(tmp_path):
    """The checker itself: a function-level import and a relative import close a cycle it must report."""
    pkg = tmp_path / "exploration_trl" / "demo"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from .b import g\n")
    (pkg / "b.py").write_text("def g():\n    from exploration_trl.demo.a import x\n")
    (pkg / "c.py").write_text("from exploration_trl.demo import a\n")
    graph = import_graph("demo", tmp_path / "exploration_trl")
    assert graph["exploration_trl.demo.c"] == {"exploration_trl.demo.a"}
    assert find_cycle(graph) == ["exploration_trl.demo.a", "exploration_trl.demo.b", "exploration_trl.demo.a"]
    (pkg / "b.py").write_text("def g():\n    pass\n")
    assert find_cycle(import_graph("demo", tmp_path / "exploration_trl")) is None
