"""SMoE layer vs dense convolutions at WeatherBench size, measured as training runs it.

One training step = forward + backward + an SGD step of every parameter (the gate included, so the routing
tensor changes every step and the gate's cached top-E is recomputed, as in training). SMoE: C = 128 in,
|E| = 256 experts (3×3), E = 128 selected, 32×64 grid, RC loss + damping 0.1, periodic longitude. Dense
baselines in the same run: a 3×3 convolution with 256 filters (the computation the experts do before
routing) and one with 128 filters (the dense layer the SMoE replaces in the ResNet). For every batch size
and dtype (fp32, bf16 autocast) each variant runs in its own subprocess so its peak memory is its own: on
CPU the peak RSS growth during the timed steps (glibc returns freed blocks ≥ 64 KiB to the OS), on CUDA
torch.cuda.max_memory_allocated.

Writes ``benchmarks/results/smoe_layer_<device>.json``: ``{"entries": [{"setup": {device, batch, dtype,
...}, "time_ratio", "memory_ratio", "time_ratio_dense128", "smoe", "dense256", "dense128"}, ...]}``
(ratios: SMoE / dense-256). Targets (issue 11): time ≤ 1.25× and memory ≤ 1.5× at batch 64 on the GPU,
≤ 1.6× time at batch 16; CPU ≤ 1.25×.

    python benchmarks/smoe_layer.py [--device cpu|cuda] [--batches 16 64] [--dtypes fp32 bf16] [--repeats 5]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
VARIANTS = ("dense256", "dense128", "smoe")


def _rss_kib() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * (resource.getpagesize() // 1024)


def measure(variant: str, device: str, batch: int, dtype: str, repeats: int) -> dict[str, float]:
    """Median seconds of a training step and peak extra memory (MiB) of one variant, in this process."""
    import torch
    from torch import nn

    from smoeweather.nn import PeriodicLonConv2d, SpatialMoE2d

    torch.manual_seed(0)
    c, experts, selected, h, w = 128, 256, 128, 32, 64
    if variant == "smoe":
        layer = SpatialMoE2d(c, experts, selected, grid=(h, w), padding="periodic_lon", rc=True, damping=0.1)
        out_channels = selected
    else:
        out_channels = 256 if variant == "dense256" else 128
        layer = PeriodicLonConv2d(c, out_channels, 3, bias=False)
    layer = layer.to(device)
    opt = torch.optim.SGD(layer.parameters(), lr=1e-2)
    x = torch.randn(batch, c, h, w, device=device)
    target = torch.randn(batch, out_channels, h, w, device=device)
    autocast = torch.autocast(device_type=device, dtype=torch.bfloat16, enabled=dtype == "bf16")

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        with autocast:
            y = layer(x)
        nn.functional.mse_loss(y.float(), target).backward()
        opt.step()  # changes the gate: the next step re-selects
        if device == "cuda":
            torch.cuda.synchronize()

    for _ in range(2):  # warm-up (allocator, kernels, autotuning)
        step()
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


def run_variant(variant: str, device: str, batch: int, dtype: str, repeats: int) -> dict[str, float]:
    cmd = [sys.executable, __file__, "--variant", variant, "--device", device, "--batches", str(batch),
           "--dtypes", dtype, "--repeats", str(repeats)]
    # glibc keeps freed large blocks in the heap by default, so RSS would count dead tensors; a fixed mmap
    # threshold returns every block ≥ 64 KiB to the OS on free, making peak RSS ≈ peak live memory
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536"}
    proc = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env)
    return json.loads(proc.stdout.splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--batches", type=int, nargs="+", default=[16, 64])
    parser.add_argument("--dtypes", nargs="+", default=["fp32", "bf16"], choices=["fp32", "bf16"])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--variant", choices=VARIANTS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.variant:  # child process: measure one variant, print its JSON
        print(json.dumps(measure(args.variant, args.device, args.batches[0], args.dtypes[0], args.repeats)))
        return
    import torch

    entries = []
    for batch in args.batches:
        for dtype in args.dtypes:
            results: dict[str, dict[str, float]] = {}
            # each variant twice, order reversed the second time; keep the faster (less disturbed) run
            for variant in (*VARIANTS, *reversed(VARIANTS)):
                out = run_variant(variant, args.device, batch, dtype, args.repeats)
                if variant not in results or out["seconds"] < results[variant]["seconds"]:
                    results[variant] = out
                print(f"batch {batch:3d} {dtype}: {variant:>8}: {out['seconds'] * 1e3:9.2f} ms  "
                      f"peak +{out['peak_mib']:8.1f} MiB", file=sys.stderr)
            smoe, d256, d128 = results["smoe"], results["dense256"], results["dense128"]
            entries.append({
                "setup": {"device": args.device, "batch": batch, "dtype": dtype, "in_channels": 128,
                          "experts": 256, "selected": 128, "grid": [32, 64], "rc": True, "damping": 0.1,
                          "step": "forward + backward + SGD step (gate changes every step)"},
                "time_ratio": round(smoe["seconds"] / d256["seconds"], 3),
                "memory_ratio": round(smoe["peak_mib"] / max(d256["peak_mib"], 1e-9), 3),
                "time_ratio_dense128": round(smoe["seconds"] / d128["seconds"], 3),
                "smoe": smoe, "dense256": d256, "dense128": d128,
            })
    device_name = torch.cuda.get_device_name() if args.device == "cuda" else f"{platform.machine()} CPU"
    doc = {
        "device": args.device,
        "device_name": device_name,
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "cpus": os.cpu_count(),
        "command": "python benchmarks/smoe_layer.py " + " ".join(sys.argv[1:]),
        "targets": {"time_ratio": {"batch 64": 1.25, "batch 16": 1.6, "cpu": 1.25}, "memory_ratio": 1.5},
        "entries": entries,
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"smoe_layer_{args.device}.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(doc, indent=2) + "\n")
    os.replace(tmp, path)
    print(json.dumps([{**e["setup"], "time_ratio": e["time_ratio"], "memory_ratio": e["memory_ratio"]}
                      for e in entries]))


if __name__ == "__main__":
    main()
