"""EMoE (Qiu et al., 2023): split a trained dense FFN or conv block into experts, without new parameters.

A hidden layer h = act(z), z = pre-activation (FFN: z = W1·x + b1, one neuron per hidden unit; conv block:
z = BN(conv(x)), one neuron per hidden channel, routed per pixel) is read as a key–value memory whose keys
are the rows of W1 (conv: the flattened kernels with eval-mode BatchNorm folded in). The keys are
L2-normalised and clustered into N groups of exactly d/N neurons (balanced k-means); expert n is group n.
Gate (avg-k): expert score = x·mean(keys of the group) + mean(bias of the group) = the mean pre-activation
of its neurons, so the gate is recomputed from the current weights at every forward and has no
parameters of its own. The top-k experts' neurons are kept, the rest masked; the output layer (W2, b2)
is unchanged, which is the EMoE sum of the selected experts' outputs with b2 split among them. With all
N experts selected the layer computes exactly the dense layer.
"""

from __future__ import annotations

import numpy as np
import torch
from scipy.optimize import linear_sum_assignment
from torch import nn


def balanced_kmeans(keys: torch.Tensor, num_groups: int, iterations: int = 20, seed: int = 0) -> torch.Tensor:
    """Cluster (d, D) keys by cosine similarity into ``num_groups`` groups of exactly d/num_groups members.

    Lloyd iterations whose assignment step is the exact balanced assignment (Hungarian algorithm on the
    d × d cost of neuron vs. group slot, scipy) — hand-written because the size-constrained k-means
    package only adds a dependency for this one call. Returns (d,) int64 group ids.
    """
    d = keys.shape[0]
    if num_groups < 1 or d % num_groups:
        raise ValueError(f"{d} neurons cannot be split into {num_groups} equal groups")
    x = torch.nn.functional.normalize(keys.detach().double().reshape(d, -1), dim=1).cpu().numpy()
    rng = np.random.default_rng(seed)
    centroids = x[rng.choice(d, num_groups, replace=False)]
    size = d // num_groups
    groups = np.zeros(d, dtype=np.int64)
    for it in range(iterations):
        cost = -(x @ centroids.T)  # (d, N): negative cosine similarity
        _, slot = linear_sum_assignment(np.repeat(cost, size, axis=1))
        new = slot // size
        if it > 0 and np.array_equal(new, groups):
            break
        groups = new
        centroids = np.stack([x[groups == g].mean(axis=0) for g in range(num_groups)])
        centroids /= np.linalg.norm(centroids, axis=1, keepdims=True).clip(1e-12)
    return torch.from_numpy(groups)


class EMoEActivation(nn.Module):
    """Avg-k gated activation: replaces the activation ``act`` of a dense layer whose pre-activation z has
    the neurons along ``channel_dim`` (−1 for an FFN on (..., d), 1 for a conv block on (B, d, H, W)).

    Output: act(z) · mask, mask keeping the neurons of the top-k groups by mean pre-activation per token
    (FFN) or per pixel (conv). ``counts`` (N,) accumulates how often each expert was selected in
    training (for the selection-frequency plot); ``last_mask`` holds the last (..., N) expert selection.
    """

    def __init__(self, act: nn.Module, groups: torch.Tensor, k: int, channel_dim: int = -1) -> None:
        super().__init__()
        n = int(groups.max()) + 1
        if not 1 <= k <= n:
            raise ValueError(f"k must be in 1..{n} experts, got {k}")
        self.act, self.k, self.num_experts, self.channel_dim = act, k, n, channel_dim
        onehot = nn.functional.one_hot(groups.long(), n).float()
        self.register_buffer("groups", groups.long())
        self.register_buffer("average", onehot / onehot.sum(dim=0))  # (d, N): group means
        self.register_buffer("counts", torch.zeros(n), persistent=False)
        self.last_mask: torch.Tensor | None = None

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        zc = z.movedim(self.channel_dim, -1)  # (..., d)
        h = self.act(zc)
        if self.k < self.num_experts:
            scores = zc.detach() @ self.average.to(zc.dtype)  # (..., N) = x·G_n + mean bias
            top = scores.topk(self.k, dim=-1).indices
            chosen = torch.zeros_like(scores, dtype=torch.bool).scatter(-1, top, True)
            h = h * chosen[..., self.groups].to(h.dtype)
            self.last_mask = chosen
            if self.training:
                self.counts += chosen.reshape(-1, self.num_experts).sum(dim=0).to(self.counts)
        return h.movedim(-1, self.channel_dim)

    def extra_repr(self) -> str:
        return f"experts={self.num_experts}, k={self.k}, channel_dim={self.channel_dim}"


def fold_bn_keys(conv: nn.Conv2d, bn: nn.BatchNorm2d | None) -> torch.Tensor:
    """Keys of a conv block's hidden channels: (d, C·k·k) kernels scaled by the eval-mode BN gain."""
    w = conv.weight.detach().reshape(conv.out_channels, -1)
    if bn is None:
        return w
    gain = bn.weight.detach() / torch.sqrt(bn.running_var + bn.eps)
    return w * gain[:, None]


def emoe_mlp(mlp: nn.Module, num_experts: int, k: int, seed: int = 0) -> nn.Module:
    """Convert a trained FFN with ``fc1``, ``act``, ``fc2`` in place: ``act`` becomes an
    :class:`EMoEActivation` over groups of its hidden units. Returns the same module."""
    keys = mlp.fc1.weight.detach()  # (d, D): key j = row j of W1
    mlp.act = EMoEActivation(mlp.act, balanced_kmeans(keys, num_experts, seed=seed), k, channel_dim=-1)
    return mlp


def emoe_conv(block: nn.Sequential, num_experts: int, k: int, seed: int = 0) -> nn.Sequential:
    """Convert a conv block ``Sequential(conv, [bn], act, ...)`` in place: ``act`` gets per-pixel expert
    routing over groups of the conv's output channels (keys = BN-folded kernels). Returns the block."""
    conv = block[0]
    bn = block[1] if isinstance(block[1], nn.BatchNorm2d) else None
    a = 2 if bn is not None else 1
    groups = balanced_kmeans(fold_bn_keys(conv, bn), num_experts, seed=seed)
    block[a] = EMoEActivation(block[a], groups, k, channel_dim=1)
    return block


def emoe_layers(model: nn.Module) -> list[EMoEActivation]:
    """All EMoE gated activations of a model."""
    return [m for m in model.modules() if isinstance(m, EMoEActivation)]
