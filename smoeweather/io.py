"""Atomic, never-clobbering writes for smoeweather outputs (checkpoints aside): re-exported from
:mod:`pipelines.atomic`, whose docstring describes the API (``check_output`` before computing, then
``with atomic_output(path, overwrite, kind="dir"|"file") as tmp:``; ``check_output(path, overwrite,
inputs=[...])`` also refuses an output that is, contains or lies inside an input), and the names taken from
files made safe for paths (:func:`safe_component`) and terminals (:func:`printable`).

The implementation lives in ``pipelines`` because data flows one way (pipelines → smoeweather):
``pipelines`` must stand alone, and ``smoeweather`` may import it, never the reverse.
"""

from __future__ import annotations

from pipelines.atomic import (
    OutputError,
    OutputExistsError,
    atomic_files,
    atomic_output,
    atomic_path,
    check_apart,
    check_output,
    clean_leftovers,
    printable,
    replace_atomically,
    safe_component,
    work_dir,
    write_json,
    write_netcdf,
    write_text,
)

__all__ = ["OutputError", "OutputExistsError", "atomic_files", "atomic_output", "atomic_path", "check_apart",
           "check_output", "clean_leftovers", "printable", "replace_atomically", "safe_component", "work_dir",
           "write_json", "write_netcdf", "write_text"]
