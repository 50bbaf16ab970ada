"""Reference forecasts on the same initialisations and leads as a model: persistence, day-of-year
climatology (31-day window, from the training store) and the training-period mean."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import xarray as xr

from smoeweather.data.forecast_stores import HOUR, open_canonical
from smoeweather.data.weather import Field, field_name
from smoeweather.forecast.climatology import climatology_at, doy_climatology, time_mean
from smoeweather.forecast.output import check_times
from smoeweather.forecast.sources import check_fields, open_statistics_years, read_field

METHODS = ("persistence", "climatology", "train_mean")


def _member_first(da: xr.DataArray) -> xr.DataArray:
    return da.transpose("time", *(["member"] if "member" in da.dims else []), "latitude", "longitude")


def persistence(ds: xr.Dataset, fields: Sequence[Field], inits: np.ndarray, leads_h: Sequence[int], where: str,
                need_truth: bool = True) -> tuple[dict[Field, np.ndarray], np.ndarray | None]:
    """f(t, τ) = o(t) for every lead: ({field: (T, L[, M], H, W)}, member coords or None)."""
    check_fields(ds, fields, where)
    check_times(ds["time"].values, inits, [0], leads_h, where, need_truth)
    out, members = {}, None
    for f in fields:
        da = _member_first(read_field(ds, f, inits))
        if "member" in da.dims:
            members = da["member"].values
        out[f] = np.repeat(da.values[:, None], len(leads_h), axis=1)
    return out, members


def training_fields(store: str, fields: Sequence[Field], years: tuple[int, int] | None = None
                    ) -> dict[Field, xr.DataArray]:
    """The fields of a training store over its training years (``years``, else the years of its
    statistics, else all times), loaded; an ensemble store contributes every member."""
    ds = open_canonical(store)
    check_fields(ds, fields, f"climatology store {store}")
    years = years or open_statistics_years(store)
    if years is not None:
        y = ds["time"].dt.year
        ds = ds.sel(time=(y >= years[0]) & (y <= years[1]))
        if ds.sizes["time"] == 0:
            raise ValueError(f"climatology store {store} has no times in the training years {years}")
    out = {}
    for f in fields:
        da = read_field(ds, f, ds["time"].values)
        if "member" in da.dims:  # all members are samples of the same climate
            da = da.stack(sample=("time", "member"))
            times = da["time"].values
            da = da.drop_vars(["sample", "time", "member"]).rename(sample="time").assign_coords(time=times)
        out[f] = da
    return out


def climatology_forecast(store: str, fields: Sequence[Field], inits: np.ndarray, leads_h: Sequence[int],
                         method: str = "climatology", years: tuple[int, int] | None = None
                         ) -> dict[Field, np.ndarray]:
    """f(t, τ) = day-of-year climatology at t + τ (``climatology``) or the training mean (``train_mean``)."""
    valid = xr.DataArray(inits[:, None] + np.asarray(leads_h)[None, :] * HOUR, dims=("time", "prediction_timedelta"))
    out = {}
    for f, da in training_fields(store, fields, years).items():
        if method == "train_mean":
            ref = time_mean(da).transpose("latitude", "longitude").values
            out[f] = np.broadcast_to(ref, (len(inits), len(leads_h), *ref.shape)).copy()
        else:
            at = climatology_at(doy_climatology(da), valid, f"climatology of {field_name(f)} from {store}")
            out[f] = at.transpose("time", "prediction_timedelta", "latitude", "longitude").values
    return out
