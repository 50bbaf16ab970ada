"""Calibration a forecaster can see: probabilities of threshold exceedance from any forecast kind, the Brier
score and its skill against references, the reliability table, and PIT histograms (pure xarray / numpy).

* :func:`exceedance_probability`: P(y > t) of an ensemble (fraction of members above t), a Gaussian N(μ, σ²)
  (1 − Φ((t − μ)/σ)) or a probability forecast (as issued; a non-exceedance forecast P(y < t) becomes 1 − p).
* :func:`brier_terms`: the per-initialisation area mean of (p − 1{y > t})², so that the time mean is the
  Brier score ``BS`` of the WB2 order (space, then time); ``BSS = 1 − BS / BS_ref``.
* :func:`reliability_table`: per probability bin, the mean forecast probability, the observed frequency of
  the event and the number of cases (every grid point and initialisation counts once, unweighted, as in the
  usual reliability diagram).
* :func:`pit_histogram`: the relative frequency of the probability integral transform F(y) in equal bins on
  [0, 1] (flat for a calibrated forecast; U-shaped: under-dispersive).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import numpy as np
import xarray as xr
from scipy import stats

from smoeweather.metrics.weights import area_mean

RELIABILITY_BINS = 10
PIT_BINS = 10
BELOW = ("less_than", "less_than_or_equal_to")
ABOVE = ("greater_than", "greater_than_or_equal_to")


def exceedance_probability(forecast: xr.DataArray, kind: str, thresholds: xr.DataArray,
                           sigma: xr.DataArray | None = None, relative_to: str = "greater_than") -> xr.DataArray:
    """P(y > t) for every threshold (dim ``threshold`` of ``thresholds``, in the field's units), dims of the
    forecast without ``member`` plus ``threshold``. ``kind``: ensemble, gaussian (``sigma``), probability
    (``forecast`` already has the ``threshold`` dim; ``relative_to`` its ``spp__relative_to_threshold``)."""
    if kind == "probability":
        if relative_to not in (*ABOVE, *BELOW):
            raise ValueError(f"spp__relative_to_threshold must be one of {ABOVE + BELOW}, got {relative_to!r}")
        p = forecast.astype(np.float64)
        return 1.0 - p if relative_to in BELOW else p
    if kind == "ensemble":
        above = (forecast > thresholds).astype(np.float64).where(forecast.notnull())
        return above.mean("member")
    if kind == "gaussian":
        if sigma is None:
            raise ValueError("a gaussian forecast needs sigma (its <name>_std variable)")
        z = (thresholds - forecast) / sigma
        return 1.0 - xr.apply_ufunc(stats.norm.cdf, z, dask="allowed")
    if kind == "deterministic":
        return (forecast > thresholds).astype(np.float64).where(forecast.notnull())
    raise ValueError(f"no exceedance probability for a {kind} forecast")


def event(truth: xr.DataArray, thresholds: xr.DataArray) -> xr.DataArray:
    """1{y > t} (NaN where the truth is missing), dims of the truth plus ``threshold``."""
    return (truth > thresholds).astype(np.float64).where(truth.notnull())


def brier_terms(probability: xr.DataArray, observed: xr.DataArray, weights: xr.DataArray) -> xr.DataArray:
    """Per-initialisation area mean of (p − o)², probability and event on the same grid (any other dims kept)."""
    return area_mean((probability - observed) ** 2, weights, ("latitude", "longitude"))


def brier_skill(brier: xr.DataArray, reference: xr.DataArray) -> xr.DataArray:
    """1 − BS / BS_ref (1: perfect, 0: as good as the reference, < 0: worse); NaN where BS_ref is 0."""
    return 1.0 - brier / reference.where(reference > 0)


def _binned(p: np.ndarray, o: np.ndarray, n_bins: int) -> np.ndarray:
    """(3, n_bins): mean probability, observed frequency and count per bin of ``p`` (last axis flattened)."""
    ok = np.isfinite(p) & np.isfinite(o)
    p, o = p[ok], o[ok]
    idx = np.clip((p * n_bins).astype(int), 0, n_bins - 1)
    count = np.bincount(idx, minlength=n_bins).astype(np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean_p = np.bincount(idx, weights=p, minlength=n_bins) / count
        freq = np.bincount(idx, weights=o, minlength=n_bins) / count
    return np.stack([mean_p, freq, count])


def reliability_table(probability: xr.DataArray, observed: xr.DataArray, over: Sequence[Hashable],
                      n_bins: int = RELIABILITY_BINS) -> xr.Dataset:
    """Reliability table over the dims ``over`` (e.g. time, latitude, longitude), other dims kept: for each
    of ``n_bins`` equal probability bins (dim ``probability_bin``, coordinate = bin centre) the mean forecast
    probability ``forecast_probability``, the ``observed_frequency`` of the event and the ``count`` of cases."""
    p, o = xr.broadcast(probability, observed)
    out = xr.apply_ufunc(_binned, p, o, input_core_dims=[list(over), list(over)],
                         output_core_dims=[["quantity", "probability_bin"]], vectorize=True,
                         kwargs={"n_bins": n_bins}, dask="parallelized", output_dtypes=[np.float64],
                         dask_gufunc_kwargs={"output_sizes": {"quantity": 3, "probability_bin": n_bins},
                                             "allow_rechunk": True})
    centres = (np.arange(n_bins) + 0.5) / n_bins
    out = out.assign_coords(probability_bin=centres)
    return xr.Dataset({"forecast_probability": out.isel(quantity=0, drop=True),
                       "observed_frequency": out.isel(quantity=1, drop=True),
                       "count": out.isel(quantity=2, drop=True)})


def pit_values(forecast: xr.DataArray, kind: str, truth: xr.DataArray, sigma: xr.DataArray | None = None
               ) -> xr.DataArray:
    """F(y) of the forecast distribution at the truth: Φ((y − μ)/σ) for a Gaussian; for an ensemble the
    mid-rank (fraction of members below y plus half the fraction equal to it), whose histogram is the rank
    histogram's."""
    if kind == "gaussian":
        if sigma is None:
            raise ValueError("a gaussian forecast needs sigma (its <name>_std variable)")
        return xr.apply_ufunc(stats.norm.cdf, (truth - forecast) / sigma, dask="allowed").where(truth.notnull())
    if kind == "ensemble":
        below = (forecast < truth).astype(np.float64).mean("member")
        equal = (forecast == truth).astype(np.float64).mean("member")
        return (below + 0.5 * equal).where(truth.notnull())
    raise ValueError(f"no PIT for a {kind} forecast")


def pit_histogram(pit: xr.DataArray, over: Sequence[Hashable], n_bins: int = PIT_BINS) -> xr.DataArray:
    """Relative frequency of PIT values in ``n_bins`` equal bins of [0, 1] over the dims ``over`` (dim
    ``pit_bin``, coordinate = bin centre; sums to 1)."""

    def hist(x: np.ndarray) -> np.ndarray:
        x = x[np.isfinite(x)]
        counts, _ = np.histogram(x, bins=n_bins, range=(0.0, 1.0))
        return counts / max(counts.sum(), 1)

    out = xr.apply_ufunc(hist, pit, input_core_dims=[list(over)], output_core_dims=[["pit_bin"]], vectorize=True,
                         dask="parallelized", output_dtypes=[np.float64],
                         dask_gufunc_kwargs={"output_sizes": {"pit_bin": n_bins}, "allow_rechunk": True})
    return out.assign_coords(pit_bin=(np.arange(n_bins) + 0.5) / n_bins)


__all__ = ["PIT_BINS", "RELIABILITY_BINS", "brier_skill", "brier_terms", "event", "exceedance_probability",
           "pit_histogram", "pit_values", "reliability_table"]
