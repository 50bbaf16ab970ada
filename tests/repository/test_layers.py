"""Imports run one way: every import of the package, in-function ones included, goes from a layer to
the same or a lower one; ``metrics`` is pure (numpy/xarray/scipy/scikit-learn, nothing of the package).

The layer order is written here and in docs/development.md, nowhere else.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

LAYERS: tuple[tuple[str, ...], ...] = (
    ("pipelines",),
    ("smoeweather", "smoeweather.io", "smoeweather.config", "smoeweather.metrics", "smoeweather.resources"),
    ("smoeweather.data", "smoeweather.heat.data", "smoeweather.vision.data"),
    ("smoeweather.nn",),
    ("smoeweather.models", "smoeweather.heat.models", "smoeweather.vision.models"),
    ("smoeweather.training", "smoeweather.vision.task"),
    ("smoeweather.forecast", "smoeweather.postprocess"),
    ("smoeweather.evaluate", "smoeweather.plotting", "smoeweather.heat.plots", "smoeweather.vision.plots"),
    ("smoeweather.interop",),
    ("smoeweather.studies", "smoeweather.demo", "smoeweather.heat.table", "smoeweather.vision.table"),
    ("smoeweather.commands", "smoeweather.cli", "smoeweather.__main__"),
)
"""Lowest first. A module may import its own layer and the layers below it, never one above."""


def layer_of(module: str) -> int | None:
    """Index in :data:`LAYERS` of the longest prefix that names ``module`` (None: not ours)."""
    best, best_len = None, -1
    for i, prefixes in enumerate(LAYERS):
        for p in prefixes:
            if (module == p or module.startswith(p + ".")) and len(p) > best_len:
                best, best_len = i, len(p)
    return best


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path) -> list[tuple[int, str]]:
    """(line, imported module) of every import statement in the file, at any depth (functions included)."""
    return imports_in(path.read_text(), module_name(path), path.name == "__init__.py")


def imports_in(source: str, me: str, is_package: bool) -> list[tuple[int, str]]:
    """(line, imported module) of every import in ``source`` of module ``me``, at any depth; ``from a import
    b`` yields ``a.b`` (b may be a submodule); relative imports are resolved against ``me``."""
    package = me if is_package else me.rpartition(".")[0]
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*up, *([base] if base else [])])
            out += [(node.lineno, f"{base}.{a.name}" if a.name != "*" else base) for a in node.names]
    return out


def sources() -> list[Path]:
    return sorted([*(REPO / "smoeweather").rglob("*.py"), *(REPO / "pipelines").rglob("*.py")])


def test_layer_table_covers_every_package() -> None:
    """Every module of smoeweather and pipelines has a layer (a new package must be placed in LAYERS)."""
    unplaced = [module_name(p) for p in sources() if layer_of(module_name(p)) is None]
    assert not unplaced, f"modules without a layer in LAYERS: {unplaced}"


def test_imports_run_one_way() -> None:
    upward = []
    for path in sources():
        me = module_name(path)
        mine = layer_of(me)
        for line, target in imports(path):
            theirs = layer_of(target)
            if theirs is not None and mine is not None and theirs > mine:
                upward.append(f"{path.relative_to(REPO)}:{line}: {me} (layer {mine}) imports {target} "
                              f"(layer {theirs})")
    assert not upward, "imports from a lower layer to a higher one:\n" + "\n".join(upward)


def test_metrics_are_pure() -> None:
    """smoeweather.metrics imports nothing of the package but itself (pure xarray/numpy in and out)."""
    bad = [f"{p.relative_to(REPO)}:{line}: {t}" for p in (REPO / "smoeweather" / "metrics").rglob("*.py")
           for line, t in imports(p)
           if (t.startswith(("smoeweather", "pipelines")) and not t.startswith("smoeweather.metrics"))
           or t.split(".")[0] in ("torch", "lightning")]
    assert not bad, bad


@pytest.mark.parametrize("code, target", [
    ("from smoeweather.postprocess.emos import fit_emos", "smoeweather.postprocess.emos.fit_emos"),
    ("import smoeweather.evaluate", "smoeweather.evaluate"),
    ("from ..forecast import output", "smoeweather.forecast.output"),
])
def test_the_walker_sees_in_function_and_relative_imports(code: str, target: str) -> None:
    """An upward import hidden in a method of a class in a function is found and placed in its layer."""
    source = f"import numpy\n\ndef f():\n    class C:\n        def g(self):\n            {code}\n"
    found = imports_in(source, "smoeweather.data.example", is_package=False)
    assert found[-1] == (6, target) and layer_of(target) > layer_of("smoeweather.data.example")
