"""The Spatial Mixture-of-Experts layer (paper §2): convolutional experts, top-E routing per location,
and the routing-classification (RC) loss and expert error damping computed inside the layer's backward.

Design decisions (differences from the reference code, each tested in ``tests/test_smoe_layer.py``; the
measurements behind them are in docs/smoe-weather-findings.md, "Design notes of the SMoE layer"):

* RC loss and damping happen in the backward of one autograd Function, from the error signal dL/dy arriving
  at the layer, so any number of SMoE layers at any depth train with ONE ordinary ``loss.backward()``.
* The RC loss gradient (sigmoid(g) − labels)/N is injected directly as the gate's gradient; its value is
  ``layer.last_rc_loss`` (computed when first read, from the step's own gate values). With RC on the gate
  gets no task gradient (paper App. B) unless ``gate_task_grad=True``; with RC off it gets the
  straight-through (or, weighted, the exact) gradient.
* The tensor-routing gate is input-independent: the top-E is taken once over (|E|, H, W), and batch-averaged
  RC labels give the exact mean BCE gradient without a B×|E|×H×W label tensor.
* The per-sample q-quantile uses ``kthvalue`` (lower quantile). Default q = 0.3 (the reference code's heat
  runs), not the paper text's 0.7; damping factor 0.1 (paper text; the reference code's default is 0.0).
* Deep networks (post-processing U-Net, vision SMoE-CNN) use damping off and a coherent gate init; this
  layer's defaults stay the paper's.
* Init: ``expert_init="reference"`` is Kaiming-uniform with the ReLU gain (the reference's hidden layers).
* Mixed precision: the injected gate gradient is multiplied by ``loss_scale`` (:func:`set_loss_scale`).
* Routing implementations (``route_impl``): ``index_select`` (planar) and ``channels_last`` give identical
  routing, labels and gradients; ``auto`` follows the input's memory format.
* No host synchronisation in forward or backward (CUDA-graph capturable) with ``expert_compute="all"``, the
  default on accelerators; logging values stay tensors.
* ``expert_compute="used"`` (the default on CPU with a tensor-routing gate) convolves only the experts that
  are selected somewhere on the grid. With a categorical prior most experts are selected nowhere: a
  land-sea prior with |E| = 4E selects about 2E of them (measured on the trained gcm_ens SMoE-U-Nets:
  32–34 of 64, 64–67 of 128, 130 of 256), which halves the dominant cost of a CPU step. The unselected
  experts' outputs are never read and their weight gradient is exactly zero either way, so results are the
  same (bitwise on exact data; tested). It reads the set size on the host, hence CPU only by default.
* ``expert_compute="selected"`` convolves each expert only in the rectangles of the grid that select it
  (:mod:`smoeweather.nn.selected`): the paper's ideal cost (§2.4) in FLOPs when every leaf holds one expert set,
  but on CPU each leaf is a separate oneDNN call, and on the 32 × 64 grids of the studies that costs more time
  than the FLOPs it saves (benchmarks/results/smoe_selected_cpu_quiet.md), so ``auto`` keeps ``used``.
* Under ``torch.compile`` every layer computes all experts and routes through an opaque custom operator
  (:mod:`smoeweather.nn.route_op`), so the layer compiles without a graph break.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import partial
from typing import Any, Literal

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from smoeweather.nn import route_op
from smoeweather.nn.gates import (
    Selection,
    TensorRoutingGate,
    flat_expert_index,
    flat_expert_index_channels_last,
    flat_slot_index,
)
from smoeweather.nn.selected import LeafConvolutions, SelectedPlan, build_plan

GateNorm = Literal["none", "softmax", "abs", "softmax_abs"]
Padding = Literal["zeros", "periodic_lon"]
RouteImpl = Literal["auto", "index_select", "channels_last"]
RCThreshold = Literal["sample", "slot"]
ExpertCompute = Literal["auto", "all", "used", "selected"]
ROUTE_IMPLS = ("auto", "index_select", "channels_last")
EXPERT_COMPUTES = ("auto", "all", "used", "selected")

# (B, E, F, H, W) <-> (B, H, W, E, F): the permutation is its own inverse
_TO_CHANNELS_LAST = (0, 3, 4, 1, 2)


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


def _pad_lon_circular(x: torch.Tensor, pad: int) -> torch.Tensor:
    """Circular padding in W only; keeps a channels-last input channels-last (``F.pad`` returns planar)."""
    if x.is_contiguous() or not x.is_contiguous(memory_format=torch.channels_last):
        return F.pad(x, (pad, pad, 0, 0), mode="circular")
    return torch.cat([x[..., -pad:], x, x[..., :pad]], dim=-1)


def is_channels_last(x: torch.Tensor) -> bool:
    """True for a 4-d tensor laid out channels-last and not also contiguous (C = 1 or H = W = 1 are both)."""
    return x.dim() == 4 and not x.is_contiguous() and x.is_contiguous(memory_format=torch.channels_last)


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
    (another dtype, layout, device, F > 1, a subsampled quantile, fake or traced tensors).

    Written out in numpy because the torch chain it replaces (abs, quantile, a broadcast ``>``, a batch count)
    costs ~2.5× as much on CPU at the U-Net's level 0 (8 × 16 × 32 × 64): torch's broadcast comparison alone
    took 0.33 ms where numpy's takes 0.02 ms. |g| is the sign bit cleared (what ``abs`` does, NaN included);
    the comparison is IEEE (NaN never flagged), as in the general path.
    """
    b = grad_y.shape[0]
    n = math.prod(grad_y.shape[1:])
    if not (NUMPY_QUANTILE and type(grad_y) is torch.Tensor and grad_y.device.type == "cpu"
            and grad_y.dtype == torch.float32 and grad_y.dim() == 5 and grad_y.shape[2] == 1
            and 1 < b <= _UINT8_MAX and n <= EXACT_QUANTILE_MAX and grad_y.is_contiguous()
            and not grad_y.requires_grad and not torch.compiler.is_compiling()):
        return None
    _, e, _, h, w = grad_y.shape
    magnitude = np.bitwise_and(grad_y.numpy().reshape(b, n).view(np.int32), np.int32(0x7FFFFFFF))
    k = min(max(math.ceil(quantile * n), 1), n)
    # the k-th smallest magnitude per sample: non-negative IEEE floats order as their bits do as integers
    threshold = np.partition(magnitude, k - 1, axis=1)[:, k - 1].view(np.float32)
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


def _routing_backward(ctx: Any, grad_y: torch.Tensor, scores: torch.Tensor, idx: torch.Tensor, need_slots: bool,
                      need_scores: bool) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """The backward shared by the routing Functions. ``grad_y``: dL/dy (B, E, F, H, W); ``ctx``: ``layer``,
    ``channels_last``, ``selection``. Returns dL/dy in the memory layout of ``ctx.channels_last``, the damped
    slot gradient (``need_slots``, else None) and the gate's gradient: RC loss, straight-through (``need_scores``)."""
    layer: SpatialMoE2d = ctx.layer
    b, _, f, h, w = grad_y.shape
    num_experts = layer.num_experts
    g, e = idx.shape[:2]
    channels_last = ctx.channels_last
    # dL/dy in the memory layout the scatter reads (planar, or (B, H, W, E, F)); the elementwise ops
    # below keep it, so nothing is copied again before the scatter (a no-op when already laid out so)
    if channels_last:
        grad_y = grad_y.permute(_TO_CHANNELS_LAST).contiguous().permute(_TO_CHANNELS_LAST)
    else:
        grad_y = grad_y.contiguous()
    damp = layer.damping is not None and num_experts > e and need_slots
    wrong = wrong_damp = error = wrong_g = None
    # the tolerances are absolute errors in output units of a mean-reduced MSE, so they are converted to
    # error-signal units (× 2/N × loss scale) instead of rescaling the (large) error tensor
    to_signal = 2.0 * layer.loss_scale / grad_y.numel()
    if layer.rc and need_scores and not damp and g == 1 and layer.rc_threshold == "sample":
        # the common CPU case: the batch-counted flags straight from dL/dy (None where it does not apply)
        wrong_g = batch_flagged_fraction_cpu(grad_y.detach(), layer.quantile, layer.tolerance * to_signal)
    if (layer.rc or damp) and wrong_g is None:
        # error = |dL/dy| per slot; the quantile itself is scale-free
        error = _sum_slot_channels(grad_y.detach(), absolute=True)
        if layer.rc_threshold == "slot":  # each slot (output plane) against its own spatial quantile
            threshold = quantile_threshold(error.reshape(b * e, 1, h, w), layer.quantile,
                                           nonnegative=True).view(b, e, 1, 1)
        else:  # "sample": the paper's per-sample quantile over every slot and location
            threshold = quantile_threshold(error, layer.quantile, nonnegative=True)
        wrong = error > threshold + layer.tolerance * to_signal
        if damp:
            if layer.damping_quantile != layer.quantile:
                threshold = quantile_threshold(error, layer.damping_quantile, nonnegative=True)
            wrong_damp = error > threshold + layer.damping_tolerance * to_signal
        if not (layer.rc and need_scores):  # else from the batch-counted flags below
            layer.record_diagnostics(last_misrouted_fraction=flagged_fraction(wrong))

    grad_slots = None
    if need_slots:
        grad_slots = grad_y
        if wrong_damp is not None:
            # 1 or damping per slot, written into the no longer needed error buffer when possible
            reuse = error.dtype == grad_y.dtype and f == 1
            factor = damping_factor(wrong_damp, layer.damping, grad_y.dtype, out=error if reuse else None)
            grad_slots = factor.unsqueeze(2).mul_(grad_y) if f == 1 else grad_y * factor.unsqueeze(2)
    grad_scores = None
    if need_scores:
        if layer.rc:
            if wrong_g is None:  # (else counted above by batch_flagged_fraction_cpu, the same bits)
                if g == 1 and b > 1:  # shared routing: mean of labels gives the exact mean-BCE gradient
                    # fractions k/B, summed over the slots in routing_labels: contiguous, so that sum runs in
                    # one order in every layout (a no-op for planar, a 1/B-sized copy for channels-last)
                    wrong_g = _count_batch(wrong).div_(b).contiguous()
                else:  # 0/1 values: sums exact in any order; contiguous for the RC loss value's sums
                    wrong_g = wrong.to(torch.float32).contiguous()
            z = scores.detach().float()
            n = z.numel()  # that of the labels, (G, |E|, H, W)
            memo = ctx.selection.memo if ctx.selection is not None else (lambda key, make, values=False: make())
            key = ("rc", layer.gate_norm)
            sigmoid = memo((*key, "sigmoid"), lambda: torch.sigmoid(z), values=True)
            gate_flat = None
            if ctx.selection is not None and g == 1 and z.is_contiguous():  # positions in (|E|, H, W)
                planar_f1 = ctx.selection.out_per_expert == 1 and not ctx.selection.channels_last
                gate_flat = ctx.selection.flat if planar_f1 else \
                    ctx.selection.memo(("gate_flat",), lambda: flat_expert_index(idx[0], 1))
            grad_scores = rc_gate_gradient(sigmoid, wrong_g, idx, num_experts, gate_flat)
            grad_scores.mul_(layer.rc_weight * layer.loss_scale / n)
            # logged values, computed when read: from the selection's snapshot of the gate's weight, or (no
            # snapshot, or normalised scores) from per-gate sums taken now, as the gate is updated in place
            if ctx.selection is not None and ctx.selection.scores is not None and layer.gate_norm == "none":
                rc_loss = partial(_selection_rc_loss, ctx.selection, wrong_g, num_experts)
            else:
                rc_loss = partial(rc_loss_mean, *_rc_loss_sums(z, idx, memo, key), wrong_g, idx, num_experts, n)
            layer.record_diagnostics(
                last_rc_loss=rc_loss,
                last_label_information=partial(label_information, wrong_g, layer.quantile),
                last_misrouted_fraction=partial(torch.mean, wrong_g))
        if grad_scores is None:
            grad_scores = torch.zeros(scores.shape, dtype=torch.float32, device=scores.device)
        if layer.gate_gets_task_grad and not layer.weighted:
            straight = _sum_slot_channels(grad_y.detach(), absolute=False)  # (B, E, H, W)
            if g == 1:
                straight = straight.sum(0, keepdim=True)
            grad_scores.scatter_add_(1, idx, straight)
        grad_scores = grad_scores.to(scores.dtype)
    return grad_y, grad_slots, grad_scores


class _RouteExperts(torch.autograd.Function):
    """Gather the selected experts; in backward: damping, RC-loss gradient for the gate.

    ``channels_last``: ``expert_out`` is laid out (B, H, W, |E|, F) in memory and ``flat`` (G = 1) indexes
    that layout (:func:`~smoeweather.nn.gates.flat_expert_index_channels_last`); the output, logically
    (B, E, F, H, W), is then laid out (B, H, W, E, F). Everything else is computed in logical coordinates,
    so both layouts give the same values; only the gather/scatter and the memory layouts differ.

    ``local_idx`` (G = 1): ``expert_out`` holds only the n experts selected somewhere, (B, n, F, H, W), and
    ``local_idx`` is ``idx`` renumbered into them; ``flat`` then indexes that block. ``idx`` keeps the global
    expert numbers for the RC labels.

    ``selection``: the gate's :class:`~smoeweather.nn.gates.Selection` when the routing is the gate's cached
    one; the RC loss's sigmoid and softplus of the scores are memoised in it, so layers sharing a gate compute
    them once per step (same values, same bits).
    """

    @staticmethod
    def forward(ctx, expert_out: torch.Tensor, scores: torch.Tensor, idx: torch.Tensor,
                layer: SpatialMoE2d, flat: torch.Tensor | None = None, channels_last: bool = False,
                local_idx: torch.Tensor | None = None, selection: Selection | None = None) -> torch.Tensor:
        # expert_out (B, |E| or n, F, H, W); scores (G, |E|, H, W); idx (G, E, H, W) -> y (B, E, F, H, W)
        ctx.save_for_backward(scores, idx)
        ctx.selection = selection
        if local_idx is not None:
            idx = local_idx
        b, num_experts, f, h, w = expert_out.shape
        e = idx.shape[1]
        ctx.layer = layer
        ctx.expert_shape = expert_out.shape
        ctx.channels_last = channels_last
        if channels_last:
            source = expert_out.permute(_TO_CHANNELS_LAST)  # (B, H, W, |E|, F), contiguous from apply_experts
            if not source.is_contiguous():
                source = source.contiguous()
            if idx.shape[0] == 1:  # one gather: every pixel reads its E slots from its |E|·F chunk
                ctx.flat = flat_expert_index_channels_last(idx[0], num_experts, f) if flat is None else flat
                y = source.reshape(b, -1).index_select(1, ctx.flat).view(b, h, w, e, f)
            else:
                y = source.gather(3, idx.permute(0, 2, 3, 1).unsqueeze(4).expand(b, h, w, e, f))
            return y.permute(_TO_CHANNELS_LAST)
        if idx.shape[0] == 1:
            # shared routing: one flat index for every sample; index_select is ~5× faster than a gather
            # with a batch-expanded index on CPU (and no slower on GPU)
            ctx.flat = flat_expert_index(idx[0], f) if flat is None else flat
            return expert_out.reshape(b, -1).index_select(1, ctx.flat).view(b, e, f, h, w)
        return expert_out.gather(1, idx.unsqueeze(2).expand(b, e, f, h, w))

    @staticmethod
    def backward(ctx, grad_y: torch.Tensor):
        scores, idx = ctx.saved_tensors
        b, computed, f, h, w = ctx.expert_shape  # computed: the experts in the forward's block (|E| or n)
        num_experts = ctx.layer.num_experts
        g, e = idx.shape[:2]
        channels_last = ctx.channels_last
        grad_y, grad_slots, grad_scores = _routing_backward(ctx, grad_y, scores, idx, ctx.needs_input_grad[0],
                                                            ctx.needs_input_grad[1])
        grad_expert = None
        if grad_slots is not None:
            if channels_last:
                source = grad_slots.permute(_TO_CHANNELS_LAST)  # (B, H, W, E, F)
                if g == 1:
                    grad_expert = grad_y.new_zeros(b, h * w * computed * f)
                    grad_expert.index_add_(1, ctx.flat, source.reshape(b, -1))  # indices unique: a copy
                    grad_expert = grad_expert.view(b, h, w, computed, f)
                else:
                    index = idx.permute(0, 2, 3, 1).unsqueeze(4).expand(b, h, w, e, f)
                    grad_expert = grad_y.new_zeros(b, h, w, num_experts, f).scatter_(3, index, source)
                grad_expert = grad_expert.permute(_TO_CHANNELS_LAST)
            elif g == 1:
                grad_expert = grad_y.new_zeros(b, computed * f * h * w)
                grad_expert.index_add_(1, ctx.flat, grad_slots.reshape(b, -1))  # indices unique: a copy
                grad_expert = grad_expert.view(ctx.expert_shape)
            else:
                index = idx.unsqueeze(2).expand(b, e, f, h, w)
                grad_expert = grad_y.new_zeros(ctx.expert_shape).scatter_(1, index, grad_slots)

        return grad_expert, grad_scores, None, None, None, None, None, None


class _RouteBlock(torch.autograd.Function):
    """The selected slots from the leaf outputs of a :class:`~smoeweather.nn.selected.SelectedPlan` (B, N); in
    backward the routing's (damping, RC-loss gradient for the gate) and the slots' gradient put back in place.
    ``flat``: the plan's slot positions, ordered (E, F, H, W), or (H, W, E, F) when ``channels_last`` (the output
    is then laid out (B, H, W, E, F), as :class:`_RouteExperts` lays it out)."""

    @staticmethod
    def forward(ctx, block: torch.Tensor, scores: torch.Tensor, idx: torch.Tensor, layer: SpatialMoE2d,
                flat: torch.Tensor, channels_last: bool, selection: Selection | None) -> torch.Tensor:
        ctx.save_for_backward(scores, idx)
        ctx.layer, ctx.flat, ctx.channels_last, ctx.selection = layer, flat, channels_last, selection
        ctx.block_size = block.shape[1]
        b, (_, e, h, w), f = block.shape[0], idx.shape, layer.out_per_expert
        y = block.index_select(1, flat)
        if channels_last:
            return y.view(b, h, w, e, f).permute(_TO_CHANNELS_LAST)
        return y.view(b, e, f, h, w)

    @staticmethod
    def backward(ctx, grad_y: torch.Tensor):
        scores, idx = ctx.saved_tensors
        _, grad_slots, grad_scores = _routing_backward(ctx, grad_y, scores, idx, ctx.needs_input_grad[0],
                                                       ctx.needs_input_grad[1])
        grad_block = None
        if grad_slots is not None:  # laid out as ``flat`` orders the slots: a view
            source = grad_slots.permute(_TO_CHANNELS_LAST) if ctx.channels_last else grad_slots
            b = source.shape[0]
            grad_block = source.new_zeros(b, ctx.block_size).index_add_(1, ctx.flat, source.reshape(b, -1))
        return grad_block, grad_scores, None, None, None, None, None


class SpatialMoE2d(nn.Module):
    """Spatial Mixture-of-Experts convolution (paper §2).

    Input (B, C, H, W) → output (B, E·F, H, W): at each location the E experts with the highest routing
    scores (out of |E|) are applied; their F output channels are concatenated in sorted routing-score
    order (slot 0 = highest score). Every expert is a k×k convolution; all experts are computed
    everywhere and then gathered (the paper's "naïve" implementation, §2.4), which keeps every expert in
    the autograd graph — DDP never sees an unused parameter.

    Args:
        in_channels: C.
        num_experts: |E|.
        num_selected: E, experts applied per location.
        gate: a gate module returning (G, |E|, H, W) scores; share one :class:`TensorRoutingGate`
            between layers to share routing. ``None`` builds a tensor-routing gate for ``grid``.
        grid: (H, W), needed when ``gate`` is None.
        out_per_expert: F, output channels of each expert.
        kernel_size: k of the expert convolutions.
        padding: ``zeros`` or ``periodic_lon`` (circular in W = longitude, zero in H = latitude).
        weighted: scale each selected expert by its (normalised) gate value.
        gate_norm: ``none`` (paper default), ``softmax``, ``abs`` or ``softmax_abs``.
        rc: train the gate with the routing-classification loss.
        damping: expert error damping factor for misrouted locations (paper text 0.1; the reference
            code's default and heat runs 0.0 = no expert gradient there); ``None`` disables damping.
        quantile: q; a selection is misrouted if its error is above the per-sample q-quantile plus
            ``tolerance``. Default 0.3 (70 % of the selections are candidates, as the reference code is
            run), not the 0.7 of the paper's text: with 0.7 training was observed to stall (see the
            module docstring for the evidence; it is not a lock).
        tolerance: absolute slack on that threshold for the RC labels, in output units of a
            mean-squared-error loss (reference code: 1e-5): a sample whose errors are all within it
            flags nothing, so a converged layer stops being pushed around.
        damping_tolerance: the same slack for expert damping (reference code: 1e-3).
        damping_quantile: quantile for damping when it should differ from the RC ``quantile``.
        rc_weight: multiplier of the RC loss.
        gate_task_grad: whether the gate also gets the task-loss gradient; default: only without RC.
        noise: routing noise in training, std = noise/sqrt(|E|) (0 = off; 1.0 is the N(0, 1/|E|) of
            the reference).
        aux_losses: subset of {"importance", "load", "spatial_agreement"} (paper App. C.1).
        bias: expert convolutions with bias.
        expert_init: ``torch`` (PyTorch's Conv2d default) or ``reference`` (Kaiming-uniform, ReLU gain:
            the reference code's init of hidden layers; its last layer — the heat SMoE's experts — gets
            the linear gain instead, see :func:`smoeweather.models.heat.reference_init`).
        route_impl: ``auto`` (default: ``channels_last`` for channels-last inputs, else ``index_select``),
            ``index_select`` (experts in the input's layout, output planar) or ``channels_last`` (experts
            and output channels-last; a planar input is converted first). Same results up to the conv's
            summation order, different speed and memory layout; see the module docstring.
        rc_threshold: which errors the RC quantile is taken over: ``sample`` (the paper: all slots and
            locations of a sample, so 1 − q of them are flagged and, in a hidden layer, the planes with the
            largest downstream weights are flagged everywhere) or ``slot`` (each slot's own spatial quantile per
            sample: a location is flagged for plane j when plane j's error there is high against plane j's
            errors elsewhere, which removes the plane-scale confound). ``last_label_information`` records the
            share of locations whose flagged fraction differs from 1 − q by more than 0.1.
        expert_compute: ``all`` (every expert everywhere, no host synchronisation), ``used`` (only the experts
            selected somewhere, for a shared routing G = 1; same results, see the module docstring),
            ``selected`` (each expert only in the rectangles of the grid where it is selected: a partition of the
            grid planned on the host once per routing, :mod:`smoeweather.nn.selected`; same results to float32
            summation order; G = 1 only, else all experts) or ``auto`` (``used`` on CPU, ``all`` on accelerators).
    """

    def __init__(
        self,
        in_channels: int,
        num_experts: int,
        num_selected: int = 1,
        gate: nn.Module | None = None,
        grid: tuple[int, int] | None = None,
        out_per_expert: int = 1,
        kernel_size: int = 3,
        padding: Padding = "zeros",
        weighted: bool = False,
        gate_norm: GateNorm = "none",
        rc: bool = True,
        damping: float | None = 0.1,
        quantile: float = 0.3,
        tolerance: float = 1e-5,
        damping_tolerance: float = 1e-3,
        damping_quantile: float | None = None,
        rc_weight: float = 1.0,
        gate_task_grad: bool | None = None,
        noise: float = 0.0,
        aux_losses: tuple[str, ...] = (),
        bias: bool = False,
        expert_init: str = "torch",
        route_impl: RouteImpl = "auto",
        rc_threshold: RCThreshold = "sample",
        expert_compute: ExpertCompute = "auto",
    ) -> None:
        super().__init__()
        if not 1 <= num_selected <= num_experts:
            raise ValueError(f"num_selected must be in 1..num_experts={num_experts}, got {num_selected}")
        if not 0.0 < quantile <= 1.0:
            raise ValueError(f"quantile must be in (0, 1], got {quantile}")
        if gate_norm not in ("none", "softmax", "abs", "softmax_abs"):
            raise ValueError(f"gate_norm must be none, softmax, abs or softmax_abs, got {gate_norm!r}")
        if padding not in ("zeros", "periodic_lon"):
            raise ValueError(f"padding must be 'zeros' or 'periodic_lon', got {padding!r}")
        if rc_threshold not in ("sample", "slot"):
            raise ValueError(f"rc_threshold must be 'sample' or 'slot', got {rc_threshold!r}")
        if expert_compute not in EXPERT_COMPUTES:
            raise ValueError(f"expert_compute must be one of {', '.join(EXPERT_COMPUTES)}, got {expert_compute!r}")
        if route_impl not in ROUTE_IMPLS:
            raise ValueError(f"route_impl must be one of {', '.join(ROUTE_IMPLS)}, got {route_impl!r}")
        unknown = set(aux_losses) - {"importance", "load", "spatial_agreement"}
        if unknown:
            raise ValueError(f"unknown aux_losses {sorted(unknown)}; expected importance, load, spatial_agreement")
        if gate is None:
            if grid is None:
                raise ValueError("give either a gate module or grid=(H, W) for a tensor-routing gate")
            gate = TensorRoutingGate(num_experts, *grid, num_selected=num_selected, out_per_expert=out_per_expert)
        self.in_channels, self.num_experts, self.num_selected = in_channels, num_experts, num_selected
        self.out_per_expert, self.kernel_size, self.padding = out_per_expert, kernel_size, padding
        self.out_channels = num_selected * out_per_expert
        self.gate = gate
        pad = kernel_size // 2
        self.experts = nn.Conv2d(in_channels, num_experts * out_per_expert, kernel_size, bias=bias,
                                 padding=(pad, 0) if padding == "periodic_lon" else pad)
        if expert_init == "reference":
            # the reference code's init of every weight: Kaiming-uniform for ReLU, bound sqrt(6 / fan_in),
            # 2.4× PyTorch's default; on heat diffusion the more diverse random stencils matter (the default
            # init left the d = 0.25 region without an expert for 14k steps, this one finds it at ~10-16k)
            nn.init.kaiming_uniform_(self.experts.weight, nonlinearity="relu")
            if bias:
                nn.init.zeros_(self.experts.bias)
        elif expert_init != "torch":
            raise ValueError(f"expert_init must be 'torch' or 'reference', got {expert_init!r}")
        self.weighted, self.gate_norm = weighted, gate_norm
        self.rc, self.damping, self.quantile, self.rc_weight = rc, damping, quantile, rc_weight
        self.tolerance, self.damping_tolerance = tolerance, damping_tolerance
        self.damping_quantile = quantile if damping_quantile is None else damping_quantile
        self.gate_task_grad, self.noise, self.aux_losses = gate_task_grad, noise, tuple(aux_losses)
        self.route_impl, self.rc_threshold, self.expert_compute = route_impl, rc_threshold, expert_compute
        self.loss_scale = 1.0
        # the selected path's per-leaf cost in multiply-adds (None: selected.CALL_OVERHEAD_MACS); 0 cuts the grid
        # until every leaf holds one expert set (each expert computed exactly where it is selected)
        self.selected_overhead_macs: float | None = None
        self._route_key = route_op.register(self, _RouteExperts)  # for compiled code (smoeweather.nn.route_op)
        # logged values of the last backward: tensors, or partials that compute them on first read
        self._diagnostics: dict[str, torch.Tensor | Callable[[], torch.Tensor]] = {}
        self.aux_loss: torch.Tensor | None = None
        self._last_idx: torch.Tensor | None = None

    def __setstate__(self, state: dict[str, Any]) -> None:
        """A copy (``copy.deepcopy``, unpickling) registers itself for compiled code under its own key."""
        super().__setstate__(state)
        self._route_key = route_op.register(self, _RouteExperts)

    def record_diagnostics(self, **values: torch.Tensor | Callable[[], torch.Tensor]) -> None:
        """Set logged values of this backward (``last_rc_loss``, ``last_label_information``,
        ``last_misrouted_fraction``); a callable (a picklable ``functools.partial`` of tensors that are not
        modified later) is evaluated on first read, so a step whose values nobody reads does not compute them."""
        self._diagnostics.update(values)

    def _diagnostic(self, name: str) -> torch.Tensor | None:
        value = self._diagnostics.get(name)
        if value is not None and not isinstance(value, torch.Tensor):
            value = self._diagnostics[name] = value()
        return value

    @property
    def last_routing(self) -> torch.Tensor | None:
        """(1, H, W) top-1 expert of the last forward (of its first sample for input-dependent gates), or None."""
        idx = self._last_idx
        return None if idx is None else idx[:1, 0].detach()

    @property
    def last_rc_loss(self) -> torch.Tensor | None:
        """Mean BCE of the RC labels in the last backward (float32 scalar), or None."""
        return self._diagnostic("last_rc_loss")

    @property
    def last_label_information(self) -> torch.Tensor | None:
        """Share of locations whose flagged fraction is off 1 − q by > 0.1 in the last backward, or None."""
        return self._diagnostic("last_label_information")

    @property
    def last_misrouted_fraction(self) -> torch.Tensor | None:
        """Fraction of the selections flagged misrouted in the last backward, or None."""
        return self._diagnostic("last_misrouted_fraction")

    @property
    def gate_gets_task_grad(self) -> bool:
        return (not self.rc) if self.gate_task_grad is None else self.gate_task_grad

    def extra_repr(self) -> str:
        return (f"in={self.in_channels}, experts={self.num_experts}, selected={self.num_selected}, "
                f"F={self.out_per_expert}, k={self.kernel_size}, padding={self.padding}, weighted={self.weighted}, "
                f"rc={self.rc}, damping={self.damping}, q={self.quantile}")

    def normalised_scores(self, x: torch.Tensor) -> torch.Tensor:
        """Gate scores after the configured normalisation: (G, |E|, H, W)."""
        scores = self.gate(x)
        if self.gate_norm in ("abs", "softmax_abs"):
            scores = scores.abs()
        if self.gate_norm in ("softmax", "softmax_abs"):
            scores = scores.softmax(dim=1)
        return scores

    def resolved_route_impl(self, x: torch.Tensor) -> str:
        """The routing implementation used for input ``x`` (``auto`` follows its memory format)."""
        if self.route_impl != "auto":
            return self.route_impl
        return "channels_last" if is_channels_last(x) else "index_select"

    def uses_selected_experts(self, x: torch.Tensor, shared_routing: bool) -> bool:
        """Whether this call convolves fewer than all experts (``used`` or ``selected``, resolved for ``x``)."""
        return self.resolved_expert_compute(x, shared_routing) != "all"

    def resolved_expert_compute(self, x: torch.Tensor, shared_routing: bool) -> str:
        """What this call computes: ``all``, ``used`` or ``selected`` (``expert_compute`` resolved for ``x``).
        A per-sample routing computes all experts; ``auto`` is ``used`` on CPU (measured faster than ``selected`` for
        the SMoE-U-Nets and ResNets on 32 × 64 grids: benchmarks/results/smoe_selected_cpu.md), ``all`` on accelerators.
        ``selected`` becomes ``used`` under autocast (the leaf convolutions' backward runs in the input's dtype);
        under ``torch.compile`` every mode computes ``all`` (the used experts and the plan have data-dependent
        shapes, which would break the graph)."""
        mode = self.expert_compute
        if not shared_routing or mode == "all" or torch.compiler.is_compiling():
            return "all"  # (compiled: the used experts' count and the plan are data-dependent shapes)
        if mode == "auto":
            mode = "used" if x.device.type == "cpu" else "all"
        if mode == "selected" and torch.is_autocast_enabled(x.device.type):
            return "used"
        return mode

    def selected_plan(self, idx: torch.Tensor, batch: int, channels_last: bool,
                      selection: Selection | None) -> SelectedPlan:
        """The leaf plan of the shared selection ``idx`` (1, E, H, W), memoised in the gate's ``selection``."""
        fan_in = self.in_channels * self.kernel_size ** 2

        overhead = self.selected_overhead_macs

        def make() -> SelectedPlan:
            return build_plan(idx[0], self.num_experts, self.out_per_expert, fan_in, batch, channels_last, overhead)
        if selection is None:
            return make()
        key = ("selected", self.num_experts, self.out_per_expert, fan_in, batch, channels_last, overhead)
        return selection.memo(key, make)

    def apply_selected(self, x: torch.Tensor, plan: SelectedPlan, channels_last: bool) -> torch.Tensor:
        """The plan's leaf convolutions: (B, C, H, W) → (B, N) leaf outputs (see :mod:`smoeweather.nn.selected`)."""
        if channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        pad = self.kernel_size // 2
        if self.padding == "periodic_lon":
            xp = F.pad(_pad_lon_circular(x, pad), (0, 0, pad, pad)) if pad else x
        else:
            xp = F.pad(x, (pad, pad, pad, pad)) if pad else x
        return LeafConvolutions.apply(xp, self.experts.weight, self.experts.bias, plan)

    def apply_experts(self, x: torch.Tensor, channels_last: bool = False,
                      experts: torch.Tensor | None = None) -> torch.Tensor:
        """All experts at all locations: (B, C, H, W) → (B, |E|, F, H, W); with ``channels_last`` computed
        and laid out channels-last, i.e. (B, H, W, |E|, F) in memory. ``experts`` (n,) ascending indices:
        only those experts, (B, n, F, H, W), with weights read from the full parameter (the others get a
        zero gradient, as they do when all are computed and none is selected)."""
        if channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        if self.padding == "periodic_lon":  # circular copy in longitude only; latitude zeros by the conv
            x = _pad_lon_circular(x, self.kernel_size // 2)
        if experts is None:
            out = self.experts(x)
            n = self.num_experts
        else:
            f = self.out_per_expert
            rows = experts if f == 1 else (experts.view(-1, 1) * f + torch.arange(f, device=experts.device)).reshape(-1)
            bias = None if self.experts.bias is None else self.experts.bias.index_select(0, rows)
            out = F.conv2d(x, self.experts.weight.index_select(0, rows), bias, padding=self.experts.padding)
            n = experts.numel()
        if channels_last:
            out = out.contiguous(memory_format=torch.channels_last)  # no-op unless a backend chose planar
        b, _, h, w = out.shape
        return out.view(b, n, self.out_per_expert, h, w)

    def _used_experts(self, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The experts selected anywhere, ascending (n,), and ``idx`` (1, E, H, W) renumbered into them."""
        flat = idx.reshape(-1)
        used = torch.bincount(flat, minlength=self.num_experts) > 0  # (a one-pass histogram: 2.4× an index_put)
        experts = used.nonzero().view(-1)  # host sync: the number of used experts sets the conv's shape
        position = torch.cumsum(used, 0) - 1  # position of each used expert in ``experts``
        return experts, position.index_select(0, flat).view(idx.shape)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        channels_last = self.resolved_route_impl(x) == "channels_last"
        scores = self.normalised_scores(x)
        routing_scores = scores
        if self.training and self.noise > 0:
            routing_scores = scores + torch.randn_like(scores) * (self.noise / math.sqrt(self.num_experts))
        flat = selection = None
        if isinstance(self.gate, TensorRoutingGate) and self.gate_norm in ("none", "softmax") and \
                routing_scores is scores:  # order-preserving: the gate's cached selection is valid
            selection = self.gate.selection(self.num_selected, self.out_per_expert, channels_last=channels_last)
            idx = selection.idx
        else:
            idx = routing_scores.detach().topk(self.num_selected, dim=1, sorted=True).indices
        self.__dict__["_last_idx"] = idx  # for last_routing; a plain attribute, set without Module.__setattr__
        experts = local_idx = None
        if torch.compiler.is_compiling():  # all experts, an opaque routing operator: no graph break (route_op)
            y = route_op.route(self.apply_experts(x, channels_last), scores, idx, self._route_key, channels_last)
            return self._finish(y, scores, routing_scores, idx)
        mode = self.resolved_expert_compute(x, shared_routing=idx.shape[0] == 1)
        if mode == "selected":
            plan = self.selected_plan(idx, x.shape[0], channels_last, selection)
            if len(plan.leaves) > 1:
                y = _RouteBlock.apply(self.apply_selected(x, plan, channels_last), scores, idx, self, plan.flat,
                                      channels_last, selection)
                return self._finish(y, scores, routing_scores, idx)
            mode = "used"  # one leaf: the used experts on the whole grid, which that path computes faster
        if mode == "used":
            if selection is None:
                experts, local_idx = self._used_experts(idx)
            else:  # once per gate and step: the layers sharing the gate share it
                experts, local_idx = selection.memo(("used", self.num_experts), lambda: self._used_experts(idx))
            if experts.numel() == self.num_experts:
                experts = local_idx = None
                flat = None if selection is None else selection.flat
            else:  # the gate's flat index is for all |E| experts: index the block of the n used ones
                flat = None if selection is None else selection.memo(
                    ("used_flat", self.num_experts, self.out_per_expert, channels_last),
                    lambda: flat_slot_index(local_idx[0], experts.numel(), self.out_per_expert, channels_last))
        elif selection is not None:
            flat = selection.flat
        expert_out = self.apply_experts(x, channels_last, experts)
        y = _RouteExperts.apply(expert_out, scores, idx, self, flat, channels_last, local_idx,
                                selection)  # (B, E, F, H, W)
        return self._finish(y, scores, routing_scores, idx)

    def _finish(self, y: torch.Tensor, scores: torch.Tensor, routing_scores: torch.Tensor,
                idx: torch.Tensor) -> torch.Tensor:
        """Gate weighting, auxiliary losses, and the slots (B, E, F, H, W) → the output (B, E·F, H, W)."""
        if self.weighted:
            weight_source = scores if self.gate_gets_task_grad else scores.detach()
            weights = weight_source.gather(1, idx).unsqueeze(2)  # (G, E, 1, H, W)
            y = y * weights.to(y.dtype)
        self.aux_loss = self._aux_losses(scores, routing_scores, idx) if self.aux_losses and self.training else None
        b, _, _, h, w = y.shape
        return y.reshape(b, self.out_channels, h, w)  # a view in both layouts

    def _aux_losses(self, scores: torch.Tensor, routing_scores: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        """Paper App. C.1: importance / load / spatial agreement, equally weighted (scaled by the caller)."""
        sparse = torch.zeros_like(scores).scatter(1, idx, scores.gather(1, idx))  # top-E gate G(x)
        terms = []
        if "importance" in self.aux_losses:
            importance = sparse.sum(dim=(0, 2, 3))
            terms.append((importance.std() / importance.mean().clamp_min(1e-9)) ** 2)
        if "load" in self.aux_losses and self.noise > 0:
            std = self.noise / math.sqrt(self.num_experts)
            threshold = routing_scores.detach().topk(self.num_selected, dim=1).values[:, -1:]
            # validate_args=False: the validation branches on tensor values (a host sync on CUDA)
            p = 1.0 - torch.distributions.Normal(0.0, std, validate_args=False).cdf(threshold - scores)
            load = p.sum(dim=(0, 2, 3))
            terms.append((load.std() / load.mean().clamp_min(1e-9)) ** 2)
        if "spatial_agreement" in self.aux_losses and sparse.shape[0] > 1:
            terms.append(sparse.std(dim=0).mean(dim=(1, 2)).sum())
        if not terms:
            return scores.new_zeros(())
        return torch.stack(terms).sum()


def smoe_layers(model: nn.Module) -> list[SpatialMoE2d]:
    """All SMoE layers of a model."""
    return [m for m in model.modules() if isinstance(m, SpatialMoE2d)]


def routing_loss(model: nn.Module, aux_weight: float = 0.01) -> torch.Tensor:
    """The loss term a training loop adds for the SMoE layers of ``model`` (after its forward).

    The RC loss itself is applied inside backward (see module docstring); this returns the auxiliary
    routing losses of App. C.1 × ``aux_weight`` (0 when none are configured).
    """
    terms = [m.aux_loss for m in smoe_layers(model) if m.aux_loss is not None]
    if not terms:
        p = next(model.parameters(), None)
        return torch.zeros((), device=p.device if p is not None else None)
    return aux_weight * torch.stack(terms).sum()


def rc_loss_value(model: nn.Module) -> torch.Tensor | None:
    """Sum of the RC losses of the last backward over all SMoE layers (for logging), or None."""
    values = [m.last_rc_loss for m in smoe_layers(model) if m.last_rc_loss is not None]
    return torch.stack(values).sum() if values else None


def set_loss_scale(model: nn.Module, scale: float) -> None:
    """Tell every SMoE layer the current loss scale (fp16 GradScaler), so RC gate gradients are scaled too."""
    for m in smoe_layers(model):
        m.loss_scale = float(scale)
