"""Training and inference cost of the ensemble networks, against the deep ensemble in the same run.

The networks of the GCM study (configs/weatherbench/gcm_*.yaml: ResNet 16 filters × 3 blocks on the 32×64
grid, 34 input channels, 2 targets) built from those configs, fed the same seeded random batch (B = 16): the
deep ensemble of 4 dense ResNets (baseline), E³ M = 4 (placement last and, for comparison, all), the Gaussian
head and the single dense ResNet. Per network: median wall time of one training step (forward, loss,
backward, Adam) and of one inference forward, per member too, with the ratio to the deep ensemble measured
in the same process (interleaved repeats, so a load change on the shared machine hits every arm alike);
parameters and multiply-accumulates per sample (torch.utils.flop_counter, forward). Writes
benchmarks/results/ensemble_cost.{json,md}.

    python -m benchmarks.ensemble_cost [--repeats 7] [--batch 16] [--threads 1]
"""

from __future__ import annotations

import argparse
import json
from typing import Any

import torch
from torch.utils.flop_counter import FlopCounterMode

from benchmarks.harness import REPO, RESULTS, Machine, interleave, pin_threads, timed, write_results
from smoeweather.config import read_config
from smoeweather.models.ensemble import members_of, model_kind
from smoeweather.models.weather import build_weather_model, synthetic_land_sea_mask
from smoeweather.training.blocks import training_settings
from smoeweather.training.ensemble_forecasting import loss_settings
from smoeweather.training.ensemble_losses import ensemble_loss
from smoeweather.training.losses import lat_weighted_mse, latitude_weights

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
    """The network of ``configs/weatherbench/CONFIG`` (with ``overrides``) on the GCM grid, and its config."""
    cfg = read_config(REPO / "configs" / "weatherbench" / config, overrides)
    mcfg = {**cfg["model"], "in_channels": IN_CHANNELS, "out_channels": OUT_CHANNELS, "grid": list(GRID)}
    return build_weather_model(mcfg, land_sea_prior=synthetic_land_sea_mask(*GRID)), cfg


def step_fn(net: torch.nn.Module, cfg: dict[str, Any], x: torch.Tensor, y: torch.Tensor, w: torch.Tensor):
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    kind = model_kind(cfg["model"])
    loss_name, alpha = loss_settings(cfg["model"], training_settings(cfg)) if kind != "deterministic" else ("mse", 0.0)

    def step() -> None:
        out = net(x)
        loss = lat_weighted_mse(out, y, w) if kind == "deterministic" else ensemble_loss(loss_name, out, y, w, alpha)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    return step


def main() -> None:
    """Every arm's training step and inference, interleaved repeats; write the results."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    pin_threads(args.threads)
    machine = Machine()
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
    def train(name: str) -> float:
        nets[name].train()
        return timed(steps[name])[1]

    def infer(name: str) -> float:
        nets[name].eval()
        with torch.no_grad():
            return timed(nets[name], x)[1]

    # interleaved: every arm sees the same machine load (each repeat: train then infer of every arm in turn)
    variants = {f"{kind}:{name}": (lambda fn=fn, name=name: fn(name)) for name in ARMS
                for kind, fn in (("train", train), ("infer", infer))}
    med = interleave(variants, args.repeats, alternate=False).medians()
    base_train, base_infer = med[f"train:{BASELINE}"], med[f"infer:{BASELINE}"]
    rows = {}
    for name in ARMS:
        tr, inf, m = med[f"train:{name}"], med[f"infer:{name}"], info[name]["members"]
        rows[name] = {**info[name], "train_step_s": tr, "infer_s": inf, "infer_s_per_member": inf / m,
                      "train_ratio_to_deep_ensemble": tr / base_train, "infer_ratio_to_deep_ensemble": inf / base_infer,
                      "macs_ratio_to_deep_ensemble": info[name]["macs_per_sample"] / info[BASELINE]["macs_per_sample"]}
    result = {"batch": args.batch, "threads": args.threads, "repeats": args.repeats, "grid": list(GRID),
              "baseline": BASELINE, "arms": rows}
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
    write_results(RESULTS / "ensemble_cost", result, lines, machine=machine)
    print(json.dumps({n: round(r["train_ratio_to_deep_ensemble"], 3) for n, r in rows.items()}))


if __name__ == "__main__":
    main()
