"""SMoE routing memos and the RC chain: the gate's selection cache follows every weight update, the shared gate's
memo equals the per-layer computation, training with selection reuse (and with the numpy flag chain) is bitwise
training without, the RC gradient and loss need no label tensor, and the logged RC values are the step's.
(The routing implementations and the host-sync checks: test_smoe_fastpath.py.)"""

from __future__ import annotations

import math

import pytest
import torch
from conftest import float_tol
from torch import nn
from torch.nn import functional as F

from smoeweather.nn import SpatialMoE2d, TensorRoutingGate, misrouting, smoe_autograd
from smoeweather.nn import smoe as smoe_module
from smoeweather.nn.smoe import quantile_threshold


def _fresh_top(gate: TensorRoutingGate, k: int) -> torch.Tensor:
    return gate.weight.detach().topk(k, dim=0, sorted=True).indices


@pytest.mark.parametrize("update", ["adam_foreach", "adam_fused", "data_copy", "load_state_dict"])
def test_gate_selection_cache_follows_every_weight_update(update: str) -> None:
    """Speed: the layers sharing a gate select once per step (the cached selection is the same
    object until the weight changes), and the cache is keyed on the weight's VALUES, so every update is seen
    on the next call, including those that do not bump the version counter (``.data.copy_``; foreach Adam
    did not in earlier torch releases)."""
    torch.manual_seed(0)
    gate = TensorRoutingGate(8, 4, 6, num_selected=3, init="uniform")
    first = gate.selection(3)
    assert gate.selection(3) is first  # the second layer of the step: no new top-k
    assert torch.equal(first.idx[0], _fresh_top(gate, 3))
    assert gate.selection(3, channels_last=True) is not first  # another layout: its own flat index
    version = gate.weight._version
    if update.startswith("adam"):
        opt = torch.optim.Adam([gate.weight], lr=1.0, **{update.split("_")[1]: True})
        gate.weight.grad = torch.randn_like(gate.weight)
        opt.step()
    elif update == "data_copy":
        gate.weight.data.copy_(torch.randn_like(gate.weight))
    else:
        gate.load_state_dict({"weight": torch.randn_like(gate.weight)})
    if update == "data_copy":
        assert gate.weight._version == version  # the counter did not move: a version-keyed cache would be stale
    second = gate.selection(3)
    assert second is not first
    assert torch.equal(second.idx[0], _fresh_top(gate, 3))
    assert not torch.equal(second.idx, first.idx)


def test_shared_gate_memo_is_bitwise_the_per_layer_computation(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two SMoE layers sharing one gate reuse its selection, used experts, flat index and the RC loss's
    sigmoid/softplus; every output, gradient and RC loss is bitwise what each layer computing its own gives."""
    h, w = 6, 8
    prior = (torch.arange(h * w).view(h, w) % 3 == 0).long()
    results = []
    uncached = TensorRoutingGate.selection

    def fresh(self: TensorRoutingGate, *args, **kwargs):
        self._snapshot = None  # drop the cache: every call selects (and memoises) anew
        return uncached(self, *args, **kwargs)

    for cached in (True, False):
        if not cached:
            monkeypatch.setattr(TensorRoutingGate, "selection", fresh)
        torch.manual_seed(3)
        gate = TensorRoutingGate(8, h, w, num_selected=2, prior=prior, init="coherent")
        net = nn.Sequential(SpatialMoE2d(3, 8, 2, gate=gate, damping=None), nn.ReLU(),
                            SpatialMoE2d(2, 8, 2, gate=gate, damping=None))
        x = torch.randn(4, 3, h, w)
        y = net(x)
        y.backward(torch.randn(4, 2, h, w, generator=torch.Generator().manual_seed(5)))
        results.append([y.detach(), net[0].last_rc_loss, net[2].last_rc_loss,
                        *[p.grad.clone() for p in net.parameters()]])
    for a, b in zip(*results, strict=True):
        assert torch.equal(a, b)


def test_gate_selection_cache_survives_inference_mode_between_steps() -> None:
    """Lightning validates under ``torch.inference_mode``; a selection cached there would hand the next
    training step inference tensors, which autograd cannot save for backward. Validation, then a training
    step with the same weights, must work and give the gradients of a layer that never ran in inference."""
    grads = []
    for validate_first in (True, False):
        torch.manual_seed(4)
        gate = TensorRoutingGate(8, 4, 6, num_selected=2, init="coherent",
                                 prior=(torch.arange(24).view(4, 6) % 2).long())
        layer = SpatialMoE2d(3, 8, 2, gate=gate, damping=None)
        x = torch.randn(2, 3, 4, 6)
        if validate_first:
            with torch.inference_mode():
                layer(x)
        layer(x).square().sum().backward()
        grads.append([p.grad.clone() for p in layer.parameters()])
    for a, b in zip(*grads, strict=True):
        assert torch.equal(a, b)


def test_selection_memo_survives_an_update_that_keeps_the_selection() -> None:
    """After a small weight update that leaves every location's sorted top-k as it was, the gate hands out a
    new Selection with the same indices and selection memo, and an empty value memo (sigmoid/softplus of the
    old scores must not be reused)."""
    torch.manual_seed(2)
    gate = TensorRoutingGate(8, 4, 6, num_selected=3, init="coherent",
                             prior=(torch.arange(24).view(4, 6) % 2).long())
    first = gate.selection(3)
    used = first.memo("used", lambda: object())
    first.memo("sigmoid", lambda: torch.sigmoid(gate.weight), values=True)
    with torch.no_grad():
        gate.weight.add_(1e-4)
    second = gate.selection(3)
    assert second is not first and second.idx is first.idx and second.flat is first.flat
    assert second.memo("used", lambda: None) is used
    assert "sigmoid" not in second.value_derived


def _small_smoe_unet() -> tuple[nn.Module, torch.optim.Optimizer, torch.Tensor, torch.Tensor]:
    """A seeded two-level SMoE-U-Net (shared gates, RC, land-sea prior, no damping), Adam with a high learning rate
    (so that routing changes on the way) and one fixed batch (x, y) on a 16 × 32 grid."""
    from smoeweather.models.unet import PostprocessingUNet

    prior = torch.zeros(16, 32)
    prior[3:10, 4:14] = 1.0
    torch.manual_seed(0)
    net = PostprocessingUNet(3, levels=2, widths=(4, 8), smoe=True, grid=(16, 32), land_sea_prior=prior,
                             damping=None)
    opt = torch.optim.Adam(net.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(1)
    return net, opt, torch.randn(4, 3, 16, 32, generator=g), torch.randn(4, 2, 16, 32, generator=g)


def test_training_with_selection_reuse_is_bitwise_training_without() -> None:
    """The SMoE-U-Net (shared gates, RC, land-sea prior) trains 15 Adam steps with a high gate learning rate, so
    routing changes on the way; reusing the selection memo across steps whose selection did not change gives
    every loss and final weight bitwise as recomputing everything each step."""
    runs = []
    for reuse in (True, False):
        net, opt, x, y = _small_smoe_unet()
        losses, changed = [], 0
        for _ in range(15):
            if not reuse:
                for gate in net.gates.values():
                    gate._previous, gate._selections, gate._snapshot = {}, {}, None
            layers = smoe_module.smoe_layers(net)
            before = [layer.gate.weight.detach().topk(layer.num_selected, dim=0).indices for layer in layers]
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(net(x), y)
            loss.backward()
            opt.step()
            losses.append(loss.detach())
            changed += sum(not torch.equal(idx, layer.gate.weight.detach().topk(layer.num_selected, dim=0).indices)
                           for idx, layer in zip(before, layers, strict=True))
        runs.append((losses, [p.detach().clone() for p in net.parameters()], changed))
    assert runs[0][2] > 0  # the routing did change during the run
    for a, b in zip(runs[0][0] + runs[0][1], runs[1][0] + runs[1][1], strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("g", [1, 3])
def test_rc_gradient_and_loss_without_a_label_tensor(g: int) -> None:
    """Speed: the gate gradient built without the (G, |E|, H, W) label tensor is bitwise
    sigmoid − routing_labels, and the RC loss value from per-gate sums is the BCE-with-logits of those
    labels (torch's own) to float32 summation tolerance."""
    from smoeweather.nn.gates import flat_expert_index
    from smoeweather.nn.smoe import rc_gate_gradient, rc_loss_mean, routing_labels

    torch.manual_seed(9)
    num_experts, e, h, w = 12, 4, 9, 14
    z = torch.randn(g, num_experts, h, w) * 3
    idx = z.topk(e, dim=1).indices
    wrong = torch.randint(0, 9, (g, e, h, w)).float() / 8  # batch-averaged flags, k/8
    labels = routing_labels(wrong, idx, num_experts)
    assert torch.equal(rc_gate_gradient(torch.sigmoid(z), wrong, idx, num_experts), torch.sigmoid(z) - labels)
    if g == 1:  # the flat-index path moves the same values
        flat = flat_expert_index(idx[0], 1)
        assert torch.equal(rc_gate_gradient(torch.sigmoid(z), wrong, idx, num_experts, flat), torch.sigmoid(z) - labels)
    value = rc_loss_mean(F.softplus(z).sum(), z.sum(1, keepdim=True), z.gather(1, idx), wrong, idx, num_experts,
                         z.numel())
    reference = F.binary_cross_entropy_with_logits(z, labels)
    # sums of n = G·|E|·H·W terms of magnitude ≤ |z| + log 2 each (the two sides sum in different orders)
    scale = float((F.softplus(z) + (labels * z).abs()).mean())
    torch.testing.assert_close(value, reference, **float_tol(torch.float32, z.numel(), scale=scale))


def test_logged_rc_values_read_after_the_optimizer_step_are_those_of_the_step() -> None:
    """The logged RC loss, flagged fraction and label information are computed when first read, from the gate's
    snapshot of its weight: read after ``optimizer.step()`` moved the gate they equal the values read before it,
    and the RC loss is the BCE-with-logits of the step's labels against the step's scores."""
    values = []
    for read_before_step in (True, False):
        torch.manual_seed(6)
        gate = TensorRoutingGate(8, 5, 7, num_selected=3, init="coherent",
                                 prior=(torch.arange(35).view(5, 7) % 3 == 0).long())
        layer = SpatialMoE2d(2, 8, 3, gate=gate, damping=None)
        opt = torch.optim.Adam(layer.parameters(), lr=0.5)
        scores_before = gate.weight.detach().clone()
        torch.nn.functional.mse_loss(layer(torch.randn(4, 2, 5, 7)), torch.randn(4, 3, 5, 7)).backward()
        names = ("last_rc_loss", "last_misrouted_fraction", "last_label_information")
        got = [getattr(layer, name) for name in names] if read_before_step else None
        opt.step()
        assert not torch.equal(gate.weight, scores_before)
        values.append(got or [getattr(layer, name) for name in names])
        # the labels of this step: 1 − wrong at the selected experts, the unselected share elsewhere
        grad_rc = gate.weight.grad[None] * scores_before.numel()  # (sigmoid(z) − labels), RC weight 1, scale 1
        labels = torch.sigmoid(scores_before[None]) - grad_rc
        reference = F.binary_cross_entropy_with_logits(scores_before[None], labels)
        torch.testing.assert_close(values[-1][0], reference, **float_tol(torch.float32, scores_before.numel(), 4.0))
    for a, b in zip(*values, strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_quantile_of_nonnegative_errors_as_integers_is_kthvalue(dtype: torch.dtype) -> None:
    """``nonnegative=True`` selects on the bit patterns as integers: the same value as ``torch.kthvalue`` (and
    the float path) for magnitudes, including exact zeros, ties, subnormals, inf and NaN."""
    g = torch.Generator().manual_seed(3)
    error = (torch.randn(4, 3, 20, 30, generator=g, dtype=dtype).abs() * 1e-6)
    error[0, 0, :5] = 0.0
    error[1, :, 3] = error[1, 0, 3, 0]  # ties
    error[2, 0, 0, :4] = torch.tensor([1e-40, 5e-45, float("inf"), float("nan")], dtype=dtype)
    for q in (0.001, 0.3, 0.7, 1.0):
        k = min(max(math.ceil(q * error[0].numel()), 1), error[0].numel())
        expected = error.reshape(4, -1).kthvalue(k, dim=1).values.view(4, 1, 1, 1)
        fast = quantile_threshold(error, q, nonnegative=True)
        torch.testing.assert_close(fast, quantile_threshold(error, q), rtol=0, atol=0, equal_nan=True)
        torch.testing.assert_close(fast, expected, rtol=0, atol=0, equal_nan=True)


def _general_batch_fraction(grad_y: torch.Tensor, quantile: float, tolerance: float) -> torch.Tensor:
    """The general path of the layer's backward: |dL/dy| per slot, per-sample quantile, flags, batch count."""
    error = misrouting._sum_slot_channels(grad_y, absolute=True)
    wrong = error > quantile_threshold(error, quantile, nonnegative=True) + tolerance
    return misrouting._count_batch(wrong).div_(grad_y.shape[0]).contiguous()


def test_batch_flagged_fraction_cpu_is_bitwise_the_general_chain() -> None:
    """Speed: the numpy chain of the RC flags (sign bit cleared, integer partition, IEEE comparison,
    uint8 batch count) gives bitwise the general torch chain, with exact zeros, −0.0, ties at the threshold,
    subnormals, inf and NaN in dL/dy, for several quantiles and tolerances; it declines what it does not handle."""
    from smoeweather.nn.smoe import batch_flagged_fraction_cpu

    g = torch.Generator().manual_seed(5)
    grad_y = torch.randn(6, 4, 1, 9, 13, generator=g) * 1e-6
    grad_y[0, 0, 0, :3] = 0.0
    grad_y[0, 1, 0, :3] = -0.0
    grad_y[1, :, 0, 2] = -grad_y[1, 0, 0, 2, 0]  # ties of opposite sign
    grad_y[2, 0, 0, 0, :4] = torch.tensor([1e-40, -5e-45, float("-inf"), float("nan")])
    grad_y[3] = 2.0**-20  # a constant sample: every error at the threshold, none above it
    for quantile in (0.001, 0.3, 0.7, 1.0):
        for tolerance in (0.0, 1e-12, 3e-7):
            fast = batch_flagged_fraction_cpu(grad_y, quantile, tolerance)
            assert fast is not None and fast.shape == (1, 4, 9, 13) and fast.dtype == torch.float32
            assert torch.equal(fast, _general_batch_fraction(grad_y, quantile, tolerance))
    assert 0.0 < float(batch_flagged_fraction_cpu(grad_y, 0.3, 0.0).mean()) < 1.0  # the check can see a difference
    declined = [grad_y.double(), grad_y[:1], grad_y.expand(6, 4, 2, 9, 13).contiguous(),
                grad_y.transpose(3, 4), grad_y.clone().requires_grad_(True), torch.zeros(256, 4, 1, 2, 3)]
    for value in declined:
        assert batch_flagged_fraction_cpu(value, 0.3, 0.0) is None
    # above EXACT_QUANTILE_MAX values per sample (4 · 130 · 140 = 72,800): the strided subsample's quantile
    large = torch.randn(3, 4, 1, 130, 140, generator=g) * 1e-6
    large[0, :, 0, :7] = 0.0
    assert large[0].numel() > misrouting.EXACT_QUANTILE_MAX
    for quantile in (0.3, 0.9):
        fast = batch_flagged_fraction_cpu(large, quantile, 1e-9)
        assert fast is not None and torch.equal(fast, _general_batch_fraction(large, quantile, 1e-9))


def test_training_with_the_numpy_flag_chain_is_bitwise_training_without(monkeypatch: pytest.MonkeyPatch) -> None:
    """The SMoE-U-Net trains the same (every loss and final weight bitwise) with the numpy RC flag chain as with
    the general torch chain, and the chain does run in it."""
    original = smoe_autograd.batch_flagged_fraction_cpu
    runs, used = [], []

    def counted(*args: object) -> torch.Tensor | None:
        result = original(*args)
        used.append(result is not None)
        return result

    for fast in (True, False):
        monkeypatch.setattr(smoe_autograd, "batch_flagged_fraction_cpu", counted if fast else lambda *args: None)
        net, opt, x, y = _small_smoe_unet()
        losses = []
        for _ in range(8):
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(net(x), y)
            loss.backward()
            opt.step()
            losses.append(loss.detach())
        runs.append(losses + [p.detach().clone() for p in net.parameters()])
    assert used and all(used)
    for a, b in zip(*runs, strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("k", [1, 3, 8])
def test_incremental_selection_is_the_full_topk_after_every_update(k: int) -> None:
    """The gate re-ranks only the locations an update may have re-ordered; after each of 60 updates of every
    kind (tiny Adam-like moves, moves across a gap, exact ties on a coarse value grid, NaN and ±inf, a reset of
    single locations) its selection is bitwise ``topk`` of the whole weight. (k = 8 = |E|: no unselected expert.)"""
    g = torch.Generator().manual_seed(11)
    gate = TensorRoutingGate(8, 5, 7, num_selected=min(k, 8), init="coherent")
    with torch.no_grad():
        gate.weight.add_(torch.rand(gate.weight.shape, generator=g) * 1e-3)
    reranked = []
    for step in range(60):
        kind = step % 6
        with torch.no_grad():
            if kind in (0, 1):  # small moves everywhere, as an optimizer step makes
                gate.weight.add_((torch.rand(gate.weight.shape, generator=g) - 0.5) * 1e-3)
            elif kind == 2:  # a large move at a few locations
                mask = torch.rand(gate.weight.shape[1:], generator=g) < 0.2
                gate.weight.add_(torch.randn(gate.weight.shape, generator=g) * mask)
            elif kind == 3:  # values on a coarse grid: many exact ties
                gate.weight.copy_((torch.rand(gate.weight.shape, generator=g) * 4).floor())
            elif kind == 4:  # non-finite values at some locations
                gate.weight[0, 1, 2], gate.weight[3, 0, 0], gate.weight[5, 4, 6] = math.nan, math.inf, -math.inf
            else:  # back to finite, distinct values
                gate.weight.copy_(torch.randn(gate.weight.shape, generator=g))
        top = gate._tops.get(k)
        drift_before = None if top is None else top.drift.clone()
        selection = gate.selection(k)
        assert torch.equal(selection.idx[0], _fresh_top(gate, k)), f"step {step}"
        if drift_before is not None and kind in (0, 1):
            reranked.append(int((gate._tops[k].drift == 0).sum()))
    assert min(reranked) < gate.weight[0].numel()  # some small updates re-ranked only part of the grid


def test_incremental_selection_keeps_the_memo_when_nothing_is_reranked() -> None:
    """A move far smaller than every ranking gap re-ranks nothing: the selection's memo (used experts, flat
    index) carries over to the new weights, which is what makes routing cost one pass per step."""
    torch.manual_seed(2)
    gate = TensorRoutingGate(6, 4, 4, num_selected=2, init="coherent")
    first = gate.selection(2)
    first.memo(("used",), lambda: torch.tensor([1]))
    with torch.no_grad():
        gate.weight.add_(1e-7)
    second = gate.selection(2)
    assert second is not first and second.derived is first.derived
    assert torch.equal(second.idx[0], _fresh_top(gate, 2))
