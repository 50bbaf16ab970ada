"""Raw Copernicus Climate Data Store downloads (ERA5): GRIB through cfgrib, and netCDF.

Handles both GRIB layouts cfgrib produces (``time`` [+ ``step``] with ``valid_time`` derived; or
``number`` for ensembles, ``isobaricInhPa`` for pressure levels) and both CDS netCDF layouts (legacy
``time``/``level``/``number``; 2024+ ``valid_time``/``pressure_level``/``number``, and for forecast
fields ``forecast_reference_time``/``forecast_period``). The GRIB index file is never written
(``indexpath=""``), so read-only folders work.

Forecast steps: for ``source="cds"`` (``prepare era5``) every field is labelled with its VALID time
(init + step; ambiguous init × step layouts are refused); for ``source="ens10"`` ``time`` stays the
initialisation and the step becomes ``prediction_timedelta`` (WeatherBench 2 convention). Control
(``dataType`` cf) and perturbed (pf) messages become one ``member`` dim, 0 = control. Levels under 1 hPa
(``isobaricInPa``) become float hPa levels next to the hPa ones.
Returns the canonical Dataset: dims (time, [prediction_timedelta], [member], [level], latitude,
longitude), WB2 names and units.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd
import xarray as xr

from pipelines.canonical import canonicalize, validate
from pipelines.errors import DataError
from pipelines.readers._files import PathLike, check_grib, load_checked, open_netcdf, resolve_sources, sniff_format

GRIB_KWARGS = {"indexpath": ""}


def _open_grib(path) -> list[xr.Dataset]:
    import cfgrib

    check_grib(path)
    try:
        parts = cfgrib.open_datasets(str(path), backend_kwargs=dict(GRIB_KWARGS))
    except Exception as err:  # cfgrib raises EOFError, DatasetBuildError, …
        raise DataError(f"{path}: cfgrib cannot read this GRIB file ({err})") from err
    return parts


def _data_types(part: xr.Dataset) -> set[str]:
    return {str(v.attrs.get("GRIB_dataType", "")) for v in part.data_vars.values()}


def _members(part: xr.Dataset) -> xr.Dataset:
    """Ensemble messages (dataType cf/pf) keep ``number`` as a dim (control = 0, cfgrib gives it as a
    scalar in its own Dataset); deterministic ones (an/fc) drop cfgrib's scalar ``number``."""
    if "number" not in part.variables or "number" in part.dims:
        return part
    if _data_types(part) & {"cf", "pf"}:
        return part.expand_dims("number")
    return part.drop_vars("number")


def _valid_times(part: xr.Dataset, path: object) -> xr.Dataset:
    """Analysis view (``prepare era5``): forecast steps become VALID times ``time = init + step``.

    One init × several steps, several inits × one step, or several × several when every (init, step)
    pair gives a distinct valid time; anything else is ambiguous and raises DataError naming the file.
    """
    if "step" not in part.variables:
        return part.expand_dims("time") if "time" in part.variables and "time" not in part.dims else part
    init = part["time"].values.reshape(-1)
    step = part["step"].values.reshape(-1)
    valid = (init[:, None] + step[None, :]).reshape(-1)
    if pd.Index(valid).has_duplicates:
        raise DataError(
            f"{path}: {init.size} initialisation time(s) x {step.size} forecast step(s) "
            f"({[str(pd.Timedelta(x)) for x in step]}) give duplicated valid times; expected analyses or "
            "forecast fields that map one-to-one to valid times (prepare forecasts with kind ens10)"
        )
    part = part.drop_vars("valid_time", errors="ignore")
    for dim in ("time", "step"):
        if dim not in part.dims:
            part = part.expand_dims(dim)
    part = part.stack(valid=("time", "step")).drop_vars(["valid", "time", "step"])
    part = part.assign_coords(valid=("valid", valid)).rename({"valid": "time"}).sortby("time")
    part["time"].attrs = {"long_name": "valid time (initialisation + forecast step)"}
    return part


def _forecast_times(part: xr.Dataset) -> xr.Dataset:
    """Forecast view (ens10, WeatherBench 2 convention): ``time`` = initialisation and ``step`` (→
    ``prediction_timedelta``) as dims, even when the file holds only one of either."""
    part = part.drop_vars("valid_time", errors="ignore")
    if "step" not in part.variables:
        part = part.assign_coords(step=np.timedelta64(0, "ns"))
    for dim in ("time", "step"):
        if dim not in part.dims:
            part = part.expand_dims(dim)
    return part


def _netcdf_forecast_dims(ds: xr.Dataset) -> xr.Dataset:
    """CDS (2024+) netCDF forecast fields: ``forecast_reference_time`` → ``time`` (init),
    ``forecast_period`` → ``step`` (timedelta; hours when undecoded), the 2-D ``valid_time`` dropped."""
    if "forecast_reference_time" not in ds.dims:
        return ds
    ds = ds.drop_vars("valid_time", errors="ignore").rename(forecast_reference_time="time")
    if "forecast_period" in ds.variables:
        period = ds["forecast_period"]
        if not np.issubdtype(period.dtype, np.timedelta64):
            units = str(period.attrs.get("units", "hours")).split(" ")[0].lower()
            if units not in ("hours", "hour", "h"):
                raise DataError(f"forecast_period has units '{units}'; expected hours")
            period = period.copy(data=(np.asarray(period.values, dtype=float) * 3600e9).astype("timedelta64[ns]"))
        ds = ds.assign_coords(forecast_period=period.variable).rename(forecast_period="step")
    return ds


def _grib_parts(path, source: str) -> list[xr.Dataset]:
    """cfgrib's Datasets of one GRIB file, each with members and times in canonical meaning."""
    parts = []
    for part in _open_grib(path):
        part = _members(part)
        part = _forecast_times(part) if source == "ens10" else _valid_times(part, path)
        parts.append(canonicalize(part, source=source))
    return parts


def _merge(parts: list[xr.Dataset], path: object) -> xr.Dataset:
    try:
        return xr.merge(parts, compat="no_conflicts", join="outer", combine_attrs="drop_conflicts")
    except (ValueError, xr.MergeError) as err:
        raise DataError(
            f"{path}: the GRIB messages do not combine into one Dataset ({err}); expected one grid and "
            "no two messages for the same variable, level, member and time"
        ) from err


def open_cds_file(path: PathLike, source: str = "cds") -> xr.Dataset:
    """Open one CDS GRIB or netCDF file as a canonical Dataset (values loaded and checked)."""
    (p,) = resolve_sources(path)
    fmt = sniff_format(p)
    if fmt == "grib":
        ds = _merge(_grib_parts(p, source), p)
    else:
        raw = _netcdf_forecast_dims(open_netcdf(p))
        if "step" in raw.dims:
            raw = _forecast_times(raw) if source == "ens10" else _valid_times(raw, p)
        ds = canonicalize(raw, source=source)
    ds = load_checked(ds, p)
    ds.attrs.update(source_files=str(p), source_format=source, file_format=fmt)
    return ds


def open_cds(
    paths: PathLike | Sequence[PathLike],
    variables: Sequence[str] | None = None,
    levels: Sequence[int] | Mapping[str, Sequence[int]] | None = None,
    fill_policy: str = "error",
    check_nans: bool = True,
) -> xr.Dataset:
    """Open CDS GRIB/netCDF file(s) and combine them along ``time``.

    ``variables`` are canonical names (e.g. "geopotential"), ``levels`` in hPa (one list, or a dict
    per variable as for ``z500``/``t850`` files); both are checked and
    selected by ``validate``, which also rejects duplicated/non-monotonic times and NaNs
    (``fill_policy``). Files are loaded into memory: CDS downloads are meant to be modest; big
    archives belong in the WB2/ARCO zarr reader. ``check_nans=False`` leaves the NaN check to the
    caller (``smoe data prepare`` counts NaNs chunk by chunk while writing).
    """
    files = resolve_sources(paths)
    parts = [open_cds_file(p) for p in files]
    if len(parts) == 1:
        ds = parts[0]
    else:
        try:
            # "minimal": only fields with a time dim are concatenated; constants (land-sea mask, orography)
            # must be equal in every file and stay 2-D (the default would broadcast them along time).
            ds = xr.concat(parts, dim="time", data_vars="minimal", coords="minimal", compat="equals",
                           join="exact", combine_attrs="drop_conflicts")
        except ValueError as err:
            raise DataError(
                f"files {[str(p) for p in files]} do not share one grid, level set or "
                f"variable set ({err}); expected the same layout in every file"
            ) from err
        ds = ds.sortby("time") if ds.indexes["time"].is_unique else ds
    ds.attrs["source_files"] = ", ".join(str(p) for p in files)
    where = files[0] if len(files) == 1 else f"{files[0].parent}/{{{', '.join(p.name for p in files)}}}"
    return validate(
        ds, path=where, variables=variables, levels=levels, fill_policy=fill_policy, check_nans=check_nans
    )
