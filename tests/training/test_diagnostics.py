"""Routing diagnostics: closed forms of the layout metrics, the error-scale measurement against the layer's
own RC labels, and the callback inside a real (tiny) training run."""

from __future__ import annotations

import math
from pathlib import Path

import lightning as L
import numpy as np
import pandas as pd
import pytest
import torch

from smoeweather.config import read_config
from smoeweather.nn.gates import TensorRoutingGate
from smoeweather.nn.smoe import SpatialMoE2d
from smoeweather.training.diagnostics import (
    RoutingDiagnostics,
    ranked_selection,
    routing_layout,
    selection_change,
    top_sets,
)
from smoeweather.training.run import train
from smoeweather.training.tasks import build

REPO = Path(__file__).resolve().parents[2]


def test_layout_metrics_closed_form() -> None:
    # |E| = 4, k = 2 on a 1×2 grid: location 0 selects {0, 1} (scores 3, 2 | 1, 0), location 1 selects {2, 3}
    scores = torch.tensor([[3.0, 0.0], [2.0, 1.0], [1.0, 5.0], [0.0, 4.0]]).view(4, 1, 2)
    out = routing_layout(scores, 2, prior=torch.tensor([[0, 1]]))  # sea → experts {0, 1}, land → {2, 3}
    assert out["margin"] == pytest.approx(((2 - 1) + (4 - 1)) / 2)
    assert out["usage"] == [0.5, 0.5, 0.5, 0.5] and out["unused"] == 0.0
    assert out["prior_agreement"] == 1.0
    p = torch.softmax(torch.tensor([3.0, 2.0, 1.0, 0.0]), 0)
    h0 = float(-(p * p.log()).sum())
    p1 = torch.softmax(torch.tensor([0.0, 1.0, 5.0, 4.0]), 0)
    h1 = float(-(p1 * p1.log()).sum())
    assert out["entropy"] == pytest.approx((h0 + h1) / 2 / math.log(4), rel=1e-6)
    flipped = routing_layout(scores, 2, prior=torch.tensor([[1, 0]]))
    assert flipped["prior_agreement"] == 0.0
    assert routing_layout(torch.zeros(4, 3, 3), 2)["entropy"] == pytest.approx(1.0, rel=1e-6)
    assert torch.equal(top_sets(scores, 2)[:, 0, 0], torch.tensor([0, 1]))


@pytest.mark.parametrize("tolerance", [0.0, 1e-5, 0.3])
def test_error_scale_matches_the_layers_own_labels(tolerance: float) -> None:
    """One SMoE layer as the whole model with a mean-squared error: dL/dy = 2 (y − t) / N, so the threshold in
    tolerance units is the q-quantile of |y − t| itself, and the layer's flagged fraction is the hook's
    fraction with tolerance 0 only when the tolerance is 0."""
    torch.manual_seed(0)
    layer = SpatialMoE2d(3, 4, 1, grid=(8, 16), rc=True, damping=None, tolerance=tolerance)
    cb = RoutingDiagnostics(error_scale=True)
    cb._layers = {"smoe": layer}
    handle = layer.register_forward_hook(cb._watch_error("smoe"))
    x, t = torch.randn(5, 3, 8, 16), torch.randn(5, 1, 8, 16)
    y = layer(x)
    torch.nn.functional.mse_loss(y, t).backward()
    handle.remove()
    err = (y - t).detach().abs().reshape(5, -1)
    k = math.ceil(layer.quantile * err.shape[1])
    expected = err.kthvalue(k, dim=1).values.mean()
    # float32: a handful of ops on values O(1)
    assert float(cb._sums["smoe"]["threshold_out"][0]) == pytest.approx(float(expected), rel=1e-5)
    no_tol = float(cb._sums["smoe"]["flagged_no_tol"][0])  # [sum, batches] of one batch
    assert no_tol == pytest.approx(1 - k / err.shape[1], abs=1.0 / err.shape[1])  # ties are measure-zero
    flagged = float(layer.last_misrouted_fraction)
    if tolerance == 0.0:
        assert flagged == no_tol
    else:
        assert flagged <= no_tol
    if tolerance == 0.3:
        assert flagged < no_tol  # O(1) errors: a 0.3 slack removes a visible share of the flags


def test_callback_in_training_logs_every_layer(world_store: str, tmp_path: Path) -> None:
    overrides = [
        f"data.store={world_store}", "data.world=null", "data.num_workers=0", "data.batch_size=4",
        "data.train_years=null", "data.valid_years=null", "data.test_years=null",
        "data.train_period=[2000-01-01, 2000-02-29T18:00]", "data.valid_period=[2000-03-01, 2000-03-20]",
        "data.test_period=[2000-03-21, 2000-04-09]", "data.variables=[geopotential_500, temperature_850]",
        "data.lead_choices_h=[24]", "model.width=8", "model.blocks=1", "trainer.max_epochs=2",
        "trainer.limit_train_batches=3", "trainer.limit_val_batches=1", "trainer.max_time=null",
        "trainer.enable_progress_bar=false", "training.diagnose_error_scale=true", f"output_dir={tmp_path}",
    ]
    cfg = read_config(REPO / "configs/weatherbench/world_smoe_all_prior.yaml", overrides)
    L.seed_everything(0, workers=True, verbose=False)
    _, module0 = build(cfg)  # the same seeded init train() builds
    gate0 = next(iter(module0.model.net.gates.values())).weight.detach().clone()
    result = train(cfg)
    cb = next(c for c in result.trainer.callbacks if isinstance(c, RoutingDiagnostics))
    layers = {h["layer"] for h in cb.history}
    assert layers == {"blocks.0.block1.layer", "blocks.0.block2.layer"}
    first = [h for h in cb.history if h["epoch"] == 0]
    gate1 = next(iter(result.module.model.net.gates.values())).weight.detach()
    assert len(result.trainer.callbacks) and result.trainer.current_epoch == 2
    # epoch-0 change: independent recomputation needs the gate after epoch 0; with shared gates both layers
    # report the same value, and it is a fraction of the 32×64 grid
    for h in first:
        assert h["changed"] * 32 * 64 == pytest.approx(round(h["changed"] * 32 * 64))
        assert 0.0 <= h["flagged"] <= h["flagged_no_tol"] <= 1.0
        assert h["threshold_out"] > 0 and h["rc_loss"] > 0
        assert h["prior_agreement"] <= 1.0 and h["unused"] == 0.0
    total_changed = float((top_sets(gate1, 8) != top_sets(gate0, 8)).any(0).float().mean())
    assert total_changed <= sum(h["changed"] for h in cb.history if h["layer"] == "blocks.0.block1.layer")
    metrics = pd.read_csv(next((tmp_path / "logs").rglob("metrics.csv")))
    cols = [c for c in metrics.columns if c.startswith("routing/blocks.0.block1.layer/")]
    assert {"routing/blocks.0.block1.layer/flagged", "routing/blocks.0.block1.layer/changed"} <= set(cols)
    assert np.isfinite(metrics["routing/blocks.0.block1.layer/flagged"].dropna()).all()


class _RecordRC(L.Callback):
    """Every batch's RC loss per SMoE layer, read after the batch (the value the diagnostics would log)."""

    def __init__(self) -> None:
        self.values: list[dict[str, float]] = []

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: object) -> None:
        self.values.append({name.removeprefix("model.net."): float(m.last_rc_loss)
                            for name, m in pl_module.named_modules() if isinstance(m, SpatialMoE2d)})


def test_routing_log_every_samples_the_logged_means_and_not_the_training(world_store: str, tmp_path: Path) -> None:
    """``training.routing_log_every=2`` reads the per-batch routing values after batches 0 and 2 of each 3-batch
    epoch: the logged epoch means are the means over exactly those batches, and training is bitwise the same
    as with every batch read."""
    runs = {}
    for every in (1, 2):
        out = tmp_path / f"every{every}"
        cfg = read_config(REPO / "configs/weatherbench/world_smoe_all_prior.yaml", [
            f"data.store={world_store}", "data.world=null", "data.num_workers=0", "data.batch_size=4",
            "data.train_years=null", "data.valid_years=null", "data.test_years=null",
            "data.train_period=[2000-01-01, 2000-02-29T18:00]", "data.valid_period=[2000-03-01, 2000-03-20]",
            "data.test_period=[2000-03-21, 2000-04-09]", "data.variables=[geopotential_500, temperature_850]",
            "data.lead_choices_h=[24]", "model.width=8", "model.blocks=1", "trainer.max_epochs=2",
            "trainer.limit_train_batches=3", "trainer.limit_val_batches=1", "trainer.max_time=null",
            "trainer.enable_progress_bar=false", f"training.routing_log_every={every}", f"output_dir={out}"])
        recorder = _RecordRC()
        result = train(cfg, extra_callbacks=[recorder])
        cb = next(c for c in result.trainer.callbacks if isinstance(c, RoutingDiagnostics))
        runs[every] = (result, cb, recorder)
        assert len(recorder.values) == 6
        for h in cb.history:
            sampled = [recorder.values[3 * h["epoch"] + i][h["layer"]] for i in range(0, 3, every)]
            assert h["rc_loss"] == pytest.approx(sum(sampled) / len(sampled), rel=1e-6)
        metrics = pd.read_csv(next((out / "logs").rglob("metrics.csv")))
        train_rc = metrics["train_rc"].dropna().to_numpy()
        expected = [np.mean([sum(recorder.values[3 * epoch + i].values()) for i in range(0, 3, every)])
                    for epoch in range(2)]
        np.testing.assert_allclose(train_rc, expected, rtol=1e-6)
    weights = [dict(runs[every][0].module.state_dict()) for every in (1, 2)]
    assert weights[0].keys() == weights[1].keys()
    # how often metrics are logged never touches training: the same code path, the same bits
    assert all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0])
    assert runs[1][2].values == runs[2][2].values  # the same RC losses batch by batch


def test_selection_change_gap_and_swap_closed_form() -> None:
    # |E| = 4, k = 2 on a 1×2 grid; ranked selections (slot 0 = highest score)
    scores = torch.tensor([[3.0, 0.0], [2.0, 1.0], [1.0, 5.0], [0.0, 4.0]]).view(4, 1, 2)
    now = ranked_selection(scores, 2)
    assert now[:, 0, 0].tolist() == [0, 1] and now[:, 0, 1].tolist() == [2, 3]
    layout = routing_layout(scores, 2)
    assert layout["selected_mean"] == pytest.approx((3 + 2 + 5 + 4) / 4)
    assert layout["unselected_mean"] == pytest.approx((1 + 0 + 0 + 1) / 4)
    assert layout["gap"] == pytest.approx(3.5 - 0.5)
    # location 0: same set, order reversed; location 1: the set swapped wholesale ({0, 1} before)
    before = torch.tensor([[1, 0], [0, 1]]).view(2, 1, 2)
    out = selection_change(now, previous=before, initial=before)
    assert out["changed"] == 0.5  # one of two locations has another set
    assert out["order_kept"] == 0.0  # no slot holds the same expert
    assert out["swapped"] == 0.5  # location 1 lost both initial experts, location 0 none
    assert selection_change(now, now, now) == {"changed": 0.0, "order_changed": 0.0, "order_kept": 1.0,
                                               "set_moved": 0.0, "order_moved": 0.0, "slots_moved": 0.0,
                                               "swapped": 0.0}


def test_vision_training_logs_routing_diagnostics(tmp_path: Path) -> None:
    """`smoe train` of the SMoE-CNN logs the routing diagnostics per epoch (changed, gap, swapped, order kept,
    flagged) for each of its three SMoE layers."""
    overrides = [f"output_dir={tmp_path}", "model.channels=8", "model.smoe.num_experts=16", "data.max_train=128",
                 "trainer.max_epochs=2", "trainer.limit_val_batches=1", "trainer.enable_progress_bar=false"]
    cfg = read_config(REPO / "configs/vision/smoe_cnn.yaml", overrides)
    result = train(cfg)
    cb = next(c for c in result.trainer.callbacks if isinstance(c, RoutingDiagnostics))
    assert {h["layer"] for h in cb.history} == {"layers.0.0", "layers.1.0", "layers.2.0"}
    metrics = pd.read_csv(next((tmp_path / "logs").rglob("metrics.csv")))
    for key in ("changed", "gap", "swapped", "order_kept", "flagged"):
        values = metrics[f"routing/layers.1.0/{key}"].dropna()
        assert len(values) == 2 and np.isfinite(values).all()
    q = cfg["model"]["smoe"]["quantile"]
    assert np.allclose(metrics["routing/layers.1.0/flagged"].dropna(), 1 - q, atol=0.01)  # 1 − q, Finding 2


def test_layers_sharing_a_gate_share_its_epoch_metrics() -> None:
    """``epoch_metrics`` computes a shared gate's routing metrics once; every layer still gets exactly what the
    per-layer computation gives (change against its own previous and initial routing, layout), and a layer with
    its own gate gets its own."""
    torch.manual_seed(0)
    shared, own = TensorRoutingGate(6, 4, 5, num_selected=2), TensorRoutingGate(6, 4, 5, num_selected=2)
    layers = {"a": SpatialMoE2d(1, 6, 2, gate=shared), "b": SpatialMoE2d(2, 6, 2, gate=shared),
              "c": SpatialMoE2d(2, 6, 2, gate=own)}
    callback = RoutingDiagnostics()
    callback._layers = layers
    initial = {name: ranked_selection(layer.gate.weight, 2) for name, layer in layers.items()}
    callback._previous, callback._initial = dict(initial), dict(initial)
    for _ in range(2):
        with torch.no_grad():
            shared.weight.add_(torch.randn_like(shared.weight))
            own.weight.add_(torch.randn_like(own.weight))
        previous = dict(callback._previous)
        got = callback.epoch_metrics()
        for name, layer in layers.items():
            now = ranked_selection(layer.gate.weight, 2)
            expected = {**selection_change(now, previous[name], initial[name]),
                        **routing_layout(layer.gate.weight, 2, None)}
            assert got[name] == expected, name
    assert got["a"] == got["b"] and got["a"] != got["c"]
