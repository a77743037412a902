"""No import cycles anywhere in `exploration_trl`, imports that only go down its layers, and no module longer than one
can keep in mind.

The graph is read from the source with `ast`, so it counts every import statement, also the ones inside
functions (a lazy import still makes two modules depend on each other), relative ones resolved. Importing a
submodule runs its package's `__init__` first; that implicit step is not an edge between modules, but it is why the
graph is also checked with each subpackage as one node (`exploration_trl.<sub>`, and each module or subpackage of
`experiments/`): a cycle there is a real one at run time.

Names resolved from strings are not import statements: the lazy names of `exploration_trl` itself (its public API,
which points at every layer by design), and the module names the CLI and `exploration_trl.hub` load lazily, which
`test_string_imports_go_down` checks like imports.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE_ROOT = Path(__file__).resolve().parents[1] / "exploration_trl"
#: Longest module allowed (issue 23: one screen per job; new modules aim at ~400 lines).
MAX_MODULE_LINES = 600
#: The floors of the package, lowest first: a module imports only from floors below its own (or from its own
#: subpackage). The first floor's modules import nothing from the package; `methods` is the method registry every
#: floor reads, filled by the trainers' `@register_method`; the boundary, the only place that knows TRL's and vLLM's
#: internals, stands under both the evaluation harness (its vLLM engine) and the trainers (the TRL adapter); the
#: trainers write their model cards (`hub`) and evaluate held-out pass@k (`eval`), so both sit below them.
LAYERS = (
    ("exploration_trl",),
    ("exploration_trl.errors", "exploration_trl.io_safety", "exploration_trl.methods", "exploration_trl.archive_commit",
     "exploration_trl.weights", "exploration_trl.toy", "exploration_trl.data", "exploration_trl.core"),
    ("exploration_trl.random_model",),  # a shipped architecture at random weights, with the toy's tokenizer
    ("exploration_trl.rewards",),
    ("exploration_trl.metrics",),
    ("exploration_trl.ops",),
    ("exploration_trl.boundary",),  # the TRL adapter reads the rewards' recorded outcomes
    ("exploration_trl.eval",),
    ("exploration_trl.hub",),
    ("exploration_trl.trainers",),
    ("exploration_trl.experiments",),
    ("exploration_trl.cli",),
    # Front ends for other frameworks (verl), loaded by those frameworks only: nothing in the package imports them.
    ("exploration_trl.integrations",),
)


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


def import_graph(package: str = "", root: Path = PACKAGE_ROOT, strings: bool = False) -> dict[str, set[str]]:
    """Edges between the modules of `exploration_trl.<package>` (default: all of it) under `root`:
    `{importer: {imported, ...}}`. With `strings`, a string constant that is a module's dotted name (a lazy import by
    name) is an edge too."""
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
            elif strings and isinstance(node, ast.Constant) and isinstance(node.value, str):
                targets = [node.value]
            graph[name].update(t for t in targets if t in modules and t != name)
    return graph


def collapse(graph: dict[str, set[str]], prefix: str) -> dict[str, set[str]]:
    """The graph between the children of package `prefix` (each module or subpackage directly in it is one node, with
    every edge of the modules inside it); modules outside `prefix` are left out."""
    depth = prefix.count(".") + 2

    def node(module: str) -> str | None:
        return ".".join(module.split(".")[:depth]) if module.startswith(prefix + ".") else None

    out: dict[str, set[str]] = {}
    for src, targets in graph.items():
        if (a := node(src)) is None:
            continue
        out.setdefault(a, set())
        for t in targets:
            if (b := node(t)) is not None and b != a:
                out[a].add(b)
                out.setdefault(b, set())
    return out


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


def test_no_import_cycles_between_subpackages():
    """`exploration_trl.<sub>` as one node each: the loops hub -> eval -> hub (the model-source check) and
    trainers -> hub -> trainers (the method tables) would show here."""
    graph = collapse(import_graph(), "exploration_trl")
    assert {"exploration_trl.hub", "exploration_trl.eval", "exploration_trl.trainers"} <= set(graph)
    cycle = find_cycle(graph)
    assert cycle is None, f"import cycle between subpackages: {' -> '.join(cycle)}"


def test_no_import_cycles_between_the_experiments():
    """Each module or subpackage of `experiments/` (and of `experiments/research/`) as one node: `countdown_tiny` <->
    `curves` / `countdown_sweep` and `tree` <-> `tree_sweep` were loops (their commands, which dispatch the sweeps,
    lived in the packages)."""
    for package, members in (("exploration_trl.experiments", ("countdown_tiny", "research")),
                             (RESEARCH, ("tree", "curves"))):
        graph = collapse(import_graph(), package)
        assert {f"{package}.{m}" for m in members} <= set(graph)
        cycle = find_cycle(graph)
        assert cycle is None, f"import cycle in {package}: {' -> '.join(cycle)}"


#: The research experiments' room (issue 64, item 8): what users run for an answer (`confirm`, the demo) never
#: imports it; only the CLI names its commands (as strings, `cli/entry_point.py`).
RESEARCH = "exploration_trl.experiments.research"


def imports_of_research_from_outside(graph: dict[str, set[str]]) -> list[str]:
    def inside(module: str) -> bool:
        return module == RESEARCH or module.startswith(RESEARCH + ".")

    return sorted(f"{a} -> {b}" for a, targets in graph.items() for b in targets if inside(b) and not inside(a))


def test_nothing_outside_the_research_room_imports_it():
    graph = import_graph()
    assert any(m.startswith(RESEARCH + ".") for m in graph)
    assert "exploration_trl.experiments.confirmatory.analysis" in graph
    assert imports_of_research_from_outside(graph) == []
    demo = {"exploration_trl.experiments.demo": {f"{RESEARCH}.curves", "exploration_trl.experiments.curves_rule"}}
    assert imports_of_research_from_outside(demo) == [f"exploration_trl.experiments.demo -> {RESEARCH}.curves"]


def _floor(module: str) -> int:
    for i, floor in enumerate(LAYERS):
        if module in floor:
            return i
    raise AssertionError(f"{module} is on no floor of LAYERS: add it where its imports put it")


def _upward(graph: dict[str, set[str]]) -> list[str]:
    return sorted(f"{a} -> {b}" for a, targets in graph.items() for b in targets if _floor(b) >= _floor(a))


#: The wings of `exploration_trl.trainers`, lowest first (its `__init__` stands above them all; the boundary they stand
#: on is `exploration_trl.boundary`, a floor of the package below them): the method modules above the trainer they
#: subclass.
TRAINER_FLOORS = (
    ("exploration_trl.trainers.components", "exploration_trl.trainers.callbacks"),
    ("exploration_trl.trainers.config", "exploration_trl.trainers.context", "exploration_trl.trainers.view"),
    ("exploration_trl.trainers.strategy",),
    ("exploration_trl.trainers.base",),
    ("exploration_trl.trainers.methods",),
    ("exploration_trl.trainers.composition",),
)


def test_the_trainers_wings_import_only_down():
    """Each wing of `trainers/` (a subpackage or a module directly in it, as one node) imports only from floors below
    its own: a component or callback imports no method and not the trainer."""
    graph = collapse(import_graph(), "exploration_trl.trainers")
    assert set(graph) == {m for floor in TRAINER_FLOORS for m in floor}, sorted(graph)
    floor = {m: i for i, names in enumerate(TRAINER_FLOORS) for m in names}
    assert sorted(f"{a} -> {b}" for a, targets in graph.items() for b in targets if floor[b] >= floor[a]) == []


def test_imports_only_go_down():
    graph = collapse(import_graph(), "exploration_trl")
    graph["exploration_trl"] = {t for t in import_graph()["exploration_trl"] if t.count(".") == 1}
    assert _upward(graph) == []


def test_string_imports_go_down():
    """Module names loaded lazily from strings (the CLI's subcommands, `exploration_trl.hub`'s lazy names) point down
    like imports; only the root package's public names may point anywhere."""
    graph = collapse(import_graph(strings=True), "exploration_trl")
    assert "exploration_trl.experiments" in graph["exploration_trl.cli"]  # the subcommand table is seen
    assert _upward(graph) == []


def test_nothing_imports_the_integrations():
    """`exploration_trl.integrations.*` imports its framework (verl) at module level; the framework loads it (verl: the
    `verl.plugins` entry point), never the package, whose other modules must import without that framework."""
    graph = import_graph(strings=True)
    assert "exploration_trl.integrations.verl" in graph
    importers = sorted(a for a, targets in graph.items() if not a.startswith("exploration_trl.integrations")
                       for b in targets if b.startswith("exploration_trl.integrations"))
    assert importers == []


def test_the_floor_checks_see_a_violation(tmp_path):
    """The checkers themselves: a lazy import from a lower floor to a higher one is reported, and so is a loop that
    exists only between subpackages."""
    root = tmp_path / "exploration_trl"
    for sub in ("hub", "eval"):
        (root / sub).mkdir(parents=True)
        (root / sub / "__init__.py").write_text("")
    (root / "__init__.py").write_text("")
    (root / "hub" / "cards.py").write_text("from ..eval.results import x\n")
    (root / "eval" / "results.py").write_text("x = 1\n")
    (root / "eval" / "command.py").write_text("def f():\n    from exploration_trl.hub import cards\n")
    graph = import_graph(root=root)
    assert find_cycle(graph) is None  # no loop between modules ...
    packages = collapse(graph, "exploration_trl")
    # ... but there is one between the subpackages
    assert find_cycle(packages) == ["exploration_trl.eval", "exploration_trl.hub", "exploration_trl.eval"]
    assert _upward(packages) == ["exploration_trl.eval -> exploration_trl.hub"]


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
