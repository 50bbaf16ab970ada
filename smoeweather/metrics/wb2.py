"""WeatherBench 2's metrics and its evaluation files (pure xarray in and out).

The metrics are not computed here: every per-initialisation term is computed once, for our tables and these
files alike, by :func:`smoeweather.metrics.scores.field_terms` (WB2's ``Metric.compute_chunk``), and
:func:`metric_terms` names those very arrays as WB2 does; the evaluation files take their mean over
initialisations (:func:`evaluation_files`, WB2's ``compute``). Definitions, with ``w`` the area weights
(:func:`~smoeweather.metrics.weights.cell_area_weights`, WB2's ``get_lat_weights``) and ``⟨·⟩`` the weighted mean
over latitude and longitude:

==========================  ===================================================================================
``mse``, ``bias``, ``mae``   ⟨(f − y)²⟩, ⟨f − y⟩, ⟨|f − y|⟩ of the point forecast (ensemble mean, Gaussian μ)
``acc``                      ⟨f′y′⟩ / √(⟨f′²⟩⟨y′²⟩), anomalies against the climatology at the valid time
``rmse_sqrt_before_time_avg``  √⟨(f − y)²⟩ per initialisation (``deterministic_temporal`` only)
``crps_skill``               ⟨E|X − y|⟩ over the members
``crps_spread``              ⟨E|X − X′|⟩, the unbiased pairwise estimate Σ(2i − M − 1)x₍ᵢ₎ · 2/(M(M − 1))
``crps``                     crps_skill − crps_spread / 2 (the fair CRPS); Gaussian: closed form
``ensemble_mean_mse``        ⟨(x̄ − y)²⟩; Gaussian: ⟨(μ − y)²⟩ (the term ``mse`` itself)
``debiased_ensemble_mean_mse``  ⟨(x̄ − y)² − s²/M⟩, s² with ddof 1 (none for one member, as WB2's NaN)
``ensemble_variance``        ⟨s²⟩ (ddof 1; 0 for one member); Gaussian: ⟨σ²⟩
``brier_score``              ⟨(p − 1{y > t})²⟩, p the fraction of members above t (Gaussian: 1 − Φ((t − μ)/σ))
``debiased_brier_score``     ⟨(p − 1{y > t})² − p(1 − p)/(M − 1)⟩ (WB2: the debiased MSE of the indicators)
``ignorance_score``          ⟨−log p⟩ where y > t, ⟨−log(1 − p)⟩ elsewhere (inf where a certain forecast missed)
==========================  ===================================================================================

Thresholds ``t`` are climatological quantiles at the valid time and grid point (a ``quantile`` dim).

Where the two differ, on purpose: WB2's spatial mean propagates NaN (``skipna=False``); here a point whose
forecast or truth is missing is left out of the mean with its weight (ACC: out of all three means; identical on
complete fields, and ``smoe evaluate`` refuses missing forecast data unless told otherwise). The time mean is
over the initialisations whose valid time the truth holds.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence

import numpy as np
import xarray as xr

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


WB2_TERM: dict[str, str] = {"ensemble_mean_mse": "mse"}
"""WB2 metric → the term of :func:`smoeweather.metrics.scores.field_terms` it is, where the names differ (every
other metric is the term of its own name)."""


def families(kind: str) -> tuple[str, ...]:
    """The WB2 evaluation families a forecast of ``kind`` gets (``deterministic_temporal`` comes with
    ``deterministic``, :func:`evaluation_files`)."""
    return {"ensemble": ("deterministic", "probabilistic", "ensemble_binary"),
            "gaussian": ("deterministic", "gaussian_probabilistic", "gaussian_binary")}.get(kind, ("deterministic",))


def metric_terms(terms: Mapping[str, xr.DataArray], kind: str) -> dict[str, xr.DataArray]:
    """{WB2 metric: per-initialisation DataArray} of the evaluations of a forecast of ``kind``: the terms of
    :func:`smoeweather.metrics.scores.field_terms` themselves (the same arrays, not recomputed), under WB2's
    names; a term the forecast has not (``acc`` without a climatology, the binary ones without thresholds) is
    left out."""
    out: dict[str, xr.DataArray] = {}
    for family in families(kind):
        for metric in EVALUATIONS[family]:
            term = WB2_TERM.get(metric, metric)
            if term in terms and metric not in out:
                out[metric] = terms[term]
    return out


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


__all__ = ["DEFAULT_QUANTILES", "EVALUATIONS", "WB2_TERM", "evaluation_files", "families", "metric_terms"]
