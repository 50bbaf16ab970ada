"""Misrouting from the error signal: per-sample quantile thresholds of |dL/dy|, the misrouting flags, the
routing-classification (RC) labels, gate gradient and loss value (paper §2.2), and the expert damping factor.

These are the pieces the backward of :class:`~smoeweather.nn.smoe.SpatialMoE2d`
(:mod:`smoeweather.nn.smoe_autograd`) assembles; see :mod:`smoeweather.nn.smoe` for the design decisions
(quantile 0.3, tolerances, bitwise-equal fast paths).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch.nn import functional as F

from smoeweather.nn.gates import Selection

EXACT_QUANTILE_MAX = 1 << 16
NUMPY_QUANTILE = True
"""Take the RC quantile of CPU tensors with ``np.partition`` (same value as ``torch.kthvalue``, faster)."""


_SAME_WIDTH_INT = {np.dtype(np.float32): np.int32, np.dtype(np.float64): np.int64}
_UINT8_MAX = int(np.iinfo(np.uint8).max)  # the most samples a uint8 batch count holds


def quantile_threshold(error: torch.Tensor, quantile: float, nonnegative: bool = False) -> torch.Tensor:
    """Per-sample lower q-quantile of (B, ...) errors: the ceil(q·n)-th smallest value, shape (B, 1, 1, 1).

    Exact up to 65,536 values per sample; above that it is taken over an evenly strided subsample of
    ≥ 32,768 values (rank error ≈ sqrt(q(1−q)/n) < 0.3 %), which makes ``kthvalue`` ~5× cheaper at
    WeatherBench size (E·H·W = 262,144) — the quantile is a noisy label threshold, not a statistic.
    The subsample is strided in the LOGICAL order of ``error``'s dims whatever its memory layout (a
    channels-last error gives the same threshold as a contiguous one), without copying the errors.
    ``nonnegative``: the caller guarantees error ≥ 0 (magnitudes, no −0.0), which lets the CPU path select on
    the IEEE bit patterns as integers (same order for non-negative floats, NaN last as for floats; the same
    value, ~1.7× faster).
    """
    b = error.shape[0]
    n = math.prod(error.shape[1:])
    step = math.ceil(n / (EXACT_QUANTILE_MAX // 2)) if n > EXACT_QUANTILE_MAX else 1
    memory_order = None if error.is_contiguous() else _memory_order_view(error)
    if memory_order is None:  # contiguous (or not dense: reshape copies into logical order)
        flat = error.reshape(b, -1)[:, ::step]
    elif step == 1:  # the k-th smallest value does not depend on the order
        flat = memory_order
    else:  # memory offset of every step-th value in logical order: one small gather
        offsets = torch.arange(n, device=error.device).as_strided(error.shape[1:], error.stride()[1:])
        flat = memory_order.index_select(1, offsets.reshape(-1)[::step])
    m = flat.shape[1]
    k = min(max(math.ceil(quantile * m), 1), m)
    if NUMPY_QUANTILE and flat.device.type == "cpu" and flat.dtype in (torch.float32, torch.float64) \
            and type(flat) is torch.Tensor and not flat.requires_grad and not torch.compiler.is_compiling():
        # (a plain eager CPU tensor only: fake/traced tensors under FakeTensorMode or torch.compile have no data)
        # numpy's introselect (np.partition) returns the same k-th smallest value as torch.kthvalue, several
        # times faster on CPU (8 × 32,768 float32 on one thread: 5 vs 36 ms on a loaded machine): the SMoE
        # ResNet 16×3 step went from 2.10× to 1.80× its dense twin's (benchmarks/results/smoe_step_cpu.md).
        # A CPU tensor has no device to synchronise with; other devices keep kthvalue.
        array = flat.numpy()
        if nonnegative:  # non-negative IEEE floats order as their bit patterns do as signed integers
            values = np.partition(array.view(_SAME_WIDTH_INT[array.dtype]), k - 1, axis=1)[:, k - 1].view(array.dtype)
        else:
            values = np.partition(array, k - 1, axis=1)[:, k - 1]
        return torch.from_numpy(np.ascontiguousarray(values)).view(b, 1, 1, 1)
    return flat.kthvalue(k, dim=1).values.view(b, 1, 1, 1)


def _memory_order_view(t: torch.Tensor) -> torch.Tensor | None:
    """(B, ...) as a (B, n) view in memory order when every sample is one dense block, else None."""
    dims = sorted(range(1, t.dim()), key=t.stride, reverse=True)
    view = t.permute(0, *dims)
    return view.reshape(t.shape[0], -1) if view.is_contiguous() else None


def _sum_slot_channels(grad_y: torch.Tensor, absolute: bool) -> torch.Tensor:
    """Sum over the F channels of each slot: (B, E, F, H, W) → float32 (B, E, H, W) in ``grad_y``'s memory
    layout. It runs in channel order f = 0, 1, … in float32, so every memory layout and device gives the
    same bits (a ``sum(2)`` vectorises differently per layout), and with them the same misrouting flags.
    ``absolute``: Σ|g|, rounded through ``grad_y``'s dtype as the former ``abs().sum(2)`` in that dtype was;
    else Σg in float32 (the straight-through gate gradient)."""
    f = grad_y.shape[2]
    first = grad_y.select(2, 0)
    if f == 1:
        return first.abs().float() if absolute else first.float()
    total = first.abs().float() if absolute else first.to(torch.float32, copy=True)
    for i in range(1, f):
        part = grad_y.select(2, i)
        total.add_(part.abs() if absolute else part)
    if absolute and grad_y.dtype != torch.float32:
        total = total.to(grad_y.dtype).float()
    return total


def damping_factor(wrong: torch.Tensor, damping: float, dtype: torch.dtype, out: torch.Tensor | None = None,
                   fused: bool | None = None) -> torch.Tensor:
    """Per-slot gradient factor: 1 where ``wrong`` is False, the damping factor where True, in ``dtype``.

    The factor is 1 + (damping − 1) rounded in ``dtype`` (e.g. 0.10000002 in float32), as the layer always
    computed it. ``fused`` (default: on CUDA) writes it with one ``where`` (1 + itemsize bytes per slot);
    otherwise copy/mul/add (three passes), which is ~3× faster on CPU, whose ``where`` is not vectorised.
    Both give the same bits.
    """
    out = torch.empty_like(wrong, dtype=dtype) if out is None else out
    if wrong.is_cuda if fused is None else fused:
        damped = out.new_ones(()).mul_(damping - 1.0).add_(1.0)
        return torch.where(wrong, damped, damped.new_ones(()), out=out)
    return out.copy_(wrong).mul_(damping - 1.0).add_(1.0)


def _count_batch(flags: torch.Tensor) -> torch.Tensor:
    """Count of True over dim 0 (keepdim) of a bool tensor, as float32 in ``flags``' memory layout.

    Summed as integers (uint8 up to 255 samples, else int32) over the memory-order view, then converted: the
    counts are exact either way, so this gives the bits of a float32 sum, ~4× faster on CPU (a float32 sum
    of a bool tensor converts every element first, and a channels-last input reduced into a planar result
    is ~4× slower again)."""
    dims = sorted(range(1, flags.dim()), key=flags.stride, reverse=True)
    inverse = [0] * flags.dim()
    for position, dim in enumerate((0, *dims)):
        inverse[dim] = position
    count_dtype = torch.uint8 if flags.shape[0] <= torch.iinfo(torch.uint8).max else torch.int32
    counts = flags.permute(0, *dims).view(torch.uint8).sum(0, keepdim=True, dtype=count_dtype)
    return counts.to(torch.float32).permute(inverse)



def misrouted_mask(error: torch.Tensor, quantile: float, tolerance: float = 0.0) -> torch.Tensor:
    """Flag selections whose error exceeds the per-sample ``quantile`` of the errors plus ``tolerance``.

    ``error``: (B, E, H, W) non-negative error magnitudes of the selected slots.
    Returns a bool tensor of the same shape; True = incorrect routing. The threshold is the lower
    q-quantile (n = E·H·W), so ties at the threshold count as correct; ``tolerance`` keeps a sample
    whose errors are all tiny from flagging anything (the reference code uses 1e-5 for the RC labels).
    """
    return error > quantile_threshold(error, quantile, nonnegative=True) + tolerance


def batch_flagged_fraction_cpu(grad_y: torch.Tensor, quantile: float, tolerance: float) -> torch.Tensor | None:
    """RC flags of a shared routing (G = 1) counted over the batch, in one numpy pass per step of the chain.

    ``grad_y``: dL/dy of the selected slots, (B, E, 1, H, W) float32, contiguous, on the CPU, 1 < B ≤ 255;
    ``tolerance``: the absolute slack in error-signal units. Returns the fraction of the B samples whose error
    |dL/dy| exceeds their per-sample lower ``quantile`` plus ``tolerance``, (1, E, H, W) float32: bitwise
    ``_count_batch(misrouted flags) / B`` of the general path (tested), or None where that path must run
    (another dtype, layout, device, F > 1, fake or traced tensors). Above EXACT_QUANTILE_MAX values per sample the
    quantile is that of :func:`quantile_threshold`'s strided subsample, the same values in the same order.

    Written out in numpy because the torch chain it replaces (abs, quantile, a broadcast ``>``, a batch count)
    costs ~2.5× as much on CPU at the U-Net's level 0 (8 × 16 × 32 × 64): torch's broadcast comparison alone
    took 0.33 ms where numpy's takes 0.02 ms. |g| is the sign bit cleared (what ``abs`` does, NaN included);
    the comparison is IEEE (NaN never flagged), as in the general path.
    """
    b = grad_y.shape[0]
    n = math.prod(grad_y.shape[1:])
    if not (NUMPY_QUANTILE and type(grad_y) is torch.Tensor and grad_y.device.type == "cpu"
            and grad_y.dtype == torch.float32 and grad_y.dim() == 5 and grad_y.shape[2] == 1
            and 1 < b <= _UINT8_MAX and grad_y.is_contiguous()
            and not grad_y.requires_grad and not torch.compiler.is_compiling()):
        return None
    _, e, _, h, w = grad_y.shape
    magnitude = np.bitwise_and(grad_y.numpy().reshape(b, n).view(np.int32), np.int32(0x7FFFFFFF))
    # the values :func:`quantile_threshold` ranks: all n, or above EXACT_QUANTILE_MAX every step-th (contiguous:
    # logical order is memory order)
    step = math.ceil(n / (EXACT_QUANTILE_MAX // 2)) if n > EXACT_QUANTILE_MAX else 1
    ranked = magnitude[:, ::step] if step > 1 else magnitude
    m = ranked.shape[1]
    k = min(max(math.ceil(quantile * m), 1), m)
    # the k-th smallest magnitude per sample: non-negative IEEE floats order as their bits do as integers
    threshold = np.partition(ranked, k - 1, axis=1)[:, k - 1].view(np.float32)
    # + tolerance in torch's float32 arithmetic, as the general path adds it
    limit = (torch.from_numpy(np.ascontiguousarray(threshold)) + tolerance).numpy()
    flagged = np.greater(magnitude.view(np.float32), limit[:, None])
    counts = flagged.view(np.uint8).sum(axis=0, dtype=np.uint8)
    return torch.from_numpy(counts).to(torch.float32).div_(b).view(1, e, h, w)


def routing_labels(wrong: torch.Tensor, idx: torch.Tensor, num_experts: int) -> torch.Tensor:
    """RC labels (paper §2.2) from the misrouting flags of the selected slots.

    ``wrong``: (G, E, H, W) in [0, 1] (a fraction when averaged over a batch), ``idx``: (G, E, H, W)
    selected expert indices. Unselected experts get num_wrong/(|E|−E); selected ones 1 − wrong.
    Returns (G, |E|, H, W).
    """
    g, e, h, w = wrong.shape
    labels = _unselected_label(wrong, num_experts).expand(g, num_experts, h, w).clone()
    return labels.scatter_(1, idx, 1.0 - wrong)


def _unselected_label(wrong: torch.Tensor, num_experts: int) -> torch.Tensor:
    """The RC label of every unselected expert, num_wrong/(|E|−E): (G, 1, H, W) from ``wrong`` (G, E, H, W)."""
    unselected = num_experts - wrong.shape[1]
    return wrong.sum(1, keepdim=True) / unselected if unselected > 0 else torch.zeros_like(wrong[:, :1])


def rc_gate_gradient(sigmoid: torch.Tensor, wrong: torch.Tensor, idx: torch.Tensor, num_experts: int,
                     flat: torch.Tensor | None = None) -> torch.Tensor:
    """sigmoid(z) − :func:`routing_labels`, bitwise, without building the (G, |E|, H, W) label tensor: the
    unselected experts' label is one value per location, subtracted by broadcasting, and the E selected
    slots are overwritten with sigmoid − (1 − wrong). ``sigmoid``: (G, |E|, H, W). Returns a new tensor.
    ``flat`` (G = 1, contiguous ``sigmoid`` and ``wrong``): the selected slots' positions in (|E|, H, W),
    :func:`~smoeweather.nn.gates.flat_expert_index` of ``idx[0]``; a 1-d index_select / index_copy_ with it moves
    the same values ~1.4× faster than gather / scatter_ along dim 1 on CPU."""
    grad = sigmoid - _unselected_label(wrong, num_experts)
    if flat is None:
        return grad.scatter_(1, idx, sigmoid.gather(1, idx) - (1.0 - wrong))
    selected = sigmoid.reshape(-1).index_select(0, flat).view(wrong.shape) - (1.0 - wrong)
    grad.view(-1).index_copy_(0, flat, selected.view(-1))
    return grad


def _rc_loss_sums(z: torch.Tensor, idx: torch.Tensor, memo: Callable[..., Any],
                  key: tuple[Any, ...]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The per-gate terms of :func:`rc_loss_mean` for scores ``z`` (G, |E|, H, W), memoised under ``key``."""
    return (memo((*key, "softplus_sum"), lambda: F.softplus(z).sum(), values=True),
            memo((*key, "z_expert_sum"), lambda: z.sum(1, keepdim=True), values=True),
            memo((*key, "z_selected"), lambda: z.gather(1, idx), values=True))


def _selection_rc_loss(selection: Selection, wrong: torch.Tensor, num_experts: int) -> torch.Tensor:
    """:func:`rc_loss_mean` of a shared selection, from its snapshot of the gate's weight (read after the step)."""
    z = selection.scores.unsqueeze(0).float()
    sums = _rc_loss_sums(z, selection.idx, selection.memo, ("rc_loss_snapshot",))
    return rc_loss_mean(*sums, wrong, selection.idx, num_experts, z.numel())


def flagged_fraction(wrong: torch.Tensor) -> torch.Tensor:
    """Fraction of True in the misrouting flags ``wrong`` (any shape), float32 scalar."""
    return torch.count_nonzero(wrong).to(torch.float32) / wrong.numel()


def label_information(wrong: torch.Tensor, quantile: float) -> torch.Tensor:
    """Share of locations whose flagged fraction (mean of ``wrong`` (G, E, H, W) over G and the slots) differs
    from 1 − q by more than 0.1: where the RC labels say more than "1 − q of the slots are wrong"."""
    p_flagged = wrong.mean(dim=(0, 1))
    return ((p_flagged - (1.0 - quantile)).abs() > 0.1).float().mean()


def rc_loss_mean(softplus_sum: torch.Tensor, z_expert_sum: torch.Tensor, z_selected: torch.Tensor,
                 wrong: torch.Tensor, idx: torch.Tensor, num_experts: int, n: int) -> torch.Tensor:
    """Mean BCE-with-logits of the RC labels, mean(softplus(z) − labels·z) over n = G·|E|·H·W, from per-gate
    sums: ``softplus_sum`` Σ softplus(z) (scalar), ``z_expert_sum`` Σ_e z (G, 1, H, W), ``z_selected`` z at
    ``idx`` (G, E, H, W). Σ labels·z = Σ base·Σ_e z + Σ_selected ((1 − wrong) − base)·z, with base the
    unselected label, so only (G, E, H, W)-sized tensors are touched per layer (the value is logged, not
    differentiated; it equals the direct mean up to float32 summation order)."""
    base = _unselected_label(wrong, num_experts)
    labelled = (base * z_expert_sum).sum() + (((1.0 - wrong) - base) * z_selected).sum()
    return (softplus_sum - labelled) / n
