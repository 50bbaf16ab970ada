"""Skill check: SMoE ResNet (+ land-sea prior) vs dense ResNet vs persistence vs climatology.

Latitude-weighted RMSE (w = cos φ / mean cos φ, square root after the mean over time, as WeatherBench) of
Z500 and T850 at 72 h and 120 h on held-out test time, in physical units, for each trained checkpoint.
Persistence = the fields at the initialisation time; climatology = the per-grid-point mean of the
training period's targets.

    smoe skill train --config configs/weatherbench/world_dense.yaml [k=v ...]
    smoe skill evaluate --out runs/skill CKPT [CKPT ...]
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Subset

from smoeweather.training.checkpoint import load_trained

LEADS_H = (72, 120)


def _rmse(sq_sum: np.ndarray, count: int) -> np.ndarray:
    return np.sqrt(sq_sum / count)


def evaluate_checkpoint(
    checkpoint: str | Path, leads_h: tuple[int, ...] = LEADS_H, batch_size: int = 64
) -> dict[str, Any]:
    """Scores of one ``smoe train`` weatherbench checkpoint on its config's test split.

    Returns {"config", "output_dir", "scores": {lead: {method: {target: rmse}}}} (physical units).
    """
    from smoeweather.training.run import _splits, base_dataset

    trained = load_trained(checkpoint)
    cfg, module, model = trained.config, trained.module, trained.model
    w = module.lat_weights.numpy()[:, None]
    from smoeweather.data.weather import WeatherBenchDataset

    dcfg = dict(cfg["data"])
    keys = ("target_variables", "input_offsets_h", "constants")
    kwargs = {k: dcfg[k] for k in keys if k in dcfg}
    store = dcfg["store"]
    continuous = dcfg.get("lead_h", 72) is None
    train_ds = base_dataset(
        module_train := _splits(
            dcfg,
            lambda years: WeatherBenchDataset(store, dcfg["variables"], years=years, lead_h=72, **kwargs),
        )["train"]
    )
    # climatology: mean of the target fields over the training samples' valid times (physical units)
    indices = module_train.indices if isinstance(module_train, Subset) else range(len(train_ds))
    clim = np.mean([train_ds.raw_target(i) for i in indices], axis=0)
    scores: dict[str, Any] = {}
    targets = train_ds.target_names
    for lead in leads_h:
        lead_kw = {"lead_h": None, "lead_choices_h": [lead]} if continuous else {"lead_h": lead}
        test = _splits(
            dcfg,
            lambda years, lead_kw=lead_kw: WeatherBenchDataset(
                store, dcfg["variables"], years=years, **lead_kw, **kwargs
            ),
        )["test"]
        ds = base_dataset(test)
        idx = test.indices if isinstance(test, Subset) else list(range(len(ds)))
        n_fields = len(ds.variables)
        tpos = [ds.variables.index(f) for f in ds.target_variables]
        sums = {m: np.zeros(len(targets)) for m in ("model", "persistence", "climatology")}
        for start in range(0, len(idx), batch_size):
            chunk = idx[start : start + batch_size]
            xs, ys = zip(*(ds[i] for i in chunk))
            x = torch.stack(xs)
            truth = ds.denormalize_target(torch.stack(ys)).numpy()
            with torch.no_grad():
                pred = ds.denormalize_target(model.net(x)).numpy()
            last = np.stack([ds.raw_inputs(i)[-1] for i in chunk])  # (B, n_fields, H, W) at init time
            assert last.shape[1] == n_fields
            persistence = last[:, tpos]
            for name, f in (("model", pred), ("persistence", persistence), ("climatology", clim[None])):
                sums[name] += ((f - truth) ** 2 * w).mean(axis=(2, 3)).sum(0)
        scores[f"{lead}h"] = {m: dict(zip(targets, _rmse(s, len(idx)).tolist())) for m, s in sums.items()}
        scores[f"{lead}h"]["n_test"] = len(idx)
    return {
        "checkpoint": str(checkpoint),
        "output_dir": cfg.get("output_dir"),
        "model": cfg["model"],
        "seed": cfg.get("seed"),
        "scores": scores,
    }


def markdown(results: list[dict[str, Any]]) -> str:
    """One table: rows = runs, then persistence / climatology of every store; columns = target × lead."""
    if not results:
        return ""
    leads = list(results[0]["scores"])
    targets = [k for k in results[0]["scores"][leads[0]]["model"]]
    head = "| run | " + " | ".join(f"{t} {lead}" for lead in leads for t in targets) + " |"
    lines = [head, "|" + "---|" * (1 + len(leads) * len(targets))]

    def row(label: str, result: dict[str, Any], method: str) -> str:
        vals = [result["scores"][lead][method][t] for lead in leads for t in targets]
        return f"| {label} | " + " | ".join(f"{v:.4g}" for v in vals) + " |"

    for r in results:
        lines.append(row(f"{Path(r['output_dir']).name} (seed {r['seed']})", r, "model"))
    by_store = {r.get("store", r["output_dir"]): r for r in reversed(results)}
    for store, r in by_store.items():
        lines.append(row(f"persistence ({Path(store).name})", r, "persistence"))
        lines.append(row(f"climatology, train mean ({Path(store).name})", r, "climatology"))
    return "\n".join(lines) + "\n"
