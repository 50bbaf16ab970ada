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
    OMP_NUM_THREADS=1 python -m benchmarks.postprocess_train_loop [--steps 100] [--warmup 50] [--rounds 2]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import warnings
from pathlib import Path

import torch

from benchmarks.harness import REPO, RESULTS, Machine, command, interleave, pin_threads, step_clock, write_results
from smoeweather.studies.run import load_study
from smoeweather.training.run import train

STUDY = REPO / "configs" / "studies" / "gcm_ens_routing.yaml"
WIDTHS = ((8, 16, 32), (16, 32, 64))


def seconds_per_step(variant_name: str, widths: tuple[int, ...], steps: int, warmup: int, out: Path) -> float:
    """Warm seconds per training step of one arm of the routing study at ``widths`` (seed 0, no validation)."""
    study = load_study(STUDY)
    variant = next(v for v in study.variants if v.name == variant_name)
    cfg = study.run_config(variant, 0, out)
    cfg["model"]["widths"] = list(widths)
    cfg["trainer"].update(max_steps=warmup + steps, limit_val_batches=0, val_check_interval=None,
                          check_val_every_n_epoch=1, enable_progress_bar=False)
    cfg["training"]["early_stopping_patience"] = 10**6
    clock = step_clock(warmup)
    train(cfg, extra_callbacks=[clock])
    if clock.timed != steps:
        raise RuntimeError(f"{variant_name} {widths}: timed {clock.timed} steps, expected {steps}")
    return clock.seconds / steps


def main() -> None:
    """The U-Net and the SMoE-U-Net at both widths, interleaved rounds of whole runs; write the results."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100, help="timed steps per run")
    parser.add_argument("--warmup", type=int, default=50, help="untimed steps first (2 epochs of 25 steps)")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    # validation is off: the checkpoint callbacks' "no val_loss to monitor" warnings say nothing here
    warnings.filterwarnings("ignore", message=".*could not find the monitored key.*")
    threads = pin_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    machine = Machine()
    setup = {"device": "cpu", "threads": threads, "study": str(STUDY.relative_to(REPO)),
             "target": "geopotential_500 at 48 h", "batch": 8, "steps": args.steps, "warmup": args.warmup,
             "rounds": args.rounds, "loadavg_at_start": machine.load_start, "cpu_count": os.cpu_count(),
             "torch": torch.__version__, "machine": platform.processor() or platform.machine()}
    entries = []
    with tempfile.TemporaryDirectory() as tmp:
        for widths in WIDTHS:
            done: dict[str, int] = {"unet": 0, "smoe": 0}

            def run(name: str, widths: tuple[int, ...] = widths, done: dict[str, int] = done) -> float:
                r, done[name] = done[name], done[name] + 1
                run_dir = Path(tmp) / f"{name}_{'_'.join(map(str, widths))}_{r}"
                seconds = seconds_per_step(name, widths, args.steps, args.warmup, run_dir)
                print(f"widths {widths} round {r}: {name} {seconds * 1e3:.1f} ms/step", flush=True)
                return seconds

            # pairs interleaved (U-Net, SMoE, SMoE, U-Net, ...): a drifting load cancels in the per-round ratio
            rounds = interleave({name: (lambda name=name: run(name)) for name in ("unet", "smoe")}, args.rounds)
            entries.append({"widths": list(widths), "seconds_per_step": rounds.seconds,
                            "ratios": rounds.ratios("smoe", "unet"), "time_ratio": rounds.ratio("smoe", "unet")})
    doc = {"setup": setup, "target": "SMoE-U-Net warm training step <= 2x the U-Net's", "command": command(),
           "entries": entries}
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
    write_results(RESULTS / "postprocess_train_loop_cpu", doc, lines, machine=machine)
    print(json.dumps({"/".join(map(str, e["widths"])): round(e["time_ratio"], 2) for e in entries}))


if __name__ == "__main__":
    main()
