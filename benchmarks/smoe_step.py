"""Warm training-step time of the SMoE networks against their dense twins, in the same run (issue 22).

One step = forward + loss + backward (RC labels inside it) + Adam step, one CPU thread, batch 8 on the
32×64 gcm_ens grid, inputs random (the data loader is not part of it; ``benchmarks/train_throughput.py``
measures whole loops). Pairs, each timed warm (``--warmup`` steps first) and interleaved ABAB over
``--rounds`` rounds so a drifting machine load cancels in the per-round ratio; the median ratio is reported:

* the post-processing U-Net at widths 8/16/32 and 16/32/64 vs the SMoE-U-Net (land-sea prior, coherent
  gate, RC q 0.3, no damping; |E| = 4 × filters);
* the WeatherBench ResNet 16 filters × 3 blocks vs its all-SMoE twin (|E| = 2 × filters, land-sea prior,
  the configs of ``configs/studies/gcm_16x3_cpu.yaml``).

``--kthvalue`` also times the SMoE networks with the RC threshold taken by ``torch.kthvalue`` (the code
before issue 22) and checks that both give the same loss trajectory for a fixed seed, bit for bit. A profile
of one SMoE-U-Net step (top operators) is stored too. The load average at start is recorded: ratios, not
seconds, are the numbers to compare across machines.

Writes ``benchmarks/results/smoe_step_cpu.json`` and ``.md``.
    python benchmarks/smoe_step.py [--steps 20] [--rounds 3] [--kthvalue]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

import smoeweather.nn.smoe as smoe_module
from smoeweather.models.resnet import SMoEPlacement, WeatherBenchResNet
from smoeweather.models.unet import PostprocessingUNet

RESULTS = Path(__file__).resolve().parent / "results"
GRID = (32, 64)


def land_sea() -> torch.Tensor:
    """A fixed land-sea map (H, W): two continents, about 30 % land."""
    land = torch.zeros(GRID)
    land[4:20, 8:24] = 1.0
    land[14:30, 36:52] = 1.0
    return land


def unet(widths: tuple[int, ...], smoe: bool) -> torch.nn.Module:
    kwargs: dict[str, Any] = dict(smoe=True, grid=GRID, land_sea_prior=land_sea(), gate_init="coherent",
                                  damping=None) if smoe else {}
    return PostprocessingUNet(8, levels=3, widths=widths, out_channels=2, **kwargs)


def resnet(smoe: bool) -> torch.nn.Module:
    placement = SMoEPlacement.from_config({"placement": "all", "experts_factor": 2, "gate_prior": "land_sea",
                                           "prior_strength": 1.0} if smoe else None)
    return WeatherBenchResNet(in_channels=8, out_channels=2, width=16, blocks=3, grid=GRID, smoe=placement,
                              land_sea_prior=land_sea().long() if smoe else None)


NETWORKS: dict[str, tuple[Callable[[], torch.nn.Module], Callable[[], torch.nn.Module]]] = {
    "unet_8_16_32": (lambda: unet((8, 16, 32), False), lambda: unet((8, 16, 32), True)),
    "unet_16_32_64": (lambda: unet((16, 32, 64), False), lambda: unet((16, 32, 64), True)),
    "resnet_16x3": (lambda: resnet(False), lambda: resnet(True)),
}


@contextmanager
def kthvalue_threshold(enabled: bool):
    """Take the RC quantile with torch.kthvalue (the code before issue 22) while ``enabled``."""
    before = smoe_module.NUMPY_QUANTILE
    smoe_module.NUMPY_QUANTILE = not enabled
    try:
        yield
    finally:
        smoe_module.NUMPY_QUANTILE = before


class Stepper:
    """A seeded network + Adam + fixed random batch; ``step()`` runs one training step, returns its loss."""

    def __init__(self, make: Callable[[], torch.nn.Module], seed: int = 0) -> None:
        torch.manual_seed(seed)
        self.net = make()
        self.opt = torch.optim.Adam(self.net.parameters(), lr=1e-3)
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randn(8, 8, *GRID, generator=g)
        self.y = torch.randn(8, 2, *GRID, generator=g)

    def step(self) -> float:
        self.opt.zero_grad()
        loss = torch.nn.functional.mse_loss(self.net(self.x), self.y)
        loss.backward()
        self.opt.step()
        return float(loss.detach())

    def timed(self, steps: int) -> float:
        t = time.perf_counter()
        for _ in range(steps):
            self.step()
        return (time.perf_counter() - t) / steps


def trajectory(make: Callable[[], torch.nn.Module], steps: int, kthvalue: bool) -> list[float]:
    with kthvalue_threshold(kthvalue):
        s = Stepper(make)
        return [s.step() for _ in range(steps)]


def profile_top(make: Callable[[], torch.nn.Module], steps: int = 5, rows: int = 12) -> list[dict[str, Any]]:
    """Top operators by self CPU time over ``steps`` warm steps: [{name, share, ms_per_step}]."""
    from torch.profiler import ProfilerActivity, profile

    s = Stepper(make)
    s.timed(2)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        s.timed(steps)
    events = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
    total = sum(e.self_cpu_time_total for e in events)
    return [{"name": e.key, "share": e.self_cpu_time_total / total, "ms_per_step": e.self_cpu_time_total / 1e3 / steps}
            for e in events[:rows]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20, help="timed steps per network per round")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--kthvalue", action="store_true", help="also time the torch.kthvalue RC threshold")
    parser.add_argument("--networks", nargs="+", default=list(NETWORKS), choices=list(NETWORKS))
    args = parser.parse_args()
    torch.set_num_threads(1)
    setup = {"device": "cpu", "threads": 1, "batch": 8, "grid": list(GRID), "steps": args.steps,
             "rounds": args.rounds, "loadavg_at_start": os.getloadavg(), "cpu_count": os.cpu_count(),
             "torch": torch.__version__, "machine": platform.processor() or platform.machine()}
    entries = []
    for name in args.networks:
        make_dense, make_smoe = NETWORKS[name]
        variants = {"dense": (make_dense, False), "smoe": (make_smoe, False)}
        if args.kthvalue:
            variants["smoe_kthvalue"] = (make_smoe, True)
        steppers = {}
        for key, (make, kth) in variants.items():
            with kthvalue_threshold(kth):
                steppers[key] = Stepper(make)
                steppers[key].timed(args.warmup)
        times: dict[str, list[float]] = {k: [] for k in variants}
        for r in range(args.rounds):
            order = list(variants) if r % 2 == 0 else list(reversed(variants))
            for key in order:
                with kthvalue_threshold(variants[key][1]):
                    times[key].append(steppers[key].timed(args.steps))
            print(f"{name} round {r}: " + ", ".join(f"{k} {times[k][-1] * 1e3:.1f} ms" for k in variants), flush=True)
        entry: dict[str, Any] = {"network": name,
                                 "seconds_per_step": {k: statistics.median(v) for k, v in times.items()},
                                 "time_ratio": statistics.median(s / d for s, d in zip(times["smoe"], times["dense"],
                                                                                       strict=True))}
        if args.kthvalue:
            entry["time_ratio_kthvalue"] = statistics.median(
                s / d for s, d in zip(times["smoe_kthvalue"], times["dense"], strict=True))
            a, b = trajectory(make_smoe, 5, False), trajectory(make_smoe, 5, True)
            entry["same_loss_trajectory"] = a == b
            entry["loss_trajectory"] = a
        entries.append(entry)
    top = profile_top(NETWORKS["unet_16_32_64"][1]) if "unet_16_32_64" in args.networks else []
    out = {"setup": setup, "target": "SMoE warm step <= 2x its dense twin (issue 22)", "entries": entries,
           "profile_smoe_unet_16_32_64": top}
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "smoe_step_cpu.json").write_text(json.dumps(out, indent=2) + "\n")
    lines = ["# SMoE training step vs its dense twin (CPU, 1 thread, batch 8, 32×64)", "",
             f"Load average at start: {setup['loadavg_at_start'][0]:.2f} on {setup['cpu_count']} cores. "
             "Median of per-round ratios (interleaved rounds).", "",
             "| network | dense ms | SMoE ms | ratio | ratio with kthvalue (before) | same losses |",
             "|---|---:|---:|---:|---:|---|"]
    for e in entries:
        s = e["seconds_per_step"]
        lines.append(f"| {e['network']} | {s['dense'] * 1e3:.1f} | {s['smoe'] * 1e3:.1f} | {e['time_ratio']:.2f} | "
                     f"{e.get('time_ratio_kthvalue', float('nan')):.2f} | {e.get('same_loss_trajectory', '')} |")
    if top:
        lines += ["", "Where an SMoE-U-Net 16/32/64 step goes (self CPU time):", "", "| operator | share | ms/step |",
                  "|---|---:|---:|"]
        lines += [f"| `{t['name']}` | {t['share']:.1%} | {t['ms_per_step']:.1f} |" for t in top]
    (RESULTS / "smoe_step_cpu.md").write_text("\n".join(lines) + "\n")
    print(json.dumps({e["network"]: round(e["time_ratio"], 2) for e in entries}))


if __name__ == "__main__":
    main()
