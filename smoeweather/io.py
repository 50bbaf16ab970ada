"""Atomic writes: a failed or interrupted run never leaves a file or store that looks complete."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any


@contextlib.contextmanager
def atomic_path(target: str | Path, overwrite: bool = False) -> Iterator[Path]:
    """Yield a temporary sibling path; rename it onto ``target`` only if the block succeeds.

    Works for files and directories (zarr stores). Raises FileExistsError when ``target`` exists and
    ``overwrite`` is False. On error the temporary path is removed and ``target`` is untouched.
    """
    target = Path(target)
    if target.exists() and not overwrite:
        raise FileExistsError(f"{target} already exists (pass --overwrite to replace it)")
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent))
    tmp.rmdir()  # the caller creates a file or a directory here
    try:
        yield tmp
        if target.exists():
            shutil.rmtree(target) if target.is_dir() else target.unlink()
        os.replace(tmp, target)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp) if tmp.is_dir() else tmp.unlink()


def write_json(path: str | Path, obj: Any) -> None:
    """Write JSON atomically (indent 2)."""
    with atomic_path(path, overwrite=True) as tmp:
        tmp.write_text(json.dumps(obj, indent=2, default=float) + "\n")


def write_text(path: str | Path, text: str) -> None:
    """Write a text file atomically."""
    with atomic_path(path, overwrite=True) as tmp:
        tmp.write_text(text)
