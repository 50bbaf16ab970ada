"""A seeded, deliberately imperfect ensemble built from a canonical store's own fields (for demos and tests).

For every field (e.g. ``geopotential_500``), init time t and lead τ, with y the store's field at t + τ:

    xₘ = y + b(s) + σ(s, t, τ) · (η + r · εₘ),     η, εₘ ~ N(0, 1) independent, r = 0.6

- location-dependent bias b(s) = β · sd(s) · (2·land_sea_mask(s) − 1) (warm/high over land, cold/low over sea;
  a smooth sin(lon)·cos(lat) pattern when the store has no land-sea mask), β = 0.3·√(τ/24 h);
- flow-dependent error scale σ = α · (0.3·sd(s) + 0.7·|y(t + τ) − y(t)|), α = 0.25·√(τ/24 h): larger where
  the field changes fast, sd(s) = the field's standard deviation over the store's times at s;
- η is shared by all members (the ensemble mean is wrong by it), r < 1 makes the ensemble under-dispersive.

So the raw ensemble is biased in places and too narrow: what EMOS (global and per grid point) corrects.
The store itself is the truth (``time`` = valid time).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd
import xarray as xr

from pipelines.readers._files import open_data
from smoeweather.data.forecast_stores import write_store

SPREAD_RATIO = 0.6


def _fields(ds: xr.Dataset, variables: Sequence[str] | None) -> list[tuple[str, int | None]]:
    if not variables:
        defaults = [("geopotential", 500), ("temperature", 850)]
        variables = [f"{n}_{lv}" for n, lv in defaults if n in ds and "level" in ds[n].dims and lv in ds["level"]]
        if not variables:
            raise ValueError("store has neither geopotential at 500 hPa nor temperature at 850 hPa; pass --variables")
    out: list[tuple[str, int | None]] = []
    for v in variables:
        if v in ds.data_vars and "level" not in ds[v].dims:
            out.append((v, None))
            continue
        name, _, level = v.rpartition("_")
        if not name or not level.isdigit() or name not in ds.data_vars or int(level) not in ds["level"].values:
            raise ValueError(f"store has no field {v!r} (expected <name>_<level hPa> or a single-level variable; "
                             f"variables: {[n for n in ds.data_vars]})")
        out.append((name, int(level)))
    return out


def synthetic_ensemble(
    truth: xr.Dataset,
    members: int = 10,
    leads: Sequence[str] = ("24h", "48h"),
    init: Sequence[str] | None = None,
    every: str = "24h",
    seed: int = 0,
    variables: Sequence[str] | None = None,
) -> xr.Dataset:
    """Ensemble Dataset (time, prediction_timedelta, member, level, latitude, longitude) from ``truth``."""
    if members < 2:
        raise ValueError(f"--members must be at least 2, got {members}")
    lead_td = [pd.Timedelta(x) for x in leads]
    times = pd.DatetimeIndex(truth["time"].values)
    start = pd.Timestamp(init[0]) if init else times[0]
    end = pd.Timestamp(init[1]) if init else times[-1]
    candidates = pd.date_range(start, end, freq=pd.Timedelta(every))
    have = set(times)
    inits = [t for t in candidates if t in have and all(t + lt in have for lt in lead_td)]
    if not inits:
        raise ValueError(f"no init time in {start}..{end} every {every} has the store's fields at every lead {leads}")
    inits_idx = pd.DatetimeIndex(inits)
    rng = np.random.default_rng(seed)
    out = {}
    requested = _fields(truth, variables)
    # one shared level axis (WeatherBench 2 stores): every requested variable at every requested level
    levels = sorted({lv for _, lv in requested if lv is not None})
    names = list(dict.fromkeys(n for n, _ in requested))
    fields = [(n, lv) for n in names for lv in ([None] if "level" not in truth[n].dims else levels)]
    by_name: dict[str, list[xr.DataArray]] = {}
    for name, level in fields:
        da = truth[name] if level is None else truth[name].sel(level=level)
        sd = da.std("time").load()
        if "land_sea_mask" in truth:
            pattern = 2.0 * truth["land_sea_mask"].load() - 1.0
        else:
            pattern = np.cos(np.deg2rad(da["latitude"])) * np.sin(np.deg2rad(da["longitude"]))
        y0 = da.sel(time=inits_idx).load()
        per_lead = []
        for lt in lead_td:
            hours = lt / pd.Timedelta("1h")
            yv = da.sel(time=inits_idx + lt).load().assign_coords(time=inits_idx)
            sigma = (0.25 * np.sqrt(hours / 24.0) * (0.3 * sd + 0.7 * abs(yv - y0))).transpose(*yv.dims)
            bias = (0.3 * np.sqrt(hours / 24.0) * sd * pattern).broadcast_like(yv).transpose(*yv.dims)
            eta = rng.standard_normal(yv.shape)
            eps = rng.standard_normal((members, *yv.shape))
            x = (yv.values + bias.values)[None] + sigma.values[None] * (eta[None] + SPREAD_RATIO * eps)
            per_lead.append(xr.DataArray(x.astype(np.float32), dims=("member", *yv.dims),
                                         coords={"member": np.arange(members), **yv.coords}))
        fc = xr.concat(per_lead, "prediction_timedelta").assign_coords(
            prediction_timedelta=np.array([lt.to_timedelta64() for lt in lead_td], "timedelta64[ns]"))
        if level is not None:
            fc = fc.expand_dims(level=[level])
        by_name.setdefault(name, []).append(fc.drop_vars([c for c in fc.coords if c not in fc.dims]))
    for name, parts in by_name.items():
        da = xr.concat(parts, "level") if len(parts) > 1 else parts[0]
        order = [d for d in ("time", "prediction_timedelta", "member", "level", "latitude", "longitude")
                 if d in da.dims]
        out[name] = da.transpose(*order).assign_attrs(truth[name].attrs)
    ds = xr.Dataset(out)
    for c in ("latitude", "longitude", "level", "time"):
        if c in ds.coords and c in truth.coords:
            ds[c].attrs = dict(truth[c].attrs)
    ds.attrs = {"forecast_kind": "ensemble", "synthetic": "imperfect ensemble: location-dependent bias, "
                "flow-dependent under-dispersive spread (smoeweather.postprocess.synthetic)",
                "seed": seed, "spread_ratio": SPREAD_RATIO}
    return ds


def write_synthetic_ensemble(store: str | Path, out: str | Path, overwrite: bool = False, **kwargs: object) -> Path:
    """:func:`synthetic_ensemble` of the canonical ``store`` written as a zarr ensemble store (atomically); an
    ``out`` that is, contains or lies inside ``store`` is refused first."""
    from smoeweather.io import check_output

    store = Path(store)
    if not store.exists():
        raise FileNotFoundError(f"store {store} does not exist")
    check_output(out, overwrite, inputs=[store])
    truth = open_data(store, "store")
    ds = synthetic_ensemble(truth, **kwargs)  # type: ignore[arg-type]
    return write_store(ds, out, "ensemble", {"truth_store": str(store)}, overwrite=overwrite, time_chunk=8)
