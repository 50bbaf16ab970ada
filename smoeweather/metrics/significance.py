"""Paired significance of score differences over initialisations (pure xarray/numpy), for scorecards.

Two forecasts scored on the same initialisations give per-init scores a_t and b_t (area means, e.g. the
squared error behind RMSE). Their difference d_t = a_t − b_t has mean d̄ and sample standard deviation s.
Consecutive initialisations are not independent (weather persists for days), so the n differences carry
less information than n independent ones; the effective sample size from the lag-1 autocorrelation r₁ of
d (an AR(1) model; Wilks, Statistical Methods in the Atmospheric Sciences, "variance inflation factor"):

    n_eff = n (1 − r₁)/(1 + r₁)   for r₁ > 0 (n otherwise), at least 2 and at most n,

and the two-sided t-test of d̄ = 0 uses t = d̄ / (s / √n_eff) with n_eff − 1 degrees of freedom. With r₁ ≤ 0
this is the ordinary paired t-test (``scipy.stats.ttest_rel``).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import xarray as xr
from scipy import stats


def _lag1(d: np.ndarray) -> float:
    """Lag-1 autocorrelation of the series d (NaNs dropped pairwise), 0 for fewer than 3 pairs."""
    a, b = d[:-1], d[1:]
    ok = np.isfinite(a) & np.isfinite(b)
    if ok.sum() < 3:
        return 0.0
    x = d[np.isfinite(d)]
    mean = x.mean()
    var = ((x - mean) ** 2).mean()
    if var <= 0:
        return 0.0
    return float(((a[ok] - mean) * (b[ok] - mean)).mean() / var)


def effective_sample_size(n: int, r1: float) -> float:
    """n (1 − r₁)/(1 + r₁) for r₁ > 0, else n; clipped to [min(2, n), n]."""
    n_eff = n * (1.0 - r1) / (1.0 + r1) if r1 > 0 else float(n)
    return float(np.clip(n_eff, min(2.0, n), n))


def _test_np(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """(mean difference, p-value, n_eff, r₁) of the paired series a, b (last axis = time, in order)."""
    shape = a.shape[:-1]
    a2 = a.reshape(-1, a.shape[-1])
    b2 = b.reshape(-1, b.shape[-1])
    out = np.full((a2.shape[0], 4), np.nan)
    for i in range(a2.shape[0]):
        d = a2[i] - b2[i]
        x = d[np.isfinite(d)]
        n = x.size
        if n < 2:
            continue
        r1 = _lag1(d)
        n_eff = effective_sample_size(n, r1)
        s = x.std(ddof=1)
        if s == 0:
            p = 1.0 if x.mean() == 0 else 0.0
        else:
            t = x.mean() / (s / np.sqrt(n_eff))
            p = float(2.0 * stats.t.sf(abs(t), df=max(n_eff - 1.0, 1.0)))
        out[i] = (x.mean(), p, n_eff, r1)
    return out.reshape(*shape, 4)


def paired_difference_test(a: xr.DataArray, b: xr.DataArray, dim: str = "time") -> xr.Dataset:
    """Paired two-sided t-test of mean(a − b) = 0 over ``dim`` (initialisations, in time order), allowing for
    the lag-1 autocorrelation of the differences (module docstring). Returns ``mean_difference``,
    ``p_value``, ``n_eff`` and ``lag1_autocorrelation`` over the other dims."""
    a, b = xr.broadcast(a.astype(np.float64), b.astype(np.float64))
    a = a.sortby(dim) if dim in a.coords else a
    b = b.sortby(dim) if dim in b.coords else b
    res = xr.apply_ufunc(_test_np, a, b, input_core_dims=[[dim], [dim]], output_core_dims=[["_stat"]],
                         dask="parallelized", output_dtypes=[np.float64],
                         dask_gufunc_kwargs={"output_sizes": {"_stat": 4}})
    names = ("mean_difference", "p_value", "n_eff", "lag1_autocorrelation")
    return xr.Dataset({k: res.isel(_stat=i, drop=True) for i, k in enumerate(names)})


__all__ = ["effective_sample_size", "paired_difference_test"]


def t_interval(values: Any, level: float = 0.95) -> dict[str, Any]:
    """Mean, standard error std/√n (ddof 1), and the ``level`` Student-t interval with n − 1 degrees of
    freedom of ``values`` (e.g. paired differences); ``excludes_zero``: the interval lies on one side of 0.
    With n < 2 the SE and the interval are NaN."""
    d = np.asarray(values, np.float64)
    n = len(d)
    mean = float(d.mean()) if n else float("nan")
    if n < 2:
        return {"mean": mean, "se": float("nan"), "n": n, "lo": float("nan"), "hi": float("nan"),
                "t": float("nan"), "level": level, "excludes_zero": False}
    se = float(d.std(ddof=1) / math.sqrt(n))
    t = float(stats.t.ppf(0.5 + level / 2, n - 1))
    lo, hi = mean - t * se, mean + t * se
    return {"mean": mean, "se": se, "n": n, "lo": lo, "hi": hi, "t": t, "level": level,
            "excludes_zero": bool(lo > 0 or hi < 0)}
