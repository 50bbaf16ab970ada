"""A gate that learns when the SMoE is a HIDDEN layer: heat diffusion on a 16×16 grid with three
diffusivity regions (the right routing is the region map), a dense 3×3 conv before and after the SMoE layer.
Each routing option must find the right experts well above chance (1/3): the paper's per-sample RC
threshold, the per-slot threshold (``rc_threshold="slot"``), and the gate's own learning rate
(``training.gate_lr_factor`` through :func:`parameter_groups`); the task gradient alone (no RC, weighted
outputs) is measured against them. Also the routing diagnostics that count the rank order."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from pipelines.heat_diffusion import initial_states, region_map, simulate, stencils
from smoeweather.heat.table import routing_accuracy
from smoeweather.nn import SpatialMoE2d, TensorRoutingGate
from smoeweather.training.base import parameter_groups
from smoeweather.training.diagnostics import order_variety, ranked_selection, routing_summary, selection_change

SIZE = 16


def _delta_conv() -> nn.Conv2d:
    """A dense 3×3 conv initialised as the identity (centre tap 1), trainable."""
    conv = nn.Conv2d(1, 1, 3, padding=1, bias=False)
    with torch.no_grad():
        conv.weight.zero_()
        conv.weight[0, 0, 1, 1] = 1.0
    return conv


def _frames() -> tuple[torch.Tensor, torch.Tensor, np.ndarray]:
    regions = region_map(SIZE, seed=0)
    frames = torch.from_numpy(simulate(initial_states(32, regions, np.random.default_rng(0)), regions, steps=10))
    return frames[:, :-1].reshape(-1, 1, SIZE, SIZE), frames[:, 1:].reshape(-1, 1, SIZE, SIZE), regions


def _train_hidden(steps: int = 300, gate_lr_factor: float = 50.0, **layer_kwargs) -> tuple[float, SpatialMoE2d, float]:
    """dense conv → SMoE (|E| = 3, E = 1, experts at the true stencils in shuffled order) → dense conv, trained
    with Adam (experts lr 1e-3, gate lr × ``gate_lr_factor`` via :func:`parameter_groups`, dense layers 1e-5)
    on one-step MSE; the RC labels come from |dL/dy| that has passed back through the dense layer after it.
    Returns (routing accuracy of the learned gate, the layer, mean label information over the steps)."""
    x, y, regions = _frames()
    torch.manual_seed(0)
    gate = TensorRoutingGate(3, SIZE, SIZE, num_selected=1)
    smoe = SpatialMoE2d(1, 3, 1, gate=gate, **{"damping": 0.0, **layer_kwargs})
    with torch.no_grad():
        smoe.experts.weight.copy_(torch.from_numpy(stencils())[[2, 0, 1]].unsqueeze(1))
    before, after = _delta_conv(), _delta_conv()
    net = nn.Sequential(before, smoe, after)
    # the dense layers train slowly (1e-5): at the experts' 1e-3, Adam moves every tap ~1e-3 per step whatever
    # its gradient, and within 300 steps the two dense layers drift into a different factorisation of the
    # stencils (routing accuracy 0.62 at 1e-3, 0.74 at 1e-4, 1.0 at 1e-5 and frozen, measured)
    groups = [*parameter_groups(smoe, 1e-3, gate_lr_factor), {"params": [before.weight, after.weight], "lr": 1e-5}]
    opt = torch.optim.Adam(groups, lr=1e-3)
    g = torch.Generator().manual_seed(0)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    information = []
    try:
        for _ in range(steps):
            i = torch.randint(0, x.shape[0], (32,), generator=g)
            loss = nn.functional.mse_loss(net(x[i]), y[i])
            opt.zero_grad()
            loss.backward()
            opt.step()
            if smoe.last_label_information is not None:
                information.append(float(smoe.last_label_information))
    finally:
        torch.set_num_threads(threads)
    accuracy = routing_accuracy(gate.weight.detach().argmax(0).numpy(), regions)
    return accuracy, smoe, float(np.mean(information)) if information else float("nan")


def test_parameter_groups_put_gates_in_their_own_group() -> None:
    gate = TensorRoutingGate(3, 4, 4)
    net = nn.Sequential(_delta_conv(), SpatialMoE2d(1, 3, 1, gate=gate))
    one = parameter_groups(net, 1e-3, 1.0)
    assert len(one) == 1 and len(one[0]["params"]) == 3  # factor 1: the optimizer state of every earlier run
    two = parameter_groups(net, 1e-3, 10.0)
    assert [len(g["params"]) for g in two] == [2, 1] and two[1]["params"][0] is gate.weight
    assert two[1]["lr"] == pytest.approx(1e-2)
    gate.weight.requires_grad_(False)  # a frozen gate is not optimised at all
    assert parameter_groups(net, 1e-3, 10.0) == [{"params": [p for p in net.parameters() if p.requires_grad]}]


def test_rc_labels_find_the_regions_from_a_hidden_layer() -> None:
    """RC labels carried by |dL/dy| of a hidden SMoE still find the right expert per region, far above
    chance (1/3); the labels carry WHERE information (the flagged share is off 1 − q at > 20 % of the grid).
    With one slot per location the per-slot threshold IS the per-sample one: the same gate comes out."""
    accuracy, layer, information = _train_hidden(rc_threshold="sample")
    assert accuracy >= 0.9, accuracy
    assert information > 0.2, information
    _, layer_slot, _ = _train_hidden(rc_threshold="slot")
    torch.testing.assert_close(layer_slot.gate.weight, layer.gate.weight, rtol=0, atol=0)


def test_slot_threshold_flags_each_output_plane_against_itself() -> None:
    """Two output planes whose error signals differ 100× in scale: the per-sample threshold flags the loud
    plane everywhere and the quiet one nowhere, the per-slot threshold flags 1 − q of each."""
    torch.manual_seed(0)
    x = torch.randn(4, 1, 8, 8)
    scale = torch.tensor([100.0, 1.0]).view(1, 2, 1, 1)
    grad = torch.rand(4, 2, 8, 8) * scale
    flagged = {}
    for threshold in ("sample", "slot"):
        layer = SpatialMoE2d(1, 4, 2, grid=(8, 8), damping=None, tolerance=0.0, rc_threshold=threshold)
        layer(x).backward(grad)
        error = grad.abs()  # F = 1: |dL/dy| per slot
        if threshold == "sample":
            limit = error.reshape(4, -1).kthvalue(int(0.3 * 128) + 1, dim=1).values.view(4, 1, 1, 1)
        else:
            limit = error.reshape(4, 2, -1).kthvalue(int(0.3 * 64) + 1, dim=2).values.view(4, 2, 1, 1)
        flagged[threshold] = (error > limit).float().mean(dim=(0, 2, 3))
        assert float(layer.last_misrouted_fraction) == pytest.approx(float(flagged[threshold].mean()), abs=1e-6)
    assert flagged["sample"][0] > 0.99 and flagged["sample"][1] < 0.5
    assert torch.allclose(flagged["slot"], torch.full((2,), 0.7), atol=0.02)
    with pytest.raises(ValueError, match="rc_threshold"):
        SpatialMoE2d(1, 4, 2, grid=(8, 8), rc_threshold="location")


def test_the_gate_learning_rate_is_what_lets_routing_move_in_a_short_run() -> None:
    """At the experts' learning rate (factor 1) the gate, started at U(−b, b), barely crosses in 300 steps;
    its own learning rate (factor 50, as the paper-level heat tests use) takes it to the region map."""
    slow, _, _ = _train_hidden(gate_lr_factor=1.0)
    fast, _, _ = _train_hidden(gate_lr_factor=50.0)
    assert fast >= 0.9 and fast > slow + 0.2, (slow, fast)


def test_task_gradient_alone_does_not_find_the_regions() -> None:
    """Paper App. B inside a network: with RC off, the straight-through task gradient of the weighted top-1
    output reaches only the SELECTED expert's score, so nothing pulls a better unselected expert up: the
    routing stays near chance where RC finds the map."""
    accuracy, _, information = _train_hidden(rc=False, weighted=True, gate_task_grad=True)
    assert accuracy < 0.6, accuracy
    assert np.isnan(information)  # no RC labels were made


def test_selection_change_counts_set_and_rank_order() -> None:
    """Swapping two experts' ranks at a location keeps the SET but changes the ORDER (the expert feeding an
    output plane): set_moved 0, order_moved = the swapped area, slots_moved = 2 slots there."""
    initial = torch.tensor([[[0, 0], [0, 0]], [[1, 1], [1, 1]]])  # (k=2, H=2, W=2): expert 0 first everywhere
    now = initial.clone()
    now[:, 0, 0] = torch.tensor([1, 0])  # swapped order at one of 4 locations
    out = selection_change(now, previous=initial, initial=initial)
    assert out["changed"] == 0.0 and out["set_moved"] == 0.0
    assert out["order_changed"] == out["order_moved"] == 0.25
    assert out["slots_moved"] == pytest.approx(2 / 8) and out["swapped"] == 0.0
    assert out["order_kept"] == pytest.approx(6 / 8)
    now[1, 1, 1] = 2  # another expert at one location: set AND order move there
    out = selection_change(now, initial=initial)
    assert out["set_moved"] == 0.25 and out["order_moved"] == 0.5 and out["swapped"] == pytest.approx(1 / 8)


def test_order_variety_is_zero_for_a_coherent_gate_and_counts_within_categories() -> None:
    prior = torch.zeros(4, 8, dtype=torch.long)
    prior[:, 4:] = 1
    gate = TensorRoutingGate(8, 4, 8, num_selected=2, init="coherent", prior=prior)
    ranked = ranked_selection(gate.weight, 2)
    assert order_variety(ranked, prior) == 0.0  # one order per category
    assert order_variety(ranked) == 0.5  # the whole grid as one category: the land half differs
    ranked = ranked.clone()
    ranked[:, 0, 0] = ranked[:, 0, 0].flip(0)  # one sea location with its own order
    assert order_variety(ranked, prior) == pytest.approx(1 / 32)


def test_routing_summary_reads_the_epoch_of_the_best_checkpoint() -> None:
    history = [{"epoch": e, "layer": "enc", "set_moved": 0.1 * e, "order_moved": 0.2 * e, "changed": 0.01,
                "order_changed": 0.5} for e in range(4)]
    out = routing_summary(history, epoch=2)
    assert out["enc"]["set_moved"] == pytest.approx(0.2) and out["enc"]["order_moved"] == pytest.approx(0.4)
    assert out["enc"]["order_changed_per_epoch"] == pytest.approx(0.5)
    assert routing_summary([]) == {}


def test_planes_off_common_order_maps_the_learned_order() -> None:
    """0 where a location keeps its category's usual ranked selection; the share of re-fed planes elsewhere."""
    from smoeweather.models.routing import planes_off_common_order

    top = np.zeros((2, 2, 3), np.int64)
    top[0], top[1] = 0, 1  # every location: expert 0 feeds plane 0, expert 1 plane 1
    top[:, 0, 0] = [1, 0]  # swapped order at one location: both planes re-fed
    top[1, 1, 2] = 5  # one plane re-fed at another
    out = planes_off_common_order(top)
    expected = np.zeros((2, 3))
    expected[0, 0], expected[1, 2] = 1.0, 0.5
    np.testing.assert_array_equal(out, expected)  # counts over 2 locations: 0, 0.5, 1 are exact
    prior = np.array([[1, 0, 0], [0, 0, 0]])  # the swapped location is its own category: its order is usual
    expected[0, 0] = 0.0
    np.testing.assert_array_equal(planes_off_common_order(top, prior), expected)


@pytest.mark.parametrize("name", ["gcm_ens_routing", "gcm_ens_routing_t850", "gcm_ens_routing_variants",
                                  "gcm_ens_routing_variants_2"])
def test_routing_study_configs_resolve_and_build(name: str, tmp_path) -> None:
    """Every arm of the committed routing studies is a valid training config whose network builds, with the
    option it exists for in effect (frozen gates, per-point head, gate learning rate, thresholds)."""
    from pathlib import Path

    from smoeweather.models.weather import build_weather_model
    from smoeweather.studies.run import load_study
    from smoeweather.training.base import SMoETrainingModule
    from smoeweather.training.schema import validate_train_config

    study = load_study(Path(__file__).resolve().parents[2] / "configs" / "studies" / f"{name}.yaml")
    assert len(study.seeds) >= 3 and study.steps == 1500 and study.baseline == "unet"
    land = torch.zeros(8, 16)
    land[:, 8:] = 1.0
    for variant in study.variants:
        cfg = study.run_config(variant, 0, tmp_path)
        validate_train_config(cfg)
        assert cfg["data"]["target_variables"] == list(study.targets) and cfg["data"]["leads_h"] == [48]
        mcfg = dict(cfg["model"], in_channels=8, out_channels=2, grid=[8, 16])
        net = build_weather_model(mcfg, land_sea_prior=land if mcfg.get("gate_prior") else None)
        gates = list(getattr(net, "gates", {}).values())
        module = SMoETrainingModule(net, gate_lr_factor=float(cfg.get("training", {}).get("gate_lr_factor", 1.0)))
        groups = module.configure_optimizers()["optimizer"].param_groups
        if variant.name == "smoe_frozen":
            assert gates and not any(p.requires_grad for g in gates for p in g.parameters())
        if variant.name == "unet_affine":
            assert net.head_scale is not None and net.head_scale.shape == (2, 8, 16)
        if variant.name == "smoe_gate_lr10":
            assert [g["lr"] for g in groups] == [pytest.approx(1e-3), pytest.approx(1e-2)]
        else:
            assert len(groups) == 1
        if variant.name == "smoe_slot_rc":
            assert all(m.rc_threshold == "slot" for m in net.modules() if isinstance(m, SpatialMoE2d))
        if variant.name == "smoe_task_grad":
            assert all(m.weighted and m.gate_gets_task_grad and not m.rc
                       for m in net.modules() if isinstance(m, SpatialMoE2d))
        if variant.name == "smoe_unshared":
            assert len(gates) == sum(isinstance(m, SpatialMoE2d) for m in net.modules())


def test_resnet_routing_study_arms(tmp_path) -> None:
    """gcm_16x3_cpu_routing: the learned and frozen arms build the same coherent land-sea routing; only the
    frozen one's gate is not trainable; the baseline is dense."""
    from pathlib import Path

    from smoeweather.models.weather import build_weather_model
    from smoeweather.studies.run import load_study
    from smoeweather.training.schema import validate_train_config

    study = load_study(Path(__file__).resolve().parents[2] / "configs" / "studies" / "gcm_16x3_cpu_routing.yaml")
    assert len(study.seeds) >= 3 and study.baseline == "dense"
    land = torch.zeros(8, 16)
    land[:, 8:] = 1.0
    routing = {}
    for variant in study.variants:
        cfg = study.run_config(variant, 0, tmp_path)
        validate_train_config(cfg)
        mcfg = dict(cfg["model"], in_channels=4, out_channels=2, grid=[8, 16])
        torch.manual_seed(0)
        net = build_weather_model(mcfg, land_sea_prior=land)
        gates = list(getattr(net, "gates", {}).values())
        if variant.name == "dense":
            assert not gates
            continue
        assert all(g.init == "coherent" for g in gates)
        assert all(m.damping is None for m in net.modules() if isinstance(m, SpatialMoE2d))
        assert all(p.requires_grad != variant.name.endswith("_frozen") for g in gates for p in g.parameters())
        routing[variant.name] = [g.top_indices(g.num_experts // 2)[0] for g in gates]
    learned, frozen = routing["smoe_all_prior_coherent"], routing["smoe_all_prior_coherent_frozen"]
    assert all(torch.equal(a, b) for a, b in zip(learned, frozen, strict=True))
