"""The SMoE layer: routing, RC labels, damping, gate gradients, sharing, priors, mixed precision."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import float_tol
from torch import nn

from smoeweather.nn import (
    SpatialMoE2d,
    TensorRoutingGate,
    misrouted_mask,
    rc_loss_value,
    routing_labels,
    routing_loss,
    set_loss_scale,
    smoe_layers,
)


def _layer_1x1(weights: list[float], gate: torch.Tensor, **kw) -> SpatialMoE2d:
    """|E| experts with 1×1 kernels on a 1-channel input, gate fixed to ``gate`` (|E|, H, W)."""
    e, h, w = gate.shape
    layer = SpatialMoE2d(1, e, kw.pop("num_selected", 1), grid=(h, w), kernel_size=1, **kw)
    with torch.no_grad():
        layer.experts.weight.copy_(torch.tensor(weights).view(e, 1, 1, 1))
        layer.gate.weight.copy_(gate)
    return layer


def test_routing_labels_hand_computed() -> None:
    # |E| = 4, E = 2, one pixel: selected experts 2 (correct) and 0 (wrong) -> unselected 1, 3 get 1/2.
    idx = torch.tensor([2, 0]).view(1, 2, 1, 1)
    wrong = torch.tensor([0.0, 1.0]).view(1, 2, 1, 1)
    labels = routing_labels(wrong, idx, num_experts=4)
    torch.testing.assert_close(labels.flatten(), torch.tensor([0.0, 0.5, 1.0, 0.5]))
    # both wrong: unselected get 2/(4-2) = 1 each, selected 0.
    labels = routing_labels(torch.ones(1, 2, 1, 1), idx, num_experts=4)
    torch.testing.assert_close(labels.flatten(), torch.tensor([0.0, 1.0, 0.0, 1.0]))
    # all correct: selected 1, unselected 0.
    labels = routing_labels(torch.zeros(1, 2, 1, 1), idx, num_experts=4)
    torch.testing.assert_close(labels.flatten(), torch.tensor([1.0, 0.0, 1.0, 0.0]))


def test_misrouted_mask_is_the_upper_quantile_per_sample() -> None:
    error = torch.stack([torch.arange(10.0), 100 + torch.arange(10.0)]).view(2, 1, 1, 10)
    wrong = misrouted_mask(error, quantile=0.7)
    # q = 0.7 over 10 values: threshold is the 7th smallest, so the 3 largest of EACH sample are wrong.
    assert wrong.sum(-1).flatten().tolist() == [3, 3]
    assert wrong[0, 0, 0, 7:].all() and not wrong[0, 0, 0, :7].any()
    # the reference README's reading, q = 0.3: 7 of 10 flagged.
    assert misrouted_mask(error, quantile=0.3).sum().item() == 14


def test_forward_selects_top_expert_per_location_in_score_order() -> None:
    gate = torch.tensor([[[3.0, 0.0]], [[1.0, 2.0]], [[2.0, 1.0]]])  # (|E|=3, H=1, W=2)
    layer = _layer_1x1([10.0, 20.0, 30.0], gate, num_selected=2, rc=False, damping=None)
    y = layer(torch.ones(1, 1, 1, 2))
    # pixel 0: scores (3, 1, 2) -> experts 0, 2 ; pixel 1: scores (0, 2, 1) -> experts 1, 2
    assert y.shape == (1, 2, 1, 2)
    torch.testing.assert_close(y[0, :, 0, 0], torch.tensor([10.0, 30.0]))
    torch.testing.assert_close(y[0, :, 0, 1], torch.tensor([20.0, 30.0]))


def test_weighted_output_is_scaled_by_gate_value() -> None:
    gate = torch.tensor([[[3.0, 0.0]], [[1.0, 2.0]], [[2.0, 1.0]]])
    layer = _layer_1x1([10.0, 20.0, 30.0], gate, weighted=True, rc=False, damping=None)
    y = layer(torch.ones(1, 1, 1, 2))
    torch.testing.assert_close(y.flatten(), torch.tensor([10.0 * 3.0, 20.0 * 2.0]))


def test_damping_and_rc_gradients_hand_computed() -> None:
    # 4 pixels, |E| = 2, E = 1; pixels 0, 1 route to expert 0, pixels 2, 3 to expert 1.
    gate = torch.tensor([[[1.0, 1.0, -1.0, -1.0]], [[-1.0, -1.0, 1.0, 1.0]]])
    layer = _layer_1x1([1.0, 2.0], gate, damping=0.1, quantile=0.75)
    x = torch.tensor([1.0, 2.0, 3.0, 4.0]).view(1, 1, 1, 4)
    y = layer(x)
    g = torch.tensor([1.0, -2.0, 0.5, 8.0])  # dL/dy; largest |g| (pixel 3) is above the 0.75-quantile
    (y.flatten() * g).sum().backward()
    # expert 0 sees pixels 0, 1 (correct): dW0 = 1·1 + (-2)·2 = -3
    # expert 1 sees pixel 2 (correct) and pixel 3 (wrong, damped ×0.1): dW1 = 0.5·3 + 0.1·8·4 = 4.7
    torch.testing.assert_close(layer.experts.weight.grad.flatten(), torch.tensor([-3.0, 4.7]))
    # RC labels: selected correct -> 1; pixel 3: selected expert 1 wrong -> 0, unselected expert 0 -> 1/(2-1)
    labels = torch.tensor([[[1.0, 1.0, 0.0, 1.0]], [[0.0, 0.0, 1.0, 0.0]]])
    expected = (torch.sigmoid(gate) - labels) / labels.numel()
    torch.testing.assert_close(layer.gate.weight.grad, expected)
    bce = nn.functional.binary_cross_entropy_with_logits(gate, labels)
    torch.testing.assert_close(rc_loss_value(layer), bce)


def test_gate_gets_no_task_gradient_with_rc_and_straight_through_without() -> None:
    gate = torch.tensor([[[1.0, -1.0]], [[-1.0, 1.0]]])
    x = torch.tensor([1.0, 2.0]).view(1, 1, 1, 2)
    g = torch.tensor([3.0, -5.0])

    def gate_grad(**kw) -> torch.Tensor:
        layer = _layer_1x1([1.0, 2.0], gate, **kw)
        (layer(x).flatten() * g).sum().backward()
        return layer.gate.weight.grad

    rc_only = gate_grad(rc=True, damping=None, quantile=1.0)  # q = 1: nothing flagged wrong
    labels = torch.tensor([[[1.0, 0.0]], [[0.0, 1.0]]])
    torch.testing.assert_close(rc_only, (torch.sigmoid(gate) - labels) / 4)
    # without RC: straight-through, dL/dy scattered to the selected expert's score
    straight = gate_grad(rc=False, damping=None)
    torch.testing.assert_close(straight, torch.tensor([[[3.0, 0.0]], [[0.0, -5.0]]]))
    # both on request
    both = gate_grad(rc=True, damping=None, quantile=1.0, gate_task_grad=True)
    torch.testing.assert_close(both, rc_only + straight)


def test_batch_shared_routing_gives_mean_bce_gradient() -> None:
    """G = 1 (tensor gate) with B samples equals the mean BCE over B·|E|·H·W with per-sample labels."""
    torch.manual_seed(1)
    layer = SpatialMoE2d(2, 4, 2, grid=(3, 5), damping=None)
    x = torch.randn(6, 2, 3, 5)
    target = torch.randn(6, 2, 3, 5)
    nn.functional.mse_loss(layer(x), target).backward()
    # recompute by hand: per-sample flags from the error signal, labels per sample, BCE mean
    with torch.no_grad():
        scores = layer.gate.weight.unsqueeze(0)
        idx = scores.topk(2, dim=1).indices
        y = layer(x)
        signal = (2.0 / y.numel()) * (y - target)
        wrong = misrouted_mask(signal.abs() * (signal.numel() / 2), layer.quantile, layer.tolerance).float()
        labels = torch.cat([routing_labels(wrong[i: i + 1], idx, 4) for i in range(6)])
    z = layer.gate.weight.detach().clone().requires_grad_()
    nn.functional.binary_cross_entropy_with_logits(z.unsqueeze(0).expand(6, -1, -1, -1), labels).backward()
    # float32: the batch-shared gradient sums B = 6 per-sample terms of size ≤ 1/N (sigmoid − label)/N
    tol = float_tol(torch.float32, 6 + 4, scale=1 / labels.numel())
    torch.testing.assert_close(layer.gate.weight.grad, z.grad, **tol)


def test_gate_init_bound_and_prior() -> None:
    gate = TensorRoutingGate(256, 32, 64, num_selected=128)
    b = math.sqrt(3 * 256 / 128)
    assert gate.weight.abs().max() <= b and gate.weight.abs().max() > 0.9 * b
    prior = torch.zeros(32, 64, dtype=torch.long)
    prior[:, 32:] = 1  # "land" in the eastern half
    gate = TensorRoutingGate(256, 32, 64, num_selected=128, prior=prior, prior_strength=1.0)
    top = gate.weight.topk(128, dim=0).indices  # (128, H, W)
    assert (top[:, :, :32] < 128).all(), "sea points must select the first half of the experts"
    assert (top[:, :, 32:] >= 128).all(), "land points must select the second half"
    with pytest.raises(ValueError, match="expected \\(H, W\\)"):
        TensorRoutingGate(4, 8, 8, prior=torch.zeros(4, 4, dtype=torch.long))


def test_shared_gate_accumulates_rc_from_every_layer() -> None:
    torch.manual_seed(2)
    gate = TensorRoutingGate(4, 6, 6, num_selected=2)
    net = nn.Sequential(SpatialMoE2d(1, 4, 2, gate=gate), nn.ReLU(), SpatialMoE2d(2, 4, 2, gate=gate))
    assert net[0].gate is net[2].gate and len({id(p) for p in net.parameters()}) == 3
    x, target = torch.randn(4, 1, 6, 6), torch.randn(4, 2, 6, 6)
    nn.functional.mse_loss(net(x), target).backward()
    total = gate.weight.grad.clone()
    # each layer's contribution: (sigmoid(D) - labels_layer)/N, so the sum has 2·sigmoid(D) in it
    assert net[0].last_rc_loss is not None and net[2].last_rc_loss is not None
    assert not torch.allclose(total, torch.zeros_like(total))
    # share is by identity: a gate grid mismatch is refused
    with pytest.raises(ValueError, match="6x6 grid"):
        SpatialMoE2d(1, 4, 2, gate=gate)(torch.randn(1, 1, 5, 5))


def test_deep_smoe_network_trains_with_one_backward() -> None:
    torch.manual_seed(3)
    gate = TensorRoutingGate(6, 8, 8, num_selected=3)
    net = nn.Sequential(
        SpatialMoE2d(2, 6, 3, gate=gate), nn.ReLU(),
        SpatialMoE2d(3, 6, 3, gate=gate), nn.ReLU(),
        SpatialMoE2d(3, 4, 1, grid=(8, 8), padding="periodic_lon"),
    )
    x = torch.randn(16, 2, 8, 8)
    target = 0.5 * x[:, :1] - 0.2 * x[:, 1:]
    opt = torch.optim.Adam(net.parameters(), lr=1e-2)
    losses = []
    for _ in range(30):
        opt.zero_grad()
        loss = nn.functional.mse_loss(net(x), target) + routing_loss(net)
        loss.backward()  # the only backward: RC and damping of all three layers happen in it
        opt.step()
        losses.append(loss.item())
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in net.parameters())
    assert all(layer.last_rc_loss is not None for layer in smoe_layers(net))
    assert losses[-1] < 0.85 * losses[0]


def test_loss_scale_keeps_gate_gradient_consistent() -> None:
    torch.manual_seed(4)
    x, target = torch.randn(3, 1, 5, 5), torch.randn(3, 1, 5, 5)

    def grads(scale: float) -> tuple[torch.Tensor, torch.Tensor]:
        torch.manual_seed(5)
        layer = SpatialMoE2d(1, 3, 1, grid=(5, 5))
        set_loss_scale(layer, scale)
        (scale * nn.functional.mse_loss(layer(x), target)).backward()
        return layer.gate.weight.grad, layer.experts.weight.grad

    gate1, exp1 = grads(1.0)
    gate_s, exp_s = grads(1024.0)
    torch.testing.assert_close(gate_s / 1024.0, gate1)
    torch.testing.assert_close(exp_s / 1024.0, exp1)


def test_bf16_autocast_trains() -> None:
    layer = SpatialMoE2d(2, 4, 2, grid=(6, 6))
    x, target = torch.randn(2, 2, 6, 6), torch.randn(2, 2, 6, 6)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = layer(x)
        loss = nn.functional.mse_loss(y.float(), target)
    loss.backward()
    assert torch.isfinite(layer.gate.weight.grad).all() and layer.gate.weight.grad.abs().sum() > 0
    assert torch.isfinite(layer.experts.weight.grad).all()


def test_aux_losses_and_noise() -> None:
    layer = SpatialMoE2d(1, 4, 1, grid=(6, 6), noise=1.0, aux_losses=("importance", "load", "spatial_agreement"))
    layer.train()
    layer(torch.randn(2, 1, 6, 6))
    aux = routing_loss(layer, aux_weight=0.01)
    assert aux.ndim == 0 and torch.isfinite(aux) and aux >= 0
    aux.backward()
    assert layer.gate.weight.grad is not None
    layer.eval()
    layer(torch.randn(2, 1, 6, 6))
    assert layer.aux_loss is None  # auxiliary losses only in training
    with pytest.raises(ValueError, match="unknown aux_losses"):
        SpatialMoE2d(1, 4, 1, grid=(6, 6), aux_losses=("bogus",))


def test_frozen_gate_is_fixed() -> None:
    gate = TensorRoutingGate(3, 4, 4, frozen=True)
    layer = SpatialMoE2d(1, 3, 1, gate=gate)
    before = gate.weight.clone()
    nn.functional.mse_loss(layer(torch.randn(2, 1, 4, 4)), torch.randn(2, 1, 4, 4)).backward()
    assert gate.weight.grad is None and torch.equal(before, gate.weight)
    assert layer.experts.weight.grad is not None


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [({"num_selected": 5}, "num_selected"), ({"quantile": 0.0}, "quantile"),
     ({"gate_norm": "sigmoid"}, "gate_norm"), ({"padding": "reflect"}, "padding")],
)
def test_bad_options_are_named(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        SpatialMoE2d(1, 4, grid=(4, 4), **kwargs)


def test_periodic_longitude_padding_of_experts() -> None:
    from smoeweather.nn import pad_periodic_lon

    layer = SpatialMoE2d(2, 3, 1, grid=(5, 7), padding="periodic_lon")
    x = torch.randn(2, 2, 5, 7)
    expected = nn.functional.conv2d(pad_periodic_lon(x, 1), layer.experts.weight).detach()
    tol = float_tol(torch.float32, 2 * 3 * 3, scale=expected)  # 18-term accumulations
    torch.testing.assert_close(layer.apply_experts(x).flatten(1, 2), expected, **tol)
    zeros = SpatialMoE2d(2, 3, 1, grid=(5, 7))
    zeros.experts.weight.data.copy_(layer.experts.weight.data)
    torch.testing.assert_close(zeros.apply_experts(x).flatten(1, 2),
                               nn.functional.conv2d(x, layer.experts.weight, padding=1), **tol)


class _PerSampleGate(nn.Module):
    """The same routing tensor, but returned per sample (G = B): exercises the general gather path."""

    def __init__(self, gate: TensorRoutingGate) -> None:
        super().__init__()
        self.gate = gate

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.gate(x).expand(x.shape[0], -1, -1, -1)


@pytest.mark.parametrize("out_per_expert", [1, 2])
def test_shared_routing_fast_path_equals_per_sample_gather(out_per_expert: int) -> None:
    torch.manual_seed(6)
    gate = TensorRoutingGate(5, 4, 6, num_selected=2, out_per_expert=out_per_expert)
    fast = SpatialMoE2d(3, 5, 2, gate=gate, out_per_expert=out_per_expert, rc=False, damping=0.1)
    slow = SpatialMoE2d(3, 5, 2, gate=_PerSampleGate(gate), out_per_expert=out_per_expert, rc=False, damping=0.1)
    slow.experts.weight.data.copy_(fast.experts.weight.data)
    x, target = torch.randn(3, 3, 4, 6), torch.randn(3, 2 * out_per_expert, 4, 6)
    grads = []
    for layer in (fast, slow):
        y = layer(x)
        nn.functional.mse_loss(y, target).backward()
        grads.append((y.detach(), layer.experts.weight.grad.clone()))
    torch.testing.assert_close(grads[0][0], grads[1][0])
    torch.testing.assert_close(grads[0][1], grads[1][1])


def test_quantile_of_large_samples_is_close_to_exact() -> None:
    from smoeweather.nn.smoe import quantile_threshold

    error = torch.rand(2, 4, 128, 256)  # 131,072 values per sample: strided subsample
    approx = quantile_threshold(error, 0.3).flatten()
    exact = error.reshape(2, -1).quantile(0.3, dim=1)
    torch.testing.assert_close(approx, exact, atol=5e-3, rtol=0)


def test_cached_selection_follows_gate_updates() -> None:
    gate = TensorRoutingGate(3, 1, 2)
    layer = SpatialMoE2d(1, 3, 1, gate=gate, kernel_size=1, rc=False, damping=None)
    with torch.no_grad():
        gate.weight.copy_(torch.tensor([[[1.0, 0.0]], [[0.0, 1.0]], [[-1.0, -1.0]]]))
        layer.experts.weight.copy_(torch.tensor([1.0, 2.0, 3.0]).view(3, 1, 1, 1))
    x = torch.ones(1, 1, 1, 2)
    assert layer(x).flatten().tolist() == [1.0, 2.0]
    opt = torch.optim.SGD([gate.weight], lr=1.0)
    gate.weight.grad = torch.tensor([[[0.0, 0.0]], [[0.0, 0.0]], [[-5.0, -5.0]]])
    opt.step()  # expert 2 now wins everywhere
    assert layer(x).flatten().tolist() == [3.0, 3.0]


@pytest.mark.parametrize("update", ["fused_adam", "foreach_adam", "data_copy"])
def test_selection_follows_updates_that_do_not_bump_the_version(update: str) -> None:
    """Fused/foreach Adam and ``.data.copy_()`` change D without bumping ``weight._version``; a cache keyed on
    the version kept the old routing."""
    gate = TensorRoutingGate(3, 1, 2)
    layer = SpatialMoE2d(1, 3, 1, gate=gate, kernel_size=1, rc=False, damping=None)
    with torch.no_grad():
        gate.weight.copy_(torch.tensor([[[1.0, 0.0]], [[0.0, 1.0]], [[-1.0, -1.0]]]))
        layer.experts.weight.copy_(torch.tensor([1.0, 2.0, 3.0]).view(3, 1, 1, 1))
    x = torch.ones(1, 1, 1, 2)
    assert layer(x).flatten().tolist() == [1.0, 2.0]
    if update == "data_copy":
        gate.weight.data.copy_(torch.tensor([[[-1.0, -1.0]], [[0.0, 1.0]], [[1.0, 0.0]]]))
        expected = [3.0, 2.0]
    else:
        opt = torch.optim.Adam([gate.weight], lr=3.0, **{update.split("_")[0]: True})
        gate.weight.grad = torch.tensor([[[1.0, 1.0]], [[1.0, 1.0]], [[-1.0, -1.0]]])
        opt.step()  # Adam's first step moves every score by lr·sign(grad): expert 2 now wins everywhere
        expected = [3.0, 3.0]
    assert layer(x).flatten().tolist() == expected
