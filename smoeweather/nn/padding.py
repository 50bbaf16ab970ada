"""Padding for fields on a latitude × longitude grid."""

from __future__ import annotations

import torch
from torch.nn import functional as F


def pad_periodic_lon(x: torch.Tensor, pad: int) -> torch.Tensor:
    """Pad (B, C, H=lat, W=lon) by ``pad`` cells: circular in longitude, zeros in latitude."""
    if pad == 0:
        return x
    x = F.pad(x, (pad, pad, 0, 0), mode="circular")
    return F.pad(x, (0, 0, pad, pad))


class PeriodicLonConv2d(torch.nn.Conv2d):
    """Conv2d whose 'same' padding is periodic in longitude (last dim) and zero in latitude."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, **kwargs) -> None:
        # latitude: the convolution's own zero padding; longitude: one circular copy in forward
        super().__init__(in_channels, out_channels, kernel_size, padding=(kernel_size // 2, 0), **kwargs)
        self.pad = kernel_size // 2

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.pad:
            x = F.pad(x, (self.pad, self.pad, 0, 0), mode="circular")
        return super().forward(x)
