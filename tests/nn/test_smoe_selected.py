"""The selected-experts path of the SMoE layer (``expert_compute="selected"``, smoeweather/nn/selected.py).

Its leaf partition covers the grid once and computes, per leaf, exactly the experts selected there; the layer's
outputs and gradients (input, every expert weight and bias, the gate) equal the all-experts path to float32
tolerance derived from the summation order (a k×k·C-term sum per output, a B·H·W-term sum per weight gradient),
and the routing's backward (RC labels and loss, damping) is the same code on the same dL/dy, so the gate's
gradient is bitwise equal. The leaf convolutions pass a float64 ``gradcheck``.
"""

from __future__ import annotations

import copy
import io

import numpy as np
import pytest
import torch
from conftest import float_tol
from torch import nn

from smoeweather.models.unet import PostprocessingUNet
from smoeweather.nn import SpatialMoE2d, TensorRoutingGate, smoe_layers
from smoeweather.nn import selected as selected_module
from smoeweather.nn.gates import ConvGate
from smoeweather.nn.selected import LeafConvolutions, build_plan, partition


@pytest.fixture
def every_leaf(monkeypatch: pytest.MonkeyPatch) -> None:
    """No per-leaf overhead: the partition cuts as long as a cut saves any expert·location."""
    monkeypatch.setattr(selected_module, "CALL_OVERHEAD_MACS", 0.0)


def _two_region_prior(h: int, w: int) -> torch.Tensor:
    prior = torch.zeros(h, w, dtype=torch.long)
    prior[2:4, 2:6] = 1  # sides of ≥ 2 (MIN_SIDE) everywhere: the partition can isolate it
    return prior


def test_partition_covers_the_grid_once_with_the_selected_experts() -> None:
    rng = np.random.default_rng(0)
    num_experts, e, h, w = 9, 3, 7, 10
    idx = np.stack([rng.permutation(num_experts)[:e] for _ in range(h * w)], 1).reshape(e, h, w)
    leaves = partition(idx, num_experts, overhead=2.0, min_side=1)
    covered = np.zeros((h, w), dtype=int)
    for top, bottom, left, right, experts in leaves:
        covered[top:bottom, left:right] += 1
        assert set(np.unique(idx[:, top:bottom, left:right])) == set(experts.tolist())
    assert (covered == 1).all()


def test_partition_of_regions_sharing_a_set_is_exact() -> None:
    """Two categories of locations with one expert set each: every leaf holds one set, so the plan computes
    the selected experts' multiply-adds and no more; with a large overhead it is one leaf (the used experts)."""
    h, w, num_experts, e = 8, 12, 8, 2
    prior = _two_region_prior(h, w)
    idx = torch.where(prior.bool(), torch.tensor([5, 6]).view(2, 1, 1), torch.tensor([1, 0]).view(2, 1, 1))
    plan = build_plan(idx, num_experts, 1, fan_in=9, batch=1, overhead_macs=0.0)
    assert plan.macs_per_sample == plan.ideal_macs_per_sample == e * h * w * 9
    assert len(plan.leaves) > 1
    whole = build_plan(idx, num_experts, 1, fan_in=9, batch=1, overhead_macs=1e12)
    assert len(whole.leaves) == 1 and whole.macs_per_sample == 2 * plan.macs_per_sample


def test_leaf_convolutions_gradcheck(every_leaf: None) -> None:
    torch.manual_seed(2)
    h, w, num_experts, f = 4, 5, 4, 2
    idx = torch.rand(num_experts, h, w).topk(1, dim=0).indices
    plan = build_plan(idx, num_experts, f, fan_in=9, batch=1, overhead_macs=0.0)
    assert len(plan.leaves) > 1
    xp = torch.randn(1, 1, h + 2, w + 2, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(num_experts * f, 1, 3, 3, dtype=torch.float64, requires_grad=True)
    bias = torch.randn(num_experts * f, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a, b, c: LeafConvolutions.apply(a, b, c, plan), (xp, weight, bias))


def _layers(c: int, num_experts: int, e: int, f: int, grid: tuple[int, int], padding: str, weighted: bool,
            damping: float | None, bias: bool, prior: torch.Tensor | None) -> dict[str, SpatialMoE2d]:
    layers = {}
    for compute in ("all", "selected"):
        torch.manual_seed(4)
        gate = TensorRoutingGate(num_experts, *grid, num_selected=e, out_per_expert=f, prior=prior,
                                 init="uniform" if prior is None else "coherent")
        layers[compute] = SpatialMoE2d(c, num_experts, e, gate=gate, out_per_expert=f, padding=padding,
                                       weighted=weighted, damping=damping, bias=bias, gate_task_grad=weighted,
                                       expert_compute=compute)
    return layers


def _step(layer: SpatialMoE2d, x: torch.Tensor, grad_out: torch.Tensor) -> dict[str, torch.Tensor]:
    x = x.clone().requires_grad_()
    y = layer(x)
    y.backward(grad_out)
    out = {"y": y.detach(), "x.grad": x.grad}
    out.update({f"{name}.grad": p.grad for name, p in layer.named_parameters()})
    return out


CASES = [  # (C, |E|, E, F, padding, weighted, damping, bias, prior)
    (3, 6, 1, 1, "zeros", False, None, False, False),
    (2, 8, 3, 1, "periodic_lon", False, 0.1, True, True),
    (3, 8, 2, 2, "zeros", True, 0.5, True, True),
    (1, 5, 2, 3, "periodic_lon", False, None, False, False),
]


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("layout", ["planar", "channels_last"])
def test_selected_equals_all_experts(case: tuple, layout: str, every_leaf: None) -> None:
    """Outputs and gradients of the selected path against all experts; unselected experts get exact zeros."""
    c, num_experts, e, f, padding, weighted, damping, bias, use_prior = case
    h, w, b = 6, 9, 3
    prior = _two_region_prior(h, w) if use_prior else None
    layers = _layers(c, num_experts, e, f, (h, w), padding, weighted, damping, bias, prior)
    x = torch.randn(b, c, h, w)
    if layout == "channels_last":
        x = x.contiguous(memory_format=torch.channels_last)
    grad_out = torch.randn(b, e * f, h, w)
    ref, got = (_step(layers[k], x, grad_out) for k in ("all", "selected"))
    plan = layers["selected"].selected_plan(layers["selected"]._last_idx, b, layout == "channels_last", None)
    assert len(plan.leaves) > 1
    assert layers["selected"].resolved_expert_compute(x, shared_routing=True) == "selected"
    sums = {"y": 9 * c + 1, "x.grad": 9 * e * f, "experts.weight.grad": b * h * w, "experts.bias.grad": b * h * w}
    for key, value in ref.items():
        if key == "gate.weight.grad":  # the routing backward on the same dL/dy (straight-through: a sum over B)
            torch.testing.assert_close(got[key], value, **float_tol(torch.float32, b, value))
            continue
        torch.testing.assert_close(got[key], value, **float_tol(torch.float32, sums[key], value))
    selected_anywhere = torch.zeros(num_experts, dtype=torch.bool)
    selected_anywhere[layers["selected"]._last_idx.unique()] = True
    unused = got["experts.weight.grad"][(~selected_anywhere).repeat_interleave(f)]
    assert torch.equal(unused, torch.zeros_like(unused))
    assert (~selected_anywhere).any() == (use_prior and num_experts > 2 * e)  # experts unused anywhere: tested
    assert layers["selected"].last_rc_loss == layers["all"].last_rc_loss


def test_per_sample_routing_falls_back_to_all_experts() -> None:
    torch.manual_seed(5)
    layers = {}
    for compute in ("all", "selected"):
        torch.manual_seed(5)
        layers[compute] = SpatialMoE2d(2, 6, 2, gate=ConvGate(2, 6), expert_compute=compute)
    x, grad_out = torch.randn(3, 2, 5, 7), torch.randn(3, 2, 5, 7)
    assert layers["selected"].resolved_expert_compute(x, shared_routing=False) == "all"
    ref, got = (_step(layers[k], x, grad_out) for k in ("all", "selected"))
    for key, value in ref.items():
        assert torch.equal(got[key], value), key  # both resolve to 'all': the same code path, the same bits


def test_auto_resolution_and_autocast() -> None:
    layer = SpatialMoE2d(2, 4, 1, grid=(3, 4))
    x = torch.zeros(1, 2, 3, 4)
    assert layer.resolved_expert_compute(x, shared_routing=True) == "used"  # measured faster on CPU
    selected = SpatialMoE2d(2, 4, 1, grid=(3, 4), expert_compute="selected")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert selected.resolved_expert_compute(x, shared_routing=True) == "used"


def test_plan_is_made_once_per_selection(every_leaf: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """The plan is memoised in the gate's selection: layers sharing the gate, and steps that keep the routing,
    reuse it (a frozen gate plans once per run)."""
    calls = []
    original = selected_module.build_plan

    def counting(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr("smoeweather.nn.smoe.build_plan", counting)
    gate = TensorRoutingGate(8, 6, 9, num_selected=2, prior=_two_region_prior(6, 9), frozen=True)
    net = nn.Sequential(SpatialMoE2d(2, 8, 2, gate=gate, expert_compute="selected"),
                        SpatialMoE2d(2, 8, 2, gate=gate, expert_compute="selected"))
    for _ in range(3):
        net(torch.randn(2, 2, 6, 9)).sum().backward()
    assert len(calls) == 1


def test_trained_model_forecasts_the_same_through_both_paths(every_leaf: None) -> None:
    """A small SMoE-U-Net trained a few steps (selected path), saved and reloaded: its forecast through the
    selected path equals the all-experts one to float32 tolerance (a 3×3·C sum per conv, through the network)."""
    grid = (8, 16)
    prior = torch.zeros(grid)
    prior[2:6, 3:9] = 1.0

    def make(compute: str) -> PostprocessingUNet:
        torch.manual_seed(6)
        net = PostprocessingUNet(3, levels=2, widths=(4, 8), out_channels=2, smoe=True, grid=grid,
                                 land_sea_prior=prior, gate_init="coherent", damping=None)
        for layer in smoe_layers(net):
            layer.expert_compute = compute
        return net

    net = make("selected")
    opt = torch.optim.Adam(net.parameters(), lr=1e-2)
    x, target = torch.randn(4, 3, *grid), torch.randn(4, 2, *grid)
    for _ in range(3):
        opt.zero_grad()
        nn.functional.mse_loss(net(x), target).backward()
        opt.step()
    buffer = io.BytesIO()
    torch.save(net.state_dict(), buffer)
    forecasts = {}
    for compute in ("all", "selected"):
        model = make(compute)
        buffer.seek(0)
        model.load_state_dict(torch.load(buffer))
        model.eval()
        with torch.no_grad():
            forecasts[compute] = model(x)
    scale = float(forecasts["all"].abs().max())
    # every conv of the U-Net (4 of them, 3×3·8 terms at most) and the BatchNorm/upsampling between them
    torch.testing.assert_close(forecasts["selected"], forecasts["all"], **float_tol(torch.float32, 4 * 9 * 16, scale))


def test_compiled_training_step_has_no_graph_break_and_matches_eager() -> None:
    """Under torch.compile the layer computes all experts and routes through an opaque custom operator
    (smoeweather.nn.route_op): ``torch._dynamo.explain`` of the training forward finds one graph, no break; two
    compiled training steps (the second with the updated gate) equal eager ones, RC loss included."""
    torch._dynamo.reset()

    def model() -> nn.Module:
        torch.manual_seed(7)
        return nn.Sequential(nn.Conv2d(2, 3, 3, padding=1), nn.ReLU(),
                             SpatialMoE2d(3, 6, 2, grid=(6, 8), damping=0.1), nn.ReLU(), nn.Conv2d(2, 1, 1))

    x, target = torch.randn(3, 2, 6, 8), torch.randn(3, 1, 6, 8)

    def loss_of(net: nn.Module) -> torch.Tensor:
        return nn.functional.mse_loss(net(x), target)

    explained = torch._dynamo.explain(loss_of)(model())
    assert (explained.graph_count, explained.graph_break_count) == (1, 0), explained.break_reasons
    torch._dynamo.reset()
    eager, compiled = model(), model()
    runs = []
    for net, module in ((eager, eager), (torch.compile(compiled, backend="aot_eager"), compiled)):
        for _ in range(2):
            module.zero_grad()
            loss = nn.functional.mse_loss(net(x), target)
            loss.backward()
            with torch.no_grad():
                for p in module.parameters():
                    p -= 0.1 * p.grad
        runs.append([loss.detach(), module[2].last_rc_loss, *[p.detach().clone() for p in module.parameters()]])
    for a, b in zip(*runs, strict=True):
        torch.testing.assert_close(a, b, **float_tol(torch.float32, 64, scale=a))
    torch._dynamo.reset()


def test_copies_route_compiled_code_through_themselves() -> None:
    """The compiled routing operator finds its layer by key: a deep copy (an EMA model, an ensemble member) has its
    own, so its logged RC values land on the copy."""
    from smoeweather.nn import route_op

    layer = SpatialMoE2d(2, 4, 1, grid=(3, 4))
    twin = copy.deepcopy(layer)
    assert twin._route_key != layer._route_key
    assert route_op._LAYERS[twin._route_key] is twin and route_op._LAYERS[layer._route_key] is layer
