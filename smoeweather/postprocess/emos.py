"""EMOS (Gneiting et al. 2005): Gaussian predictive distribution from ensemble statistics, minimum-CRPS fit.

    μ = a + b · ensemble mean,   σ² = c + d · ensemble variance (ddof = 1),   c, d ≥ 0

fitted by minimising the mean closed-form Gaussian CRPS over the training init times (and, for a global
fit, over the grid with latitude weights). One coefficient set per variable, lead and level, and per grid
point with ``per_gridpoint=True``. All independent fits are solved at once with torch L-BFGS (float64),
each in standardised units of its own truth (so one tolerance suits Z500 and T850); positivity by
c = softplus(γ), d = softplus(δ). Budget: a fixed number of L-BFGS iterations.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
import xarray as xr

from smoeweather.metrics.weights import latitude_weights
from smoeweather.training.losses import gaussian_crps

COEFFICIENTS = ("a", "b", "c", "d")


def ensemble_moments(forecast: xr.Dataset, member_dim: str = "member") -> tuple[xr.Dataset, xr.Dataset]:
    """(ensemble mean, unbiased ensemble variance) over ``member_dim``; units and units² of the field."""
    return forecast.mean(member_dim), forecast.var(member_dim, ddof=1)


def _fit_groups(m: np.ndarray, v: np.ndarray, y: np.ndarray, w: np.ndarray, iterations: int) -> np.ndarray:
    """Coefficients (G, 4) in physical units from (G, S) mean/variance/truth and (G, S) weights (0 = skip)."""
    valid = np.isfinite(m) & np.isfinite(v) & np.isfinite(y) & (w > 0)
    w = np.where(valid, w, 0.0)
    wsum = np.maximum(w.sum(1, keepdims=True), 1e-300)
    m, v, y = (np.where(valid, a, 0.0) for a in (m, v, y))
    loc = (w * y).sum(1, keepdims=True) / wsum
    scale = np.sqrt((w * (y - loc) ** 2).sum(1, keepdims=True) / wsum)
    scale = np.where(scale > 0, scale, 1.0)
    t = {k: torch.from_numpy(a) for k, a in
         (("m", (m - loc) / scale), ("v", v / scale**2), ("y", (y - loc) / scale), ("w", w / wsum))}
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
        a_, b_ = a.numpy(), b.numpy()
        c_ = torch.nn.functional.softplus(gamma).numpy()
        d_ = torch.nn.functional.softplus(delta).numpy()
    loc, scale = loc[:, 0], scale[:, 0]
    # back to physical units: μ = loc + scale·(a' + b'(mean − loc)/scale), σ² = scale²·c' + d'·var
    return np.stack([loc + scale * a_ - b_ * loc, b_, scale**2 * c_, d_], axis=1)


def fit_emos(
    forecast: xr.Dataset,
    truth: xr.Dataset,
    per_gridpoint: bool = False,
    iterations: int = 300,
    member_dim: str = "member",
    sample_dims: Sequence[str] = ("time",),
) -> xr.Dataset:
    """EMOS coefficients: per variable a DataArray with dim ``coefficient`` (a, b, c, d) and the group dims
    (``prediction_timedelta``, [``level``], and ``latitude``/``longitude`` if ``per_gridpoint``).

    ``forecast`` (ensemble) and ``truth`` (at valid times, see :func:`~.stores.truth_at_valid_times`) share
    their non-member dims. Units: a, μ in the field's units; b, d dimensionless; c in units².
    """
    mean, var = ensemble_moments(forecast, member_dim)
    out = {}
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
        coef = _fit_groups(*(np.asarray(a, np.float64).reshape(g, s) for a in (m.values, v.values, y.values, w)),
                           iterations=iterations)
        out[name] = xr.DataArray(coef.reshape(*shape, 4), dims=(*groups, "coefficient"),
                                 coords={**{d: m[d] for d in groups}, "coefficient": list(COEFFICIENTS)},
                                 attrs={"units": forecast[name].attrs.get("units", "")})
    params = xr.Dataset(out)
    params.attrs = {"method": "emos", "per_gridpoint": int(per_gridpoint), "lbfgs_iterations": iterations}
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
