"""Heat-diffusion benchmark models: shapes, gradients, parameter counts, baseline layer semantics."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import float_tol
from torch import nn
from torch.nn import functional as F

from smoeweather.heat.models import build_heat_model, count_parameters
from smoeweather.models import registry
from smoeweather.nn.baselines import CondConv2d, LowRankLocallyConnected2d
from smoeweather.nn.smoe import SpatialMoE2d
from smoeweather.nn.vit import ViT, VMoE
from smoeweather.training.base import auxiliary_loss

S = 16


@pytest.mark.parametrize("name", registry.names("heat"))
def test_shape_and_gradients(name: str) -> None:
    model = build_heat_model(name, S).train()
    x, target = torch.rand(4, 1, S, S), torch.rand(4, 1, S, S)
    y = model(x)
    assert y.shape == (4, 1, S, S)
    loss = F.mse_loss(y, target)
    aux = auxiliary_loss(model)  # the V-MoE layers' importance + load losses, summed over modules
    if isinstance(model, VMoE):
        assert aux is not None
        loss = loss + 0.01 * aux
    loss.backward()
    params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    assert params
    for n, p in params:
        assert p.grad is not None, f"{name}: {n} got no gradient"
        assert torch.isfinite(p.grad).all(), f"{name}: {n} has a non-finite gradient"
        # every parameter actually learns, except V-MoE experts to which no token was routed
        if not (isinstance(model, VMoE) and ".experts." in n):
            assert p.grad.abs().sum() > 0, f"{name}: {n} got an all-zero gradient"


def test_smoe_gate_learns_only_from_rc_loss() -> None:
    model = build_heat_model("smoe", S)
    assert isinstance(model, SpatialMoE2d) and model.rc and model.damping == 0.1 and model.quantile == 0.3
    model(torch.rand(2, 1, S, S)).square().mean().backward()
    assert model.last_rc_loss is not None and model.gate.weight.grad.abs().sum() > 0


@pytest.mark.parametrize("name, rc, damping", [
    ("smoe", True, 0.1), ("smoe_no_rc_no_damping", False, None), ("smoe_rc_only", True, None),
    ("smoe_damping_only", False, 0.1),
])
def test_smoe_rows(name: str, rc: bool, damping: float | None) -> None:
    model = build_heat_model(name, S)
    assert (model.rc, model.damping, model.weighted, model.padding) == (rc, damping, False, "zeros")
    assert (model.num_experts, model.num_selected, model.kernel_size, model.experts.bias) == (3, 1, 3, None)


def test_overrides() -> None:
    assert build_heat_model("smoe", S, quantile=0.5, damping=0.0).quantile == 0.5
    assert build_heat_model("smoe_q07", S).quantile == 0.7
    assert build_heat_model("smoe_no_rc_no_damping", S, damping=0.0).damping == 0.0
    assert build_heat_model("gate_conv", S, rc=False).rc is False
    assert len(build_heat_model("conv", S, layers=1)) == 1
    six = build_heat_model("smoe", S, num_experts=6, num_selected=2)  # paper §3.1, case 3: outputs summed
    assert six(torch.rand(2, 1, S, S)).shape == (2, 1, S, S)
    with pytest.raises(TypeError):
        build_heat_model("lcn", S, layers=2)
    with pytest.raises(ValueError, match="must be one of"):
        build_heat_model("resnet", S)


def test_parameter_counts() -> None:
    n = S * S
    conv3 = (9 * 12) + 24 + (9 * 12 * 12) + 24 + (9 * 12 + 1)  # no bias before BN, BN weight+bias
    expected = {
        "smoe": 27 + 3 * n,  # paper: 27 + 12288 at S = 64
        "gate_lcn": 27 + 9 * 3 * n,
        "gate_fc": 27 + n * 3 * n + 3 * n,
        "gate_conv": 27 + 27 + 3,
        "lrlcn_nd": 27 + 3 * n,  # paper: 12315 at S = 64
        "lcn": 9 * n,  # no bias
        "fc": n * n + n,
        "conv": conv3,
        "coordconv": conv3 + 2 * 9 * 12 + 2 * 9 * 12 + 2 * 9,
        # 3 expert kernels per layer, routing Linear(C_in, 3), 3 expert biases in the last layer only
        "condconv": (3 * 108 + 6 + 24) + (3 * 1296 + 39 + 24) + (3 * 108 + 3 + 39),
        # location logits (3, S, S) per layer, input-dependent combiner Conv2d(C_in, 3, 3)
        "lrlcn": (3 * 108 + 3 * n + 30 + 24) + (3 * 1296 + 3 * n + 327 + 24) + (3 * 108 + 3 * n + 327 + 1),
        "vit": 2176 + 16 * 128 + 2 * 256 + (128 * 384 + 384) + (128 * 128 + 128) + 2 * (128 * 512) + 512 + 128
        + 256 + (128 * 16 + 16),
    }
    expected["vmoe"] = expected["vit"] + 2 * (2 * 128 * 512 + 512 + 128) + 3 * 128  # 2 more MLPs, router
    for name, count in expected.items():
        assert count_parameters(build_heat_model(name, S)) == count, name
    assert count_parameters(build_heat_model("conv", S, layers=1)) == 10
    assert count_parameters(build_heat_model("smoe", 64)) == 27 + 12288


def test_condconv_identical_kernels_equal_plain_conv() -> None:
    conv = nn.Conv2d(2, 5, 3, padding=1)
    cond = CondConv2d(2, 5, 3, num_experts=3)
    with torch.no_grad():
        cond.weight.copy_(conv.weight.expand_as(cond.weight))
        cond.bias.copy_(conv.bias.expand_as(cond.bias))
        cond.routing.weight.zero_()
        cond.routing.bias.fill_(-math.log(2.0))  # sigmoid = 1/3 per expert: the weights sum to 1
    x = torch.randn(4, 2, 9, 11)
    ref = conv(x).detach()  # a value to compare with, no graph (float() of a graph tensor warns)
    # float32: mixing 3 kernels (3 roundings per weight) then a 2·3·3 = 18-term accumulation
    torch.testing.assert_close(cond(x), ref, **float_tol(torch.float32, 3 + 18, scale=ref))


def test_condconv_routing_is_per_sample() -> None:
    cond = CondConv2d(1, 1, 3, num_experts=3)
    x = torch.randn(3, 1, 8, 8)
    batched = cond(x)
    single = torch.cat([cond(x[i : i + 1]) for i in range(3)]).detach()  # a value, no graph (float() of one warns)
    # the same per-sample kernels; only the accumulation order of the 1·3·3-term sums may differ
    torch.testing.assert_close(batched, single, **float_tol(torch.float32, 3 + 9, scale=single))


def test_lrlcn_nd_equal_logits_is_mean_of_basis() -> None:
    layer = LowRankLocallyConnected2d(2, 4, 8, 10, rank=3, input_dependent=False, bias=False)
    with torch.no_grad():
        layer.location_logits.fill_(0.7)
    x = torch.randn(3, 2, 8, 10)
    mean_kernel = layer.basis.weight.view(3, 4, 2, 3, 3).mean(0)
    ref = F.conv2d(x, mean_kernel, padding=1).detach()
    # mean of 3 basis outputs vs conv with the mean kernel: 3 + 2·3·3 accumulated roundings
    torch.testing.assert_close(layer(x), ref, **float_tol(torch.float32, 3 + 18, scale=ref))


def test_lrlcn_is_location_and_input_dependent() -> None:
    layer = LowRankLocallyConnected2d(1, 1, 8, 8)
    with torch.no_grad():
        layer.location_logits.normal_()
    x = torch.randn(2, 1, 8, 8)
    assert layer.combining_weights(x).shape == (2, 3, 8, 8)
    # softmax over 3: exp, sum of 3, division → ~5 roundings of values ≤ 1
    torch.testing.assert_close(layer.combining_weights(x).sum(1), torch.ones(2, 8, 8), **float_tol(torch.float32, 5))
    nd = LowRankLocallyConnected2d(1, 1, 8, 8, input_dependent=False)
    assert nd.combining_weights(x).shape == (1, 3, 8, 8)


def test_vmoe_top1_routing_and_aux_loss() -> None:
    model = build_heat_model("vmoe", S).train()
    assert isinstance(model, VMoE)
    model(torch.rand(2, 1, S, S))
    moe = model.blocks[0].mlp
    gates = moe.last_gates  # (T, |E|), T = 2 samples × (16/4)² tokens
    assert gates.shape == (2 * 16, 3)
    # top-1 with capacity B_e = round(1.05·T/E): a token goes to one expert or (past capacity) to none
    per_token = (gates > 0).sum(dim=1)
    assert (per_token <= 1).all()
    assert float((per_token == 0).float().mean()) == pytest.approx(moe.last_dropped, abs=1e-6)
    assert int((gates > 0).sum(dim=0).max()) <= round(1.05 * 32 / 3)
    kept = per_token == 1
    assert (gates.max(dim=1).values[kept] >= 1 / 3).all()  # weighted by its (top) router probability
    aux = auxiliary_loss(model)
    assert aux is not None and aux.ndim == 0
    assert torch.isfinite(aux) and aux >= 0
    model.eval()
    model(torch.rand(2, 1, S, S))
    assert auxiliary_loss(model) is None


def test_vmoe_equals_vit_with_identical_experts() -> None:
    vit = ViT(1, 1, (8, 8), patch=4, dim=16, heads=2)
    vmoe = VMoE(1, 1, (8, 8), patch=4, dim=16, heads=2, num_experts=3, k=1, capacity_ratio=None)  # no drops
    state = vit.state_dict()
    for key, value in vit.blocks[0].mlp.state_dict().items():
        for e in range(3):
            state[f"blocks.0.mlp.experts.{e}.{key}"] = value
        del state[f"blocks.0.mlp.{key}"]
    state["blocks.0.mlp.router.weight"] = torch.zeros(3, 16)
    vmoe.load_state_dict(state)
    x = torch.rand(2, 1, 8, 8)
    # equal router logits: the top-1 weight is 1/3, so V-MoE's MLP output is a third of ViT's
    vmoe.eval()
    vit.eval()
    vit.blocks[0].mlp.fc2.weight.data /= 3
    vit.blocks[0].mlp.fc2.bias.data /= 3
    ref = vit(x).detach()
    # one block, dim 16: patch embedding (16 terms), attention (16-term dots, softmax over 4 tokens), MLP
    # (16 + 64 terms), the /3 of fc2 on each side, head (16): a chain of ~150 float32 roundings
    torch.testing.assert_close(vmoe(x), ref, **float_tol(torch.float32, 150, scale=ref))


def test_vit_non_square_grid() -> None:
    model = ViT(1, 2, (16, 32), patch=4, dim=32, heads=4)
    assert model(torch.rand(3, 1, 16, 32)).shape == (3, 2, 16, 32)
    with pytest.raises(ValueError):
        model(torch.rand(3, 1, 32, 16))
    with pytest.raises(ValueError):
        ViT(1, 1, (18, 32), patch=4)


def test_vit_patchify_roundtrip() -> None:
    model = ViT(2, 2, (8, 12), patch=4, dim=16, heads=2)
    x = torch.rand(2, 2, 8, 12)
    torch.testing.assert_close(model.unpatchify(model.patchify(x)), x)
    # the first token is the top-left patch
    torch.testing.assert_close(model.patchify(x)[:, 0], x[:, :, :4, :4].reshape(2, -1))
