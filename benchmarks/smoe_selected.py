"""SMoE networks at the cost of their selected experts? The three expert computations against the dense twins.

Quiet-machine command (the numbers in docs/guide/benchmarks.md; ~15 min on 2 cores):

    .venv/bin/python -m benchmarks.smoe_selected --rounds 7 --compile

Dry run (seconds to minutes; noisy): ``--quick``. Writes ``benchmarks/results/smoe_selected_cpu.json`` and ``.md``.

For each network pair of the studies (SMoE-U-Net 16/32/64 and 8/16/32 against the U-Net of the same widths,
SMoE-all ResNet 16 × 3 against the dense ResNet 16 × 3; the constructors of ``benchmarks/smoe_step.py``: land-sea
prior, coherent gates, batch 8 on the 32 × 64 grid, random inputs) and for 1 and 2 threads:

* the training step (forward, loss, backward with the RC labels, Adam), the inference forward (``eval``,
  ``no_grad``) and the forward + backward of the network's first SMoE layer against a dense 3 × 3 convolution of
  the same widths, timed warm in interleaved rounds (dense, ``used``, ``selected``, …), each round the median of
  ``--steps`` calls; the median over rounds of the per-round ratios is reported, against the dense twin and against
  the previous path (``used``, the CPU default);
* the FLOPs each training step and each forward actually computes, counted by ``torch.utils.flop_counter`` on the
  operators that ran (the leaf convolutions of ``selected`` included), and the experts' share the plan computes
  beyond the selected ones (``computed / ideal``);
* where a target is missed (train ≤ 1.3×, infer ≤ 1.15× the dense twin), a profile of the step's top operators.

``--compile``: ``torch._dynamo.explain`` of an SMoE network's training-step forward (the graph breaks and their
reasons) and compiled against eager step time for the SMoE-U-Net 8/16/32 and its dense twin (inductor; under
``torch.compile`` the layer computes all experts: the selected path's plan is made on the host).

The load average at the start and the end is recorded: other processes on the machine make the seconds noisy, the
interleaving keeps the ratios comparable.
"""

from __future__ import annotations

import argparse
import os
import platform
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from benchmarks.harness import RESULTS, Machine, interleave, load_average, median_seconds, pin_threads, write_results
from benchmarks.smoe_step import GRID, NETWORKS, Stepper
from smoeweather.nn import SpatialMoE2d, smoe_layers

VARIANTS = ("dense", "used", "selected", "exact")
TARGETS = {"train": 1.3, "infer": 1.15}


def build(name: str, variant: str) -> Callable[[], nn.Module]:
    """The network ``name`` as ``variant``: the dense twin, or the SMoE computing ``used`` or ``selected`` experts
    (``exact``: ``selected`` with no per-leaf overhead in the plan's cost model, i.e. each expert only where it is
    selected as far as rectangles of side ≥ 2 allow)."""
    dense, smoe = NETWORKS[name]

    def make() -> nn.Module:
        if variant == "dense":
            return dense()
        net = smoe()
        for layer in smoe_layers(net):
            layer.expert_compute = "selected" if variant == "exact" else variant
            if variant == "exact":  # no per-leaf cost: cut until each leaf holds one expert set
                layer.selected_overhead_macs = 0.0
        return net
    return make


class Runner:
    """One variant's seeded network, optimizer and batch: a training step, an inference forward, and its first
    SMoE layer (or the dense twin's first 3 × 3 convolution of the same widths) forward + backward."""

    def __init__(self, name: str, variant: str) -> None:
        self.step = Stepper(build(name, variant))
        self.net = self.step.net
        torch.manual_seed(1)
        layers = smoe_layers(self.net)
        reference = smoe_layers(build(name, "used")())[0]
        self.layer: nn.Module = layers[0] if layers else nn.Conv2d(reference.in_channels, reference.out_channels, 3,
                                                                   padding=1, bias=False)
        self.layer_x = torch.randn(8, reference.in_channels, *reference.gate.weight.shape[1:], requires_grad=True)
        self.layer_grad = torch.randn(8, reference.out_channels, *reference.gate.weight.shape[1:])

    def train(self) -> None:
        self.net.train()
        self.step.step()

    def infer(self) -> None:
        self.net.eval()
        with torch.no_grad():
            self.net(self.step.x)
        self.net.train()

    def layer_step(self) -> None:
        self.layer(self.layer_x).backward(self.layer_grad)


def interleaved(runners: dict[str, Runner], what: str, rounds: int, calls: int) -> dict[str, Any]:
    """Interleaved rounds of ``what`` (train, infer, layer) over the variants, each round the median of ``calls``
    calls of each: medians and the median per-round ratios."""
    name = "layer_step" if what == "layer" else what
    timed = interleave({v: partial(median_seconds, getattr(r, name), calls) for v, r in runners.items()}, rounds,
                       alternate=False)
    out: dict[str, Any] = {"ms": {v: 1e3 * t for v, t in timed.medians().items()}}
    for variant in runners:
        if variant == "dense":
            continue
        for base in ("dense", "used"):
            if base != variant:
                out[f"{variant}/{base}"] = timed.ratio(variant, base)
    return out


class _Global:
    """A stand-in for FlopCounterMode's module tracker, whose output hooks fail on the SMoE layer's routing
    Function outputs ("Expected gradient function to be set"); the totals need no module hierarchy."""

    parents = frozenset({"Global"})

    def __enter__(self) -> _Global:
        return self

    def __exit__(self, *args: object) -> None:
        return None


def counted_flops(runner: Runner) -> dict[str, float]:
    """GFLOP of one training step and one inference forward, counted on the operators that ran."""
    out = {}
    for what in ("train", "infer"):
        counter = FlopCounterMode(display=False)
        counter.mod_tracker = _Global()
        with counter:
            getattr(runner, what)()
        out[what] = counter.get_total_flops() / 1e9
    return out


def plan_shares(runner: Runner) -> list[dict[str, Any]]:
    """Per SMoE layer: the leaves and the MACs the selected plan computes over the selected experts' MACs."""
    shares = []
    for layer in smoe_layers(runner.net):
        if layer._last_idx is None:
            continue
        plan = layer.selected_plan(layer._last_idx, 8, False, None)  # the runner's overhead setting
        shares.append({"leaves": len(plan.leaves), "computed/ideal": plan.macs_per_sample / plan.ideal_macs_per_sample})
    return shares


def profile_top(runner: Runner, rows: int = 10) -> list[dict[str, Any]]:
    """Top operators by self CPU time over 3 warm training steps: [{name, ms_per_step}]."""
    from torch.profiler import ProfilerActivity, profile

    runner.train()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(3):
            runner.train()
    events = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)[:rows]
    return [{"name": e.key, "ms_per_step": e.self_cpu_time_total / 1e3 / 3} for e in events]


def measure_network(name: str, threads: int, rounds: int, calls: int, warmup: int) -> dict[str, Any]:
    """Train, inference and layer times of the variants of ``name`` on ``threads`` threads; at 1 thread also the
    counted FLOPs, the selected plans and (where a target is missed) the profiles."""
    pin_threads(threads)
    runners = {variant: Runner(name, variant) for variant in VARIANTS}
    for runner in runners.values():
        for _ in range(warmup):
            runner.train()
            runner.infer()
            runner.layer_step()
    result: dict[str, Any] = {what: interleaved(runners, what, rounds, calls) for what in ("train", "infer", "layer")}
    if threads == 1:
        result["gflop"] = {v: counted_flops(r) for v, r in runners.items()}
        result["selected_plans"] = {v: plan_shares(runners[v]) for v in ("selected", "exact")}
        best = {w: min(result[w][f"{v}/dense"] for v in VARIANTS[1:]) for w in TARGETS}
        if any(best[w] > t for w, t in TARGETS.items()):
            result["profile"] = {v: profile_top(runners[v]) for v in ("dense", "used", "exact")}
    return result


def compile_part(calls: int) -> dict[str, Any]:
    """``torch._dynamo.explain`` of the SMoE-U-Net 8/16/32 step's forward + loss, and compiled vs eager steps."""
    pin_threads(1)
    torch._dynamo.reset()
    smoe = Stepper(build("unet_8_16_32", "auto"))

    def loss_of(net: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return nn.functional.mse_loss(net(x), y)

    explained = torch._dynamo.explain(loss_of)(smoe.net, smoe.x, smoe.y)
    reasons = [str(getattr(r, "reason", r)) for r in explained.break_reasons]
    out: dict[str, Any] = {"graph_count": explained.graph_count, "graph_break_count": explained.graph_break_count,
                           "break_reasons": reasons}
    times: dict[str, float] = {}
    for variant in ("dense", "auto"):
        for compiled in (False, True):
            torch._dynamo.reset()
            stepper = Stepper(build("unet_8_16_32", variant))
            if compiled:
                stepper.net = torch.compile(stepper.net)
            eager_loss = Stepper(build("unet_8_16_32", variant)).step() if compiled else None
            first = stepper.step()
            if compiled:
                out[f"{variant}_first_loss_compiled_minus_eager"] = first - eager_loss
            for _ in range(2):
                stepper.step()
            times[f"{variant}{' compiled' if compiled else ''}"] = 1e3 * median_seconds(stepper.step, calls)
    out["step_ms"] = times
    return out


READING = """How to read it. `exact` computes what the paper's ideal implementation would: its counted FLOPs are
those of
the dense twin plus the gate's (the plan's leaves hold one expert set each; computed / selected ≈ 1.0–1.2, the
excess where a coast cuts a rectangle of side < 2). Its time is not: on one CPU thread each leaf is a separate
oneDNN convolution whose fixed cost (the window copy into the blocked layout, `aten::copy_`; primitive setup; the
input-gradient add into the overlapping halo, `aten::add_`; `LeafConvolutionsBackward`) is paid 11–13 times per
layer on leaves of a few hundred points, so the experts' convolutions cost more than those of the used experts on
the whole grid at twice the FLOPs. `selected` (the default cost model, `CALL_OVERHEAD_MACS`) therefore keeps one
leaf, i.e. the used experts, nearly everywhere on these 32 × 64 grids. Even at zero expert overhead the targets
would be missed: the routing's own work (`_RouteExpertsBackward` / `_RouteBlockBackward`: RC quantiles and labels;
`index_select`, `scatter_add_`: the slot gather and scatter; `topk`; the gates' Adam step) costs a U-Net step
about 0.3–0.5 of the dense twin's step (benchmarks/results/smoe_step_cpu.md, "fixed routing")."""


def markdown(results: dict[str, Any]) -> list[str]:
    """The results page: the time table, the FLOPs table, the profiles of missed targets, torch.compile."""
    lines = ["# SMoE expert computations against the dense twins (CPU, batch 8, 32 × 64)", "",
             f"Load average at start {results['loadavg_start']}, at end {results['loadavg_end']} on "
             f"{results['cpu_count']} cores; {results['rounds']} interleaved rounds of {results['calls']} calls, "
             "median of the per-round ratios. `used`: the experts selected anywhere on the grid (the CPU default); "
             "`selected`: each expert only in the rectangles that select it (`expert_compute=\"selected\"`).", "",
             "`exact`: `selected` cut until every leaf holds one expert set (no per-leaf cost in the plan).", "",
             "| network | threads | what | dense ms | used ms | selected ms | exact ms | used / dense "
             "| selected / dense | exact / dense | selected / used | exact / used |",
             "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for name, per_threads in results["networks"].items():
        for threads, r in per_threads.items():
            for what in ("train", "infer", "layer"):
                m = r[what]
                ms = " | ".join(f"{m['ms'][v]:.1f}" for v in VARIANTS)
                ratios = " | ".join(f"{m[k]:.2f}" for k in ("used/dense", "selected/dense", "exact/dense",
                                                             "selected/used", "exact/used"))
                lines.append(f"| {name} | {threads} | {what} | {ms} | {ratios} |")
    lines += ["", "FLOPs counted on the operators that ran, GFLOP per training step / per forward; per SMoE layer "
              "the plan's leaves and its multiply-adds over those of the selected experts alone:", "",
              "| network | dense | used | selected | exact | selected plans | exact plans |",
              "|---|---:|---:|---:|---:|---|---|"]
    for name, per_threads in results["networks"].items():
        r = per_threads["1"]
        flops = " | ".join(f"{r['gflop'][v]['train']:.2f} / {r['gflop'][v]['infer']:.2f}" for v in VARIANTS)
        plans = " | ".join(", ".join(f"{p['leaves']}: {p['computed/ideal']:.2f}" for p in r["selected_plans"][v])
                           for v in ("selected", "exact"))
        lines.append(f"| {name} | {flops} | {plans} |")
    for name, per_threads in results["networks"].items():
        profile = per_threads["1"].get("profile")
        if profile:
            lines += ["", f"Targets missed by every variant for {name} (1 thread): top operators, self CPU ms "
                          "per training step:", "",
                      "| dense | ms | used | ms | exact | ms |", "|---|---:|---|---:|---|---:|"]
            for row in zip(profile["dense"], profile["used"], profile["exact"], strict=False):
                lines.append("| " + " | ".join(f"`{r['name']}` | {r['ms_per_step']:.1f}" for r in row) + " |")
    lines += ["", READING]
    if "compile" in results:
        c = results["compile"]
        lines += ["", f"torch.compile (SMoE-U-Net 8/16/32, 1 thread): `torch._dynamo.explain` of the training "
                      f"forward: {c['graph_count']} graphs, {c['graph_break_count']} graph breaks.", ""]
        lines += [f"- break: {reason}" for reason in c["break_reasons"]]
        lines += ["Compiled, every SMoE layer computes all |E| = 4E experts (the used experts' count and the selected "
                  "plan are data-dependent shapes) and routes through one opaque custom operator "
                  "(smoeweather/nn/route_op.py); `auto` is the eager CPU default (`used`). Losses of the first "
                  "compiled step minus eager: "
                  + ", ".join(f"{k.split('_')[0]} {v:.1e}" for k, v in c.items() if k.endswith("minus_eager")) + "."]
        lines += ["", "| step | ms |", "|---|---:|"] + [f"| {k} | {v:.1f} |" for k, v in c["step_ms"].items()]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--calls", type=int, default=3, help="calls per variant and round (their median counts)")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--networks", nargs="+", default=list(NETWORKS), choices=list(NETWORKS))
    parser.add_argument("--compile", action="store_true", help="also the torch.compile part")
    parser.add_argument("--quick", action="store_true", help="dry run: 2 rounds of 1 call, 1 warm-up step")
    parser.add_argument("--out", type=Path, default=RESULTS / "smoe_selected_cpu.json")
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.calls, args.warmup = 2, 1, 1
    machine = Machine()
    results: dict[str, Any] = {
        "loadavg_start": machine.load_start, "cpu_count": os.cpu_count(),
        "machine": platform.processor() or platform.machine(), "torch": torch.__version__, "grid": list(GRID),
        "rounds": args.rounds, "calls": args.calls, "quick": args.quick, "networks": {}}
    for name in args.networks:
        results["networks"][name] = {}
        for threads in args.threads:
            print(f"{name}, {threads} thread(s)", flush=True)
            results["networks"][name][str(threads)] = measure_network(name, threads, args.rounds, args.calls,
                                                                      args.warmup)
    if args.compile:
        print("torch.compile", flush=True)
        results["compile"] = compile_part(args.calls)
    results["loadavg_end"] = load_average()
    lines = markdown(results)
    write_results(args.out, results, lines, machine=machine)
    print("\n".join(lines))


if __name__ == "__main__":
    assert SpatialMoE2d  # the layer the variants configure
    main()
