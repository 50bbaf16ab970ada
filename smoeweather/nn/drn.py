"""The distributional regression network of post-processing (Rasp & Lerch 2018) as an ``nn.Module``: B
independent one-hidden-layer networks evaluated at once with batched matrix products (one per seed, lead, level
and rolling date), a location embedding each; used by :mod:`smoeweather.postprocess.drn`."""

from __future__ import annotations

import torch
from torch import nn

PARAMETERS = ("w1", "b1", "w2", "b2", "emb")
"""w1 (B, F+E, H), b1 (B, H), w2 (B, H, 2), b2 (B, 2), emb (B, P, E)."""


def stacked_forward(p: dict[str, torch.Tensor], x: torch.Tensor, loc: torch.Tensor, sigma_floor: float
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """(μ, σ) (B, N) standardised, of standardised features x (B, N, F) at location indices loc (B, N):
    μ = x₀ + out₀ (the ensemble mean plus a correction), σ = softplus(out₁) + ``sigma_floor``."""
    e = torch.gather(p["emb"], 1, loc[..., None].expand(-1, -1, p["emb"].shape[-1]))
    h = torch.relu(torch.baddbmm(p["b1"][:, None], torch.cat([x, e], -1), p["w1"]))
    out = torch.baddbmm(p["b2"][:, None], h, p["w2"])
    return x[..., 0] + out[..., 0], torch.nn.functional.softplus(out[..., 1]) + sigma_floor


class StackedDRN(nn.Module):
    """B independent DRNs (:data:`PARAMETERS`, :func:`stacked_forward`) as one module: train with any torch
    optimiser over ``parameters()``; :meth:`weights` gives the detached tensors the model file stores."""

    def __init__(self, params: dict[str, torch.Tensor], sigma_floor: float) -> None:
        super().__init__()
        for k in PARAMETERS:
            self.register_parameter(k, nn.Parameter(params[k].clone()))
        self.sigma_floor = sigma_floor

    def forward(self, x: torch.Tensor, loc: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return stacked_forward(dict(self.named_parameters()), x, loc, self.sigma_floor)

    def weights(self) -> dict[str, torch.Tensor]:
        return {k: v.detach() for k, v in self.named_parameters()}


__all__ = ["PARAMETERS", "StackedDRN", "stacked_forward"]
