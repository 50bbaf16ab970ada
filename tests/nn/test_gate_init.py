"""Tensor-routing gate initialisations: ``uniform`` (paper) and ``coherent`` (same rank order everywhere)."""

from __future__ import annotations

import pytest
import torch
from conftest import float_tol

from smoeweather.models.resnet import WeatherBenchResNet
from smoeweather.nn.gates import TensorRoutingGate


def _land_sea(h: int = 8, w: int = 16) -> torch.Tensor:
    torch.manual_seed(1)
    return (torch.rand(h, w) > 0.6).long()


def test_coherent_init_gives_one_rank_order_per_prior_category():
    lsm = _land_sea()
    torch.manual_seed(0)
    gate = TensorRoutingGate(8, 8, 16, num_selected=4, prior=lsm, init="coherent")
    idx = gate.weight.topk(4, dim=0).indices  # (E, H, W), descending score
    for category, group in ((0, set(range(0, 4))), (1, set(range(4, 8)))):
        ranks = idx[:, lsm == category]
        assert torch.equal(ranks, ranks[:, :1].expand_as(ranks))  # the same expert in plane j everywhere
        assert set(ranks[:, 0].tolist()) == group  # and the prior's group is selected
    # the scores are U(-b, b) draws shifted by 2b on the category's group
    scores = gate.weight.detach()
    assert float(scores.min()) >= -gate.bound and float(scores.max()) <= 3 * gate.bound


def test_uniform_init_scrambles_the_rank_order_between_locations():
    lsm = _land_sea()
    torch.manual_seed(0)
    gate = TensorRoutingGate(8, 8, 16, num_selected=4, prior=lsm, init="uniform")
    idx = gate.weight.topk(4, dim=0).indices
    sea = idx[:, lsm == 0]
    # same selected SET (the prior), but the order differs between locations
    assert all(set(sea[:, i].tolist()) == {0, 1, 2, 3} for i in range(sea.shape[1]))
    assert not torch.equal(sea, sea[:, :1].expand_as(sea))


def test_gate_init_is_validated():
    with pytest.raises(ValueError, match="gate init"):
        TensorRoutingGate(4, 2, 2, init="ordered")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="gate_init"):
        WeatherBenchResNet(3, 2, width=4, blocks=1, grid=(8, 16), smoe={"placement": "all", "gate_init": "x"})


@pytest.mark.parametrize("share", [True, False])
def test_resnet_shares_one_gate_or_builds_one_per_layer(share):
    model = WeatherBenchResNet(3, 2, width=4, blocks=2, grid=(8, 16), land_sea_prior=_land_sea(),
                               smoe={"placement": "all", "gate_prior": "land_sea", "gate_init": "coherent",
                                     "share_gate": share})
    assert len(model.gates) == (1 if share else 4)
    layers = [m for m in model.modules() if m.__class__.__name__ == "SpatialMoE2d"]
    assert len({id(layer.gate) for layer in layers}) == len(model.gates)
    x = torch.randn(2, 3, 8, 16)
    assert model(x).shape == (2, 2, 8, 16)


def test_upcycled_smoe_layer_starts_as_one_dense_conv_everywhere():
    """Upcycled: expert groups are copies and ranks coincide, so every location applies the same filters."""
    lsm = _land_sea()
    torch.manual_seed(0)
    model = WeatherBenchResNet(3, 2, width=4, blocks=1, grid=(8, 16), land_sea_prior=lsm,
                               smoe={"placement": "all", "gate_prior": "land_sea", "gate_init": "coherent",
                                     "upcycle": True})
    layer = model.blocks[0].block1.layer
    gate = model.gates["E8_H8_W16"]
    idx = gate.weight.topk(4, dim=0).indices  # (E, H, W)
    assert torch.equal(idx[:, lsm == 1], idx[:, lsm == 0][:, :1].expand(4, int(lsm.sum())) + 4)
    sea_order = idx[:, 0, 0] if lsm[0, 0] == 0 else idx[:, 0, 0] - 4
    dense = torch.nn.Conv2d(4, 4, 3, padding=(1, 0), bias=False)
    dense.weight.data.copy_(layer.experts.weight[sea_order])
    x = torch.randn(2, 4, 8, 16)
    expected = dense(torch.nn.functional.pad(x, (1, 1, 0, 0), mode="circular")).detach()
    # the same 4·3·3 = 36-term dot products, possibly summed in another order by another conv kernel
    torch.testing.assert_close(layer(x), expected, **float_tol(torch.float32, 36, scale=expected))


def test_upcycle_needs_a_coherent_land_sea_gate():
    with pytest.raises(ValueError, match="upcycle"):
        WeatherBenchResNet(3, 2, width=4, blocks=1, grid=(8, 16), land_sea_prior=_land_sea(),
                           smoe={"placement": "all", "gate_prior": "land_sea", "upcycle": True})
