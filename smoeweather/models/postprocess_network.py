"""The post-processing network: ensemble statistics (+ static maps) in, Gaussian (μ, σ) per target out."""

from __future__ import annotations

import torch
from torch import nn

from smoeweather.models.unet import gaussian_heads


class EnsemblePostprocessor(nn.Module):
    """Normalised units in and out: ensemble statistics (+ static maps) → Gaussian forecasts of T targets.

    ``forward(x, ens_mean, ens_std)``: ``x`` (B, C, H, W) from
    :class:`~smoeweather.data.ensemble_dataset.EnsembleDataset`; ``ens_mean``, ``ens_std`` (B, T, H, W). The static
    channels (S, H, W) are a buffer concatenated to ``x`` (so they travel in the checkpoint and need not exist in
    a later forecast file). Returns (μ, σ), each (B, T, H, W), in the normalised units of the targets
    (:func:`~smoeweather.models.unet.gaussian_heads`).
    """

    def __init__(self, net: nn.Module, static: torch.Tensor, num_targets: int) -> None:
        super().__init__()
        self.net = net
        self.num_targets = int(num_targets)
        self.register_buffer("static", torch.as_tensor(static, dtype=torch.float32))

    def forward(self, x: torch.Tensor, ens_mean: torch.Tensor, ens_std: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor]:
        if self.static.shape[0]:
            x = torch.cat([x, self.static.expand(x.shape[0], -1, -1, -1).to(x.dtype)], 1)
        return gaussian_heads(self.net(x), ens_mean, ens_std)
