"""Day-of-year climatology (31-day window) and training-period mean of fields, and their values at valid
times — the reference forecasts and the climatology of the anomaly correlation.

Day of year: on a 365-day calendar. In leap years 29 February is counted as 28 February (day 59) and the
later days shift back by one, so 1 March is always day 60; a valid time on 29 February gets the
climatology of 28 February. Hour of day is kept separate (per (day, hour) as WeatherBench 2), so a
diurnal cycle is not smeared. Window: every day d averages ALL training samples of days d−15 … d+15 at
that hour, circularly (late December borrows early January of the same training years, and vice versa);
each sample counts once (sums over the window divided by counts over the window). Days without any sample
in their window are NaN, and asking for them is an error.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import xarray as xr

DAYS = 365
WINDOW_DAYS = 31


def day_of_year(times: np.ndarray | xr.DataArray) -> np.ndarray:
    """1 … 365 on the no-leap calendar above (29 Feb → 59), same shape as ``times``."""
    t = xr.DataArray(np.asarray(times, dtype="datetime64[ns]").ravel(), dims="t").dt
    doy = t.dayofyear.values - (t.is_leap_year.values & (t.dayofyear.values >= 60))
    return doy.reshape(np.shape(times))


def hour_of_day(times: np.ndarray | xr.DataArray) -> np.ndarray:
    t = np.asarray(times, dtype="datetime64[ns]")
    return ((t - t.astype("datetime64[D]")) // np.timedelta64(1, "h")).astype(int)


def doy_climatology(da: xr.DataArray, window: int = WINDOW_DAYS) -> xr.DataArray:
    """Climatology of ``da`` (time, ...) → (dayofyear 1..365, hour, ...), same units; see module doc.

    Hand-written (not ``groupby('time.dayofyear').mean()`` + rolling) because that would average daily
    MEANS (unequal sample counts) and not handle 29 February or the wrap-around at the year's end.
    """
    if window % 2 != 1 or not 1 <= window <= DAYS:
        raise ValueError(f"climatology window must be an odd number of days in 1..{DAYS}, got {window}")
    if "time" not in da.dims or da.sizes["time"] == 0:
        raise ValueError(f"climatology of {da.name!r} needs a non-empty time dim")
    da = da.transpose("time", ...)
    times = da["time"].values
    doy, hour = day_of_year(times) - 1, hour_of_day(times)
    hours = np.unique(hour)
    h_idx = np.searchsorted(hours, hour)
    values = np.asarray(da.values, np.float64)
    finite = np.isfinite(values)
    sums = np.zeros((DAYS, len(hours), *values.shape[1:]))
    counts = np.zeros_like(sums)
    np.add.at(sums, (doy, h_idx), np.where(finite, values, 0.0))
    np.add.at(counts, (doy, h_idx), finite)
    half = window // 2
    wsum = sum(np.roll(sums, k, axis=0) for k in range(-half, half + 1))
    wcount = sum(np.roll(counts, k, axis=0) for k in range(-half, half + 1))
    with np.errstate(invalid="ignore", divide="ignore"):
        clim = np.where(wcount > 0, wsum / np.maximum(wcount, 1), np.nan)
    other = {d: da[d] for d in da.dims[1:] if d in da.coords}
    out = xr.DataArray(
        clim.astype(np.float32),
        dims=("dayofyear", "hour", *da.dims[1:]),
        coords={"dayofyear": np.arange(1, DAYS + 1), "hour": hours, **other},
        name=da.name,
        attrs=dict(da.attrs),
    )
    out.attrs["climatology"] = (
        f"mean over {window}-day window (circular, per hour of day), "
        f"{str(times.min())[:10]} .. {str(times.max())[:10]}, 29 Feb counted as 28 Feb"
    )
    return out


def climatology_at(clim: xr.DataArray, valid_time: xr.DataArray, where: str = "climatology") -> xr.DataArray:
    """Climatology at the valid times (any dims, e.g. (time, prediction_timedelta)): ``clim`` indexed by
    their day of year and hour; ValueError naming ``where`` when an hour or a day is not covered."""
    vt = valid_time.values
    doy, hour = day_of_year(vt), hour_of_day(vt)
    hours = clim["hour"].values
    missing_h = sorted(set(np.unique(hour).tolist()) - set(hours.tolist()))
    if missing_h:
        raise ValueError(f"{where} has no values for hour(s) {missing_h} UTC (it has {hours.tolist()})")
    d = xr.DataArray(doy - 1, dims=valid_time.dims, coords=valid_time.coords)
    h = xr.DataArray(np.searchsorted(hours, hour), dims=valid_time.dims, coords=valid_time.coords)
    out = clim.isel(dayofyear=d, hour=h).drop_vars(["dayofyear", "hour"], errors="ignore")
    empty = out.isnull().all([x for x in out.dims if x not in valid_time.dims])
    if bool(empty.any()):
        bad = np.unique(vt[np.asarray(empty.transpose(*valid_time.dims).values)])
        raise ValueError(
            f"{where} has no training samples within its window for valid times such as "
            f"{[str(t)[:16] for t in bad[:3]]}: prepare it from a longer training period"
        )
    return out


def time_mean(da: xr.DataArray) -> xr.DataArray:
    """Per-grid-point mean over time (the 'training mean' reference), same units."""
    out = da.mean("time")
    out.attrs = dict(da.attrs)
    return out


def _doy_window_reduce(da: xr.DataArray, valid_time: xr.DataArray, window: int, size: int,
                       reduce: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
    """``reduce`` (samples, ...) → (size, ...) applied, for each valid time's (day of year, hour), to every
    sample of that hour within ±window//2 days (circular); → (size, *valid_time.shape, ...)."""
    da = da.transpose("time", ...)
    doy, hour = day_of_year(da["time"].values) - 1, hour_of_day(da["time"].values)
    values = np.asarray(da.values, np.float64)
    vt = np.asarray(valid_time.values)
    v_doy, v_hour = day_of_year(vt).ravel() - 1, hour_of_day(vt).ravel()
    table: dict[tuple[int, int], np.ndarray] = {}
    for d, h in sorted(set(zip(v_doy.tolist(), v_hour.tolist()))):
        dist = np.abs((doy - d + DAYS // 2) % DAYS - DAYS // 2)
        pick = (dist <= window // 2) & (hour == h)
        if not pick.any():
            raise ValueError(f"climatology of {da.name!r} has no sample within {window} days of day {d + 1} at "
                             f"{h:02d} UTC: prepare it from a longer training period")
        table[d, h] = reduce(values[pick])
    out = np.stack([table[d, h] for d, h in zip(v_doy.tolist(), v_hour.tolist())], axis=1)
    return out.reshape(size, *vt.shape, *values.shape[1:])


def _on_valid(values: np.ndarray, da: xr.DataArray, valid_time: xr.DataArray, dim: str, coord: np.ndarray,
              note: str) -> xr.DataArray:
    other = {d: da[d] for d in da.dims if d != "time" and d in da.coords}
    dims = [d for d in da.dims if d != "time"]
    return xr.DataArray(values, dims=(dim, *valid_time.dims, *dims),
                        coords={dim: coord, **dict(valid_time.coords), **other}, name=da.name,
                        attrs={"climatology": note})


def nanquantile_samples(x: np.ndarray, q: np.ndarray) -> np.ndarray:
    """``np.nanquantile(x, q, axis=0)`` (linear method), the same numbers, vectorised: (samples, ...) →
    (len(q), ...). numpy's applies a Python function to every 1-d slice (1.5 M calls, 200 s, for the demo's
    climatological thresholds); here ``np.quantile`` runs once for NaN-free data, else once per distinct count
    of valid samples, on the slices sorted NaN-last and cut to that count (what nanquantile does per slice)."""
    x = np.asarray(x, np.float64)
    q = np.asarray(q, np.float64)
    nan = np.isnan(x)
    if not nan.any():
        return np.quantile(x, q, axis=0)
    flat = np.sort(x.reshape(x.shape[0], -1), axis=0)  # NaN last
    count = (~nan).reshape(x.shape[0], -1).sum(0)
    out = np.full((len(q), flat.shape[1]), np.nan)
    for k in np.unique(count[count > 0]):
        cols = count == k
        out[:, cols] = np.quantile(flat[:k, cols], q, axis=0)
    return out.reshape(len(q), *x.shape[1:])


def doy_quantiles(da: xr.DataArray, quantiles: np.ndarray, valid_time: xr.DataArray,
                  window: int = WINDOW_DAYS) -> xr.DataArray:
    """Climatological quantiles of ``da`` (time, ...) at the valid times: for each valid time's day of year
    and hour, the ``quantiles`` (probabilities in (0, 1)) of every sample of that hour within ±window//2 days
    (circular, the day-of-year convention of :func:`doy_climatology`), per grid point. Returns (quantile,
    *valid_time.dims, ...), units of ``da``. Only the (day, hour) pairs asked for are computed."""
    q = np.asarray(quantiles, np.float64)
    values = _doy_window_reduce(da, valid_time, window, len(q), lambda x: nanquantile_samples(x, q))
    out = _on_valid(values, da, valid_time, "quantile", q, f"quantiles over a {window}-day window per hour")
    out.attrs["units"] = da.attrs.get("units", "")
    return out


def doy_exceedance(da: xr.DataArray, thresholds: np.ndarray, valid_time: xr.DataArray,
                   window: int = WINDOW_DAYS) -> xr.DataArray:
    """Climatological probability of exceeding each threshold (units of ``da``) at the valid times: the
    fraction of the window's samples above it (:func:`doy_quantiles`' samples), per grid point →
    (threshold, *valid_time.dims, ...), dimensionless."""
    t = np.asarray(thresholds, np.float64)

    def frac(x: np.ndarray) -> np.ndarray:
        ok = np.isfinite(x)
        above = (x[None] > t.reshape(-1, *([1] * x.ndim))) & ok[None]
        return above.sum(1) / np.maximum(ok.sum(0), 1)

    values = _doy_window_reduce(da, valid_time, window, len(t), frac)
    out = _on_valid(values, da, valid_time, "threshold", t, f"fraction above threshold in a {window}-day window")
    out.attrs["units"] = "1"
    return out


def is_wb2_climatology(ds: xr.Dataset) -> bool:
    """A WeatherBench 2 climatology (zarr with a ``dayofyear`` dim, usually ``hour`` too) rather than a store of
    fields on times."""
    return "dayofyear" in ds.dims and "time" not in ds.dims


def wb2_climatology_at(ds: xr.Dataset, name: str, valid_time: xr.DataArray, where: str,
                       quantiles: np.ndarray | None = None) -> xr.DataArray:
    """A WB2 climatology's ``name`` (the mean; ``name_mean`` if absent) or, with ``quantiles``, its
    ``name_quantile`` at those quantiles (nearest within 0.01, as WB2), at the valid times selected as WB2
    does: ``dayofyear`` = the calendar day of year (1..366), ``hour`` = the hour when the climatology has one."""
    var = name if quantiles is None else f"{name}_quantile"
    if quantiles is None and var not in ds.data_vars:
        var = f"{name}_mean"
    if var not in ds.data_vars:
        raise ValueError(f"{where} has no {var!r} (WeatherBench 2 climatology variables: {sorted(ds.data_vars)})")
    da = ds[var]
    t = xr.DataArray(np.asarray(valid_time.values, "datetime64[ns]"), dims=valid_time.dims).dt
    sel = {"dayofyear": xr.DataArray(t.dayofyear.values, dims=valid_time.dims, coords=valid_time.coords)}
    if "hour" in da.dims:
        hours = xr.DataArray(t.hour.values, dims=valid_time.dims, coords=valid_time.coords)
        missing = sorted(set(np.unique(hours.values).tolist()) - set(da["hour"].values.tolist()))
        if missing:
            raise ValueError(f"{where}: {var} has no hour(s) {missing} UTC (it has {da['hour'].values.tolist()})")
        sel["hour"] = hours
    if quantiles is not None:
        if "quantile" not in da.dims:
            raise ValueError(f"{where}: {var} has no 'quantile' dim")
        try:
            da = da.sel(quantile=np.asarray(quantiles, np.float64), method="nearest", tolerance=0.01)
        except KeyError as err:
            raise ValueError(f"{where}: {var} lacks quantiles {list(quantiles)} (±0.01); it has "
                             f"{da['quantile'].values.tolist()}; choose --binary-quantiles among them") from err
    out = da.sel(sel).drop_vars(["dayofyear", "hour"], errors="ignore")
    return out.astype(np.float64)
