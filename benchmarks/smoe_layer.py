"""SMoE layer vs dense convolution at WeatherBench size: forward + backward time and peak memory.

SMoE: C = 128 in, |E| = 256 experts (3×3), E = 128 selected, 32×64 grid, batch 16, RC loss + damping.
Baseline in the same run: a dense 3×3 convolution with 256 filters (the computation the SMoE's experts
do before routing), both periodic in longitude as in the WeatherBench ResNet.
Targets (issue #2): time ratio ≤ 1.25, memory ratio ≤ 1.5.

Each variant runs in its own subprocess so its peak memory is its own: on CPU the peak RSS growth
during the timed steps (ru_maxrss − RSS before them, with glibc returning freed blocks to the OS);
on CUDA torch.cuda.max_memory_allocated.
Writes benchmarks/results/smoe_layer.json and ends by printing one JSON line
{"time_ratio": ..., "memory_ratio": ...}.

    python benchmarks/smoe_layer.py [--device cuda] [--repeats 10] [--batch 16]
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
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results" / "smoe_layer.json"


def _rss_kib() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * (resource.getpagesize() // 1024)


def measure(variant: str, device: str, batch: int, repeats: int) -> dict[str, float]:
    """Median forward+backward seconds and peak extra memory (MiB) of one variant, in this process."""
    import torch
    from torch import nn

    from smoeweather.nn import PeriodicLonConv2d, SpatialMoE2d

    torch.manual_seed(0)
    c, experts, selected, h, w = 128, 256, 128, 32, 64
    if variant == "smoe":
        layer = SpatialMoE2d(c, experts, selected, grid=(h, w), padding="periodic_lon", rc=True, damping=0.1)
        out_channels = selected
    else:
        layer = PeriodicLonConv2d(c, experts, 3, bias=False)
        out_channels = experts
    layer = layer.to(device)
    x = torch.randn(batch, c, h, w, device=device)
    target = torch.randn(batch, out_channels, h, w, device=device)

    def step() -> None:
        layer.zero_grad(set_to_none=True)
        nn.functional.mse_loss(layer(x), target).backward()
        if device == "cuda":
            torch.cuda.synchronize()

    step()  # warm-up (allocator, kernels)
    layer.zero_grad(set_to_none=True)
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    else:
        base = _rss_kib() * 1024
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    if device == "cuda":
        peak = torch.cuda.max_memory_allocated() - base
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - base
    return {"seconds": statistics.median(times), "peak_mib": max(peak, 0) / 2**20, "repeats": repeats}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--variant", choices=["smoe", "dense"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.variant:  # child process: measure one variant, print its JSON
        print(json.dumps(measure(args.variant, args.device, args.batch, args.repeats)))
        return
    results = {}
    # alternate the order twice to even out machine noise; keep the faster (less disturbed) run
    for variant in ("dense", "smoe", "smoe", "dense"):
        cmd = [sys.executable, __file__, "--variant", variant, "--device", args.device,
               "--batch", str(args.batch), "--repeats", str(args.repeats)]
        # glibc keeps freed large blocks in the heap by default, so RSS would count dead tensors; a fixed
        # mmap threshold returns every block ≥ 64 KiB to the OS on free, making peak RSS ≈ peak live memory
        env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536"}
        proc = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env)
        out = json.loads(proc.stdout.splitlines()[-1])
        if variant not in results or out["seconds"] < results[variant]["seconds"]:
            results[variant] = out
        print(f"{variant:>5}: {out['seconds'] * 1e3:8.1f} ms  peak +{out['peak_mib']:7.1f} MiB", file=sys.stderr)
    doc = {
        "setup": {"in_channels": 128, "experts": 256, "selected": 128, "grid": [32, 64], "batch": args.batch,
                  "device": args.device, "rc": True, "damping": 0.1, "baseline": "PeriodicLonConv2d(128, 256, 3)"},
        "smoe": results["smoe"],
        "dense": results["dense"],
        "time_ratio": round(results["smoe"]["seconds"] / results["dense"]["seconds"], 3),
        "memory_ratio": round(results["smoe"]["peak_mib"] / max(results["dense"]["peak_mib"], 1e-9), 3),
        "targets": {"time_ratio": 1.25, "memory_ratio": 1.5},
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(doc, indent=2) + "\n")
    print(json.dumps({"time_ratio": doc["time_ratio"], "memory_ratio": doc["memory_ratio"]}))


if __name__ == "__main__":
    main()
