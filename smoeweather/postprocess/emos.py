"""EMOS (Gneiting et al. 2005): Gaussian predictive distribution from ensemble statistics, minimum-CRPS fit.

    μ = a + b · ensemble mean,   σ² = c + d · ensemble variance (ddof = 1),   c, d ≥ 0

fitted by minimising the mean closed-form Gaussian CRPS over the training init times (and, for a global
fit, over the grid with latitude weights). One coefficient set per variable, lead and level, and per grid
point with ``per_gridpoint=True``. Every fit is done in standardised units of its own truth (so one
tolerance suits Z500 and T850).

Solver (``solver="newton"``, the default): every group (variable × lead × level [× grid point]) is its own
4-parameter problem, solved by a batched damped Newton method on all groups at once:

- closed-form start: a, b by weighted least squares of the truth on the ensemble mean; c, d by regressing
  the squared residuals on the ensemble variance (clipped to c, d ≥ 0);
- c = γ² + c₀, d = δ² (c₀ = 10⁻⁶ of the truth's variance keeps σ > 0 when all members tie): the bound
  c, d = 0 is reachable, and a minimum on it has positive curvature in γ, δ, so Newton converges there too;
- the exact Hessian of the mean CRPS (per sample it is (2φ(z)/σ)·[[1, z], [z, z²]] in (μ, σ), plus the
  curvature of σ = √(c + d·v)) in a 4 × 4 eigendecomposition per group; negative eigenvalues are flipped
  (saddle-free Newton), so every step descends;
- a backtracking Armijo line search per group (each group its own step length), and converged groups leave
  the active set: the cost follows the groups still moving.

``solver="lbfgs"`` is the earlier implementation (one torch L-BFGS over the sum of all groups, shared line
search, c = softplus(γ), d = softplus(δ)); kept as the reference for tests and ``benchmarks/postprocess.py``.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch
import xarray as xr

from smoeweather.metrics.weights import latitude_weights
from smoeweather.training.losses import gaussian_crps

COEFFICIENTS = ("a", "b", "c", "d")
SOLVERS = ("newton", "lbfgs")
C_FLOOR = 1e-6  # floor of c in units of the truth's variance (σ ≥ 10⁻³ of the truth's standard deviation)
_BLOCK = 1 << 18  # group × sample elements per Newton block (2 MB per float64 temporary: cache-friendly)
_SQRT_2PI = math.sqrt(2.0 * math.pi)
_INV_SQRT_PI = 1.0 / math.sqrt(math.pi)
_INV_SQRT_2 = 1.0 / math.sqrt(2.0)


def ensemble_moments(forecast: xr.Dataset, member_dim: str = "member") -> tuple[xr.Dataset, xr.Dataset]:
    """(ensemble mean, unbiased ensemble variance) over ``member_dim``; units and units² of the field."""
    return forecast.mean(member_dim), forecast.var(member_dim, ddof=1)


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


def _fit_groups_lbfgs(m: np.ndarray, v: np.ndarray, y: np.ndarray, w: np.ndarray, iterations: int) -> np.ndarray:
    """Reference solver (the implementation before issue 17): one L-BFGS over the summed CRPS of all groups.

    Coefficients (G, 4) in physical units from (G, S) mean/variance/truth and (G, S) weights (0 = skip).
    """
    data, loc, scale = _standardise(m, v, y, w)
    t = {k: torch.from_numpy(a) for k, a in data.items()}
    g = m.shape[0]
    resid = (t["y"] - t["m"]) * t["w"]
    a = resid.sum(1).clone().requires_grad_(True)  # start: bias-corrected raw ensemble
    b = torch.ones(g, dtype=torch.float64, requires_grad=True)
    inv_softplus = float(np.log(np.expm1(0.1)))
    gamma = torch.full((g,), inv_softplus, dtype=torch.float64, requires_grad=True)
    delta = torch.full((g,), float(np.log(np.expm1(1.0))), dtype=torch.float64, requires_grad=True)
    params = [a, b, gamma, delta]
    opt = torch.optim.LBFGS(params, lr=1.0, max_iter=iterations, line_search_fn="strong_wolfe",
                            tolerance_grad=1e-9, tolerance_change=1e-12, history_size=20)

    def closure() -> torch.Tensor:
        opt.zero_grad()
        mu = a[:, None] + b[:, None] * t["m"]
        var = torch.nn.functional.softplus(gamma)[:, None] + torch.nn.functional.softplus(delta)[:, None] * t["v"]
        loss = (gaussian_crps(mu, torch.sqrt(var), t["y"]) * t["w"]).sum()
        loss.backward()
        return loss

    # these element-wise problems are small: one thread avoids oversubscription stalls on shared CPUs
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        opt.step(closure)
    finally:
        torch.set_num_threads(threads)
    with torch.no_grad():
        coef = np.stack([a.numpy(), b.numpy(), torch.nn.functional.softplus(gamma).numpy(),
                         torch.nn.functional.softplus(delta).numpy()], axis=1)
    return _to_physical(coef, loc, scale)


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


def _newton_block(data: dict[str, np.ndarray], iterations: int, tol: float) -> tuple[np.ndarray, np.ndarray]:
    """Standardised coefficients (G, 4) and convergence flags (G,) of one block of groups (see module doc).

    Each iteration evaluates CRPS, gradient and Hessian once, at the trial point θ + p; a group whose trial
    fails the Armijo test backtracks (halving its own step, CRPS only) before its derivatives are recomputed.
    Converged groups are dropped from the working arrays once a quarter of them is done.
    """
    t = {k: torch.from_numpy(np.ascontiguousarray(a)) for k, a in data.items()}
    theta = _start(t["m"], t["v"], t["y"], t["w"])
    n = theta.shape[0]
    converged = torch.zeros(n, dtype=torch.bool)
    idx = torch.arange(n)  # groups held in the working arrays
    work = dict(t, f=_features(t["m"], t["v"]))

    def sub(rows: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return work["m"][rows], work["v"][rows], work["y"][rows], work["w"][rows]

    th = theta.clone()
    f, grad, hess = _crps_and_derivatives(th, work["m"], work["v"], work["y"], work["w"], work["f"])
    live = torch.ones(n, dtype=torch.bool)  # working rows still iterating
    for _ in range(iterations):
        step = _newton_step(grad, hess)
        slope = (grad * step).sum(1)  # −(Newton decrement) < 0
        live &= -slope >= tol
        if not live.any():
            break
        if live.sum() < 0.75 * len(idx):  # compact the working arrays
            keep = torch.nonzero(live)[:, 0]
            theta[idx] = th
            converged[idx[~live]] = True
            idx, th, f, step, slope = idx[keep], th[keep], f[keep], step[keep], slope[keep]
            work = {k: a[keep] for k, a in work.items()}
            live = torch.ones(len(idx), dtype=torch.bool)
        trial = th + step * live[:, None]
        f_new, g_new, h_new = _crps_and_derivatives(trial, work["m"], work["v"], work["y"], work["w"], work["f"])
        bad = torch.nonzero(live & ~(f_new <= f + 1e-4 * slope))[:, 0]
        if len(bad):
            alpha = torch.full((len(bad),), 0.5, dtype=th.dtype)
            found = torch.zeros(len(bad), dtype=torch.bool)
            for _ls in range(40):
                todo = torch.nonzero(~found)[:, 0]
                if len(todo) == 0:
                    break
                rows = bad[todo]
                cand = th[rows] + alpha[todo, None] * step[rows]
                fc, _, _ = _crps_and_derivatives(cand, *sub(rows))
                ok = fc <= f[rows] + 1e-4 * alpha[todo] * slope[rows]
                trial[rows[ok]] = cand[ok]
                found[todo[ok]] = True
                alpha[todo[~ok]] *= 0.5
            live[bad[~found]] = False  # no step lowers the CRPS: at its minimum to working precision
            trial[bad[~found]] = th[bad[~found]]
            redo = bad[found]
            if len(redo):
                f_new[redo], g_new[redo], h_new[redo] = _crps_and_derivatives(trial[redo], *sub(redo),
                                                                               work["f"][redo])
        th, f, grad, hess = trial, f_new, g_new, h_new
    else:
        step = _newton_step(grad, hess)
        live &= -(grad * step).sum(1) >= tol
    theta[idx] = th
    converged[idx[~live]] = True
    theta_np = theta.numpy()
    coef = np.stack([theta_np[:, 0], theta_np[:, 1], theta_np[:, 2] ** 2 + C_FLOOR, theta_np[:, 3] ** 2], 1)
    return coef, converged.numpy()


def _fit_groups_newton(m: np.ndarray, v: np.ndarray, y: np.ndarray, w: np.ndarray, iterations: int = 50,
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
    solver: str = "newton",
) -> xr.Dataset:
    """EMOS coefficients: per variable a DataArray with dim ``coefficient`` (a, b, c, d) and the group dims
    (``prediction_timedelta``, [``level``], and ``latitude``/``longitude`` if ``per_gridpoint``).

    ``forecast`` (ensemble) and ``truth`` (at valid times, see :func:`~.stores.truth_at_valid_times`) share
    their non-member dims. Units: a, μ in the field's units; b, d dimensionless; c in units².
    ``iterations``: Newton iterations per group (default 50) or L-BFGS iterations (default 300).
    attrs: method, per_gridpoint, solver, iterations, groups, groups_not_converged.
    """
    if solver not in SOLVERS:
        raise ValueError(f"EMOS solver must be one of {SOLVERS}, got {solver!r}")
    iterations = iterations if iterations is not None else (50 if solver == "newton" else 300)
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
        if solver == "newton":
            coef, ok = _fit_groups_newton(*arrays, iterations=iterations)
            n_bad += int((~ok).sum())
        else:
            coef = _fit_groups_lbfgs(*arrays, iterations=iterations)
        n_groups += g
        out[name] = xr.DataArray(coef.reshape(*shape, 4), dims=(*groups, "coefficient"),
                                 coords={**{d: m[d] for d in groups}, "coefficient": list(COEFFICIENTS)},
                                 attrs={"units": forecast[name].attrs.get("units", "")})
    if n_bad:
        warnings.warn(f"EMOS: {n_bad} of {n_groups} fits did not converge in {iterations} Newton iterations",
                      stacklevel=2)
    params = xr.Dataset(out)
    params.attrs = {"method": "emos", "per_gridpoint": int(per_gridpoint), "solver": solver,
                    "iterations": iterations, "groups": n_groups, "groups_not_converged": n_bad}
    return params


def apply_emos(params: xr.Dataset, forecast: xr.Dataset, member_dim: str = "member") -> tuple[xr.Dataset,
                                                                                               xr.Dataset]:
    """(μ, σ) Datasets of the EMOS predictive distribution for every init of ``forecast`` (units of the field)."""
    mean, var = ensemble_moments(forecast, member_dim)
    mu, sigma = xr.Dataset(), xr.Dataset()
    for name in forecast.data_vars:
        if name not in params.data_vars:
            raise ValueError(f"EMOS coefficients have no variable {name!r} (fitted: {list(params.data_vars)})")
        p = params[name]
        mu[name] = (p.sel(coefficient="a", drop=True) + p.sel(coefficient="b", drop=True) * mean[name]).assign_attrs(
            forecast[name].attrs)
        sigma[name] = np.sqrt(p.sel(coefficient="c", drop=True) + p.sel(coefficient="d", drop=True) * var[name])
        dims = [d for d in forecast[name].dims if d != member_dim]
        mu[name], sigma[name] = mu[name].transpose(*dims), sigma[name].transpose(*dims)
    return mu, sigma
