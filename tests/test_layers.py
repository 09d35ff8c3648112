"""The layer order the README draws, held by the code's imports (no Spark, no PostgreSQL).

core <- bronze <- capture <- silver <- gold <- marts <- commands: a module imports only from
its own layer and the layers before it, so no cycle can form between layers. Each layer is a
folder of the repository installed as a subpackage of the one import package (``capture/`` is
``pgmedallion.capture``); the folder ``commands/`` is the top layer (CLI, pipeline), installed
as ``pgmedallion`` itself.
Imports sit at module top, except where a module states why below.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LAYERS = ["core", "bronze", "capture", "silver", "gold", "marts", "commands"]

# Modules allowed to import project code inside functions, and why.
LAZY_IMPORTS = {
    "bronze/engines.py": "bronze's Spark writer loads pyspark, which a local capture never needs",
    "commands/cli.py": "a command imports only what it runs (no pyspark for `capture`)",
    "commands/pipeline.py": "a stage's modules load only when it runs (silver: ~0.2 s more)",
    "commands/demo.py": "the demo starts PostgreSQL before importing the Spark side",
    "commands/status.py": "status reads local tables by delta-rs: bronze's Spark reader "
    "(pyspark) loads only where a table is not local",
    "commands/checks.py": "type overrides are judged with silver's Spark types, and doctor "
    "runs where PySpark is not installed",
}


def _layer(module: str) -> str | None:
    """The layer a module name belongs to (None: not this project)."""
    parts = module.split(".")
    if parts[0] != "pgmedallion":
        return None
    return parts[1] if len(parts) > 1 and parts[1] in LAYERS[:-1] else "commands"


def _module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts[:-1] if rel.name == "__init__" else rel.parts)
    return ".".join(["pgmedallion", *(parts[1:] if parts[0] == "commands" else parts)])


def _modules() -> list[Path]:
    return sorted(p for layer in LAYERS for p in (ROOT / layer).rglob("*.py"))


def _imports(path: Path) -> list[tuple[str, bool, int]]:
    """(module imported, inside a function?, line) for every import of a project package."""
    found: list[tuple[str, bool, int]] = []

    def walk(node: ast.AST, nested: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Import):
                names = [a.name for a in child.names]
            elif isinstance(child, ast.ImportFrom) and child.level == 0 and child.module:
                names = [child.module]
            else:
                names = []
            for name in names:
                if _layer(name) is not None:
                    found.append((name, nested, child.lineno))
            inner = isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            walk(child, nested or inner)

    walk(ast.parse(path.read_text(), str(path)), False)
    return found


def test_every_layer_package_exists_and_has_modules():
    for layer in LAYERS:
        assert (ROOT / layer / "__init__.py").is_file(), layer
    assert len(_modules()) > 40


@pytest.mark.parametrize("layer", LAYERS)
def test_a_layer_imports_only_itself_and_the_layers_before_it(layer):
    rank = LAYERS.index(layer)
    wrong = []
    for path in sorted((ROOT / layer).rglob("*.py")):
        for name, _, line in _imports(path):
            if LAYERS.index(_layer(name)) > rank:
                wrong.append(f"{path.relative_to(ROOT)}:{line} imports {name}")
    assert wrong == []


def test_project_imports_sit_at_module_top_unless_a_reason_is_stated():
    wrong = []
    for path in _modules():
        rel = path.relative_to(ROOT).as_posix()
        if rel in LAZY_IMPORTS:
            continue
        for name, nested, line in _imports(path):
            if nested:
                wrong.append(f"{rel}:{line} imports {name} inside a function")
    assert wrong == []


def _cycles(nested_too: bool) -> list[list[str]]:
    graph: dict[str, set[str]] = {}
    for path in _modules():
        module = _module_name(path)
        graph[module] = {name for name, nested, _ in _imports(path) if nested_too or not nested}
    for module in graph:
        graph[module] = {n if n in graph else n.rsplit(".", 1)[0] for n in graph[module]}

    state: dict[str, int] = {}
    cycles: list[list[str]] = []

    def visit(node: str, trail: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                cycles.append(trail[trail.index(nxt) :] + [nxt] if nxt in trail else [node, nxt])
            elif nxt in graph and nxt not in state:
                visit(nxt, trail + [nxt])
        state[node] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    return cycles


def test_no_cycle_among_modules_imported_at_module_top():
    assert _cycles(nested_too=False) == []


def test_no_two_modules_import_each_other_even_inside_functions():
    assert _cycles(nested_too=True) == []


def test_the_checker_sees_a_wrong_import(tmp_path):
    """The checks above are not vacuous: an upward import and a nested one are found."""
    bad = tmp_path / "bad.py"
    bad.write_text(
        "import pgmedallion.gold.build\n\ndef f():\n    from pgmedallion.silver.build import run\n"
    )
    assert _imports(bad) == [
        ("pgmedallion.gold.build", False, 1),
        ("pgmedallion.silver.build", True, 4),
    ]
    assert [_layer(name) for name, _, _ in _imports(bad)] == ["gold", "silver"]
    assert _layer("pgmedallion.cli") == "commands" and _layer("pyspark.sql") is None
