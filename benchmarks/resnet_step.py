"""Training-step time of the all-SMoE WeatherBench ResNet vs the dense ResNet, in the same run.

One step = forward + MSE loss + backward (RC loss and damping inside it) + Adam step, batch 16 on the
32×64 grid, paper size (117 → 2 channels, 128 filters, |E| = 256, E = 128, 19 blocks). When one SMoE step
would take longer than ``--max-step-s`` on this machine, the number of residual blocks is reduced. The
stem (7×7 conv on 117 channels ≈ 5 dense 3×3 convs) and head are shared, so the ratio grows with depth:
a stem+head-only network is timed too, and the ratio at 19 blocks is extrapolated as
t_stem + 19·(t − t_stem)/blocks for both networks (``time_ratio_19_blocks_extrapolated``).

Writes benchmarks/results/resnet_step.json and prints one JSON line {"time_ratio": ...}.
Usage: python -m benchmarks.resnet_step [--steps 5] [--max-step-s 10] [--blocks N] [--device cpu]
"""

from __future__ import annotations

import argparse
import json
import platform
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F

from benchmarks.harness import RESULTS, Machine, interleave, timed, write_results
from smoeweather.models.resnet import WeatherBenchResNet

IN_CHANNELS, OUT_CHANNELS, WIDTH, PAPER_BLOCKS, GRID = 117, 2, 128, 19, (32, 64)


def build(blocks: int, smoe: bool, device: torch.device) -> nn.Module:
    placement = {"placement": "all", "experts_factor": 2} if smoe else None
    return WeatherBenchResNet(IN_CHANNELS, OUT_CHANNELS, width=WIDTH, blocks=blocks, smoe=placement,
                              grid=GRID).to(device).train()


class Stepper:
    """One model, its Adam optimiser and a fixed random batch; ``step()`` returns seconds."""

    def __init__(self, model: nn.Module, batch: int, device: torch.device) -> None:
        self.model, self.device = model, device
        self.opt = torch.optim.Adam(model.parameters(), lr=1e-4)
        self.x = torch.randn(batch, IN_CHANNELS, *GRID, device=device)
        self.y = torch.randn(batch, OUT_CHANNELS, *GRID, device=device)

    def step(self) -> float:
        """One training step; returns its seconds (the device drained before and after)."""
        return timed(self._train_step, sync=self._sync)[1]

    def _train_step(self) -> None:
        self.opt.zero_grad(set_to_none=True)
        loss = F.mse_loss(self.model(self.x), self.y)
        loss.backward()
        self.opt.step()

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--steps", type=int, default=5, help="timed steps per model (after 1 warm-up)")
    parser.add_argument("--max-step-s", type=float, default=10.0,
                        help="reduce blocks above this SMoE step time")
    parser.add_argument("--blocks", type=int, default=None, help="force the number of residual blocks")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--out", type=Path, default=RESULTS / "resnet_step.json")
    args = parser.parse_args()
    machine = Machine()
    torch.manual_seed(0)
    device = torch.device(args.device)

    stem = Stepper(build(0, False, device), args.batch, device)  # stem + head only, shared by both nets
    stem.step()
    blocks, note = args.blocks or PAPER_BLOCKS, "paper size"
    if args.blocks is None:
        probe = Stepper(build(2, True, device), args.batch, device)
        probe.step()
        t_stem, t_probe = stem.step(), probe.step()
        del probe
        per_block = max(t_probe - t_stem, 1e-6) / 2
        estimate = t_stem + PAPER_BLOCKS * per_block
        if estimate > args.max_step_s:
            blocks = int(min(PAPER_BLOCKS, max(1, (args.max_step_s - t_stem) // per_block)))
            note = (f"blocks reduced 19 -> {blocks}: a paper-size SMoE step would take ~{estimate:.0f} s "
                    f"> {args.max_step_s:.0f} s on this machine")
    elif blocks != PAPER_BLOCKS:
        note = f"blocks set to {blocks} by --blocks"

    dense = Stepper(build(blocks, False, device), args.batch, device)
    smoe = Stepper(build(blocks, True, device), args.batch, device)
    dense.step(), smoe.step()  # warm-up
    # interleaved, one step each a round, so load changes hit all alike
    rounds = interleave({"dense": dense.step, "smoe": smoe.step, "stem_only": stem.step}, args.steps, alternate=False)
    times, med = rounds.seconds, rounds.medians()

    def at_paper_depth(t: float) -> float:  # stem/head time + 19 × the measured per-block time
        return med["stem_only"] + PAPER_BLOCKS * (t - med["stem_only"]) / blocks

    extrapolated = at_paper_depth(med["smoe"]) / at_paper_depth(med["dense"])
    result = {
        "time_ratio": med["smoe"] / med["dense"],
        "time_ratio_19_blocks_extrapolated": extrapolated,
        "dense_step_s": med["dense"],
        "smoe_step_s": med["smoe"],
        "stem_only_step_s": med["stem_only"],
        "steps_s": times,
        "blocks": blocks,
        "note": note,
        "batch": args.batch,
        "grid": list(GRID),
        "width": WIDTH,
        "num_experts": 2 * WIDTH,
        "num_selected": WIDTH,
        "params": {k: sum(p.numel() for p in s.model.parameters())
                   for k, s in (("dense", dense), ("smoe", smoe))},
        "device": str(device),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "machine": platform.processor() or platform.machine(),
        "target_ratio_max": 2.3,
    }
    write_results(args.out, result, machine=machine)
    print(json.dumps({"time_ratio": round(result["time_ratio"], 3),
                      "time_ratio_19_blocks_extrapolated": round(extrapolated, 3),
                      "dense_step_s": round(med["dense"], 3), "smoe_step_s": round(med["smoe"], 3),
                      "blocks": blocks, "note": note}))


if __name__ == "__main__":
    main()
