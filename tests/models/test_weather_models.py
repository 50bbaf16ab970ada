"""Weather networks (ResNet + SMoE variants, ENS-10 U-Net): shapes, gradients, symmetry, gates, heads."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from conftest import float_tol
from torch import nn
from torch.nn import functional as F

from smoeweather.models.resnet import (
    NormalizedModel,
    PeriodicLonLRLCN,
    WeatherBenchResNet,
    dense_resnet_param_count,
)
from smoeweather.models.unet import PostprocessingUNet, gaussian_head
from smoeweather.models.weather import (
    TINY_GRID,
    TINY_VARIANTS,
    build_tiny,
    build_weather_model,
    synthetic_land_sea_mask,
)
from smoeweather.nn import SpatialMoE2d, TensorRoutingGate, smoe_layers

H, W = TINY_GRID


def _input(model_cfg: dict, batch: int = 3) -> torch.Tensor:
    return torch.randn(batch, model_cfg["in_channels"], H, W)


def _unique_gates(model: nn.Module) -> list[nn.Module]:
    seen: dict[int, nn.Module] = {}
    for layer in smoe_layers(model):
        seen[id(layer.gate)] = layer.gate
    return list(seen.values())


@pytest.mark.parametrize("name", sorted(TINY_VARIANTS))
def test_output_shape_and_every_parameter_gets_a_gradient(name: str) -> None:
    cfg = TINY_VARIANTS[name]
    model = build_tiny(name)
    x = _input(cfg)
    y = model(x)
    assert y.shape == (3, 2, H, W)
    loss = F.mse_loss(y, torch.randn_like(y))
    loss.backward()
    trainable = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    assert trainable
    for n, p in trainable:
        assert p.grad is not None, f"{name}: {n} has no gradient"
        assert torch.isfinite(p.grad).all(), f"{name}: {n} has a non-finite gradient"
    for gate in _unique_gates(model):
        if gate.weight.requires_grad:  # the RC loss (applied inside backward) trains every learnable gate
            assert gate.weight.grad.abs().sum() > 0
    for layer in smoe_layers(model):
        if layer.gate.weight.requires_grad:
            assert layer.last_rc_loss is not None and torch.isfinite(layer.last_rc_loss)


def test_random_fixed_gate_is_frozen() -> None:
    model = build_tiny("resnet-smoe-all-random-fixed")
    gates = _unique_gates(model)
    assert len(gates) == 1 and not gates[0].weight.requires_grad
    before = gates[0].weight.clone()
    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=0.1)
    model(_input(TINY_VARIANTS["resnet-smoe-all-random-fixed"])).square().mean().backward()
    opt.step()
    assert torch.equal(gates[0].weight, before)


@pytest.mark.parametrize("k", [1, 5, 31])
def test_dense_resnet_is_periodic_in_longitude(k: int) -> None:
    model = build_tiny("resnet-dense").eval()
    x = _input(TINY_VARIANTS["resnet-dense"])
    with torch.no_grad():
        y = model(x)
        y_rolled = model(torch.roll(x, k, dims=-1))
    # rolling changes which positions share a block of the convolution kernels' accumulation order: tiny
    # ResNet = stem + 2 blocks × 2 convs + head, each a 8·3·3 = 72-term float32 sum → 6 · 72 roundings
    torch.testing.assert_close(y_rolled, torch.roll(y, k, dims=-1), **float_tol(torch.float32, 6 * 72,
                                                                                  scale=y))


def test_dense_resnet_is_not_periodic_in_latitude() -> None:
    """Latitude is zero-padded: rolling in latitude must NOT commute with the network."""
    model = build_tiny("resnet-dense").eval()
    x = _input(TINY_VARIANTS["resnet-dense"])
    with torch.no_grad():
        diff = (model(torch.roll(x, 3, dims=-2)) - torch.roll(model(x), 3, dims=-2)).abs().max()
    assert diff > 1e-3


def test_land_sea_prior_routes_land_and_sea_to_separate_halves() -> None:
    mask = synthetic_land_sea_mask(H, W)
    assert 0 < mask.sum() < mask.numel()
    model = build_tiny("resnet-smoe-all-prior", land_sea_prior=mask)
    gates = _unique_gates(model)
    assert len(gates) == 1
    layer = smoe_layers(model)[0]
    num_experts, selected = layer.num_experts, layer.num_selected
    assert (num_experts, selected) == (16, 8)
    idx = gates[0].weight.detach().topk(selected, dim=0).indices  # (E, H, W)
    land = mask.bool()
    assert (idx[:, land] >= num_experts // 2).all()  # land → second half
    assert (idx[:, ~land] < num_experts // 2).all()  # sea → first half


def test_land_sea_prior_accepts_fractions_and_is_required() -> None:
    frac = synthetic_land_sea_mask(H, W).float() * 0.8 + 0.1  # 0.1 sea, 0.9 land
    model = build_tiny("resnet-smoe-all-prior", land_sea_prior=frac)
    idx = _unique_gates(model)[0].weight.detach().topk(8, dim=0).indices
    assert (idx[:, frac > 0.5] >= 8).all()
    with pytest.raises(ValueError, match="land_sea_prior"):
        build_weather_model(TINY_VARIANTS["resnet-smoe-all-prior"])


def test_resnet_gate_sharing() -> None:
    model = build_tiny("resnet-smoe-all")
    layers = smoe_layers(model)
    assert len(layers) == 2 * 2  # blocks × two 3×3 convs
    gates = _unique_gates(model)
    assert len(gates) == 1
    assert all(layer.gate.weight is gates[0].weight for layer in layers)
    assert list(model.gates.values())[0] is gates[0]
    # parameters() counts the shared gate once
    assert sum(p is gates[0].weight for p in model.parameters()) == 1
    for placement in ("first", "last"):
        m = build_tiny(f"resnet-smoe-{placement}")
        assert len(smoe_layers(m)) == 1 and len(_unique_gates(m)) == 1
    assert not smoe_layers(build_tiny("resnet-dense"))


def test_unet_gate_sharing_per_resolution_and_part() -> None:
    model = build_tiny("unet-smoe")
    layers = smoe_layers(model)
    assert len(layers) == 12  # 3 levels × 2 convs × (encoder + decoder)
    gates = _unique_gates(model)
    expected = set()
    for part, modules in (("enc", model.encoder), ("dec", model.decoder)):
        for seq in modules:
            for block in seq:
                layer = block.layer
                assert isinstance(layer, SpatialMoE2d)
                assert layer.num_experts == 4 * layer.num_selected
                assert layer.padding == "zeros"
                gate = layer.gate
                assert isinstance(gate, TensorRoutingGate)
                expected.add((part, gate.num_experts, gate.height, gate.width))
    assert len(gates) == len(expected) == len(model.gates)
    # encoder and decoder never share a gate
    enc_gates = {id(b.layer.gate) for seq in model.encoder for b in seq}
    dec_gates = {id(b.layer.gate) for seq in model.decoder for b in seq}
    assert not enc_gates & dec_gates
    # level 0 of the encoder: both convs have 4 filters → one shared gate
    assert model.encoder[0][0].layer.gate is model.encoder[0][1].layer.gate


def test_unet_handles_odd_grids() -> None:
    model = PostprocessingUNet(3, levels=3, widths=(4, 8, 16), smoe=True, grid=(19, 36))
    assert model(torch.randn(2, 3, 19, 36)).shape == (2, 2, 19, 36)
    assert PostprocessingUNet(3, widths=(4, 8, 16))(torch.randn(1, 3, 21, 30)).shape == (1, 2, 21, 30)


def test_normalized_model_round_trip_and_state_dict() -> None:
    c = 4
    mean, std = torch.tensor([1.0, -2.0, 300.0, 5e4]), torch.tensor([0.5, 2.0, 10.0, 3e3])
    model = NormalizedModel(nn.Identity(), mean, std, mean, std)
    x = torch.randn(2, c, H, W) * std.view(-1, 1, 1) + mean.view(-1, 1, 1)
    # (x − μ)/σ·σ + μ in float32: ~4 roundings of values up to |μ| + 3σ ≈ 5.9e4
    torch.testing.assert_close(model(x), x, **float_tol(torch.float32, 4, scale=x))
    # statistics, not rounding: the mean of n = 2·H·W standard normals is within 5/√n (5 σ)
    n = 2 * H * W
    torch.testing.assert_close(model.normalize_input(x).mean(dim=(0, 2, 3)), torch.zeros(c), rtol=0,
                               atol=5 / math.sqrt(n))
    sd = model.state_dict()
    assert {"input_mean", "input_std", "target_mean", "target_std"} <= set(sd)
    assert sd["input_mean"].shape == (c, 1, 1)
    other = NormalizedModel(nn.Identity(), torch.zeros(c), torch.ones(c), torch.zeros(c), torch.ones(c))
    other.load_state_dict(sd)
    torch.testing.assert_close(other.target_std, std.view(-1, 1, 1))
    # a linear net: y_phys = (W((x − μ)/σ)) σ_t + μ_t
    net = nn.Conv2d(c, 1, 1, bias=False)
    wrapped = NormalizedModel(net, mean, std, torch.tensor([10.0]), torch.tensor([3.0]))
    expected = net((x - mean.view(-1, 1, 1)) / std.view(-1, 1, 1)) * 3.0 + 10.0
    # the same operations, possibly fused/ordered differently: 2 + a 4-term sum + 2 roundings
    torch.testing.assert_close(wrapped(x), expected, **float_tol(torch.float32, 8, scale=expected))
    with pytest.raises(ValueError, match="positive"):
        NormalizedModel(nn.Identity(), mean, torch.zeros(c), mean, std)


def test_gaussian_head_closed_form() -> None:
    o = torch.tensor([[0.5, -1.0], [2.0, 0.0]]).view(1, 2, 1, 2)  # o0 = (0.5, -1), o1 = (2, 0)
    m = torch.tensor([[[10.0, 20.0]]])
    s = torch.tensor([[[2.0, 4.0]]])
    mu, sigma = gaussian_head(o, m, s, eps=0.0)
    torch.testing.assert_close(mu, torch.tensor([[[11.0, 16.0]]]))
    torch.testing.assert_close(sigma, torch.tensor([[[math.log1p(math.e**2) * 2.0, math.log(2.0) * 4.0]]]))
    mu_e, sigma_e = gaussian_head(o, m.unsqueeze(1), s.unsqueeze(1), positive="exp", eps=0.0)
    torch.testing.assert_close(mu_e, mu)
    torch.testing.assert_close(sigma_e, torch.tensor([[[math.e**2 * 2.0, 4.0]]]))
    _, sigma_eps = gaussian_head(o, m, torch.zeros_like(s))
    assert (sigma_eps > 0).all()
    with pytest.raises(ValueError):
        gaussian_head(o, m.expand(2, 1, 2), s)


def _n_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def test_paper_size_parameter_counts() -> None:
    """Rasp & Thuerey ResNet at the paper's size: 117 inputs, 2 outputs, 128 filters, 19 blocks."""
    dense = WeatherBenchResNet(117, 2, width=128, blocks=19)
    stem = 117 * 128 * 7 * 7 + 128 + 2 * 128  # 7×7 conv + bias + BN (γ, β)
    block = 2 * (128 * 128 * 3 * 3 + 128 + 2 * 128)
    head = 128 * 2 * 3 * 3 + 2
    assert stem + 19 * block + head == 6_354_434 == dense_resnet_param_count(117, 2, 128, 19)
    assert _n_params(dense) == 6_354_434
    # 2× wide baseline
    wide = WeatherBenchResNet(117, 2, width=256, blocks=19)
    assert _n_params(wide) == dense_resnet_param_count(117, 2, 256, 19)
    # all 3×3 convs → SMoE (|E| = 256, E = 128, no expert bias) + one shared 256×32×64 gate
    smoe = WeatherBenchResNet(117, 2, width=128, blocks=19, smoe={"placement": "all"}, grid=(32, 64))
    smoe_block = 2 * (128 * 256 * 9 + 2 * 128)
    assert _n_params(smoe) == stem + 19 * smoe_block + head + 256 * 32 * 64 == 12_477_186
    # first/last: one extra SMoE block (experts + BN) and the gate
    extra = 128 * 256 * 9 + 2 * 128 + 256 * 32 * 64
    for placement in ("first", "last"):
        m = WeatherBenchResNet(117, 2, width=128, blocks=19, smoe={"placement": placement}, grid=(32, 64))
        assert _n_params(m) == 6_354_434 + extra


def test_registry_rejects_unknown_names_and_keys() -> None:
    with pytest.raises(ValueError, match="must be one of"):
        build_weather_model({"name": "transformer"})
    with pytest.raises(ValueError, match="unknown keys"):
        build_weather_model({"name": "resnet", "in_channels": 3, "out_channels": 1, "depth": 3})
    with pytest.raises(ValueError, match="unknown SMoE config keys"):
        build_weather_model({"name": "resnet", "in_channels": 3, "out_channels": 1, "smoe": {"where": "all"}})
    with pytest.raises(ValueError, match="placement"):
        build_weather_model({"name": "resnet", "in_channels": 3, "out_channels": 1, "smoe": "mid"})


def test_smoe_resnet_passes_routing_options_through() -> None:
    cfg = {**TINY_VARIANTS["resnet-smoe-all"],
           "smoe": {"placement": "all", "rc": False, "damping": None, "quantile": 0.5,
                    "layer_kwargs": {"weighted": True}}}
    layers = smoe_layers(build_weather_model(cfg))
    assert all(not m.rc and m.damping is None and m.quantile == 0.5 and m.weighted for m in layers)
    defaults = smoe_layers(build_tiny("resnet-smoe-all"))[0]
    assert defaults.rc and defaults.damping == 0.1 and defaults.quantile == 0.3
    assert defaults.padding == "periodic_lon" and defaults.num_experts == 16 and defaults.out_channels == 8


def test_periodic_lrlcn_matches_zero_padded_lrlcn_away_from_the_longitude_edges() -> None:
    """The periodic wrapper recomputes the LRLCN; only the first/last longitude columns may differ."""
    layer = PeriodicLonLRLCN(3, 5, (H, W), rank=3)
    x = torch.randn(2, 3, H, W)
    reference = copy.deepcopy(layer.lrlcn)
    for conv in (reference.basis, reference.combiner):
        conv.padding = (1, 1)
    y, y_ref = layer(x), reference(x)
    # two 3·3·3-term convolutions (basis, combiner) in both; padding differs only at the edges
    tol = float_tol(torch.float32, 2 * 27 + 3, scale=y_ref)
    torch.testing.assert_close(y[..., 1:-1], y_ref[..., 1:-1], **tol)
    assert (y[..., 0] - y_ref[..., 0]).abs().max() > 1e-4
    # periodic: rolling in longitude commutes with the layer except for the location-dependent weights
    # → with uniform location logits (the init) it commutes exactly
    torch.testing.assert_close(layer(torch.roll(x, 4, -1)), torch.roll(y, 4, -1), **tol)


def test_location_embedding_learns_what_the_inputs_do_not_carry() -> None:
    """Headroom arm: ``location_embedding=k`` adds k learned channels (k, H, W), zero at init, to the
    stem's input. On a target that is a fixed map of location only (inputs are noise), 150 Adam steps bring
    the embedded ResNet far below the plain one, whose translation-equivariant convolutions cannot tell the
    points apart; the parameter count grows by exactly k·H·W + the stem's extra weights."""
    grid = (8, 16)
    plain = WeatherBenchResNet(2, 1, width=8, blocks=1, dropout=0.0, grid=grid)
    torch.manual_seed(0)
    embedded = WeatherBenchResNet(2, 1, width=8, blocks=1, dropout=0.0, grid=grid, location_embedding=3)
    assert embedded.location_embedding.shape == (3, *grid) and not embedded.location_embedding.any()
    assert _n_params(embedded) - _n_params(plain) == 3 * grid[0] * grid[1] + 3 * 8 * 7 * 7
    g = torch.Generator().manual_seed(1)
    target = torch.randn(1, 1, *grid, generator=g).expand(16, 1, *grid)
    losses = {}
    for name, net in (("plain", plain), ("embedded", embedded)):
        torch.manual_seed(2)
        opt = torch.optim.Adam(net.parameters(), lr=0.02)
        for _ in range(150):
            x = torch.randn(16, 2, *grid, generator=g)
            loss = nn.functional.mse_loss(net(x), target)
            opt.zero_grad()
            loss.backward()
            opt.step()
        net.eval()
        with torch.no_grad():
            losses[name] = float(nn.functional.mse_loss(net(torch.randn(16, 2, *grid, generator=g)), target))
    assert losses["embedded"] < 0.25 * losses["plain"], losses
    assert embedded.location_embedding.abs().sum() > 0
    with pytest.raises(ValueError, match="location_embedding"):
        WeatherBenchResNet(2, 1, width=8, blocks=1, grid=grid, location_embedding=-1)
    with pytest.raises(ValueError, match="location_embedding is for the grid"):
        embedded(torch.randn(1, 2, 4, 16))
    # the config key a study arm sets (model.location_embedding=8)
    built = build_weather_model({"name": "resnet", "in_channels": 2, "out_channels": 1, "width": 8, "blocks": 1,
                                 "grid": [8, 16], "location_embedding": 4})
    assert built.location_embedding.shape == (4, 8, 16)
