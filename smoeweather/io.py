"""Atomic writes for smoeweather outputs (checkpoints aside): re-exported from :mod:`pipelines.atomic`.

The implementation lives in ``pipelines`` because data flows one way (pipelines → smoeweather):
``pipelines`` must stand alone, and ``smoeweather`` may import it, never the reverse.
"""

from __future__ import annotations

from pipelines.atomic import atomic_path, replace_atomically, write_json, write_netcdf, write_text

__all__ = ["atomic_path", "replace_atomically", "write_json", "write_netcdf", "write_text"]
