"""Scores of post-processed forecasts on one split of an ensemble source, per target field and lead:
area-weighted CRPS (WB2's cell areas, as ``smoe evaluate``; closed-form Gaussian for (μ, σ); the fair
estimator for raw members), spread–skill ratio and bias of the mean, in the field's units. Used by the
post-processing study (:mod:`smoeweather.studies.run`) for networks, EMOS and the raw
ensemble alike, on the same inits.

When the source has a ``land_sea_mask``, every target is also scored over land and over sea (keys
``TARGET/land`` and ``TARGET/sea``, weighted by the cell area × the land fraction or its complement, as
``smoe evaluate --regions``); the plain ``TARGET`` key stays the global score.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import xarray as xr

from smoeweather.data.ensemble_dataset import EnsembleSpec
from smoeweather.data.forecast_stores import lead_label, lead_timedeltas, open_ensemble, open_truth, select_split
from smoeweather.data.weather import Field, field_name
from smoeweather.metrics.regions import parse_regions, region_weights
from smoeweather.metrics.scores import forecast_scores
from smoeweather.metrics.weights import cell_area_weights

METRICS = ("crps", "spread_skill", "bias")
SPACE_TIME = ("time", "latitude", "longitude")


def _sel(ds: xr.Dataset, f: Field) -> xr.DataArray:
    da = ds[f[0]]
    return (da.sel(level=f[1], drop=True) if f[1] is not None else da).astype(np.float64)


def _by_lead(da: xr.DataArray) -> dict[str, float]:
    return {lead_label(v): float(x) for v, x in zip(da["prediction_timedelta"].values, np.atleast_1d(da.values))}


def _scores(kind: str, forecast: xr.Dataset, truth: xr.Dataset, targets: Sequence[Field],
            sigma: xr.Dataset | None = None, land_sea_mask: xr.DataArray | None = None
            ) -> dict[str, dict[str, dict[str, float]]]:
    """{metric: {lead: {target: value}}} of :data:`METRICS` from :func:`~smoeweather.metrics.scores.forecast_scores`
    (the score set ``smoe evaluate`` computes) for every target; with ``land_sea_mask`` (latitude, longitude;
    land fraction) also ``target/land`` and ``target/sea``."""
    out: dict[str, dict[str, dict[str, float]]] = {m: {} for m in METRICS}
    if land_sea_mask is None:
        w, rw, suffixes = cell_area_weights(truth["latitude"]), None, {"": None}
    else:
        w = None
        lsm = land_sea_mask.reindex(latitude=truth["latitude"], longitude=truth["longitude"], method="nearest",
                                    tolerance=1e-3)  # the forecast's grid order
        if lsm.isnull().any():
            raise ValueError("the land_sea_mask's grid is not the forecast's: land and sea scores need one grid")
        rw = region_weights(parse_regions(["default"]), truth["latitude"], truth["longitude"], lsm)
        suffixes = {"" if r == "global" else f"/{r}": r for r in rw["region"].values.tolist()}
    for f in targets:
        scores = forecast_scores(_sel(forecast, f), kind, _sel(truth, f), w,
                                 sigma=None if sigma is None else _sel(sigma, f), dims=SPACE_TIME, regions=rw)
        for metric in METRICS:
            for suffix, region in suffixes.items():
                da = scores[metric] if region is None else scores[metric].sel(region=region, drop=True)
                for lead, v in _by_lead(da).items():
                    out[metric].setdefault(lead, {})[field_name(f) + suffix] = v
    return out


def config_land_sea_mask(dcfg: dict[str, Any]) -> xr.DataArray | None:
    """The land fraction (latitude, longitude; float64) of a postprocess config's source, or None when its
    files hold no land-sea mask (then only global scores)."""
    from smoeweather.data.forecast_stores import open_static

    try:
        static = open_static(dcfg.get("source") or dcfg.get("store"), ["land_sea_mask"])
    except ValueError:  # no land-sea mask in the source: global scores only
        return None
    return static["land_sea_mask"].astype(np.float64).load()


def score_gaussian(mu: xr.Dataset, sigma: xr.Dataset, truth: xr.Dataset, targets: Sequence[Field],
                   land_sea_mask: xr.DataArray | None = None) -> dict[str, dict[str, dict[str, float]]]:
    """{metric: {lead: {target: value}}} of N(μ, σ²) forecasts against ``truth`` (same dims, valid times):
    closed-form CRPS, spread–skill ratio, bias of μ; over land and sea too with ``land_sea_mask``."""
    return _scores("gaussian", mu, truth, targets, sigma, land_sea_mask)


def score_ensemble(forecast: xr.Dataset, truth: xr.Dataset, targets: Sequence[Field],
                   land_sea_mask: xr.DataArray | None = None) -> dict[str, dict[str, dict[str, float]]]:
    """{metric: {lead: {target: value}}} of raw ensemble members against ``truth``: fair CRPS, spread–skill
    ratio, bias of the ensemble mean; over land and sea too with ``land_sea_mask``."""
    return _scores("ensemble", forecast, truth, targets, land_sea_mask=land_sea_mask)


def open_config_data(dcfg: dict[str, Any]) -> tuple[xr.Dataset, xr.Dataset, EnsembleSpec]:
    """(forecast, truth on valid times, spec) of a postprocess config's ``data`` block, opened once (lazy)."""
    source = dcfg.get("source") or dcfg.get("store")
    forecast = open_ensemble(source)
    return forecast, open_truth(dcfg.get("truth"), source), EnsembleSpec.from_config(dcfg, forecast)


def split_forecast(dcfg: dict[str, Any], split: str, opened: tuple[xr.Dataset, xr.Dataset, EnsembleSpec] | None = None
                   ) -> tuple[xr.Dataset, xr.Dataset, EnsembleSpec]:
    """(forecast, truth at valid times, spec) of one split of a postprocess config's ``data`` block, at the
    spec's leads, loaded into memory; ``opened``: the result of :func:`open_config_data` to reuse."""
    forecast, truth, spec = opened or open_config_data(dcfg)
    leads = lead_timedeltas(spec.leads_h)
    names = list(dict.fromkeys(n for n, _ in (*spec.predictors, *spec.targets)))
    fc, truth_at = select_split(forecast[names], truth, spec.leads_h, spec.target_variables, split,
                                dcfg.get(f"{split}_years"), dcfg.get(f"{split}_period"),
                                str(dcfg.get("source") or dcfg.get("store")))
    return fc.sel(prediction_timedelta=leads).load(), truth_at.sel(prediction_timedelta=leads).load(), spec


def score_checkpoint(checkpoint: str, dcfg: dict[str, Any], split: str = "test"
                     ) -> dict[str, dict[str, dict[str, float]]]:
    """Scores of a post-processing network checkpoint on ``split`` of the config's source."""
    from smoeweather.postprocess.neural import apply_checkpoint

    opened = open_config_data(dcfg)
    fc, truth, spec = split_forecast(dcfg, split, opened)
    mu, sigma, _ = apply_checkpoint(checkpoint, fc)
    return score_gaussian(mu, sigma, truth, spec.targets, config_land_sea_mask(dcfg))


def reference_scores(dcfg: dict[str, Any], split: str = "test") -> dict[str, dict[str, dict[str, dict[str, float]]]]:
    """{method: scores} of the raw ensemble, global EMOS and per-grid-point EMOS, both EMOS fitted on the
    config's train split (the same inits the networks train on) and scored on ``split``."""
    from smoeweather.postprocess.emos import apply_emos, fit_emos

    opened = open_config_data(dcfg)
    train_fc, train_truth, spec = split_forecast(dcfg, "train", opened)
    test_fc, test_truth, _ = split_forecast(dcfg, split, opened)
    targets = list(spec.targets)
    names = list(dict.fromkeys(n for n, _ in targets))
    lsm = config_land_sea_mask(dcfg)
    out = {"raw": score_ensemble(test_fc[names], test_truth, targets, lsm)}
    for method, per_gridpoint in (("emos_global", False), ("emos_gridpoint", True)):
        params = fit_emos(train_fc[names], train_truth, per_gridpoint=per_gridpoint)
        mu, sigma = apply_emos(params, test_fc[names])
        out[method] = score_gaussian(mu, sigma, test_truth, targets, lsm)
    return out


__all__ = ["METRICS", "config_land_sea_mask", "open_config_data", "reference_scores", "score_checkpoint",
           "score_ensemble", "score_gaussian", "split_forecast"]
