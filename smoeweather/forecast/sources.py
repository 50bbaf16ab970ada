"""Forecast inputs read from canonical data (opened by :func:`smoeweather.data.forecast_stores.open_canonical`): the
training years of a prepared store, field checks, and one field at given times."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import xarray as xr

from smoeweather.data.weather import Field, field_name


def open_statistics_years(store: str | Path) -> tuple[int, int] | None:
    """The training years recorded in a prepared store's ``statistics`` group, or None."""
    try:
        attrs = xr.open_zarr(str(store), group="statistics").attrs
    except Exception:  # noqa: BLE001 - no statistics group (a plain canonical file): no recorded years
        return None
    years = attrs.get("train_years")
    return (int(years[0]), int(years[-1])) if years else None


def check_fields(ds: xr.Dataset, fields: Sequence[Field], where: str, constants: Sequence[str] = ()) -> None:
    """ValueError naming ``where`` when a (variable, level) field or a constant is missing from ``ds``."""
    levels = [int(v) for v in ds["level"].values] if "level" in ds.dims else []
    for name, level in fields:
        label = field_name((name, level))
        if name not in ds.data_vars:
            raise ValueError(f"{where}: needs variable {name!r} ({label}); available: {sorted(ds.data_vars)}")
        if "time" not in ds[name].dims:
            raise ValueError(f"{where}: {name!r} has no time dim")
        if level is not None and ("level" not in ds[name].dims or level not in levels):
            have = levels if "level" in ds[name].dims else "none"
            raise ValueError(f"{where}: needs {label} but {name!r} has levels {have}")
        if level is None and "level" in ds[name].dims:
            raise ValueError(f"{where}: {name!r} has levels {levels}; name one, e.g. {name}_{levels[0]}")
    for c in constants:
        if c != "latitude" and c not in ds.data_vars:
            raise ValueError(f"{where}: needs constant {c!r}; available: {sorted(ds.data_vars)}")


def read_field(ds: xr.Dataset, field: Field, times: np.ndarray) -> xr.DataArray:
    """One field at ``times`` (loaded, float32), dims (time, [member], latitude, longitude)."""
    name, level = field
    da = ds[name].sel(time=times)
    if level is not None:
        da = da.sel(level=level, drop=True)
    return da.astype(np.float32).load()
