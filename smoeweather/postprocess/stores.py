"""Forecast stores for post-processing: open an ensemble store and its truth, write a ``gaussian`` store.

An ensemble store is a zarr/netCDF in WeatherBench 2 conventions (``time`` = init, ``prediction_timedelta``,
``member``, [``level``], ``latitude``, ``longitude``, ``attrs["forecast_kind"] = "ensemble"``); any other
forecast file with recognisable axes (SEAS5-like ``sdate``/``ftime``) is converted on the fly by
:mod:`pipelines.readers.forecast_nc`. Truth: a canonical store with ``time`` = valid time, or the truth held
inside the forecast file. A ``gaussian`` store holds μ as ``<name>`` and σ as ``<name>_std`` (same units).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import xarray as xr

from pipelines.readers.forecast_nc import LEAD_NAMES, MEMBER_NAMES, TRUTH_SUFFIX, open_forecast_nc, open_forecast_truth
from smoeweather.io import atomic_path

STD_SUFFIX = "_std"


def _open_any(path: Path) -> xr.Dataset:
    if not path.exists():
        raise FileNotFoundError(f"{path} does not exist")
    return xr.open_zarr(path) if path.is_dir() else xr.open_dataset(path)


def _is_wb2_forecast(ds: xr.Dataset) -> bool:
    return ("time" in ds.dims and "prediction_timedelta" in ds.dims
            and np.issubdtype(ds["prediction_timedelta"].dtype, np.timedelta64))


Sources = str | Path | Sequence[str | Path]


def _paths(source: Sources) -> list[Path]:
    paths = [Path(source)] if isinstance(source, str | Path) else [Path(p) for p in source]
    if not paths:
        raise ValueError("no ensemble source given (a path or a list of paths was expected)")
    return paths


def _is_ens10_store(ds: xr.Dataset) -> bool:
    """A ``smoe data prepare ens10`` store: ``time`` = init, ``member``, one lead (no lead dim), truth as
    ``<name>_truth`` on the init time."""
    return "member" in ds.dims and "time" in ds.dims and "prediction_timedelta" not in ds.dims


def _ens10_lead(ds: xr.Dataset, where: str) -> np.timedelta64:
    """The one lead of an ENS-10 store: its scalar ``prediction_timedelta``, ``valid_time − time`` or the
    ``lead_time`` attribute ("48 h") that ``smoe data prepare ens10`` writes."""
    if "prediction_timedelta" in ds.coords:
        return ds["prediction_timedelta"].values.astype("timedelta64[ns]")
    if "valid_time" in ds.coords and ds["valid_time"].dims == ("time",):
        leads = np.unique(ds["valid_time"].values - ds["time"].values)
        if len(leads) == 1:
            return leads[0].astype("timedelta64[ns]")
    text = str(ds.attrs.get("lead_time", "")).replace(" ", "")
    if text:
        return pd.Timedelta(text).to_timedelta64().astype("timedelta64[ns]")
    raise ValueError(f"{where}: an ensemble store without a lead time (no prediction_timedelta dim or coord, "
                     "no valid_time, no lead_time attribute); expected a `smoe data prepare ens10` store")


def _open_one_ensemble(path: Path) -> xr.Dataset:
    ds = _open_any(path)
    if _is_ens10_store(ds) and "time" in ds.indexes and not _has_other_init_axes(ds):
        names = [n for n in ds.data_vars if "member" in ds[n].dims and not str(n).endswith(TRUTH_SUFFIX)]
        lead = _ens10_lead(ds, str(path))
        out = ds[names].drop_vars([c for c in ds[names].coords if c not in ds[names].dims])
        out = out.expand_dims(prediction_timedelta=[lead], axis=1)
        order = ("time", "prediction_timedelta", "member", "level", "latitude", "longitude")
        for n in names:
            out[n] = out[n].transpose(*[d for d in order if d in out[n].dims])
        out.attrs = dict(ds.attrs, source_format="ens10 store")
        return out.sortby("latitude")
    if not (_is_wb2_forecast(ds) and "member" in ds.dims):
        ds = open_forecast_nc(path)
    return ds.sortby("latitude") if "latitude" in ds.dims else ds


def open_ensemble(source: Sources, variables: Sequence[str] | None = None) -> xr.Dataset:
    """Ensemble forecast Dataset (lazy) in WeatherBench 2 conventions, from any supported layout.

    ``source``: one path or several (concatenated along ``time``, duplicates refused). Layouts: a
    WeatherBench 2 ensemble zarr/netCDF (``time`` = init, ``prediction_timedelta``, ``member``, [``level``],
    ``latitude``, ``longitude``), a forecast file with other axis names (gcm_ens, SEAS5 ``sdate``/``ftime``;
    :mod:`pipelines.readers.forecast_nc`) or a ``smoe data prepare ens10`` store (one lead). Only the
    variables with a ``member`` dim are kept; latitude ascending.
    """
    paths = _paths(source)
    parts = [_open_one_ensemble(p) for p in paths]
    ds = parts[0] if len(parts) == 1 else _concat_times(parts, paths)
    where = ", ".join(map(str, paths))
    names = [n for n in ds.data_vars if "member" in ds[n].dims]
    if variables:
        missing = [v for v in variables if v not in names]
        if missing:
            raise ValueError(f"{where}: no ensemble variable(s) {missing}; it has {names}")
        names = list(variables)
    if not names:
        raise ValueError(f"{where}: no variable with a 'member' dimension (an ensemble forecast was expected)")
    if ds.sizes["member"] < 2:
        raise ValueError(f"{where}: {ds.sizes['member']} member(s); post-processing needs at least 2")
    out = ds[names]
    out.attrs = dict(ds.attrs, forecast_kind="ensemble", source_files=where)
    return out


def _concat_times(parts: list[xr.Dataset], paths: list[Path]) -> xr.Dataset:
    """Concatenate per-file Datasets along ``time`` after checking that every other axis agrees."""
    first = parts[0]
    for p, ds in zip(paths[1:], parts[1:]):
        for dim in ("prediction_timedelta", "member", "level", "latitude", "longitude"):
            a = first[dim].values if dim in first.dims else None
            b = ds[dim].values if dim in ds.dims else None
            if (a is None) != (b is None) or (a is not None and (a.shape != b.shape or not np.array_equal(a, b))):
                raise ValueError(f"{p}: {dim} differs from {paths[0]}'s; ensemble files must share every axis "
                                 "except time")
    out = xr.concat(parts, dim="time", data_vars="minimal", coords="minimal", compat="override",
                    join="override", combine_attrs="drop_conflicts")
    t = pd.DatetimeIndex(out["time"].values)
    if t.has_duplicates:
        raise ValueError(f"initialisation times repeat across {[str(p) for p in paths]} "
                         f"(first {t[t.duplicated()][0]})")
    return out.sortby("time")


def _has_other_init_axes(ds: xr.Dataset) -> bool:
    """True for forecast files whose lead axis has another name (SEAS5 ``ftime``, ``step``, ``lead_time``)."""
    return any(d in ds.dims for d in LEAD_NAMES)


def _ens10_truth(ds: xr.Dataset, where: str) -> xr.Dataset:
    """``<name>_truth`` on init times of an ENS-10 store → truth on valid times (``time`` = init + lead)."""
    names = [n for n in ds.data_vars if str(n).endswith(TRUTH_SUFFIX)]
    if not names:
        raise ValueError(f"{where}: no <name>{TRUTH_SUFFIX} variable (prepare ens10 with --truth, or pass a truth)")
    lead = _ens10_lead(ds, where)
    out = ds[names].rename({n: str(n)[: -len(TRUTH_SUFFIX)] for n in names})
    out = out.drop_vars([c for c in out.coords if c not in out.dims])
    return out.assign_coords(time=ds["time"].values.astype("datetime64[ns]") + lead).sortby("latitude")


def _open_one_truth(path: Path | None, forecast_path: Path) -> xr.Dataset:
    src = path if path is not None else forecast_path
    ds = _open_any(src)
    if _is_ens10_store(ds) and "time" in ds.indexes and not _has_other_init_axes(ds):
        return _ens10_truth(ds, str(src))
    if any(m in ds.dims for m in MEMBER_NAMES) or path is None:
        try:
            return open_forecast_truth(src)
        except ValueError as err:
            if path is None:
                raise ValueError(f"{err}; pass --truth STORE (a store with the fields at the valid times)") from err
            raise
    if "time" not in ds.dims:
        raise ValueError(f"truth {src}: no 'time' dimension (valid times expected)")
    return ds.sortby("latitude") if "latitude" in ds.dims else ds


def open_truth(path: Sources | None, forecast_path: Sources) -> xr.Dataset:
    """Truth on ``time`` = valid time: from ``path`` (a canonical store, or a forecast file holding its truth),
    or, when ``path`` is None, from the forecast file(s) themselves (gcm_ens ``truth_<name>``, SEAS5
    ``<name>_era5``, ENS-10 store ``<name>_truth``). Several files: their truths are merged; a valid time held
    by two files must hold the same values."""
    if path is not None:
        parts = [_open_one_truth(p, p) for p in _paths(path)]
    else:
        parts = [_open_one_truth(None, p) for p in _paths(forecast_path)]
    if len(parts) == 1:
        return parts[0]
    out = xr.concat(parts, dim="time", data_vars="minimal", coords="minimal", compat="override",
                    join="override", combine_attrs="drop_conflicts")
    t = pd.Index(out["time"].values)
    if t.has_duplicates:
        out = out.isel(time=~t.duplicated())
    return out.sortby("time")


STATIC_FIELDS = {"land_sea_mask": ("land_sea_mask", "lsm", "land_sea"),
                 "orography": ("geopotential_at_surface", "orography", "z_surface", "surface_geopotential")}
"""Static inputs read from a file, each with the variable names it may have there."""


def open_static(source: Sources, names: Sequence[str]) -> xr.Dataset:
    """Static (latitude, longitude) fields ``names`` (keys of :data:`STATIC_FIELDS`) from the first file of
    ``source`` that holds them (latitude ascending). ValueError naming the files when one is missing."""
    out = {}
    opened = [_open_any(p) for p in _paths(source)]  # each file once, whatever the number of fields
    for name in names:
        if name not in STATIC_FIELDS:
            raise ValueError(f"unknown static field {name!r}; expected one of {sorted(STATIC_FIELDS)} or 'latitude'")
        found = next(((ds, v) for ds in opened for v in STATIC_FIELDS[name]
                      if v in ds.variables and set(ds[v].dims) >= {"latitude", "longitude"}), None)
        if found is None:
            raise ValueError(f"no static field {name!r} (any of {STATIC_FIELDS[name]}) on latitude/longitude in "
                             f"{[str(p) for p in _paths(source)]}; set data.constants to a file that has it")
        da = found[0][found[1]].sortby("latitude")
        extra = [d for d in da.dims if d not in ("latitude", "longitude")]
        out[name] = da.isel({d: 0 for d in extra}, drop=True).astype(np.float64)
    return xr.Dataset(out)


def truth_at_valid_times(forecast: xr.Dataset, truth: xr.Dataset) -> xr.Dataset:
    """``truth`` at init + lead for every (time, prediction_timedelta) of ``forecast``, on its grid/levels.

    Raises ValueError naming the variables or valid times the truth lacks.
    """
    names = [n for n in forecast.data_vars if n in truth.data_vars]
    missing = [n for n in forecast.data_vars if n not in truth.data_vars]
    if missing:
        raise ValueError(f"truth has no variable(s) {missing} (it has {list(truth.data_vars)})")
    valid = forecast["time"] + forecast["prediction_timedelta"]  # (time, prediction_timedelta)
    lacking = pd.DatetimeIndex(np.unique(valid.values)).difference(pd.DatetimeIndex(truth["time"].values))
    if len(lacking):
        raise ValueError(f"truth lacks {len(lacking)} valid time(s), first {[str(t) for t in lacking[:3]]}; "
                         "expected truth at every init + lead of the forecast")
    out = truth[names].rename(time="valid_time").sel(valid_time=valid)
    out = out.drop_vars("valid_time")
    for dim in ("latitude", "longitude", "level"):
        if dim in forecast.dims:
            if dim not in out.dims:
                raise ValueError(f"truth has no {dim!r} dimension that the forecast has")
            try:
                out = out.sel({dim: forecast[dim].values})
            except KeyError as err:
                raise ValueError(f"truth {dim} does not contain the forecast's {dim} values ({err})") from err
    return out.assign_coords({d: forecast[d] for d in ("latitude", "longitude") if d in forecast.dims})


def select_period(ds: xr.Dataset, period: Sequence[Any] | None, invert: bool = False) -> xr.Dataset:
    """Init times in [start, end] (inclusive; years like 2003 mean the whole year); ``invert``: outside."""
    if period is None:
        return ds
    start, end = (str(p) for p in period)
    t = pd.DatetimeIndex(ds["time"].values)
    lo = pd.Timestamp(start)
    hi = pd.Timestamp(f"{end}-12-31T23:59:59") if end.isdigit() and len(end) == 4 else pd.Timestamp(end)
    inside = (t >= lo) & (t <= hi)
    keep = ~inside if invert else inside
    if not keep.any():
        what = "outside" if invert else "inside"
        raise ValueError(f"no initialisation time {what} the period {start}..{end} "
                         f"(forecast inits {t.min()}..{t.max()})")
    return ds.isel(time=np.flatnonzero(keep))


def write_gaussian(mu: xr.Dataset, sigma: xr.Dataset, out: str | Path, attrs: dict[str, Any],
                   overwrite: bool = True) -> Path:
    """Write μ (``<name>``) and σ (``<name>_std``) as a ``gaussian`` forecast store (zarr, atomically)."""
    ds = xr.Dataset()
    for n in mu.data_vars:
        ds[n] = mu[n].astype(np.float32).assign_attrs(mu[n].attrs)
        ds[n + STD_SUFFIX] = sigma[n].astype(np.float32).assign_attrs(
            {**mu[n].attrs, "long_name": f"{mu[n].attrs.get('long_name', n)} (predictive standard deviation)"})
    ds.attrs = {**{k: v for k, v in attrs.items() if v is not None}, "forecast_kind": "gaussian"}
    for v in ds.variables.values():  # the source file's codecs (CF packing) need not suit the new store
        v.encoding = {}
    out = Path(out)
    with atomic_path(out, overwrite=overwrite) as tmp:
        ds.chunk({"time": 1}).to_zarr(tmp, mode="w", consolidated=True, zarr_format=2)  # as the prepared stores
    return out


def split_gaussian(ds: xr.Dataset) -> tuple[xr.Dataset, xr.Dataset]:
    """(μ, σ) Datasets of a ``gaussian`` store (``<name>`` and ``<name>_std``)."""
    names = [n for n in ds.data_vars if not n.endswith(STD_SUFFIX) and n + STD_SUFFIX in ds.data_vars]
    if not names:
        raise ValueError("not a gaussian forecast store: no <name> / <name>_std variable pair")
    return ds[names], ds[[n + STD_SUFFIX for n in names]].rename({n + STD_SUFFIX: n for n in names})
