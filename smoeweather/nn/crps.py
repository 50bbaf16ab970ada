"""The closed-form CRPS of the normal distribution in torch (elementwise, differentiable): the one torch home
of the Gaussian CRPS, for training losses, the DRN and the post-processing networks. Its numpy/xarray twin is
:func:`smoeweather.metrics.probabilistic.crps_gaussian`; the tests hold them equal.
"""

from __future__ import annotations

import math

import torch

_SQRT_2 = math.sqrt(2.0)
_SQRT_2PI = math.sqrt(2.0 * math.pi)
_INV_SQRT_PI = 1.0 / math.sqrt(math.pi)


def normal_cdf(x: torch.Tensor) -> torch.Tensor:
    """Φ(x) = ½ erfc(−x/√2) (accurate in the lower tail, where 1 + erf(x/√2) cancels)."""
    return 0.5 * torch.erfc(-x / _SQRT_2)


def gaussian_crps(mu: torch.Tensor, sigma: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """CRPS of N(μ, σ²) for observation y, elementwise and differentiable: σ [z (2Φ(z) − 1) + 2 φ(z) − 1/√π],
    z = (y − μ)/σ.

    Inputs broadcast together (any shape, same units); σ > 0. Returns the CRPS in the units of y.
    """
    z = (y - mu) / sigma
    return sigma * (z * (2.0 * normal_cdf(z) - 1.0) + 2.0 * torch.exp(-0.5 * z * z) / _SQRT_2PI - _INV_SQRT_PI)
