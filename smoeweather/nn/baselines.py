"""Baseline layers for the location-dependence benchmarks (paper §3.1, Fig. 3).

``CoordConv2d`` and ``LocallyConnected2d`` live in :mod:`smoeweather.nn.gates`; this module adds
CondConv (Yang et al., 2019), the low-rank locally connected layer LRLCN (Elsayed et al., 2020) and a
fully connected layer over the whole grid. All layers map (B, C_in, H, W) → (B, C_out, H, W).
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F


class CondConv2d(nn.Module):
    """Conditionally parameterised convolution (Yang et al., 2019).

    Per sample, routing weights r = sigmoid(FC(global-avg-pool(x))) ∈ (0, 1)^K mix K expert kernels into
    one kernel Σ_k r_k W_k (and bias Σ_k r_k b_k), applied to that sample with a grouped convolution.
    'Same' zero padding. Input (B, C_in, H, W) → output (B, C_out, H, W).
    """

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int = 3, num_experts: int = 3,
                 bias: bool = True) -> None:
        super().__init__()
        self.in_channels, self.out_channels, self.kernel_size = in_channels, out_channels, kernel_size
        self.num_experts = num_experts
        shape = (num_experts, out_channels, in_channels, kernel_size, kernel_size)
        self.weight = nn.Parameter(torch.empty(shape))
        self.bias = nn.Parameter(torch.empty(num_experts, out_channels)) if bias else None
        self.routing = nn.Linear(in_channels, num_experts)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Every expert initialised like an ``nn.Conv2d``."""
        bound = 1.0 / math.sqrt(self.in_channels * self.kernel_size**2)
        for k in range(self.num_experts):
            nn.init.kaiming_uniform_(self.weight[k], a=math.sqrt(5))
        if self.bias is not None:
            nn.init.uniform_(self.bias, -bound, bound)

    def routing_weights(self, x: torch.Tensor) -> torch.Tensor:
        """(B, C_in, H, W) → (B, K) routing weights in (0, 1)."""
        return torch.sigmoid(self.routing(x.mean(dim=(2, 3))))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, c, h, w = x.shape
        r = self.routing_weights(x)  # (B, K)
        kernel = torch.einsum("bk,koixy->boixy", r, self.weight).reshape(b * self.out_channels, c,
                                                                         self.kernel_size, self.kernel_size)
        y = F.conv2d(x.reshape(1, b * c, h, w), kernel, padding=self.kernel_size // 2, groups=b)
        y = y.view(b, self.out_channels, h, w)
        if self.bias is not None:
            y = y + (r @ self.bias).view(b, self.out_channels, 1, 1)
        return y


class LowRankLocallyConnected2d(nn.Module):
    """Low-rank locally connected layer, LRLCN (Elsayed et al., 2020).

    R basis filter banks W_r (k×k, shared over space) are combined per location with weights
    w(x)_{r,h,w} = softmax_r(L_{r,h,w} + g(x)_{r,h,w}): L is a learned location-dependent logit tensor
    (R, H, W) and g a k×k convolution C_in → R of the input (the input-dependent combiner).
    ``input_dependent=False`` drops g (LRLCN-ND). 'Same' zero padding.
    Input (B, C_in, H, W) → output (B, C_out, H, W).
    """

    def __init__(self, in_channels: int, out_channels: int, height: int, width: int, kernel_size: int = 3,
                 rank: int = 3, input_dependent: bool = True, bias: bool = True) -> None:
        super().__init__()
        self.out_channels, self.rank, self.height, self.width = out_channels, rank, height, width
        pad = kernel_size // 2
        self.basis = nn.Conv2d(in_channels, rank * out_channels, kernel_size, padding=pad, bias=False)
        self.location_logits = nn.Parameter(torch.zeros(rank, height, width))
        self.combiner = nn.Conv2d(in_channels, rank, kernel_size, padding=pad) if input_dependent else None
        self.bias = nn.Parameter(torch.zeros(out_channels)) if bias else None

    def combining_weights(self, x: torch.Tensor) -> torch.Tensor:
        """Softmax-normalised combining weights: (1, R, H, W) for LRLCN-ND, else (B, R, H, W)."""
        if x.shape[-2:] != (self.height, self.width):
            raise ValueError(f"LRLCN is for a {self.height}x{self.width} grid, got input {tuple(x.shape)}")
        logits = self.location_logits.unsqueeze(0)
        if self.combiner is not None:
            logits = logits + self.combiner(x)
        return logits.softmax(dim=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, _, h, w = x.shape
        basis = self.basis(x).view(b, self.rank, self.out_channels, h, w)
        y = (basis * self.combining_weights(x).unsqueeze(2)).sum(dim=1)
        return y if self.bias is None else y + self.bias.view(1, -1, 1, 1)


class FullyConnected2d(nn.Module):
    """One Linear layer over the whole grid: (B, C_in, H, W) → flatten → (B, C_out, H, W)."""

    def __init__(self, in_channels: int, out_channels: int, height: int, width: int,
                 bias: bool = True) -> None:
        super().__init__()
        self.shape = (out_channels, height, width)
        self.fc = nn.Linear(in_channels * height * width, out_channels * height * width, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x.flatten(1)).view(x.shape[0], *self.shape)
