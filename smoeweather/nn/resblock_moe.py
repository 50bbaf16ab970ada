"""ResBlock-MoE (Pavlitskaya et al., 2022, "Towards Inherently Interpretable Deep Neural Networks Using
Sparse MoE in CNNs"): residual blocks as experts of a per-image sparse MoE layer inside a CNN.

F(x) = relu(x + Σ_i g_i(x)·body_i(x)), body_i = conv3×3 → BN → ReLU → conv3×3 → BN at reduced width; with
Σ g_i = 1 this is the gated sum of full residual blocks relu-before. The gate is GAP-FC or Conv-GAP-FC;
softmax over N experts, keep the top-k and renormalise (the paper's figures show convex combinations).
Balancing (paper §III-B), chosen by ``constraint``:

* ``importance``: soft, w·CV(I)², I_i = Σ_x g_i(x) over the batch.
* ``kl``: soft, w·Σ_i (I_i/|X|)·ln(I_i·N/|X|) (KL of the mean gate to uniform).
* ``relative``: hard, expert i is zeroed for batch t when Σ_{t'<t} (I_i − Ī)/Ī > m_rel (Eq. 2).
* ``mean``: hard, zeroed when its running mean importance per sample exceeds the mean over experts
  by m_mean (Eq. 4; both sides per sample, our reading of the paper's Ī). Training only.
  At least k experts always stay on (the least-used ones).
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import nn
from torch.nn import functional as F

Constraint = Literal["none", "importance", "kl", "relative", "mean"]


def importance_cv2(gates: torch.Tensor) -> torch.Tensor:
    """CV(I)² with I = gates.sum(0) over a (B, N) gate matrix (population variance)."""
    imp = gates.sum(dim=0)
    return imp.var(unbiased=False) / imp.mean().square().clamp_min(1e-10)


def kl_to_uniform(gates: torch.Tensor) -> torch.Tensor:
    """Σ_i (I_i/|X|)·ln(I_i·N/|X|): KL(mean gate ‖ uniform) for a (B, N) gate matrix (0·ln 0 = 0)."""
    p = gates.mean(dim=0)
    return torch.where(p > 0, p * torch.log((p * gates.shape[1]).clamp_min(1e-30)), p.new_zeros(())).sum()


def _conv_bn(cin: int, cout: int) -> list[nn.Module]:
    return [nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout)]


class ResBlockMoE(nn.Module):
    """Sparse MoE of residual-block experts, one routing decision per image. (B, C, H, W) → (B, C, H, W).

    Args:
        channels: C. width: hidden width of each expert (default C/2, "reduced width").
        num_experts, k: N and top-k. gate: ``gap_fc`` or ``conv_gap_fc``.
        constraint: see module docstring; weight: w of the soft losses (paper 0.5, applied through
            ``aux_weight``); m_rel, m_mean: hard-constraint thresholds (paper 0.5, 0.3).

    After a forward: ``last_gates`` (B, N); ``aux_loss`` (training, soft constraints, already the
    unweighted loss) and ``aux_weight`` = w for the training module.
    """

    def __init__(self, channels: int, num_experts: int = 4, k: int = 2, width: int | None = None,
                 gate: str = "gap_fc", constraint: Constraint = "importance", weight: float = 0.5,
                 m_rel: float = 0.5, m_mean: float = 0.3) -> None:
        super().__init__()
        if not 1 <= k <= num_experts:
            raise ValueError(f"k must be in 1..{num_experts}, got {k}")
        if constraint not in ("none", "importance", "kl", "relative", "mean"):
            raise ValueError(f"constraint must be none, importance, kl, relative or mean, got {constraint!r}")
        width = width or max(channels // 2, 1)
        self.num_experts, self.k, self.constraint = num_experts, k, constraint
        self.aux_weight, self.m_rel, self.m_mean = float(weight), float(m_rel), float(m_mean)
        self.experts = nn.ModuleList(
            nn.Sequential(*_conv_bn(channels, width), nn.ReLU(inplace=True), *_conv_bn(width, channels))
            for _ in range(num_experts)
        )
        if gate == "gap_fc":
            self.gate = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(channels, num_experts))
        elif gate == "conv_gap_fc":
            self.gate = nn.Sequential(nn.Conv2d(channels, channels, 3, padding=1), nn.ReLU(inplace=True),
                                      nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(channels, num_experts))
        else:
            raise ValueError(f"gate must be gap_fc or conv_gap_fc, got {gate!r}")
        self.register_buffer("cum_relative", torch.zeros(num_experts))  # Σ_t I_rel (relative constraint)
        self.register_buffer("mean_importance", torch.zeros(num_experts))  # running mean of I_i/|X|
        self.register_buffer("steps", torch.zeros((), dtype=torch.long))
        self.aux_loss: torch.Tensor | None = None
        self.last_gates: torch.Tensor | None = None
        self.last_disabled: torch.Tensor | None = None

    def disabled(self) -> torch.Tensor:
        """(N,) bool: experts the hard constraint switches off for the next training batch."""
        if self.constraint == "relative":
            stat = self.cum_relative
            off = stat > self.m_rel
        elif self.constraint == "mean" and int(self.steps) > 0:
            stat = self.mean_importance
            off = stat - stat.mean() > self.m_mean
        else:
            return torch.zeros(self.num_experts, dtype=torch.bool, device=self.cum_relative.device)
        if int((~off).sum()) < self.k:  # keep the k least-used experts on
            off = torch.ones_like(off)
            off[stat.topk(self.k, largest=False).indices] = False
        return off

    def gates(self, x: torch.Tensor) -> torch.Tensor:
        """(B, N) sparse renormalised gate weights (hard constraints applied in training)."""
        logits = self.gate(x).float()
        if self.training and self.constraint in ("relative", "mean"):
            off = self.disabled()
            self.last_disabled = off
            logits = logits.masked_fill(off, float("-inf"))
        probs = logits.softmax(dim=-1)
        top_p, top_i = probs.topk(self.k, dim=-1)
        top_p = top_p / top_p.sum(dim=-1, keepdim=True)
        return torch.zeros_like(probs).scatter(1, top_i, top_p)

    @torch.no_grad()
    def _update_hard_statistics(self, g: torch.Tensor) -> None:
        imp = g.sum(dim=0)
        self.cum_relative += (imp - imp.mean()) / imp.mean().clamp_min(1e-10)
        self.steps += 1
        self.mean_importance += (imp / g.shape[0] - self.mean_importance) / self.steps.float()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        g = self.gates(x)
        self.last_gates = g.detach()
        out = torch.zeros_like(x)
        for i, expert in enumerate(self.experts):
            idx = (g[:, i] > 0).nonzero().squeeze(1)
            if idx.numel() == 0:  # keep the expert in the graph (DDP) with a zero contribution
                out = out + 0.0 * sum(p.sum() for p in expert.parameters())
                continue
            y = expert(x.index_select(0, idx)) * g.index_select(0, idx)[:, i, None, None, None].to(x.dtype)
            out = out.index_add(0, idx, y.to(out.dtype))
        self.aux_loss = None
        if self.training:
            if self.constraint == "importance":
                self.aux_loss = importance_cv2(g)
            elif self.constraint == "kl":
                self.aux_loss = kl_to_uniform(g)
            elif self.constraint in ("relative", "mean"):
                self._update_hard_statistics(g.detach())
        return F.relu(x + out)
