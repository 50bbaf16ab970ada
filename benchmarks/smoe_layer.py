"""SMoE layer vs dense convolutions at WeatherBench size, measured as training runs it.

One training step = forward + backward + an SGD step of every parameter (the gate included, so the routing
tensor changes every step and the gate's cached top-E is recomputed, as in training). SMoE: C = 128 in,
|E| = 256 experts (3×3), E = 128 selected, 32×64 grid, RC loss + damping 0.1, periodic longitude. Dense
baselines in the same run: a 3×3 convolution with 256 filters (the computation the experts do before
routing) and one with 128 filters (the dense layer the SMoE replaces in the ResNet). For every batch size
and dtype (fp32, bf16 autocast) each variant runs in its own subprocess so its peak memory is its own: on
CPU the peak RSS growth during the timed steps (glibc returns freed blocks ≥ 64 KiB to the OS), on CUDA
torch.cuda.max_memory_allocated.

Both routing implementations of :class:`SpatialMoE2d` (``--impls``), each against dense layers in the same
memory layout, as a network using it would run: ``index_select`` with planar inputs and planar dense
convolutions, ``channels_last`` with channels-last inputs and channels-last dense convolutions
(``time_ratio_vs_planar_dense256`` compares it with the planar dense layer instead). The machine may be
shared: every round runs all variants (order reversed every other round), the time ratio is the median over
``--rounds`` of the ratios within a round (paired, so slow drifts of the load cancel), seconds and peaks are
medians over rounds of per-process medians over ``--repeats`` steps; the load average is recorded.

Writes ``benchmarks/results/smoe_layer_<device>.json``: ``{"entries": [{"setup": {device, batch, dtype,
route_impl, memory_format, ...}, "time_ratio", "memory_ratio", "time_ratio_dense128", "smoe", "dense256",
"dense128"}, ...]}`` (ratios: SMoE / dense-256 of the same layout). Targets: time ≤ 1.25× and
memory ≤ 1.5× at batch 64 on the GPU, ≤ 1.6× time at batch 16; CPU ≤ 1.25×.

    python -m benchmarks.smoe_layer [--device cpu|cuda] [--batches 16 64] [--dtypes fp32 bf16]
        [--impls index_select channels_last] [--repeats 3] [--rounds 3]
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
from typing import Any

from benchmarks.harness import (
    REPO,
    RESULTS,
    Machine,
    command,
    interleave,
    load_average,
    median_seconds,
    pin_threads,
    warm_up,
    write_results,
)

IMPLS = ("index_select", "channels_last")
LAYOUT = {"index_select": "planar", "channels_last": "channels_last"}


def _rss_kib() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * (resource.getpagesize() // 1024)


def measure(variant: str, device: str, batch: int, dtype: str, repeats: int) -> dict[str, float]:
    """Median seconds of a training step and peak extra memory (MiB) of one variant, in this process.

    ``variant``: ``dense256@<layout>``, ``dense128@<layout>`` (layout ``planar`` or ``channels_last``) or
    ``smoe@<route_impl>`` (planar inputs for ``index_select``, channels-last ones for ``channels_last``).
    """
    import torch
    from torch import nn

    from smoeweather.nn import PeriodicLonConv2d, SpatialMoE2d
    from smoeweather.nn.smoe import pad_lon_circular

    class ChannelsLastPeriodicLonConv2d(PeriodicLonConv2d):
        """PeriodicLonConv2d's F.pad(mode="circular") returns a planar tensor; this pad keeps channels-last."""

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return nn.Conv2d.forward(self, pad_lon_circular(x, self.pad))

    torch.manual_seed(0)
    c, experts, selected, h, w = 128, 256, 128, 32, 64
    kind, option = variant.split("@")
    if kind == "smoe":
        layer = SpatialMoE2d(c, experts, selected, grid=(h, w), padding="periodic_lon", rc=True, damping=0.1,
                             route_impl=option)
        out_channels, layout = selected, LAYOUT[option]
    else:
        out_channels, layout = (256 if kind == "dense256" else 128), option
        conv = ChannelsLastPeriodicLonConv2d if layout == "channels_last" else PeriodicLonConv2d
        layer = conv(c, out_channels, 3, bias=False)
    memory_format = torch.channels_last if layout == "channels_last" else torch.contiguous_format
    layer = layer.to(device, memory_format=memory_format)  # 4-d weights only (the gate's tensor is 3-d)
    opt = torch.optim.SGD(layer.parameters(), lr=1e-2)
    x = torch.randn(batch, c, h, w, device=device).contiguous(memory_format=memory_format)
    target = torch.randn(batch, out_channels, h, w, device=device).contiguous(memory_format=memory_format)
    autocast = torch.autocast(device_type=device, dtype=torch.bfloat16, enabled=dtype == "bf16")

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        with autocast:
            y = layer(x)
        nn.functional.mse_loss(y.float(), target).backward()
        opt.step()  # changes the gate: the next step re-selects
        if device == "cuda":
            torch.cuda.synchronize()

    warm_up(step, 2)  # allocator, kernels, autotuning
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    else:
        base = _rss_kib() * 1024
    seconds = median_seconds(step, repeats)
    if device == "cuda":
        peak = torch.cuda.max_memory_allocated() - base
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - base
    return {"seconds": seconds, "peak_mib": max(peak, 0) / 2**20, "repeats": repeats}


def run_variant(variant: str, device: str, batch: int, dtype: str, repeats: int,
                threads: int | None = None) -> dict[str, float]:
    """:func:`measure` of one variant in a child process of its own (its peak memory is its own)."""
    cmd = [sys.executable, "-m", "benchmarks.smoe_layer", "--variant", variant, "--device", device,
           "--batches", str(batch), "--dtypes", dtype, "--repeats", str(repeats)]
    cmd += ["--threads", str(threads)] if threads else []
    # glibc keeps freed large blocks in the heap by default, so RSS would count dead tensors; a fixed mmap
    # threshold returns every block ≥ 64 KiB to the OS on free, making peak RSS ≈ peak live memory
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536"}
    proc = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env, cwd=REPO)
    return json.loads(proc.stdout.splitlines()[-1])


def _median_run(runs: list[dict[str, float]]) -> dict[str, float]:
    return {"seconds": statistics.median(r["seconds"] for r in runs),
            "peak_mib": statistics.median(r["peak_mib"] for r in runs),
            "repeats": runs[0]["repeats"], "rounds": len(runs)}


def measure_setup(batch: int, dtype: str, variants: list[str], args: argparse.Namespace,
                  threads: int) -> list[dict[str, Any]]:
    """Every variant at one batch size and dtype over the interleaved rounds (one child process per variant and
    round, the order reversed every other round): one entry per routing path."""
    runs: dict[str, list[dict[str, float]]] = {v: [] for v in variants}
    load = [load_average()[0]]

    def run(variant: str) -> float:
        out = run_variant(variant, args.device, batch, dtype, args.repeats, args.threads)
        print(f"batch {batch:3d} {dtype} round {len(runs[variant])}: {variant:>22}: {out['seconds'] * 1e3:9.2f} ms  "
              f"peak +{out['peak_mib']:8.1f} MiB", file=sys.stderr)
        runs[variant].append(out)
        return out["seconds"]

    interleave({v: (lambda v=v: run(v)) for v in variants}, args.rounds,
               on_round=lambda r, _: load.append(load_average()[0]))
    entries = []
    for impl in args.impls:
        layout = LAYOUT[impl]
        smoe_runs, d256_runs = runs[f"smoe@{impl}"], runs[f"dense256@{layout}"]
        d128_runs, planar_runs = runs[f"dense128@{layout}"], runs.get("dense256@planar")
        smoe, d256, d128 = _median_run(smoe_runs), _median_run(d256_runs), _median_run(d128_runs)
        ratios = [s["seconds"] / d["seconds"] for s, d in zip(smoe_runs, d256_runs, strict=True)]
        entry = {
            "setup": {"device": args.device, "batch": batch, "dtype": dtype, "route_impl": impl,
                      "memory_format": layout, "threads": threads, "in_channels": 128,
                      "experts": 256, "selected": 128, "grid": [32, 64], "rc": True, "damping": 0.1,
                      "step": "forward + backward + SGD step (gate changes every step)"},
            "time_ratio": round(statistics.median(ratios), 3),
            "memory_ratio": round(smoe["peak_mib"] / max(d256["peak_mib"], 1e-9), 3),
            "time_ratio_dense128": round(statistics.median(
                s["seconds"] / d["seconds"] for s, d in zip(smoe_runs, d128_runs, strict=True)), 3),
            "time_ratio_rounds": [round(r, 3) for r in ratios],
            "load_average_1min": {"min": min(load), "max": max(load)},
            "smoe": smoe, "dense256": d256, "dense128": d128,
        }
        if layout != "planar" and planar_runs:
            entry["time_ratio_vs_planar_dense256"] = round(statistics.median(
                s["seconds"] / d["seconds"] for s, d in zip(smoe_runs, planar_runs, strict=True)), 3)
            entry["dense256_planar"] = _median_run(planar_runs)
        entries.append(entry)
    return entries


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--batches", type=int, nargs="+", default=[16, 64])
    parser.add_argument("--dtypes", nargs="+", default=["fp32", "bf16"], choices=["fp32", "bf16"])
    parser.add_argument("--impls", nargs="+", default=list(IMPLS), choices=IMPLS)
    parser.add_argument("--repeats", type=int, default=3, help="timed steps per process (median)")
    parser.add_argument("--rounds", type=int, default=3, help="processes per variant (median; paired ratios)")
    parser.add_argument("--threads", type=int, help="torch intra-op threads (default: torch's choice)")
    parser.add_argument("--append", action="store_true",
                        help="keep the result file's entries of other setups (e.g. another --threads)")
    parser.add_argument("--variant", help=argparse.SUPPRESS)
    args = parser.parse_args()
    threads = pin_threads(args.threads)
    if args.variant:  # child process: measure one variant, print its JSON
        print(json.dumps(measure(args.variant, args.device, args.batches[0], args.dtypes[0], args.repeats)))
        return
    import torch

    machine = Machine()
    layouts = list(dict.fromkeys(LAYOUT[impl] for impl in args.impls))
    variants = [f"{kind}@{layout}" for layout in layouts for kind in ("dense256", "dense128")]
    variants += [f"smoe@{impl}" for impl in args.impls]
    entries = [e for batch in args.batches for dtype in args.dtypes
               for e in measure_setup(batch, dtype, variants, args, threads)]
    device_name = torch.cuda.get_device_name() if args.device == "cuda" else f"{platform.machine()} CPU"
    path = RESULTS / f"smoe_layer_{args.device}.json"
    runs_before = []
    if args.append and path.exists():  # keep other setups' entries and the commands and loads behind them
        previous = json.loads(path.read_text())
        setups = [e["setup"] for e in entries]
        entries = [e for e in previous["entries"] if e["setup"] not in setups] + entries
        runs_before = previous.get("runs_before", []) + [{k: previous.get(k) for k in ("command", "load_average")}]
    state = machine.record()
    doc = {
        "device": args.device,
        "device_name": device_name,
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "cpus": os.cpu_count(),
        "command": command(),
        "load_average": {"start": state["load_average"]["start"], "end": state["load_average"]["end"],
                         "note": "1/5/15-min load averages of the machine; other jobs may share its cores"},
        "targets": {"time_ratio": {"batch 64": 1.25, "batch 16": 1.6, "cpu": 1.25}, "memory_ratio": 1.5},
        "entries": entries,
    }
    if runs_before:
        doc["runs_before"] = runs_before
    write_results(path, {**doc, "machine_state": state})
    print(json.dumps([{**e["setup"], "time_ratio": e["time_ratio"], "memory_ratio": e["memory_ratio"]}
                      for e in entries]))


if __name__ == "__main__":
    main()
