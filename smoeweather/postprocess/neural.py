"""Apply an ENS-10 post-processing checkpoint (U-Net or SMoE-U-Net of ``smoe train`` with configs/ens10/*.yaml)
to an ensemble store: ensemble mean/std of the predictor fields in, Gaussian (μ, σ) of the target out.

The network sees exactly what :class:`~smoeweather.data.ens10.Ens10Dataset` gave it in training: per
predictor field the ensemble mean and the ensemble standard deviation (ddof = 1) in physical units (the
checkpoint's :class:`~smoeweather.training.postprocessing.Ens10Postprocessor` normalises with its saved
statistics), plus the target field's ensemble mean/std for the Gaussian head. Every lead of the store is
processed (the network was trained at one lead; applying it at others is the caller's choice).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
import xarray as xr

from smoeweather.data.weather import field_name, parse_fields


def _field(forecast: xr.Dataset, name: str, level: int | None, where: str) -> xr.DataArray:
    if name not in forecast.data_vars:
        raise ValueError(f"{where}: the checkpoint needs {name!r}; the store has {list(forecast.data_vars)}")
    da = forecast[name]
    if level is not None:
        if "level" not in da.dims or level not in da["level"].values:
            raise ValueError(f"{where}: the checkpoint needs {name} at {level} hPa; not in the store")
        da = da.sel(level=level, drop=True)
    elif "level" in da.dims:
        raise ValueError(f"{where}: {name} has levels; the checkpoint expects a single-level field")
    return da.transpose("time", "prediction_timedelta", "member", "latitude", "longitude")


def apply_checkpoint(
    checkpoint: str | Path, forecast: xr.Dataset, batch_size: int = 8
) -> tuple[xr.Dataset, xr.Dataset, dict[str, Any]]:
    """(μ, σ, attrs) of the checkpoint's target field for every (time, prediction_timedelta) of ``forecast``.

    μ, σ: Datasets with the target variable on (time, prediction_timedelta, [level], latitude, longitude),
    units of the field. Raises ValueError for a checkpoint of another task, a missing field, or a grid or
    ensemble size other than the training one (when the config records it).
    """
    from smoeweather.training.checkpoint import load_trained

    trained = load_trained(checkpoint)
    where = str(checkpoint)
    if trained.task != "ens10":
        raise ValueError(f"{where} is a {trained.task!r} checkpoint; post-processing needs an ens10 one")
    dcfg = trained.config["data"]
    predictors = parse_fields(dcfg["variables"])
    targets = parse_fields(dcfg.get("target_variables") or dcfg["variables"])
    if len(targets) != 1:
        raise ValueError(f"{where}: expected one target field, got {[field_name(t) for t in targets]}")
    members = dcfg.get("members")
    if members is not None and int(members) != forecast.sizes["member"]:
        raise ValueError(f"{where} was trained on {members} members; the store has {forecast.sizes['member']}")
    grid = trained.config["model"].get("grid")
    shape = [forecast.sizes["latitude"], forecast.sizes["longitude"]]
    if grid is not None and list(grid) != shape:
        raise ValueError(f"{where} was trained on a {grid} grid; the store's grid is {shape}")
    fields = [_field(forecast, n, lv, where) for n, lv in predictors]
    tname, tlevel = targets[0]
    target = _field(forecast, tname, tlevel, where)
    nt, nl = forecast.sizes["time"], forecast.sizes["prediction_timedelta"]
    mu = np.empty((nt, nl, *shape), np.float32)
    sigma = np.empty_like(mu)
    model = trained.model.eval()
    pairs = [(i, j) for i in range(nt) for j in range(nl)]
    for start in range(0, len(pairs), batch_size):
        chunk = pairs[start : start + batch_size]
        ti = xr.DataArray([i for i, _ in chunk], dims="b")
        li = xr.DataArray([j for _, j in chunk], dims="b")
        xs = []
        for da in fields:
            ens = np.asarray(da.isel(time=ti, prediction_timedelta=li).values, np.float64)  # (B, M, H, W)
            xs += [ens.mean(1), ens.std(1, ddof=1)]
        x = torch.from_numpy(np.stack(xs, 1).astype(np.float32))
        tens = np.asarray(target.isel(time=ti, prediction_timedelta=li).values, np.float64)
        with torch.no_grad():
            m, s = model(x, torch.from_numpy(tens.mean(1).astype(np.float32)),
                         torch.from_numpy(tens.std(1, ddof=1).astype(np.float32)))
        for k, (i, j) in enumerate(chunk):
            mu[i, j], sigma[i, j] = m[k].numpy(), s[k].numpy()
    coords = {d: forecast[d] for d in ("time", "prediction_timedelta", "latitude", "longitude")}
    dims = ("time", "prediction_timedelta", "latitude", "longitude")
    mu_da = xr.DataArray(mu, dims=dims, coords=coords, attrs=dict(forecast[tname].attrs))
    sigma_da = xr.DataArray(sigma, dims=dims, coords=coords, attrs=dict(forecast[tname].attrs))
    if tlevel is not None:
        mu_da = mu_da.expand_dims(level=[tlevel], axis=2)
        sigma_da = sigma_da.expand_dims(level=[tlevel], axis=2)
    attrs = {"method": "ens10_network", "checkpoint": str(checkpoint), "checkpoint_sha256": trained.sha256,
             "model": str(trained.config["model"].get("name", "")), "smoe": int(bool(trained.config["model"].get(
                 "smoe", False))), "members": int(forecast.sizes["member"]),
             "predictors": " ".join(field_name(f) for f in predictors)}
    return xr.Dataset({tname: mu_da}), xr.Dataset({tname: sigma_da}), attrs
