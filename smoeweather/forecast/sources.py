"""Open forecast inputs and truths: a prepared zarr store, a canonical netCDF file or several (glob/list).

Whatever the source, the result is a lazy canonical Dataset (WeatherBench 2 long names, ``latitude``
ascending, ``longitude`` in [0, 360)): netCDF files go through :func:`pipelines.canonical.canonicalize`;
prepared stores already are canonical.
"""

from __future__ import annotations

import glob
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import xarray as xr

from smoeweather.data.weather import Field, field_name

Source = str | Path | Sequence[str | Path]


def describe(source: Source) -> str:
    """The source as one provenance string (absolute paths)."""
    if isinstance(source, str | Path):
        s = str(source)
        return s if "://" in s else str(Path(s).resolve())
    return ", ".join(describe(s) for s in source)


def _files(source: Source) -> list[str]:
    if not isinstance(source, str | Path):
        return [f for s in source for f in _files(s)]
    s = str(source)
    if any(c in s for c in "*?["):
        found = sorted(glob.glob(s))
        if not found:
            raise FileNotFoundError(f"no files match {s}")
        return found
    return [s]


def open_source(source: Source) -> xr.Dataset:
    """Lazy canonical Dataset of a prepared store (zarr directory) or canonical netCDF file(s)."""
    files = _files(source)
    for f in files:
        if "://" not in f and not Path(f).exists():
            raise FileNotFoundError(f"data source {f} does not exist")
    if len(files) == 1 and (Path(files[0]).is_dir() or files[0].endswith(".zarr")):
        ds = xr.open_zarr(files[0])
    else:
        from pipelines.canonical import canonicalize

        if len(files) == 1:
            ds = xr.open_dataset(files[0], chunks={})
        else:
            ds = xr.open_mfdataset(files, combine="nested", concat_dim="time", data_vars="minimal",
                                   coords="minimal", compat="override", chunks={})
        ds = canonicalize(ds)
    if "latitude" not in ds.dims or "longitude" not in ds.dims:
        raise ValueError(f"{describe(source)}: expected dims latitude and longitude, got {dict(ds.sizes)}")
    ds = ds.assign_coords(longitude=np.mod(ds["longitude"], 360.0))
    return ds.sortby(["latitude", "longitude"])


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
