"""Paper size on a GPU: the gcm_128x19 networks' training throughput and peak memory against batch size.

``configs/studies/gcm_128x19.yaml``'s arms as networks: the ResNet of 19 blocks × 128 filters on the GCM
world's inputs (34 channels: 10 fields × 3 offsets, 3 constants, the lead; 2 outputs, 32 × 64 grid), dense
against SMoE in every block (|E| = 256, E = 128, land-sea gate prior), bf16 autocast and Adam as the study
trains them (``trainer.precision=bf16-mixed``), on a fixed random batch (the throughput of the network, not
of the data loader). Per batch size and network: warm steps, then ``--steps`` timed steps: ms per step,
samples per second, and the peak memory of a step (all allocations: weights, Adam state, activations), with
an out-of-memory recorded as such. Batches run smallest first; none starts after ``--deadline`` seconds.

Writes ``benchmarks/results/gpu_paper_<device>.{json,md}`` after every measurement.

    python -m benchmarks.gpu_paper [--device cuda] [--batches 8 16 32 64 128] [--steps 10]
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import torch

from benchmarks.gpu_check import resnet_maker
from benchmarks.gpu_compile import Stepper
from benchmarks.harness import RESULTS, Machine, Stopwatch, device_record, write_results


def measure(width: int, blocks: int, smoe: bool, device: str, batch: int, steps: int) -> dict[str, Any]:
    """One network at one batch: ms per step, samples/s and peak MiB of a step (or the OOM message)."""
    if device == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    try:
        s = Stepper(resnet_maker(width, blocks, "all" if smoe else None), device, batch, 34, "eager", torch.bfloat16)
        s.run(2)
        seconds = s.timed(steps)
        peak = torch.cuda.max_memory_allocated() / 2**20 if device == "cuda" else None
    except torch.OutOfMemoryError as err:
        return {"error": f"out of memory: {str(err)[:200]}"}
    params = sum(p.numel() for p in s.net.parameters())
    del s
    return {"ms_per_step": seconds * 1e3, "samples_per_s": batch / seconds, "peak_mib": peak, "parameters": params}


def markdown(out: dict[str, Any]) -> list[str]:
    s = out["setup"]
    lines = [f"# gcm_128x19 at paper size on {s.get('gpu', s['device'])}: throughput and memory against batch", "",
             f"torch {s['torch']}; ResNet {s['blocks']} blocks × {s['width']} filters, 34 → 2 channels on 32 × 64, "
             f"bf16 autocast, Adam, random batch; {s['steps']} timed steps after 2 warm ones. Peak: all allocations "
             "of a step (weights, Adam state, activations).", "",
             "| batch | dense ms | dense samples/s | dense peak MiB | SMoE ms | SMoE samples/s | SMoE peak MiB | "
             "SMoE / dense time |", "|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for batch, r in out["batches"].items():
        d, m = r.get("dense", {}), r.get("smoe", {})

        def cells(x: dict[str, Any]) -> str:
            if "error" in x or not x:
                return f"{x.get('error', 'not run')[:60]} | – | –"
            peak = "–" if x["peak_mib"] is None else f"{x['peak_mib']:.0f}"
            return f"{x['ms_per_step']:.1f} | {x['samples_per_s']:.0f} | {peak}"

        ratio = f"{m['ms_per_step'] / d['ms_per_step']:.2f}" if "ms_per_step" in d and "ms_per_step" in m else "–"
        lines.append(f"| {batch} | {cells(d)} | {cells(m)} | {ratio} |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--batches", type=int, nargs="+", default=[8, 16, 32, 64, 128])
    parser.add_argument("--steps", type=int, default=10, help="timed steps per network and batch")
    parser.add_argument("--width", type=int, default=128)
    parser.add_argument("--blocks", type=int, default=19)
    parser.add_argument("--deadline", type=float, default=60.0, help="seconds after which no batch starts")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: torch sees no CUDA device on this machine")
    watch, machine = Stopwatch(), Machine()
    out: dict[str, Any] = {"setup": device_record(args.device) | {"width": args.width, "blocks": args.blocks,
                                                                   "steps": args.steps}, "batches": {}}
    stem = args.out / f"gpu_paper_{args.device}"
    for batch in sorted(args.batches):
        if watch.elapsed() > args.deadline:
            out["batches"][str(batch)] = {"skipped": f"the {args.deadline:.0f} s deadline had passed"}
            continue
        row = out["batches"][str(batch)] = {}
        for name in ("dense", "smoe"):
            row[name] = measure(args.width, args.blocks, name == "smoe", args.device, batch, args.steps)
            print(f"batch {batch} {name}: {row[name]}", flush=True)
            write_results(stem, out, markdown(out), machine=machine)
    write_results(stem, out, markdown(out), machine=machine)
    print(f"wrote {stem}.json and .md")


if __name__ == "__main__":
    main()
