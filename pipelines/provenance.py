"""Provenance of what the project writes: the code version stamped into stores, model files and studies."""

from __future__ import annotations

import subprocess
from pathlib import Path


def code_version() -> str:
    """The installed smoeweather version, plus ``+g<commit>`` (``-dirty`` with local changes) when run from a
    git checkout: ``0.1.0+g1a2b3c4d5e6f``."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        installed = version("smoeweather")
    except PackageNotFoundError:  # a plain checkout on PYTHONPATH
        installed = "0+unknown"
    try:
        sha = subprocess.run(["git", "describe", "--always", "--dirty", "--abbrev=12"], capture_output=True,
                             text=True, cwd=Path(__file__).resolve().parent, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        sha = ""
    return f"{installed}+g{sha}" if sha else installed
