"""Whole training loop of the post-processing networks, SMoE-U-Net against its dense U-Net twin.

``benchmarks/smoe_step.py`` times the bare model step; this times what a user's ``smoe study`` / ``smoe train``
run spends per step once warm: the real gcm_ens data module of ``configs/studies/gcm_ens_routing.yaml`` (Z500 at
48 h), Lightning, and every callback ``smoe train`` attaches (checkpoints, per-batch reseeding, throughput,
routing diagnostics). Each run trains ``--warmup`` + ``--steps`` steps with validation off; the clock runs from
the start of step ``--warmup`` (past the cold first epochs, while the data is first read) to the end of the last
step, epoch boundaries included. Pairs run interleaved (dense, SMoE, SMoE, dense, …) over ``--rounds`` rounds,
so a drifting machine load cancels in the per-round ratio; the median ratio is reported with the load average
at start. Ratios, not seconds, are the numbers to compare across machines.

Writes ``benchmarks/results/postprocess_train_loop_cpu.{json,md}``.
    OMP_NUM_THREADS=1 python benchmarks/postprocess_train_loop.py [--steps 100] [--warmup 50] [--rounds 2]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import lightning as L
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from smoeweather.io import write_json  # noqa: E402
from smoeweather.studies.run import load_study  # noqa: E402
from smoeweather.training.run import train  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
STUDY = REPO / "configs" / "studies" / "gcm_ens_routing.yaml"
RESULTS = Path(__file__).resolve().parent / "results"
WIDTHS = ((8, 16, 32), (16, 32, 64))


class StepClock(L.Callback):
    """Wall time from the start of step ``warmup`` to the end of the last training step."""

    def __init__(self, warmup: int) -> None:
        self.warmup, self.t0, self.t1, self.timed = warmup, 0.0, 0.0, 0

    def on_train_batch_start(self, trainer: L.Trainer, *args: Any) -> None:
        if trainer.global_step == self.warmup and self.timed == 0:
            self.t0 = time.perf_counter()

    def on_train_batch_end(self, trainer: L.Trainer, *args: Any) -> None:
        if trainer.global_step > self.warmup:
            self.t1, self.timed = time.perf_counter(), self.timed + 1


def seconds_per_step(variant_name: str, widths: tuple[int, ...], steps: int, warmup: int, out: Path) -> float:
    """Warm seconds per training step of one arm of the routing study at ``widths`` (seed 0, no validation)."""
    study = load_study(STUDY)
    variant = next(v for v in study.variants if v.name == variant_name)
    cfg = study.run_config(variant, 0, out)
    cfg["model"]["widths"] = list(widths)
    cfg["trainer"].update(max_steps=warmup + steps, limit_val_batches=0, val_check_interval=None,
                          check_val_every_n_epoch=1, enable_progress_bar=False)
    cfg["training"]["early_stopping_patience"] = 10**6
    clock = StepClock(warmup)
    train(cfg, extra_callbacks=[clock])
    if clock.timed != steps:
        raise RuntimeError(f"{variant_name} {widths}: timed {clock.timed} steps, expected {steps}")
    return (clock.t1 - clock.t0) / steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100, help="timed steps per run")
    parser.add_argument("--warmup", type=int, default=50, help="untimed steps first (2 epochs of 25 steps)")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    # validation is off: the checkpoint callbacks' "no val_loss to monitor" warnings say nothing here
    warnings.filterwarnings("ignore", message=".*could not find the monitored key.*")
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    setup = {"device": "cpu", "threads": torch.get_num_threads(), "study": str(STUDY.relative_to(REPO)),
             "target": "geopotential_500 at 48 h", "batch": 8, "steps": args.steps, "warmup": args.warmup,
             "rounds": args.rounds, "loadavg_at_start": os.getloadavg(), "cpu_count": os.cpu_count(),
             "torch": torch.__version__, "machine": platform.processor() or platform.machine()}
    entries = []
    with tempfile.TemporaryDirectory() as tmp:
        for widths in WIDTHS:
            times: dict[str, list[float]] = {"unet": [], "smoe": []}
            for r in range(args.rounds):
                for name in ("unet", "smoe") if r % 2 == 0 else ("smoe", "unet"):
                    run_dir = Path(tmp) / f"{name}_{'_'.join(map(str, widths))}_{r}"
                    times[name].append(seconds_per_step(name, widths, args.steps, args.warmup, run_dir))
                    print(f"widths {widths} round {r}: {name} {times[name][-1] * 1e3:.1f} ms/step", flush=True)
            ratios = [s / d for s, d in zip(times["smoe"], times["unet"], strict=True)]
            entries.append({"widths": list(widths), "seconds_per_step": times, "ratios": ratios,
                            "time_ratio": statistics.median(ratios)})
    doc = {"setup": setup, "target": "SMoE-U-Net warm training step <= 2x the U-Net's",
           "command": "python benchmarks/postprocess_train_loop.py " + " ".join(sys.argv[1:]), "entries": entries}
    write_json(RESULTS / "postprocess_train_loop_cpu.json", doc)
    lines = ["# Whole training loop: SMoE-U-Net vs U-Net (CPU, `smoe train` of gcm_ens_routing, Z500 48 h)", "",
             f"Load average at start: {setup['loadavg_at_start'][0]:.2f} on {setup['cpu_count']} cores, "
             f"{setup['threads']} torch thread(s), batch 8, {args.steps} timed steps after {args.warmup} warm-up "
             f"steps, validation off, {args.rounds} interleaved rounds (median ratio).", "",
             "| widths | U-Net ms/step | SMoE-U-Net ms/step | ratio | per-round ratios |", "|---|---:|---:|---:|---|"]
    for e in entries:
        s = e["seconds_per_step"]
        lines.append(f"| {'/'.join(map(str, e['widths']))} | {statistics.median(s['unet']) * 1e3:.1f} | "
                     f"{statistics.median(s['smoe']) * 1e3:.1f} | {e['time_ratio']:.2f} | "
                     f"{', '.join(f'{r:.2f}' for r in e['ratios'])} |")
    (RESULTS / "postprocess_train_loop_cpu.md").write_text("\n".join(lines) + "\n")
    print(json.dumps({"/".join(map(str, e["widths"])): round(e["time_ratio"], 2) for e in entries}))


if __name__ == "__main__":
    main()
