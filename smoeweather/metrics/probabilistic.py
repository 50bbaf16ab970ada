"""Probabilistic scores (pure xarray, dask-friendly): ensemble and Gaussian CRPS, quantile (pinball) loss,
threshold-weighted CRPS, Extreme Forecast Index, spread–skill ratio.

Conventions: ``forecast`` carries the ensemble on ``member_dim``; ``truth`` has the same other dims (or
broadcasts to them). Per-point functions (:func:`crps_ensemble`, :func:`crps_gaussian`,
:func:`extreme_weighted_crps`, :func:`extreme_forecast_index`) do no reduction: average them with
:func:`smoeweather.metrics.weights.weighted_mean`. Scores are in the units of the field.

The ensemble CRPS is hand-written (instead of calling ``properscoring``/``scores``) because those build an
(…, M, M) array of pairwise differences without numba (O(M²) memory, slow); here the members are sorted
once and Σᵢⱼ|xᵢ − xⱼ| = 2 Σᵢ (2i − M − 1) x₍ᵢ₎ (O(M log M)), block by block so memory stays bounded.
The tests check it against both libraries.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Literal, TypeVar

import numpy as np
import xarray as xr
from scipy.special import ndtr

from smoeweather.metrics.weights import weighted_mean

X = TypeVar("X", xr.DataArray, xr.Dataset)
Estimator = Literal["fair", "standard"]
ESTIMATORS: tuple[str, ...] = ("fair", "standard")
_BLOCK_ROWS = 1 << 15  # rows (points) per block: ≈ 13 MB of float64 temporaries for 50 members


def _check_member(forecast: xr.DataArray | xr.Dataset, member_dim: str, minimum: int = 1) -> int:
    if member_dim not in forecast.dims:
        raise ValueError(f"forecast has no ensemble dimension {member_dim!r} (dims: {tuple(forecast.dims)})")
    m = int(forecast.sizes[member_dim])
    if m < minimum:
        raise ValueError(f"forecast needs at least {minimum} members on {member_dim!r}, got {m}")
    return m


def _matching_truth(forecast: X, truth: xr.DataArray | xr.Dataset) -> xr.DataArray | xr.Dataset:
    """``truth`` restricted to the forecast's variables (Datasets); ValueError naming what is missing."""
    if isinstance(forecast, xr.Dataset) and isinstance(truth, xr.Dataset):
        missing = [v for v in forecast.data_vars if v not in truth.data_vars]
        if missing:
            raise ValueError(f"truth has no variable(s) {missing} that the forecast has")
        return truth[list(forecast.data_vars)]
    return truth


def _crps_ensemble_np(x: np.ndarray, y: np.ndarray, fair: bool) -> np.ndarray:
    """CRPS of ensembles ``x`` (..., M) against ``y`` (...) in float64, sorted estimator, in row blocks.

    standard (ECDF): (1/M) Σ|xᵢ − y| − 1/(2M²) Σᵢⱼ|xᵢ − xⱼ|;  fair: the second term over 2M(M − 1).
    NaN anywhere in a point's members or truth gives NaN there. Blocks are slices of the leading axis, so
    a transposed (non-contiguous) view is only copied one block at a time.
    """
    x, y = np.broadcast_arrays(x, y[..., None])
    y = y[..., 0]
    if x.ndim == 1:  # a single point
        return _crps_ensemble_np(x[None], y[None], fair)[0]
    shape, m = x.shape[:-1], x.shape[-1]
    # Σᵢⱼ|xᵢ − xⱼ| = 2 Σᵢ (2i − M − 1) x₍ᵢ₎ for sorted x (i = 1..M)
    coef = (2.0 * np.arange(1, m + 1) - m - 1) * 2.0
    denom = 2.0 * m * (m - 1) if fair else 2.0 * m * m
    out = np.empty(shape, np.float64)
    per_row = max(1, int(np.prod(shape[1:], dtype=np.int64)))
    step = max(1, _BLOCK_ROWS // per_row)
    for start in range(0, shape[0], step):
        sl = slice(start, start + step)
        xb = np.sort(x[sl].reshape(-1, m).astype(np.float64, copy=False), axis=-1)
        yb = y[sl].reshape(-1).astype(np.float64, copy=False)
        mae = np.abs(xb - yb[:, None]).mean(axis=-1)
        out[sl] = (mae - (xb @ coef) / denom).reshape(out[sl].shape)
    return out


def crps_ensemble(
    forecast: X, truth: xr.DataArray | xr.Dataset, member_dim: str = "member", estimator: Estimator = "fair"
) -> X:
    """Ensemble CRPS per point (no reduction), float64, units of the field.

    ``estimator="standard"``: CRPS of the ensemble's empirical CDF (``properscoring.crps_ensemble``,
    ``scores`` method ``"ecdf"``). ``"fair"`` (Ferro 2014): pairwise term over M(M − 1), an unbiased
    estimate of the CRPS of the distribution the members are drawn from (``scores`` method ``"fair"``);
    needs M ≥ 2. Works lazily on dask-backed inputs (the member dim is gathered into one chunk).
    """
    if estimator not in ESTIMATORS:
        raise ValueError(f"estimator must be one of {ESTIMATORS}, got {estimator!r}")
    _check_member(forecast, member_dim, 2 if estimator == "fair" else 1)
    truth = _matching_truth(forecast, truth)
    if member_dim in truth.dims:
        raise ValueError(f"truth must not have the ensemble dimension {member_dim!r}")
    return xr.apply_ufunc(
        _crps_ensemble_np,
        forecast,
        truth,
        kwargs={"fair": estimator == "fair"},
        input_core_dims=[[member_dim], []],
        dask="parallelized",
        output_dtypes=[np.float64],
        dask_gufunc_kwargs={"allow_rechunk": True},
        keep_attrs=True,
    )


def pairwise_spread(forecast: xr.DataArray, member_dim: str = "member") -> xr.DataArray:
    """E|X − X′| per point (no reduction), unbiased: 2 Σᵢ (2i − M − 1) x₍ᵢ₎ / (M(M − 1)) over the sorted members
    (0 for M = 1); WeatherBench 2's ``crps_spread`` before its area mean. Lazy on dask-backed inputs (the member
    dim is gathered into one chunk: stores may be chunked along the members)."""
    m = forecast.sizes[member_dim]
    if m < 2:
        return xr.zeros_like(forecast.isel({member_dim: 0}, drop=True))
    ordered = xr.apply_ufunc(np.sort, forecast, input_core_dims=[[member_dim]], output_core_dims=[[member_dim]],
                             kwargs={"axis": -1}, dask="parallelized", output_dtypes=[np.float64],
                             dask_gufunc_kwargs={"allow_rechunk": True})
    coef = xr.DataArray(2.0 * np.arange(1, m + 1) - m - 1, dims=member_dim)
    return 2.0 * (ordered * coef).sum(member_dim) / (m * (m - 1))


def _crps_gaussian_np(mu: np.ndarray, sigma: np.ndarray, y: np.ndarray) -> np.ndarray:
    mu, sigma, y = (np.asarray(a, np.float64) for a in (mu, sigma, y))
    with np.errstate(divide="ignore", invalid="ignore"):
        z = (y - mu) / sigma
        pdf = np.exp(-0.5 * z * z) / np.sqrt(2.0 * np.pi)
        crps = sigma * (z * (2.0 * ndtr(z) - 1.0) + 2.0 * pdf - 1.0 / np.sqrt(np.pi))
    crps = np.where(sigma == 0, np.abs(y - mu), crps)  # point mass: CRPS = absolute error
    return np.where(sigma < 0, np.nan, crps)


G = TypeVar("G", xr.DataArray, xr.Dataset, np.ndarray)


def crps_gaussian(mu: G, sigma: G | float, truth: xr.DataArray | xr.Dataset | np.ndarray) -> G:
    """Closed-form CRPS of N(μ, σ²) per point (Gneiting et al. 2005): σ[z(2Φ(z) − 1) + 2φ(z) − 1/√π],
    z = (y − μ)/σ; σ = 0 gives |y − μ| (the point mass's limit), σ < 0 gives NaN. Units of the field; no
    reduction; float64. xarray inputs (lazy with dask) give xarray, numpy arrays (broadcast) give numpy.

    The one numpy/xarray Gaussian CRPS of the package (its torch twin, for losses, is
    :func:`smoeweather.nn.crps.gaussian_crps`; the tests hold them equal)."""
    if not isinstance(mu, (xr.DataArray, xr.Dataset)):
        return _crps_gaussian_np(mu, sigma, truth)  # type: ignore[arg-type, return-value]
    if isinstance(mu, xr.Dataset) and isinstance(sigma, xr.Dataset):
        missing = [v for v in mu.data_vars if v not in sigma.data_vars]
        if missing:
            raise ValueError(f"sigma has no variable(s) {missing} that mu has")
        sigma = sigma[list(mu.data_vars)]
    truth = _matching_truth(mu, truth)  # type: ignore[arg-type]
    return xr.apply_ufunc(_crps_gaussian_np, mu, sigma, truth, dask="parallelized",
                          output_dtypes=[np.float64], keep_attrs=True)


def quantile_loss(forecast: X, truth: xr.DataArray | xr.Dataset, quantile_dim: str = "quantile") -> X:
    """Pinball loss per point and level: ρ_q(y − x_q) = (y − x_q)·(q − 1{y < x_q}), q the ``quantile_dim``
    coordinate (probability levels in (0, 1)); units of the field, no reduction. Its mean over levels
    q = (k − ½)/K tends to ½·CRPS as K grows (Laio & Tamea 2007); ``scores.continuous.quantile_score``."""
    if quantile_dim not in forecast.dims:
        raise ValueError(f"quantile forecast has no {quantile_dim!r} dim (dims: {tuple(forecast.dims)})")
    q = forecast[quantile_dim]
    if bool(((q <= 0) | (q >= 1)).any()):
        raise ValueError(f"quantile levels must lie in (0, 1), got {q.values.tolist()}")
    truth = _matching_truth(forecast, truth)
    err = truth - forecast
    return err * (q - (err < 0))


def _chain(x: X, threshold: float | xr.DataArray, tail: str) -> X:
    if tail == "upper":
        return np.maximum(x, threshold)  # type: ignore[return-value]
    if tail == "lower":
        return np.minimum(x, threshold)  # type: ignore[return-value]
    raise ValueError(f"tail must be 'upper' or 'lower', got {tail!r}")


def climate_quantile(
    climate: X, quantile: float, sample_dims: Sequence[Hashable] = ("time", "member")
) -> X:
    """Per-point quantile of a model climate over ``sample_dims`` (those present); ``quantile`` in (0, 1)."""
    if not 0.0 < quantile < 1.0:
        raise ValueError(f"quantile must be in (0, 1), got {quantile}")
    dims = [d for d in sample_dims if d in climate.dims]
    if not dims:
        raise ValueError(f"climate has none of the sample dims {tuple(sample_dims)} (dims: {tuple(climate.dims)})")
    return climate.quantile(quantile, dim=dims).drop_vars("quantile")


def extreme_weighted_crps(
    forecast: X,
    truth: xr.DataArray | xr.Dataset,
    threshold: float | xr.DataArray | xr.Dataset | None = None,
    *,
    climate: X | None = None,
    quantile: float = 0.9,
    tail: Literal["upper", "lower"] = "upper",
    member_dim: str = "member",
    estimator: Estimator = "fair",
    sample_dims: Sequence[Hashable] = ("time", "member"),
) -> X:
    """Threshold-weighted CRPS per point (Gneiting & Ranjan 2011): weight w(z) = 1{z ≥ t} (``tail="upper"``)
    or 1{z ≤ t}; computed as the CRPS of the chained values v(z) = max(z, t) (min for "lower"), so it only
    scores the forecast's behaviour beyond ``t``.

    ``threshold`` is a number or per-point array (units of the field); if None it is the ``quantile`` of
    the model ``climate`` (e.g. all members of training forecasts at the same lead) over ``sample_dims``.
    Same as ``scores.probability.tail_tw_crps_for_ensemble``.
    """
    if threshold is None:
        if climate is None:
            raise ValueError("extreme_weighted_crps needs a threshold or a model climate to take it from")
        threshold = climate_quantile(climate, quantile, sample_dims)
    truth = _matching_truth(forecast, truth)
    return crps_ensemble(_chain(forecast, threshold, tail), _chain(truth, threshold, tail), member_dim, estimator)


def _efi_levels(n_bins: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Probability levels p_k and exact weights of the EFI integral on the bins [k/K, (k+1)/K].

    With A(p) = 2 arcsin √p = ∫ dp/√(p(1−p)) and G(p) = arcsin √p − √(p(1−p)) = ∫ p dp/√(p(1−p)):
    the ∫ p/√(p(1−p)) part is integrated exactly (ΔG_k), F_f is held at the level p_k = ΔG_k/ΔA_k of each
    bin, the point where p·ΔA_k equals ΔG_k — so a forecast distributed like the climate gives EFI = 0 and
    the extremes ±1 are exact.
    """
    edges = np.linspace(0.0, 1.0, n_bins + 1)
    a = 2.0 * np.arcsin(np.sqrt(edges))
    g = np.arcsin(np.sqrt(edges)) - np.sqrt(edges * (1.0 - edges))
    da, dg = np.diff(a), np.diff(g)
    return dg / da, da, dg


def _ecdf_hazen(sorted_x: np.ndarray, q: np.ndarray) -> np.ndarray:
    """CDF (..., K) at ``q`` (..., K) of samples ``sorted_x`` (..., N): the inverse of
    ``np.quantile(method="hazen")`` (linear through (x₍ᵢ₎, (i − ½)/N)); 0 below the minimum, 1 above."""
    n = sorted_x.shape[-1]
    idx = (sorted_x[..., None, :] <= q[..., :, None]).sum(-1)  # (..., K): members ≤ q
    lo = np.take_along_axis(sorted_x, np.clip(idx - 1, 0, n - 1), -1)
    hi = np.take_along_axis(sorted_x, np.clip(idx, 0, n - 1), -1)
    with np.errstate(divide="ignore", invalid="ignore"):
        frac = np.where(hi > lo, (q - lo) / (hi - lo), 0.0)
    cdf = (idx - 0.5 + frac) / n
    cdf = np.where(idx == 0, 0.0, cdf)
    return np.where(idx == n, np.where(q > sorted_x[..., -1:], 1.0, (n - 0.5) / n), cdf)


def _efi_np(forecast: np.ndarray, climate: np.ndarray, n_bins: int) -> np.ndarray:
    p, da, dg = _efi_levels(n_bins)
    forecast, climate = np.broadcast_arrays(forecast[..., :, None], climate[..., None, :])
    forecast, climate = forecast[..., 0], climate[..., 0, :]
    shape = forecast.shape[:-1]
    f2 = np.sort(forecast.reshape(-1, forecast.shape[-1]).astype(np.float64), -1)
    c2 = climate.reshape(-1, climate.shape[-1]).astype(np.float64)
    out = np.empty(f2.shape[0])
    block = max(1, _BLOCK_ROWS // 64)
    for start in range(0, f2.shape[0], block):
        q = np.quantile(c2[start : start + block], p, axis=-1, method="hazen").T  # (rows, K)
        ff = _ecdf_hazen(f2[start : start + block], q)
        out[start : start + block] = (2.0 / np.pi) * (dg.sum() - ff @ da)
        bad = np.isnan(f2[start : start + block]).any(-1) | np.isnan(c2[start : start + block]).any(-1)
        out[start : start + block][bad] = np.nan
    return out.reshape(shape)


def extreme_forecast_index(
    forecast: X,
    climate: X,
    member_dim: str = "member",
    climate_dims: Sequence[Hashable] = ("time", "member"),
    n_bins: int = 100,
) -> X:
    """Extreme Forecast Index per point (Lalaurette 2003), in [−1, 1]:
    EFI = (2/π) ∫₀¹ (p − F_f(q_c(p))) / √(p(1 − p)) dp,
    q_c = quantile function of the model ``climate`` (sampled over ``climate_dims``, e.g. the members of
    past forecasts at the same lead), F_f = CDF of the ensemble ``forecast`` (both linear-interpolated,
    Hazen positions). 0 for a forecast distributed like the climate, 1 when every member is above the
    climate's range, −1 below. ``n_bins`` p-bins (see :func:`_efi_levels`); the climate sample should hold
    at least 2·n_bins/3 values so the outer bins fall inside it.
    """
    _check_member(forecast, member_dim)
    dims = [d for d in climate_dims if d in climate.dims]
    if not dims:
        raise ValueError(f"climate has none of the dims {tuple(climate_dims)} (dims: {tuple(climate.dims)})")
    sample = "_climate_sample"
    stacked = climate.stack({sample: dims})
    stacked = stacked.drop_vars([c for c in stacked.coords if sample in stacked[c].dims])
    if isinstance(forecast, xr.Dataset) and isinstance(stacked, xr.Dataset):
        stacked = _matching_truth(forecast, stacked)
    return xr.apply_ufunc(
        _efi_np, forecast, stacked, kwargs={"n_bins": int(n_bins)},
        input_core_dims=[[member_dim], [sample]], dask="parallelized", output_dtypes=[np.float64],
        dask_gufunc_kwargs={"allow_rechunk": True},
    )


def spread_skill_ratio(
    forecast: X,
    truth: xr.DataArray | xr.Dataset,
    weights: xr.DataArray | None = None,
    dims: Sequence[Hashable] = ("time", "latitude", "longitude"),
    member_dim: str = "member",
) -> X:
    """Spread–skill ratio √((M + 1)/M) · √(mean of ensemble variance) / RMSE of the ensemble mean, reduced
    over ``dims`` (weighted by ``weights``, e.g. latitude weights), other dims kept; dimensionless.

    The variance is the unbiased one (ddof = 1). For a statistically consistent ensemble of M members the
    ensemble-mean error variance is (1 + 1/M) times the spread variance, so the (M + 1)/M correction makes
    the ratio 1 (Fortin et al. 2014); < 1 under-dispersive, > 1 over-dispersive.
    """
    m = _check_member(forecast, member_dim, 2)
    truth = _matching_truth(forecast, truth)
    variance = forecast.var(member_dim, ddof=1)
    error2 = (forecast.mean(member_dim) - truth) ** 2
    spread = np.sqrt(weighted_mean(variance, dims, weights))
    rmse = np.sqrt(weighted_mean(error2, dims, weights))
    return np.sqrt((m + 1.0) / m) * spread / rmse


def spread_skill_ratio_gaussian(
    mu: X,
    sigma: X,
    truth: xr.DataArray | xr.Dataset,
    weights: xr.DataArray | None = None,
    dims: Sequence[Hashable] = ("time", "latitude", "longitude"),
) -> X:
    """Spread–skill ratio of a Gaussian forecast N(μ, σ²): √(mean σ²) / RMSE of μ, reduced over ``dims``
    (weighted), dimensionless. The limit M → ∞ of :func:`spread_skill_ratio`: 1 when the truth is distributed
    as forecast, < 1 under-dispersive."""
    truth = _matching_truth(mu, truth)
    spread = np.sqrt(weighted_mean(sigma**2, dims, weights))
    rmse = np.sqrt(weighted_mean((mu - truth) ** 2, dims, weights))
    return spread / rmse


# ---- ensemble diagnostics ----------------------------------------------------------------
def rank_histogram(
    forecast: X,
    truth: xr.DataArray | xr.Dataset,
    weights: xr.DataArray | None = None,
    dims: Sequence[Hashable] = ("time", "latitude", "longitude"),
    member_dim: str = "member",
) -> X:
    """Relative frequency of the truth's rank among the M members (Talagrand diagram), over ``dims``
    (weighted by ``weights``, e.g. latitude weights), other dims kept; new dim ``rank`` = 1 … M + 1 (sums
    to 1). Flat (1/(M + 1) each) for a calibrated ensemble; U-shaped under-dispersive, ∩-shaped
    over-dispersive. Ties share their weight equally among the tied ranks (``scores.probability.rank_histogram``,
    which computes it)."""
    from scores.probability import rank_histogram as _rank_histogram

    _check_member(forecast, member_dim, 1)
    truth = _matching_truth(forecast, truth)
    w = None
    if weights is not None:
        template = truth if isinstance(truth, xr.DataArray) else truth[list(truth.data_vars)[0]]
        w = weights.broadcast_like(template)
    return _rank_histogram(forecast, truth, member_dim, reduce_dims=list(dims), weights=w)


def member_diversity(
    forecast: X,
    truth: xr.DataArray | xr.Dataset,
    weights: xr.DataArray | None = None,
    dims: Sequence[Hashable] = ("time", "latitude", "longitude"),
    member_dim: str = "member",
) -> xr.Dataset:
    """Diversity of an ensemble against its error, reduced over ``dims`` (weighted):

    * ``pairwise_distance`` D = mean over points of (1/(M(M − 1))) Σⱼ≠ₖ |xⱼ − xₖ| (units of the field);
    * ``member_error`` E = mean over points of (1/M) Σⱼ |xⱼ − y| (units of the field);
    * ``diversity_ratio`` D / E (dimensionless): E[|X − X'|] = E[|X − Y|] when the truth is exchangeable with
      the members, so ≈ 1 for a calibrated ensemble and → 0 for a collapsed one (all members equal).

    The fair CRPS is E − D/2 with these two terms. ``forecast`` must be a DataArray with M ≥ 2.
    """
    if not isinstance(forecast, xr.DataArray):
        raise ValueError("member_diversity takes a DataArray forecast (one field)")
    _check_member(forecast, member_dim, 2)
    pairwise = pairwise_spread(forecast, member_dim)
    error = abs(forecast - truth).mean(member_dim)
    d = weighted_mean(pairwise, dims, weights)
    e = weighted_mean(error, dims, weights)
    return xr.Dataset({"pairwise_distance": d, "member_error": e, "diversity_ratio": d / e})


# ---- WeatherBench 2's probabilistic set: debiased ensemble-mean MSE, energy score -------------------------
def debiased_ensemble_mean_mse_per_point(forecast: X, truth: xr.DataArray | xr.Dataset,
                                         member_dim: str = "member") -> X:
    """(x̄ − y)² − s²/M per point, s² the unbiased (ddof = 1) member variance; units² of the field, no
    reduction. The squared error of an M-member mean overestimates that of the infinite ensemble's mean by
    σ²/M on average; subtracting s²/M removes it (WB2 ``DebiasedEnsembleMeanMSE``), so the score of an
    M-member ensemble estimates E(μ − Y)², μ the mean of the distribution the members are drawn from. Can be
    negative at a point; needs M ≥ 2."""
    m = _check_member(forecast, member_dim, 2)
    truth = _matching_truth(forecast, truth)
    return (forecast.mean(member_dim) - truth) ** 2 - forecast.var(member_dim, ddof=1) / m


def debiased_ensemble_mean_mse(
    forecast: X,
    truth: xr.DataArray | xr.Dataset,
    weights: xr.DataArray | None = None,
    dims: Sequence[Hashable] = ("time", "latitude", "longitude"),
    member_dim: str = "member",
) -> X:
    """:func:`debiased_ensemble_mean_mse_per_point` averaged over ``dims`` (weighted, e.g. latitude
    weights); units² of the field."""
    return weighted_mean(debiased_ensemble_mean_mse_per_point(forecast, truth, member_dim), dims, weights)


def _energy_terms_np(x: np.ndarray, y: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Energy-score skill and spread of ensembles ``x`` (..., M, P) against ``y`` (..., P), the norm
    ‖v‖ = √(Σₚ wₚ vₚ² / Σₚ wₚ) for each weight row of ``w`` (R, P) over the points p that have a truth.

    Returns (..., R, 2): [:, 0] skill (1/M) Σⱼ ‖xⱼ − y‖, [:, 1] spread (1/(M(M − 1))) Σⱼ≠ₖ ‖xⱼ − xₖ‖, the
    latter from the Gram matrix of the members' deviations from their mean (Σ w (a − b)² = G_aa + G_bb −
    2G_ab, O(M²P) per region in one matrix product, no (M, M, P) array).

    The BLAS thread count is left alone: changing it per task (threadpoolctl) from several dask worker threads
    at once is not thread-safe in OpenBLAS and crashed a long test process.
    """
    return _energy_terms_block(x, y, w)


def _energy_terms_block(x: np.ndarray, y: np.ndarray, w: np.ndarray) -> np.ndarray:
    x = np.asarray(x, np.float64)
    y = np.asarray(y, np.float64)
    lead = x.shape[:-2]
    m, p = x.shape[-2:]
    xb = x.reshape(-1, m, p)
    yb = np.broadcast_to(y, (*lead, p)).reshape(-1, p)
    valid = np.isfinite(yb)
    out = np.empty((xb.shape[0], w.shape[0], 2))
    for i in range(xb.shape[0]):
        v = valid[i]
        xi, yi, wi = xb[i][:, v], yb[i][v], w[:, v]
        wsum = wi.sum(-1)  # (R,)
        with np.errstate(invalid="ignore", divide="ignore"):
            skill = np.sqrt(((xi - yi) ** 2) @ wi.T / wsum)  # (M, R)
            dev = xi - xi.mean(0)
            spread = np.empty(w.shape[0])
            for r in range(w.shape[0]):
                g = (dev * wi[r]) @ dev.T
                d2 = np.clip(np.diag(g)[:, None] + np.diag(g)[None, :] - 2.0 * g, 0.0, None)
                spread[r] = np.sqrt(d2).sum() / (m * (m - 1)) / np.sqrt(wsum[r]) if m > 1 else 0.0
        out[i, :, 0] = skill.mean(0)
        out[i, :, 1] = spread
        out[i, wsum <= 0] = np.nan
    return out.reshape(*lead, w.shape[0], 2)


def energy_score_terms(
    forecast: xr.DataArray,
    truth: xr.DataArray,
    weights: xr.DataArray,
    spatial_dims: Sequence[Hashable] = ("latitude", "longitude"),
    member_dim: str = "member",
) -> xr.Dataset:
    """Energy score (Gneiting & Raftery 2007) of each forecast field, per remaining dim (e.g. per init and
    lead): ``skill`` E‖X − Y‖, ``spread`` E‖X − X′‖ and ``energy_score`` skill − spread/2, units of the field.

    Conventions (WeatherBench 2 ``EnergyScore``): one field at a time, ‖v‖ the area-weighted L2 norm
    √(Σ w v² / Σ w) over ``spatial_dims`` (``weights`` over those dims, e.g. latitude weights; an extra
    leading dim of ``weights``, e.g. ``region``, is kept in the result). The spread uses ALL M(M − 1) ordered
    member pairs (the fair estimator; WB2 averages the M − 1 adjacent pairs, which has the same expectation
    and more variance), so both are unbiased for the energy score of the distribution the members are drawn
    from. With one spatial point the energy score is the fair CRPS. Points without truth are left out of the
    norms; a field with no truth gives NaN. Needs M ≥ 2.
    """
    _check_member(forecast, member_dim, 2)
    space = [d for d in spatial_dims if d in forecast.dims]
    w = weights.broadcast_like(truth.isel({d: 0 for d in truth.dims if d not in space}, drop=True))
    extra = [d for d in w.dims if d not in space]
    if len(extra) > 1:
        raise ValueError(f"weights may have at most one dim beyond {space}, got {extra}")
    wd = extra[0] if extra else "_weights"
    w = w if extra else w.expand_dims(wd)
    stacked_w = w.stack(_point=space).transpose(wd, "_point")
    f = forecast.astype(np.float64).stack(_point=space)
    t = truth.astype(np.float64).stack(_point=space)
    f, t = f.drop_vars([c for c in f.coords if "_point" in f[c].dims]), \
        t.drop_vars([c for c in t.coords if "_point" in t[c].dims])
    terms = xr.apply_ufunc(
        _energy_terms_np, f, t, kwargs={"w": stacked_w.values.astype(np.float64)},
        input_core_dims=[[member_dim, "_point"], ["_point"]], output_core_dims=[[wd, "_term"]],
        dask="parallelized", output_dtypes=[np.float64],
        dask_gufunc_kwargs={"allow_rechunk": True, "output_sizes": {wd: w.sizes[wd], "_term": 2}},
    )
    if extra:
        terms = terms.assign_coords({wd: w[wd].values})
    skill, spread = terms.isel(_term=0, drop=True), terms.isel(_term=1, drop=True)
    out = xr.Dataset({"skill": skill, "spread": spread, "energy_score": skill - 0.5 * spread})
    return out if extra else out.squeeze(wd, drop=True)
