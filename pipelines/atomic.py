"""Atomic writes: a failed or interrupted run never leaves a file or store that looks complete.

``--overwrite`` never loses data either: the old target is renamed aside, the new one renamed into its
place, and only then is the old one deleted. A crash between any two of these steps leaves either the
old or the new target in place (and possibly a hidden ``.NAME.*.old`` sibling to remove by hand).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any


def _remove(path: Path) -> None:
    """Delete a file or a directory tree."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink()


def _sibling(target: Path, suffix: str) -> Path:
    """A fresh, unused hidden sibling path of ``target`` (nothing is left at it)."""
    path = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=suffix, dir=target.parent))
    path.rmdir()
    return path


def replace_atomically(new: Path, target: Path) -> None:
    """Move ``new`` onto ``target``: rename the old target aside, rename ``new`` in, delete the old one.

    If renaming ``new`` in fails, the old target is renamed back, so ``target`` always exists
    afterwards when it existed before.
    """
    if not target.exists():
        os.replace(new, target)
        return
    old = _sibling(target, ".old")
    os.replace(target, old)  # step 1: old aside
    try:
        os.replace(new, target)  # step 2: new into place
    except BaseException:
        os.replace(old, target)  # undo step 1
        raise
    _remove(old)  # step 3: only now is the old data gone


@contextlib.contextmanager
def atomic_path(target: str | Path, overwrite: bool = False) -> Iterator[Path]:
    """Yield a temporary sibling path; move it onto ``target`` only if the block succeeds.

    Works for files and directories (zarr stores). Raises FileExistsError when ``target`` exists and
    ``overwrite`` is False. On error the temporary path is removed and ``target`` is untouched.
    """
    target = Path(target)
    if target.exists() and not overwrite:
        raise FileExistsError(f"{target} already exists (pass --overwrite to replace it)")
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = _sibling(target, ".tmp")  # the caller creates a file or a directory here
    try:
        yield tmp
        replace_atomically(tmp, target)
    finally:
        if tmp.exists():
            _remove(tmp)


def write_json(path: str | Path, obj: Any) -> None:
    """Write JSON atomically (indent 2)."""
    with atomic_path(path, overwrite=True) as tmp:
        tmp.write_text(json.dumps(obj, indent=2, default=float) + "\n")


def write_text(path: str | Path, text: str) -> None:
    """Write a text file atomically."""
    with atomic_path(path, overwrite=True) as tmp:
        tmp.write_text(text)


def string_char_encoding(ds: Any) -> dict[str, dict[str, Any]]:
    """Encodings that store every string variable and coordinate of ``ds`` as a netCDF char array.

    xarray's default for strings in netCDF4 files is the variable-length string type, and netCDF-C (all
    netCDF4 wheels to date) crashes the process with a segmentation fault when such a file is opened again
    while an earlier handle to it is still open (Unidata/netcdf4-python#1444, pydata/xarray#8289): a notebook
    that holds ``scores.nc`` open and then runs ``smoe plot scores`` on it would die. Char arrays (``S1`` plus
    a string-length dimension, UTF-8) read back as the same strings and do not trigger it.
    """
    return {name: {"dtype": "S1"} for name in string_variables(ds)}


def string_variables(ds: Any) -> list[str]:
    """Names of the variables and coordinates of ``ds`` that hold strings (unicode, bytes, or objects that
    are str/bytes, as netCDF strings read back)."""
    return [str(name) for name, var in ds.variables.items()
            if var.dtype.kind in "US" or (var.dtype.kind == "O" and var.size
                                          and isinstance(var.values.flat[0], str | bytes))]


def write_netcdf(ds: Any, path: str | Path, overwrite: bool = True,
                 encoding: dict[str, dict[str, Any]] | None = None, **to_netcdf: Any) -> Path:
    """Write the xarray Dataset ``ds`` to ``path`` as netCDF4, atomically, strings as char arrays
    (:func:`string_char_encoding`); ``encoding`` adds per-variable encodings (e.g. zlib) on top."""
    enc = string_char_encoding(ds)
    for name, e in (encoding or {}).items():
        enc[name] = {**enc.get(name, {}), **e}
    path = Path(path)
    with atomic_path(path, overwrite=overwrite) as tmp:
        ds.to_netcdf(tmp, encoding=enc, **to_netcdf)
    return path
