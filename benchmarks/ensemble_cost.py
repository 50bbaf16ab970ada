"""Training and inference cost of the ensemble networks, against the deep ensemble in the same run.

The networks of the GCM study (configs/weatherbench/gcm_*.yaml: ResNet 16 filters × 3 blocks on the 32×64
grid, 34 input channels, 2 targets) built from those configs, fed the same seeded random batch (B = 16): the
deep ensemble of 4 dense ResNets (baseline), E³ M = 4 (placement last and, for comparison, all), the Gaussian
head and the single dense ResNet. Per network: median wall time of one training step (forward, loss,
backward, Adam) and of one inference forward, per member too, with the ratio to the deep ensemble measured
in the same process (interleaved repeats, so a load change on the shared machine hits every arm alike);
parameters and multiply-accumulates per sample (torch.utils.flop_counter, forward). Writes
benchmarks/results/ensemble_cost.{json,md}.

    python benchmarks/ensemble_cost.py [--repeats 7] [--batch 16] [--threads 1]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

import torch
from torch.utils.flop_counter import FlopCounterMode

from smoeweather.config import read_config
from smoeweather.models.ensemble import members_of, model_kind
from smoeweather.models.weather import build_weather_model, synthetic_land_sea_mask
from smoeweather.training.ensemble_forecasting import loss_settings
from smoeweather.training.ensemble_losses import ensemble_loss
from smoeweather.training.losses import lat_weighted_mse, latitude_weights

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
GRID, IN_CHANNELS, OUT_CHANNELS = (32, 64), 34, 2
ARMS = {  # name → (config, overrides)
    "deep_ensemble": ("gcm_deep_ensemble.yaml", []),
    "e3_last": ("gcm_e3.yaml", []),
    "e3_last_crps": ("gcm_e3_crps.yaml", []),
    "e3_all": ("gcm_e3.yaml", ["model.smoe.placement=all"]),
    "gaussian": ("gcm_gaussian.yaml", []),
    "dense": ("gcm_dense.yaml", []),
}
BASELINE = "deep_ensemble"


def build(config: str, overrides: list[str]) -> tuple[torch.nn.Module, dict[str, Any]]:
    cfg = read_config(ROOT / "configs" / "weatherbench" / config, overrides)
    mcfg = {**cfg["model"], "in_channels": IN_CHANNELS, "out_channels": OUT_CHANNELS, "grid": list(GRID)}
    return build_weather_model(mcfg, land_sea_prior=synthetic_land_sea_mask(*GRID)), cfg


def step_fn(net: torch.nn.Module, cfg: dict[str, Any], x: torch.Tensor, y: torch.Tensor, w: torch.Tensor):
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    kind = model_kind(cfg["model"])
    loss_name, alpha = loss_settings(cfg) if kind != "deterministic" else ("mse", 0.0)

    def step() -> None:
        out = net(x)
        loss = lat_weighted_mse(out, y, w) if kind == "deterministic" else ensemble_loss(loss_name, out, y, w, alpha)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    return step


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    x = torch.randn(args.batch, IN_CHANNELS, *GRID)
    y = torch.randn(args.batch, OUT_CHANNELS, *GRID)
    w = latitude_weights(torch.linspace(-87.1875, 87.1875, GRID[0]))
    nets, steps, info = {}, {}, {}
    for name, (config, overrides) in ARMS.items():
        net, cfg = build(config, overrides)
        nets[name], steps[name] = net, step_fn(net.train(), cfg, x, y, w)
        with FlopCounterMode(display=False) as counter:  # (under no_grad its module tracker fails)
            net.eval()(x[:1])
        info[name] = {"config": config, "overrides": overrides, "members": members_of(cfg["model"]),
                      "kind": model_kind(cfg["model"]), "parameters": sum(p.numel() for p in net.parameters()),
                      "macs_per_sample": counter.get_total_flops() // 2}
    for name in ARMS:  # warm-up
        nets[name].train()
        steps[name]()
    train_t: dict[str, list[float]] = {n: [] for n in ARMS}
    infer_t: dict[str, list[float]] = {n: [] for n in ARMS}
    for _ in range(args.repeats):  # interleaved: every arm sees the same machine load
        for name in ARMS:
            nets[name].train()
            t = time.perf_counter()
            steps[name]()
            train_t[name].append(time.perf_counter() - t)
            nets[name].eval()
            with torch.no_grad():
                t = time.perf_counter()
                nets[name](x)
                infer_t[name].append(time.perf_counter() - t)
    base_train = statistics.median(train_t[BASELINE])
    base_infer = statistics.median(infer_t[BASELINE])
    rows = {}
    for name in ARMS:
        tr, inf, m = statistics.median(train_t[name]), statistics.median(infer_t[name]), info[name]["members"]
        rows[name] = {**info[name], "train_step_s": tr, "infer_s": inf, "infer_s_per_member": inf / m,
                      "train_ratio_to_deep_ensemble": tr / base_train, "infer_ratio_to_deep_ensemble": inf / base_infer,
                      "macs_ratio_to_deep_ensemble": info[name]["macs_per_sample"] / info[BASELINE]["macs_per_sample"]}
    result = {"batch": args.batch, "threads": args.threads, "repeats": args.repeats, "grid": list(GRID),
              "baseline": BASELINE, "arms": rows}
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "ensemble_cost.json").write_text(json.dumps(result, indent=2) + "\n")
    lines = [f"# Ensemble cost (batch {args.batch}, {args.threads} thread(s), median of {args.repeats} interleaved "
             "repeats; ratios to the deep ensemble of 4 in the same run)", "",
             "| network | members | parameters | MACs/sample | train step s | ×DE | inference s | s/member | ×DE "
             "| MACs ×DE |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for name, r in rows.items():
        lines.append(f"| {name} | {r['members']} | {r['parameters']} | {r['macs_per_sample'] / 1e6:.1f} M | "
                     f"{r['train_step_s']:.3f} | {r['train_ratio_to_deep_ensemble']:.2f} | {r['infer_s']:.4f} | "
                     f"{r['infer_s_per_member']:.4f} | {r['infer_ratio_to_deep_ensemble']:.2f} | "
                     f"{r['macs_ratio_to_deep_ensemble']:.2f} |")
    (RESULTS / "ensemble_cost.md").write_text("\n".join(lines) + "\n")
    print(json.dumps({n: round(r["train_ratio_to_deep_ensemble"], 3) for n, r in rows.items()}))


if __name__ == "__main__":
    main()
