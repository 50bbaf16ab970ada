"""The autograd Functions of the SMoE layer's routing: the forward gathers the selected experts' outputs
(all experts computed, :class:`_RouteExperts`, or the leaf outputs of a selected-experts plan, :class:`_RouteBlock`);
the backward (:func:`_routing_backward`) applies expert damping and injects the RC loss gradient into the gate,
from the error signal dL/dy arriving at the layer (see :mod:`smoeweather.nn.smoe` for the design). Their
``layer`` argument is the :class:`~smoeweather.nn.smoe.SpatialMoE2d` (typed ``nn.Module`` here: that module
imports this one).
"""

from __future__ import annotations

from functools import partial
from typing import Any

import torch

from smoeweather.nn.gates import Selection, flat_expert_index, flat_expert_index_channels_last
from smoeweather.nn.misrouting import (
    _count_batch,
    _rc_loss_sums,
    _selection_rc_loss,
    _sum_slot_channels,
    batch_flagged_fraction_cpu,
    damping_factor,
    flagged_fraction,
    label_information,
    quantile_threshold,
    rc_gate_gradient,
    rc_loss_mean,
)

# (B, E, F, H, W) <-> (B, H, W, E, F): the permutation is its own inverse
_TO_CHANNELS_LAST = (0, 3, 4, 1, 2)


def _routing_backward(ctx: Any, grad_y: torch.Tensor, scores: torch.Tensor, idx: torch.Tensor, need_slots: bool,
                      need_scores: bool) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """The backward shared by the routing Functions. ``grad_y``: dL/dy (B, E, F, H, W); ``ctx``: ``layer``,
    ``channels_last``, ``selection``. Returns dL/dy in the memory layout of ``ctx.channels_last``, the damped
    slot gradient (``need_slots``, else None) and the gate's gradient: RC loss, straight-through (``need_scores``)."""
    layer = ctx.layer  # the SpatialMoE2d
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
                layer: torch.nn.Module, flat: torch.Tensor | None = None, channels_last: bool = False,
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
    def forward(ctx, block: torch.Tensor, scores: torch.Tensor, idx: torch.Tensor, layer: torch.nn.Module,
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
