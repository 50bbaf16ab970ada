"""Forecast Datasets of ``smoe forecast`` from arrays, and their time checks.

The layout is the one of :mod:`smoeweather.data.forecast_stores` (which also writes them): a level-dependent
variable holds NaN at the levels that were not forecast (e.g. geopotential only at 500 hPa, temperature only
at 850).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd
import xarray as xr

from smoeweather.data.forecast_stores import HOUR, STD_SUFFIX, code_version
from smoeweather.data.weather import Field


def init_times(start: Any, end: Any, every: str | pd.Timedelta = "12h") -> np.ndarray:
    """Initialisation times start, start + every, … ≤ end (datetime64[ns]); ValueError when empty."""
    try:
        step = pd.Timedelta(every)
    except ValueError:
        raise ValueError(f"--every {every!r}: not a duration; give e.g. 12h or 1D") from None
    if not step > pd.Timedelta(0):
        raise ValueError(f"--every must be positive, got {every!r}")
    bounds = []
    for t in (start, end):
        try:
            bounds.append(pd.Timestamp(str(t)))
        except ValueError:
            raise ValueError(f"--init {t!r}: not a date; give e.g. --init 2003-01-01 2003-12-31T12 (or one time "
                             "for one init)") from None
    times = pd.date_range(*bounds, freq=step)
    if len(times) == 0:
        raise ValueError(f"no initialisation times from {start} to {end} (start after end?)")
    return times.values.astype("datetime64[ns]")


def check_times(data_times: np.ndarray, inits: np.ndarray, offsets_h: Sequence[int], leads_h: Sequence[int],
                where: str, need_truth: bool = True) -> None:
    """ValueError naming ``where`` and the times when an init's inputs (init + offsets) or, if
    ``need_truth``, a lead's verifying time (init + lead) are not in ``data_times``."""
    have = pd.DatetimeIndex(data_times)
    checks = [("input", o) for o in offsets_h] + ([("truth (valid time)", lead) for lead in leads_h]
                                                  if need_truth else [])
    for what, off in checks:
        want = pd.DatetimeIndex(inits + off * HOUR)
        missing = want[~want.isin(have)]
        if len(missing):
            span = f"{have.min()} .. {have.max()}" if len(have) else "no times"
            raise ValueError(
                f"{where}: {len(missing)} initialisation(s) lack their {what} at init {off:+d} h: missing "
                f"times such as {[str(t) for t in missing[:3]]}; the data cover {span}. Narrow --init"
                + (" or pass --beyond-data to forecast past the data" if what.startswith("truth") else "")
            )


def _var_attrs(name: str, source: xr.Dataset | None) -> dict[str, str]:
    from pipelines.canonical import VARIABLES

    attrs: dict[str, str] = {}
    if name in VARIABLES:
        units, long_name, standard = VARIABLES[name]
        attrs = {"units": units, "long_name": long_name}
        if standard:
            attrs["standard_name"] = standard
    if source is not None and name in source:
        attrs.update({k: str(v) for k, v in source[name].attrs.items()
                      if k in ("units", "long_name", "standard_name")})
    return attrs


def forecast_dataset(
    fields: dict[Field, np.ndarray],
    inits: np.ndarray,
    leads_h: Sequence[int],
    latitude: np.ndarray,
    longitude: np.ndarray,
    member: np.ndarray | None = None,
    source: xr.Dataset | None = None,
    attrs: dict[str, Any] | None = None,
) -> xr.Dataset:
    """Assemble the WB2-convention Dataset from arrays (T, L[, M], H, W) per (variable, level) field."""
    lead_td = np.array([np.timedelta64(int(h), "h") for h in leads_h]).astype("timedelta64[ns]")
    lead_dims = ("time", "prediction_timedelta", *(("member",) if member is not None else ()))
    levels = sorted({lev for _, lev in fields if lev is not None})
    coords: dict[str, Any] = {
        "time": ("time", inits.astype("datetime64[ns]"),
                 {"long_name": "initialisation time", "standard_name": "forecast_reference_time"}),
        "prediction_timedelta": ("prediction_timedelta", lead_td,
                                 {"long_name": "lead time", "standard_name": "forecast_period"}),
        "latitude": ("latitude", np.asarray(latitude, np.float64),
                     {"units": "degrees_north", "standard_name": "latitude", "long_name": "latitude"}),
        "longitude": ("longitude", np.asarray(longitude, np.float64),
                      {"units": "degrees_east", "standard_name": "longitude", "long_name": "longitude"}),
    }
    if member is not None:
        coords["member"] = ("member", np.asarray(member), {"long_name": "ensemble member"})
    if levels:
        coords["level"] = ("level", np.asarray(levels, np.int64),
                           {"units": "hPa", "long_name": "pressure level", "standard_name": "air_pressure"})
    data: dict[str, Any] = {}
    for name in dict.fromkeys(n for n, _ in fields):
        mine = {lev: a for (n, lev), a in fields.items() if n == name}
        if None in mine:
            arr = np.asarray(mine[None], np.float32)
            data[name] = ((*lead_dims, "latitude", "longitude"), arr, _var_attrs(name, source))
        else:
            first = next(iter(mine.values()))
            arr = np.full((*first.shape[:-2], len(levels), *first.shape[-2:]), np.nan, np.float32)
            for lev, a in mine.items():
                arr[..., levels.index(lev), :, :] = a
            data[name] = ((*lead_dims, "level", "latitude", "longitude"), arr, _var_attrs(name, source))
    ds = xr.Dataset(data, coords=coords)
    ds.attrs = {"Conventions": "CF-1.8", "created_utc": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
                "code_version": code_version(), **(attrs or {})}
    return ds.sortby(["latitude", "longitude"])


def forecast_fields(ds: xr.Dataset) -> list[Field]:
    """(variable, level) fields present in a forecast Dataset: levels that hold any finite value."""
    out: list[Field] = []
    for name, da in ds.data_vars.items():
        if "prediction_timedelta" not in da.dims or str(name).endswith(STD_SUFFIX):
            continue
        if "level" in da.dims:
            has = da.notnull().any([d for d in da.dims if d != "level"]).values
            out += [(str(name), int(lev)) for lev, ok in zip(da["level"].values, has) if ok]
        else:
            out.append((str(name), None))
    return out
