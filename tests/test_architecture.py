"""The architecture, held by the import graph (issue #28): the engine's packages are layers, each importing only
those below it; nothing imports in a circle; the engine imports none of what calls it. The graph is read from the
source, imports inside functions and under ``TYPE_CHECKING`` included."""

import ast
from pathlib import Path

import pytest

LMCALC = Path(__file__).resolve().parent.parent / "lmcalc"

ENGINE_LAYERS = [
    {"choices"},
    {"model"},  # parameters, FLOPs, number formats
    {"finetune"},  # what is trained: the method, its FLOPs, offloading
    {"workload"},
    {"model_code", "parallel"},  # what the model's code keeps; the layout, its stages and shards
    {"memory", "time"},  # neither imports the other
    {"search", "inference", "run"},  # what asks memory and time
]
"""The engine's packages (and top modules), lowest first: a module imports the engine only from its own package or
from a lower layer, so two packages of one layer never import each other."""

ENGINE_MAY_IMPORT = {
    "lmcalc.specs",
    "lmcalc.recipe_specs",
    "lmcalc.framework_specs",
    "lmcalc.errors",
    "lmcalc.units",
    "lmcalc.result",
}
"""What the engine may import from the rest of lmcalc: the specs it computes from, its errors, units and the result
objects it returns. Never the presets (YAML), the estimates, the command line, the renderers or torch."""


def modules() -> dict[str, Path]:
    found = {}
    for path in LMCALC.rglob("*.py"):
        parts = path.relative_to(LMCALC.parent).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The lmcalc modules ``name`` imports anywhere in its source (a name imported from a package is its submodule
    where one exists, else the package)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name.split(".")[0] == "lmcalc"}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(
                    [*package.split(".")[: len(package.split(".")) - node.level + 1], *filter(None, [base])]
                )
            if base.split(".")[0] != "lmcalc":
                continue
            for alias in node.names:
                found.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base)
    return found - {name}


GRAPH = {name: imports(name, path, modules()) for name, path in modules().items()}


def engine_unit(module: str) -> str | None:
    """The engine package or top module that ``module`` belongs to (``lmcalc.engine.memory.terms``: memory)."""
    parts = module.split(".")
    return parts[2] if len(parts) > 2 and parts[:2] == ["lmcalc", "engine"] else None


def layer(unit: str) -> int:
    return next(i for i, units in enumerate(ENGINE_LAYERS) if unit in units)


def test_every_engine_module_has_a_layer():
    units = {engine_unit(m) for m in GRAPH} - {None}
    assert units <= set().union(*ENGINE_LAYERS), sorted(units - set().union(*ENGINE_LAYERS))


def test_the_engine_imports_only_from_below():
    wrong = []
    for module, imported in GRAPH.items():
        unit = engine_unit(module)
        if unit is None:
            continue
        for target in imported:
            other = engine_unit(target)
            if other is None:
                if target not in ENGINE_MAY_IMPORT and target != "lmcalc.engine":
                    wrong.append(f"{module} imports {target}, outside the engine")
            elif other != unit and layer(other) >= layer(unit):
                wrong.append(f"{module} imports {target}: {other} is not below {unit}")
    assert not wrong, "\n".join(sorted(wrong))


def test_no_module_imports_in_a_circle():
    """Tarjan's strongly connected components: any component of more than one module is a circle."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles = []

    def visit(module: str) -> None:  # recursive: the graph is some 150 modules deep at most
        index[module] = low[module] = len(index)
        stack.append(module)
        for target in GRAPH.get(module, ()):
            if target not in GRAPH:
                continue
            if target not in index:
                visit(target)
                low[module] = min(low[module], low[target])
            elif target in stack:
                low[module] = min(low[module], index[target])
        if low[module] == index[module]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == module:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for module in sorted(GRAPH):
        if module not in index:
            visit(module)
    assert not circles, circles


@pytest.mark.parametrize(
    ("graph", "circular"),
    [({"a": {"b"}, "b": {"c"}, "c": set()}, False), ({"a": {"b"}, "b": {"c"}, "c": {"a"}}, True)],
)
def test_the_circle_check_can_fail(graph, circular, monkeypatch):
    monkeypatch.setattr(__import__(__name__), "GRAPH", graph)
    if circular:
        with pytest.raises(AssertionError):
            test_no_module_imports_in_a_circle()
    else:
        test_no_module_imports_in_a_circle()
