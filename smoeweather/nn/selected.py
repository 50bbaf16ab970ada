"""The selected-experts computation of an SMoE layer with a shared routing (``expert_compute="selected"``).

A tensor-routing gate does not depend on the input, so every sample of a batch routes alike: the grid can be
cut into rectangles ("leaves") once per routing and each leaf convolved with only the experts selected inside
it. The cut is a binary space partition chosen by dynamic programming: a rectangle is convolved whole with the
union of its experts, or split in half along its longer side, whichever costs fewer multiply-adds counting a
fixed per-call overhead (:data:`CALL_OVERHEAD_MACS`). Where all locations of a leaf share their expert set (a
land-sea prior with a coherent init: two sets), each expert is computed exactly where it is selected; where the
sets vary from point to point the leaf computes their union, never more than the experts used on the whole grid
(``expert_compute="used"``, the root leaf) plus the overhead of the calls.

Why rectangles and the library convolution rather than a gather → GEMM per expert set: on one CPU thread at the
SMoE-U-Net's level 0 (8 × 16 × 32 × 64, 16 → 16 channels) the im2col gather alone took ~5× the whole oneDNN
convolution and the GEMM ~1.6× it (benchmarks/results/smoe_selected_cpu.md); a k×k expert with F = 1 output
channel reuses a gathered column only across the experts of its location. A rectangle is a strided view of the
padded input, so the leaf convolutions gather nothing.

The plan is built on the host (numpy) from the selection ``idx`` and memoised in the gate's
:class:`~smoeweather.nn.gates.Selection`: once per routing change on CPU, where the gate caches its selection
(the memo survives weight updates that keep the selection). On an accelerator the gate selects anew every call,
so the plan costs one device → host copy of ``idx`` per call (a host synchronisation; correct, not fast).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np
import torch
from torch.nn import functional as F

CALL_OVERHEAD_MACS = 2e7
"""Fixed cost of one leaf (its forward and backward convolution calls, the window copies oneDNN makes) in
multiply-adds, for the partition's cost model. Measured: 12 leaves took ≈ 2.6 ms per leaf beyond one convolution of
the same multiply-adds at ≈ 2.9 GMAC/s (SMoE-U-Net level 0, one thread, loaded machine: ≈ 7.5e6), and on a quiet
machine plans of 3 leaves at 1.69× the selected experts' MACs were still slower than the used experts on the whole
grid (benchmarks/results/smoe_selected_cpu_quiet.md), hence the margin. A larger value gives fewer, larger leaves."""

MIN_SIDE = 2
"""The smallest leaf side the partition splits down to (grid points)."""

_PARTITIONS: dict[bytes, list[tuple[int, int, int, int, np.ndarray]]] = {}
"""Recent partitions by expert-set map: training changes the ORDER of a location's experts far more often than
its set (U-Net 16/32/64: ~5 new selections per step), and only the set decides the partition."""
_PARTITIONS_KEPT = 64


@dataclass(frozen=True)
class Leaf:
    """Output rows [top, bottom) and columns [left, right) convolved with weight ``rows`` (u·F,) — the u experts
    selected in the rectangle, ascending, F output channels each."""

    top: int
    bottom: int
    left: int
    right: int
    rows: torch.Tensor

    @property
    def size(self) -> int:
        """Values per sample in the leaf's output: u·F · height · width."""
        return self.rows.numel() * (self.bottom - self.top) * (self.right - self.left)


@dataclass(frozen=True)
class SelectedPlan:
    """Leaves covering the grid once, and ``flat``: the position in the concatenated leaf outputs (B, N) of every
    selected slot, ordered (E, F, H, W), or (H, W, E, F) for a channels-last layer. ``macs_per_sample``: the
    multiply-adds computed per sample; ``ideal_macs_per_sample``: those of the selected experts alone."""

    leaves: tuple[Leaf, ...]
    flat: torch.Tensor | None  # None for a single leaf (the layer then takes the used-experts path)
    block_size: int
    macs_per_sample: int
    ideal_macs_per_sample: int


def _cut_unions(sums: np.ndarray, top: int, bottom: int, left: int, right: int, axis: int,
                min_side: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For every cut of the rectangle along ``axis`` (0: between rows, 1: between columns) leaving ≥ ``min_side``
    on both sides: the cut positions and the number of experts selected in the first and in the second part."""
    lo, hi = (top, bottom) if axis == 0 else (left, right)
    cuts = np.arange(lo + min_side, hi - min_side + 1)
    if axis == 0:  # (|E|, H + 1) cumulative counts of the rectangle's columns, by row boundary
        line = sums[:, :, right] - sums[:, :, left]
    else:  # (|E|, W + 1) by column boundary
        line = sums[:, bottom, :] - sums[:, top, :]
    first = line[:, cuts] - line[:, lo:lo + 1]
    second = line[:, hi:hi + 1] - line[:, cuts]
    return cuts, (first > 0).sum(0), (second > 0).sum(0)


def partition(idx: np.ndarray, num_experts: int, overhead: float, min_side: int = MIN_SIDE) \
        -> list[tuple[int, int, int, int, np.ndarray]]:
    """Leaves (top, bottom, left, right, experts) of a cheap guillotine partition of the grid.

    ``idx``: (E, H, W) selected experts; ``overhead``: the cost of a leaf in expert·location units. A leaf costs
    u · area + overhead with u the experts selected in it (u ≥ E, so a leaf whose locations share one set is
    never split). A rectangle is cut where the two parts' u · area sum least (every row and column boundary is
    tried), recursively, and the cut is kept only if the parts' best partitions cost less than the whole."""
    e, h, w = idx.shape
    presence = np.zeros((num_experts, h, w), dtype=np.int32)
    np.put_along_axis(presence, idx.astype(np.int64), 1, axis=0)
    sums = np.zeros((num_experts, h + 1, w + 1), dtype=np.int32)
    sums[:, 1:, 1:] = presence.cumsum(1).cumsum(2)

    def solve(top: int, bottom: int, left: int, right: int) -> tuple[float, list]:
        counts = sums[:, bottom, right] - sums[:, top, right] - sums[:, bottom, left] + sums[:, top, left]
        experts = np.flatnonzero(counts)
        rows, cols = bottom - top, right - left
        whole = experts.size * rows * cols + overhead
        leaf = [(top, bottom, left, right, experts)]
        if experts.size <= e:
            return whole, leaf
        best = None
        for axis, length, other in ((0, rows, cols), (1, cols, rows)):
            if length < 2 * min_side:
                continue
            cuts, first, second = _cut_unions(sums, top, bottom, left, right, axis, min_side)
            start = top if axis == 0 else left
            cost = (first * (cuts - start) + second * (length - (cuts - start))) * other
            ties = np.flatnonzero(cost == cost.min())  # of equal cost, the most balanced cut
            i = int(ties[np.argmin(np.abs(2 * (cuts[ties] - start) - length))])
            if best is None or cost[i] < best[0]:
                best = (cost[i], axis, int(cuts[i]))
        if best is None:
            return whole, leaf
        _, axis, cut = best
        if axis == 0:
            first_part, second_part = solve(top, cut, left, right), solve(cut, bottom, left, right)
        else:
            first_part, second_part = solve(top, bottom, left, cut), solve(top, bottom, cut, right)
        split = first_part[0] + second_part[0]
        return (split, first_part[1] + second_part[1]) if split < whole else (whole, leaf)

    return solve(0, h, 0, w)[1]


def build_plan(idx: torch.Tensor, num_experts: int, out_per_expert: int, fan_in: int, batch: int,
               channels_last: bool = False, overhead_macs: float | None = None) -> SelectedPlan:
    """The :class:`SelectedPlan` of a shared selection ``idx`` (E, H, W) for experts of ``fan_in`` = C·k·k inputs
    and ``out_per_expert`` channels, for batches of ``batch`` samples (the overhead's weight, default
    :data:`CALL_OVERHEAD_MACS`)."""
    overhead_macs = CALL_OVERHEAD_MACS if overhead_macs is None else overhead_macs
    device = idx.device
    sel = idx.detach().cpu().numpy()
    e, h, w = sel.shape
    f = out_per_expert
    overhead = overhead_macs / max(batch * fan_in * f, 1)
    key = hashlib.blake2b(np.sort(sel, axis=0).tobytes() + repr((sel.shape, num_experts, overhead)).encode(),
                          digest_size=16).digest()
    leaves_np = _PARTITIONS.get(key)
    if leaves_np is None:
        leaves_np = partition(sel, num_experts, overhead)
        if len(_PARTITIONS) >= _PARTITIONS_KEPT:
            _PARTITIONS.pop(next(iter(_PARTITIONS)))
        _PARTITIONS[key] = leaves_np
    if len(leaves_np) == 1:  # the layer computes the used experts on the whole grid: no slot index needed
        (_, _, _, _, experts), = leaves_np
        rows = torch.from_numpy((experts[:, None] * f + np.arange(f)).reshape(-1)).to(device)
        size = rows.numel() * h * w
        return SelectedPlan((Leaf(0, h, 0, w, rows),), None, size, size * fan_in, e * f * h * w * fan_in)
    leaf_of = np.empty((h, w), dtype=np.int64)
    offset = np.empty(len(leaves_np), dtype=np.int64)
    rank = np.zeros((len(leaves_np), num_experts), dtype=np.int64)
    geometry = np.empty((len(leaves_np), 4), dtype=np.int64)  # top, left, height, width
    leaves, total = [], 0
    for i, (top, bottom, left, right, experts) in enumerate(leaves_np):
        leaf_of[top:bottom, left:right] = i
        rank[i, experts] = np.arange(experts.size)
        geometry[i] = (top, left, bottom - top, right - left)
        rows = torch.from_numpy((experts[:, None] * f + np.arange(f)).reshape(-1)).to(device)
        leaf = Leaf(top, bottom, left, right, rows)
        offset[i] = total
        total += leaf.size
        leaves.append(leaf)
    ys, xs = np.meshgrid(np.arange(h), np.arange(w), indexing="ij")
    top, left, height, width = (geometry[:, j][leaf_of] for j in range(4))  # (H, W) each
    slot_rank = np.take_along_axis(rank[leaf_of], np.moveaxis(sel, 0, -1).astype(np.int64), axis=-1)  # (H, W, E)
    # slot (s, c) at (y, x): offset + (rank·F + c) · height·width + (y − top) · width + (x − left)
    channel = np.moveaxis(slot_rank, -1, 0)[:, None] * f + np.arange(f)[None, :, None, None]  # (E, F, H, W)
    position = offset[leaf_of] + channel * (height * width) + (ys - top) * width + (xs - left)
    if channels_last:
        position = position.transpose(2, 3, 0, 1)  # (H, W, E, F)
    flat = torch.from_numpy(np.ascontiguousarray(position).reshape(-1)).to(device)
    return SelectedPlan(tuple(leaves), flat, total, total * fan_in, e * f * h * w * fan_in)


class LeafConvolutions(torch.autograd.Function):
    """The plan's leaf convolutions: padded input ``xp`` (B, C, H + 2p, W + 2p) → (B, N) leaf outputs, each leaf
    (B, u·F, h, w) flattened and concatenated in plan order. Backward: one ``convolution_backward`` per leaf,
    the input gradients added into the overlapping halos, the weight and bias gradients into the rows of the
    leaf's experts (the others get exact zeros)."""

    @staticmethod
    def forward(ctx, xp: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                plan: SelectedPlan) -> torch.Tensor:
        pad = weight.shape[-1] - 1
        outs, weights = [], []
        for leaf in plan.leaves:
            w = weight.index_select(0, leaf.rows)
            b = None if bias is None else bias.index_select(0, leaf.rows)
            window = xp[:, :, leaf.top:leaf.bottom + pad, leaf.left:leaf.right + pad]
            outs.append(F.conv2d(window, w, b).reshape(xp.shape[0], -1))
            weights.append(w)
        ctx.save_for_backward(xp)
        ctx.plan, ctx.weights, ctx.has_bias, ctx.weight_shape = plan, weights, bias is not None, weight.shape
        return torch.cat(outs, 1) if len(outs) > 1 else outs[0]

    @staticmethod
    def backward(ctx, grad_block: torch.Tensor):
        (xp,) = ctx.saved_tensors
        need_x, need_w, need_b = ctx.needs_input_grad[:3]
        need_b = need_b and ctx.has_bias
        pad = ctx.weight_shape[-1] - 1
        grad_xp = torch.zeros_like(xp) if need_x else None
        grad_w = xp.new_zeros(ctx.weight_shape) if need_w else None
        grad_b = xp.new_zeros(ctx.weight_shape[0]) if need_b else None
        start = 0
        for leaf, w in zip(ctx.plan.leaves, ctx.weights, strict=True):
            size = leaf.size
            g = grad_block[:, start:start + size].reshape(
                xp.shape[0], leaf.rows.numel(), leaf.bottom - leaf.top, leaf.right - leaf.left)
            start += size
            window = (slice(None), slice(None), slice(leaf.top, leaf.bottom + pad), slice(leaf.left, leaf.right + pad))
            gx, gw, gb = torch.ops.aten.convolution_backward(
                g, xp[window], w, [w.shape[0]] if ctx.has_bias else None, [1, 1], [0, 0], [1, 1], False, [0, 0], 1,
                [need_x, need_w, need_b])
            if need_x:
                grad_xp[window] += gx
            if need_w:
                grad_w.index_add_(0, leaf.rows, gw)
            if need_b:
                grad_b.index_add_(0, leaf.rows, gb)
        return grad_xp, grad_w, grad_b, None
