"""CMIP6 (and CMIP5) CMOR netCDF: several files per variable, concatenated in time, regridded.

CMOR layout: ``<variable_id>_<table_id>_<source_id>_<experiment_id>_<variant>_<grid>_<dates>.nc``,
variables ``zg`` (geopotential HEIGHT, m → ×G to geopotential), ``ta``, ``ua``, ``va``, ``hus``,
``tas``…, coordinates ``time`` (cftime calendars), ``plev`` (Pa → hPa), ``lat``/``lon`` with bounds.

Calendar policy: times are decoded with cftime, then converted to numpy ``datetime64`` (proleptic
Gregorian) when every date of the file exists there: "standard", "gregorian", "proleptic_gregorian",
"noleap"/"365_day" (a no-leap axis simply has no 29 February). "360_day", "all_leap"/"366_day" and
"julian" keep cftime objects (a conversion would invent or move dates). The original calendar is kept
in ``attrs["calendar_original"]``.

Regridding uses xarray-regrid: ``conservative`` (area-weighted, for fluxes and means) or ``bilinear``
(``.regrid.linear``). xarray-regrid itself pads a wrapped longitude column for global grids (periodic
in longitude) and pads the poles for conservative regridding, so no hand-written padding is needed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import numpy as np
import xarray as xr

from pipelines.canonical import canonicalize, validate
from pipelines.errors import DataError
from pipelines.grids import regrid
from pipelines.readers._files import PathLike, open_netcdf, resolve_sources

CONVERTIBLE_CALENDARS = {"standard", "gregorian", "proleptic_gregorian", "noleap", "365_day"}


def _open_one(path) -> xr.Dataset:
    coder = xr.coders.CFDatetimeCoder(use_cftime=True)
    ds = open_netcdf(path, decode_times=coder, chunks={})
    calendar = ds["time"].encoding.get("calendar", "standard") if "time" in ds else None
    ds = canonicalize(ds, source="cmip6")
    ds.attrs["calendar_original"] = str(calendar)
    return ds


def _to_datetime64(ds: xr.Dataset, calendar: str) -> xr.Dataset:
    if calendar not in CONVERTIBLE_CALENDARS:
        return ds
    times = ds["time"].values
    converted = np.array([np.datetime64(t.isoformat(), "ns") for t in times])
    return ds.assign_coords(time=("time", converted, ds["time"].attrs))


def _check_same_grid(parts: list[xr.Dataset], files: list) -> None:
    ref = parts[0]
    for ds, path in zip(parts[1:], files[1:]):
        for dim in ("latitude", "longitude", "level"):
            a, b = ref.get(dim), ds.get(dim)
            if (a is None) != (b is None) or (
                a is not None and (a.size != b.size or not np.allclose(a.values, b.values))
            ):
                raise DataError(
                    f"{path}: {dim} differs from {files[0]} ({0 if b is None else b.size} vs "
                    f"{0 if a is None else a.size} values); expected one grid in all files"
                )
        if set(ds.data_vars) != set(ref.data_vars):
            raise DataError(
                f"{path}: variables {sorted(ds.data_vars)} differ from {files[0]}'s "
                f"{sorted(ref.data_vars)}; expected the same variable in every file"
            )


def open_cmip6(
    paths: PathLike | Sequence[PathLike],
    target_grid: xr.Dataset | None = None,
    method: Literal["conservative", "bilinear"] = "conservative",
    variables: Sequence[str] | None = None,
    levels: Sequence[int] | None = None,
    fill_policy: str = "error",
    check_nans: bool = True,
) -> xr.Dataset:
    """Open CMOR file(s), concatenate along time, canonicalize and (optionally) regrid.

    Files must share grid and variable; their times must not overlap (checked by ``validate``).
    ``target_grid``: a Dataset with ``latitude``/``longitude`` (e.g. ``weatherbench_grid()``);
    ``None`` keeps the model grid. Result dims: (time, [level], latitude, longitude). Lazy (dask)
    except for the NaN check on the model grid; ``check_nans=False`` defers it.
    """
    files = resolve_sources(paths)
    parts = [_open_one(p) for p in files]
    _check_same_grid(parts, files)
    calendars = {p.attrs["calendar_original"] for p in parts}
    if len(calendars) > 1:
        raise DataError(f"files {[str(f) for f in files]} mix calendars {sorted(calendars)}; expected one")
    (calendar,) = calendars
    order = np.argsort([p["time"].values[0] for p in parts])
    ds = xr.concat(
        [parts[i] for i in order],
        dim="time",
        join="override",
        combine_attrs="drop_conflicts",
        data_vars="all",
    )
    ds = _to_datetime64(ds, calendar)
    ds.attrs.update(
        calendar_original=calendar,
        source_format="cmip6",
        source_files=", ".join(str(files[i]) for i in order),
    )
    where = files[0] if len(files) == 1 else f"{files[0].parent}/{{{', '.join(f.name for f in files)}}}"
    ds = validate(
        ds, path=where, variables=variables, levels=levels, fill_policy=fill_policy, check_nans=check_nans
    )
    if target_grid is not None:
        ds = regrid(ds, target_grid, method, what=str(where))
    return ds
