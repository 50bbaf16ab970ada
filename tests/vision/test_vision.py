"""Vision MoE baselines: V-MoE routing invariants and losses, E³ partitions, EMoE equivalence, ResBlock-MoE
constraints, classification metrics, image readers on files in the original formats, and the CLI."""

from __future__ import annotations

import gzip
import json
import pickle
import struct

import numpy as np
import pytest
import torch
from scipy.stats import mannwhitneyu, norm
from torch import nn

from smoeweather.metrics.classification import (
    brier,
    classification_scores,
    ece,
    member_diversity_kl,
    nll,
    ood_scores,
    utilisation,
)
from smoeweather.nn.emoe import balanced_kmeans, emoe_layers
from smoeweather.nn.resblock_moe import ResBlockMoE, importance_cv2, kl_to_uniform
from smoeweather.nn.vit import (
    MLP,
    MoEMLP,
    ViTClassifier,
    expert_capacity,
    moe_blocks,
    route,
    vmoe_aux_loss,
)
from smoeweather.training.base import auxiliary_loss
from smoeweather.vision.data import load_images, read_idx
from smoeweather.vision.models import ThreeLayerCNN, apply_emoe, build_vision_model
from smoeweather.vision.task import mean_probabilities, member_cross_entropy
from tests.conftest import float_tol

# ---- V-MoE routing -------------------------------------------------------------------------------------


def test_capacity_formula_and_never_exceeded() -> None:
    assert expert_capacity(100, 8, 2, 1.05) == round(2 * 100 * 1.05 / 8)  # 26.25 → 26
    assert expert_capacity(10, 4, 1, 0.01) == 1  # at least one slot
    assert expert_capacity(10, 4, 1, None) == 10
    g = torch.Generator().manual_seed(1)
    for k, ratio in ((1, 1.0), (2, 0.5), (2, 0.15), (3, 1.05)):
        probs = torch.rand(64, 6, generator=g).softmax(dim=-1)
        cap = expert_capacity(64, 6, k, ratio)
        for bpr in (False, True):
            mask = route(probs, k, cap, bpr)
            assert int(mask.sum(0).max()) <= cap
            assert int(mask.sum(1).max()) <= k
            chosen = torch.zeros_like(mask).scatter(1, probs.topk(k, dim=1).indices, True)
            assert not (mask & ~chosen).any()  # only a token's own top-k


def test_moe_layer_respects_capacity_and_does_not_renormalise() -> None:
    layer = MoEMLP(8, 16, num_experts=4, k=2, capacity_ratio=0.5).eval()
    x = torch.randn(3, 10, 8)
    layer(x)
    cap = expert_capacity(30, 4, 2, 0.5)
    kept = layer.last_gates > 0
    assert int(kept.sum(0).max()) <= cap
    probs = layer.router(x.reshape(-1, 8)).softmax(dim=-1)
    torch.testing.assert_close(layer.last_gates[kept], probs[kept], **float_tol(torch.float32, 16))
    assert layer.last_dropped > 0  # C = 0.5 with k = 2: half the assignments cannot fit


def test_top1_choices_are_allocated_before_top2() -> None:
    # tokens 0-3 prefer expert 1 and have expert 0 second; tokens 4-6 prefer expert 0
    probs = torch.tensor([[0.3, 0.6, 0.1]] * 4 + [[0.7, 0.2, 0.1]] * 3)
    mask = route(probs, k=2, capacity=3, bpr=False)
    assert mask[4:, 0].all()  # the three later top-1 choices take expert 0's capacity ...
    assert not mask[:4, 0].any()  # ... before any earlier token's top-2 choice
    assert mask[:3, 1].all() and not mask[3, 1]  # expert 1: first three top-1s in array order


def test_bpr_keeps_highest_scoring_tokens_when_capacity_is_short() -> None:
    top = torch.tensor([0.5, 0.9, 0.6, 0.95, 0.55, 0.8])
    probs = torch.stack([top, 1 - top], dim=1)  # all tokens pick expert 0 first
    bpr = route(probs, k=1, capacity=3, bpr=True)[:, 0]
    vanilla = route(probs, k=1, capacity=3, bpr=False)[:, 0]
    assert bpr.nonzero().flatten().tolist() == sorted(top.topk(3).indices.tolist())  # 0.95, 0.9, 0.8
    assert vanilla.nonzero().flatten().tolist() == [0, 1, 2]


def test_bpr_inference_with_small_capacity_degrades_gracefully() -> None:
    model = ViTClassifier(1, 10, (8, 8), patch=2, dim=16, depth=2, heads=2, num_experts=4, k=2).eval()
    x = torch.randn(16, 1, 8, 8)
    full = model(x)
    for layer in model.modules():
        if isinstance(layer, MoEMLP):
            layer.eval_capacity_ratio = 0.15
    low = model(x)
    assert torch.isfinite(low).all() and low.shape == full.shape
    layer = next(m for m in model.modules() if isinstance(m, MoEMLP))
    assert int((layer.last_gates > 0).sum(0).max()) <= expert_capacity(16 * 17, 4, 2, 0.15)


def test_vmoe_aux_loss_matches_hand_computation() -> None:
    logits = torch.tensor([[1.0, 0.0, -1.0, 0.5], [0.2, 0.3, 0.1, -0.4], [2.0, -1.0, 0.0, 0.0]], dtype=torch.float64)
    noisy = logits + torch.tensor([[0.1, -0.2, 0.0, 0.05], [0.0, 0.1, -0.1, 0.2], [-0.3, 0.0, 0.1, 0.0]],
                                  dtype=torch.float64)
    k, sigma = 2, 0.25
    p = np.exp(logits.numpy()) / np.exp(logits.numpy()).sum(1, keepdims=True)
    imp = p.sum(0)
    thr = np.sort(noisy.numpy(), axis=1)[:, -k][:, None]
    load = (1 - norm.cdf((thr - logits.numpy()) / sigma)).sum(0)
    expected = 0.5 * imp.var() / imp.mean() ** 2 + 0.5 * load.var() / load.mean() ** 2
    got = vmoe_aux_loss(logits, noisy, k, sigma).item()
    assert got == pytest.approx(expected, rel=1e-12)
    # two experts: the reference fallback E²·mean_i(frac_top1_i · mean_gate_i) replaces the load term
    two = logits[:, :2]
    p2 = np.exp(two.numpy()) / np.exp(two.numpy()).sum(1, keepdims=True)
    frac = np.bincount(noisy[:, :2].argmax(1).numpy(), minlength=2) / 3
    exp2 = 0.5 * p2.sum(0).var() / p2.sum(0).mean() ** 2 + 0.5 * 4 * np.mean(frac * p2.mean(0))
    assert vmoe_aux_loss(two, noisy[:, :2], 1, sigma).item() == pytest.approx(exp2, rel=1e-12)


def test_router_noise_only_in_training_and_aux_counted_once() -> None:
    model = build_vision_model({"name": "vmoe", "patch": 2, "dim": 16, "depth": 2, "heads": 2, "num_experts": 4},
                               1, 10, (8, 8))
    x = torch.randn(4, 1, 8, 8)
    model.eval()
    assert torch.equal(model(x), model(x))  # eval: no router noise, the same code twice gives the same bits
    model.train()
    model(x)
    layers = [m for m in model.modules() if isinstance(m, MoEMLP)]
    assert len(layers) == 1  # every-2 of depth 2: block 1 only
    assert auxiliary_loss(model).item() == pytest.approx(layers[0].aux_loss.item())  # no double counting


def test_placement() -> None:
    assert moe_blocks(6, "every_2") == [False, True, False, True, False, True]
    assert moe_blocks(6, "last_n", 2) == [False, False, False, True, False, True]
    assert moe_blocks(3, "all") == [True] * 3
    with pytest.raises(ValueError, match="placement"):
        moe_blocks(4, "first")


# ---- E³ ------------------------------------------------------------------------------------------------


def test_e3_members_route_only_inside_their_partition() -> None:
    layer = MoEMLP(8, 16, num_experts=6, k=1, partitions=2, capacity_ratio=None).train()
    x = torch.randn(2 * 5, 4, 8)  # 2 members × 5 images × 4 tokens, member-major
    layer(x)
    gates = layer.last_gates.view(2, 20, 6)
    assert (gates[0, :, 3:] == 0).all() and (gates[0, :, :3] > 0).sum(1).eq(1).all()
    assert (gates[1, :, :3] == 0).all() and (gates[1, :, 3:] > 0).sum(1).eq(1).all()


def test_e3_model_tiles_and_averages_members() -> None:
    model = build_vision_model({"name": "e3", "patch": 2, "dim": 16, "depth": 2, "heads": 2, "num_experts": 4,
                                "placement": "last_n", "last_n": 1}, 1, 10, (8, 8)).eval()
    logits = model(torch.randn(3, 1, 8, 8))
    assert logits.shape == (2, 3, 10)
    y = torch.tensor([1, 2, 3])
    ce = [nn.functional.cross_entropy(logits[m], y) for m in range(2)]
    torch.testing.assert_close(member_cross_entropy(logits, y), (ce[0] + ce[1]) / 2)  # mean member CE
    torch.testing.assert_close(mean_probabilities(logits), logits.softmax(-1).mean(0))  # mean member probs


# ---- EMoE ----------------------------------------------------------------------------------------------


def test_balanced_kmeans_groups_are_equal_and_recover_clusters() -> None:
    g = torch.Generator().manual_seed(0)
    centres = torch.randn(4, 12, generator=g) * 3
    keys = centres.repeat_interleave(8, 0) + 0.1 * torch.randn(32, 12, generator=g)
    groups = balanced_kmeans(keys, 4)
    assert torch.bincount(groups).tolist() == [8, 8, 8, 8]
    for c in range(4):  # each planted cluster is one group
        assert groups[c * 8 : (c + 1) * 8].unique().numel() == 1


def test_emoe_all_experts_equals_dense_mlp_and_conv() -> None:
    vit = ViTClassifier(1, 10, (8, 8), patch=2, dim=16, depth=2, heads=2).eval()
    x = torch.randn(5, 1, 8, 8)
    dense = vit(x)
    apply_emoe(vit, experts=4, k=4, blocks=[0, 1])
    assert torch.equal(vit(x), dense)  # k = N: the same fc1/fc2 run and act(z) · 1.0 is exact
    cnn = ThreeLayerCNN(1, 10, (8, 8), channels=8)
    cnn.train()
    cnn(torch.randn(16, 1, 8, 8))  # give BN running statistics
    cnn.eval()
    dense = cnn(x)
    apply_emoe(cnn, experts=2, k=2, blocks=[1])
    assert torch.equal(cnn(x), dense)  # k = N: the same convs run and act(z) · 1.0 is exact


def test_emoe_gate_is_mean_key_score_and_masks_other_experts() -> None:
    mlp = MLP(6, 8)
    from smoeweather.nn.emoe import emoe_mlp

    emoe_mlp(mlp, num_experts=4, k=1)
    act = mlp.act
    x = torch.randn(10, 6)
    mlp(x)
    groups = act.groups
    keys_mean = torch.stack([mlp.fc1.weight[groups == n].mean(0) for n in range(4)])
    bias_mean = torch.stack([mlp.fc1.bias[groups == n].mean() for n in range(4)])
    scores = (x @ keys_mean.T + bias_mean).detach()  # avg-k gate from the keys
    # the layer scores by the mean pre-activation (x·W + b, then the group mean), this by x·mean(W) + mean(b): the
    # same number in exact arithmetic, rounded in another order. The chosen expert is the top one to that rounding
    # (a sum of 6 products and a mean of 2 per side), not necessarily the same index on a near tie.
    chosen = act.last_mask.float().argmax(-1, keepdim=True)
    gap = scores.max(-1).values - scores.gather(-1, chosen)[:, 0]
    assert (gap <= float_tol(torch.float32, 16, scale=scores)["atol"]).all(), gap
    h = nn.functional.gelu(mlp.fc1(x)) * act.last_mask[:, groups]
    torch.testing.assert_close(mlp(x), mlp.fc2(h))
    assert sum(p.numel() for p in mlp.parameters()) == 6 * 8 + 8 + 8 * 6 + 6  # no new parameters


# ---- ResBlock-MoE --------------------------------------------------------------------------------------


def test_soft_constraint_losses_match_hand_computation() -> None:
    g = torch.tensor([[0.6, 0.4, 0.0, 0.0], [0.0, 0.5, 0.5, 0.0], [0.7, 0.0, 0.0, 0.3]], dtype=torch.float64)
    imp = np.array([1.3, 0.9, 0.5, 0.3])
    assert importance_cv2(g).item() == pytest.approx(imp.var() / imp.mean() ** 2, rel=1e-12)
    p = imp / 3
    assert kl_to_uniform(g).item() == pytest.approx(float(np.sum(p * np.log(p * 4))), rel=1e-12)
    assert kl_to_uniform(torch.full((5, 4), 0.25)).item() == pytest.approx(0.0, abs=1e-15)


def test_relative_importance_hard_constraint_switches_off_overused_expert() -> None:
    layer = ResBlockMoE(4, num_experts=4, k=2, constraint="relative", m_rel=0.5).train()
    with torch.no_grad():  # make expert 0 the favourite of every image
        layer.gate[-1].weight.zero_()
        layer.gate[-1].bias.copy_(torch.tensor([5.0, 1.0, 0.0, 0.0]))
    x = torch.randn(6, 4, 4, 4)
    layer(x)  # batch 1: nothing disabled yet; expert 0 gets I_rel > 0.5
    g = layer.last_gates
    assert (g > 0).sum(1).eq(2).all() and torch.allclose(g.sum(1), torch.ones(6))
    imp = g.sum(0)
    torch.testing.assert_close(layer.cum_relative, (imp - imp.mean()) / imp.mean())
    assert layer.cum_relative[0] > 0.5
    layer(x)  # batch 2: expert 0 is zeroed for the whole batch
    assert layer.last_disabled[0] and (layer.last_gates[:, 0] == 0).all()
    assert torch.allclose(layer.last_gates.sum(1), torch.ones(6))


def test_utilisation_counts_dead_experts() -> None:
    gates = np.array([[0.5, 0.5, 0, 0], [0.6, 0.4, 0, 0], [0.7, 0.295, 0.005, 0]])
    u = utilisation(gates)
    assert u["alive"] == 2 and u["experts"] == 4  # expert 2 has 0.005/3 < 1 % of the importance
    samples = np.array([3, 3, 1, 0.0])
    assert u["cv_samples"] == pytest.approx(samples.std() / samples.mean())


# ---- metrics -------------------------------------------------------------------------------------------


def test_classification_metrics_closed_forms() -> None:
    probs = np.array([[0.9, 0.1], [0.6, 0.4], [0.3, 0.7], [0.55, 0.45]])
    labels = np.array([0, 1, 1, 0])
    assert nll(probs, labels) == pytest.approx(-np.mean(np.log([0.9, 0.4, 0.7, 0.55])))
    assert brier(probs, labels) == pytest.approx(np.mean([0.02, 0.72, 0.18, 0.405]))
    # 15 bins of width 1/15: 0.9 → bin 13, 0.6 → bin 8, 0.7 → bin 10, 0.55 → bin 8
    # bin 8: confidences 0.6 (wrong), 0.55 (right): |0.5 − 0.575| · 2/4; bins 13, 10: |1 − 0.9|/4, |1 − 0.7|/4
    assert ece(probs, labels) == pytest.approx(0.075 * 0.5 + 0.1 / 4 + 0.3 / 4)
    members = np.stack([probs, probs[:, ::-1]])
    kl = np.mean(np.sum(probs * np.log(probs / probs[:, ::-1]), axis=1))
    assert member_diversity_kl(members) == pytest.approx(kl)  # both directions are equal here
    assert member_diversity_kl(probs[None]) == 0.0
    scores = classification_scores(members, labels)
    assert scores["accuracy"] == pytest.approx(np.mean(members.mean(0).argmax(1) == labels))


def test_ood_auroc_equals_mann_whitney_and_fpr95() -> None:
    rng = np.random.default_rng(0)
    p_in = rng.dirichlet([5, 1, 1], size=200)
    p_out = rng.dirichlet([1, 1, 1], size=150)
    s_in, s_out = p_in.max(1), p_out.max(1)
    u = mannwhitneyu(s_in, s_out).statistic
    res = ood_scores(p_in, p_out)
    assert res["ood_auroc"] == pytest.approx(u / (len(s_in) * len(s_out)))
    thr = np.sort(s_in)[::-1][int(np.ceil(0.95 * len(s_in))) - 1]  # accepts ≥ 95 % of in-distribution
    assert res["ood_fpr95"] == pytest.approx(np.mean(s_out >= thr))


# ---- data ----------------------------------------------------------------------------------------------


def _write_idx(path, array: np.ndarray, opener=open) -> None:
    with opener(path, "wb") as f:
        f.write(struct.pack(">BBBB", 0, 0, 0x08, array.ndim) + struct.pack(f">{array.ndim}i", *array.shape))
        f.write(array.astype(np.uint8).tobytes())


def test_mnist_idx_files(tmp_path) -> None:
    rng = np.random.default_rng(0)
    x_train, y_train = rng.integers(0, 256, (40, 28, 28)), np.tile(np.arange(10), 4)
    x_test, y_test = rng.integers(0, 256, (10, 28, 28)), np.arange(10)
    _write_idx(tmp_path / "train-images-idx3-ubyte.gz", x_train, gzip.open)
    _write_idx(tmp_path / "train-labels-idx1-ubyte", y_train)
    _write_idx(tmp_path / "t10k-images-idx3-ubyte", x_test)
    _write_idx(tmp_path / "t10k-labels-idx1-ubyte.gz", y_test, gzip.open)
    s = load_images("mnist", tmp_path, valid_fraction=0.25)
    assert s.shape == (1, 28, 28) and len(s.labels["train"]) == 30 and len(s.labels["valid"]) == 10
    # stored as x / 255 in float32: two roundings (the divide, then this multiply) from the integers
    np.testing.assert_allclose(s.images["test"][:, 0] * 255, x_test, rtol=2 * np.finfo(np.float32).eps, atol=0)
    np.testing.assert_array_equal(s.labels["test"], y_test)
    (tmp_path / "bad").write_bytes(b"\x01\x02\x03\x04")
    with pytest.raises(ValueError, match="bad"):
        read_idx(tmp_path / "bad")


def test_cifar_pickle_batches(tmp_path) -> None:
    rng = np.random.default_rng(0)
    c10, c100 = tmp_path / "c10", tmp_path / "c100"
    c10.mkdir()
    c100.mkdir()
    data = {}
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        data[name] = rng.integers(0, 256, (10, 3072), dtype=np.uint8)
        with open(c10 / name, "wb") as f:
            pickle.dump({b"data": data[name], b"labels": list(range(10))}, f)
    with open(c10 / "batches.meta", "wb") as f:
        pickle.dump({b"label_names": [f"c{i}".encode() for i in range(10)]}, f)
    for name, n in (("train", 20), ("test", 5)):
        with open(c100 / name, "wb") as f:
            pickle.dump({b"data": rng.integers(0, 256, (n, 3072), dtype=np.uint8),
                         b"fine_labels": [i % 100 for i in range(n)], b"coarse_labels": [0] * n}, f)
    s = load_images("cifar10", c10, valid_fraction=0.2)
    assert s.shape == (3, 32, 32) and s.classes[3] == "c3"
    assert len(s.labels["train"]) + len(s.labels["valid"]) == 50
    np.testing.assert_array_equal((s.images["test"] * 255).round().astype(np.uint8).reshape(10, -1),
                                  data["test_batch"])
    s100 = load_images("cifar100", c100, valid_fraction=0.0)
    assert len(s100.labels["train"]) == 20 and len(s100.classes) == 100
    with pytest.raises(FileNotFoundError, match="data_batch_1"):
        load_images("cifar10", tmp_path)


def test_digits_default_is_seeded_and_stratified() -> None:
    a, b = load_images(seed=3), load_images(seed=3)
    np.testing.assert_array_equal(a.labels["test"], b.labels["test"])
    assert a.shape == (1, 8, 8) and sum(len(v) for v in a.labels.values()) == 1797
    counts = np.bincount(a.labels["test"], minlength=10)
    assert counts.min() >= 34 and counts.max() <= 37  # 20 % of ~180 per class


# ---- end to end ----------------------------------------------------------------------------------------


@pytest.mark.slow
# expected: the tiny run's checkpoint can be written before the first validation gives val_loss
@pytest.mark.filterwarnings("ignore:.*could not find the monitored key:UserWarning")
def test_cli_benchmark_and_train(tmp_path) -> None:
    from smoeweather.cli import main

    torch.set_num_threads(1)
    out = tmp_path / "bench"
    assert main(["vision", "benchmark", "--out", str(out), "--quick", "--only", "vmoe_k2,resblock_moe_hard,emoe",
                 "steps=3", "emoe_steps=2", "emoe_log_every=1", "capacity_sweep=[1.05,0.15]"]) == 0
    result = json.loads((out / "vision_benchmark.json").read_text())
    assert [r["name"] for r in result["rows"]] == ["vit", "vmoe_k2", "resblock_moe_hard", "emoe"]
    for row in result["rows"]:
        assert {"name", "accuracy", "nll", "ece", "params", "flops"} <= set(row)
    vit, emoe = result["rows"][0], result["rows"][3]
    assert vit["params"] == emoe["params"]  # EMoE adds no parameters
    assert (out / "vision_benchmark.md").exists() and (out / "emoe_selection.png").exists()
    assert (out / "experts_resblock_moe_hard.png").exists()
    assert main(["vision", "benchmark", "--out", str(out), "--only", "nope"]) == 2
    run = tmp_path / "run"
    assert main(["train", "--config", "configs/vision/e3.yaml", f"output_dir={run}", "trainer.max_steps=2",
                 "trainer.limit_val_batches=1", "trainer.enable_progress_bar=false", "model.dim=16",
                 "model.depth=2"]) == 0
    assert (run / "checkpoints" / "last.ckpt").exists()
    assert emoe_layers(build_vision_model({"name": "vit", "patch": 2, "dim": 16, "depth": 2, "heads": 2,
                                           "emoe": {"experts": 4, "k": 2}}, 1, 10, (8, 8)))


def test_train_config_errors_name_the_key(tmp_path, capsys) -> None:
    from smoeweather.cli import main

    assert main(["train", "--config", "configs/vision/vit.yaml", "data.datset=digits"]) == 2
    assert "data.datset" in capsys.readouterr().err
    assert main(["train", "--config", "configs/vision/vit.yaml", "model.dimm=3", f"output_dir={tmp_path}"]) == 2
    assert "dimm" in capsys.readouterr().err
    # a GPU config: on this CPU, with the accelerator set to cpu, the missing data.path is what remains
    assert main(["train", "--config", "configs/vision/vmoe_s16_cifar10.yaml", "trainer.accelerator=cpu",
                 f"output_dir={tmp_path}"]) == 2
    assert "data.path" in capsys.readouterr().err


def test_smoe_cnn_does_not_degrade_as_it_trains() -> None:
    """The SMoE-CNN with the layer's damping 0.1 got WORSE with training (digits 0.89 at 250 steps,
    0.43 at 1000). configs/vision/smoe_cnn.yaml (damping off, q 0.7), shrunk to 16 channels / 32 experts, 300 seeded
    steps: test accuracy at 300 steps not below that at 75 and the training loss still falling. With
    ``smoe.damping=0.1`` the same run fails both (accuracy 0.76 → 0.61, loss rising after step ~200; Finding 6)."""
    from smoeweather.config import read_config
    from smoeweather.vision.table import CONFIG_DIR, collapse_run

    torch.set_num_threads(1)
    cfg = read_config(CONFIG_DIR / "smoe_cnn.yaml")["model"]
    cfg["channels"], cfg["smoe"]["num_experts"] = 16, 32
    run = collapse_run(cfg, steps=300, seed=0, eval_steps=[75, 300], log_every=75)
    acc = {e["step"]: e["accuracy"] for e in run["evals"]}
    loss = {t["step"]: t["train_loss"] for t in run["trace"]}
    assert acc[300] >= acc[75] and acc[300] > 0.85
    assert loss[300] < loss[225] < loss[150]
    assert run["trace"][-1]["flagged"] == pytest.approx(0.3, abs=0.01)  # RC still on: 1 − q flagged (q = 0.7)


class _RunsCode:
    """A pickle payload that would create a file when unpickled (what a crafted data_batch_1 does)."""

    def __init__(self, marker: object) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple:
        import os

        return os.system, (f"touch {self.marker}",)


def test_cifar_batch_that_would_run_code_is_refused_unrun(tmp_path) -> None:
    """A crafted CIFAR batch is data from elsewhere: refused by name, and its code never runs."""
    marker = tmp_path / "ran"
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        with open(tmp_path / name, "wb") as f:
            pickle.dump({b"data": _RunsCode(marker), b"labels": [0]}, f)
    with pytest.raises(ValueError, match=r"data_batch_1 is not a CIFAR batch of plain data .*os.*system"):
        load_images("cifar10", tmp_path)
    assert not marker.exists()
    with open(tmp_path / "data_batch_1", "wb") as f:  # a real batch from numpy 1 pickles under numpy.core.*
        f.write(pickle.dumps({b"data": np.zeros((2, 3072), np.uint8), b"labels": [0, 1]}, protocol=2)
                .replace(b"numpy._core.multiarray", b"numpy.core.multiarray"))
    from smoeweather.vision.data import _unpickle

    assert _unpickle(tmp_path / "data_batch_1")["data"].shape == (2, 3072)
