"""A small dense-prediction Vision Transformer and its sparse-MoE variant V-MoE (Riquelme et al., 2021).

Both map a field (B, C_in, H, W) → (B, C_out, H, W): p×p patches are embedded linearly, a learned
position embedding is added, ``depth`` pre-norm transformer blocks follow, and a linear head maps every
token back to its p×p patch of C_out channels. In V-MoE every block's MLP is a sparse mixture of MLP
experts with the V-MoE router g(x) = TOP_k(softmax(W·x + ε)), ε ~ N(0, (noise/|E|)²) in training.

Simplifications with respect to V-MoE: no expert capacity (no token is dropped), and all experts are
computed for all tokens and then combined with the sparse gate matrix (as SpatialMoE2d does), which
keeps every expert in the autograd graph; for the small models here this costs nothing that matters.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F


def cv_squared(x: torch.Tensor) -> torch.Tensor:
    """Squared coefficient of variation (std/mean)² of a vector, population std as in V-MoE."""
    return x.var(unbiased=False) / x.mean().square().clamp_min(1e-10)


class MLP(nn.Module):
    """Transformer MLP: Linear → GELU → Linear. (..., dim) → (..., dim)."""

    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(dim, hidden), nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


class MoEMLP(nn.Module):
    """Sparse mixture of MLP experts over tokens with the V-MoE noisy top-k router.

    (..., dim) → (..., dim). Each token's output is Σ_{e ∈ top-k} p_e · MLP_e(x) with p = softmax of the
    (noisy) router logits. After a training forward, ``aux_loss`` = ½ importance + ½ load loss
    (V-MoE App. A.2); ``last_gates`` (T, |E|) holds the sparse gate matrix (k non-zeros per token).
    """

    def __init__(self, dim: int, hidden: int, num_experts: int = 3, k: int = 1, noise: float = 1.0) -> None:
        super().__init__()
        if not 1 <= k <= num_experts:
            raise ValueError(f"k must be in 1..num_experts={num_experts}, got {k}")
        self.num_experts, self.k = num_experts, k
        self.noise_std = noise / num_experts
        self.router = nn.Linear(dim, num_experts, bias=False)
        self.experts = nn.ModuleList(MLP(dim, hidden) for _ in range(num_experts))
        self.aux_loss: torch.Tensor | None = None
        self.last_gates: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens = x.reshape(-1, x.shape[-1])  # (T, dim)
        logits = self.router(tokens)  # (T, |E|)
        noisy = logits
        if self.training and self.noise_std > 0:
            noisy = logits + torch.randn_like(logits) * self.noise_std
        probs = noisy.softmax(dim=-1)
        top_p, top_i = probs.topk(self.k, dim=-1)
        gates = torch.zeros_like(probs).scatter(1, top_i, top_p)  # (T, |E|), k non-zeros per row
        self.last_gates = gates.detach()
        expert_out = torch.stack([expert(tokens) for expert in self.experts], dim=1)  # (T, |E|, dim)
        out = torch.einsum("te,ted->td", gates, expert_out)
        self.aux_loss = self._aux_loss(logits, noisy, probs) if self.training else None
        return out.view_as(x)

    def _aux_loss(self, logits: torch.Tensor, noisy: torch.Tensor, probs: torch.Tensor) -> torch.Tensor:
        """½ CV²(importance) + ½ CV²(load); the load term needs routing noise and is 0 without it."""
        loss = 0.5 * cv_squared(probs.sum(dim=0))
        if self.noise_std > 0:
            threshold = noisy.detach().topk(self.k, dim=-1).values[:, -1:]  # k-th largest noisy logit
            normal = torch.distributions.Normal(0.0, self.noise_std)
            load = (1.0 - normal.cdf(threshold - logits)).sum(dim=0)  # P(expert still selected), summed
            loss = loss + 0.5 * cv_squared(load)
        return loss


class Attention(nn.Module):
    """Multi-head self-attention: (B, N, dim) → (B, N, dim)."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        if dim % heads:
            raise ValueError(f"dim={dim} must be divisible by heads={heads}")
        self.heads = heads
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, d = x.shape
        q, k, v = self.qkv(x).view(b, n, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        out = F.scaled_dot_product_attention(q, k, v)  # (B, heads, N, d/heads)
        return self.proj(out.transpose(1, 2).reshape(b, n, d))


class Block(nn.Module):
    """Pre-norm transformer block; ``mlp`` is a dense :class:`MLP` or a :class:`MoEMLP`. (B, N, dim)."""

    def __init__(self, dim: int, heads: int, mlp: nn.Module) -> None:
        super().__init__()
        self.norm1, self.attn = nn.LayerNorm(dim), Attention(dim, heads)
        self.norm2, self.mlp = nn.LayerNorm(dim), mlp

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class ViT(nn.Module):
    """Dense-prediction Vision Transformer: (B, C_in, H, W) → (B, C_out, H, W).

    Args:
        in_channels, out_channels: C_in, C_out.
        grid: (H, W); both must be divisible by ``patch`` (the position embedding is per patch).
        patch: p, patch side.
        dim, depth, heads, mlp_ratio: embedding size, number of blocks, attention heads, MLP width / dim.
        num_experts: 0 for dense MLPs (ViT); otherwise every block MLP is a :class:`MoEMLP` with this
            many experts, ``k`` selected per token and router noise std ``noise``/num_experts (V-MoE).
    """

    def __init__(self, in_channels: int, out_channels: int, grid: tuple[int, int], patch: int = 4,
                 dim: int = 128, depth: int = 1, heads: int = 4, mlp_ratio: int = 4, num_experts: int = 0,
                 k: int = 1, noise: float = 1.0) -> None:
        super().__init__()
        h, w = grid
        if h % patch or w % patch:
            raise ValueError(f"grid {grid} must be divisible by the patch size {patch}")
        self.grid, self.patch, self.out_channels = (h, w), patch, out_channels
        self.embed = nn.Linear(in_channels * patch * patch, dim)
        self.pos = nn.Parameter(torch.zeros(1, (h // patch) * (w // patch), dim))
        nn.init.trunc_normal_(self.pos, std=0.02)
        hidden = mlp_ratio * dim
        self.blocks = nn.ModuleList(
            Block(dim, heads, MoEMLP(dim, hidden, num_experts, k, noise) if num_experts else MLP(dim, hidden))
            for _ in range(depth)
        )
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, out_channels * patch * patch)
        self.aux_loss: torch.Tensor | None = None

    def patchify(self, x: torch.Tensor) -> torch.Tensor:
        """(B, C, H, W) → (B, N, C·p·p), patches in row-major order."""
        b, c, h, w = x.shape
        p = self.patch
        x = x.view(b, c, h // p, p, w // p, p).permute(0, 2, 4, 1, 3, 5)
        return x.reshape(b, (h // p) * (w // p), c * p * p)

    def unpatchify(self, tokens: torch.Tensor) -> torch.Tensor:
        """(B, N, C·p·p) → (B, C, H, W), the inverse of :meth:`patchify`."""
        b = tokens.shape[0]
        (h, w), p = self.grid, self.patch
        x = tokens.view(b, h // p, w // p, -1, p, p).permute(0, 3, 1, 4, 2, 5)
        return x.reshape(b, -1, h, w)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[-2:] != self.grid:
            raise ValueError(f"{type(self).__name__} is for a {self.grid} grid, got input {tuple(x.shape)}")
        tokens = self.embed(self.patchify(x)) + self.pos
        for block in self.blocks:
            tokens = block(tokens)
        out = self.unpatchify(self.head(self.norm(tokens)))
        moe_losses = [m.aux_loss for m in self.modules() if isinstance(m, MoEMLP) and m.aux_loss is not None]
        self.aux_loss = torch.stack(moe_losses).sum() if moe_losses else None
        return out


class VMoE(ViT):
    """ViT whose every block MLP is a sparse :class:`MoEMLP` (V-MoE); (B, C_in, H, W) → (B, C_out, H, W).

    After a training forward, ``aux_loss`` is the sum of the blocks' importance + load losses (a tensor;
    add ``0.01 * model.aux_loss`` to the task loss); it is None in eval mode.
    """

    def __init__(self, in_channels: int, out_channels: int, grid: tuple[int, int], patch: int = 4,
                 dim: int = 128, depth: int = 1, heads: int = 4, mlp_ratio: int = 4, num_experts: int = 3,
                 k: int = 1, noise: float = 1.0) -> None:
        if num_experts < 1:
            raise ValueError(f"V-MoE needs num_experts >= 1, got {num_experts}")
        super().__init__(in_channels, out_channels, grid, patch, dim, depth, heads, mlp_ratio,
                         num_experts=num_experts, k=k, noise=noise)
