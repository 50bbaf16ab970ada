"""Apply a post-processing network checkpoint (U-Net or SMoE-U-Net of ``smoe train`` with a ``postprocess`` or
``ens10`` config) to any ensemble forecast in the project convention: Gaussian (μ, σ) of every target out.

The network sees exactly what :class:`~smoeweather.data.ensemble_dataset.EnsembleDataset` gave it in training (the
checkpoint carries the field statistics, the static maps and the sample layout), so a checkpoint calibrates a
forecast it never saw: another season, another stream, another machine. The forecast must have the training
grid, fields, levels, leads and member count; a mismatch is refused by name before anything is computed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
import xarray as xr

from smoeweather.data.ensemble_dataset import EnsembleDataset, EnsembleSpec, check_forecast
from smoeweather.data.forecast_stores import check_grid, lead_timedeltas
from smoeweather.data.weather import field_name

CACHE_LIMIT_BYTES = 2 * 1024**3
"""Moments of a forecast smaller than this are computed in one pass; larger ones sample by sample."""


def apply_checkpoint(
    checkpoint: str | Path, forecast: xr.Dataset, batch_size: int = 8
) -> tuple[xr.Dataset, xr.Dataset, dict[str, Any]]:
    """(μ, σ, attrs) of every target of the checkpoint for every init of ``forecast`` (its trained leads).

    μ, σ: Datasets with one variable per target variable on (time, prediction_timedelta, [level], latitude,
    longitude), units of the field (levels that are not a target of that variable hold NaN). Raises
    ValueError for a checkpoint of another task, or a missing field/level/lead, another grid or member count.
    """
    from smoeweather.models.loader import load_network

    trained = load_network(checkpoint)
    where = f"{checkpoint} applied to {forecast.attrs.get('source_files', 'the forecast')}"
    meta = trained.metadata or {}
    if trained.task != "postprocess" or "spec" not in meta:
        raise ValueError(f"{checkpoint} is a {trained.task!r} checkpoint; post-processing needs a postprocess one")
    spec = EnsembleSpec.from_config(meta["spec"])
    check_forecast(forecast, spec, where)
    check_grid(forecast, meta["latitude"], meta["longitude"], where, "the training grid")
    members = int(meta["members"])
    if forecast.sizes["member"] != members:
        raise ValueError(f"{where}: {forecast.sizes['member']} members; the network was trained on {members} "
                         "(the ensemble std it reads depends on the member count)")
    stats = {k: (float(v[0]), float(v[1])) for k, v in meta["stats"].items()}
    original, forecast = forecast, in_trained_units(forecast, meta.get("variables", {}), where)
    forecast = forecast.sortby("latitude")
    size = 4 * forecast.sizes["time"] * len(spec.leads_h) * forecast.sizes["latitude"] * forecast.sizes["longitude"]
    data = EnsembleDataset(forecast, None, spec, stats=stats, source=where,
                           cache=size * 2 * (len(spec.predictors) + len(spec.targets)) < CACHE_LIMIT_BYTES)
    nt, nl, grid = len(data.times), len(spec.leads_h), data.grid
    targets = list(spec.targets)
    mu = np.full((len(targets), nt, nl, *grid), np.nan, np.float32)
    sigma = np.full_like(mu, np.nan)
    model = trained.model.eval()
    for start in range(0, len(data), batch_size):
        items = list(range(start, min(start + batch_size, len(data))))
        x, _, m, s = (torch.stack(parts) for parts in zip(*(data[i] for i in items)))
        with torch.no_grad():
            out_mu, out_sigma = model(x, m, s)  # (B, T', H, W) normalised
        for b, i in enumerate(items):
            t, k = data.index[i]
            leads = range(nl) if k is None else [k]
            c = 0
            for li in leads:
                for j, f in enumerate(targets):
                    mean, std = stats[field_name(f)]
                    mu[j, t, li] = out_mu[b, c].numpy() * std + mean
                    sigma[j, t, li] = out_sigma[b, c].numpy() * std
                    c += 1
    mu_ds, sigma_ds = _to_datasets(mu, forecast, spec), _to_datasets(sigma, forecast, spec)
    mu_ds, sigma_ds = in_forecast_units(mu_ds, sigma_ds, original, where)
    attrs = {"method": "network", "checkpoint": str(checkpoint), "checkpoint_sha256": trained.sha256,
             "model": str(trained.config["model"].get("name", "")),
             "smoe": int(bool(trained.config["model"].get("smoe", False))), "members": members,
             "predictors": " ".join(meta["spec"]["variables"]),
             "static_inputs": " ".join(meta.get("static_names", [])),
             "train_inits": " ".join(meta.get("train_inits", []))}
    return mu_ds, sigma_ds, attrs


def _trained_units(records: dict[str, Any]) -> dict[str, str]:
    """{variable: units} a network was trained in, from its card's ``variables`` records (empty for a checkpoint
    written before the card recorded them)."""
    return {str(r["variable"]): str(r["units"]) for r in records.values() if r.get("units")}


def in_trained_units(forecast: xr.Dataset, records: dict[str, Any], where: str) -> xr.Dataset:
    """``forecast`` with every variable the network reads in the units it was trained in (``smoeweather.units``:
    converted exactly with a note, or refused naming both); unchanged for a checkpoint without recorded units."""
    from smoeweather.units import convert, units_of

    out = forecast
    for name, want in _trained_units(records).items():
        if name in forecast.data_vars and units_of(forecast[name]) != want:
            out = out.assign({name: convert(forecast[name], want, name, f"forecast ({where})", "the network")})
    return out


def in_forecast_units(mu: xr.Dataset, sigma: xr.Dataset, forecast: xr.Dataset, where: str
                      ) -> tuple[xr.Dataset, xr.Dataset]:
    """μ (values) and σ (a spread: scale only) back in the units of the raw ``forecast``'s variables."""
    from smoeweather.units import conversion, units_of

    for name in list(mu.data_vars):
        have, want = units_of(mu[name]), units_of(forecast[name]) if name in forecast.data_vars else ""
        conv = conversion(str(name), have, "the network", want, f"forecast ({where})") if have and want else None
        if conv is not None:
            mu = mu.assign({name: conv.value(mu[name]).assign_attrs({**mu[name].attrs, "units": want})})
            sigma = sigma.assign({name: conv.spread(sigma[name]).assign_attrs({**sigma[name].attrs, "units": want})})
    return mu, sigma


def _to_datasets(values: np.ndarray, forecast: xr.Dataset, spec: EnsembleSpec) -> xr.Dataset:
    """(T, time, lead, H, W) per-target arrays → one variable per target name, levels stacked (NaN elsewhere)."""
    leads = lead_timedeltas(spec.leads_h)
    coords = {"time": forecast["time"].values, "prediction_timedelta": leads,
              "latitude": forecast["latitude"].values, "longitude": forecast["longitude"].values}
    dims = ("time", "prediction_timedelta", "latitude", "longitude")
    out = {}
    for name in dict.fromkeys(n for n, _ in spec.targets):
        idx = [(j, lev) for j, (n, lev) in enumerate(spec.targets) if n == name]
        attrs = dict(forecast[name].attrs)
        if idx[0][1] is None:
            out[name] = xr.DataArray(values[idx[0][0]], dims=dims, coords=coords, attrs=attrs)
            continue
        levels = sorted(lev for _, lev in idx)
        arr = np.stack([values[j] for j, _ in sorted(idx, key=lambda p: p[1])], axis=2)
        out[name] = xr.DataArray(arr, dims=(*dims[:2], "level", *dims[2:]),
                                 coords={**coords, "level": levels}, attrs=attrs)
    ds = xr.Dataset(out)
    ds["prediction_timedelta"].attrs.update(standard_name="forecast_period", long_name="lead time")
    return ds
