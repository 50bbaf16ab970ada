"""Ensemble forecast networks: losses against properscoring/scores, E³ partitioning and tiling,
deep ensembles, the Gaussian head, rank histograms and the diversity measure."""

from __future__ import annotations

import numpy as np
import properscoring
import pytest
import torch
import xarray as xr
from scores.probability import crps_for_ensemble
from scores.probability import rank_histogram as scores_rank_histogram

from smoeweather.metrics import probabilistic as P
from smoeweather.models.ensemble import DeepEnsemble, E3ResNet, GaussianResNet
from smoeweather.models.weather import build_weather_model, synthetic_land_sea_mask
from smoeweather.nn import SpatialMoE2d
from smoeweather.training import ensemble_losses as EL
from smoeweather.training.losses import latitude_weights

# float64 losses of O(1) values summed over M ≤ 8 members and 2·3·4·5 points: a few hundred ulps
RTOL = 1e-12
GRID = (8, 16)


def _data(b: int = 2, m: int = 5, c: int = 3, h: int = 4, w: int = 5, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(b, m, c, h, w, generator=g, dtype=torch.float64)
    y = torch.randn(b, c, h, w, generator=g, dtype=torch.float64)
    weights = latitude_weights(np.linspace(-60, 60, h)).double()
    return x, y, weights


def _weighted(score: np.ndarray, weights: torch.Tensor) -> float:
    return float((score * weights.numpy()[None, None, :, None]).mean())


def test_member_mse_is_mean_member_mse() -> None:
    x, y, w = _data()
    expected = np.mean([_weighted((x[:, j] - y).square().numpy(), w) for j in range(x.shape[1])])
    np.testing.assert_allclose(EL.member_mse(x, y, w).item(), expected, rtol=RTOL)


@pytest.mark.parametrize("alpha", [0.0, 0.95, 1.0])
def test_almost_fair_crps_matches_properscoring_and_scores(alpha: float) -> None:
    x, y, w = _data()
    fc = np.moveaxis(x.numpy(), 1, -1)  # (B, C, H, W, M)
    standard = properscoring.crps_ensemble(y.numpy(), fc)  # ECDF (standard) CRPS
    dims = ("b", "c", "h", "w")
    fair = crps_for_ensemble(xr.DataArray(fc, dims=(*dims, "member")), xr.DataArray(y.numpy(), dims=dims),
                             "member", method="fair", preserve_dims="all").values
    ours = EL.ensemble_crps_pointwise(x, y, alpha).numpy()
    np.testing.assert_allclose(ours, alpha * fair + (1 - alpha) * standard, rtol=RTOL, atol=RTOL)
    np.testing.assert_allclose(EL.ensemble_crps(x, y, w, alpha).item(),
                               _weighted(alpha * fair + (1 - alpha) * standard, w), rtol=RTOL)


def test_gaussian_crps_loss_matches_properscoring() -> None:
    x, y, w = _data(m=2)
    params = torch.stack([x[:, 0], x[:, 1].abs() + 0.1], dim=1)
    ref = properscoring.crps_gaussian(y.numpy(), params[:, 0].numpy(), params[:, 1].numpy())
    np.testing.assert_allclose(EL.gaussian_crps_loss(params, y, w).item(), _weighted(ref, w), rtol=RTOL)


def test_loss_refusals() -> None:
    x, y, w = _data()
    with pytest.raises(ValueError, match="training.loss"):
        EL.ensemble_loss("nll", x, y, w)
    with pytest.raises(ValueError, match="alpha"):
        EL.ensemble_crps(x, y, w, alpha=1.5)
    with pytest.raises(ValueError, match="2 members"):
        EL.ensemble_crps(x[:, :1], y, w, alpha=0.95)
    with pytest.raises(ValueError, match=r"\(B, M, C, H, W\)"):
        EL.member_mse(x[:, 0], y, w)


def test_fair_crps_zero_spread_penalty_for_collapsed_members() -> None:
    """A collapsed ensemble (all members equal) has CRPS = MAE under every α (no spread term)."""
    _, y, w = _data()
    x = y.unsqueeze(1).repeat(1, 4, 1, 1, 1) + 0.5
    for alpha in (0.0, 0.95, 1.0):
        np.testing.assert_allclose(EL.ensemble_crps(x, y, w, alpha).item(), 0.5, rtol=RTOL)


def _e3(members: int = 4, placement: str = "all", **smoe) -> E3ResNet:
    torch.manual_seed(0)
    return E3ResNet(5, 2, members=members, width=4, blocks=2, grid=GRID,
                    smoe={"placement": placement, "experts_factor": 2 * members, **smoe},
                    land_sea_prior=synthetic_land_sea_mask(*GRID) if smoe.get("gate_prior") else None)


@pytest.mark.parametrize("placement", ["all", "first", "last"])
def test_e3_partitions_experts_and_members_differ(placement: str) -> None:
    net = _e3(placement=placement).eval()
    x = torch.randn(3, 5, *GRID)
    y = net(x)
    assert y.shape == (3, 4, 2, *GRID)
    # every SMoE position holds M disjoint expert groups of experts_factor·width/M = 2·width experts each
    layers = [m for m in net.modules() if isinstance(m, SpatialMoE2d)]
    assert len(layers) == 4 * (4 if placement == "all" else 1)
    assert {lay.num_experts for lay in layers} == {8} and {lay.num_selected for lay in layers} == {4}
    assert len({id(p) for lay in layers for p in lay.experts.parameters()}) == len(layers)
    assert set(net.gates) == {f"M{m}_E8_H8_W16" for m in range(4)}  # one gate per member, shared by its layers
    assert not torch.allclose(y[:, 0], y[:, 1])  # different experts → different members
    # the tiled members are independent of the batch composition: member m of sample 0 alone is the same
    np.testing.assert_allclose(net(x[:1]).detach().numpy(), y[:1].detach().numpy(), rtol=1e-5, atol=1e-6)


def test_e3_member_uses_only_its_own_group() -> None:
    """Member m's output depends on the experts of group m only: changing group 1's weights leaves
    members 0, 2, 3 unchanged."""
    net = _e3().eval()
    x = torch.randn(2, 5, *GRID)
    before = net(x).detach()
    with torch.no_grad():
        for module in net.modules():
            if isinstance(module, SpatialMoE2d) and module.gate is net.gates["M1_E8_H8_W16"]:
                module.experts.weight.add_(1.0)
    after = net(x).detach()
    assert not torch.allclose(before[:, 1], after[:, 1])
    for m in (0, 2, 3):
        torch.testing.assert_close(before[:, m], after[:, m])


def test_e3_land_sea_prior_within_each_group() -> None:
    net = _e3(gate_prior="land_sea")
    land = synthetic_land_sea_mask(*GRID).bool()
    for gate in net.gates.values():
        top = gate.weight.argmax(dim=0)  # (H, W): best expert of the member's group
        assert bool((top[land] >= 4).all()) and bool((top[~land] < 4).all())  # land → second half of the group


def test_e3_refusals() -> None:
    with pytest.raises(ValueError, match="experts_factor >= 4"):
        E3ResNet(5, 2, members=4, width=4, blocks=1, grid=GRID, smoe={"placement": "all", "experts_factor": 2})
    with pytest.raises(ValueError, match="placement"):
        E3ResNet(5, 2, members=4, width=4, blocks=1, grid=GRID, smoe=None)
    with pytest.raises(ValueError, match="members >= 2"):
        E3ResNet(5, 2, members=1, width=4, blocks=1, grid=GRID, smoe={"placement": "all", "experts_factor": 2})
    with pytest.raises(ValueError, match="unknown keys"):
        build_weather_model({"name": "e3", "members": 4, "heads": 2})


def test_deep_ensemble_and_gaussian_shapes() -> None:
    torch.manual_seed(0)
    de = build_weather_model({"name": "deep_ensemble", "members": 3, "in_channels": 5, "out_channels": 2,
                              "width": 4, "blocks": 1, "grid": list(GRID)})
    assert isinstance(de, DeepEnsemble)
    x = torch.randn(2, 5, *GRID)
    y = de.eval()(x)
    assert y.shape == (2, 3, 2, *GRID)
    assert not torch.allclose(y[:, 0], y[:, 1])  # independently initialised
    assert not torch.equal(de.nets[0].head.weight if hasattr(de.nets[0].head, "weight") else
                           next(de.nets[0].head.parameters()), next(de.nets[1].head.parameters()))
    g = build_weather_model({"name": "gaussian", "in_channels": 5, "out_channels": 2, "width": 4, "blocks": 1,
                             "grid": list(GRID)})
    assert isinstance(g, GaussianResNet)
    out = g.eval()(x)
    assert out.shape == (2, 2, 2, *GRID) and bool((out[:, 1] > 0).all())


# ---- rank histogram and diversity ------------------------------------------------------------------
def _ens(m: int = 4, shape: tuple[int, ...] = (50, 6, 8), seed: int = 0, spread: float = 1.0):
    rng = np.random.default_rng(seed)
    dims = ("time", "latitude", "longitude")
    centre = rng.normal(size=shape)
    fc = xr.DataArray(centre[..., None] + spread * rng.normal(size=(*shape, m)), dims=(*dims, "member"))
    truth = xr.DataArray(centre + rng.normal(size=shape), dims=dims,
                         coords={"latitude": np.linspace(-50, 50, shape[1])})
    return fc.assign_coords(latitude=truth["latitude"]), truth


def test_rank_histogram_matches_scores_and_is_flat_when_calibrated() -> None:
    from smoeweather.metrics.weights import latitude_weights as lat_w

    fc, truth = _ens()
    w = lat_w(truth["latitude"])
    ours = P.rank_histogram(fc, truth, w)
    ref = scores_rank_histogram(fc, truth, "member", reduce_dims="all", weights=w.broadcast_like(truth))
    np.testing.assert_allclose(ours.values, ref.values, rtol=1e-12)
    assert ours.sizes["rank"] == 5 and abs(float(ours.sum()) - 1) < 1e-12
    # truth exchangeable with the members: each of the M + 1 ranks has frequency 1/(M+1) ± sampling noise
    n = truth.size
    np.testing.assert_allclose(ours.values, 0.2, atol=4 * np.sqrt(0.2 * 0.8 / n) * 2)
    # under-dispersive (members too close): U shape
    narrow, _ = _ens(spread=0.2)
    u = P.rank_histogram(narrow, truth).values
    assert u[0] > 0.3 and u[-1] > 0.3 and u[2] < 0.1


def test_member_diversity_closed_forms() -> None:
    fc, truth = _ens(spread=1.0)
    d = P.member_diversity(fc, truth)
    x = fc.values
    pair = np.abs(x[..., :, None] - x[..., None, :]).sum(axis=(-1, -2)) / (4 * 3)
    np.testing.assert_allclose(float(d["pairwise_distance"]), pair.mean(), rtol=1e-12)
    np.testing.assert_allclose(float(d["member_error"]), np.abs(x - truth.values[..., None]).mean(), rtol=1e-12)
    # fair CRPS = E − D/2 pointwise, so also in the mean
    fair = P.crps_ensemble(fc, truth, estimator="fair").mean()
    np.testing.assert_allclose(float(d["member_error"] - d["pairwise_distance"] / 2), float(fair), rtol=1e-10)
    # calibrated: ratio ≈ 1 (E|X − X'| = E|X − Y|); collapsed: 0
    assert abs(float(d["diversity_ratio"]) - 1) < 0.05
    collapsed = fc.isel(member=[0, 0, 0, 0]).assign_coords(member=np.arange(4))
    assert float(P.member_diversity(collapsed, truth)["diversity_ratio"]) == 0.0


def test_ensemble_study_summary_pairs_to_the_baseline() -> None:
    """`smoe study` with scoring: ensemble: per metric mean ± std over seeds, the paired (same seed) difference
    to the baseline with SE std(d)/√n and its 95 % Student-t interval, and the training-cost ratio."""
    from smoeweather.studies.ensembles import ensemble_markdown, ensemble_summary

    def run(variant: str, seed: int, crps: float, rmse: float, seconds: float) -> dict:
        cell = {"72h": {"z": crps}}
        return {"variant": variant, "seed": seed, "scores": cell, "train_seconds": seconds,
                "extra": {"rmse": {"72h": {"z": rmse}}, "spread_skill": {"72h": {"z": 1.0}}, "forecast_seconds": 1.0}}

    runs = [run("de", s, c, 2 * c, 100.0) for s, c in enumerate([1.0, 2.0, 3.0])]
    runs += [run("e3", s, c, 2 * c, 40.0 + s) for s, c in enumerate([1.5, 2.1, 3.6])]
    summary = ensemble_summary(runs, "de", ["72h"], ["z"])
    d = np.array([0.5, 0.1, 0.6])
    cell = summary["e3"]["crps"]["z@72h"]
    np.testing.assert_allclose(cell["mean"], 2.4, rtol=1e-12)
    np.testing.assert_allclose(cell["diff_to_baseline"]["mean"], d.mean(), rtol=1e-12)
    np.testing.assert_allclose(cell["diff_to_baseline"]["se"], d.std(ddof=1) / np.sqrt(3), rtol=1e-12)
    np.testing.assert_allclose(summary["e3"]["rmse"]["z@72h"]["diff_to_baseline"]["mean"], 2 * d.mean(), rtol=1e-12)
    np.testing.assert_allclose(summary["e3"]["cost"]["ratio_to_baseline"], np.mean([0.40, 0.41, 0.42]), rtol=1e-12)
    text = ensemble_markdown(summary, "de", ["72h"], ["z"])
    # mean 0.4, SE 0.153, t(0.975, 2) = 4.303: [-0.257, 1.06] holds zero, so not bold (|mean| > 2 SE would be)
    np.testing.assert_allclose(cell["diff_to_baseline"]["lo"], 0.4 - 4.302652729911275 * d.std(ddof=1) / np.sqrt(3),
                               rtol=1e-9)
    assert "| e3 | +0.4 [-0.257, 1.06] (3) |" in text and "Training cost" in text


def test_mc_dropout_members_are_dropout_draws() -> None:
    from smoeweather.models.ensemble import MCDropoutResNet

    torch.manual_seed(0)
    net = build_weather_model({"name": "mc_dropout", "members": 3, "dropout": 0.2, "in_channels": 5,
                               "out_channels": 2, "width": 4, "blocks": 1, "grid": list(GRID)})
    assert isinstance(net, MCDropoutResNet)
    x = torch.randn(2, 5, *GRID)
    assert net.train()(x).shape == (2, 1, 2, *GRID)  # training: one stochastic pass
    net.eval()
    torch.manual_seed(1)
    y = net(x)
    assert y.shape == (2, 3, 2, *GRID) and not torch.allclose(y[:, 0], y[:, 1])
    assert all(not m.training for m in net.modules())  # dropout back in eval mode after the draws
    torch.manual_seed(1)
    torch.testing.assert_close(net(x), y)  # seeded draws are reproducible
    with pytest.raises(ValueError, match="dropout"):
        build_weather_model({"name": "mc_dropout", "dropout": 0.0, "in_channels": 5, "out_channels": 2})
