"""Products of a Gaussian (μ, σ) post-processed forecast: calibrated members by ensemble copula coupling
(ECC-Q) and predictive quantiles, each written as its own forecast store
(:func:`smoeweather.data.forecast_stores.write_store`).

ECC-Q (Schefzik et al. 2013): at every point, init, lead and level the N = M calibrated members are the
Gaussian quantiles x̃₍ₖ₎ = μ + σ Φ⁻¹((k − ½)/N), k = 1..N, given to the raw members in their rank order:
member j gets x̃₍rank(j)₎. So each calibrated member keeps the raw member's spatial, inter-variable and
lead structure (the raw ensemble's copula), and the marginal at every point is the post-processed one.
N must equal the raw member count M (ECC reorders; it cannot invent or drop members).

Ties (gcm_ens is int16-packed, members can tie): ranks come from a STABLE argsort, so tied members are
ranked by member index. This is deterministic (identical output on every run and machine, no seed to record);
the cost is that among tied members the lower index always gets the lower quantile. Ties are within the
packing quantum (10 m² s⁻², 0.02 K in gcm_ens), far below the calibrated spread, so the bias is negligible
for these continuous fields; random tie-breaking (as for precipitation) is not needed here.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import xarray as xr
from scipy.special import ndtr, ndtri


def ecc_levels(n: int) -> np.ndarray:
    """Probability levels (k − ½)/n, k = 1..n, of the ECC-Q quantiles."""
    return (np.arange(1, n + 1) - 0.5) / n


def check_quantile_levels(levels: Sequence[float]) -> np.ndarray:
    """Sorted unique levels in (0, 1); ValueError naming the option otherwise."""
    q = np.asarray(sorted(set(float(x) for x in levels)), np.float64)
    if len(q) == 0 or (q <= 0).any() or (q >= 1).any():
        raise ValueError(f"--quantiles must be probabilities strictly between 0 and 1, got {list(levels)}")
    return q


def gaussian_quantiles(mu: xr.Dataset, sigma: xr.Dataset, levels: Sequence[float], distribution: str = "normal"
                       ) -> xr.Dataset:
    """Quantiles μ + σ Φ⁻¹(q) of N(μ, σ²) on a new leading-after-lead dim ``quantile`` (units of the field);
    ``distribution="truncnormal"``: of N(μ, σ²) truncated to [0, ∞) (:func:`.distributions.quantiles`)."""
    q = check_quantile_levels(levels)
    z = xr.DataArray(ndtri(q), dims="quantile", coords={"quantile": q})
    out = xr.Dataset()
    for n in mu.data_vars:
        if distribution == "truncnormal":
            qa = xr.DataArray(q, dims="quantile", coords={"quantile": q})
            da = xr.apply_ufunc(_tn_quantiles, mu[n], sigma[n], qa, dask="parallelized",
                                output_dtypes=[np.float64]).assign_attrs(mu[n].attrs)
        else:
            da = (mu[n] + sigma[n] * z).assign_attrs(mu[n].attrs)
        order = [d for d in ("time", "prediction_timedelta", "quantile") if d in da.dims]
        out[n] = da.transpose(*order, ...)
    out["quantile"].attrs = {"long_name": "probability level of the predictive quantile", "units": "1"}
    return out


def _tn_quantiles(mu: np.ndarray, sd: np.ndarray, q: np.ndarray) -> np.ndarray:
    from smoeweather.postprocess.distributions import quantiles

    return quantiles("truncnormal", mu, sd, q)


def ranks(raw: np.ndarray, axis: int) -> np.ndarray:
    """0-based rank of every member along ``axis`` (stable: ties ranked by member index)."""
    order = np.argsort(raw, axis=axis, kind="stable")
    out = np.empty_like(order)
    idx = np.arange(raw.shape[axis]).reshape([-1 if i == axis else 1 for i in range(raw.ndim)])
    np.put_along_axis(out, order, np.broadcast_to(idx, order.shape), axis=axis)
    return out


def ecc_members(mu: xr.Dataset, sigma: xr.Dataset, raw: xr.Dataset, n: int, member_dim: str = "member",
                distribution: str = "normal") -> xr.Dataset:
    """ECC-Q members (module doc) of N(μ, σ²) in the rank order of ``raw``'s members: Dataset with ``raw``'s
    dims (``member`` of size n). ValueError when n differs from the raw member count.
    ``distribution="truncnormal"``: quantiles of N(μ, σ²) truncated to [0, ∞) (:mod:`.distributions`)."""
    m = int(raw.sizes[member_dim])
    if n != m:
        raise ValueError(f"--members {n}: ECC-Q reorders the raw members, so N must equal the raw ensemble's "
                         f"member count ({m})")
    zq = ndtri(ecc_levels(n))
    out = xr.Dataset()
    for name in mu.data_vars:
        r = raw[name].transpose(*mu[name].dims, member_dim)
        if r.chunks is not None:  # every member of a point in one block: a store chunked along members works too
            r = r.chunk({member_dim: -1})
        # per chunk of (init, lead, level, space) with every member: lazy on dask, streamed chunk by chunk
        da = xr.apply_ufunc(_ecc_block, r, mu[name], sigma[name].transpose(*mu[name].dims),
                            kwargs={"zq": zq, "truncated": distribution == "truncnormal"},
                            input_core_dims=[[member_dim], [], []],
                            output_core_dims=[[member_dim]], dask="parallelized", output_dtypes=[np.float32])
        da = da.assign_coords({member_dim: np.arange(n)}).assign_attrs(dict(mu[name].attrs))
        order = [d for d in ("time", "prediction_timedelta", member_dim) if d in da.dims]
        out[name] = da.transpose(*order, ...)
    return out


def _ecc_block(raw: np.ndarray, mu: np.ndarray, sd: np.ndarray, zq: np.ndarray, truncated: bool = False
               ) -> np.ndarray:
    """ECC-Q members (..., M) float32 of N(μ, σ²) (...) in the rank order of ``raw`` (..., M); NaN where raw is.
    ``truncated``: of N(μ, σ²) truncated to [0, ∞)."""
    x = np.asarray(raw)  # ranked in its own dtype (float32 → float64 would not change the order)
    if truncated:
        from smoeweather.postprocess.distributions import quantiles

        q = ndtr(zq)[ranks(x, axis=x.ndim - 1)]
        vals = quantiles("truncnormal", np.asarray(mu, np.float64)[..., None], np.asarray(sd, np.float64)[..., None], q)
        return np.where(np.isnan(x), np.nan, vals).astype(np.float32)
    vals = np.asarray(mu, np.float64)[..., None] + np.asarray(sd, np.float64)[..., None] * zq[ranks(x, axis=x.ndim - 1)]
    return np.where(np.isnan(x), np.nan, vals).astype(np.float32)
