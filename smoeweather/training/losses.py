"""Differentiable training losses (torch), tested against the xarray / properscoring scores.

* :func:`latitude_weights`: w(φ) = cos φ / mean(cos φ) over the grid's latitudes (mean 1, WeatherBench).
* :func:`lat_weighted_mse`: mean of w·(ŷ − y)² over batch, latitude and longitude.
* :func:`gaussian_crps`: closed-form CRPS of N(μ, σ²) against an observation (Gneiting et al. 2005).
"""

from __future__ import annotations

import math

import numpy as np
import torch


def latitude_weights(latitude_deg: torch.Tensor | np.ndarray | list[float]) -> torch.Tensor:
    """cos φ normalised to mean 1 over the given latitudes: (H,) degrees north → (H,) float32
    (:func:`smoeweather.metrics.weights.latitude_weight_values`, the weights the scores use)."""
    from smoeweather.metrics.weights import latitude_weight_values

    return torch.as_tensor(latitude_weight_values(np.asarray(latitude_deg, dtype=np.float64))).float()


def lat_weighted_mse(
    pred: torch.Tensor, target: torch.Tensor, weights: torch.Tensor, per_channel: bool = False
) -> torch.Tensor:
    """Latitude-weighted mean squared error.

    ``pred``, ``target``: (B, C, H, W); ``weights``: (H,) with mean 1 (:func:`latitude_weights`).
    Returns a scalar (mean over B, C, H, W), or (C,) with ``per_channel`` (mean over B, H, W), in the
    squared units of the inputs.
    """
    if pred.shape != target.shape or pred.dim() != 4:
        raise ValueError(
            f"pred and target must both be (B, C, H, W); got {tuple(pred.shape)}, {tuple(target.shape)}"
        )
    if weights.shape != (pred.shape[2],):
        raise ValueError(f"weights must be (H,) = ({pred.shape[2]},), got {tuple(weights.shape)}")
    sq = (pred - target).square() * weights.to(pred.dtype).view(1, 1, -1, 1)
    return sq.mean(dim=(0, 2, 3)) if per_channel else sq.mean()


_SQRT_2 = math.sqrt(2.0)
_SQRT_2PI = math.sqrt(2.0 * math.pi)
_INV_SQRT_PI = 1.0 / math.sqrt(math.pi)


def normal_cdf(x: torch.Tensor) -> torch.Tensor:
    """Φ(x) = ½ erfc(−x/√2) (accurate in the lower tail, where 1 + erf(x/√2) cancels)."""
    return 0.5 * torch.erfc(-x / _SQRT_2)


def gaussian_crps(mu: torch.Tensor, sigma: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """CRPS of N(μ, σ²) for observation y, elementwise and differentiable: σ [z (2Φ(z) − 1) + 2 φ(z) − 1/√π],
    z = (y − μ)/σ.

    Inputs broadcast together (any shape, same units); σ > 0. Returns the CRPS in the units of y. The one
    torch Gaussian CRPS (losses, DRN, post-processing networks); its numpy/xarray twin is
    :func:`smoeweather.metrics.probabilistic.crps_gaussian`, held equal by the tests.
    """
    z = (y - mu) / sigma
    return sigma * (z * (2.0 * normal_cdf(z) - 1.0) + 2.0 * torch.exp(-0.5 * z * z) / _SQRT_2PI - _INV_SQRT_PI)
