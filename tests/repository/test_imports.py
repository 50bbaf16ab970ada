"""One-way imports: every module of ``smoeweather/`` and ``pipelines/`` is parsed (ast; imports inside functions
count too) and its imports must point at its own layer or one below, with no import cycle anywhere.

Layers, lowest first: the one table, :data:`test_layers.LAYERS` (also in docs/development.md). A new package must
be placed in it.
"""

from __future__ import annotations

import ast
import sys
from collections import defaultdict
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
ROOTS = ("smoeweather", "pipelines")

from test_layers import LAYERS  # noqa: E402 - the one layer table (test_layers.py and docs/development.md)

FORBIDDEN: dict[tuple[str, str], str] = {
    # (importer prefix, imported prefix): why; a known case is listed in KNOWN until it is moved
    ("smoeweather.plotting", "smoeweather.models.loader"): "plotting draws; loading checkpoints and extracting "
                                                           "routing belongs below it (e.g. models/routing.py)",
}
KNOWN: dict[tuple[str, str], str] = {}


def modules() -> dict[str, Path]:
    """Dotted name → file of every module under :data:`ROOTS` (a package by its ``__init__``)."""
    out: dict[str, Path] = {}
    for root in ROOTS:
        for path in sorted((REPO / root).rglob("*.py")):
            parts = list(path.relative_to(REPO).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(parts)] = path
    return out


def import_graph() -> dict[str, set[str]]:
    """Module → the modules of :data:`ROOTS` it imports (anywhere in its body; ``from a import b`` → ``a.b``
    when ``b`` is a module, else ``a``)."""
    mods = modules()

    def resolve(name: str) -> str | None:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = defaultdict(set)
    for name, path in mods.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")
                    base = ".".join(parts[: len(parts) - node.level + 1] + ([node.module] if node.module else []))
                targets = [f"{base}.{a.name}" for a in node.names]
            for target in targets:
                if target.split(".")[0] in ROOTS and (found := resolve(target)) not in (None, name):
                    graph[name].add(found)
    return graph


def layer_of(module: str) -> int:
    """Index in :data:`LAYERS` of the longest entry that is ``module`` or a package above it."""
    best, level = "", -1
    for i, names in enumerate(LAYERS):
        for entry in names:
            if (module == entry or module.startswith(entry + ".")) and len(entry) > len(best):
                best, level = entry, i
    return level


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    sys.setrecursionlimit(max(10_000, sys.getrecursionlimit()))
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

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
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(set(graph) | {w for ws in graph.values() for w in ws}):
        if v not in index:
            visit(v)
    return found


def test_every_module_has_a_layer() -> None:
    unplaced = sorted(m for m in modules() if layer_of(m) < 0)
    assert not unplaced, f"place these modules in LAYERS of tests/repository/test_imports.py: {unplaced}"


def test_no_import_cycles() -> None:
    assert cycles(import_graph()) == []


def test_no_upward_imports() -> None:
    upward = sorted(f"{a} ({LAYERS[layer_of(a)][0]}) imports {b} ({LAYERS[layer_of(b)][0]})"
                    for a, targets in import_graph().items() for b in targets if layer_of(b) > layer_of(a))
    assert upward == []


@pytest.mark.parametrize("rule", sorted(FORBIDDEN), ids=lambda r: f"{r[0]}-x-{r[1]}")
def test_forbidden_imports(rule: tuple[str, str], request: pytest.FixtureRequest) -> None:
    if rule in KNOWN:
        request.applymarker(pytest.mark.xfail(reason=KNOWN[rule], strict=True))
    importer, imported = rule
    hits = sorted(f"{a} imports {b}" for a, targets in import_graph().items() for b in targets
                  if (a == importer or a.startswith(importer + "."))
                  and (b == imported or b.startswith(imported + ".")))
    assert hits == [], f"{FORBIDDEN[rule]}: {hits}"


def test_the_checker_sees_a_cycle_and_an_upward_import() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert layer_of("smoeweather.training.registry") > layer_of("smoeweather.models.loader")
    assert layer_of("smoeweather.studies.run") > layer_of("smoeweather.evaluate")
