"""Where one SMoE layer's training step goes: the routing, the experts and the gather/scatter, per expert path.

Quiet-machine command (the table in benchmarks/results/smoe_profile_cpu.md; a few minutes on 2 cores):

    .venv/bin/python -m benchmarks.smoe_profile --threads 1
    .venv/bin/python -m benchmarks.smoe_profile --threads 2 --out-name smoe_profile_cpu_2threads

The layer is the SMoE-U-Net's first layer (16 → 16 channels, |E| = 64 experts of one channel, E = 16 selected,
a coherent tensor-routing gate with a land-sea prior of two continents, RC on with q = 0.3, no damping), at
32 × 64 (batch 8) and 128 × 256 (batch 4); its dense twin is the 3 × 3 convolution of the same widths. One step is
forward, MSE loss, backward (the RC labels inside it) and Adam, timed warm without the profiler in interleaved rounds
(:func:`benchmarks.harness.interleave`), then split by the profiler into parts. The parts are scopes
(``record_function``) the benchmark wraps around the layer's own functions, so the library pays nothing for them:

* ``routing: selection``: the gate's top-k (cached while the weight is unchanged), the used experts, the flat slot
  index, the selected path's plan;
* ``routing: RC labels + gate gradient``: the backward's misrouting flags, labels, gate gradient (and damping);
* ``routing: gate update``: Adam's step on the routing tensor (an optimizer of its own);
* ``experts: forward`` / ``experts: backward``: the expert convolutions (and their weight rows);
* ``gather / scatter``: the slots gathered from the experts' output, their gradient put back;
* ``expert update``: Adam on the expert weights; ``loss and rest``: what is left of the step.

Each part is reported in ms per step (profiler time, inflated by a few µs per operator) and as a share of the dense
twin's step (its unprofiled wall time). The routing's share is the number the target (≤ 0.15) is about.

Then the whole network at both sizes (skip with ``--no-networks``): the SMoE-U-Net 16/32/64 (the studies' constructor,
the land-sea map above) with ``used`` and ``selected`` against the U-Net 16/32/64, training step and inference forward
(``eval``, ``no_grad``), interleaved rounds of ``--steps // 5`` calls, median of the per-round ratios.
"""

from __future__ import annotations

import argparse
import functools
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile, record_function

from benchmarks.harness import (
    RESULTS,
    Machine,
    block_seconds,
    interleave,
    load_average,
    pin_threads,
    warm_up,
    write_results,
)
from smoeweather.models.unet import PostprocessingUNet
from smoeweather.nn import gates as gates_module
from smoeweather.nn import smoe as smoe_module
from smoeweather.nn import smoe_autograd
from smoeweather.nn.gates import TensorRoutingGate
from smoeweather.nn.smoe import SpatialMoE2d, smoe_layers

CASES = {"32x64": ((32, 64), 8), "128x256": ((128, 256), 4)}
PATHS = ("all", "used", "selected")
PARTS = ("routing: selection", "routing: RC labels + gate gradient", "routing: gate update", "experts: forward",
         "experts: backward", "gather / scatter", "expert update", "loss and rest")
ROUTING = PARTS[:3]
# autograd nodes of the expert computation in backward (the weight rows' IndexSelect included)
EXPERT_BACKWARD = ("ConvolutionBackward0", "IndexSelectBackward0", "LeafConvolutionsBackward")
CHANNELS, FACTOR = 16, 4


def land_sea(grid: tuple[int, int]) -> torch.Tensor:
    """Two continents, about 30 % land, at any grid size (the map of benchmarks/smoe_step.py, scaled)."""
    h, w = grid
    land = torch.zeros(grid, dtype=torch.long)
    land[h // 8:h * 5 // 8, w // 8:w * 3 // 8] = 1
    land[h * 7 // 16:h * 15 // 16, w * 9 // 16:w * 13 // 16] = 1
    return land


class LayerStep:
    """The SMoE layer (or its dense twin) with Adam and a fixed batch; ``step()`` is one training step."""

    def __init__(self, grid: tuple[int, int], batch: int, path: str | None, seed: int = 0) -> None:
        torch.manual_seed(seed)
        self.smoe = path is not None
        if self.smoe:
            gate = TensorRoutingGate(FACTOR * CHANNELS, *grid, num_selected=CHANNELS, prior=land_sea(grid),
                                     init="coherent")
            self.layer: torch.nn.Module = SpatialMoE2d(CHANNELS, FACTOR * CHANNELS, CHANNELS, gate=gate, damping=None,
                                                       quantile=0.3, expert_compute=path)
            experts = [p for n, p in self.layer.named_parameters() if not n.startswith("gate.")]
            self.gate_opt: torch.optim.Optimizer | None = torch.optim.Adam(gate.parameters(), lr=1e-3)
        else:
            self.layer = torch.nn.Conv2d(CHANNELS, CHANNELS, 3, padding=1, bias=False)
            experts, self.gate_opt = list(self.layer.parameters()), None
        self.opt = torch.optim.Adam(experts, lr=1e-3)
        g = torch.Generator().manual_seed(seed)
        # the input needs its gradient, as a hidden layer's does (the convolution's input gradient is part of the cost)
        self.x = torch.randn(batch, CHANNELS, *grid, generator=g).requires_grad_(True)
        self.target = torch.randn(batch, CHANNELS, *grid, generator=g)

    def step(self) -> None:
        self.opt.zero_grad()
        if self.gate_opt is not None:
            self.gate_opt.zero_grad()
        loss = torch.nn.functional.mse_loss(self.layer(self.x), self.target)
        loss.backward()
        with record_function("expert update"):
            self.opt.step()
        if self.gate_opt is not None:
            with record_function("routing: gate update"):
                self.gate_opt.step()


def _scoped(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with record_function(name):
            return fn(*args, **kwargs)
    return wrapper


@contextmanager
def scopes() -> Iterator[None]:
    """The layer's functions wrapped in the parts' ``record_function`` scopes, restored afterwards."""
    patches = [
        (TensorRoutingGate, "selection", "routing: selection"),
        (SpatialMoE2d, "_used_experts", "routing: selection"),
        (SpatialMoE2d, "selected_plan", "routing: selection"),
        (smoe_module, "flat_slot_index", "routing: selection"),
        (gates_module, "flat_slot_index", "routing: selection"),
        (SpatialMoE2d, "apply_experts", "experts: forward"),
        (SpatialMoE2d, "apply_selected", "experts: forward"),
        (smoe_autograd, "_routing_backward", "routing: RC labels + gate gradient"),
    ]
    saved = [(owner, attr, owner.__dict__[attr]) for owner, attr, _ in patches]
    for owner, attr, name in patches:
        setattr(owner, attr, _scoped(name, getattr(owner, attr)))
    functions = [smoe_autograd._RouteExperts, smoe_autograd._RouteBlock]
    originals = [(f, f.__dict__["forward"], f.__dict__["backward"]) for f in functions]
    for f in functions:
        f.forward = staticmethod(_scoped("gather / scatter", f.forward))
        f.backward = staticmethod(_scoped("gather / scatter", f.backward))
    try:
        yield
    finally:
        for owner, attr, original in saved:
            setattr(owner, attr, original)
        for f, forward, backward in originals:
            f.forward, f.backward = forward, backward


def _event_tree(prof: Any) -> list[Any]:
    return [e for e in prof.events() if e.cpu_parent is None]


def split(prof: Any, steps: int) -> dict[str, float]:
    """ms per step of every part, from the profiler's event tree: a part's time is its scopes' CPU time minus the
    other parts' scopes nested inside it (the RC labels run inside the scatter's backward); the expert backward is
    the autograd nodes of :data:`EXPERT_BACKWARD`; everything else is ``loss and rest``."""
    parts = dict.fromkeys(PARTS, 0.0)
    total = 0.0

    def walk(event: Any, inherited: str | None) -> float:
        """Adds ``event``'s exclusive time to its part; returns its CPU total (µs)."""
        name = event.name
        part = name if name in parts else inherited
        if any(name.endswith(node) for node in EXPERT_BACKWARD) and name.startswith("autograd::engine"):
            part = "experts: backward"
        children = sum(walk(child, part) for child in event.cpu_children)
        own = event.time_range.elapsed_us() - children
        parts[part or "loss and rest"] += own
        return event.time_range.elapsed_us()

    for event in _event_tree(prof):
        total += walk(event, None)
    return {k: v / 1e3 / steps for k, v in parts.items()}


def profile_parts(stepper: LayerStep, steps: int) -> dict[str, float]:
    """The parts of ``steps`` warm steps of ``stepper``, ms per step."""
    with scopes():
        warm_up(stepper.step, 2)
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(steps):
                stepper.step()
    return split(prof, steps)


def measure_case(name: str, args: argparse.Namespace) -> dict[str, Any]:
    """Wall time per step of the dense twin and every path, interleaved; the profiler's parts of each."""
    grid, batch = CASES[name]
    steppers = {"dense": LayerStep(grid, batch, None), **{p: LayerStep(grid, batch, p) for p in PATHS}}
    for s in steppers.values():
        warm_up(s.step, args.warmup)
    rounds = interleave({k: (lambda s=s: block_seconds(s.step, args.steps)) for k, s in steppers.items()},
                        args.rounds, on_round=lambda r, so_far: print(
                            f"{name} round {r}: " + ", ".join(f"{k} {v[-1] * 1e3:.2f} ms"
                                                             for k, v in so_far.seconds.items()), flush=True))
    dense_ms = rounds.median("dense") * 1e3
    out: dict[str, Any] = {"grid": list(grid), "batch": batch, "dense_ms": dense_ms, "paths": {}}
    for path in PATHS:
        parts = profile_parts(steppers[path], args.profile_steps)
        out["paths"][path] = {
            "step_ms": rounds.median(path) * 1e3, "ratio": rounds.ratio(path, "dense"),
            "round_ratios": rounds.ratios(path, "dense"), "parts_ms": parts,
            "routing_ms": sum(parts[p] for p in ROUTING),
            "routing_share_of_dense": sum(parts[p] for p in ROUTING) / dense_ms,
            "profiled_ms": sum(parts.values())}
    out["dense_parts_ms"] = profile_parts(steppers["dense"], args.profile_steps)
    return out


class NetworkStep:
    """The SMoE-U-Net 16/32/64 of the studies (land-sea prior of :func:`land_sea`, coherent gates, RC q = 0.3, no
    damping) with ``expert_compute=path``, or its dense twin (``path`` None), Adam, and a fixed random batch."""

    def __init__(self, grid: tuple[int, int], batch: int, path: str | None, seed: int = 0) -> None:
        torch.manual_seed(seed)
        smoe = dict(smoe=True, grid=grid, land_sea_prior=land_sea(grid).float(), gate_init="coherent",
                    damping=None) if path is not None else {}
        self.net = PostprocessingUNet(8, levels=3, widths=(16, 32, 64), out_channels=2, **smoe)
        for layer in smoe_layers(self.net):
            layer.expert_compute = path
        self.opt = torch.optim.Adam(self.net.parameters(), lr=1e-3)
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randn(batch, 8, *grid, generator=g)
        self.y = torch.randn(batch, 2, *grid, generator=g)

    def train(self) -> None:
        self.net.train()
        self.opt.zero_grad()
        torch.nn.functional.mse_loss(self.net(self.x), self.y).backward()
        self.opt.step()

    def infer(self) -> None:
        self.net.eval()
        with torch.no_grad():
            self.net(self.x)


def measure_networks(name: str, args: argparse.Namespace) -> dict[str, Any]:
    """Training step and inference forward of the SMoE-U-Net 16/32/64 per path against its dense twin, wall time in
    interleaved rounds (median of the per-round ratios)."""
    grid, batch = CASES[name]
    nets = {"dense": NetworkStep(grid, batch, None), **{p: NetworkStep(grid, batch, p) for p in ("used", "selected")}}
    out: dict[str, Any] = {"grid": list(grid), "batch": batch}
    calls = max(1, args.steps // 5)
    for what in ("train", "infer"):
        for net in nets.values():
            warm_up(getattr(net, what), args.warmup)
        steps = {k: getattr(n, what) for k, n in nets.items()}
        rounds = interleave({k: (lambda f=f: block_seconds(f, calls)) for k, f in steps.items()},
                            args.rounds, on_round=lambda r, so_far, what=what: print(
                                f"{name} network {what} round {r}: " + ", ".join(
                                    f"{k} {v[-1] * 1e3:.1f} ms" for k, v in so_far.seconds.items()), flush=True))
        out[what] = {"dense_ms": rounds.median("dense") * 1e3,
                     **{p: {"ms": rounds.median(p) * 1e3, "ratio": rounds.ratio(p, "dense"),
                            "round_ratios": rounds.ratios(p, "dense")} for p in ("used", "selected")}}
    return out


def network_markdown(networks: dict[str, Any]) -> list[str]:
    """The networks' table: ms and ratio to the dense twin per path."""
    lines = ["## SMoE-U-Net 16/32/64 against the U-Net 16/32/64 (whole network)", "",
             "| grid, batch | what | dense ms | used ms | used / dense | selected ms | selected / dense |",
             "|---|---|---:|---:|---:|---:|---:|"]
    for case in networks.values():
        h, w = case["grid"]
        for what in ("train", "infer"):
            r = case[what]
            lines.append(f"| {h} × {w}, {case['batch']} | {what} | {r['dense_ms']:.1f} | {r['used']['ms']:.1f} | "
                         f"×{r['used']['ratio']:.2f} | {r['selected']['ms']:.1f} | ×{r['selected']['ratio']:.2f} |")
    return lines + [""]


def markdown(cases: dict[str, Any], machine: Machine, threads: int, rounds: int) -> list[str]:
    lines = [f"# One SMoE layer's training step, split into parts (CPU, {threads} thread(s))", "",
             f"Load average at start {machine.load_start}, at end {load_average()}; {machine.record()['cpu']}; "
             f"torch {torch.__version__}; wall times: median of {rounds} interleaved rounds of blocks of steps.", "",
             "SMoE-U-Net level-0 layer: 16 → 16 channels, |E| = 64, E = 16, coherent land-sea gate, RC q = 0.3, no "
             "damping; dense twin: the 3 × 3 convolution 16 → 16. Step = forward, MSE, backward, Adam. Parts: "
             "profiler ms per step (each operator inflated by a few µs); `share` = part / dense step (unprofiled).",
             ""]
    for case in cases.values():
        h, w = case["grid"]
        lines += [f"## {h} × {w}, batch {case['batch']}: dense step {case['dense_ms']:.2f} ms", "",
                  "| part | " + " | ".join(f"{p} ms | {p} share" for p in PATHS) + " |",
                  "|---|" + "---:|---:|" * len(PATHS)]
        for part in PARTS:
            ms = [case['paths'][p]['parts_ms'][part] for p in PATHS]
            cells = [f"{value:.2f} | {value / case['dense_ms']:.2f}" for value in ms]
            lines.append(f"| {part} | " + " | ".join(cells) + " |")
        routing = [f"**{case['paths'][p]['routing_ms']:.2f}** | **{case['paths'][p]['routing_share_of_dense']:.2f}**"
                   for p in PATHS]
        lines.append("| routing, all three parts | " + " | ".join(routing) + " |")
        steps = [f"{case['paths'][p]['step_ms']:.2f} | ×{case['paths'][p]['ratio']:.2f}" for p in PATHS]
        lines += ["| step (wall, unprofiled) and its ratio to the dense step | " + " | ".join(steps) + " |", ""]
    return lines


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--steps", type=int, default=10, help="steps per timed block")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--profile-steps", type=int, default=10)
    parser.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    parser.add_argument("--no-networks", action="store_true", help="the layer only, not the whole SMoE-U-Net")
    parser.add_argument("--out-name", default="smoe_profile_cpu")
    args = parser.parse_args(argv)
    threads = pin_threads(args.threads)
    machine = Machine()
    cases = {name: measure_case(name, args) for name in args.cases}
    networks = {} if args.no_networks else {name: measure_networks(name, args) for name in args.cases}
    result = {"threads": threads, "cases": cases, "parts": list(PARTS), "networks": networks}
    lines = markdown(cases, machine, threads, args.rounds) + (network_markdown(networks) if networks else [])
    write_results(RESULTS / args.out_name, result, lines, machine=machine)


if __name__ == "__main__":
    main()
