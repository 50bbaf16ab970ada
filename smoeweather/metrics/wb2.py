"""WeatherBench 2's metrics, metric for metric, and its evaluation files (pure xarray in and out).

Every function returns the per-initialisation area means that WB2's ``Metric.compute_chunk`` returns; the
evaluation files take their mean over initialisations (:func:`evaluation_files`). Definitions, with ``w`` the
area weights (:func:`cell_area_weights`, WB2's ``get_lat_weights``) and ``⟨·⟩`` the weighted mean over
latitude and longitude:

==========================  ===================================================================================
``mse``, ``bias``, ``mae``   ⟨(f − y)²⟩, ⟨f − y⟩, ⟨|f − y|⟩ of the point forecast (ensemble mean, Gaussian μ)
``acc``                      ⟨f′y′⟩ / √(⟨f′²⟩⟨y′²⟩), anomalies against the climatology at the valid time
``rmse_sqrt_before_time_avg``  √⟨(f − y)²⟩ per initialisation (``deterministic_temporal`` only)
``crps_skill``               ⟨E|X − y|⟩ over the members
``crps_spread``              ⟨E|X − X′|⟩, the unbiased pairwise estimate Σ(2i − M − 1)x₍ᵢ₎ · 2/(M(M − 1))
``crps``                     crps_skill − crps_spread / 2 (the fair CRPS); Gaussian: closed form
``ensemble_mean_mse``        ⟨(x̄ − y)²⟩; Gaussian: ⟨(μ − y)²⟩
``debiased_ensemble_mean_mse``  ⟨(x̄ − y)² − s²/M⟩, s² with ddof 1
``ensemble_variance``        ⟨s²⟩ (ddof 1; 0 for one member); Gaussian: ⟨σ²⟩
``brier_score``              ⟨(p − 1{y > t})²⟩, p the fraction of members above t (Gaussian: 1 − Φ((t − μ)/σ))
``debiased_brier_score``     ⟨(p − 1{y > t})² − p(1 − p)/(M − 1)⟩ (WB2: the debiased MSE of the indicators)
``ignorance_score``          ⟨−log p⟩ where y > t, ⟨−log(1 − p)⟩ elsewhere (inf where a certain forecast missed)
==========================  ===================================================================================

Thresholds ``t`` are climatological quantiles at the valid time and grid point (a ``quantile`` dim).

Where the two differ, on purpose: WB2's spatial mean propagates NaN (``skipna=False``); here a point whose
forecast or truth is missing is left out of the mean with its weight (identical on complete fields, and
``smoe evaluate`` refuses missing forecast data unless told otherwise). The time mean is over the
initialisations whose valid time the truth holds.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import numpy as np
import xarray as xr
from scipy import stats

from smoeweather.metrics.probabilistic import crps_gaussian
from smoeweather.metrics.scores import area_mean as scores_area_mean

SPACE: tuple[str, str] = ("latitude", "longitude")

EVALUATIONS: dict[str, tuple[str, ...]] = {
    "deterministic": ("mse", "acc", "bias", "mae"),
    "deterministic_temporal": ("mse", "acc", "bias", "mae", "rmse_sqrt_before_time_avg"),
    "probabilistic": ("crps", "crps_spread", "crps_skill", "ensemble_mean_mse", "debiased_ensemble_mean_mse",
                      "ensemble_variance"),
    "ensemble_binary": ("brier_score", "debiased_brier_score", "ignorance_score"),
    "gaussian_probabilistic": ("crps", "ensemble_mean_mse", "ensemble_variance"),
    "gaussian_binary": ("brier_score", "ignorance_score"),
}
"""WB2 evaluation name → the metrics its file holds (``deterministic_temporal`` keeps the ``time`` dim)."""

DEFAULT_QUANTILES: tuple[float, ...] = (0.1, 0.5, 0.9)
"""Climatological quantiles at which the binary evaluations score exceedance (``--binary-quantiles``)."""


def area_mean(x: xr.DataArray, weights: xr.DataArray) -> xr.DataArray:
    """Weighted mean over latitude and longitude (:func:`smoeweather.metrics.scores.area_mean`); ``weights`` may
    carry a ``region`` dim (kept). Missing points drop out with their weight; infinite values propagate."""
    return scores_area_mean(x, weights, SPACE)


def deterministic_terms(point: xr.DataArray, truth: xr.DataArray, weights: xr.DataArray,
                        climatology: xr.DataArray | None = None) -> dict[str, xr.DataArray]:
    """Per-initialisation ``mse``, ``bias``, ``mae`` [``acc``] of a point forecast (time, lead, lat, lon),
    units of the field (mse squared; acc 1)."""
    err = point - truth
    out = {"mse": area_mean(err**2, weights), "bias": area_mean(err, weights), "mae": area_mean(abs(err), weights)}
    if climatology is not None:
        fa, oa = point - climatology, truth - climatology
        den = np.sqrt(area_mean(fa**2, weights) * area_mean(oa**2, weights))
        out["acc"] = area_mean(fa * oa, weights) / den.where(den > 0)
    return out


def _pairwise_spread(forecast: xr.DataArray, member_dim: str) -> xr.DataArray:
    """E|X − X′| per point, unbiased: 2 Σᵢ (2i − M − 1) x₍ᵢ₎ / (M(M − 1)) over the sorted members (0 for M = 1)."""
    m = forecast.sizes[member_dim]
    if m < 2:
        return xr.zeros_like(forecast.isel({member_dim: 0}, drop=True))
    ordered = xr.apply_ufunc(np.sort, forecast, input_core_dims=[[member_dim]], output_core_dims=[[member_dim]],
                             kwargs={"axis": -1}, dask="parallelized", output_dtypes=[np.float64],
                             dask_gufunc_kwargs={"allow_rechunk": True})  # stores chunked along the members
    coef = xr.DataArray(2.0 * np.arange(1, m + 1) - m - 1, dims=member_dim)
    return 2.0 * (ordered * coef).sum(member_dim) / (m * (m - 1))


def ensemble_terms(forecast: xr.DataArray, truth: xr.DataArray, weights: xr.DataArray,
                   member_dim: str = "member") -> dict[str, xr.DataArray]:
    """Per-initialisation ``crps``, ``crps_spread``, ``crps_skill``, ``ensemble_mean_mse``,
    ``debiased_ensemble_mean_mse`` (NaN for one member, as WB2) and ``ensemble_variance`` of an ensemble."""
    m = forecast.sizes[member_dim]
    mean = forecast.mean(member_dim)
    variance = forecast.var(member_dim, ddof=1) if m > 1 else xr.zeros_like(mean)
    skill = area_mean(abs(forecast - truth).mean(member_dim), weights)
    spread = area_mean(_pairwise_spread(forecast, member_dim), weights)
    debiased = (mean - truth) ** 2 - variance / m if m > 1 else xr.full_like(mean, np.nan)
    return {"crps": skill - 0.5 * spread, "crps_spread": spread, "crps_skill": skill,
            "ensemble_mean_mse": area_mean((mean - truth) ** 2, weights),
            "debiased_ensemble_mean_mse": area_mean(debiased, weights),
            "ensemble_variance": area_mean(variance, weights)}


def gaussian_terms(mu: xr.DataArray, sigma: xr.DataArray, truth: xr.DataArray, weights: xr.DataArray
                   ) -> dict[str, xr.DataArray]:
    """Per-initialisation ``crps`` (closed form), ``ensemble_mean_mse`` (of μ) and ``ensemble_variance`` (σ²)."""
    return {"crps": area_mean(crps_gaussian(mu, sigma, truth), weights),
            "ensemble_mean_mse": area_mean((mu - truth) ** 2, weights),
            "ensemble_variance": area_mean(sigma**2, weights)}


def _ignorance(p: xr.DataArray, event: xr.DataArray) -> xr.DataArray:
    """−log of the probability given to what happened; +inf where it was 0 (as WB2), NaN where no event."""
    realized = xr.where(event > 0.5, p, 1.0 - p).where(event.notnull())
    return xr.where(realized > 0, -np.log(realized.where(realized > 0)), np.inf).where(realized.notnull())


def ensemble_binary_terms(forecast: xr.DataArray, truth: xr.DataArray, thresholds: xr.DataArray,
                          weights: xr.DataArray, member_dim: str = "member") -> dict[str, xr.DataArray]:
    """Per-initialisation ``brier_score``, ``debiased_brier_score`` and ``ignorance_score`` of the event
    truth > threshold; ``thresholds`` has a ``quantile`` dim (kept) and broadcasts against the truth."""
    m = forecast.sizes[member_dim]
    event = (truth > thresholds).astype(np.float64).where(truth.notnull())
    above = (forecast > thresholds).astype(np.float64).where(forecast.notnull())
    p = above.mean(member_dim)
    brier = (p - event) ** 2
    debiased = brier - above.var(member_dim, ddof=1) / m if m > 1 else xr.full_like(brier, np.nan)
    return {"brier_score": area_mean(brier, weights), "debiased_brier_score": area_mean(debiased, weights),
            "ignorance_score": area_mean(_ignorance(p, event), weights)}


def gaussian_binary_terms(mu: xr.DataArray, sigma: xr.DataArray, truth: xr.DataArray, thresholds: xr.DataArray,
                          weights: xr.DataArray) -> dict[str, xr.DataArray]:
    """Per-initialisation ``brier_score`` and ``ignorance_score`` of N(μ, σ²) for truth > threshold."""
    event = (truth > thresholds).astype(np.float64).where(truth.notnull())
    cdf = xr.apply_ufunc(stats.norm.cdf, (thresholds - mu) / sigma, dask="allowed")
    p = 1.0 - cdf
    return {"brier_score": area_mean((p - event) ** 2, weights), "ignorance_score": area_mean(_ignorance(p, event),
                                                                                             weights)}


def evaluation_files(per_init: dict[str, dict[str, xr.DataArray]], time_dim: Hashable = "time"
                     ) -> dict[str, xr.Dataset]:
    """{evaluation: Dataset} from {evaluation family: {metric: per-init DataArray with a ``field`` dim}}.

    Families: ``deterministic``, ``probabilistic``, ``ensemble_binary``, ``gaussian_probabilistic``,
    ``gaussian_binary``; the ``deterministic_temporal`` file is the deterministic terms per initialisation
    plus √mse. Each Dataset has a ``metric`` dim; the means over ``time_dim`` skip initialisations without truth.
    """
    out: dict[str, xr.Dataset] = {}
    for family, terms in per_init.items():
        if not terms:
            continue
        if family == "deterministic":
            temporal = dict(terms, rmse_sqrt_before_time_avg=np.sqrt(terms["mse"]))
            out["deterministic_temporal"] = _stack(temporal, EVALUATIONS["deterministic_temporal"])
        means = {k: v.mean(time_dim, skipna=True) for k, v in terms.items()}
        out[family] = _stack(means, EVALUATIONS[family])
    return out


def _stack(terms: dict[str, xr.DataArray], order: Sequence[str]) -> xr.Dataset:
    names = [k for k in order if k in terms]
    da = xr.concat([terms[k].expand_dims(metric=[k]) for k in names], "metric", coords="minimal",
                   compat="override", join="outer")
    return da.to_dataset(name="value")


__all__ = ["DEFAULT_QUANTILES", "EVALUATIONS", "area_mean", "deterministic_terms",
           "ensemble_binary_terms", "ensemble_terms", "evaluation_files", "gaussian_binary_terms",
           "gaussian_terms"]
