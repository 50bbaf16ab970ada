"""Page faults of a training step: the SMoE-U-Net 16/32/64 against its dense twin (:class:`benchmarks.smoe_profile.
NetworkStep`), with glibc's default allocator settings and with freed memory kept (``MALLOC_MMAP_THRESHOLD_`` 1 GiB,
``MALLOC_TRIM_THRESHOLD_`` 2 GiB, so a freed tensor's pages are reused instead of handed back to the OS and faulted in
again by the next step).

Each setting runs in a child process of its own (the variables act at process start), 1 thread, warm: minor faults,
system and wall seconds per step, and the SMoE / dense wall ratio of interleaved rounds. Writes
``benchmarks/results/page_faults.{json,md}``. A measurement, never an assert.

    python -m benchmarks.page_faults [--grid 128 256] [--batch 4] [--rounds 5]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from typing import Any

from benchmarks.harness import REPO, RESULTS, Machine, load_average, write_results

SETTINGS = {"glibc default": {}, "freed memory kept": {"MALLOC_MMAP_THRESHOLD_": str(1 << 30),
                                                        "MALLOC_TRIM_THRESHOLD_": str(1 << 31)}}


def child(grid: tuple[int, int], batch: int, rounds: int, steps: int) -> dict[str, Any]:
    """In this process: per network, medians over rounds of faults, system and wall seconds per training step."""
    import torch

    from benchmarks.smoe_profile import NetworkStep

    torch.set_num_threads(1)
    nets = {"dense": NetworkStep(grid, batch, None), "smoe (used)": NetworkStep(grid, batch, "used")}
    for net in nets.values():
        for _ in range(3):
            net.train()
    per: dict[str, dict[str, list[float]]] = {k: {"faults": [], "sys_s": [], "wall_s": []} for k in nets}
    for _ in range(rounds):
        for name, net in nets.items():
            before, start = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
            for _ in range(steps):
                net.train()
            after = resource.getrusage(resource.RUSAGE_SELF)
            per[name]["faults"].append((after.ru_minflt - before.ru_minflt) / steps)
            per[name]["sys_s"].append((after.ru_stime - before.ru_stime) / steps)
            per[name]["wall_s"].append((time.perf_counter() - start) / steps)
    ratios = [s / d for s, d in zip(per["smoe (used)"]["wall_s"], per["dense"]["wall_s"], strict=True)]
    return {"per_step": {k: {m: statistics.median(v) for m, v in d.items()} for k, d in per.items()},
            "smoe_over_dense": statistics.median(ratios), "round_ratios": ratios}


def run_setting(env: dict[str, str], args: argparse.Namespace) -> dict[str, Any]:
    """:func:`child` in a fresh process with ``env`` added."""
    cmd = [sys.executable, "-m", "benchmarks.page_faults", "--child", "--grid", *map(str, args.grid),
           "--batch", str(args.batch), "--rounds", str(args.rounds), "--steps", str(args.steps)]
    proc = subprocess.run(cmd, check=True, capture_output=True, text=True, cwd=REPO,
                          env={**os.environ, "OMP_NUM_THREADS": "1", **env})
    return json.loads(proc.stdout.splitlines()[-1])


def markdown(results: dict[str, Any], args: argparse.Namespace, load: list[float]) -> list[str]:
    h, w = args.grid
    lines = [f"# Page faults of a training step: SMoE-U-Net 16/32/64 vs its dense twin, {h} × {w}, batch {args.batch}",
             "", f"1 thread, warm, medians of {args.rounds} interleaved rounds of {args.steps} steps, each setting in "
             f"a fresh process; load average at the end {load}.", "",
             "| allocator | network | minor faults / step | system ms / step | wall ms / step | SMoE / dense |",
             "|---|---|---:|---:|---:|---:|"]
    for setting, r in results.items():
        for name, p in r["per_step"].items():
            ratio = f"×{r['smoe_over_dense']:.2f}" if name != "dense" else ""
            lines.append(f"| {setting} | {name} | {p['faults']:.0f} | {p['sys_s'] * 1e3:.1f} | {p['wall_s'] * 1e3:.1f} "
                         f"| {ratio} |")
    return lines


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--grid", type=int, nargs=2, default=[128, 256])
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--out-name", default="page_faults")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(tuple(args.grid), args.batch, args.rounds, args.steps)))
        return
    machine = Machine()
    results = {}
    for setting, env in SETTINGS.items():
        results[setting] = run_setting(env, args)
        print(f"{setting}: {json.dumps(results[setting]['per_step'])}", flush=True)
    path = write_results(RESULTS / args.out_name, {"grid": args.grid, "batch": args.batch, "settings": results},
                         markdown(results, args, load_average()), machine=machine)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
