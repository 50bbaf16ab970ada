"""The score set of one forecast field against its truth, per forecast kind (pure xarray in and out).

``forecast_scores`` is what ``smoe evaluate`` (:mod:`smoeweather.evaluate`) computes for every (method, field):
latitude-weighted RMSE and bias of the point forecast (ensemble mean, Gaussian μ, median of the quantiles),
ACC with a climatology, and by kind the fair and the empirical (ECDF) ensemble CRPS and spread–skill ratio,
the debiased ensemble-mean MSE and the energy score, the closed-form Gaussian CRPS and spread–skill ratio, or
the pinball loss averaged over the quantile levels.

Every score is computed in the WeatherBench 2 order: an area mean per initialisation (and lead) first, over
each region at once (``regions``: area weights with a ``region`` dim, :func:`smoeweather.metrics.regions.
region_weights`), then the mean over the initialisations. The per-initialisation area means are returned too
(``per_init=True``): they are what paired significance tests over initialisations need (the scorecard).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import dask
import numpy as np
import xarray as xr

from smoeweather.metrics import probabilistic
from smoeweather.metrics.deterministic import SPATIAL_DIMS

METRICS = ("rmse", "bias", "acc", "crps", "crps_ecdf", "spread_skill", "diversity_ratio", "quantile_loss",
           "debiased_ensemble_mean_mse", "energy_score")
"""Every score ``forecast_scores`` may return, in table order."""
SPACE_TIME = ("time", "latitude", "longitude")
PER_INIT: dict[str, str] = {"rmse": "mse", "bias": "bias", "acc": "acc", "crps": "crps", "crps_ecdf": "crps_ecdf",
                            "quantile_loss": "quantile_loss",
                            "debiased_ensemble_mean_mse": "debiased_ensemble_mean_mse",
                            "energy_score": "energy_score"}
"""metric → the per-initialisation area mean whose mean over initialisations gives it (RMSE: √ of the mean of
the per-init MSE); the other scores are ratios of such means and have no per-init value."""


def median_of_quantiles(da: xr.DataArray) -> xr.DataArray:
    """The 0.5 quantile of a quantile forecast (dim ``quantile``): taken if present, else linearly
    interpolated between the levels around 0.5, else the level nearest 0.5."""
    q = da["quantile"].values
    if np.any(np.isclose(q, 0.5)):
        return da.sel(quantile=q[np.isclose(q, 0.5)][0], drop=True)
    if q.min() < 0.5 < q.max():
        return da.interp(quantile=0.5).drop_vars("quantile")
    return da.isel(quantile=int(np.argmin(abs(q - 0.5))), drop=True)


def area_mean(x: xr.DataArray, weights: xr.DataArray, space: Sequence[Hashable]) -> xr.DataArray:
    """Weighted mean of ``x`` over ``space``, NaNs skipped with their weight; ``weights`` may carry extra dims
    (``region``), kept in the result. NaN where no point with weight > 0 has a value."""
    valid = x.notnull().astype(np.float64)
    num = xr.dot(x.fillna(0.0), weights, dim=list(space))
    den = xr.dot(valid, weights, dim=list(space))
    return num / den.where(den > 0)


BLOCK_BYTES = 2.5e8
"""Float64 bytes of forecast per block of initialisations that :func:`forecast_scores` computes at once."""


def _init_blocks(forecast: xr.DataArray, time_dim: str | None) -> list[slice | None]:
    """Slices of ``time_dim`` that :func:`forecast_scores` computes one after another: [None] (all at once)
    for an in-memory forecast, else runs of whole time chunks of at most about :data:`BLOCK_BYTES` each (one
    chunk at least).

    One ``dask.compute`` of every score of a whole dask-backed store at once kept the float64 forecast in
    memory until the last score reading it was done: the peak grew with the number of initialisations (1°,
    51 members: about 50 MB per initialisation; ``benchmarks/evaluate_memory.py``). Blocks bound it."""
    block_bytes = BLOCK_BYTES
    if time_dim is None or forecast.chunks is None or forecast.sizes.get(time_dim, 0) <= 1:
        return [None]
    per_init = 8.0 * forecast.size / forecast.sizes[time_dim]
    chunks = forecast.chunksizes.get(time_dim, (forecast.sizes[time_dim],))
    blocks, start, stop = [], 0, 0
    for c in chunks:
        if stop > start and (stop + c - start) * per_init > block_bytes:
            blocks.append(slice(start, stop))
            start = stop
        stop += c
    blocks.append(slice(start, stop))
    return blocks if len(blocks) > 1 else [None]


def _area_means(forecast: xr.DataArray, kind: str, truth: xr.DataArray, w: xr.DataArray,
                weights: xr.DataArray, space: list[Hashable], dims: Sequence[Hashable],
                sigma: xr.DataArray | None, climatology: xr.DataArray | None, block: slice | None
                ) -> tuple[dict[str, xr.DataArray], xr.DataArray | None, xr.DataArray | None]:
    """The area means per initialisation of one block of initialisations (``block`` of ``time``; None: all),
    computed in one pass: ({quantity: (time, ..., region)}, its rank histogram or None, the histogram's total
    weight or None). ``forecast`` is already that block; ``truth``, ``sigma`` and ``climatology`` are cut here."""
    da = forecast.astype(np.float64)
    if block is not None:
        truth = truth.isel(time=block)
        sigma = sigma.isel(time=block) if sigma is not None and "time" in sigma.dims else sigma
        if climatology is not None and "time" in climatology.dims:
            climatology = climatology.isel(time=block)
    if kind == "ensemble":
        point = da.mean("member")
    elif kind == "quantiles":
        point = median_of_quantiles(da)
    else:
        point = da

    def amean(x: xr.DataArray) -> xr.DataArray:
        return area_mean(x, w, space)

    err = point - truth
    q: dict[str, xr.DataArray] = {"mse": amean(err**2), "bias": amean(err)}
    if climatology is not None:
        fa, oa = point - climatology, truth - climatology
        ok = fa.notnull() & oa.notnull()
        fa, oa = fa.where(ok), oa.where(ok)
        den = np.sqrt(amean(fa**2) * amean(oa**2))
        q["acc"] = amean(fa * oa) / den.where(den > 0)  # the climatology itself: NaN, as WB2
    lazy: dict[str, xr.DataArray] = {}
    m = da.sizes.get("member", 1) if kind == "ensemble" else 1
    if kind == "deterministic":  # a one-member ensemble: its CRPS is its mean absolute error
        q["crps"] = q["crps_ecdf"] = amean(abs(err))
    elif kind == "ensemble":
        q["crps"] = amean(probabilistic.crps_ensemble(da, truth, estimator="fair"))
        # the CRPS of the members' own empirical distribution: the proper score of the forecast as issued. The
        # fair CRPS estimates the CRPS of the distribution the members are DRAWN from, which assumes
        # exchangeable draws; members trained jointly on a (fair) CRPS loss are not, and can lower the fair
        # score by spreading out without being a better forecast (docs/guide/ensembles.md)
        q["crps_ecdf"] = amean(probabilistic.crps_ensemble(da, truth, estimator="standard"))
        if m > 1:
            variance = da.var("member", ddof=1)
            q["variance"] = amean(variance)
            q["debiased_ensemble_mean_mse"] = amean(err**2 - variance / m)
            sorted_x = xr.apply_ufunc(np.sort, da, input_core_dims=[["member"]], output_core_dims=[["member"]],
                                      kwargs={"axis": -1}, dask="parallelized", output_dtypes=[np.float64],
                                      dask_gufunc_kwargs={"allow_rechunk": True})
            coef = xr.DataArray((2.0 * np.arange(1, m + 1) - m - 1) * 2.0, dims="member")
            q["pairwise_distance"] = amean((sorted_x * coef).sum("member") / (m * (m - 1)))
            q["member_error"] = amean(abs(da - truth).mean("member"))
            q["energy_score"] = probabilistic.energy_score_terms(da, truth, w, space)["energy_score"]
            lazy["rank_histogram"] = probabilistic.rank_histogram(da, truth, weights, dims)
    elif kind == "gaussian":
        if sigma is None:
            raise ValueError("a gaussian forecast needs sigma (its <name>_std variable)")
        sd = sigma.astype(np.float64)
        q["crps"] = q["crps_ecdf"] = amean(probabilistic.crps_gaussian(da, sd, truth))
        q["variance"] = amean(sd**2)
    elif kind == "quantiles":
        q["quantile_loss"] = amean(probabilistic.quantile_loss(da, truth).mean("quantile"))
    names = list(q)
    computed = dask.compute(*q.values(), *lazy.values())
    q = dict(zip(names, computed[: len(names)]))
    if "rank_histogram" not in lazy:
        return q, None, None
    hist_w = weights.broadcast_like(truth.isel({d: 0 for d in truth.dims if d not in space}, drop=True))
    block_w = (hist_w * truth.notnull()).sum([d for d in dims if d in truth.dims])
    return q, computed[len(names)], block_w


def forecast_scores(forecast: xr.DataArray, kind: str, truth: xr.DataArray, weights: xr.DataArray | None,
                    sigma: xr.DataArray | None = None, climatology: xr.DataArray | None = None,
                    dims: Sequence[Hashable] = SPACE_TIME, regions: xr.DataArray | None = None,
                    per_init: bool = False, space: Sequence[Hashable] | None = None) -> dict[str, xr.DataArray]:
    """{metric: score reduced over ``dims``} of one field (computed, float64, in one pass over the data).

    ``forecast``: (time, prediction_timedelta, [member | quantile], latitude, longitude) of ``kind``
    (deterministic, ensemble, gaussian: μ with ``sigma`` = σ, quantiles); ``truth``, ``climatology``: the
    same without member/quantile, at the valid times; ``weights``: latitude weights (mean 1), or
    ``regions``: area weights (region, latitude, longitude) of :func:`~smoeweather.metrics.regions.
    region_weights`, which give every score a ``region`` dim. With ``per_init``, also ``per_init_<q>``: the
    area means q per initialisation (dims kept but space) for q in :data:`PER_INIT`. Units: those of the field
    (debiased ensemble-mean MSE: squared), ACC, spread–skill and diversity ratio dimensionless.
    ``rank_histogram`` (ensembles) is over ``weights`` only (the global one with ``regions``). ``space``: the
    dims of ``dims`` averaged first with the weights (default: latitude and longitude; site forecasts: their
    case dim, :mod:`smoeweather.evaluate.sites`); the other dims of ``dims`` are averaged after, plainly.
    """
    truth = truth.astype(np.float64)
    space = [d for d in dims if (d in space if space is not None else d in SPATIAL_DIMS) and d in truth.dims]
    rest = [d for d in dims if d not in space and d in truth.dims]
    if regions is None:
        if weights is None:
            weights = xr.DataArray(1.0)
        template = truth.isel({d: 0 for d in truth.dims if d not in space}, drop=True)
        w = weights.broadcast_like(template).expand_dims(region=["_"]).fillna(0.0)
    else:
        w = regions.fillna(0.0)
        if weights is None:  # the rank histogram: the first region's weights
            weights = regions.isel(region=0, drop=True)
    m = forecast.sizes.get("member", 1) if kind == "ensemble" else 1
    blocks = _init_blocks(forecast, "time" if "time" in rest else None)
    parts = [_area_means(forecast.isel(time=b) if b is not None else forecast, kind, truth, w, weights, space,
                         dims, sigma, climatology, b) for b in blocks]
    q = {k: xr.concat([part[0][k] for part in parts], "time") if len(parts) > 1 else parts[0][0][k]
         for k in parts[0][0]}
    lazy: dict[str, xr.DataArray] = {}
    if len(parts) == 1 and parts[0][1] is not None:
        lazy["rank_histogram"] = parts[0][1]
    elif parts[0][1] is not None:  # the rank histogram of each block, weighted by the block's share of the weight
        hists = xr.concat([part[1] for part in parts], "_block")
        block_w = xr.concat([part[2] for part in parts], "_block")
        lazy["rank_histogram"] = (hists.fillna(0.0) * block_w).sum("_block") / block_w.where(
            hists.notnull()).sum("_block")

    def tmean(x: xr.DataArray) -> xr.DataArray:
        return x.mean(rest) if rest else x

    out = {"rmse": np.sqrt(tmean(q["mse"])), "bias": tmean(q["bias"])}
    for k in ("acc", "crps", "crps_ecdf", "quantile_loss", "debiased_ensemble_mean_mse", "energy_score"):
        if k in q:
            out[k] = tmean(q[k])
    if "variance" in q:
        factor = np.sqrt((m + 1.0) / m) if kind == "ensemble" else 1.0
        out["spread_skill"] = factor * np.sqrt(tmean(q["variance"])) / out["rmse"]
    if "pairwise_distance" in q:
        out["diversity_ratio"] = tmean(q["pairwise_distance"]) / tmean(q["member_error"])
    if per_init:
        out.update({f"per_init_{k}": q[k] for k in set(PER_INIT.values()) if k in q})
    if regions is None:
        out = {k: v.squeeze("region", drop=True) if "region" in v.dims else v for k, v in out.items()}
    out.update(lazy)
    return out
