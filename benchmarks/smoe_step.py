"""Warm training-step time of the SMoE networks against their dense twins, in the same run.

One step = forward + loss + backward (RC labels inside it) + Adam step, one CPU thread, batch 8 on the
32×64 gcm_ens grid, inputs random (the data loader is not part of it; ``benchmarks/train_throughput.py``
measures whole loops; ``benchmarks/postprocess_train_loop.py`` the post-processing networks' ``smoe train``).
Pairs, each timed warm (``--warmup`` steps first), alternating blocks of ``--block`` steps (dense, SMoE, SMoE
all-experts, …) so a drifting machine load hits every variant alike; per round the median block of each, and
the median over ``--rounds`` rounds of the per-round ratios is reported:

* the post-processing U-Net at widths 8/16/32 and 16/32/64 vs the SMoE-U-Net (land-sea prior, coherent
  gate, RC q 0.3, no damping; |E| = 4 × filters);
* the WeatherBench ResNet 16 filters × 3 blocks vs its all-SMoE twin (|E| = 2 × filters, land-sea prior,
  the configs of ``configs/studies/gcm_16x3_cpu.yaml``).

The SMoE networks run with the CPU default ``expert_compute="used"`` (only the experts selected somewhere on
the grid are convolved) and, as "before", with ``expert_compute="all"`` (every expert everywhere, the code
before); both loss trajectories for a fixed seed are compared (max relative difference; float32 summation
order is the only allowed difference). The number of experts computed per layer is recorded. A third SMoE
variant, "fixed routing" (RC off, gates frozen), splits the SMoE's cost into its experts plus gather and what
learning the routing adds. A profiler split of each network's step into the convolution kernels and
everything else (dense, fixed routing, SMoE) gives the floor the expert convolutions alone set, and a profile of
one SMoE-U-Net step (top operators) is stored too. The load average at start is recorded: ratios, not seconds,
are the numbers to compare across machines.

Writes ``benchmarks/results/smoe_step_cpu.json`` and ``.md``.
    python -m benchmarks.smoe_step [--steps 20] [--block 5] [--rounds 5]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
from collections.abc import Callable
from typing import Any

import torch

from benchmarks.harness import RESULTS, Machine, Rounds, block_seconds, interleave, pin_threads, warm_up, write_results
from smoeweather.models.resnet import SMoEPlacement, WeatherBenchResNet
from smoeweather.models.unet import PostprocessingUNet
from smoeweather.nn.smoe import smoe_layers

GRID = (32, 64)


def land_sea() -> torch.Tensor:
    """A fixed land-sea map (H, W): two continents, about 30 % land."""
    land = torch.zeros(GRID)
    land[4:20, 8:24] = 1.0
    land[14:30, 36:52] = 1.0
    return land


def unet(widths: tuple[int, ...], smoe: bool) -> torch.nn.Module:
    kwargs: dict[str, Any] = dict(smoe=True, grid=GRID, land_sea_prior=land_sea(), gate_init="coherent",
                                  damping=None) if smoe else {}
    return PostprocessingUNet(8, levels=3, widths=widths, out_channels=2, **kwargs)


def resnet(smoe: bool) -> torch.nn.Module:
    placement = SMoEPlacement.from_config({"placement": "all", "experts_factor": 2, "gate_prior": "land_sea",
                                           "prior_strength": 1.0} if smoe else None)
    return WeatherBenchResNet(in_channels=8, out_channels=2, width=16, blocks=3, grid=GRID, smoe=placement,
                              land_sea_prior=land_sea().long() if smoe else None)


NETWORKS: dict[str, tuple[Callable[[], torch.nn.Module], Callable[[], torch.nn.Module]]] = {
    "unet_8_16_32": (lambda: unet((8, 16, 32), False), lambda: unet((8, 16, 32), True)),
    "unet_16_32_64": (lambda: unet((16, 32, 64), False), lambda: unet((16, 32, 64), True)),
    "resnet_16x3": (lambda: resnet(False), lambda: resnet(True)),
}


def all_experts(make: Callable[[], torch.nn.Module]) -> Callable[[], torch.nn.Module]:
    """The same network with every SMoE layer computing all experts everywhere (the code before)."""
    def build() -> torch.nn.Module:
        net = make()
        for layer in smoe_layers(net):
            layer.expert_compute = "all"
        return net
    return build


def fixed_routing(make: Callable[[], torch.nn.Module]) -> Callable[[], torch.nn.Module]:
    """The same network with RC off and every gate frozen: the experts and the gather, no routing to learn."""
    def build() -> torch.nn.Module:
        net = make()
        for layer in smoe_layers(net):
            layer.rc = False
            layer.gate.requires_grad_(False)
        return net
    return build


def experts_computed(make: Callable[[], torch.nn.Module]) -> list[list[int]]:
    """[experts computed, |E|] per SMoE layer in one forward of the seeded network at initialisation."""
    s = Stepper(make)
    counts: list[list[int]] = []
    hooks = [layer.register_forward_hook(lambda m, i, o: counts.append(
        [int(m._used_experts(m.gate.top_indices(m.num_selected)[0])[0].numel()), m.num_experts]))
        for layer in smoe_layers(s.net)]
    s.step()
    for h in hooks:
        h.remove()
    return counts


class Stepper:
    """A seeded network + Adam + fixed random batch; ``step()`` runs one training step, returns its loss."""

    def __init__(self, make: Callable[[], torch.nn.Module], seed: int = 0) -> None:
        torch.manual_seed(seed)
        self.net = make()
        self.opt = torch.optim.Adam(self.net.parameters(), lr=1e-3)
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randn(8, 8, *GRID, generator=g)
        self.y = torch.randn(8, 2, *GRID, generator=g)

    def step(self) -> float:
        self.opt.zero_grad()
        loss = torch.nn.functional.mse_loss(self.net(self.x), self.y)
        loss.backward()
        self.opt.step()
        return float(loss.detach())

    def timed(self, steps: int) -> float:
        """Seconds per step of ``steps`` steps timed as one block."""
        return block_seconds(self.step, steps)


def trajectory(make: Callable[[], torch.nn.Module], steps: int) -> list[float]:
    s = Stepper(make)
    return [s.step() for _ in range(steps)]


def profile_top(make: Callable[[], torch.nn.Module], steps: int = 5, rows: int = 12) -> list[dict[str, Any]]:
    """Top operators by self CPU time over ``steps`` warm steps: [{name, share, ms_per_step}]."""
    from torch.profiler import ProfilerActivity, profile

    s = Stepper(make)
    s.timed(2)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        s.timed(steps)
    events = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
    total = sum(e.self_cpu_time_total for e in events)
    return [{"name": e.key, "share": e.self_cpu_time_total / total, "ms_per_step": e.self_cpu_time_total / 1e3 / steps}
            for e in events[:rows]]


CONVOLUTION_OPS = ("aten::mkldnn_convolution", "aten::convolution_backward", "aten::_slow_conv2d_forward",
                   "aten::_slow_conv2d_backward", "aten::thnn_conv2d", "aten::_nnpack_spatial_convolution")


def cost_split(variants: dict[str, Callable[[], torch.nn.Module]], steps: int = 5,
               repeats: int = 4) -> dict[str, dict[str, float]]:
    """Self CPU time per step (ms) of each variant in the convolution kernels (forward and backward) and in
    everything else, from the profiler, over ``repeats`` interleaved blocks of ``steps`` warm steps. The profiler
    adds a few µs to every operator, so "other" is inflated a little, the more so the more operators."""
    from torch.profiler import ProfilerActivity, profile

    steppers = {key: Stepper(make) for key, make in variants.items()}
    totals = {key: {"convolutions_ms": 0.0, "other_ms": 0.0} for key in variants}
    for stepper in steppers.values():
        stepper.timed(2)
    for _ in range(repeats):
        for key, stepper in steppers.items():
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                stepper.timed(steps)
            for event in prof.key_averages():
                part = "convolutions_ms" if event.key in CONVOLUTION_OPS else "other_ms"
                totals[key][part] += event.self_cpu_time_total / 1e3 / (steps * repeats)
    for parts in totals.values():
        parts["total_ms"] = parts["convolutions_ms"] + parts["other_ms"]
    return totals


def measure_network(name: str, args: argparse.Namespace) -> dict[str, Any]:
    """The four variants of network ``name`` in interleaved rounds, their loss trajectories and cost split."""
    make_dense, make_smoe = NETWORKS[name]
    variants = {"dense": make_dense, "smoe": make_smoe, "smoe_fixed_routing": fixed_routing(make_smoe),
                "smoe_all_experts": all_experts(make_smoe)}
    steppers = {key: Stepper(make) for key, make in variants.items()}
    for stepper in steppers.values():
        warm_up(stepper.step, args.warmup)

    def progress(r: int, so_far: Rounds) -> None:
        print(f"{name} round {r}: " + ", ".join(f"{k} {v[-1] * 1e3:.1f} ms" for k, v in so_far.seconds.items()),
              flush=True)

    # alternate short blocks: a load change hits every variant alike, and each block runs with its own network's
    # caches warm; per round the median block of each variant
    rounds = interleave({k: (lambda s=s: s.timed(args.block)) for k, s in steppers.items()}, args.rounds,
                        blocks=max(args.steps // args.block, 1), on_round=progress)
    used, every = trajectory(make_smoe, 10), trajectory(all_experts(make_smoe), 10)
    return {"network": name, "seconds_per_step": rounds.medians(),
            "time_ratio": rounds.ratio("smoe", "dense"),
            "time_ratio_all_experts": rounds.ratio("smoe_all_experts", "dense"),
            "round_ratios": rounds.ratios("smoe", "dense"),
            "experts_computed_per_layer": experts_computed(make_smoe),
            "time_ratio_fixed_routing": rounds.ratio("smoe_fixed_routing", "dense"),
            "loss_trajectory": used, "loss_trajectory_all_experts": every,
            "max_relative_loss_difference": max(abs(a - b) / abs(b) for a, b in zip(used, every)),
            "bitwise_identical_steps": next((i for i, (a, b) in enumerate(zip(used, every)) if a != b), len(used)),
            "cost_split_ms": cost_split({"dense": make_dense, "smoe_fixed_routing": fixed_routing(make_smoe),
                                         "smoe": make_smoe})}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20, help="timed steps per network per round")
    parser.add_argument("--block", type=int, default=5, help="steps per timed block")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--networks", nargs="+", default=list(NETWORKS), choices=list(NETWORKS))
    args = parser.parse_args()
    pin_threads(1)
    machine = Machine()
    setup = {"device": "cpu", "threads": 1, "batch": 8, "grid": list(GRID), "steps": args.steps,
             "rounds": args.rounds, "loadavg_at_start": machine.load_start, "cpu_count": os.cpu_count(),
             "torch": torch.__version__, "machine": platform.processor() or platform.machine()}
    entries = [measure_network(name, args) for name in args.networks]
    top = profile_top(NETWORKS["unet_16_32_64"][1]) if "unet_16_32_64" in args.networks else []
    out = {"setup": setup, "target": "SMoE warm step <= 2x its dense twin", "entries": entries,
           "profile_smoe_unet_16_32_64": top}
    write_results(RESULTS / "smoe_step_cpu", out, markdown(out, args), machine=machine)
    print(json.dumps({e["network"]: round(e["time_ratio"], 2) for e in entries}))


def markdown(out: dict[str, Any], args: argparse.Namespace) -> list[str]:
    """The results page's tables."""
    setup, entries, top = out["setup"], out["entries"], out["profile_smoe_unet_16_32_64"]
    lines = ["# SMoE training step vs its dense twin (CPU, 1 thread, batch 8, 32×64)", "",
             f"Load average at start: {setup['loadavg_at_start'][0]:.2f} on {setup['cpu_count']} cores. "
             f"Blocks of {args.block} steps alternate between the variants; median block per round, median of the "
             f"{args.rounds} per-round ratios.", "",
             "| network | dense ms | SMoE ms | ratio | per-round ratios | all experts ms | ratio before (all experts) "
             "| experts computed | bitwise-equal losses | max rel. loss difference, 10 steps |",
             "|---|---:|---:|---:|---|---:|---:|---|---:|---:|"]
    for e in entries:
        s = e["seconds_per_step"]
        computed = sum(c for c, _ in e["experts_computed_per_layer"])
        total = sum(n for _, n in e["experts_computed_per_layer"])
        lines.append(f"| {e['network']} | {s['dense'] * 1e3:.1f} | {s['smoe'] * 1e3:.1f} | {e['time_ratio']:.2f} | "
                     f"{', '.join(f'{r:.2f}' for r in e['round_ratios'])} | "
                     f"{s['smoe_all_experts'] * 1e3:.1f} | {e['time_ratio_all_experts']:.2f} | {computed} of {total} | "
                     f"{e['bitwise_identical_steps']} of 10 | {e['max_relative_loss_difference']:.1e} |")
    lines += ["", "Fixed routing: the same SMoE network with RC off and every gate frozen, timed in the same blocks. "
              "It convolves the same experts and gathers the same slots, but computes no RC labels, no gate "
              "gradient, no new top-k and no Adam step of the gates: what the experts cost, against what learning "
              "the routing adds.", "", "| network | SMoE | SMoE, fixed routing | learning the routing adds |",
              "|---|---:|---:|---:|"]
    for e in entries:
        lines.append(f"| {e['network']} | {e['time_ratio']:.2f} | {e['time_ratio_fixed_routing']:.2f} | "
                     f"{e['time_ratio'] - e['time_ratio_fixed_routing']:+.2f} |")
    lines += ["", "Where the ratio comes from (profiler, self CPU ms per step, interleaved blocks): the convolution "
              "kernels (forward and backward) against everything else. \"Convolutions alone\" is the ratio the "
              "SMoE would have if everything but its convolutions cost what the dense network's does: the floor "
              "that the expert convolutions set.", "",
              "| network | dense: conv / other | fixed routing: conv / other | SMoE: conv / other | "
              "convolutions, SMoE / dense | convolutions alone | fixed routing | SMoE |",
              "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for e in entries:
        c = e["cost_split_ms"]
        d, f, m = c["dense"], c["smoe_fixed_routing"], c["smoe"]
        lines.append(f"| {e['network']} | {d['convolutions_ms']:.1f} / {d['other_ms']:.1f} | "
                     f"{f['convolutions_ms']:.1f} / {f['other_ms']:.1f} | "
                     f"{m['convolutions_ms']:.1f} / {m['other_ms']:.1f} | "
                     f"{m['convolutions_ms'] / d['convolutions_ms']:.2f} | "
                     f"{(m['convolutions_ms'] + d['other_ms']) / d['total_ms']:.2f} | "
                     f"{f['total_ms'] / d['total_ms']:.2f} | {m['total_ms'] / d['total_ms']:.2f} |")
    if top:
        lines += ["", "Where an SMoE-U-Net 16/32/64 step goes (self CPU time):", "", "| operator | share | ms/step |",
                  "|---|---:|---:|"]
        lines += [f"| `{t['name']}` | {t['share']:.1%} | {t['ms_per_step']:.1f} |" for t in top]
    lines += ["", "Losses: the two SMoE variants (only the selected experts / every expert) start from the same seed; "
              "they are bitwise equal until the float32 summation order of a convolution's input gradient (a sum "
              "over fewer output channels) flips one RC flag at its threshold, after which the gate updates "
              "differ by one Adam step at that location. The layer itself is tested bitwise on exact data "
              "(tests/nn/test_smoe_fastpath.py::test_used_experts_only_is_bitwise_identical)."]
    return lines


if __name__ == "__main__":
    main()
