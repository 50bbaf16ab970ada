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

from pipelines.readers.forecast_nc import MEMBER_NAMES, open_forecast_nc, open_forecast_truth
from smoeweather.io import atomic_path

STD_SUFFIX = "_std"


def _open_any(path: Path) -> xr.Dataset:
    if not path.exists():
        raise FileNotFoundError(f"{path} does not exist")
    return xr.open_zarr(path) if path.is_dir() else xr.open_dataset(path)


def _is_wb2_forecast(ds: xr.Dataset) -> bool:
    return ("time" in ds.dims and "prediction_timedelta" in ds.dims
            and np.issubdtype(ds["prediction_timedelta"].dtype, np.timedelta64))


def open_ensemble(path: str | Path, variables: Sequence[str] | None = None) -> xr.Dataset:
    """Ensemble forecast Dataset (lazy) of ``path``: only its variables with a ``member`` dim."""
    path = Path(path)
    ds = _open_any(path)
    if not (_is_wb2_forecast(ds) and "member" in ds.dims):
        ds = open_forecast_nc(path)
    names = [n for n in ds.data_vars if "member" in ds[n].dims]
    if variables:
        missing = [v for v in variables if v not in names]
        if missing:
            raise ValueError(f"{path}: no ensemble variable(s) {missing}; it has {names}")
        names = list(variables)
    if not names:
        raise ValueError(f"{path}: no variable with a 'member' dimension (an ensemble forecast was expected)")
    if ds.sizes["member"] < 2:
        raise ValueError(f"{path}: {ds.sizes['member']} member(s); post-processing needs at least 2")
    out = ds[names]
    out.attrs = dict(ds.attrs, forecast_kind="ensemble")
    return out


def open_truth(path: str | Path | None, forecast_path: str | Path) -> xr.Dataset:
    """Truth on ``time`` = valid time: from ``path`` (a canonical store, or a forecast file holding its truth),
    or, when ``path`` is None, from the forecast file itself."""
    src = Path(path) if path is not None else Path(forecast_path)
    ds = _open_any(src)
    if any(m in ds.dims for m in MEMBER_NAMES) or path is None:
        try:
            return open_forecast_truth(src)
        except ValueError as err:
            if path is None:
                raise ValueError(f"{err}; pass --truth STORE (a store with the fields at the valid times)") from err
            raise
    if "time" not in ds.dims:
        raise ValueError(f"truth {src}: no 'time' dimension (valid times expected)")
    return ds


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
        ds.chunk({"time": 1}).to_zarr(tmp, mode="w", consolidated=True)
    return out


def split_gaussian(ds: xr.Dataset) -> tuple[xr.Dataset, xr.Dataset]:
    """(μ, σ) Datasets of a ``gaussian`` store (``<name>`` and ``<name>_std``)."""
    names = [n for n in ds.data_vars if not n.endswith(STD_SUFFIX) and n + STD_SUFFIX in ds.data_vars]
    if not names:
        raise ValueError("not a gaussian forecast store: no <name> / <name>_std variable pair")
    return ds[names], ds[[n + STD_SUFFIX for n in names]].rename({n + STD_SUFFIX: n for n in names})
