"""Normalisation statistics of a canonical Dataset over its training years only."""

from __future__ import annotations

import numpy as np
import pandas as pd
import xarray as xr

from pipelines.errors import DataError

STATISTICS = ("mean", "std", "diff_std")


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


def time_step(time: xr.DataArray) -> tuple[pd.Timedelta | None, str]:
    """The data's own time step and its label: (median step, "6h" / "1D" / "1 month" / why not).

    Regular steps (all equal) and calendar months (28–31 days) have a step; anything else (one time,
    irregular initialisations such as twice-weekly ENS-10) returns (None, the reason).
    """
    values = time.values
    if values.size < 2:
        return None, f"{values.size} time step(s): no differences"
    if not np.issubdtype(values.dtype, np.datetime64):  # cftime (360-day calendars …)
        steps = pd.to_timedelta([b - a for a, b in zip(values[:-1], values[1:])])
    else:
        steps = pd.to_timedelta(np.diff(values))
    median = pd.Timedelta(steps.median())
    if (steps == steps[0]).all():
        return median, _label(median)
    if steps.min() >= pd.Timedelta(days=28) and steps.max() <= pd.Timedelta(days=31):
        return median, "1 month"
    return None, f"irregular time steps ({steps.min()} to {steps.max()}): differences mix step lengths"


def _label(step: pd.Timedelta) -> str:
    hours = step / pd.Timedelta(hours=1)
    if hours >= 24 and hours % 24 == 0:
        return f"{int(hours // 24)}D"
    return f"{int(hours)}h" if hours == int(hours) else str(step)


def compute_statistics(ds: xr.Dataset, train_years: tuple[int, int] | None = None) -> xr.Dataset:
    """Lazy per-variable, per-level statistics over the training years.

    Returns a Dataset with the data variables of ``ds`` and a new dim ``statistic`` =
    (``mean``, ``std``, ``diff_std``): mean and standard deviation over time (and member), latitude and
    longitude (unweighted, per grid point as in WeatherBench); ``diff_std`` is the standard deviation of
    differences x(t + Δ) − x(t) over the data's OWN time step Δ (6 h, 12 h, 1 day, 1 month …; recorded in
    ``attrs["diff_step"]``), 0 for time-invariant variables, NaN with ``attrs["diff_std_note"]`` saying
    why when the steps are irregular. Dims kept: ``statistic`` and ``level`` where present. Units as the
    data. Computed in float64; the three share one read of the data when computed together.
    ``train_years`` (inclusive) defaults to all years in ``ds``.

    Fewer than two times (a single analysis, the input of a forecast) is not an error: every value is
    NaN and ``attrs["available"] = 0`` with the reason in ``attrs["unavailable_reason"]`` — readers must
    take statistics from elsewhere (e.g. the training store or the checkpoint).
    """
    if train_years is not None:
        ds = select_years(ds, train_years, "training years")
    n_times = int(ds.sizes.get("time", 0))
    if n_times < 2:
        reason = (
            f"the data has {n_times} time step(s); mean/std/diff_std need at least two times "
            "(take the statistics from the training store or the checkpoint)"
        )
        out = {}
        for name, var in ds.data_vars.items():
            kept = {d: var.sizes[d] for d in var.dims if d == "level"}
            nan = xr.DataArray(
                np.full((len(STATISTICS), *kept.values()), np.nan),
                dims=("statistic", *kept),
                coords={"statistic": list(STATISTICS), **{d: var[d].values for d in kept}},
                attrs=var.attrs,
            )
            out[name] = nan
        return xr.Dataset(out, attrs={"available": 0, "unavailable_reason": reason, "n_times": n_times})
    step, label = time_step(ds["time"])
    out = {}
    for name, var in ds.data_vars.items():
        dims = [d for d in var.dims if d not in ("level",)]
        x = var.astype(np.float64)
        mean = x.mean(dims)
        std = x.std(dims)
        if "time" not in var.dims:
            diff_std = xr.zeros_like(mean)  # time-invariant: x(t + Δ) − x(t) = 0 exactly
        elif step is not None:
            diff = x.isel(time=slice(1, None)).variable - x.isel(time=slice(None, -1)).variable
            diff_std = xr.DataArray(
                diff, coords={k: v for k, v in x.coords.items() if "time" not in v.dims}
            ).std(dims)
        else:
            diff_std = xr.full_like(mean, np.nan)
        stat = xr.concat([mean, std, diff_std], dim="statistic", coords="minimal", compat="override")
        out[name] = stat.assign_coords(statistic=list(STATISTICS)).assign_attrs(var.attrs)
    years = np.unique(ds["time"].dt.year.values)
    attrs = {
        "available": 1,
        "train_years": [int(years.min()), int(years.max())],
        "n_times": n_times,
        "diff_step": label if step is not None else "none",
        "note": "unweighted mean/std over time, member, latitude, longitude per level; diff_std: differences "
        f"over the data's own time step ({label})",
    }
    if step is not None:
        attrs["diff_hours"] = float(step / pd.Timedelta(hours=1))
    else:
        attrs["diff_std_note"] = f"diff_std not computed: {label}"
    return xr.Dataset(out, attrs=attrs)
