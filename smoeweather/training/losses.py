"""Differentiable training losses (torch), tested against the xarray / properscoring scores.

* :func:`latitude_weights`: w(φ) = cos φ / mean(cos φ) over the grid's latitudes (mean 1, WeatherBench).
* :func:`lat_weighted_mse`: mean of w·(ŷ − y)² over batch, latitude and longitude.
"""

from __future__ import annotations

import numpy as np
import torch


def latitude_weights(latitude_deg: torch.Tensor | np.ndarray | list[float]) -> torch.Tensor:
    """cos φ normalised to mean 1 over the given latitudes: (H,) degrees north → (H,) float32
    (:func:`smoeweather.metrics.weights.latitude_weight_values`; the scores use the cell areas instead)."""
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
