"""The score set of one forecast field against its truth, per forecast kind (pure xarray in and out).

``forecast_scores`` is what ``smoe evaluate`` (:mod:`smoeweather.evaluate`) computes for every (method, field):
latitude-weighted RMSE and bias of the point forecast (ensemble mean, Gaussian μ, median of the quantiles),
ACC with a climatology, and by kind the fair and the empirical (ECDF) ensemble CRPS and spread–skill ratio,
the closed-form Gaussian CRPS and spread–skill ratio, or the pinball loss averaged over the quantile levels.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import numpy as np
import xarray as xr

from smoeweather.metrics import deterministic as det
from smoeweather.metrics import probabilistic
from smoeweather.metrics.weights import weighted_mean

METRICS = ("rmse", "bias", "acc", "crps", "crps_ecdf", "spread_skill", "diversity_ratio", "quantile_loss")
"""Every score ``forecast_scores`` may return, in table order."""
SPACE_TIME = ("time", "latitude", "longitude")


def median_of_quantiles(da: xr.DataArray) -> xr.DataArray:
    """The 0.5 quantile of a quantile forecast (dim ``quantile``): taken if present, else linearly
    interpolated between the levels around 0.5, else the level nearest 0.5."""
    q = da["quantile"].values
    if np.any(np.isclose(q, 0.5)):
        return da.sel(quantile=q[np.isclose(q, 0.5)][0], drop=True)
    if q.min() < 0.5 < q.max():
        return da.interp(quantile=0.5).drop_vars("quantile")
    return da.isel(quantile=int(np.argmin(abs(q - 0.5))), drop=True)


def forecast_scores(forecast: xr.DataArray, kind: str, truth: xr.DataArray, weights: xr.DataArray,
                    sigma: xr.DataArray | None = None, climatology: xr.DataArray | None = None,
                    dims: Sequence[Hashable] = SPACE_TIME) -> dict[str, xr.DataArray]:
    """{metric: score reduced over ``dims``} of one field (computed, float64).

    ``forecast``: (time, prediction_timedelta, [member | quantile], latitude, longitude) of ``kind``
    (deterministic, ensemble, gaussian: μ with ``sigma`` = σ, quantiles); ``truth``, ``climatology``: the
    same without member/quantile, at the valid times; ``weights``: latitude weights (mean 1). Units: those of
    the field, ACC and spread–skill dimensionless.
    """
    da = forecast.astype(np.float64)
    if kind == "ensemble":
        point = da.mean("member")
    elif kind == "quantiles":
        point = median_of_quantiles(da)
    else:
        point = da
    out = {"rmse": det.rmse(point, truth, weights, dims), "bias": det.bias(point, truth, weights, dims)}
    if climatology is not None:
        out["acc"] = det.acc(point, truth, climatology, weights, dims)
    if kind == "deterministic":  # a one-member ensemble: its CRPS is its mean absolute error
        out["crps"] = out["crps_ecdf"] = weighted_mean(abs(point - truth), dims, weights)
    elif kind == "ensemble":
        out["crps"] = weighted_mean(probabilistic.crps_ensemble(da, truth, estimator="fair"), dims, weights)
        # the CRPS of the members' own empirical distribution: the proper score of the forecast as issued. The
        # fair CRPS estimates the CRPS of the distribution the members are DRAWN from, which assumes
        # exchangeable draws; members trained jointly on a (fair) CRPS loss are not, and can lower the fair
        # score by spreading out without being a better forecast (docs/guide/ensembles.md)
        out["crps_ecdf"] = weighted_mean(probabilistic.crps_ensemble(da, truth, estimator="standard"), dims,
                                         weights)
        if da.sizes["member"] > 1:
            out["spread_skill"] = probabilistic.spread_skill_ratio(da, truth, weights, dims)
            # diversity_ratio and rank_histogram (dims prediction_timedelta × rank) of the members
            out.update(probabilistic.ensemble_diagnostics(da, truth, weights, dims))
    elif kind == "gaussian":
        if sigma is None:
            raise ValueError("a gaussian forecast needs sigma (its <name>_std variable)")
        sd = sigma.astype(np.float64)
        out["crps"] = out["crps_ecdf"] = weighted_mean(probabilistic.crps_gaussian(da, sd, truth), dims, weights)
        out["spread_skill"] = probabilistic.spread_skill_ratio_gaussian(da, sd, truth, weights, dims)
    elif kind == "quantiles":
        out["quantile_loss"] = weighted_mean(probabilistic.quantile_loss(da, truth).mean("quantile"), dims, weights)
    return {k: v.compute() for k, v in out.items()}
