"""EMOS (Gneiting et al. 2005): Gaussian predictive distribution from ensemble statistics, minimum-CRPS fit.

    μ = a + b · ensemble mean,   σ² = c + d · ensemble variance (ddof = 1),   c, d ≥ 0

fitted by minimising the mean closed-form Gaussian CRPS over the training init times (and, for a global
fit, over the grid with latitude weights). One coefficient set per variable, lead and level, and per grid
point with ``per_gridpoint=True``. Every fit is done in standardised units of its own truth (so one
tolerance suits Z500 and T850).

Solver: every group (variable × lead × level [× grid point]) is its own
4-parameter problem, solved on all groups at once by the one damped saddle-free Newton solver
(:func:`.newton.minimise`, also used by :func:`fit_blocks` for any mean predictors and the truncated normal):

- closed-form start: a, b by weighted least squares of the truth on the ensemble mean; c, d by regressing
  the squared residuals on the ensemble variance (clipped to c, d ≥ 0);
- c = γ² + c₀, d = δ² (c₀ = 10⁻⁶ of the truth's variance keeps σ > 0 when all members tie): the bound
  c, d = 0 is reachable, and a minimum on it has positive curvature in γ, δ, so Newton converges there too;
- the exact Hessian of the mean CRPS (per sample it is (2φ(z)/σ)·[[1, z], [z, z²]] in (μ, σ), plus the
  curvature of σ = √(c + d·v)) in a 4 × 4 eigendecomposition per group; negative eigenvalues are flipped
  (saddle-free Newton), so every step descends;
- a backtracking Armijo line search per group (each group its own step length), and converged groups leave
  the active set: the cost follows the groups still moving.

An independent reference solver (one torch L-BFGS over the sum of all groups) is
:mod:`smoeweather.postprocess.emos_reference`; the tests check against it, ``benchmarks/postprocess.py`` times
against it.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import partial

import numpy as np
import pandas as pd
import torch
import xarray as xr

from smoeweather.metrics.weights import latitude_weights
from smoeweather.postprocess.newton import LADDER, minimise, saddle_free_step

COEFFICIENTS = ("a", "b", "c", "d")
C_FLOOR = 1e-6  # floor of c in units of the truth's variance (σ ≥ 10⁻³ of the truth's standard deviation)
_BLOCK = 1 << 18  # group × sample elements per Newton block (2 MB per float64 temporary: cache-friendly)
_SQRT_2PI = math.sqrt(2.0 * math.pi)
_INV_SQRT_PI = 1.0 / math.sqrt(math.pi)
_INV_SQRT_2 = 1.0 / math.sqrt(2.0)


def ensemble_moments(forecast: xr.Dataset, member_dim: str = "member") -> tuple[xr.Dataset, xr.Dataset]:
    """(ensemble mean, unbiased ensemble variance) over ``member_dim``; units and units² of the field."""
    return forecast.mean(member_dim, skipna=False), forecast.var(member_dim, ddof=1, skipna=False)


def _standardise(m: np.ndarray, v: np.ndarray, y: np.ndarray, w: np.ndarray
                 ) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray]:
    """Masked, standardised float64 arrays {m, v, y, w} (G, S) with w summing to 1 per group; (loc, scale) (G,)."""
    valid = np.isfinite(m) & np.isfinite(v) & np.isfinite(y) & (w > 0)
    w = np.where(valid, w, 0.0)
    wsum = np.maximum(w.sum(1, keepdims=True), 1e-300)
    m, v, y = (np.where(valid, a, 0.0) for a in (m, v, y))
    loc = (w * y).sum(1, keepdims=True) / wsum
    scale = np.sqrt((w * (y - loc) ** 2).sum(1, keepdims=True) / wsum)
    scale = np.where(scale > 0, scale, 1.0)
    data = {"m": (m - loc) / scale, "v": v / scale**2, "y": (y - loc) / scale, "w": w / wsum}
    return data, loc[:, 0], scale[:, 0]


def _to_physical(coef: np.ndarray, loc: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """(G, 4) standardised (a', b', c', d') → physical: μ = loc + scale·(a' + b'(mean − loc)/scale),
    σ² = scale²·c' + d'·var."""
    a_, b_, c_, d_ = coef.T
    return np.stack([loc + scale * a_ - b_ * loc, b_, scale**2 * c_, d_], axis=1)


def _features(m: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Per-sample products (G, S, 3) = [m², m·v, v²] that the Hessian sums need (computed once per block)."""
    return torch.stack([m * m, m * v, v * v], -1)


def _crps_and_derivatives(theta: torch.Tensor, m: torch.Tensor, v: torch.Tensor, y: torch.Tensor,
                          w: torch.Tensor, feats: torch.Tensor | None = None
                          ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """Mean CRPS (G,) at θ = (a, b, γ, δ) (G, 4) and, when ``feats`` (:func:`_features`) is given, its
    gradient (G, 4) and Hessian (G, 4, 4) with respect to θ (c = γ² + C_FLOOR, d = δ²).

    Data (G, S) standardised, w summing to 1 per group. Per sample, in (μ, σ): ∂/∂μ = 1 − 2Φ(z),
    ∂/∂σ = 2φ(z) − 1/√π, Hessian (2φ(z)/σ)·[[1, z], [z, z²]]; σ = √(c + d·v) adds ∂/∂σ · ∇²σ.
    """
    a, b, gam, dlt = (theta[:, i : i + 1] for i in range(4))
    mu = a + b * m
    sigma = torch.sqrt(gam * gam + C_FLOOR + dlt * dlt * v)
    z = (y - mu) / sigma
    pdf = torch.exp(-0.5 * z * z) / _SQRT_2PI
    cdf = 0.5 * (1.0 + torch.erf(z * _INV_SQRT_2))
    loss = (w * sigma * (z * (2.0 * cdf - 1.0) + 2.0 * pdf - _INV_SQRT_PI)).sum(1)
    if feats is None:
        return loss, None, None
    inv2s = 0.5 / sigma  # ∂σ/∂c (∂σ/∂d = v/(2σ))
    l_s = w * (2.0 * pdf - _INV_SQRT_PI)  # ∂/∂σ, weighted
    h_mm = w * 2.0 * pdf / sigma  # ∂²/∂μ²
    h_ms = h_mm * z * inv2s  # ∂²/∂μ∂c
    # ∂²/∂c² = ∂²/∂σ² (∂σ/∂c)² + ∂/∂σ ∂²σ/∂c², ∂²σ/∂c² = −1/(4σ³) = −2 (1/(2σ))³
    h_ss = (h_ms * z - 2.0 * l_s * inv2s * inv2s) * inv2s
    g_m, g_s = w * (1.0 - 2.0 * cdf), l_s * inv2s  # ∂/∂μ, ∂/∂c (weighted)
    m2, mv, v2 = feats.unbind(-1)

    def s(x: torch.Tensor) -> torch.Tensor:
        return x.sum(1)

    grad = torch.stack([s(g_m), s(g_m * m), s(g_s), s(g_s * v)], 1)
    h_ab = [s(h_mm), s(h_mm * m), s(h_mm * m2)]
    h_x = [s(h_ms), s(h_ms * v), s(h_ms * m), s(h_ms * mv)]  # ac, ad, bc, bd
    h_cd = [s(h_ss), s(h_ss * v), s(h_ss * v2)]
    hess = torch.stack([
        torch.stack([h_ab[0], h_ab[1], h_x[0], h_x[1]], 1),
        torch.stack([h_ab[1], h_ab[2], h_x[2], h_x[3]], 1),
        torch.stack([h_x[0], h_x[2], h_cd[0], h_cd[1]], 1),
        torch.stack([h_x[1], h_x[3], h_cd[1], h_cd[2]], 1)], 1)
    # chain rule to (γ, δ): c = γ² + c₀, d = δ²
    jac = torch.cat([torch.ones_like(a), torch.ones_like(a), 2.0 * gam, 2.0 * dlt], 1)
    hess = hess * jac[:, :, None] * jac[:, None, :]
    hess[:, 2, 2] += 2.0 * grad[:, 2]
    hess[:, 3, 3] += 2.0 * grad[:, 3]
    return loss, grad * jac, hess


def _newton_step(grad: torch.Tensor, hess: torch.Tensor) -> torch.Tensor:
    """Saddle-free Newton step −|H|⁻¹ g (G, 4): eigenvalues by magnitude, floored at 10⁻¹⁰ of the largest."""
    evals, evecs = torch.linalg.eigh(hess)
    floor = 1e-10 * evals.abs().amax(1, keepdim=True).clamp_min(1e-300)
    inv = 1.0 / torch.maximum(evals.abs(), floor)
    return -(evecs @ (inv[:, :, None] * (evecs.transpose(1, 2) @ grad[:, :, None])))[:, :, 0]


def _start(m: torch.Tensor, v: torch.Tensor, y: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Closed-form θ₀ (G, 4): a, b by weighted least squares; c, d by regressing squared residuals on v."""
    mbar, ybar = (w * m).sum(1), (w * y).sum(1)
    varm = (w * (m - mbar[:, None]) ** 2).sum(1)
    cov = (w * (m - mbar[:, None]) * (y - ybar[:, None])).sum(1)
    b0 = torch.where(varm > 1e-12, cov / varm.clamp_min(1e-12), torch.ones_like(varm))
    a0 = ybar - b0 * mbar
    r2 = (y - a0[:, None] - b0[:, None] * m) ** 2
    r2bar, vbar = (w * r2).sum(1), (w * v).sum(1)
    varv = (w * (v - vbar[:, None]) ** 2).sum(1)
    covv = (w * (v - vbar[:, None]) * (r2 - r2bar[:, None])).sum(1)
    d0 = torch.where(varv > 1e-12, covv / varv.clamp_min(1e-12), torch.zeros_like(varv))
    d0 = torch.minimum(d0.clamp_min(0.0), 0.9 * r2bar / vbar.clamp_min(1e-12))
    c0 = (r2bar - d0 * vbar).clamp_min(10 * C_FLOOR)
    return torch.stack([a0, b0, torch.sqrt(c0 - C_FLOOR), torch.sqrt(d0.clamp_min(1e-4))], 1)


class _MeanSpread:
    """The mean/spread Gaussian EMOS of one block of groups as a :class:`.newton.Problem`: standardised data
    (G, S) held as torch tensors, the closed-form CRPS derivatives of :func:`_crps_and_derivatives` (torch)."""

    def __init__(self, data: dict[str, np.ndarray]) -> None:
        t = {k: torch.from_numpy(np.ascontiguousarray(a)) for k, a in data.items()}
        self.work = dict(t, f=_features(t["m"], t["v"]))

    def start(self) -> np.ndarray:
        w = self.work
        return _start(w["m"], w["v"], w["y"], w["w"]).numpy()

    def _eval(self, theta: np.ndarray, rows: np.ndarray | None, derivatives: bool
              ) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
        w = self.work if rows is None else {k: a[torch.from_numpy(rows)] for k, a in self.work.items()}
        th = torch.from_numpy(theta if rows is None else theta[rows])
        f, g, h = _crps_and_derivatives(th, w["m"], w["v"], w["y"], w["w"], w["f"] if derivatives else None)
        return f.numpy(), None if g is None else g.numpy(), None if h is None else h.numpy()

    def derivatives(self, theta: np.ndarray, rows: np.ndarray | None = None
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return self._eval(theta, rows, True)  # type: ignore[return-value]

    def trial(self, theta: np.ndarray, step: np.ndarray, ladder: np.ndarray
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        f, g, h = self.derivatives(theta + step)  # the ladder is (1,): its loss comes with the derivatives
        return f[:, None], f, g, h

    def losses(self, theta: np.ndarray, rows: np.ndarray) -> np.ndarray:
        return self._eval(theta, rows, False)[0]

    def step(self, grad: np.ndarray, hess: np.ndarray) -> np.ndarray:
        return _newton_step(torch.from_numpy(grad), torch.from_numpy(hess)).numpy()

    def dot(self, grad: np.ndarray, step: np.ndarray) -> np.ndarray:
        return (torch.from_numpy(grad) * torch.from_numpy(step)).sum(1).numpy()

    def keep(self, rows: np.ndarray) -> None:
        self.work = {k: a[torch.from_numpy(rows)] for k, a in self.work.items()}


def _newton_block(data: dict[str, np.ndarray], iterations: int, tol: float) -> tuple[np.ndarray, np.ndarray]:
    """Standardised coefficients (G, 4) and convergence flags (G,) of one block of groups: the one Newton
    solver (:func:`.newton.minimise`) with a line search that evaluates the full step with the derivatives,
    then halves the steps of the groups it fails for one by one (up to 40 times); converged groups leave the
    working arrays once a quarter of them is done."""
    problem = _MeanSpread(data)
    theta0 = problem.start()
    theta, ok = minimise(problem, theta0, np.ones(len(theta0), bool), iterations, tol, ladder=np.ones(1),
                         halvings=40, compact=True)
    coef = np.stack([theta[:, 0], theta[:, 1], theta[:, 2] ** 2 + C_FLOOR, theta[:, 3] ** 2], 1)
    return coef, ok


def fit_groups_newton(m: np.ndarray, v: np.ndarray, y: np.ndarray, w: np.ndarray, iterations: int = 50,
                       tol: float = 1e-12) -> tuple[np.ndarray, np.ndarray]:
    """Per-group damped Newton (module doc): coefficients (G, 4) in physical units and convergence flags (G,).

    ``tol``: a group stops when the Newton decrement −gᵀp (its predicted CRPS decrease ×2, in units of the
    truth's standard deviation) falls below it, or when no step lowers its CRPS any more.
    """
    data, loc, scale = _standardise(m, v, y, w)
    g, s = m.shape
    step = max(1, _BLOCK // max(s, 1))
    coef = np.empty((g, 4))
    ok = np.empty(g, bool)
    blocks = [slice(i, i + step) for i in range(0, g, step)]

    def one(sl: slice) -> None:
        coef[sl], ok[sl] = _newton_block({k: a[sl] for k, a in data.items()}, iterations, tol)

    # blocks in parallel threads (torch releases the GIL), each single-threaded: on busy shared CPUs this
    # avoids the OpenMP barrier stalls of many small multi-threaded element-wise ops
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with ThreadPoolExecutor(max_workers=max(1, min(threads, len(blocks)))) as pool:
            list(pool.map(one, blocks))
    finally:
        torch.set_num_threads(threads)
    return _to_physical(coef, loc, scale), ok


def fit_emos(
    forecast: xr.Dataset,
    truth: xr.Dataset,
    per_gridpoint: bool = False,
    iterations: int | None = None,
    member_dim: str = "member",
    sample_dims: Sequence[str] = ("time",),
) -> xr.Dataset:
    """EMOS coefficients: per variable a DataArray with dim ``coefficient`` (a, b, c, d) and the group dims
    (``prediction_timedelta``, [``level``], and ``latitude``/``longitude`` if ``per_gridpoint``).

    ``forecast`` (ensemble) and ``truth`` (at valid times, see
    :func:`~smoeweather.data.forecast_stores.truth_at_valid_times`) share their non-member dims. Units: a, μ in
    the field's units; b, d dimensionless; c in units².
    ``iterations``: Newton iterations per group (default 50).
    attrs: method, per_gridpoint, solver, iterations, groups, groups_not_converged.
    """
    iterations = iterations if iterations is not None else 50
    mean, var = ensemble_moments(forecast, member_dim)
    out = {}
    n_groups = n_bad = 0
    for name in forecast.data_vars:
        samples = [d for d in sample_dims if d in mean[name].dims]
        if not per_gridpoint:
            samples += [d for d in ("latitude", "longitude") if d in mean[name].dims]
        groups = [d for d in mean[name].dims if d not in samples]
        m = mean[name].transpose(*groups, *samples)
        shape = [m.sizes[d] for d in groups]
        g, s = int(np.prod(shape, dtype=np.int64)), int(np.prod([m.sizes[d] for d in samples], dtype=np.int64))
        y = truth[name].transpose(*groups, *samples)
        v = var[name].transpose(*groups, *samples)
        if "latitude" in samples:
            w = latitude_weights(m["latitude"]).broadcast_like(m).transpose(*groups, *samples).values
        else:
            w = np.ones(m.shape)
        arrays = [np.asarray(a, np.float64).reshape(g, s) for a in (m.values, v.values, y.values, w)]
        coef, ok = fit_groups_newton(*arrays, iterations=iterations)
        n_bad += int((~ok).sum())
        n_groups += g
        out[name] = xr.DataArray(coef.reshape(*shape, 4), dims=(*groups, "coefficient"),
                                 coords={**{d: m[d] for d in groups}, "coefficient": list(COEFFICIENTS)},
                                 attrs={"units": forecast[name].attrs.get("units", "")})
    if n_bad:
        warnings.warn(f"EMOS: {n_bad} of {n_groups} fits did not converge in {iterations} Newton iterations",
                      stacklevel=2)
    params = xr.Dataset(out)
    params.attrs = {"method": "emos", "per_gridpoint": int(per_gridpoint), "solver": "newton",
                    "iterations": iterations, "groups": n_groups, "groups_not_converged": n_bad}
    return params


def apply_emos(params: xr.Dataset, forecast: xr.Dataset, member_dim: str = "member") -> tuple[xr.Dataset,
                                                                                               xr.Dataset]:
    """(μ, σ) Datasets of the EMOS predictive distribution for every init of ``forecast`` (units of the field).

    Lazy on a dask-backed ``forecast``. Coefficients with a ``time`` dim (rolling windows) are taken at each
    init's date (ValueError naming the dates they lack); the members form (coefficients ``a``, ``b_<member>``…,
    ``c``, ``d``) weights each member by its own ``b`` (ValueError when the member labels differ)."""
    mean, var = ensemble_moments(forecast, member_dim)
    mu, sigma = xr.Dataset(), xr.Dataset()
    for name in forecast.data_vars:
        if name not in params.data_vars:
            raise ValueError(f"EMOS coefficients have no variable {name!r} (fitted: {list(params.data_vars)})")
        p = params[name]
        if "time" in p.dims:
            p = coefficients_at(p, forecast["time"])
        labels = [str(c) for c in p["coefficient"].values]
        if any(c.startswith("b_") for c in labels):
            b = p.sel(coefficient=[c for c in labels if c.startswith("b_")])
            model_members = [c[2:] for c in b["coefficient"].values]
            have = [str(m) for m in forecast[member_dim].values]
            if model_members != have:
                raise ValueError(f"the forecast's members {have} differ from the members the EMOS model weights "
                                 f"{model_members} (non-exchangeable members must match by name and order)")
            b = b.rename(coefficient=member_dim).assign_coords({member_dim: forecast[member_dim].values})
            loc = p.sel(coefficient="a", drop=True) + (b * forecast[name]).sum(member_dim, skipna=False)
        else:
            loc = p.sel(coefficient="a", drop=True) + p.sel(coefficient="b", drop=True) * mean[name]
        mu[name] = loc.assign_attrs(forecast[name].attrs)
        sigma[name] = np.sqrt(p.sel(coefficient="c", drop=True) + p.sel(coefficient="d", drop=True) * var[name])
        dims = [d for d in forecast[name].dims if d != member_dim]
        mu[name], sigma[name] = mu[name].transpose(*dims), sigma[name].transpose(*dims)
    return mu, sigma


def coefficients_at(p: xr.DataArray, times: xr.DataArray) -> xr.DataArray:
    """Rolling-window coefficients ``p`` (dim ``time`` = forecast date) at every init of ``times``;
    ValueError naming the init dates that have no coefficients."""
    have = pd.DatetimeIndex(p["time"].values)
    want = pd.DatetimeIndex(times.values)
    lacking = want.difference(have)
    if len(lacking):
        raise ValueError(f"the rolling-window EMOS model has no coefficients for the forecast date(s) "
                         f"{[str(t) for t in lacking[:3]]}{' …' if len(lacking) > 3 else ''} (model dates "
                         f"{have.min()} .. {have.max()}); fit with --dates covering them")
    return p.sel(time=times.values).assign_coords(time=times.values)


# --- EMOS on blocks of samples: any mean predictors, sums reduced over blocks ----------------------
#
# μ = Xβ (X: K mean predictors per sample, column 0 the intercept: [1, ensemble mean] for the mean/spread
# form, [1, x₁ … x_M] for non-exchangeable members), σ² = c + d·v (v the ensemble variance). θ = (β, γ, δ),
# c = γ² + C_FLOOR, d = δ². The data of a group may be spread over many blocks (chunks of a dask array, or
# one in-memory block): every quantity the solver needs is a sum over samples, so a ``reduce`` callable sums a
# function's outputs over the blocks, and each Newton iteration is one pass (two when a step is shortened).

Block = dict[str, np.ndarray]
"""One block of samples in physical units: ``X`` (G, S, K) mean predictors (X[..., 0] = 1), ``v`` (G, S)
ensemble variance, ``y`` (G, S) truth, ``w`` (G, S) sample weights (0 = no sample)."""
Reduce = Callable[[Callable[[Block], dict[str, np.ndarray]]], dict[str, np.ndarray]]
"""Sums ``fn(block)`` over every block of the data (a dict of arrays, summed key by key)."""


def _valid(b: Block) -> np.ndarray:
    """(G, S) mask of usable samples: finite predictors, variance and truth, positive weight."""
    return np.isfinite(b["X"]).all(-1) & np.isfinite(b["v"]) & np.isfinite(b["y"]) & (b["w"] > 0)


def _standardised_block(b: Block, loc: np.ndarray, scale: np.ndarray, wsum: np.ndarray) -> Block:
    """``b`` in units of each group's truth (loc, scale (G,)), invalid samples zeroed, w / wsum (G,)."""
    ok = _valid(b)
    s = scale[:, None]
    x = (b["X"] - loc[:, None, None]) / s[..., None]
    x[..., 0] = 1.0
    return {"X": np.where(ok[..., None], x, 0.0), "v": np.where(ok, b["v"] / s**2, 0.0),
            "y": np.where(ok, (b["y"] - loc[:, None]) / s, 0.0), "w": np.where(ok, b["w"], 0.0) / wsum[:, None]}


def _moment_sums(b: Block) -> dict[str, np.ndarray]:
    """Σw, Σw·y, Σw·y² per group (G,) over the valid samples of a physical block."""
    ok = _valid(b)
    w = np.where(ok, b["w"], 0.0)
    y = np.where(ok, b["y"], 0.0)
    return {"w": w.sum(1), "wy": (w * y).sum(1), "wyy": (w * y * y).sum(1)}


def _start_sums(b: Block) -> dict[str, np.ndarray]:
    """Sums (standardised block) that give the closed-form start: weighted least squares of y on X, then the
    regression of the squared residuals on v (as :func:`_start`)."""
    x, v, y, w = b["X"], b["v"], b["y"], b["w"]
    wx = w[..., None] * x
    return {"xx": np.einsum("gsk,gsl->gkl", wx, x), "xy": np.einsum("gsk,gs->gk", wx, y),
            "yy": (w * y * y).sum(1), "v": (w * v).sum(1), "vv": (w * v * v).sum(1),
            "xxv": np.einsum("gsk,gsl->gkl", wx * v[..., None], x), "xyv": np.einsum("gsk,gs->gk", wx, y * v),
            "yyv": (w * y * y * v).sum(1)}


def _start_from_sums(s: dict[str, np.ndarray]) -> np.ndarray:
    """θ₀ (G, K + 2) from :func:`_start_sums` totals (weights summing to 1 per group)."""
    xx, k = s["xx"], s["xx"].shape[-1]
    ridge = 1e-10 * np.trace(xx, axis1=1, axis2=2)[:, None, None] * np.eye(k) + 1e-300 * np.eye(k)
    beta = np.linalg.solve(xx + ridge, s["xy"][..., None])[..., 0]
    r2 = s["yy"] - 2 * (beta * s["xy"]).sum(1) + np.einsum("gk,gkl,gl->g", beta, xx, beta)
    r2v = s["yyv"] - 2 * (beta * s["xyv"]).sum(1) + np.einsum("gk,gkl,gl->g", beta, s["xxv"], beta)
    vbar = s["v"]
    varv = s["vv"] - vbar**2
    covv = r2v - r2 * vbar
    d0 = np.where(varv > 1e-12, covv / np.maximum(varv, 1e-12), 0.0)
    d0 = np.minimum(np.maximum(d0, 0.0), 0.9 * r2 / np.maximum(vbar, 1e-12))
    c0 = np.maximum(r2 - d0 * vbar, 10 * C_FLOOR)
    return np.concatenate([beta, np.sqrt(c0 - C_FLOOR)[:, None], np.sqrt(np.maximum(d0, 1e-4))[:, None]], 1)


def _block_crps(theta: np.ndarray, b: Block) -> np.ndarray:
    """Σ w·CRPS (G,) of a standardised block at θ (G, K + 2)."""
    from smoeweather.metrics.probabilistic import crps_gaussian

    k = b["X"].shape[-1]
    mu = np.einsum("gsk,gk->gs", b["X"], theta[:, :k])
    sigma = np.sqrt(theta[:, k, None] ** 2 + C_FLOOR + theta[:, k + 1, None] ** 2 * b["v"])
    return (b["w"] * crps_gaussian(mu, sigma, b["y"])).sum(1)


def _block_derivatives(theta: np.ndarray, b: Block) -> dict[str, np.ndarray]:
    """Σ over a standardised block of the weighted CRPS (G,), its gradient (G, P) and Hessian (G, P, P) in
    θ = (β, γ, δ), P = K + 2 (per sample as in :func:`_crps_and_derivatives`)."""
    from scipy.special import ndtr

    x, v, y, w = b["X"], b["v"], b["y"], b["w"]
    k = x.shape[-1]
    gam, dlt = theta[:, k, None], theta[:, k + 1, None]
    mu = np.einsum("gsk,gk->gs", x, theta[:, :k])
    sigma = np.sqrt(gam**2 + C_FLOOR + dlt**2 * v)
    z = (y - mu) / sigma
    pdf = np.exp(-0.5 * z * z) / _SQRT_2PI
    cdf = ndtr(z)
    loss = (w * sigma * (z * (2.0 * cdf - 1.0) + 2.0 * pdf - _INV_SQRT_PI)).sum(1)
    inv2s = 0.5 / sigma
    l_s = w * (2.0 * pdf - _INV_SQRT_PI)
    h_mm = w * 2.0 * pdf / sigma
    h_ms = h_mm * z * inv2s
    h_ss = (h_ms * z - 2.0 * l_s * inv2s * inv2s) * inv2s
    g_m, g_s = w * (1.0 - 2.0 * cdf), l_s * inv2s
    p = k + 2
    grad = np.empty((x.shape[0], p))
    grad[:, :k] = np.einsum("gs,gsk->gk", g_m, x)
    grad[:, k], grad[:, k + 1] = g_s.sum(1), (g_s * v).sum(1)
    hess = np.empty((x.shape[0], p, p))
    hess[:, :k, :k] = np.einsum("gs,gsk,gsl->gkl", h_mm, x, x)
    hess[:, :k, k] = np.einsum("gs,gsk->gk", h_ms, x)
    hess[:, :k, k + 1] = np.einsum("gs,gsk->gk", h_ms * v, x)
    hess[:, k, :k], hess[:, k + 1, :k] = hess[:, :k, k], hess[:, :k, k + 1]
    hess[:, k, k], hess[:, k, k + 1] = h_ss.sum(1), (h_ss * v).sum(1)
    hess[:, k + 1, k], hess[:, k + 1, k + 1] = hess[:, k, k + 1], (h_ss * v * v).sum(1)
    return {"loss": loss, "grad": grad, "hess": hess}


def _chain(theta: np.ndarray, d: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(loss, gradient, Hessian) in θ = (β, γ, δ) from sums in (β, c, d): c = γ² + c₀, d = δ²."""
    k = theta.shape[1] - 2
    jac = np.ones_like(theta)
    jac[:, k:] = 2.0 * theta[:, k:]
    hess = d["hess"] * jac[:, :, None] * jac[:, None, :]
    hess[:, k, k] += 2.0 * d["grad"][:, k]
    hess[:, k + 1, k + 1] += 2.0 * d["grad"][:, k + 1]
    return d["loss"], d["grad"] * jac, hess


def _tn_terms(theta: torch.Tensor, b: dict[str, torch.Tensor]) -> torch.Tensor:
    """Σ w·CRPS (G,) of the normal truncated at ``lo`` (G, 1) (0 in physical units) on a standardised block."""
    from smoeweather.postprocess.distributions import crps_torch

    k = b["X"].shape[-1]
    mu = torch.einsum("gsk,gk->gs", b["X"], theta[:, :k])
    sigma = torch.sqrt(theta[:, k, None] ** 2 + C_FLOOR + theta[:, k + 1, None] ** 2 * b["v"])
    crps = crps_torch("truncnormal", mu - b["lo"], sigma, b["y"] - b["lo"])
    return (b["w"] * torch.where(b["w"] > 0, crps, torch.zeros_like(crps))).sum(1)


def _block_crps_tn(theta: np.ndarray, b: Block) -> np.ndarray:
    """Σ w·CRPS (G,) of the truncated normal on a standardised block (with ``lo``) at θ (G, K + 2)."""
    t = {k: torch.from_numpy(np.ascontiguousarray(a, np.float64)) for k, a in b.items()}
    with torch.no_grad():
        return _tn_terms(torch.from_numpy(theta), t).numpy()


def _block_derivatives_tn(theta: np.ndarray, b: Block) -> dict[str, np.ndarray]:
    """Σ over a standardised block of the truncated-normal CRPS (G,), its gradient (G, P) and Hessian (G, P, P)
    directly in θ = (β, γ, δ), by automatic differentiation (groups are independent: the Hessian of the summed
    loss is block diagonal, so one backward pass per parameter gives every group's row)."""
    t = {k: torch.from_numpy(np.ascontiguousarray(a, np.float64)) for k, a in b.items()}
    th = torch.from_numpy(np.array(theta, np.float64)).requires_grad_(True)
    loss = _tn_terms(th, t)
    (grad,) = torch.autograd.grad(loss.sum(), th, create_graph=True)
    rows = [torch.autograd.grad(grad[:, p].sum(), th, retain_graph=True)[0] for p in range(th.shape[1])]
    return {"loss": loss.detach().numpy(), "grad": grad.detach().numpy(),
            "hess": torch.stack(rows, 1).detach().numpy()}


def _no_chain(theta: np.ndarray, d: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return d["loss"], d["grad"], d["hess"]


def _std(b: Block, loc: np.ndarray, scale: np.ndarray, wsum: np.ndarray, tn: bool) -> Block:
    """:func:`_standardised_block`, with the truncation point 0 in each group's standardised units (``tn``)."""
    out = _standardised_block(b, loc, scale, wsum)
    if tn:
        out["lo"] = (-loc / scale)[:, None]
    return out


class _Pooled:
    """EMOS on blocks of samples as a :class:`.newton.Problem`: every quantity a sum over the blocks of
    ``reduce`` (one pass each call), in each group's standardised units (numpy; the truncated normal's
    derivatives by autograd). What ``reduce`` ships to the blocks captures arrays and module functions only
    (it may go to the processes of a dask cluster)."""

    def __init__(self, reduce: Reduce, tn: bool) -> None:
        self.reduce = reduce
        self.crps, self.grads, self.chain = (
            (_block_crps_tn, _block_derivatives_tn, _no_chain) if tn else (_block_crps, _block_derivatives, _chain))
        self.moments = mom = reduce(_moment_sums)
        wsum = np.maximum(mom["w"], 1e-300)
        self.loc = mom["wy"] / wsum
        scale = np.sqrt(np.maximum(mom["wyy"] / wsum - self.loc**2, 0.0))
        self.scale = np.where(scale > 0, scale, 1.0)
        self.std = partial(_std, loc=self.loc, scale=self.scale, wsum=wsum, tn=tn)

    def start(self) -> np.ndarray:
        std = self.std
        return _start_from_sums(self.reduce(lambda b: _start_sums(std(b))))

    def derivatives(self, theta: np.ndarray, rows: np.ndarray | None = None
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        std, grads = self.std, self.grads
        f, g, h = self.chain(theta, self.reduce(lambda b: grads(theta, std(b))))
        return (f, g, h) if rows is None else (f[rows], g[rows], h[rows])

    def trial(self, theta: np.ndarray, step: np.ndarray, ladder: np.ndarray
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        std, crps, grads = self.std, self.crps, self.grads

        def one(b: Block) -> dict[str, np.ndarray]:
            sb = std(b)
            out = {f"f{i}": crps(theta + a * step, sb) for i, a in enumerate(ladder)}
            out.update(grads(theta + step, sb))
            return out

        r = self.reduce(one)
        f, g, h = self.chain(theta + step, {k: r[k] for k in ("loss", "grad", "hess")})
        return np.stack([r[f"f{i}"] for i in range(len(ladder))], 1), f, g, h

    def losses(self, theta: np.ndarray, rows: np.ndarray) -> np.ndarray:
        std, crps = self.std, self.crps
        return self.reduce(lambda b: {"f": crps(theta, std(b))})["f"][rows]

    def step(self, grad: np.ndarray, hess: np.ndarray) -> np.ndarray:
        return saddle_free_step(grad, hess)

    def dot(self, grad: np.ndarray, step: np.ndarray) -> np.ndarray:
        return (grad * step).sum(1)

    def keep(self, rows: np.ndarray) -> None:
        raise NotImplementedError("pooled EMOS sums over every group in each pass: no compaction")


def fit_blocks(reduce: Reduce, iterations: int = 50, tol: float = 1e-12, distribution: str = "normal"
               ) -> tuple[np.ndarray, np.ndarray]:
    """EMOS coefficients (G, K + 2) = (a, b₁ … b_{K−1}, c, d) in physical units and convergence flags (G,)
    of groups whose samples are spread over blocks.

    ``reduce(fn)`` returns the sum over all blocks of ``fn(block)`` (a dict of arrays), ``block`` a physical
    :data:`Block`. Passes: truth moments (standardisation), start sums, then the one Newton solver
    (:func:`.newton.minimise`): one pass per iteration that evaluates the CRPS at the step lengths
    :data:`.newton.LADDER` and the derivatives at the full step (a second pass when a group takes a shorter
    step). A group stops when its Newton decrement falls below ``tol`` or no step length lowers its CRPS.

    ``distribution="truncnormal"``: the predictive normal truncated at 0 (physical units), minimum truncated-normal
    CRPS (:mod:`.distributions`); the same parameters and Newton iteration, derivatives by autograd.
    """
    from smoeweather.postprocess.distributions import check_distribution

    tn = check_distribution(distribution, "distribution") == "truncnormal"
    problem = _Pooled(reduce, tn)
    mom, loc, scale = problem.moments, problem.loc, problem.scale
    theta, ok = minimise(problem, problem.start(), mom["w"] > 0, iterations, tol, ladder=LADDER)
    k = theta.shape[1] - 2
    beta = theta[:, :k]
    a = loc + scale * beta[:, 0] - loc * beta[:, 1:].sum(1)
    coef = np.concatenate([a[:, None], beta[:, 1:], (scale**2 * (theta[:, k] ** 2 + C_FLOOR))[:, None],
                           (theta[:, k + 1] ** 2)[:, None]], 1)
    coef[mom["w"] <= 0] = np.nan  # a group without a single sample has no fit
    return coef, ok
