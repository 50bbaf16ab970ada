"""Notebooks are executed so they cannot rot, and the stored copies the docs site renders hold their outputs.

The site shows each notebook as stored (the docs build does not execute it, so CI runs each notebook once):
refresh the stored outputs with `.venv/bin/python notebooks/execute.py` after changing a notebook or the code it
calls. The test below re-executes every notebook from scratch and fails on any error.
"""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

NOTEBOOKS = sorted((Path(__file__).resolve().parents[2] / "notebooks").glob("*.ipynb"))


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_runs(path: Path, tmp_path: Path) -> None:
    nb = nbformat.read(path, as_version=4)
    NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}).execute()
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []) if o.output_type == "error"]
    assert not errors


def test_there_are_notebooks() -> None:
    assert NOTEBOOKS, "notebooks/ must hold at least one notebook"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_stored_notebook_is_executed(path: Path) -> None:
    """What the site renders: every code cell run once, top to bottom, in one kernel, no error, no huge output."""
    nb = nbformat.read(path, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code, f"{path.name} has no code"
    counts = [c.get("execution_count") for c in code]
    assert counts == list(range(1, len(code) + 1)), (
        f"{path.name}: stored outputs are stale or partial (execution counts {counts}); "
        "run `.venv/bin/python notebooks/execute.py " + f"notebooks/{path.name}`")
    errors = [o for c in code for o in c.get("outputs", []) if o.output_type == "error"]
    assert not errors, f"{path.name} was stored with an error output"
    assert path.stat().st_size < 800_000, f"{path.name} is {path.stat().st_size} bytes; downscale its images"
