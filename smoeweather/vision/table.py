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

import copy
import json
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from smoeweather.config import BUILTIN_CONFIGS, apply_overrides, deep_merge, read_config
from smoeweather.io import write_json, write_text
from smoeweather.metrics.classification import (
    ECE_BINS,
    classification_scores,
    expert_class_matrix,
    utilisation,
)
from smoeweather.nn.emoe import emoe_layers
from smoeweather.nn.resblock_moe import ResBlockMoE
from smoeweather.nn.vit import moe_layers, set_eval_capacity
from smoeweather.vision.data import load_images, shuffled_pixels, standardise
from smoeweather.vision.models import apply_emoe, build_vision_model
from smoeweather.vision.task import member_cross_entropy, weighted_aux_loss

ROWS = ("vit", "vmoe_k1", "vmoe_k2", "e3", "resblock_moe_soft", "resblock_moe_hard", "emoe", "smoe_cnn", "cnn")
CONFIG_DIR = BUILTIN_CONFIGS / "vision"


def row_model_config(row: str, overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """The ``model`` block of ``configs/vision/<row>.yaml`` (EMoE: of vit.yaml, converted later)."""
    cfg = read_config(CONFIG_DIR / f"{'vit' if row == 'emoe' else row}.yaml")["model"]
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
    """``steps`` Adam steps of mean member CE + weighted aux losses over a reshuffled ``loader``;
    ``on_step(step, loss)`` after each step (``loss``: the member CE tensor of that step, before aux terms)."""
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
                on_step(step, loss.detach())
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
    from smoeweather.vision.plots import plot_expert_class_heatmap, plot_selection_frequency

    cfg = read_config(config or CONFIG_DIR / "benchmark.yaml")
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

            def record(step: int, loss: torch.Tensor, layer: Any = layer, history: list = history,
                       every: int = log_every) -> None:
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


# ---- SMoE-CNN collapse study (docs/smoe-weather-findings.md Finding 6) ------------------

COLLAPSE_CONFIG = CONFIG_DIR / "collapse.yaml"


def routing_trace_record(model: nn.Module, initial: torch.Tensor | None, previous: torch.Tensor | None,
                         flagged: list[float]) -> tuple[dict[str, Any], torch.Tensor | None]:
    """Diagnostics of the (shared) tensor gate of ``model``'s SMoE layers: selected/unselected mean logit and
    their gap, set/rank change against ``previous`` and ``initial`` (see
    :mod:`smoeweather.training.diagnostics`), and the mean flagged fraction over ``flagged`` (per-step means
    over the layers). Returns (record, the current ranked selection); ({}, None) without SMoE layers."""
    from smoeweather.nn.gates import TensorRoutingGate
    from smoeweather.nn.smoe import smoe_layers
    from smoeweather.training.diagnostics import ranked_selection, routing_layout, selection_change

    layers = [m for m in smoe_layers(model) if isinstance(m.gate, TensorRoutingGate)]
    if not layers:
        return {}, None
    weight, k = layers[0].gate.weight, layers[0].num_selected
    now = ranked_selection(weight, k)
    layout = routing_layout(weight, k)
    record = {key: round(layout[key], 5) for key in ("selected_mean", "unselected_mean", "gap", "margin")}
    record.update({key: round(v, 5) for key, v in selection_change(now, previous, initial).items()})
    record["flagged"] = round(float(np.mean(flagged)), 5) if flagged else None
    return record, now


def damping_gradient_cosine(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> list[float] | None:
    """Per SMoE layer: cosine similarity between the expert-weight gradient of the mean CE on (x, y) as the
    layer computes it (its damping) and the undamped gradient (damping None), on a copy of ``model`` in
    training mode (batch statistics; the model itself is untouched). None without damped SMoE layers."""
    from smoeweather.nn.smoe import smoe_layers

    probe = copy.deepcopy(model).train()
    layers = smoe_layers(probe)
    if not layers or all(m.damping is None for m in layers):
        return None
    damping = [m.damping for m in layers]
    grads = []
    for setting in (damping, [None] * len(layers)):
        for m, d in zip(layers, setting):
            m.damping = d
        probe.zero_grad(set_to_none=True)
        member_cross_entropy(probe(x), y).backward()
        grads.append([m.experts.weight.grad.flatten().clone() for m in layers])
    return [round(float(nn.functional.cosine_similarity(a, b, dim=0)), 4) for a, b in zip(*grads)]


def collapse_run(model_cfg: dict[str, Any], steps: int, seed: int, eval_steps: list[int], log_every: int = 50,
                 lr: float = 1e-3, batch_size: int = 64, dataset: str = "digits", path: str | None = None,
                 split_seed: int = 0) -> dict[str, Any]:
    """Train one model for ``steps`` Adam steps (constant lr, so the state at step n is that of an n-step
    budget) on a fixed seeded split; test accuracy / NLL at ``eval_steps``; training loss and routing
    diagnostics every ``log_every`` steps. ``seed`` sets the init and the data order."""
    from smoeweather.nn.smoe import smoe_layers

    splits = load_images(dataset, path, seed=split_seed)
    datasets, _, _ = standardise(splits)
    test_x, test_y = datasets["test"].images, torch.as_tensor(splits.labels["test"])
    probe_x, probe_y = datasets["train"].images[:256], torch.as_tensor(splits.labels["train"][:256])
    c, h, w = splits.shape
    generator = torch.Generator().manual_seed(seed)
    loader = torch.utils.data.DataLoader(datasets["train"], batch_size=batch_size, shuffle=True, drop_last=True,
                                         generator=generator)
    torch.manual_seed(seed)
    model = build_vision_model(model_cfg, c, len(splits.classes), (h, w))
    layers = smoe_layers(model)
    _, initial = routing_trace_record(model, None, None, [])
    previous = initial
    losses: list[float] = []
    flagged: list[float] = []
    evals: list[dict[str, Any]] = []
    trace: list[dict[str, Any]] = []

    def on_step(step: int, loss: torch.Tensor) -> None:
        nonlocal previous
        losses.append(float(loss))
        fractions = [m.last_misrouted_fraction for m in layers if m.last_misrouted_fraction is not None]
        if fractions:
            flagged.append(float(torch.stack(fractions).mean()))
        if step % log_every == 0:
            record, previous = routing_trace_record(model, initial, previous, flagged[-log_every:])
            trace.append({"step": step, "train_loss": round(float(np.mean(losses[-log_every:])), 5), **record})
        if step in eval_steps:
            with torch.no_grad():
                model.eval()
                logits = model(test_x)[0].float()
                model.train()
            evals.append({"step": step, "accuracy": round(float((logits.argmax(1) == test_y).float().mean()), 5),
                          "nll": round(float(nn.functional.cross_entropy(logits, test_y)), 5),
                          "damping_grad_cosine": damping_gradient_cosine(model, probe_x, probe_y)})

    train_steps(model, loader, steps, lr, 0.0, seed, on_step=on_step)
    return {"evals": evals, "trace": trace, "params": count_parameters(model)}


def collapse_study(out: str | Path, config: str | Path | None = None, arms: list[str] | None = None,
                   seeds: list[int] | None = None) -> list[Path]:
    """Run the (arm, seed) jobs of the collapse study config not yet in ``out/jobs`` (resumable; run several
    processes with disjoint ``arms``/``seeds`` to use more cores). Returns the job files written."""
    cfg = read_config(config or COLLAPSE_CONFIG)
    quick = (read_config(CONFIG_DIR / "benchmark.yaml").get("quick") or {}).get("model_overrides", {})
    dcfg = cfg.get("data", {})
    jobs = Path(out) / "jobs"
    jobs.mkdir(parents=True, exist_ok=True)
    written = []
    for arm in arms or list(cfg["arms"]):
        spec = cfg["arms"][arm]
        model_cfg = row_model_config(spec["row"], deep_merge(quick.get(spec["row"], {}), spec.get("model", {})))
        for seed in seeds if seeds is not None else cfg["seeds"]:
            path = jobs / f"{arm}__seed{seed}.json"
            if path.exists():
                continue
            result = collapse_run(model_cfg, int(cfg["steps"]), int(seed), [int(s) for s in cfg["eval_steps"]],
                                  int(cfg.get("log_every", 50)), float(cfg.get("lr", 1e-3)),
                                  int(dcfg.get("batch_size", 64)), dcfg.get("dataset", "digits"), dcfg.get("path"),
                                  int(cfg.get("split_seed", 0)))
            write_json(path, {"arm": arm, "seed": int(seed), "model": model_cfg, **result})
            print(f"vision collapse: {arm} seed {seed}: {result['evals']}", flush=True)
            written.append(path)
    return written


def collapse_summary(out: str | Path, config: str | Path | None = None, name: str = "vision_collapse") -> dict:
    """Aggregate ``out/jobs`` into ``out/<name>.json``, ``.md`` (accuracy mean ± std per arm and step, paired
    differences to the arm ``smoe_cnn`` ± standard error) and ``<name>.png`` (diagnostics over training)."""
    cfg = read_config(config or COLLAPSE_CONFIG)
    out = Path(out)
    runs = [json.loads(p.read_text()) for p in sorted((out / "jobs").glob("*.json"))]
    for r in runs:  # a job run longer than the config's budget: its first ``steps`` are that budget's run
        r["trace"] = [t for t in r["trace"] if t["step"] <= int(cfg["steps"])]
    arms = [a for a in cfg["arms"] if any(r["arm"] == a for r in runs)]
    steps = [int(s) for s in cfg["eval_steps"]]
    acc = {a: {r["seed"]: {e["step"]: e["accuracy"] for e in r["evals"]} for r in runs if r["arm"] == a}
           for a in arms}
    table = []
    for a in arms:
        model = next(r["model"] for r in runs if r["arm"] == a)
        row: dict[str, Any] = {"arm": a, "seeds": sorted(acc[a]), "model": model}
        for s in steps:
            vals = np.array([acc[a][seed][s] for seed in sorted(acc[a]) if s in acc[a][seed]])
            sd = float(vals.std(ddof=1)) if len(vals) > 1 else 0.0
            row[f"acc_{s}"] = [round(float(vals.mean()), 4), round(sd, 4)]
        first, last = steps[0], steps[-1]
        diff = np.array([acc[a][seed][last] - acc[a][seed][first] for seed in acc[a]])
        row["last_minus_first"] = [round(float(diff.mean()), 4),
                                   round(float(diff.std(ddof=1) / np.sqrt(len(diff))) if len(diff) > 1 else 0.0, 4)]
        table.append(row)
    reference = "smoe_cnn"
    paired = {}
    if reference in acc:
        for a in arms:
            if a == reference:
                continue
            common = sorted(set(acc[a]) & set(acc[reference]))
            paired[a] = {}
            for s in steps:
                d = np.array([acc[a][seed][s] - acc[reference][seed][s] for seed in common])
                se = float(d.std(ddof=1) / np.sqrt(len(d))) if len(d) > 1 else 0.0
                paired[a][str(s)] = [round(float(d.mean()), 4), round(se, 4)]
    summary = {"config": cfg, "table": table, "paired_vs_smoe_cnn": paired,
               "traces": {f"{r['arm']}__seed{r['seed']}": r["trace"] for r in runs},
               "provenance": {"torch": torch.__version__, "jobs": len(runs)}}
    write_json(out / f"{name}.json", summary)
    lines = ["# SMoE-CNN collapse study (digits, quick row size)", "",
             f"{cfg['steps']} constant-lr Adam steps (lr {cfg['lr']}), seeds {cfg['seeds']}, one seeded split; test "
             "accuracy mean ± std over seeds. Config: configs/vision/collapse.yaml.", "",
             "| arm | " + " | ".join(f"acc @ {s}" for s in steps) + f" | acc {steps[-1]} − acc {steps[0]} (± SE) |",
             "|---|" + "---:|" * (len(steps) + 1)]
    for row in table:
        cells = [f"{row[f'acc_{s}'][0]:.3f} ± {row[f'acc_{s}'][1]:.3f}" for s in steps]
        d = row["last_minus_first"]
        lines.append(f"| {row['arm']} | " + " | ".join(cells) + f" | {d[0]:+.3f} ± {d[1]:.3f} |")
    if paired:
        lines += ["", "Paired difference to `smoe_cnn` (same seed), mean ± SE:", "",
                  "| arm | " + " | ".join(f"Δ @ {s}" for s in steps) + " |", "|---|" + "---:|" * len(steps)]
        for a, by_step in paired.items():
            lines.append(f"| {a} | " + " | ".join(f"{by_step[str(s)][0]:+.3f} ± {by_step[str(s)][1]:.3f}"
                                                   for s in steps) + " |")
    cosines = {a: {s: [e["damping_grad_cosine"] for r in runs if r["arm"] == a for e in r["evals"]
                       if e["step"] == s and e.get("damping_grad_cosine")] for s in steps} for a in arms}
    damped = [a for a in arms if any(cosines[a].values())]
    if damped:
        lines += ["", "Cosine between the damped and the undamped expert-weight gradient (256 training images, "
                  "per SMoE layer 1/2/3, seed mean):", "", "| arm | " + " | ".join(f"step {s}" for s in steps) + " |",
                  "|---|" + "---:|" * len(steps)]
        for a in damped:
            cells = ["/".join(f"{v:.2f}" for v in np.mean(cosines[a][s], axis=0)) if cosines[a][s] else "–"
                     for s in steps]
            lines.append(f"| {a} | " + " | ".join(cells) + " |")
    lines += ["", "Diagnostics over training (seed means, shared gate): " + f"{name}.png."]
    for a in arms:
        if a == "cnn":
            continue
        tr = [r["trace"] for r in runs if r["arm"] == a]
        last = {k: float(np.mean([t[-1][k] for t in tr])) for k in ("gap", "swapped", "order_kept", "flagged")
                if tr and tr[0][-1].get(k) is not None}
        lines.append(f"- {a} at step {tr[0][-1]['step']}: " + ", ".join(f"{k} {v:.3f}" for k, v in last.items()))
    write_text(out / f"{name}.md", "\n".join(lines) + "\n")
    plot_collapse_diagnostics(summary["traces"], out / f"{name}.png")
    return summary


def plot_collapse_diagnostics(traces: dict[str, list[dict[str, Any]]], path: str | Path) -> Path:
    """Seed-mean curves per arm over training: training loss, selected/unselected mean gate logit, swapped
    share of the initial selection, rank order kept since the previous point, flagged fraction."""
    from smoeweather.vision.plots import _save, plt

    by_arm: dict[str, list[list[dict[str, Any]]]] = {}
    for key, trace in traces.items():
        by_arm.setdefault(key.split("__seed")[0], []).append(trace)
    panels = [("train_loss", "training loss (50-step mean)"), ("selected_mean", "mean gate logit: selected (—), "
              "unselected (--)"), ("swapped", "share of the initial selection swapped out"),
              ("order_kept", "slots with the same expert as 50 steps before"),
              ("flagged", "flagged (misrouted) fraction")]
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.4))
    for i, (arm, runs) in enumerate(sorted(by_arm.items())):
        color = f"C{i}"
        steps = np.array([r["step"] for r in runs[0]])
        for ax, (key, title) in zip(axes, panels):
            if runs[0][0].get(key) is None:
                continue
            values = np.array([[r[key] for r in run] for run in runs], dtype=float).mean(0)
            ax.plot(steps, values, color=color, label=f"{arm} ({len(runs)} seeds)")
            if key == "selected_mean":
                other = np.array([[r["unselected_mean"] for r in run] for run in runs], dtype=float).mean(0)
                ax.plot(steps, other, color=color, ls="--")
            ax.set_title(title, fontsize=9)
            ax.set_xlabel("step")
    axes[0].set_yscale("log")
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    return _save(fig, Path(path))
