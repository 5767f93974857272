"""The import graph of hops/, autoresearch/ and experiments/ has no cycles, and the core stays free
of Hydra and MLflow.

Every `import` and `from ... import` in a module counts, wherever it sits (module level, inside a
function, under `if TYPE_CHECKING`): a function-level import that closes a cycle only defers the
cycle to the first call, it does not remove it. The graph is read from the source (an AST walk),
not from `sys.modules`, so a path no test executes is checked as well.

An edge goes to the module an import names: `from hops.engine import loop` reaches `hops.engine.loop`,
`from hops.scenario import load_scenario` reaches `hops.scenario`, `import hops.scenario` reaches
`hops.scenario`. It also goes to the packages Python initialises on the way (`hops.schedulers` for
`hops.schedulers.base`), except those the importing module sits in: they are initialising already
(a package `__init__` that re-exports its submodules is not a cycle with them). An import that
names its own package (`from . import resolve_scheduler`) is an edge to it like any other.
"""
import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("hops", "autoresearch", "experiments")

# The app is the package hops.run: the Hydra entry point, its callbacks (MLflow runs, sweep table,
# run-directory lock), terminal progress and the tracking-server probe. Everything else in hops/ is
# the core, which a library user imports without Hydra or MLflow.
# omegaconf is not on the list: hops.scenario.load_document imports it only when it is handed an
# OmegaConf config, which means the caller has loaded it already.
APP_PACKAGE = "hops.run"


def is_app(module: str) -> bool:
    return module == APP_PACKAGE or module.startswith(APP_PACKAGE + ".")


APP_ONLY_LIBRARIES = ("hydra", "mlflow")


def _modules(root=ROOT, packages=PACKAGES):
    """Module name -> source path for every .py file of the packages."""
    found = {}
    for pkg in packages:
        for path in sorted((root / pkg).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def _is_package(path):
    return path.name == "__init__.py"


def _imports(name, path, modules=()):
    """Every (imported module, line) in the file: absolute names, relative imports resolved.

    `from pkg import x` names `pkg.x` when that is a module of `modules`, else `pkg` itself.
    """
    package = name if _is_package(path) else name.rpartition(".")[0]
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(a.name, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            mod = node.module
            if node.level:
                base = package.split(".")[:len(package.split(".")) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            out += [(f"{mod}.{a.name}" if f"{mod}.{a.name}" in modules else mod, node.lineno)
                    for a in node.names]
    return out


def import_graph(root=ROOT, packages=PACKAGES):
    """Module -> {imported module of the packages: first line importing it}."""
    modules = _modules(root, packages)
    graph = {}
    for name, path in modules.items():
        edges = {}
        for mod, line in _imports(name, path, modules):
            parts = mod.split(".")
            for target in (".".join(parts[:k]) for k in range(1, len(parts) + 1)):
                if target not in modules or target == name:
                    continue
                inside = name.startswith(target + ".")  # its own package, initialising already
                if target == mod or (_is_package(modules[target]) and not inside):
                    edges.setdefault(target, line)
        graph[name] = edges
    return graph


def strongly_connected(graph):
    """Tarjan's strongly connected components with more than one module (or a self-loop)."""
    index, low, stack, on_stack, comps = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                comps.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return comps


def _describe(comp, graph):
    inside = set(comp)
    return "\n".join(f"  {a} -> {b} (line {graph[a][b]})" for a in comp for b in sorted(graph[a]) if b in inside)


def test_the_checker_finds_a_cycle_closed_by_a_function_level_import():
    graph = {"a": {"b": 1}, "b": {"c": 3}, "c": {"a": 9}, "d": {"a": 2}}
    assert strongly_connected(graph) == [["a", "b", "c"]]
    assert strongly_connected({"a": {"b": 1}, "b": {}}) == []


def test_the_checker_reads_imports_inside_functions(tmp_path):
    src = tmp_path / "m.py"
    src.write_text("import os\n\ndef f():\n    from hops.engine.loop import Engine\n    from . import sibling\n")
    names = {m for m, _ in _imports("hops.m", src, {"hops.sibling"})}
    assert names == {"os", "hops.engine.loop", "hops.sibling"}


def test_the_checker_counts_the_package_an_import_initialises(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("from . import sub\nfrom app import helper\n")
    (tmp_path / "pkg" / "sub.py").write_text("X = 1\n")
    (tmp_path / "pkg" / "user.py").write_text("def f():\n    from . import X\n")
    (tmp_path / "app").mkdir()
    (tmp_path / "app" / "__init__.py").write_text("")
    (tmp_path / "app" / "helper.py").write_text("def f():\n    import pkg.sub\n")
    graph = import_graph(tmp_path, ("pkg", "app"))
    assert graph["pkg"] == {"pkg.sub": 1, "app": 2, "app.helper": 2}  # no edge back from pkg.sub: it is inside
    assert graph["pkg.sub"] == {}
    assert graph["pkg.user"] == {"pkg": 2}  # names its own package: a cycle if pkg imported it
    assert strongly_connected(graph) == [["app.helper", "pkg"]]


def test_no_module_of_hops_autoresearch_or_experiments_is_part_of_an_import_cycle():
    graph = import_graph()
    cycles = strongly_connected(graph)
    assert not cycles, "import cycles:\n" + "\n\n".join(_describe(c, graph) for c in cycles)


@pytest.mark.parametrize("module", sorted(m for m in _modules() if m.startswith("hops") and not is_app(m)))
def test_the_core_imports_neither_hydra_nor_mlflow(module):
    path = _modules()[module]
    bad = [(m, line) for m, line in _imports(module, path) if m.split(".")[0] in APP_ONLY_LIBRARIES]
    assert not bad, f"{path.relative_to(ROOT)} imports {bad} (only {APP_PACKAGE} may)"


def test_the_core_does_not_reach_the_app_through_an_import():
    graph = import_graph()
    core = [m for m in graph if m.startswith("hops") and not is_app(m)]
    leaks = [f"{m} -> {d} (line {graph[m][d]})" for m in core for d in graph[m] if is_app(d)]
    assert not leaks, "the core imports the app:\n" + "\n".join(leaks)
