"""Report of the gate-learning studies (``configs/studies/gcm_ens_routing*.yaml`` and the ResNet arms
``gcm_16x3_cpu_routing.yaml``) from their study.json:

* the score per arm (CRPS or RMSE, mean ± std over seeds) at every lead and target, with the parameter count of
  each U-Net;
* paired differences (same seed) to the study's baseline (U-Net or dense ResNet), to the parameter-matched wide
  U-Net, and LEARNED − FROZEN gate, as mean [95 % Student-t interval, n − 1 dof], bold where it excludes zero;
* how far the routing moved from its initialisation by the best checkpoint, per U-Net level (mean over the
  layers of a level and over seeds): area whose expert SET moved, area whose rank ORDER moved (some output
  plane fed by another expert), share of (slot, location) pairs moved, order variety within a land/sea
  category, per-epoch order change, and the RC labels' information (share of locations whose flagged share is
  off 1 − q by more than 0.1).

Writes ``<study.json stem>_report.md`` and ``_report.json`` beside it.
    python -m benchmarks.studies.routing_study_report benchmarks/studies/results/gcm_ens_routing.json [more.json ...]
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.harness import Machine, write_results
from smoeweather.config import apply_overrides, read_config
from smoeweather.data.ensemble_dataset import EnsembleSpec
from smoeweather.models.weather import build_weather_model

PAIRS = (("smoe", "smoe_frozen", "learned − frozen gate"),
         ("smoe_all_prior_coherent", "smoe_all_prior_coherent_frozen", "learned − frozen gate"),
         ("smoe_gate_lr10", "smoe", "gate learning rate ×10 − ×1"),
         ("smoe_slot_rc", "smoe", "per-slot − per-sample RC threshold"),
         ("smoe_task_grad", "smoe", "task gradient, no RC − RC"),
         ("smoe_unshared", "smoe", "per-layer − shared gates"),
         ("smoe", "unet_affine", "SMoE − U-Net with a per-point affine head (headroom arm)"),
         ("dense_location_embedding", "dense", "dense + location embedding − dense (headroom arm)"),
         ("smoe_all_prior_coherent", "dense_location_embedding", "SMoE − dense + location embedding"))


def parameter_count(variant: dict[str, Any], grid: tuple[int, int] = (32, 64)) -> int:
    """Trainable + frozen parameters of a variant's network (built from its config, a dummy prior). A
    post-processing network's channels come from its ``data`` block as in training (:class:`EnsembleSpec`:
    ensemble mean and std of every predictor per lead, plus static channels; μ and σ per target and lead);
    the weather ResNet's from its model block."""
    import torch

    cfg = apply_overrides(read_config(variant["config"]), variant["overrides"])
    mcfg = dict(cfg["model"], grid=list(grid))
    if cfg.get("task") == "postprocess":
        spec = EnsembleSpec.from_config(cfg["data"])
        mcfg.update(in_channels=len(spec.channel_names) + len(cfg["data"].get("static") or []),
                    out_channels=2 * len(spec.target_names))
    prior = torch.zeros(grid) if mcfg.get("gate_prior") == "land_sea" and mcfg.get("smoe") else None
    net = build_weather_model(mcfg, land_sea_prior=prior)
    return sum(p.numel() for p in net.parameters())


def paired(runs: list[dict[str, Any]], a: str, b: str, key: tuple[str, str]) -> dict[str, float] | None:
    """a − b over the seeds both finished: mean, standard error, n and the 95 % t-interval (lo, hi)."""
    lead, target = key
    by_seed = {(r["variant"], r["seed"]): r["scores"][lead][target] for r in runs}
    seeds = sorted(s for (v, s) in by_seed if v == a and (b, s) in by_seed)
    if not seeds:
        return None
    from smoeweather.metrics.significance import t_interval

    return t_interval([by_seed[(a, s)] - by_seed[(b, s)] for s in seeds])


def level_of(layer: str) -> str:
    """U-Net layer path → 'enc L' / 'dec L' (decoder blocks are listed bottom-up)."""
    m = re.match(r"(?:.*\.)?(encoder|decoder)\.(\d+)\.", layer)
    if not m:
        return layer
    part, i = m.group(1), int(m.group(2))
    return f"enc {i}" if part == "encoder" else f"dec {2 - i}"


def routing_table(runs: list[dict[str, Any]], variant: str) -> dict[str, dict[str, float]]:
    """{level: {metric: mean over layers and seeds}} of a variant's routing movement at its best checkpoint."""
    acc: dict[str, dict[str, list[float]]] = {}
    for r in runs:
        if r["variant"] != variant:
            continue
        for layer, metrics in (r.get("extra", {}).get("routing") or {}).items():
            for k, v in metrics.items():
                acc.setdefault(level_of(layer), {}).setdefault(k, []).append(v)
    return {lev: {k: float(np.mean(v)) for k, v in m.items()} for lev, m in sorted(acc.items())}


def fmt(d: dict[str, float] | None) -> str:
    if d is None:
        return "–"
    s = f"{d['mean']:+.3g} [{d['lo']:+.2g}, {d['hi']:+.2g}] ({d['n']})"
    return f"**{s}**" if d["excludes_zero"] else s


def report(path: Path) -> dict[str, Any]:
    """The report of the study at ``path``, written beside it (``_report.{md,json}``); returns its JSON."""
    machine = Machine()
    study = json.loads(path.read_text())
    runs = study["runs"]
    baseline = study["baseline"]
    score = study.get("score", "CRPS").split(" ")[0]
    keys = [(lead, target) for lead in study["leads"] for target in study["targets"]]
    variants = list(study["variants"])
    unet = "unet" in baseline
    params = {v: parameter_count(study["variants"][v]) if unet else None for v in variants}
    wide = "unet_wide" if "unet_wide" in variants else None
    out: dict[str, Any] = {"study": study["name"], "baseline": baseline, "score": score,
                           "keys": [f"{t}@{lead}" for lead, t in keys], "arms": {}, "pairs": {}, "routing": {}}
    lines = [f"# {study['name']}: {study['steps']} steps, seeds {study['seeds']}", "",
             f"{score} (m² s⁻² for Z500, K for T850; latitude-weighted, test period), mean ± std over seeds; paired "
             "differences are mean [95 % Student-t interval, n − 1 dof] (n), **bold** where the interval excludes "
             "zero; negative = the arm is better."]
    for key in keys:
        lead, target = key
        name = f"{target}@{lead}"
        lines += ["", f"## {name}", "", f"| arm | parameters | {score} | − {baseline} |"
                  + (" − wide U-Net |" if wide else ""), "|---|---:|---:|---:|" + ("---:|" if wide else "")]
        for v in variants:
            vals = [r["scores"][lead][target] for r in runs if r["variant"] == v]
            if not vals:
                continue
            mean, std = float(np.mean(vals)), float(np.std(vals, ddof=1)) if len(vals) > 1 else float("nan")
            vs_base = paired(runs, v, baseline, key) if v != baseline else None
            vs_wide = paired(runs, v, wide, key) if wide and v != wide else None
            out["arms"].setdefault(v, {})[name] = {"mean": mean, "std": std, "n": len(vals), "parameters": params[v],
                                                  "minus_baseline": vs_base, "minus_unet_wide": vs_wide}
            value = f"{mean:.4g} ± {std:.2g} ({len(vals)})"
            count = f"{params[v]:,}" if params[v] is not None else "–"
            lines.append(f"| {v} | {count} | {value} | {fmt(vs_base)} |" + (f" {fmt(vs_wide)} |" if wide else ""))
        refs = runs[0].get("references", {}) if runs else {}
        for ref in ("raw", "emos_global", "emos_gridpoint"):
            if ref in refs:
                lines.append(f"| {ref} (reference) | – | {refs[ref][lead][target]:.4g} | |" + (" |" if wide else ""))
        for a, b, label in PAIRS:
            if a in variants and b in variants:
                pair = paired(runs, a, b, key)
                out["pairs"].setdefault(label, {})[name] = pair
                lines += ["", f"{label} ({a} − {b}, same seed): {fmt(pair)}"]
    metrics = ("set_moved", "order_moved", "slots_moved", "order_variety", "order_changed_per_epoch",
               "label_information")
    for v in variants:
        table = routing_table(runs, v)
        if not table:
            continue
        out["routing"][v] = table
        lines += ["", f"Routing of `{v}` at the best checkpoint against its initialisation (mean over the level's "
                  "layers and the seeds):", "", "| level | " + " | ".join(metrics) + " |",
                  "|---|" + "---:|" * len(metrics)]
        for lev, m in table.items():
            lines.append(f"| {lev} | " + " | ".join(f"{m.get(k, float('nan')):.3f}" for k in metrics) + " |")
    write_results(path.with_name(path.stem + "_report"), out, lines, machine=machine)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("study_json", nargs="+", type=Path)
    for path in parser.parse_args().study_json:
        report(path)
        print(path.with_name(path.stem + "_report.md").read_text())


if __name__ == "__main__":
    main()
