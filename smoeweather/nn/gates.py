"""Gating layers for the Spatial Mixture-of-Experts (paper §2.1, Table 2).

Every gate maps an input ``x`` of shape (B, C, H, W) to routing scores of shape (G, |E|, H, W), where
G = 1 for input-independent gates (tensor routing: one routing decision shared by the whole batch) and
G = B for input-dependent gates (the ablation gates).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from torch import nn
from torch.nn import functional as F


def tensor_gate_bound(num_experts: int, num_selected: int, out_per_expert: int = 1) -> float:
    """Half-width b of the U(-b, b) init of the routing tensor: sqrt(3|E| / (E·F)) (paper §2.1)."""
    return math.sqrt(3.0 * num_experts / (num_selected * out_per_expert))


GateInit = Literal["uniform", "coherent"]


@dataclass
class Selection:
    """One top-k selection of a routing tensor and what the layers derive from it.

    ``idx``: (1, k, H, W) selected experts in descending score order out of ``num_experts``; :attr:`flat`: their
    positions in the expert block of ``out_per_expert`` channels each, laid out channels-last or not (see
    :meth:`TensorRoutingGate.top_indices`), computed on first use. Two memos let the layers that share a gate
    compute derived tensors once instead of once per layer:

    * ``derived`` (:meth:`memo`): tensors that depend on the selection only (the experts used anywhere, a
      renumbered flat index). They survive a weight update that leaves the selection as it was.
    * ``value_derived`` (:meth:`memo` with ``values=True``): tensors of the gate's values (the RC loss's
      sigmoid and softplus of the scores), valid for one set of weights.

    ``scores``: the gate's weight (|E|, H, W) the selection was made for, a snapshot that is never modified (a
    logged value can be computed from it after the optimizer has moved the weight), or None.
    """

    idx: torch.Tensor
    num_experts: int
    out_per_expert: int = 1
    channels_last: bool = False
    derived: dict[Any, Any] = field(default_factory=dict)
    value_derived: dict[Any, Any] = field(default_factory=dict)
    scores: torch.Tensor | None = None

    def memo(self, key: Any, make: Callable[[], Any], values: bool = False) -> Any:
        """``derived[key]`` (``values``: ``value_derived[key]``), computed by ``make()`` on first use (never
        stored under ``torch.inference_mode``: an inference tensor cannot be saved for a later training step's
        backward)."""
        store = self.value_derived if values else self.derived
        if key not in store:
            if torch.is_inference_mode_enabled():
                return make()
            store[key] = make()
        return store[key]

    @property
    def flat(self) -> torch.Tensor:
        """(k·F·H·W,) gather positions of the selected slots in the expert block (:func:`flat_slot_index`);
        memoised, and not computed at all by a layer that convolves only the used experts (it gathers from
        their block with its own index)."""
        return self.memo(("flat",), lambda: flat_slot_index(self.idx[0], self.num_experts, self.out_per_expert,
                                                            self.channels_last))

    def for_new_values(self, scores: torch.Tensor | None) -> Selection:
        """The same selection for updated gate values ``scores``: the selection memo is kept, the value memo
        starts empty."""
        return Selection(self.idx, self.num_experts, self.out_per_expert, self.channels_last, self.derived,
                         scores=scores)


# |w − s| of float32 weights is rounded to nearest (≤ 2^-24 relative below the exact move) and the drift is summed
# in float64: inflating the summed drift by 2^-20 and deflating the float64 gaps by 2^-40 keeps the bound safe
_DRIFT_MARGIN, _GAP_MARGIN = 1.0 + 2.0 ** -20, 1.0 - 2.0 ** -40


class IncrementalTopK:
    """The sorted top-k along dim 0 of a (|E|, H, W) weight, kept equal to ``weight.topk(k, dim=0).indices``
    while the weight moves, re-ranking only the locations whose ranking a move may have changed.

    Per location it keeps ``gap``, the smallest difference between consecutive values of the ranking when it
    was taken (the k selected ones in order and then the largest unselected one), and ``drift``, the summed
    largest move of any expert's value there since (:meth:`TensorRoutingGate._follow_update`). No value has
    moved by more than ``drift``, so while 2·drift < gap no two of them can have swapped or tied: the
    selection and its order are those of a full ``topk``. Elsewhere (and where a gap is 0, a tie, or the values
    are not finite) the location is ranked again by ``topk`` on its column alone, which ranks every column on
    its own, so it gives the bits of the full call, ties included (tested). Routing work per update: one pass
    over |E|·H·W for the move and a ``topk`` of the columns near a swap, instead of a ``topk`` of all H·W.
    """

    def __init__(self, weight: torch.Tensor, k: int) -> None:
        self.k = k
        columns = weight.reshape(weight.shape[0], -1)
        self.idx, self.gap = self._rank(columns)
        self.idx = self.idx.view(k, *weight.shape[1:])
        self.drift = torch.zeros_like(self.gap)

    def _rank(self, columns: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Top-k indices (k, n) and ranking gaps (n,) float64 of the (|E|, n) ``columns``."""
        values, idx = columns.topk(self.k, dim=0, sorted=True)
        ranked = values.double()
        if self.k < columns.shape[0]:  # the largest unselected value closes the ranking
            rest = columns.scatter(0, idx, float("-inf")).amax(0, keepdim=True)
            ranked = torch.cat([ranked, rest.double()])
        if ranked.shape[0] < 2:
            return idx, torch.full(ranked.shape[1:], math.inf, dtype=torch.float64)
        return idx, (ranked[:-1] - ranked[1:]).amin(0).mul_(_GAP_MARGIN)

    def rerank_stale(self, weight: torch.Tensor) -> bool:
        """Re-rank the locations the drift may have re-ordered; True if any selected index changed (then
        :attr:`idx` is a new tensor, else the same one)."""
        stale = ~(self.drift * (2.0 * _DRIFT_MARGIN) < self.gap)  # (NaN: stale)
        if not bool(stale.any()):
            return False
        where = stale.nonzero().view(-1)
        idx, gap = self._rank(weight.reshape(weight.shape[0], -1).index_select(1, where))
        self.gap.index_copy_(0, where, gap)
        self.drift.index_fill_(0, where, 0.0)
        flat = self.idx.view(self.k, -1)
        if torch.equal(flat.index_select(1, where), idx):
            return False
        flat = flat.clone()
        flat.index_copy_(1, where, idx)
        self.idx = flat.view_as(self.idx)
        return True


class TensorRoutingGate(nn.Module):
    """Learnable routing tensor D ∈ R^{|E|×H×W}; input-independent (paper §2.1).

    Share one instance between several :class:`SpatialMoE2d` layers of equal (|E|, H, W) to share the
    routing. ``frozen=True`` keeps D fixed (the "random fixed gate" ablation).

    ``init``: ``uniform`` (paper §2.1): D ~ U(−b, b) drawn independently per expert AND location.
    ``coherent``: one U(−b, b) draw per expert, the same at every location, so the experts' rank order is
    the same everywhere (and, with a categorical prior, the same within every category). This matters
    because an SMoE's output plane j is the rank-j expert of its location: with ``uniform`` the rank order
    is an independent random permutation at every grid point, so plane j of neighbouring points comes
    from different experts and the next layer's 3×3 filters and BatchNorm see spatially scrambled
    channels (see docs/smoe-weather-findings.md, Finding 4).
    """

    def __init__(
        self,
        num_experts: int,
        height: int,
        width: int,
        num_selected: int = 1,
        out_per_expert: int = 1,
        prior: torch.Tensor | None = None,
        prior_strength: float = 1.0,
        frozen: bool = False,
        init: GateInit = "uniform",
    ) -> None:
        super().__init__()
        if init not in ("uniform", "coherent"):
            raise ValueError(f"gate init must be 'uniform' or 'coherent', got {init!r}")
        self.init = init
        self.num_experts, self.height, self.width = num_experts, height, width
        self.bound = tensor_gate_bound(num_experts, num_selected, out_per_expert)
        self.weight = nn.Parameter(torch.empty(num_experts, height, width), requires_grad=not frozen)
        # the categorical prior map (H, W) the gate was initialised with, for diagnostics; not saved
        self.prior_map: torch.Tensor | None
        self.register_buffer("prior_map", None, persistent=False)
        # CPU selection cache: {(k, F, channels_last): Selection} valid while the weight equals the snapshot
        self._selections: dict[tuple[int, int, bool], Selection] = {}
        self._previous: dict[tuple[int, int, bool], Selection] = {}  # of the previous weights
        self._snapshot: torch.Tensor | None = None
        self._snapshot_version = -1  # weight._version when the snapshot was taken
        self._tops: dict[int, IncrementalTopK] = {}  # {k: the top-k kept valid across updates}, CPU only
        self.reset_parameters()
        if prior is not None:
            self.init_from_prior(prior, prior_strength)

    def reset_parameters(self) -> None:
        with torch.no_grad():
            if self.init == "coherent":  # one score per expert, broadcast over the grid
                per_expert = torch.empty(self.num_experts, 1, 1).uniform_(-self.bound, self.bound)
                self.weight.copy_(per_expert.expand_as(self.weight))
            else:
                self.weight.uniform_(-self.bound, self.bound)

    @torch.no_grad()
    def init_from_prior(self, prior: torch.Tensor, strength: float = 1.0) -> None:
        """Assign disjoint expert groups to the categories of a prior map.

        ``prior``: integer map (H, W) with categories 0..K-1 (e.g. 0 = sea, 1 = land). The experts are
        split into K contiguous groups of (nearly) equal size; at a location of category k every expert of
        group k gets ``strength · 2b`` added to its U(-b, b) initial score. With ``strength >= 1`` the
        group's experts outrank all others at initialisation; smaller values make the prior a soft bias.
        """
        prior = torch.as_tensor(prior)
        if prior.shape != (self.height, self.width):
            raise ValueError(
                f"gate prior has shape {tuple(prior.shape)}, expected (H, W) = ({self.height}, {self.width})"
            )
        if prior.is_floating_point():
            if not torch.equal(prior, prior.round()):
                raise ValueError("gate prior must be a categorical (integer) map; threshold fractions first")
            prior = prior.long()
        num_groups = int(prior.max().item()) + 1
        if prior.min() < 0 or num_groups > self.num_experts:
            raise ValueError(
                f"gate prior categories must be in 0..{self.num_experts - 1}, got {prior.min()}..{prior.max()}"
            )
        self.prior_map = prior.to(self.weight.device)
        group_of_expert = torch.arange(self.num_experts) * num_groups // self.num_experts  # (|E|,)
        in_group = group_of_expert[:, None, None] == prior[None].to(group_of_expert.device)
        self.weight.add_(in_group.to(self.weight) * (2.0 * self.bound * strength))

    def top_indices(self, k: int, out_per_expert: int = 1,
                    channels_last: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """Top-k experts per location, (1, k, H, W) in descending score order, and their flat positions
        in a (|E|, F, H, W) expert block (k·F·H·W,), or with ``channels_last`` in an (H, W, |E|, F) block
        (ordered H, W, k, F; see :func:`flat_expert_index_channels_last`). The selection itself is the same
        ``topk`` call either way, so both layouts route identically, ties included.
        """
        selection = self.selection(k, out_per_expert, channels_last)
        return selection.idx, selection.flat

    def selection(self, k: int, out_per_expert: int = 1, channels_last: bool = False) -> Selection:
        """The :class:`Selection` of the current weights (indices as :meth:`top_indices`).

        On CPU it is cached while the weight is bitwise equal to a snapshot taken when it was computed, so the
        layers sharing this gate select once per step (and a frozen gate once per run); ``torch.equal`` on the
        |E|·H·W values costs ~2 % of the ``topk`` it saves. The check is on VALUES: a cache keyed on
        ``weight._version`` alone went stale under foreach Adam (earlier torch releases) and
        ``weight.data.copy_()``, which do not bump the version counter, and froze the routing. Only a bumped
        counter skips the comparison (the weight was written in place: the selection is made anew). Accelerators
        and ``torch.compile`` recompute every call (a value check would be a host synchronisation).
        After an update the top-k is not taken anew: :class:`IncrementalTopK` re-ranks only the locations where the
        update may have re-ordered the experts (bitwise the full ``topk``). When it leaves the selection as it was,
        the selection memo (used experts, their index, the selected path's plan) is kept too.
        """
        weight = self.weight.detach()
        # not under inference_mode (Lightning's validation): its tensors cannot be saved for backward, so a
        # selection cached there would break the next training step (tested)
        cacheable = weight.device.type == "cpu" and not torch.compiler.is_compiling() \
            and not torch.is_inference_mode_enabled()
        key = (int(k), int(out_per_expert), bool(channels_last))
        if not cacheable:
            return self._selection_of(weight.topk(k, dim=0, sorted=True).indices, out_per_expert, channels_last)
        snapshot = self._snapshot
        # a bumped version counter means an in-place update (an optimizer step): no need to compare the values
        moved = snapshot is None or self.weight._version != self._snapshot_version
        if moved or not torch.equal(snapshot, weight):  # False for another shape too
            self._follow_update(snapshot, weight)
        elif key in self._selections:
            return self._selections[key]
        top = self._tops.get(int(k))
        if top is None:
            top = self._tops[int(k)] = IncrementalTopK(weight, int(k))
            changed = True
        else:
            changed = top.rerank_stale(weight)
        previous = self._previous.get(key)
        # the update kept the selection: the same index tensor (never written in place), or equal values
        if previous is not None and (previous.idx.data_ptr() == top.idx.data_ptr() if not changed
                                     else torch.equal(previous.idx[0], top.idx)):
            selection = previous.for_new_values(self._snapshot)
        else:
            selection = self._selection_of(top.idx, out_per_expert, channels_last, scores=self._snapshot)
        self._selections[key] = selection
        return selection

    def _follow_update(self, snapshot: torch.Tensor | None, weight: torch.Tensor) -> None:
        """The weight moved from ``snapshot`` to ``weight``: take a new snapshot, keep the selections made so far
        as the previous ones (reused where the new weights still select the same), and widen every kept top-k's
        drift bound by this update's largest move per location (:class:`IncrementalTopK`)."""
        self._previous = {**self._previous, **self._selections}
        if snapshot is None or snapshot.shape != weight.shape:
            self._tops = {}  # (a dropped cache, or another grid): every top-k is taken anew
        elif self._tops:
            move = torch.sub(weight, snapshot).abs_().amax(0).reshape(-1).double()  # (H·W,)
            for top in self._tops.values():
                top.drift.add_(move)
        self._selections, self._snapshot = {}, weight.clone()
        self._snapshot_version = self.weight._version

    def _selection_of(self, idx: torch.Tensor, out_per_expert: int, channels_last: bool,
                      scores: torch.Tensor | None = None) -> Selection:
        """A new :class:`Selection` of the sorted top-k ``idx`` (k, H, W), with its flat gather index."""
        return Selection(idx.unsqueeze(0), self.num_experts, out_per_expert, channels_last,
                         scores=scores)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Return the routing tensor as scores of shape (1, |E|, H, W); ``x`` only checks the grid."""
        if x.shape[-2:] != (self.height, self.width):
            raise ValueError(
                f"TensorRoutingGate is for a {self.height}x{self.width} grid, got input {tuple(x.shape)}"
            )
        return self.weight.unsqueeze(0)


def flat_expert_index(idx: torch.Tensor, out_per_expert: int = 1) -> torch.Tensor:
    """Flat positions in a (|E|, F, H, W) block of the slots (E, F, H, W) selected by ``idx`` (E, H, W)."""
    e, h, w = idx.shape
    f = out_per_expert
    pixels = torch.arange(h * w, device=idx.device)
    channel = torch.arange(f, device=idx.device).view(1, f, 1) * (h * w)
    return (idx.reshape(e, 1, h * w) * (f * h * w) + channel + pixels).reshape(-1)


def flat_expert_index_channels_last(idx: torch.Tensor, num_experts: int, out_per_expert: int = 1) -> torch.Tensor:
    """Flat positions in a channels-last (H, W, |E|, F) block of the slots selected by ``idx`` (E, H, W),
    ordered (H, W, E, F): an ``index_select`` with it turns a channels-last expert output (B, H·W·|E|·F)
    into the selected slots (B, H, W, E, F) in one gather, each pixel reading one contiguous |E|·F chunk."""
    e, h, w = idx.shape
    f = out_per_expert
    pixel = torch.arange(h * w, device=idx.device).view(h * w, 1, 1) * (num_experts * f)
    channel = torch.arange(f, device=idx.device)
    return (idx.reshape(e, h * w).t().unsqueeze(2) * f + pixel + channel).reshape(-1)


def flat_slot_index(idx: torch.Tensor, num_experts: int, out_per_expert: int = 1,
                    channels_last: bool = False) -> torch.Tensor:
    """Flat gather positions of the slots selected by ``idx`` (E, H, W) in a block of ``num_experts`` experts:
    :func:`flat_expert_index_channels_last` for a channels-last block, else :func:`flat_expert_index`."""
    if channels_last:
        return flat_expert_index_channels_last(idx, num_experts, out_per_expert)
    return flat_expert_index(idx, out_per_expert)


def coord_channels(x: torch.Tensor) -> torch.Tensor:
    """Append two channels with coordinates in [-1, 1] (rows, columns): (B, C, H, W) → (B, C+2, H, W)."""
    b, _, h, w = x.shape
    rows = torch.linspace(-1, 1, h, device=x.device, dtype=x.dtype).view(1, 1, h, 1).expand(b, 1, h, w)
    cols = torch.linspace(-1, 1, w, device=x.device, dtype=x.dtype).view(1, 1, 1, w).expand(b, 1, h, w)
    return torch.cat([x, rows, cols], dim=1)


class CoordConv2d(nn.Module):
    """Convolution over the input plus two coordinate channels (Liu et al., 2018)."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int = 3, bias: bool = True) -> None:
        super().__init__()
        self.conv = nn.Conv2d(in_channels + 2, out_channels, kernel_size, padding=kernel_size // 2, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(coord_channels(x))


class LocallyConnected2d(nn.Module):
    """Locally connected layer: an independent k×k filter bank at every location (no weight sharing).

    Weight shape (H, W, out, in·k·k); zero padding keeps the grid size. Output (B, out, H, W).
    """

    def __init__(self, in_channels: int, out_channels: int, height: int, width: int, kernel_size: int = 3,
                 bias: bool = True) -> None:
        super().__init__()
        self.kernel_size, self.height, self.width = kernel_size, height, width
        fan_in = in_channels * kernel_size * kernel_size
        bound = 1.0 / math.sqrt(fan_in)
        self.weight = nn.Parameter(torch.empty(height * width, out_channels, fan_in).uniform_(-bound, bound))
        self.bias = nn.Parameter(torch.zeros(out_channels, height, width)) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, _, h, w = x.shape
        patches = F.unfold(x, self.kernel_size, padding=self.kernel_size // 2)  # (B, C·k·k, H·W)
        out = torch.einsum("bkl,lok->bol", patches, self.weight).reshape(b, -1, h, w)
        return out if self.bias is None else out + self.bias


class ConvGate(nn.Module):
    """3×3 convolution gate (input-dependent): (B, C, H, W) → (B, |E|, H, W)."""

    def __init__(self, in_channels: int, num_experts: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(in_channels, num_experts, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x)


class CoordConvGate(nn.Module):
    """3×3 CoordConv gate, or ``depth`` CoordConv layers with BatchNorm and ReLU between them."""

    def __init__(self, in_channels: int, num_experts: int, depth: int = 1, hidden: int = 3) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        channels = in_channels
        for _ in range(depth - 1):
            layers += [CoordConv2d(channels, hidden), nn.BatchNorm2d(hidden), nn.ReLU()]
            channels = hidden
        layers.append(CoordConv2d(channels, num_experts))
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class LCNGate(nn.Module):
    """3×3 locally connected gate: (B, C, H, W) → (B, |E|, H, W)."""

    def __init__(self, in_channels: int, num_experts: int, height: int, width: int) -> None:
        super().__init__()
        self.lcn = LocallyConnected2d(in_channels, num_experts, height, width, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lcn(x)


class FCGate(nn.Module):
    """Fully connected gate over the whole grid: (B, C·H·W) → (B, |E|·H·W). Very many parameters."""

    def __init__(self, in_channels: int, num_experts: int, height: int, width: int) -> None:
        super().__init__()
        self.shape = (num_experts, height, width)
        self.fc = nn.Linear(in_channels * height * width, num_experts * height * width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x.flatten(1)).view(x.shape[0], *self.shape)


def build_gate(kind: str, in_channels: int, num_experts: int, height: int, width: int,
               num_selected: int = 1, out_per_expert: int = 1) -> nn.Module:
    """Gate by name: ``tensor``, ``fc``, ``conv``, ``coordconv``, ``lcn``, ``coordconv3``."""
    if kind == "tensor":
        return TensorRoutingGate(num_experts, height, width, num_selected, out_per_expert)
    if kind == "fc":
        return FCGate(in_channels, num_experts, height, width)
    if kind == "conv":
        return ConvGate(in_channels, num_experts)
    if kind == "coordconv":
        return CoordConvGate(in_channels, num_experts, depth=1)
    if kind == "coordconv3":
        return CoordConvGate(in_channels, num_experts, depth=3)
    if kind == "lcn":
        return LCNGate(in_channels, num_experts, height, width)
    raise ValueError(f"unknown gate kind {kind!r}; expected one of tensor, fc, conv, coordconv, coordconv3, lcn")
