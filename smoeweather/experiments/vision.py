"""``smoe vision benchmark``: ViT, V-MoE (k = 1, 2), E³, ResBlock-MoE (soft, hard), EMoE, SMoE-CNN and a
conv CNN trained with one step budget on the same images; accuracy, NLL, 15-bin ECE, Brier, member
diversity, MSP OOD detection (pixel-shuffled test images), parameters and forward FLOPs per image;
interpretability outputs (expert × class heatmaps, utilisation table, EMoE selection frequency) and the
V-MoE inference capacity sweep (BPR vs vanilla).

Training is a plain loop over the same loss functions as :class:`ClassificationModule` (mean member
cross-entropy + weighted aux losses, Adam at a constant lr): the benchmark needs no checkpoints or
validation-driven schedules, and a loop keeps nine short trainings cheap on 2 CPU cores.
"""

from __future__ import annotations

import argparse
import copy
import json
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from smoeweather.config import apply_overrides, deep_merge, load_config
from smoeweather.data.images import load_images, shuffled_pixels, standardise
from smoeweather.io import write_json, write_text
from smoeweather.metrics.classification import (
    ECE_BINS,
    classification_scores,
    expert_class_matrix,
    utilisation,
)
from smoeweather.models.vision import apply_emoe, build_vision_model
from smoeweather.nn.emoe import emoe_layers
from smoeweather.nn.resblock_moe import ResBlockMoE
from smoeweather.nn.vit import moe_layers, set_eval_capacity
from smoeweather.training.vision import member_cross_entropy, weighted_aux_loss

ROWS = ("vit", "vmoe_k1", "vmoe_k2", "e3", "resblock_moe_soft", "resblock_moe_hard", "emoe", "smoe_cnn", "cnn")
CONFIG_DIR = Path(__file__).resolve().parents[2] / "configs" / "vision"


def row_model_config(row: str, overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """The ``model`` block of ``configs/vision/<row>.yaml`` (EMoE: of vit.yaml, converted later)."""
    cfg = load_config(CONFIG_DIR / f"{'vit' if row == 'emoe' else row}.yaml")["model"]
    return deep_merge(cfg, overrides or {})


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def flops_per_image(model: nn.Module, x: torch.Tensor) -> float:
    """Forward FLOPs per image in eval mode, counted by torch's FlopCounterMode (2 per multiply-add) on
    the operations actually run: routed MoE experts count only for their dispatched tokens; SMoE layers
    compute every expert everywhere (the paper's naïve implementation) and count that way."""
    model.eval()
    flags = [p.requires_grad for p in model.parameters()]
    for p in model.parameters():  # FlopCounterMode's module tracker hooks tensors that require grad
        p.requires_grad_(False)
    try:
        with torch.no_grad(), FlopCounterMode(display=False) as counter:
            model(x)
    finally:
        for p, flag in zip(model.parameters(), flags):
            p.requires_grad_(flag)
    return counter.get_total_flops() / x.shape[0]


def train_steps(model: nn.Module, loader: Any, steps: int, lr: float, aux_weight: float, seed: int,
                on_step: Any = None) -> None:
    """``steps`` Adam steps of mean member CE + weighted aux losses over a reshuffled ``loader``."""
    torch.manual_seed(seed)
    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=lr)
    model.train()
    step = 0
    while step < steps:
        for x, y in loader:
            loss = member_cross_entropy(model(x), y)
            aux = weighted_aux_loss(model, aux_weight)
            (loss if aux is None else loss + aux).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            step += 1
            if on_step is not None:
                on_step(step)
            if step >= steps:
                break


@torch.no_grad()
def predict(model: nn.Module, images: torch.Tensor, batch: int = 512,
            token_gates: list[np.ndarray] | None = None) -> tuple[np.ndarray, np.ndarray | None]:
    """(M, N, K) member probabilities and (N, E) per-image gates of the last MoE layer (None if none);
    V-MoE/E³ token gates (T, E) of that layer are appended to ``token_gates`` when given."""
    model.eval()
    probs, gates = [], []
    layers = moe_layers(model)
    for i in range(0, len(images), batch):
        x = images[i : i + batch]
        probs.append(model(x).float().softmax(dim=-1).numpy())
        g = image_gates(model, len(x))
        if token_gates is not None and layers:
            token_gates.append(layers[-1].last_gates.numpy())
        if g is not None:
            gates.append(g)
    return np.concatenate(probs, axis=1), (np.concatenate(gates) if gates else None)


def image_gates(model: nn.Module, batch: int) -> np.ndarray | None:
    """Per-image gate weights (B, E) of the last MoE layer after a forward: ResBlock-MoE gates as they
    are, V-MoE/E³ token gates averaged over an image's tokens (E³: over members too)."""
    res = [m for m in model.modules() if isinstance(m, ResBlockMoE)]
    if res:
        return res[-1].last_gates.numpy()
    layers = moe_layers(model)
    if layers and layers[-1].last_gates is not None:
        g = layers[-1].last_gates.numpy()  # (M·B·P, E)
        return g.reshape(layers[-1].partitions, batch, -1, g.shape[1]).sum(0).mean(1)  # (M, B, P, E) → (B, E)
    return None


def _scores(model: nn.Module, test_x: torch.Tensor, test_y: np.ndarray, ood_x: torch.Tensor) -> dict[str, Any]:
    tokens: list[np.ndarray] = []
    probs, gates = predict(model, test_x, token_gates=tokens)
    ood_probs, _ = predict(model, ood_x)
    return {"scores": classification_scores(probs, test_y, ood_probs), "gates": gates,
            "token_gates": np.concatenate(tokens) if tokens else None}


def run_benchmark(out: str | Path, quick: bool = False, config: str | Path | None = None,
                  only: list[str] | None = None, overrides: list[str] | tuple[str, ...] = ()) -> dict[str, Any]:
    """Train and score the rows; write ``out/vision_benchmark.json``, ``.md`` and figures. Returns the JSON."""
    from smoeweather.plotting.vision import plot_expert_class_heatmap, plot_selection_frequency

    cfg = load_config(config or CONFIG_DIR / "benchmark.yaml")
    quick_block = cfg.pop("quick", {}) or {}
    if quick:
        cfg = deep_merge(cfg, quick_block)
    cfg = apply_overrides(cfg, overrides)  # command-line overrides win over the quick block
    rows = list(only or cfg.get("rows", ROWS))
    unknown = sorted(set(rows) - set(ROWS))
    if unknown:
        raise ValueError(f"unknown vision benchmark rows {unknown}; expected some of {', '.join(ROWS)}")
    if "emoe" in rows and "vit" not in rows:
        rows.insert(0, "vit")  # EMoE converts the trained vit row
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    seed, steps, lr = int(cfg.get("seed", 0)), int(cfg["steps"]), float(cfg.get("lr", 1e-3))
    aux_weight = float(cfg.get("aux_weight", 0.01))
    dcfg = cfg.get("data", {})
    splits = load_images(dcfg.get("dataset", "digits"), dcfg.get("path"), seed=seed, max_train=dcfg.get("max_train"))
    datasets, mean, std = standardise(splits)
    test_x, test_y = datasets["test"].images, splits.labels["test"]
    ood = (shuffled_pixels(splits.images["test"], seed) - mean[None, :, None, None]) / std[None, :, None, None]
    ood_x = torch.from_numpy(ood.astype(np.float32))
    c, h, w = splits.shape
    k = len(splits.classes)
    generator = torch.Generator().manual_seed(seed)
    loader = torch.utils.data.DataLoader(datasets["train"], batch_size=int(dcfg.get("batch_size", 64)), shuffle=True,
                                         drop_last=True, generator=generator)
    model_overrides = cfg.get("model_overrides", {}) or {}
    results: dict[str, Any] = {"rows": [], "utilisation": {}, "notes": {}}
    models: dict[str, nn.Module] = {}
    extra_md: list[str] = []
    for row in [r for r in ROWS if r in rows]:
        torch.manual_seed(seed)
        if row == "emoe":
            model = copy.deepcopy(models["vit"])
            last = len(model.blocks) - 1
            apply_emoe(model, experts=4, k=2, blocks=[last], seed=seed)
            history: list[np.ndarray] = []
            log_every = int(cfg.get("emoe_log_every", 25))
            layer = emoe_layers(model)[0]

            def record(step: int, layer: Any = layer, history: list = history, every: int = log_every) -> None:
                if step % every == 0:
                    total = layer.counts.sum().item() / layer.k
                    history.append((layer.counts / max(total, 1)).numpy().copy())
                    layer.counts.zero_()

            row_steps = int(cfg["emoe_steps"])
            train_steps(model, loader, row_steps, lr, aux_weight, seed, on_step=record)
            dense = copy.deepcopy(models["vit"])
            train_steps(dense, loader, row_steps, lr, aux_weight, seed)
            results["notes"]["vit_dense_finetuned"] = _scores(dense, test_x, test_y, ood_x)["scores"]
            if history:
                freq = np.stack(history)
                plot_selection_frequency(np.arange(1, len(freq) + 1) * log_every, freq, out / "emoe_selection.png")
                results["notes"]["emoe_selection_frequency"] = freq.round(4).tolist()
        else:
            model = build_vision_model(row_model_config(row, model_overrides.get(row)), c, k, (h, w))
            row_steps = steps
            train_steps(model, loader, steps, lr, aux_weight, seed)
        models[row] = model
        res = _scores(model, test_x, test_y, ood_x)
        flops = flops_per_image(model, test_x[:64])
        results["rows"].append({"name": row, **{m: round(v, 5) for m, v in res["scores"].items()},
                                "params": count_parameters(model), "flops": round(flops), "steps": row_steps})
        if res["gates"] is not None:
            # V-MoE/E³: per token (the routing unit); ResBlock-MoE: per image
            util = utilisation(res["token_gates"] if res["token_gates"] is not None else res["gates"])
            results["utilisation"][row] = util
            plot_expert_class_heatmap(expert_class_matrix(res["gates"], test_y, k), splits.classes,
                                      f"{row}: mean gate weight per class (test)", out / f"experts_{row}.png")
        print(f"vision benchmark: {row}: " + json.dumps(results["rows"][-1]), flush=True)
    if "vmoe_k2" in models:
        results["capacity_sweep"] = capacity_sweep(models["vmoe_k2"], cfg.get("capacity_sweep", []), test_x, test_y)
    flops = {r["name"]: r["flops"] for r in results["rows"]}
    if {"e3", "vmoe_k1", "vmoe_k2"} <= set(flops):
        results["flops_comparison"] = {
            "e3": flops["e3"], "vmoe_k2": flops["vmoe_k2"], "deep_ensemble_2x_vmoe_k1": 2 * flops["vmoe_k1"],
            "e3_vs_vmoe_k2": round(flops["e3"] / flops["vmoe_k2"] - 1, 4),
            "e3_vs_deep_ensemble": round(flops["e3"] / (2 * flops["vmoe_k1"]) - 1, 4)}
    results["provenance"] = {"data": splits.source, "splits": {s: int(len(v)) for s, v in splits.labels.items()},
                             "steps": steps, "lr": lr, "quick": quick, "seed": seed, "ece_bins": ECE_BINS,
                             "ood": "test images with pixels randomly permuted; score = max softmax probability",
                             "torch": torch.__version__}
    write_json(out / "vision_benchmark.json", results)
    write_text(out / "vision_benchmark.md", markdown(results, extra_md))
    return results


@torch.no_grad()
def capacity_sweep(model: nn.Module, ratios: list[float], x: torch.Tensor, y: np.ndarray) -> list[dict[str, Any]]:
    """Test accuracy of a trained V-MoE at inference capacity ratios C, with BPR and with vanilla routing."""
    layers = moe_layers(model)
    saved = [(m.bpr, m.eval_capacity_ratio) for m in layers]
    out = []
    for ratio in ratios:
        entry: dict[str, Any] = {"capacity_ratio": float(ratio)}
        for bpr in (True, False):
            for m in layers:
                m.bpr = bpr
            set_eval_capacity(model, float(ratio))
            probs, _ = predict(model, x)
            acc = float((probs.mean(0).argmax(1) == y).mean())
            entry["accuracy_bpr" if bpr else "accuracy_vanilla"] = round(acc, 5)
            entry["dropped_bpr" if bpr else "dropped_vanilla"] = round(float(layers[-1].last_dropped), 4)
        out.append(entry)
    for m, (bpr, ratio) in zip(layers, saved):
        m.bpr, m.eval_capacity_ratio = bpr, ratio
    return out


def markdown(results: dict[str, Any], extra: list[str] | None = None) -> str:
    """The results table (and utilisation / capacity / FLOPs tables) as markdown."""
    prov = results["provenance"]
    lines = [f"# Vision MoE benchmark ({'quick' if prov['quick'] else 'full'})", "",
             f"Data: {prov['data']}, splits {prov['splits']}; {prov['steps']} Adam steps per row (lr {prov['lr']}, "
             f"seed {prov['seed']}). ECE with {prov['ece_bins']} equal-width bins. OOD: {prov['ood']}.", "",
             "| model | accuracy | NLL | ECE | Brier | diversity KL | OOD AUROC | FPR@95 | params | FLOPs/image |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in results["rows"]:
        lines.append(f"| {r['name']} | {r['accuracy']:.4f} | {r['nll']:.4f} | {r['ece']:.4f} | {r['brier']:.4f} | "
                     f"{r['diversity_kl']:.4f} | {r['ood_auroc']:.4f} | {r['ood_fpr95']:.4f} | {r['params']:,} | "
                     f"{r['flops'] / 1e6:.3f} M |")
    if "vit_dense_finetuned" in results["notes"]:
        d = results["notes"]["vit_dense_finetuned"]
        lines += ["", f"Same extra steps as EMoE, dense (vit continued): accuracy {d['accuracy']:.4f}, "
                      f"NLL {d['nll']:.4f}, ECE {d['ece']:.4f}."]
    if results["utilisation"]:
        lines += ["", "## Expert utilisation (test set, last MoE layer; V-MoE/E³ per token, ResBlock-MoE per image)",
                  "",
                  "| model | CV samples/expert | CV importance | alive experts (≥ 1 % importance) |",
                  "|---|---|---|---|"]
        for name, u in results["utilisation"].items():
            lines.append(f"| {name} | {u['cv_samples']:.3f} | {u['cv_importance']:.3f} | {u['alive']}/{u['experts']} |")
    if results.get("capacity_sweep"):
        lines += ["", "## V-MoE k=2 at inference capacity ratio C (same weights)", "",
                  "| C | accuracy BPR | accuracy vanilla | dropped assignments BPR | dropped vanilla |",
                  "|---|---|---|---|---|"]
        for e in results["capacity_sweep"]:
            lines.append(f"| {e['capacity_ratio']} | {e['accuracy_bpr']:.4f} | {e['accuracy_vanilla']:.4f} | "
                         f"{e['dropped_bpr']:.3f} | {e['dropped_vanilla']:.3f} |")
    if results.get("flops_comparison"):
        f = results["flops_comparison"]
        lines += ["", f"FLOPs/image: E³ {f['e3']:,}, V-MoE k=2 {f['vmoe_k2']:,} (E³ {f['e3_vs_vmoe_k2']:+.1%}), "
                      f"deep ensemble of two V-MoE k=1 {f['deep_ensemble_2x_vmoe_k1']:,} "
                      f"(E³ {f['e3_vs_deep_ensemble']:+.1%})."]
    return "\n".join(lines + (extra or [])) + "\n"


def run_cli(args: argparse.Namespace) -> int:
    # one intra-op thread: these models are small (batch 64 of 8×8 images), where thread hand-offs cost
    # more than they save, badly so on a loaded machine
    torch.set_num_threads(int(args.threads))
    results = run_benchmark(args.out, quick=args.quick, config=args.config, only=args.only, overrides=args.overrides)
    print(markdown(results))
    print(f"smoe vision benchmark: wrote {Path(args.out) / 'vision_benchmark.json'}")
    return 0
