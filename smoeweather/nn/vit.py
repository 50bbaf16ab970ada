"""Vision Transformers and V-MoE (Riquelme et al., 2021), for dense prediction and for classification.

* :class:`MoEMLP` is the V-MoE layer: MLP experts, router g(x) = TOP_k(softmax(W·x + ε)) with
  ε ~ N(0, (noise/E)²) in training only and no renormalisation of the k selected weights; expert capacity
  B_e = round(k·T·C/E) for T tokens in the routing group (the batch: T = N images × P patches); all top-1
  choices are allocated before any top-2 choice, in array order (vanilla) or by descending max gate
  (Batch Prioritized Routing, BPR); tokens past capacity get no expert output (only the residual).
  Importance + load losses (V-MoE App. A) are left in ``aux_loss``. With ``partitions`` = M > 1 the layer is
  the E³ layer (Allingham et al., 2022): the batch holds M tiled copies (member-major), member m routes
  only inside its partition of E/M experts with its own router slice, and the aux loss is the mean over
  partitions.
* Only routed tokens are computed: each expert runs on the tokens dispatched to it (possibly none, which
  still leaves the expert in the autograd graph with zero gradient, so DDP sees no unused parameter).
* :class:`ViT` / :class:`VMoE` map a field (B, C_in, H, W) → (B, C_out, H, W) (heat benchmark rows);
  :class:`ViTClassifier` is the class-token ViT / V-MoE / E³ image classifier returning member logits
  (M, B, classes) (M = 1 unless E³).
"""

from __future__ import annotations

import math
from typing import Literal

import torch
from torch import nn
from torch.nn import functional as F

Placement = Literal["all", "every_2", "last_n"]


def cv_squared(x: torch.Tensor) -> torch.Tensor:
    """Squared coefficient of variation (std/mean)² of a vector, population std as in V-MoE."""
    return x.var(unbiased=False) / x.mean().square().clamp_min(1e-10)


def expert_capacity(num_tokens: int, num_experts: int, k: int, capacity_ratio: float | None) -> int:
    """B_e = round(k·T·C/E) (at least 1); ``capacity_ratio`` None means unlimited (= T)."""
    if capacity_ratio is None:
        return num_tokens
    if capacity_ratio <= 0:
        raise ValueError(f"capacity_ratio must be > 0, got {capacity_ratio}")
    return max(1, int(math.floor(k * num_tokens * capacity_ratio / num_experts + 0.5)))


def route(probs: torch.Tensor, k: int, capacity: int, bpr: bool) -> torch.Tensor:
    """Dispatch mask of V-MoE routing with capacity.

    ``probs``: (T, E) router probabilities (T tokens of one routing group). Each token picks its top-k
    experts; allocation goes choice by choice (every token's 1st choice, then every token's 2nd, ...), and
    within a choice in token order (vanilla) or by descending max probability (BPR, ties by token order).
    An expert accepts its first ``capacity`` assignments. Returns a bool (T, E) mask of kept assignments.
    """
    t, e = probs.shape
    top_p, top_i = probs.topk(k, dim=-1)  # (T, k)
    order = torch.argsort(-top_p[:, 0], stable=True) if bpr else torch.arange(t, device=probs.device)
    onehot = F.one_hot(top_i[order].T.reshape(-1), e)  # (k·T, E), choice-major
    position = onehot.cumsum(dim=0) * onehot - 1  # rank of each assignment in its expert's queue
    kept = ((position < capacity) & (onehot > 0)).view(k, t, e).any(dim=0)  # (T, E) in priority order
    mask = torch.zeros_like(kept)
    mask[order] = kept
    return mask


def load_probability(logits: torch.Tensor, noisy: torch.Tensor, k: int, noise_std: float) -> torch.Tensor:
    """V-MoE load: P(expert i still among the top-k under fresh noise), (T, E) from clean and noisy logits:
    1 − Φ((threshold_k − logit_i)/σ), threshold_k = k-th largest noisy logit of the token."""
    threshold = noisy.detach().topk(k, dim=-1).values[:, -1:]
    return 1.0 - torch.distributions.Normal(0.0, noise_std).cdf(threshold - logits)


def vmoe_aux_loss(logits: torch.Tensor, noisy: torch.Tensor, k: int, noise_std: float) -> torch.Tensor:
    """½ CV²(importance) + ½ CV²(load) of one routing group (V-MoE App. A).

    importance_i = Σ_t softmax(logits)_ti (clean logits); load_i = Σ_t load_probability. With 2 experts
    (where the reference code finds the load loss ill-posed) or without noise the load term is the
    reference fallback E²·mean_i(fraction of tokens with top-1 = i · mean gate of i).
    """
    e = logits.shape[-1]
    probs = logits.softmax(dim=-1)
    loss = 0.5 * cv_squared(probs.sum(dim=0))
    if noise_std > 0 and e > 2:
        loss = loss + 0.5 * cv_squared(load_probability(logits, noisy, k, noise_std).sum(dim=0))
    else:
        top1 = F.one_hot(noisy.argmax(dim=-1), e).to(probs.dtype)
        loss = loss + 0.5 * e * e * (top1.mean(dim=0) * probs.mean(dim=0)).mean()
    return loss


class MLP(nn.Module):
    """Transformer MLP: Linear → GELU → Linear. (..., dim) → (..., dim)."""

    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(dim, hidden), nn.Linear(hidden, dim)
        self.act = nn.GELU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class MoEMLP(nn.Module):
    """V-MoE / E³ sparse mixture of MLP experts over tokens. (B, N, dim) → (B, N, dim).

    Args:
        dim, hidden: token width, expert MLP width.
        num_experts: E (all partitions together).
        k: experts per token (per member for E³).
        noise: router noise std = ``noise``/E (V-MoE: 1/E), training only.
        capacity_ratio: C of B_e = round(k·T·C/E) in training; ``None`` = no capacity limit.
        eval_capacity_ratio: C at evaluation (default: ``capacity_ratio``); set below 1 with BPR to
            process fewer tokens at inference.
        bpr: Batch Prioritized Routing (else vanilla array-order allocation).
        partitions: M (E³); the input batch must hold M member-major tiles.
        expert_dropout: dropout inside the experts (V-MoE small-data recipe uses 0.1–0.2).

    After a forward: ``last_gates`` (T, E) combine weights of the kept assignments, ``last_dropped``
    fraction of token assignments over capacity, ``aux_loss`` (training only) the V-MoE aux loss.
    """

    def __init__(self, dim: int, hidden: int, num_experts: int = 3, k: int = 1, noise: float = 1.0,
                 capacity_ratio: float | None = 1.05, eval_capacity_ratio: float | None = None, bpr: bool = True,
                 partitions: int = 1, expert_dropout: float = 0.0) -> None:
        super().__init__()
        if partitions < 1 or num_experts % partitions:
            raise ValueError(f"num_experts={num_experts} must be divisible by partitions={partitions}")
        per = num_experts // partitions
        if not 1 <= k <= per:
            raise ValueError(f"k must be in 1..{per} (experts per partition), got {k}")
        self.num_experts, self.k, self.partitions, self.bpr = num_experts, k, partitions, bpr
        self.noise_std = noise / num_experts
        self.capacity_ratio = capacity_ratio
        self.eval_capacity_ratio = capacity_ratio if eval_capacity_ratio is None else eval_capacity_ratio
        self.router = nn.Linear(dim, num_experts, bias=False)
        self.experts = nn.ModuleList(MLP(dim, hidden) for _ in range(num_experts))
        self.dropout = nn.Dropout(expert_dropout)
        self.aux_loss: torch.Tensor | None = None
        self.last_gates: torch.Tensor | None = None
        self._dropped: torch.Tensor | None = None

    @property
    def last_dropped(self) -> float:
        """Fraction of the last forward's k·T token assignments that were over capacity (0 before any)."""
        return 0.0 if self._dropped is None else float(self._dropped)  # read lazily: no GPU sync per forward

    def extra_repr(self) -> str:
        return (f"experts={self.num_experts}, k={self.k}, partitions={self.partitions}, bpr={self.bpr}, "
                f"C_train={self.capacity_ratio}, C_eval={self.eval_capacity_ratio}")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() != 3 or x.shape[0] % self.partitions:
            raise ValueError(f"MoEMLP expects (B, N, dim) with B divisible by partitions={self.partitions}, "
                             f"got {tuple(x.shape)}")
        m, per = self.partitions, self.num_experts // self.partitions
        tokens = x.reshape(-1, x.shape[-1])  # (T, dim), member-major
        logits = self.router(tokens)  # (T, E)
        noisy = logits + torch.randn_like(logits) * self.noise_std if self.training and self.noise_std > 0 else logits
        ratio = self.capacity_ratio if self.training else self.eval_capacity_ratio
        t_member = tokens.shape[0] // m
        capacity = expert_capacity(t_member, per, self.k, ratio)
        gates = torch.zeros_like(logits)
        aux = []
        for j in range(m):  # E³ member j: its own tokens and router slice only
            rows, cols = slice(j * t_member, (j + 1) * t_member), slice(j * per, (j + 1) * per)
            probs = noisy[rows, cols].softmax(dim=-1)
            mask = route(probs.detach(), self.k, capacity, self.bpr)
            gates[rows, cols] = probs * mask
            if self.training:
                aux.append(vmoe_aux_loss(logits[rows, cols], noisy[rows, cols], self.k, self.noise_std))
        dispatch = gates.detach() > 0
        self.last_gates = gates.detach()
        self._dropped = 1.0 - dispatch.sum() / (self.k * tokens.shape[0])
        out = torch.zeros_like(tokens)
        for e, expert in enumerate(self.experts):
            idx = dispatch[:, e].nonzero().squeeze(1)
            y = self.dropout(expert(tokens.index_select(0, idx)))  # may be empty: grad is then zero
            out = out.index_add(0, idx, (y * gates.index_select(0, idx)[:, e : e + 1]).to(out.dtype))
        self.aux_loss = torch.stack(aux).mean() if aux else None
        return out.view_as(x)


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


def moe_blocks(depth: int, placement: Placement, last_n: int | None = None) -> list[bool]:
    """Which of ``depth`` blocks get an MoE MLP: ``all``, ``every_2`` (0-indexed 1, 3, 5, ... as V-MoE) or
    ``last_n`` (the last ``last_n`` of the every-2 blocks)."""
    if placement == "all":
        return [True] * depth
    every2 = [i % 2 == 1 for i in range(depth)]
    if placement == "every_2":
        return every2
    if placement == "last_n":
        if not last_n or last_n < 1:
            raise ValueError(f"placement last_n needs last_n >= 1, got {last_n}")
        odd = [i for i in range(depth) if every2[i]][-last_n:]
        return [i in odd for i in range(depth)]
    raise ValueError(f"placement must be all, every_2 or last_n, got {placement!r}")


def moe_layers(model: nn.Module) -> list[MoEMLP]:
    """All V-MoE / E³ layers of a model."""
    return [m for m in model.modules() if isinstance(m, MoEMLP)]


def set_eval_capacity(model: nn.Module, capacity_ratio: float | None) -> None:
    """Set the inference capacity ratio of every MoE layer (e.g. 0.15 with BPR to skip 85 % of tokens)."""
    for layer in moe_layers(model):
        layer.eval_capacity_ratio = capacity_ratio


def _patchify(x: torch.Tensor, patch: int) -> torch.Tensor:
    """(B, C, H, W) → (B, N, C·p·p), patches in row-major order."""
    b, c, h, w = x.shape
    x = x.view(b, c, h // patch, patch, w // patch, patch).permute(0, 2, 4, 1, 3, 5)
    return x.reshape(b, (h // patch) * (w // patch), c * patch * patch)


class ViT(nn.Module):
    """Dense-prediction Vision Transformer: (B, C_in, H, W) → (B, C_out, H, W).

    Args:
        in_channels, out_channels: C_in, C_out.
        grid: (H, W); both must be divisible by ``patch`` (the position embedding is per patch).
        patch: p, patch side.
        dim, depth, heads, mlp_ratio: embedding size, number of blocks, attention heads, MLP width / dim.
        num_experts: 0 for dense MLPs (ViT); otherwise every block MLP is a :class:`MoEMLP` with this
            many experts, ``k`` per token, router noise std ``noise``/num_experts, capacity ratio
            ``capacity_ratio`` (None: no token dropped) and BPR ``bpr`` (V-MoE).
    """

    def __init__(self, in_channels: int, out_channels: int, grid: tuple[int, int], patch: int = 4,
                 dim: int = 128, depth: int = 1, heads: int = 4, mlp_ratio: int = 4, num_experts: int = 0,
                 k: int = 1, noise: float = 1.0, capacity_ratio: float | None = 1.05, bpr: bool = True) -> None:
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
            Block(dim, heads, MoEMLP(dim, hidden, num_experts, k, noise, capacity_ratio, bpr=bpr)
                  if num_experts else MLP(dim, hidden))
            for _ in range(depth)
        )
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, out_channels * patch * patch)

    def patchify(self, x: torch.Tensor) -> torch.Tensor:
        """(B, C, H, W) → (B, N, C·p·p), patches in row-major order."""
        return _patchify(x, self.patch)

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
        return self.unpatchify(self.head(self.norm(tokens)))


class VMoE(ViT):
    """ViT whose every block MLP is a sparse :class:`MoEMLP` (V-MoE); (B, C_in, H, W) → (B, C_out, H, W).

    After a training forward each MoE layer holds its importance + load loss in ``aux_loss`` (the training
    modules add 0.01 × their sum, see :func:`smoeweather.training.base.auxiliary_loss`).
    """

    def __init__(self, in_channels: int, out_channels: int, grid: tuple[int, int], patch: int = 4,
                 dim: int = 128, depth: int = 1, heads: int = 4, mlp_ratio: int = 4, num_experts: int = 3,
                 k: int = 1, noise: float = 1.0, capacity_ratio: float | None = 1.05, bpr: bool = True) -> None:
        if num_experts < 1:
            raise ValueError(f"V-MoE needs num_experts >= 1, got {num_experts}")
        super().__init__(in_channels, out_channels, grid, patch, dim, depth, heads, mlp_ratio,
                         num_experts=num_experts, k=k, noise=noise, capacity_ratio=capacity_ratio, bpr=bpr)


class ViTClassifier(nn.Module):
    """Class-token ViT image classifier, optionally V-MoE or E³: (B, C, H, W) → member logits (M, B, classes).

    Args:
        in_channels, num_classes, image_size: C, number of classes, (H, W) divisible by ``patch``.
        patch, dim, depth, heads, mlp_ratio: ViT shape (ViT-S/16: 16, 384, 12, 6, 4).
        num_experts: 0 = dense ViT; else E experts in the MoE blocks chosen by ``placement``/``last_n``.
        k, noise, capacity_ratio, eval_capacity_ratio, bpr, expert_dropout: see :class:`MoEMLP`.
        ensemble: M. M > 1 makes it E³: the batch is tiled M times before the first MoE block, every MoE
            layer has M partitions of E/M experts, and the head gives M member predictions.
        dropout: dropout after the patch embedding.
    """

    def __init__(self, in_channels: int, num_classes: int, image_size: tuple[int, int], patch: int = 4,
                 dim: int = 192, depth: int = 4, heads: int = 3, mlp_ratio: int = 4, num_experts: int = 0,
                 k: int = 1, placement: Placement = "every_2", last_n: int | None = None, noise: float = 1.0,
                 capacity_ratio: float | None = 1.05, eval_capacity_ratio: float | None = None, bpr: bool = True,
                 expert_dropout: float = 0.0, ensemble: int = 1, dropout: float = 0.0) -> None:
        super().__init__()
        h, w = image_size
        if h % patch or w % patch:
            raise ValueError(f"image_size {tuple(image_size)} must be divisible by the patch size {patch}")
        flags = moe_blocks(depth, placement, last_n) if num_experts else [False] * depth
        if ensemble > 1 and not any(flags):
            raise ValueError("an E³ ensemble (ensemble > 1) needs MoE blocks (num_experts > 0)")
        self.image_size, self.patch, self.ensemble, self.num_classes = (h, w), patch, ensemble, num_classes
        self.embed = nn.Linear(in_channels * patch * patch, dim)
        self.cls = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos = nn.Parameter(torch.zeros(1, (h // patch) * (w // patch) + 1, dim))
        nn.init.trunc_normal_(self.pos, std=0.02)
        self.drop = nn.Dropout(dropout)
        hidden = mlp_ratio * dim
        self.blocks = nn.ModuleList(
            Block(dim, heads, MoEMLP(dim, hidden, num_experts, k, noise, capacity_ratio, eval_capacity_ratio,
                                     bpr, partitions=ensemble, expert_dropout=expert_dropout)
                  if moe else MLP(dim, hidden))
            for moe in flags
        )
        self.first_moe = flags.index(True) if any(flags) else depth
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if tuple(x.shape[-2:]) != self.image_size:
            raise ValueError(f"ViTClassifier is for {self.image_size} images, got input {tuple(x.shape)}")
        b = x.shape[0]
        tokens = self.embed(_patchify(x, self.patch))
        tokens = torch.cat([self.cls.expand(b, -1, -1), tokens], dim=1) + self.pos
        tokens = self.drop(tokens)
        for i, block in enumerate(self.blocks):
            if i == self.first_moe and self.ensemble > 1:
                tokens = tokens.repeat(self.ensemble, 1, 1)  # E³ tiling, member-major
            tokens = block(tokens)
        logits = self.head(self.norm(tokens[:, 0]))  # (M·B, classes)
        return logits.view(-1, b, self.num_classes) if self.ensemble > 1 else logits.unsqueeze(0)
