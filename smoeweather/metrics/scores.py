"""The scores of one forecast field against its truth, per forecast kind, from ONE engine (pure xarray in and out).

WeatherBench 2's two steps. :func:`field_terms` (WB2's ``Metric.compute_chunk``) computes every per-initialisation
area mean a forecast of its kind has, each term once, block of initialisations by block (one read of the forecast,
bounded memory), over each region at once (``regions``: area weights with a ``region`` dim, :func:`smoeweather.
metrics.regions.region_weights`). From those terms come both outputs (WB2's ``compute``: the mean over the
initialisations): our table (:func:`table_scores`, what :func:`forecast_scores` returns: latitude-weighted RMSE,
bias, ACC, fair and ECDF CRPS, spread–skill and diversity ratios, debiased ensemble-mean MSE, energy score,
pinball loss, rank histogram) and WeatherBench 2's evaluation files (:func:`smoeweather.metrics.wb2.metric_terms`
names the very same arrays as WB2 does). The per-initialisation terms are returned too (``per_init=True``): they
are what paired significance tests over initialisations need (the scorecard).

The terms (``⟨·⟩`` the weighted area mean per initialisation and lead, :func:`~smoeweather.metrics.weights.
area_mean`; f the point forecast: ensemble mean, Gaussian μ, median of the quantiles):

==============================  ================================================================================
``mse``, ``bias``, ``mae``       ⟨(f − y)²⟩, ⟨f − y⟩, ⟨|f − y|⟩ (also WB2's ``ensemble_mean_mse`` of ensembles, μ)
``acc``                          ⟨f′y′⟩ / √(⟨f′²⟩⟨y′²⟩), anomalies against the climatology, points where both exist
``crps_skill``, ``crps_spread``  ⟨E|X − y|⟩ and the unbiased ⟨E|X − X′|⟩ of an ensemble (0 for one member)
``crps``                         fair: crps_skill − crps_spread/2; Gaussian: closed form; deterministic: mae
``crps_ecdf``                    the members' ECDF: crps_skill − (M − 1)/(2M)·crps_spread; else as ``crps``
``ensemble_variance``            ⟨s²⟩ (ddof 1; 0 for one member); Gaussian ⟨σ²⟩
``debiased_ensemble_mean_mse``   ⟨(x̄ − y)² − s²/M⟩ (M > 1)
``energy_score``                 E‖X − Y‖ − E‖X − X′‖/2 per field (M > 1)
``quantile_loss``                ⟨pinball loss⟩, mean over the quantile levels
``brier_score``, ...             Brier, debiased Brier and ignorance of truth > climatological quantile
                                 (``thresholds``; :mod:`smoeweather.metrics.wb2`)
==============================  ================================================================================

The ensemble terms (and the Gaussian variance) count a point only where the truth and every member have a value,
so that spread, skill and variance average over the same points and initialisations.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass

import dask
import numpy as np
import xarray as xr

from smoeweather.metrics import calibration, probabilistic
from smoeweather.metrics.deterministic import SPATIAL_DIMS
from smoeweather.metrics.weights import area_mean

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


BLOCK_BYTES = 2.5e8
"""Float64 bytes of forecast per block of initialisations that :func:`field_terms` computes at once."""


def _init_blocks(forecast: xr.DataArray, time_dim: str | None) -> list[slice | None]:
    """Slices of ``time_dim`` that :func:`field_terms` computes one after another: [None] (all at once)
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


@dataclass
class FieldTerms:
    """The per-initialisation terms of one forecast field (:func:`field_terms`): ``per_init`` {term: (time, lead,
    ..., region [, quantile])}, computed; the rank histogram (ensembles of M > 1) or None; ``rest``: the dims of
    ``dims`` that the scores average after the area mean (``time``)."""

    kind: str
    members: int
    per_init: dict[str, xr.DataArray]
    rank_histogram: xr.DataArray | None
    rest: list[Hashable]


def _point_terms(point: xr.DataArray, err: xr.DataArray, truth: xr.DataArray, climatology: xr.DataArray | None,
                 amean: Callable[[xr.DataArray], xr.DataArray]) -> dict[str, xr.DataArray]:
    """``mse``, ``bias``, ``mae`` [``acc``] of the point forecast (``err`` = point − truth)."""
    q = {"mse": amean(err**2), "bias": amean(err), "mae": amean(abs(err))}
    if climatology is not None:
        fa, oa = point - climatology, truth - climatology
        ok = fa.notnull() & oa.notnull()
        fa, oa = fa.where(ok), oa.where(ok)
        den = np.sqrt(amean(fa**2) * amean(oa**2))
        q["acc"] = amean(fa * oa) / den.where(den > 0)  # the climatology itself: NaN, as WB2
    return q


def _ignorance(p: xr.DataArray, event: xr.DataArray) -> xr.DataArray:
    """−log of the probability given to what happened; +inf where it was 0 (as WB2), NaN where no event."""
    realized = xr.where(event > 0.5, p, 1.0 - p).where(event.notnull())
    return xr.where(realized > 0, -np.log(realized.where(realized > 0)), np.inf).where(realized.notnull())


def _ensemble_terms(da: xr.DataArray, err: xr.DataArray, truth: xr.DataArray, w: xr.DataArray,
                    space: list[Hashable], thresholds: xr.DataArray | None,
                    amean: Callable[[xr.DataArray], xr.DataArray]) -> dict[str, xr.DataArray]:
    """The ensemble terms (module table) of members ``da`` (dim ``member``), each once; the binary ones with
    ``thresholds`` (dim ``quantile``)."""
    m = da.sizes["member"]
    scored = truth.notnull() & da.notnull().all("member")  # the spread and variance too only where skill is
    variance = (da.var("member", ddof=1) if m > 1 else xr.zeros_like(err)).where(scored)
    skill = amean(abs(da - truth).mean("member").where(scored))
    spread = amean(probabilistic.pairwise_spread(da).where(scored))
    q = {"crps_skill": skill, "crps_spread": spread, "ensemble_variance": amean(variance)}
    if m > 1:
        q["debiased_ensemble_mean_mse"] = amean(err**2 - variance / m)
        q["energy_score"] = probabilistic.energy_score_terms(da, truth, w, space)["energy_score"]
    if thresholds is not None:
        q.update(_ensemble_binary_terms(da, truth, thresholds, amean))
    return q


def _ensemble_binary_terms(da: xr.DataArray, truth: xr.DataArray, thresholds: xr.DataArray,
                           amean: Callable[[xr.DataArray], xr.DataArray]) -> dict[str, xr.DataArray]:
    """Brier, debiased Brier and ignorance of the members' fraction above each threshold. The members'
    indicators are formed one ``quantile`` at a time (a third of the memory for three thresholds); the per-point
    terms of all thresholds are then area-averaged together, in the layout of one pass over all of them."""
    m = da.sizes["member"]
    per_q: dict[str, list[xr.DataArray]] = {"brier_score": [], "debiased_brier_score": [], "ignorance_score": []}
    levels = thresholds["quantile"].values if "quantile" in thresholds.dims else [None]
    axis = da.dims.index("member")
    for level in levels:
        thr = thresholds.sel(quantile=level, drop=True) if level is not None else thresholds
        event = calibration.event(truth, thr)
        above = (da > thr).astype(np.float64).where(da.notnull())
        p = above.mean("member")
        brier = (p - event) ** 2
        debiased = brier - above.var("member", ddof=1) / m if m > 1 else xr.full_like(brier, np.nan)
        for k, v in (("brier_score", brier), ("debiased_brier_score", debiased),
                     ("ignorance_score", _ignorance(p, event))):
            per_q[k].append(v if level is None else v.expand_dims(quantile=[level], axis=axis))
    # stacked where the members were, then viewed with the quantile last: the memory layout numpy gives the
    # one-pass broadcast of the members against all thresholds, so the area means add in its order, bit for bit
    return {k: amean(xr.concat(v, "quantile").transpose(..., "quantile") if len(v) > 1 else v[0])
            for k, v in per_q.items()}


def _gaussian_terms(mu: xr.DataArray, sigma: xr.DataArray | None, truth: xr.DataArray,
                    thresholds: xr.DataArray | None, amean: Callable[[xr.DataArray], xr.DataArray]
                    ) -> dict[str, xr.DataArray]:
    """``crps`` (closed form) = ``crps_ecdf``, ``ensemble_variance`` ⟨σ²⟩ [Brier and ignorance of N(μ, σ²)]."""
    if sigma is None:
        raise ValueError("a gaussian forecast needs sigma (its <name>_std variable)")
    sd = sigma.astype(np.float64)
    crps = amean(probabilistic.crps_gaussian(mu, sd, truth))
    q = {"crps": crps, "crps_ecdf": crps, "ensemble_variance": amean((sd**2).where(truth.notnull()))}
    if thresholds is not None:
        event = calibration.event(truth, thresholds)
        p = calibration.exceedance_probability(mu, "gaussian", thresholds, sd)
        q.update(brier_score=amean((p - event) ** 2), ignorance_score=amean(_ignorance(p, event)))
    return q


def _block_terms(forecast: xr.DataArray, kind: str, truth: xr.DataArray, w: xr.DataArray,
                 weights: xr.DataArray, space: list[Hashable], dims: Sequence[Hashable],
                 sigma: xr.DataArray | None, climatology: xr.DataArray | None, thresholds: xr.DataArray | None,
                 block: slice | None) -> tuple[dict[str, xr.DataArray], xr.DataArray | None, xr.DataArray | None]:
    """The terms of one block of initialisations (``block`` of ``time``; None: all), computed in one pass:
    ({term: (time, ..., region)}, its rank histogram or None, the histogram's total weight or None).
    ``forecast`` is already that block; ``truth``, ``sigma``, ``climatology`` and ``thresholds`` are cut here."""
    da = forecast.astype(np.float64)
    if block is not None:
        truth = truth.isel(time=block)
        sigma, climatology, thresholds = (x.isel(time=block) if x is not None and "time" in x.dims else x
                                          for x in (sigma, climatology, thresholds))
    point = da.mean("member") if kind == "ensemble" else median_of_quantiles(da) if kind == "quantiles" else da

    def amean(x: xr.DataArray) -> xr.DataArray:
        return area_mean(x, w, space)

    err = point - truth
    q = _point_terms(point, err, truth, climatology, amean)
    lazy: dict[str, xr.DataArray] = {}
    if kind == "deterministic":  # a one-member ensemble: its CRPS is its mean absolute error
        q["crps"] = q["crps_ecdf"] = q["mae"]
    elif kind == "ensemble":
        q.update(_ensemble_terms(da, err, truth, w, space, thresholds, amean))
        if da.sizes["member"] > 1:
            lazy["rank_histogram"] = probabilistic.rank_histogram(da, truth, weights, dims)
    elif kind == "gaussian":
        q.update(_gaussian_terms(da, sigma, truth, thresholds, amean))
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


def _crps_of(q: dict[str, xr.DataArray], m: int) -> None:
    """Add the ensemble's ``crps`` (fair) and ``crps_ecdf`` per initialisation from its skill and spread terms."""
    q["crps"] = q["crps_skill"] - 0.5 * q["crps_spread"]
    q["crps_ecdf"] = q["crps_skill"] - (0.5 * (m - 1) / m) * q["crps_spread"]


def field_terms(forecast: xr.DataArray, kind: str, truth: xr.DataArray, weights: xr.DataArray | None,
                sigma: xr.DataArray | None = None, climatology: xr.DataArray | None = None,
                dims: Sequence[Hashable] = SPACE_TIME, regions: xr.DataArray | None = None,
                space: Sequence[Hashable] | None = None, thresholds: xr.DataArray | None = None) -> FieldTerms:
    """Every per-initialisation term of one field (module table), each computed once, float64, block of
    initialisations by block (:func:`_init_blocks`). Arguments as :func:`forecast_scores`; ``thresholds``: the
    climatological quantiles (dim ``quantile``, at the valid times) of the binary terms. Without ``regions``
    the terms have a ``region`` dim of one label, ``global``."""
    truth = truth.astype(np.float64)
    space = [d for d in dims if (d in space if space is not None else d in SPATIAL_DIMS) and d in truth.dims]
    rest = [d for d in dims if d not in space and d in truth.dims]
    if regions is None:
        if weights is None:
            weights = xr.DataArray(1.0)
        template = truth.isel({d: 0 for d in truth.dims if d not in space}, drop=True)
        w = weights.broadcast_like(template).expand_dims(region=["global"]).fillna(0.0)
    else:
        w = regions.fillna(0.0)
        if weights is None:  # the rank histogram: the first region's weights
            weights = regions.isel(region=0, drop=True)
    m = forecast.sizes.get("member", 1) if kind == "ensemble" else 1
    blocks = _init_blocks(forecast, "time" if "time" in rest else None)
    parts = [_block_terms(forecast.isel(time=b) if b is not None else forecast, kind, truth, w, weights, space,
                          dims, sigma, climatology, thresholds, b) for b in blocks]
    q = {k: xr.concat([part[0][k] for part in parts], "time") if len(parts) > 1 else parts[0][0][k]
         for k in parts[0][0]}
    if kind == "ensemble":
        _crps_of(q, m)
    hist = None
    if len(parts) == 1:
        hist = parts[0][1]
    elif parts[0][1] is not None:  # the rank histogram of each block, weighted by the block's share of the weight
        hists = xr.concat([part[1] for part in parts], "_block")
        block_w = xr.concat([part[2] for part in parts], "_block")
        hist = (hists.fillna(0.0) * block_w).sum("_block") / block_w.where(hists.notnull()).sum("_block")
    return FieldTerms(kind, m, q, hist, rest)


def table_scores(terms: FieldTerms, per_init: bool = False, regions: bool = True) -> dict[str, xr.DataArray]:
    """Our table from the terms (:func:`forecast_scores`' result): the means over ``terms.rest`` (RMSE: √ of the
    mean MSE) and the ratios of such means; ``per_init``: also ``per_init_<q>`` for q in :data:`PER_INIT`;
    without ``regions`` the region dim is dropped."""
    q, rest, m = terms.per_init, terms.rest, terms.members

    def tmean(x: xr.DataArray) -> xr.DataArray:
        return x.mean(rest) if rest else x

    out = {"rmse": np.sqrt(tmean(q["mse"])), "bias": tmean(q["bias"])}
    for k in ("acc", "crps", "crps_ecdf", "quantile_loss", "debiased_ensemble_mean_mse", "energy_score"):
        if k in q:
            out[k] = tmean(q[k])
    if terms.kind == "gaussian" or (terms.kind == "ensemble" and m > 1):
        factor = np.sqrt((m + 1.0) / m) if terms.kind == "ensemble" else 1.0
        out["spread_skill"] = factor * np.sqrt(tmean(q["ensemble_variance"])) / out["rmse"]
    if terms.kind == "ensemble" and m > 1:
        out["diversity_ratio"] = tmean(q["crps_spread"]) / tmean(q["crps_skill"])
    if per_init:
        out.update({f"per_init_{k}": q[k] for k in dict.fromkeys(PER_INIT.values()) if k in q})
    if not regions:
        out = {k: v.squeeze("region", drop=True) if "region" in v.dims else v for k, v in out.items()}
    if terms.rank_histogram is not None:
        out["rank_histogram"] = terms.rank_histogram
    return out


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
    terms = field_terms(forecast, kind, truth, weights, sigma, climatology, dims, regions, space)
    return table_scores(terms, per_init, regions is not None)
