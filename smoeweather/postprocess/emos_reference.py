"""An independent EMOS reference solver: one torch L-BFGS over the summed CRPS of all groups, with a shared line
search and c = softplus(γ), d = softplus(δ). The product fits with the batched Newton solver of
:mod:`smoeweather.postprocess.emos`; this one checks that it finds the same minimum (the tests) and is the
baseline its speed is measured against (``python -m benchmarks.postprocess``)."""

from __future__ import annotations

import numpy as np
import torch

from smoeweather.nn.crps import gaussian_crps
from smoeweather.postprocess.emos import _standardise, _to_physical


def fit_groups_lbfgs(m: np.ndarray, v: np.ndarray, y: np.ndarray, w: np.ndarray, iterations: int) -> np.ndarray:
    """Reference solver: one L-BFGS over the summed CRPS of all groups.

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
