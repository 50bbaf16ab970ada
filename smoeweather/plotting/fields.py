"""Forecast-vs-truth and error maps from a forecast store (WeatherBench 2 conventions) and a truth source.

Forecast store: dims ``time`` (initialisation), ``prediction_timedelta``, ``latitude``, ``longitude``,
``level`` where applicable, optional ``member``; ``attrs["forecast_kind"]`` ``deterministic``,
``ensemble`` (the ensemble mean is mapped) or ``gaussian`` (μ is mapped). Truth: a prepared store or a
canonical file (:func:`smoeweather.data.forecast_stores.open_canonical`), read at the valid time init + lead.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import xarray as xr  # noqa: E402

from smoeweather.data.forecast_stores import open_forecast  # noqa: E402 (one reader for forecast stores)
from smoeweather.data.weather import parse_fields  # noqa: E402
from smoeweather.plotting.cartography import draw_field, global_axes, save_png  # noqa: E402


def select_field(ds: xr.Dataset, field: str, where: str) -> xr.DataArray:
    """``geopotential_500`` → ``ds.geopotential.sel(level=500)``; ``2m_temperature`` → that variable."""
    if field in ds.data_vars:
        return ds[field]
    (name, level), = parse_fields([field])
    if name not in ds.data_vars:
        raise ValueError(f"{where}: no variable {name!r} for field {field!r}; available: {sorted(ds.data_vars)}")
    da = ds[name]
    if level is not None:
        if "level" not in da.dims or level not in set(int(v) for v in da["level"].values):
            levels = [int(v) for v in da["level"].values] if "level" in da.dims else "none"
            raise ValueError(f"{where}: {name!r} has no level {level} (levels: {levels})")
        da = da.sel(level=level, drop=True)
    elif "level" in da.dims:
        raise ValueError(f"{where}: {name!r} has levels; name one, e.g. {name}_{int(da['level'][0])}")
    return da


def forecast_and_truth(forecast: str | Path, truth: Any, field: str, lead: str | int,
                       init: str | None = None) -> tuple[xr.DataArray, xr.DataArray, str]:
    """(forecast, truth, kind) as (time, latitude, longitude) float DataArrays at one lead, both at the
    same inits (all of them, or the one ``init``), truth taken at the valid time init + lead.
    ``kind``: what is mapped (``deterministic``, ``ensemble mean`` or ``gaussian mean``)."""
    from smoeweather.data.forecast_stores import describe, open_canonical, parse_lead

    fc_ds = open_forecast(forecast)
    lead_h = parse_lead(lead)
    td = np.timedelta64(lead_h, "h")
    leads = fc_ds["prediction_timedelta"].values.astype("timedelta64[h]")
    if td not in leads:
        raise ValueError(f"{forecast}: no lead {lead_h} h; available: {[f'{int(x)}h' for x in leads.astype(int)]}")
    fc = select_field(fc_ds, field, str(forecast)).sel(prediction_timedelta=td.astype("timedelta64[ns]"))
    kind = fc_ds.attrs.get("forecast_kind", "deterministic")
    if "member" in fc.dims:
        fc, kind = fc.mean("member"), "ensemble mean"
    elif kind == "gaussian":
        kind = "gaussian mean (μ)"
    if init is not None:
        t = np.datetime64(pd.Timestamp(str(init)).to_datetime64(), "ns")
        if t not in fc["time"].values:
            raise ValueError(f"{forecast}: no initialisation {init}; first {fc['time'].values[0]}, "
                             f"last {fc['time'].values[-1]}")
        fc = fc.sel(time=[t])
    tr_ds = open_canonical(truth, where=f"truth {describe(truth)}", role="the truth",
                           fix="give --truth the analysis or prepared store the forecast is compared with")
    tr = select_field(tr_ds, field, str(truth))
    valid = fc["time"].values + td.astype("timedelta64[ns]")
    missing = np.setdiff1d(valid, tr["time"].values)
    if missing.size:
        raise ValueError(f"{truth}: no truth at valid time(s) {missing[:3]} (init + {lead_h} h)")
    tr = tr.sel(time=valid).assign_coords(time=fc["time"].values)
    if "member" in tr.dims:
        raise ValueError(f"{truth}: the truth has a member dim; pass an analysis/reanalysis store")
    fc = fc.transpose("time", "latitude", "longitude").astype(np.float64).load()
    tr = tr.transpose("time", "latitude", "longitude").astype(np.float64).load()
    if not (np.allclose(fc["latitude"], tr["latitude"]) and np.allclose(fc["longitude"], tr["longitude"])):
        raise ValueError(f"{forecast} and {truth} are on different grids")
    tr = tr.assign_coords(latitude=fc["latitude"], longitude=fc["longitude"])
    fc.attrs.setdefault("units", tr.attrs.get("units", ""))
    return fc, tr, kind


def pretty_units(units: str) -> str:
    """CF/ECMWF unit strings for labels: ``m**2 s**-2`` → ``m² s⁻²``."""
    sup = str.maketrans("-0123456789", "⁻⁰¹²³⁴⁵⁶⁷⁸⁹")
    return " ".join(p.split("**")[0] + p.split("**")[1].translate(sup) if "**" in p else p for p in units.split())


def _sorted(da: xr.DataArray) -> xr.DataArray:
    """Latitude ascending, longitude in [0, 360) ascending (what the maps expect)."""
    da = da.assign_coords(longitude=np.mod(da["longitude"], 360.0))
    return da.sortby(["latitude", "longitude"])


def _panel(fig: plt.Figure, pos: Any, da: xr.DataArray, title: str, label: str, proj: str = "robinson",
           **kwargs: Any) -> None:
    da = _sorted(da)
    ax = global_axes(fig, pos, proj=proj, longitude=da["longitude"].values)
    mesh = draw_field(ax, da.values, da["latitude"].values, da["longitude"].values, **kwargs)
    ax.set_title(title, fontsize=10)
    cbar = fig.colorbar(mesh, ax=ax, orientation="horizontal", fraction=0.05, pad=0.04, shrink=0.8)
    cbar.set_label(label, fontsize=9)


def _stamp(t: np.datetime64) -> str:
    return pd.Timestamp(t).strftime("%Y-%m-%d %H UTC")


def _symmetric(values: np.ndarray) -> float:
    v = float(np.nanmax(np.abs(values)))
    return v if v > 0 else 1.0


def plot_forecast(forecast: str | Path, truth: Any, field: str, lead: str | int, init: str, out_dir: str | Path,
                  name: str | None = None, proj: str = "robinson") -> Path:
    """Forecast, truth and forecast − truth for one init and lead: a three-panel PNG in ``out_dir``."""
    fc, tr, kind = forecast_and_truth(forecast, truth, field, lead, init)
    from smoeweather.data.forecast_stores import parse_lead

    lead_h = parse_lead(lead)
    units = pretty_units(fc.attrs.get("units", ""))
    f, t = fc.isel(time=0), tr.isel(time=0)
    t0 = fc["time"].values[0]
    valid = t0 + np.timedelta64(lead_h, "h")
    lo, hi = float(min(f.min(), t.min())), float(max(f.max(), t.max()))
    fig = plt.figure(figsize=(16, 4.3), layout="constrained")
    label = f"{field} [{units}]"
    _panel(fig, 131, f, f"forecast ({kind})", label, proj=proj, cmap="viridis", vmin=lo, vmax=hi)
    _panel(fig, 132, t, "truth", label, proj=proj, cmap="viridis", vmin=lo, vmax=hi)
    d = f - t
    v = _symmetric(d.values)
    _panel(fig, 133, d, "forecast − truth", f"difference [{units}]", proj=proj, cmap="RdBu_r", vmin=-v, vmax=v)
    fig.suptitle(f"{name or Path(forecast).stem}: {field}, init {_stamp(t0)}, lead {lead_h} h, "
                 f"valid {_stamp(valid)}", fontsize=12)
    out = Path(out_dir) / f"forecast_{field}_{lead_h}h_{pd.Timestamp(t0).strftime('%Y%m%dT%H')}.png"
    return save_png(fig, out)


def plot_error(forecast: str | Path, truth: Any, field: str, lead: str | int, out_dir: str | Path,
               init: str | None = None, name: str | None = None, proj: str = "robinson") -> Path:
    """Error maps at one lead: for one ``init`` the error forecast − truth; otherwise, over all inits of
    the store, the time-mean error (bias) and the root-mean-square error per grid point."""
    from smoeweather.data.forecast_stores import parse_lead

    fc, tr, kind = forecast_and_truth(forecast, truth, field, lead, init)
    lead_h = parse_lead(lead)
    units = pretty_units(fc.attrs.get("units", ""))
    err = fc - tr
    label = name or Path(forecast).stem
    if init is not None:
        t0 = fc["time"].values[0]
        fig = plt.figure(figsize=(9, 5), layout="constrained")
        v = _symmetric(err.values)
        _panel(fig, 111, err.isel(time=0), f"{label} ({kind}) − truth: {field}, init {_stamp(t0)}, lead {lead_h} h",
               f"error [{units}]", proj=proj, cmap="RdBu_r", vmin=-v, vmax=v)
        out = Path(out_dir) / f"error_{field}_{lead_h}h_{pd.Timestamp(t0).strftime('%Y%m%dT%H')}.png"
        return save_png(fig, out)
    n = fc.sizes["time"]
    first, last = _stamp(fc["time"].values[0]), _stamp(fc["time"].values[-1])
    bias = err.mean("time")
    rmse = np.sqrt((err**2).mean("time"))
    fig = plt.figure(figsize=(13, 5.0), layout="constrained")
    v = _symmetric(bias.values)
    _panel(fig, 121, bias, "time-mean error (bias)", f"bias [{units}]", proj=proj, cmap="RdBu_r", vmin=-v, vmax=v)
    _panel(fig, 122, rmse, "root-mean-square error", f"RMSE [{units}]", proj=proj, cmap="magma_r", vmin=0)
    fig.suptitle(f"{label} ({kind}) − truth: {field}, lead {lead_h} h, {n} inits {first} … {last}", fontsize=12)
    return save_png(fig, Path(out_dir) / f"error_{field}_{lead_h}h_mean.png")
