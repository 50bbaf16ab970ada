"""Ensemble forecast files (netCDF/zarr) → a forecast Dataset in WeatherBench 2 conventions, plus their truth.

Seasonal/medium-range hindcast files come with their own axis names, e.g. CSTools' SEAS5 sample
(``member``, ``sdate``, ``ftime``, ``lat``, ``lon``; ``tas_seas5`` forecast and ``tas_era5`` verifying
analysis on (``sdate``, ``ftime``); a ``valid_time(sdate, ftime)`` variable) or the GCM-world reforecasts
(already ``time``/``prediction_timedelta``/``member``, truth as ``truth_<name>`` on ``valid_time``).

``open_forecast_nc(path)`` returns the forecast: dims (``time`` = initialisation, ``prediction_timedelta``
(timedelta64), ``member``, [``level``], ``latitude`` ascending, ``longitude`` in [0, 360) sorted), long
variable names, units, ``attrs["forecast_kind"] = "ensemble"``.
``open_forecast_truth(path)`` returns the verifying truth of the same file with ``time`` = VALID time
(a canonical truth store: the forecast at (init, lead) verifies against ``truth.sel(time=init + lead)``).

Lead times: a ``valid_time(init, lead)`` variable gives ``prediction_timedelta = valid_time − init``, which
must be the same for every initialisation (e.g. SEAS5 November starts: monthly means labelled Nov 1, Dec 1,
Jan 1 → 0, 30, 61 days); otherwise a lead coordinate with time units (``hours``/``days``) is used.
"""

from __future__ import annotations

from pathlib import Path
from typing import TypeVar

import numpy as np
import pandas as pd
import xarray as xr

from pipelines.canonical import VARIABLES
from pipelines.errors import DataError
from pipelines.readers._files import PathLike

X = TypeVar("X", xr.Dataset, xr.DataArray)

INIT_NAMES = ("time", "sdate", "init", "init_time", "initial_time", "forecast_reference_time", "reftime")
LEAD_NAMES = ("prediction_timedelta", "ftime", "lead", "lead_time", "leadtime", "step", "forecast_period")
MEMBER_NAMES = ("member", "number", "ensemble", "realization", "ens")
LAT_NAMES = ("latitude", "lat", "y")
LON_NAMES = ("longitude", "lon", "x")
LEVEL_NAMES = ("level", "plev", "pressure_level", "isobaricInhPa")
TRUTH_PREFIX = "truth_"
TRUTH_SUFFIX = "_truth"
# short (CF/CMIP/GRIB) names → WeatherBench 2 long names; a name's part before the first "_" counts too
SHORT_NAMES = {
    "tas": "2m_temperature", "t2m": "2m_temperature", "2t": "2m_temperature", "z": "geopotential",
    "zg": "geopotential", "t": "temperature", "ta": "temperature", "psl": "mean_sea_level_pressure",
    "msl": "mean_sea_level_pressure", "u": "u_component_of_wind", "v": "v_component_of_wind",
    "tp": "total_precipitation", "pr": "total_precipitation",
}
# sources that are verifying analyses, not forecasts, when they appear as a name suffix (tas_era5)
TRUTH_SOURCES = ("era5", "era", "obs", "analysis", "truth", "ref", "reference")


def _find(ds: xr.Dataset, names: tuple[str, ...], what: str, path: object, required: bool = True) -> str | None:
    for n in names:
        if n in ds.dims:
            return n
    if required:
        raise DataError(f"{path}: no {what} dimension; expected one of {names} (dims: {tuple(ds.dims)})")
    return None


def _long_name(name: str) -> str:
    base = name[len(TRUTH_PREFIX):] if name.startswith(TRUTH_PREFIX) else name
    base = base[: -len(TRUTH_SUFFIX)] if base.endswith(TRUTH_SUFFIX) else base
    if base in VARIABLES:
        return base
    if base.lower() in SHORT_NAMES:
        return SHORT_NAMES[base.lower()]
    head = base.split("_")[0].lower()
    return SHORT_NAMES.get(head, base)


def _is_truth_name(name: str) -> bool:
    low = name.lower()
    return low.startswith(TRUTH_PREFIX) or low.endswith(TRUTH_SUFFIX) or low.split("_")[-1] in TRUTH_SOURCES


def _open(path: PathLike) -> xr.Dataset:
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"forecast file {p} not found")
    try:
        return xr.open_zarr(p) if p.is_dir() else xr.open_dataset(p)
    except (OSError, ValueError) as err:
        raise DataError(f"{p}: cannot be opened as netCDF or zarr ({err})") from err


def _lead_timedelta(ds: xr.Dataset, init: str, lead: str, path: object) -> np.ndarray:
    coord = ds[lead]
    if np.issubdtype(coord.dtype, np.timedelta64):
        return coord.values.astype("timedelta64[ns]")
    if "valid_time" in ds.variables and set(ds["valid_time"].dims) == {init, lead}:
        valid = ds["valid_time"].transpose(init, lead).values.astype("datetime64[ns]")
        inits = ds[init].values.astype("datetime64[ns]")
        delta = valid - inits[:, None]
        if not (delta == delta[:1]).all():
            raise DataError(
                f"{path}: valid_time − {init} differs between initialisations (leads {np.unique(delta)}); "
                "expected the same lead times for every initialisation"
            )
        return delta[0]
    units = str(coord.attrs.get("units", "")).lower()
    for key, unit in (("hour", "h"), ("day", "D"), ("minute", "m")):
        if units.startswith(key):
            return (np.asarray(coord.values, np.float64) * np.timedelta64(1, unit)).astype("timedelta64[ns]")
    raise DataError(
        f"{path}: cannot turn lead {lead!r} into a time interval; expected timedelta values, a "
        f"valid_time({init}, {lead}) variable or lead units of hours/days (units: {units or 'none'})"
    )


def _grid(ds: xr.Dataset, path: object) -> xr.Dataset:
    lat = _find(ds, LAT_NAMES, "latitude", path)
    lon = _find(ds, LON_NAMES, "longitude", path)
    lev = _find(ds, LEVEL_NAMES, "level", path, required=False)
    ds = ds.rename({k: v for k, v in ((lat, "latitude"), (lon, "longitude"), (lev, "level")) if k and k != v})
    ds = normalise_grid(ds)
    if "level" in ds.dims:
        ds = ds.assign_coords(level=ds["level"].values.astype(int))
    ds["latitude"].attrs.update(units="degrees_north", standard_name="latitude")
    ds["longitude"].attrs.update(units="degrees_east", standard_name="longitude")
    return ds


def normalise_grid(ds: X) -> X:
    """``ds`` with ``longitude`` in [0, 360) ascending and ``latitude`` ascending: the one convention of every
    gridded input (forecast, truth, masks), so that inputs in −180…180 match. Returned as it is (no copy, no
    reindex) when it already follows it."""
    if "longitude" in ds.dims:
        lon = np.asarray(ds["longitude"].values, np.float64)
        if lon.size and (lon.min() < 0 or lon.max() >= 360 or np.any(np.diff(lon) <= 0)):
            ds = ds.assign_coords(longitude=np.mod(lon, 360.0)).sortby("longitude")
    if "latitude" in ds.dims and np.any(np.diff(np.asarray(ds["latitude"].values, np.float64)) <= 0):
        ds = ds.sortby("latitude")
    return ds


def _attrs(da: xr.DataArray, name: str, path: object, units: dict[str, str] | None) -> xr.DataArray:
    attrs = dict(da.attrs)
    if units and name in units:
        attrs["units"] = units[name]
    elif "units" not in attrs and name in VARIABLES:
        expected = VARIABLES[name][0]
        if expected == "K" and not 150.0 < float(da.mean()) < 350.0:
            raise DataError(f"{path}: {name} has no units and a mean of {float(da.mean()):.4g}, not kelvin; "
                            "pass units={name: ...}")
        attrs["units"] = expected
        attrs["units_note"] = "not in the file; the WeatherBench 2 unit, checked against the values' range"
    if name in VARIABLES:
        attrs.setdefault("long_name", VARIABLES[name][1])
    return da.assign_attrs(attrs)


def open_forecast_nc(path: PathLike, units: dict[str, str] | None = None) -> xr.Dataset:
    """The ensemble forecast of ``path`` in WeatherBench 2 conventions (see module docstring), lazily."""
    raw = _open(path)
    init = _find(raw, INIT_NAMES, "initialisation time", path)
    lead = _find(raw, LEAD_NAMES, "lead time", path)
    member = _find(raw, MEMBER_NAMES, "ensemble member", path)
    names = [n for n in raw.data_vars if member in raw[n].dims and not _is_truth_name(n)]
    if not names:
        raise DataError(f"{path}: no forecast variable with an ensemble dimension {member!r}")
    delta = _lead_timedelta(raw, init, lead, path)
    out = {}
    for n in names:
        long = _long_name(n)
        if long in out:
            raise DataError(f"{path}: variables {names} map to the same name {long!r}")
        out[long] = raw[n]
    ds = xr.Dataset(out).rename({init: "time", lead: "prediction_timedelta", member: "member"})
    ds = ds.assign_coords(prediction_timedelta=delta)
    ds = ds.drop_vars([c for c in ds.coords if c not in ds.dims])
    ds = _grid(ds, path)
    order = [d for d in ("time", "prediction_timedelta", "member", "level", "latitude", "longitude")]
    for n in list(ds.data_vars):
        ds[n] = _attrs(ds[n].transpose(*[d for d in order if d in ds[n].dims]), n, path, units)
    ds["prediction_timedelta"].attrs.update(standard_name="forecast_period", long_name="lead time")
    ds.attrs = {"forecast_kind": "ensemble", "source_files": str(path), "source_format": "forecast_nc",
                **{k: str(v) for k, v in raw.attrs.items() if k in ("title", "source", "note", "license")}}
    return ds


def open_forecast_truth(path: PathLike, units: dict[str, str] | None = None) -> xr.Dataset:
    """The verifying truth held in a forecast file, on ``time`` = valid time (no member dim).

    Either variables without the member dim on (init, lead) (``tas_era5``, ``<name>_truth``; put at their
    valid times init + lead) or ``truth_<name>`` on a ``valid_time`` dim.
    """
    raw = _open(path)
    member = _find(raw, MEMBER_NAMES, "ensemble member", path, required=False)
    out: dict[str, xr.DataArray] = {}
    if "valid_time" in raw.dims:
        for n in raw.data_vars:
            if "valid_time" in raw[n].dims and (member is None or member not in raw[n].dims):
                out[_long_name(n)] = raw[n].rename(valid_time="time")
        ds = xr.Dataset(out)
    else:
        init = _find(raw, INIT_NAMES, "initialisation time", path)
        lead = _find(raw, LEAD_NAMES, "lead time", path)
        delta = _lead_timedelta(raw, init, lead, path)
        names = [n for n in raw.data_vars if {init, lead} <= set(raw[n].dims)
                 and (member is None or member not in raw[n].dims) and n != "valid_time"]
        valid = raw[init].values.astype("datetime64[ns]")[:, None] + delta[None, :]
        pieces = {}
        for n in names:
            da = raw[n].transpose(init, lead, ...)
            flat = da.stack(_v=(init, lead)).transpose("_v", ...)
            flat = flat.drop_vars([c for c in flat.coords if "_v" in flat[c].dims])
            flat = flat.assign_coords(_v=valid.reshape(-1)).rename(_v="time")
            if pd.Index(flat["time"].values).has_duplicates:  # overlapping forecasts share valid times
                groups = flat.groupby("time")
                if float(abs(groups.max() - groups.min()).max()) > 0:
                    raise DataError(f"{path}: {n} differs between forecasts verifying at the same time")
                flat = groups.first()
            pieces[_long_name(n)] = flat.sortby("time")
        ds = xr.Dataset(pieces)
    if not ds.data_vars:
        raise DataError(f"{path}: no truth variable (a variable without {member!r} on the forecast's "
                        "init/lead axes, or truth_<name> on valid_time)")
    ds = _grid(ds, path)
    for n in list(ds.data_vars):
        ds[n] = _attrs(ds[n], n, path, units)
    ds.attrs = {"source_files": str(path), "source_format": "forecast_nc truth"}
    return ds
