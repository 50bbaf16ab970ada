"""The launch-bound SMoE step on a GPU: whole training steps replayed as CUDA graphs and ``torch.compile``d,
against their dense twins treated the same way, and the layer alone.

Earlier measurement (benchmarks/results/gpu_step_cuda.md): eager SMoE steps cost 2.2–3.1× their dense twins
because the step is bound by kernel launches (host 29 ms against 16 ms of kernels). Here each step runs as

* ``eager``: forward, MSE, backward, Adam, as written;
* ``graph``: the whole step (forward, backward, Adam with ``capturable=True``) captured once with
  ``torch.cuda.graph`` and replayed: no launch cost, no compile time (needs a step without host
  synchronisation: the layer's ``expert_compute="all"`` path);
* ``compile:<mode>``: the network ``torch.compile``d with ``mode`` (``reduce-overhead`` = CUDA graphs,
  ``max-autotune-no-cudagraphs``) and the optimizer step compiled; compile seconds recorded; a failure is
  recorded with its message; modes are skipped once ``--deadline`` seconds have passed.

Networks: the SMoE-all ResNet 16 × 3 (batch 32, 34 channels) and the SMoE-U-Net 16/32/64 (batch 8) against
their dense twins (``gpu_check.py``'s). Layer: the benchmark layer (C = 128, |E| = 256, E = 128, RC + damping,
periodic longitude) against the dense 256-filter conv, batch 64 and 16, fp32 and bf16 autocast. SMoE and
dense alternate in blocks of ``--block`` steps over ``--rounds`` rounds; ratios are medians of per-round
ratios. Targets: layer ≤ 1.25× at batch 64, ≤ 1.6× at batch 16; network steps ≤ 1.3× their twins. Where the
best mode misses its target, a profiler table (top ops by device and host time) of both sides is written.
Every mode's loss after the timed steps is compared with eager steps from the same weights (``loss_vs_eager``).

Writes ``benchmarks/results/gpu_compile_<device>.{json,md}`` (rewritten after every item, so a time-out keeps
what was measured) and ``gpu_compile_profile_<device>.txt``.

    python -m benchmarks.gpu_compile [--device cuda] [--rounds 5] [--block 20] [--deadline 150]
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import torch

from benchmarks.gpu_check import resnet_maker
from benchmarks.harness import (
    RESULTS,
    Machine,
    Stopwatch,
    device_record,
    interleave,
    timed,
    write_report,
    write_results,
)
from benchmarks.smoe_step import GRID, unet
from smoeweather.nn import PeriodicLonConv2d, SpatialMoE2d

LAYER_TARGET = {64: 1.25, 16: 1.6}
NETWORK_TARGET = 1.3
NETWORKS: dict[str, dict[str, Any]] = {
    "resnet_16x3": {"smoe": resnet_maker(16, 3, "all"), "dense": resnet_maker(16, 3, None), "batch": 32, "in": 34,
                    "out": 2},
    "unet_16_32_64": {"smoe": partial(unet, (16, 32, 64), True), "dense": partial(unet, (16, 32, 64), False),
                      "batch": 8, "in": 8, "out": 2},
}


def layer_pair(channels: int, experts: int) -> dict[str, Callable[[], torch.nn.Module]]:
    """The benchmark layer (|E| = ``experts``, E = C = ``channels``) and the dense conv of |E| filters."""
    return {"smoe": lambda: SpatialMoE2d(channels, experts, channels, grid=GRID, padding="periodic_lon", rc=True,
                                         damping=0.1, expert_compute="all"),
            "dense": lambda: PeriodicLonConv2d(channels, experts, 3, bias=False)}


class Stepper:
    """One network, Adam and a fixed batch; ``run(n)`` takes n training steps in ``mode``."""

    def __init__(self, make: Callable[[], torch.nn.Module], device: str, batch: int, cin: int, mode: str,
                 dtype: torch.dtype = torch.float32) -> None:
        torch.manual_seed(0)
        self.device, self.mode, self.dtype = device, mode, dtype
        self.net = make().to(device)
        self.opt = torch.optim.Adam(self.net.parameters(), lr=1e-3, capturable=mode == "graph")
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(batch, cin, *GRID, generator=g).to(device)
        with torch.no_grad():
            cout = self.net(self.x).shape[1]
        self.y = torch.randn(batch, cout, *GRID, generator=g).to(device)
        self.loss = torch.zeros((), device=device)
        self.graph: torch.cuda.CUDAGraph | None = None
        self.forward: Callable[[torch.Tensor], torch.Tensor] = self.net
        self.opt_step: Callable[[], Any] = self.opt.step
        with Stopwatch(self.sync) as setup:
            if mode.startswith("compile:"):
                self.forward = torch.compile(self.net, mode=mode.split(":", 1)[1])
                self.opt_step = torch.compile(self.opt.step, fullgraph=False)
                self.run(3)  # compile forward, backward and the optimizer step
            elif mode == "graph":
                self._capture()
        self.setup_seconds = setup.seconds

    def sync(self) -> None:
        if self.device == "cuda":
            torch.cuda.synchronize()

    def _eager_step(self) -> torch.Tensor:
        with torch.autocast(self.device, dtype=torch.bfloat16, enabled=self.dtype == torch.bfloat16,
                            cache_enabled=False):
            loss = torch.nn.functional.mse_loss(self.forward(self.x).float(), self.y)
        loss.backward()
        self.opt_step()
        return loss.detach()

    def _capture(self) -> None:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                self.opt.zero_grad(set_to_none=True)
                self._eager_step()
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        self.opt.zero_grad(set_to_none=True)
        with torch.cuda.graph(self.graph):
            self.loss = self._eager_step()

    def run(self, steps: int) -> None:
        for _ in range(steps):
            if self.graph is not None:
                self.graph.replay()
                continue
            if self.mode == "compile:reduce-overhead":
                torch.compiler.cudagraph_mark_step_begin()
            self.opt.zero_grad(set_to_none=True)
            self.loss = self._eager_step()

    def timed(self, steps: int) -> float:
        """Seconds per step of ``steps`` steps timed as one block (the device drained before and after)."""
        return timed(self.run, steps, sync=self.sync)[1] / steps

    def peak_mib(self) -> float | None:
        if self.device != "cuda":
            return None
        self.sync()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        self.run(1)
        self.sync()
        return (torch.cuda.max_memory_allocated() - base) / 2**20


def steps_done(s: Stepper) -> int:
    """Optimizer steps taken so far (Adam's step count of the first parameter)."""
    state = s.opt.state.get(next(iter(s.net.parameters())), {})
    return int(state["step"]) if "step" in state else 0


def compare(pair: dict[str, Callable[[], torch.nn.Module]], device: str, batch: int, cin: int, mode: str,
            dtype: torch.dtype, rounds: int, block: int) -> dict[str, Any]:
    """SMoE against dense in ``mode``: median ms per step, the median ratio, peaks, loss against eager."""
    steppers = {k: Stepper(m, device, batch, cin, mode, dtype) for k, m in pair.items()}
    for s in steppers.values():
        s.run(2)
    times = interleave({k: partial(s.timed, block) for k, s in steppers.items()}, rounds)
    out: dict[str, Any] = {"mode": mode, "batch": batch, "dtype": str(dtype).removeprefix("torch."),
                           "ratio": times.ratio("smoe", "dense")}
    for k, s in steppers.items():
        out[k] = {"ms_per_step": times.median(k) * 1e3, "setup_seconds": s.setup_seconds,
                  "peak_mib": s.peak_mib()}
        if mode != "eager":  # the same number of eager steps from the same weights: same loss up to rounding
            eager = Stepper(pair[k], device, batch, cin, "eager", dtype)
            eager.run(steps_done(s))  # loss of the last step, computed before its update, on both sides
            out[k]["loss_vs_eager"] = abs(float(s.loss) - float(eager.loss)) / max(abs(float(eager.loss)), 1e-30)
    del steppers
    if device == "cuda":
        torch.cuda.empty_cache()
    return out


def profile_pair(pair: dict[str, Callable[[], torch.nn.Module]], device: str, batch: int, cin: int, mode: str,
                 dtype: torch.dtype, title: str, steps: int = 5) -> str:
    """Profiler tables (top ops by device time, then by host time) of SMoE and dense in ``mode``."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    parts = []
    for k, make in pair.items():
        s = Stepper(make, device, batch, cin, mode, dtype)
        s.run(3)
        s.sync()
        with profile(activities=activities) as prof:
            s.run(steps)
            s.sync()
        table = prof.key_averages()
        for sort in (["cuda_time_total"] if device == "cuda" else []) + ["cpu_time_total"]:
            parts.append(f"=== {title}: {k}, {mode}, {steps} steps, sorted by {sort}\n"
                         + table.table(sort_by=sort, row_limit=12, max_name_column_width=60))
    return "\n".join(parts)


def _write(out: dict[str, Any], args: argparse.Namespace) -> None:
    write_results(args.out / f"gpu_compile_{args.device}", out, markdown(out), machine=args.machine)


def _item(out: dict[str, Any], key: str, fn: Callable[[], dict[str, Any]], args: argparse.Namespace) -> None:
    """Run one measurement into ``out["items"][key]`` (an error is recorded, not raised); write the files."""
    device, watch = args.device, Stopwatch()
    print(f"{key}: started", flush=True)  # a time-out mid-item shows here (what did not finish compiling)
    try:
        out["items"][key] = fn() | {"seconds": watch.elapsed()}
        r = out["items"][key]
        print(f"{key}: ×{r['ratio']:.2f} (smoe {r['smoe']['ms_per_step']:.2f} ms, dense "
              f"{r['dense']['ms_per_step']:.2f} ms)", flush=True)
    except Exception as err:  # a mode that does not capture or compile is a result, not a crash
        out["items"][key] = {"error": f"{type(err).__name__}: {str(err)[:400]}", "seconds": watch.elapsed()}
        print(f"{key}: FAILED {out['items'][key]['error']}", flush=True)
        if device == "cuda":
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
    _write(out, args)


def run(args: argparse.Namespace) -> dict[str, Any]:
    """The layer and network items in every mode, the profiles of missed targets, then the compile modes."""
    watch, args.machine = Stopwatch(), Machine()
    dtypes = {"fp32": torch.float32, "bf16": torch.bfloat16}
    modes = ["eager"] + (["graph"] if args.device == "cuda" else [])
    out: dict[str, Any] = {"setup": device_record(args.device) | {"rounds": args.rounds, "block": args.block,
                                                            "layer": [args.layer_channels, args.layer_experts],
                                                            "grid": list(GRID)}, "items": {}}
    pair = layer_pair(args.layer_channels, args.layer_experts)
    for batch in args.batches:
        for dname in args.dtypes:
            for mode in modes:
                _item(out, f"layer_b{batch}_{dname}_{mode}", partial(
                    compare, pair, args.device, batch, args.layer_channels, mode, dtypes[dname], args.rounds,
                    args.block), args)
    networks = {n: NETWORKS[n] for n in args.networks}
    for name, spec in networks.items():
        for mode in modes:
            _item(out, f"{name}_{mode}", partial(
                compare, {"smoe": spec["smoe"], "dense": spec["dense"]}, args.device, spec["batch"], spec["in"],
                mode, torch.float32, args.rounds, args.block), args)
    profiles = profile_misses(out, args, pair, networks)
    write_report(args.out / f"gpu_compile_profile_{args.device}.txt", profiles + "\n")
    for mode in args.compile_modes:
        for name, spec in networks.items():
            key = f"{name}_compile:{mode}"
            if watch.elapsed() > args.deadline:
                out["items"][key] = {"error": f"skipped: the {args.deadline:.0f} s deadline had passed"}
                _write(out, args)
                continue
            _item(out, key, partial(
                compare, {"smoe": spec["smoe"], "dense": spec["dense"]}, args.device, spec["batch"], spec["in"],
                f"compile:{mode}", torch.float32, args.rounds, args.block), args)
    return out


def profile_misses(out: dict[str, Any], args: argparse.Namespace, pair: dict[str, Callable[[], torch.nn.Module]],
                   networks: dict[str, dict[str, Any]]) -> str:
    """Profiles of the items whose best mode misses its target (layer at batch 64 fp32, each network)."""
    parts = []
    groups = {f"layer_b{b}_fp32": (pair, b, args.layer_channels, LAYER_TARGET.get(b, 1.25)) for b in args.batches}
    groups |= {n: ({"smoe": s["smoe"], "dense": s["dense"]}, s["batch"], s["in"], NETWORK_TARGET)
               for n, s in networks.items()}
    for prefix, (p, batch, cin, target) in groups.items():
        done = {k: v for k, v in out["items"].items() if k.startswith(prefix + "_") and "ratio" in v}
        if not done:
            continue
        best = min(done, key=lambda k: done[k]["ratio"])
        if done[best]["ratio"] <= target:
            continue
        try:
            parts.append(profile_pair(p, args.device, batch, cin, done[best]["mode"], torch.float32,
                                      f"{best} (×{done[best]['ratio']:.2f} > target {target})"))
        except Exception as err:
            parts.append(f"=== {best}: profile failed: {type(err).__name__}: {err}")
    return "\n".join(parts) or "every target met: no profile"


def markdown(out: dict[str, Any]) -> list[str]:
    s = out["setup"]
    lines = [f"# Launch-bound SMoE step on {s.get('gpu', s['device'])}: eager, CUDA graphs, torch.compile", "",
             f"torch {s['torch']}; blocks of {s['block']} steps interleaved over {s['rounds']} rounds (median); "
             f"layer C = {s['layer'][0]}, |E| = {s['layer'][1]} against the dense {s['layer'][1]}-filter conv; "
             f"targets: layer ≤ {LAYER_TARGET[64]}× at batch 64, ≤ {LAYER_TARGET[16]}× at 16; networks ≤ "
             f"{NETWORK_TARGET}× their dense twins. Setup = capture or compile seconds. Peak: memory allocated during "
             "one step beyond what was held before it (a CUDA graph holds its pool: ~0).", "",
             "| item | SMoE ms | dense ms | × dense | SMoE / dense setup s | peak MiB SMoE / dense | "
             "loss vs eager SMoE / dense |", "|---|---:|---:|---:|---:|---:|---:|"]
    for key, r in out["items"].items():
        if "error" in r:
            lines.append(f"| {key} | – | – | – | – | – | {r['error'][:160]} |")
            continue
        sm, de = r["smoe"], r["dense"]
        peak = "–" if sm["peak_mib"] is None else f"{sm['peak_mib']:.0f} / {de['peak_mib']:.0f}"
        lve = "–" if "loss_vs_eager" not in sm else f"{sm['loss_vs_eager']:.1e} / {de['loss_vs_eager']:.1e}"
        lines.append(f"| {key} | {sm['ms_per_step']:.2f} | {de['ms_per_step']:.2f} | {r['ratio']:.2f} | "
                     f"{sm['setup_seconds']:.1f} / {de['setup_seconds']:.1f} | {peak} | {lve} |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--block", type=int, default=20, help="steps per timed block")
    parser.add_argument("--batches", type=int, nargs="+", default=[64, 16], help="layer batches")
    parser.add_argument("--dtypes", nargs="+", default=["fp32", "bf16"], choices=["fp32", "bf16"])
    parser.add_argument("--layer-channels", type=int, default=128, help="layer C = E (the benchmark's 128)")
    parser.add_argument("--layer-experts", type=int, default=256, help="layer |E| (the benchmark's 256)")
    parser.add_argument("--networks", nargs="*", default=list(NETWORKS), choices=list(NETWORKS))
    parser.add_argument("--compile-modes", nargs="*", default=["reduce-overhead", "max-autotune-no-cudagraphs"])
    parser.add_argument("--deadline", type=float, default=150.0,
                        help="seconds after which no further compile mode starts")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: torch sees no CUDA device on this machine")
    run(args)
    print(f"wrote {args.out / f'gpu_compile_{args.device}'}.json, .md and _profile .txt")


if __name__ == "__main__":
    main()
