"""``smoe heat generate`` and ``smoe heat benchmark``: the paper's §3.1 table, reproduced side by side.

The benchmark trains every configured row (SMoE, its RC/damping ablations, the baselines and the gate
ablations) with Lightning on one heat store, scores each best checkpoint on the test split, and writes
``heat_benchmark.json`` / ``heat_benchmark.md`` (rewritten after every row, so an interrupted run keeps
the rows it finished) plus the routing-map and expert-kernel plots of the SMoE row.
"""

from __future__ import annotations

import argparse
import itertools
import logging
import time
import warnings
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
from lightning.pytorch.callbacks import EarlyStopping, ModelCheckpoint, TQDMProgressBar

from pipelines.heat_diffusion import generate, open_heat
from smoeweather.config import apply_overrides, deep_merge, load_config
from smoeweather.data.heat import HeatDataModule
from smoeweather.io import write_json, write_text
from smoeweather.models.heat import HEAT_MODELS, build_heat_model, count_parameters
from smoeweather.nn.smoe import SpatialMoE2d
from smoeweather.training.regression import FieldRegressionModule

DEFAULT_CONFIG = Path(__file__).resolve().parents[2] / "configs" / "heat" / "benchmark.yaml"


def train_row(name: str, store: Path, out_dir: Path, training: dict[str, Any],
              model_kwargs: dict[str, Any], size: int) -> dict[str, Any]:
    """Train one benchmark row; returns its result row (test score of the best validation checkpoint)."""
    L.seed_everything(int(training.get("seed", 0)), verbose=False)
    model = build_heat_model(name, size=size, **model_kwargs)
    module = FieldRegressionModule(model, lr=float(training["lr"]),
                                   plateau_factor=float(training["plateau_factor"]),
                                   plateau_patience=int(training["plateau_patience"]))
    data = HeatDataModule(store, batch_size=int(training["batch_size"]),
                          max_runs=training.get("max_runs"))
    progress = bool(training.get("progress", True))
    checkpoint = ModelCheckpoint(dirpath=out_dir / "checkpoints" / name, monitor="val_loss", save_last=True)
    stopper = EarlyStopping(monitor="val_loss", patience=int(training["early_stopping_patience"]))
    # a perfect model (every validation point within 1 %) has nothing left to learn
    perfect = EarlyStopping(monitor="val_pct_within_1pct", mode="max", stopping_threshold=99.995,  # strict >
                            patience=10**9)
    trainer = L.Trainer(
        max_epochs=int(training["max_epochs"]),
        max_time=training.get("max_time"),
        limit_train_batches=training.get("limit_train_batches"),
        accelerator=training.get("accelerator", "cpu"),
        devices=1,
        # a tiny model steps fast: redrawing the bar every step would cost more than the step itself
        callbacks=[checkpoint, stopper, perfect] + ([TQDMProgressBar(refresh_rate=50)] if progress else []),
        logger=L.pytorch.loggers.CSVLogger(out_dir / "logs", name=name),
        enable_progress_bar=progress,
        enable_model_summary=False,
        deterministic=True,
    )
    start = time.perf_counter()
    trainer.fit(module, datamodule=data)
    seconds = time.perf_counter() - start
    best = checkpoint.best_model_path or None
    test = trainer.test(module, datamodule=data, ckpt_path=best, verbose=False)[0]
    row: dict[str, Any] = {
        "name": name,
        "pct_within_1pct": round(float(test["test_pct_within_1pct"]), 3),
        "test_mse": float(test["test_loss"]),
        "params": count_parameters(model),
        "epochs": int(trainer.current_epoch),
        "seconds": round(seconds, 1),
    }
    if isinstance(model, SpatialMoE2d) and hasattr(model.gate, "weight"):
        region = open_heat(store)["region"].values
        row["routing_accuracy"] = round(routing_accuracy(model.gate.weight.detach().argmax(0).numpy(), region), 4)
    return row | {"_model": model}


def best_relabelling(routing: np.ndarray, regions: np.ndarray) -> np.ndarray:
    """Expert → region map (array indexed by expert) that makes ``routing`` agree best with ``regions``."""
    num = int(max(routing.max(), regions.max())) + 1
    perms = [np.asarray(p) for p in itertools.permutations(range(num))]
    return max(perms, key=lambda p: float((p[routing] == regions).mean()))


def routing_accuracy(routing: np.ndarray, regions: np.ndarray) -> float:
    """Fraction of locations routed to the expert matching their region, under the best expert↔region
    relabelling (experts are interchangeable)."""
    return float((best_relabelling(routing, regions)[routing] == regions).mean())


def markdown_table(rows: list[dict[str, Any]], title: str) -> str:
    """People-readable results table, our score next to the paper's."""
    lines = [f"# {title}", "", "| row | % within 1% (ours) | paper | params | epochs | seconds |",
             "|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        paper = "–" if r.get("paper") is None else f"{r['paper']:.1f}"
        lines.append(f"| {r['name']} | {r['pct_within_1pct']:.2f} | {paper} | {r['params']:,} | "
                     f"{r['epochs']} | {r['seconds']:.0f} |")
    return "\n".join(lines) + "\n"


def run_benchmark(out: Path, quick: bool = False, config: Path | None = None, only: list[str] | None = None,
                  data: Path | None = None, overrides: list[str] | tuple[str, ...] = ()) -> dict[str, Any]:
    """Run the heat benchmark; returns the JSON document written to ``out/heat_benchmark.json``."""
    cfg = load_config(config or DEFAULT_CONFIG)
    quick_cfg = cfg.pop("quick", {}) or {}
    if quick:
        cfg = deep_merge(cfg, quick_cfg)
    cfg = apply_overrides(cfg, overrides)
    rows = only or cfg["rows"]
    unknown = [r for r in rows if r not in HEAT_MODELS]
    if unknown:
        raise ValueError(f"unknown benchmark rows {unknown}; known: {', '.join(HEAT_MODELS)}")
    out.mkdir(parents=True, exist_ok=True)
    d = cfg["data"]
    store = data or out / "heat.zarr"
    if data is None and not store.exists():
        generate(store, runs=d["runs"], val_runs=d["val_runs"], test_runs=d["test_runs"], steps=d["steps"],
                 size=d["size"], seed=d["seed"])
    size = int(open_heat(store)["region"].shape[0])
    doc: dict[str, Any] = {"quick": quick, "data": {**d, "store": str(store)}, "training": cfg["training"],
                           "rows": []}
    for name in rows:
        print(f"\n=== heat benchmark: {name} ===", flush=True)
        training = {**cfg["training"], **(cfg.get("row_training", {}).get(name) or {})}
        row = train_row(name, store, out, training, cfg.get("models", {}).get(name, {}) or {}, size)
        model = row.pop("_model")
        row["paper"] = cfg.get("paper", {}).get(name)
        doc["rows"].append(row)
        if name == "smoe":
            from smoeweather.plotting.heat import plot_experts, plot_routing

            ds = open_heat(store)
            routing, regions = model.gate.weight.detach().argmax(0).numpy(), ds["region"].values
            to_region = best_relabelling(routing, regions)  # show expert k under the stencil it learned
            plot_routing(to_region[routing], regions, out / "heat_routing.png")
            experts = model.experts.weight.detach().numpy()[np.argsort(to_region), 0]
            plot_experts(experts, ds["stencil"].values, out / "heat_experts.png")
        write_json(out / "heat_benchmark.json", doc)
        title = "Heat-diffusion benchmark" + (" (quick)" if quick else "")
        write_text(out / "heat_benchmark.md", markdown_table(doc["rows"], title))
        print(f"{name}: {row['pct_within_1pct']:.2f} % within 1 % (paper {row['paper']})", flush=True)
    return doc


def run_cli(args: argparse.Namespace) -> int:
    """Entry point of ``smoe heat ...``."""
    logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)
    warnings.filterwarnings("ignore", ".*does not have many workers.*")
    if args.heat_verb == "generate":
        path = generate(args.out, runs=args.runs, val_runs=args.val_runs, test_runs=args.test_runs,
                        steps=args.steps, size=args.size, seed=args.seed, overwrite=args.overwrite)
        print(f"wrote {path}")
        return 0
    if args.heat_verb == "benchmark":
        doc = run_benchmark(args.out, quick=args.quick, config=args.config, only=args.only, data=args.data,
                            overrides=args.overrides)
        print(markdown_table(doc["rows"], "Heat-diffusion benchmark"))
        print(f"wrote {args.out / 'heat_benchmark.json'} and {args.out / 'heat_benchmark.md'}")
        return 0
    raise ValueError(f"unknown heat verb {args.heat_verb!r}")
