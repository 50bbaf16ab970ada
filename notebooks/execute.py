"""Execute notebooks in place so that the stored copies (rendered by the docs site) hold current outputs.

    .venv/bin/python notebooks/execute.py                       # every notebook in notebooks/
    .venv/bin/python notebooks/execute.py notebooks/NAME.ipynb  # one or more

Each notebook runs from a fresh temporary working directory, as in tests/repository/test_notebooks.py (which re-executes
every notebook and fails on any error). Prints each notebook's wall time.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

HERE = Path(__file__).resolve().parent


def execute(path: Path, timeout: int = 600) -> float:
    nb = nbformat.read(path, as_version=4)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        NotebookClient(nb, timeout=timeout, kernel_name="python3", resources={"metadata": {"path": tmp}}).execute()
    seconds = time.perf_counter() - started
    nbformat.write(nb, path)
    return seconds


if __name__ == "__main__":
    paths = [Path(p) for p in sys.argv[1:]] or sorted(HERE.glob("*.ipynb"))
    for p in paths:
        print(f"{p.name}: {execute(p):.0f} s", flush=True)
