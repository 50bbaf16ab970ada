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


def git_commit() -> str | None:
    """The full commit hash of the git checkout this code runs from (``-dirty`` appended with local changes),
    or None when it is not run from one (an installed wheel)."""
    here = Path(__file__).resolve().parent
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=here,
                             timeout=10).stdout.strip()
        if not sha:
            return None
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                               text=True, cwd=here, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return f"{sha}-dirty" if dirty else sha
