"""Normalisation statistics of a canonical Dataset over its training years only."""

from __future__ import annotations

import numpy as np
import pandas as pd
import xarray as xr

from pipelines.errors import DataError

STATISTICS = ("mean", "std", "diff_std")
DIFF_HOURS = 6


def select_years(ds: xr.Dataset, years: tuple[int, int], what: str = "years") -> xr.Dataset:
    """Select the inclusive year range ``years``; DataError when any of those years is not in ``ds``."""
    y0, y1 = int(years[0]), int(years[1])
    if y1 < y0:
        raise DataError(f"{what} {y0}..{y1}: the end year must not precede the start year")
    have = np.unique(ds["time"].dt.year.values)
    missing = sorted(set(range(y0, y1 + 1)) - set(have.tolist()))
    if missing:
        span = f"{have.min()}–{have.max()}" if have.size else "no times"
        raise DataError(
            f"{what} {y0}–{y1} are not all in the data: missing {missing} (the data covers {span})"
        )
    return ds.sel(time=slice(f"{y0}-01-01", f"{y1}-12-31T23:59:59"))


def _time_step(time: xr.DataArray) -> pd.Timedelta:
    steps = np.diff(time.values)
    if steps.size == 0:
        raise DataError("statistics need at least two time steps")
    return pd.Timedelta(np.median(steps))


def compute_statistics(ds: xr.Dataset, train_years: tuple[int, int] | None = None) -> xr.Dataset:
    """Lazy per-variable, per-level statistics over the training years.

    Returns a Dataset with the data variables of ``ds`` and a new dim ``statistic`` =
    (``mean``, ``std``, ``diff_std``): mean and standard deviation over time (and member), latitude and
    longitude (unweighted, per grid point as in WeatherBench); ``diff_std`` is the standard deviation of
    6-hourly differences x(t + 6 h) − x(t) (NaN for time-invariant variables and for data whose time step
    does not divide 6 h, e.g. twice-weekly ENS-10 initialisations). Dims kept: ``statistic`` and
    ``level`` where present. Units as the data. Computed in float64; all three share one read of the data
    when computed together (``dask.compute`` merges the graphs). ``train_years`` (inclusive) defaults to all
    years in ``ds``.
    """
    if "time" not in ds.dims:
        raise DataError("compute_statistics needs a Dataset with a time dimension")
    if train_years is not None:
        ds = select_years(ds, train_years, "training years")
    step = _time_step(ds["time"])
    ratio = pd.Timedelta(hours=DIFF_HOURS) / step
    lag = int(ratio) if ratio == int(ratio) and ratio >= 1 else None  # None: no 6-hourly differences
    if lag is not None and lag >= ds.sizes["time"]:
        lag = None  # too few times for one 6-hourly difference
    out = {}
    for name, var in ds.data_vars.items():
        dims = [d for d in var.dims if d not in ("level",)]
        x = var.astype(np.float64)
        mean = x.mean(dims)
        std = x.std(dims)
        if "time" in var.dims and lag is not None:
            diff = x.isel(time=slice(lag, None)).variable - x.isel(time=slice(None, -lag)).variable
            diff_std = xr.DataArray(
                diff, coords={k: v for k, v in x.coords.items() if "time" not in v.dims}
            ).std(dims)
        else:
            diff_std = xr.full_like(mean, np.nan)
        stat = xr.concat([mean, std, diff_std], dim="statistic", coords="minimal", compat="override")
        out[name] = stat.assign_coords(statistic=list(STATISTICS)).assign_attrs(var.attrs)
    years = np.unique(ds["time"].dt.year.values)
    attrs = {
        "train_years": [int(years.min()), int(years.max())],
        "n_times": int(ds.sizes["time"]),
        "diff_hours": DIFF_HOURS,
        "note": "unweighted mean/std over time, member, latitude, longitude per level; diff_std: 6-hourly "
        "differences",
    }
    return xr.Dataset(out, attrs=attrs)
