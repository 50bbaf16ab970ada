"""The SMoE networks on an accelerator: CUDA against CPU for one seed, and training-step cost against dense twins.

``correctness``: an SMoE-U-Net (8/16/32, land-sea prior, coherent gate, RC q 0.3) and an SMoE ResNet (16 × 3,
SMoE in every block, land-sea prior, the ``gcm_16x3_cpu`` settings) and their dense twins train ``--steps`` Adam
steps from the same seed, the same initial weights and the same fixed batch, once on CPU and once on
``--device``. CPU runs the default ``expert_compute="used"`` (only the selected experts are convolved), the
accelerator ``"all"`` (every expert, no host synchronisation), so this also checks that the two paths train the
same network. TF32 is switched off: both sides compute in float32. Recorded per network: the per-step loss
relative difference, the largest parameter difference relative to that tensor's largest value, and for the SMoE
networks the share of grid points whose selected expert set is the same at the end. Every SMoE network is also
run with RC off (the gates still learn from the task loss), which removes the one discrete step inside a
training step (an RC flag at its quantile threshold).

Tolerance. Both sides evaluate the same float32 expressions in different summation orders (oneDNN on CPU,
cuDNN on CUDA): each reduction of K terms may differ by about log2(K) · eps32 relative (eps32 = 1.19e-7; K
up to 9 · 64 = 576 in a convolution, 32,768 in the loss), and the differences of ~12 layers add up, so the
first step's loss (one forward from equal weights) agrees within 12 · 15 · eps32 ≈ 2e-5 (``FORWARD_RTOL``).
Later steps drift further: Adam divides each update by the gradient's running RMS, so a parameter whose true
gradient is about zero (a convolution bias before BatchNorm) takes full-size steps whose sign is set by
float32 noise. No closed bound covers that drift; the dense twin, trained the same way without routing,
measures it. Dropout is switched off (its masks come from each device's own random stream). The SMoE network
passes when its first-step loss is within ``FORWARD_RTOL`` and its largest loss difference over the steps is
at most ``TWIN_FACTOR`` × its dense twin's: a routing error (a wrong expert, a lost gradient) shows as a
difference of order one at the first or second step, far outside either.

``selected``: every expert path of the layer (``expert_compute`` ``used`` and ``selected``, and any later one)
against ``"all"`` on ``--device``: single layers (outputs, input, expert and gate gradients from the same weights
and batch, tolerances K·eps32 for sums of K float32 terms) and the SMoE-U-Net's ``--steps`` Adam steps.

``step``: warm training-step time (forward, MSE, backward, Adam) on ``--device`` of the SMoE networks against
their dense twins and against wider and deeper dense networks, so that the dense network of equal measured
cost can be read off (the frontier studies' frame). ResNets: batch 32, 34 input channels (the GCM configs:
10 fields × 3 offsets, 3 constants, the lead), 3 blocks at widths 8–32 and 16 × 6; SMoE in every block and in
the last block, widths 8 and 16. U-Nets: batch 8 (the post-processing configs'), widths 8/16/32 to 32/64/128.
Blocks of ``--block`` steps alternate between all networks of a group, ``--rounds`` rounds; the median per round
and the median of per-round ratios are reported, with each network's peak memory of one step.

``profile``: profiler tables of the benchmark layer (``benchmarks/smoe_layer.py``'s, batch 64, fp32) against the
dense 256-filter convolution, both routing paths: device kernels against host-side launches.

Writes ``benchmarks/results/gpu_correctness_<device>.{json,md}``, ``gpu_selected_<device>.{json,md}``,
``gpu_step_<device>.{json,md}`` and ``gpu_profile_<device>.txt``;
``render --json FILE`` rewrites a fetched result's .md.

    python -m benchmarks.gpu_check correctness [--device cuda] [--steps 20]
    python -m benchmarks.gpu_check selected [--device cuda] [--steps 20]
    python -m benchmarks.gpu_check step [--device cuda] [--rounds 5] [--block 10]
    python -m benchmarks.gpu_check profile [--device cuda]
    python -m benchmarks.gpu_check render --json benchmarks/results/gpu_correctness_cuda.json
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import torch

from benchmarks.harness import (
    RESULTS,
    Machine,
    Stopwatch,
    block_seconds,
    device_record,
    interleave,
    warm_up,
    write_report,
    write_results,
)
from benchmarks.smoe_step import GRID, land_sea, resnet, unet  # the CPU step benchmark's networks
from smoeweather.models.resnet import SMoEPlacement, WeatherBenchResNet
from smoeweather.nn.smoe import smoe_layers

FORWARD_RTOL = 2e-5  # first-step loss, derived in the module docstring
TWIN_FACTOR = 4.0  # largest loss difference over the steps, against the dense twin's (module docstring)


def _no_rc(make: Callable[[], torch.nn.Module]) -> Callable[[], torch.nn.Module]:
    def build() -> torch.nn.Module:
        net = make()
        for layer in smoe_layers(net):
            layer.rc = False
        return net
    return build


CORRECTNESS: dict[str, Callable[[], torch.nn.Module]] = {
    "smoe_unet_8_16_32": lambda: unet((8, 16, 32), True),
    "smoe_unet_8_16_32_no_rc": _no_rc(lambda: unet((8, 16, 32), True)),
    "unet_8_16_32": lambda: unet((8, 16, 32), False),
    "smoe_resnet_16x3": lambda: resnet(True),
    "smoe_resnet_16x3_no_rc": _no_rc(lambda: resnet(True)),
    "resnet_16x3": lambda: resnet(False),
}


def _selected_sets(net: torch.nn.Module) -> list[torch.Tensor]:
    """Per SMoE layer, the selected experts at every grid point as a sorted index set, shape (k, H, W)."""
    return [torch.sort(layer.gate.top_indices(layer.num_selected)[0][0], 0)[0].cpu() for layer in smoe_layers(net)]


def _train(make: Callable[[], torch.nn.Module], device: str, steps: int) -> tuple[list[float], torch.nn.Module]:
    torch.manual_seed(0)
    net = make()  # built on CPU: both devices start from the same weights
    for module in net.modules():  # each device draws its own dropout masks: not a difference of the code
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
    net.to(device)
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(8, 8, *GRID, generator=g).to(device), torch.randn(8, 2, *GRID, generator=g).to(device)
    losses = []
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.mse_loss(net(x), y)
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    return losses, net.cpu()


def correctness(device: str, steps: int) -> dict[str, Any]:
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    entries = []
    for name, make in CORRECTNESS.items():
        watch = Stopwatch()
        cpu_losses, cpu_net = _train(make, "cpu", steps)
        dev_losses, dev_net = _train(make, device, steps)
        loss_rel = [abs(a - b) / abs(a) for a, b in zip(cpu_losses, dev_losses, strict=True)]
        dev_params = dict(dev_net.named_parameters())
        param_rel = [float((p - dev_params[k]).detach().abs().max() / p.detach().abs().max().clamp_min(1e-30))
                     for k, p in cpu_net.named_parameters()]
        entry: dict[str, Any] = {
            "network": name, "loss_cpu": cpu_losses, "loss_device": dev_losses,
            "max_loss_relative_difference": max(loss_rel),
            "first_step_loss_relative_difference": loss_rel[0],
            "max_parameter_relative_difference": max(param_rel),
            "median_parameter_relative_difference": statistics.median(param_rel),
            "expert_compute": {"cpu": "used", device: "all"} if "smoe" in name else None,
            "seconds": watch.elapsed()}
        if "smoe" in name:
            same = [float((a == b).all(0).float().mean()) for a, b in
                    zip(_selected_sets(cpu_net), _selected_sets(dev_net), strict=True)]
            entry["same_selected_set_share_per_layer"] = same
        entries.append(entry)
        print(f"{name}: loss rel. diff step 1 {loss_rel[0]:.1e}, max {max(loss_rel):.1e}", flush=True)
    out = {"setup": device_record(device) | {"steps": steps, "batch": 8, "grid": list(GRID), "tf32": False,
                                      "dropout": 0.0, "forward_rtol": FORWARD_RTOL, "twin_factor": TWIN_FACTOR},
           "entries": entries}
    out["verdicts"] = verdicts(entries)
    return out


def _twin(network: str) -> str:
    """The dense twin of a correctness network: ``smoe_unet_8_16_32_no_rc`` -> ``unet_8_16_32``."""
    return network.removeprefix("smoe_").removesuffix("_no_rc")


def verdicts(entries: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per SMoE network: first step within FORWARD_RTOL, drift within TWIN_FACTOR × the dense twin's."""
    by_name = {e["network"]: e for e in entries}
    out = {}
    for e in entries:
        if not e["network"].startswith("smoe"):
            continue
        twin = by_name[_twin(e["network"])]
        drift = e["max_loss_relative_difference"] / max(twin["max_loss_relative_difference"], 1e-30)
        out[e["network"]] = {"first_step_ok": e["first_step_loss_relative_difference"] <= FORWARD_RTOL,
                             "drift_to_twin": drift, "passed": (e["first_step_loss_relative_difference"] <= FORWARD_RTOL
                                        and drift <= TWIN_FACTOR)}
    return out


SELECTED_LAYERS: dict[str, dict[str, Any]] = {  # SpatialMoE2d kwargs of the path-vs-all layer checks
    "E8_F1_planar": {"in_channels": 16, "num_experts": 32, "num_selected": 8, "route_impl": "index_select"},
    "E8_F1_channels_last": {"in_channels": 16, "num_experts": 32, "num_selected": 8, "route_impl": "channels_last"},
    "E4_F2_planar": {"in_channels": 16, "num_experts": 16, "num_selected": 4, "out_per_expert": 2,
                     "route_impl": "index_select"},
    "E2_F1_no_rc": {"in_channels": 8, "num_experts": 8, "num_selected": 2, "rc": False, "damping": None,
                    "route_impl": "index_select"},
}
SELECTED_GATE_SHARE = 0.999  # gate-gradient elements that must agree (an RC flag at its threshold may flip)


def expert_paths() -> tuple[str, ...]:
    """The layer's expert paths other than ``all`` (``used``, ``selected``, and any later one)."""
    from smoeweather.nn.smoe import EXPERT_COMPUTES

    return tuple(m for m in EXPERT_COMPUTES if m not in ("all", "auto"))


def _rel(a: torch.Tensor | None, b: torch.Tensor | None) -> float:
    """max |a − b| / max |a| (0 for two missing gradients)."""
    if a is None or b is None:
        return 0.0 if a is None and b is None else float("inf")
    return float((a - b).abs().max() / a.abs().max().clamp_min(1e-30))


def _path_layer(name: str, kwargs: dict[str, Any], device: str, mode: str) -> dict[str, Any]:
    """One forward + backward of the layer with expert_compute ``all`` and ``mode`` from the same weights and batch."""
    from smoeweather.nn import SpatialMoE2d
    from smoeweather.nn.gates import TensorRoutingGate

    grid = GRID  # the land-sea prior's regions: some experts unused, several leaves (else every path is ``all``)
    layers = {}
    for m in ("all", mode):
        torch.manual_seed(0)
        gate = TensorRoutingGate(kwargs["num_experts"], *grid, num_selected=kwargs["num_selected"],
                                 out_per_expert=kwargs.get("out_per_expert", 1), prior=land_sea().long(),
                                 init="coherent")
        layers[m] = SpatialMoE2d(**kwargs, gate=gate, padding="periodic_lon", expert_compute=m).to(device)
        layers[m].selected_overhead_macs = 0.0  # selected: cut down to one expert set per leaf (the path's extreme)
    layers[mode].load_state_dict(layers["all"].state_dict())
    g = torch.Generator().manual_seed(1)
    x0 = torch.randn(8, kwargs["in_channels"], *grid, generator=g).to(device)
    out: dict[str, dict[str, torch.Tensor | None]] = {}
    for m, layer in layers.items():
        x = x0.clone().requires_grad_(True)
        y = layer(x)
        target = torch.randn(y.shape, generator=torch.Generator().manual_seed(2)).to(device)
        torch.nn.functional.mse_loss(y, target).backward()
        out[m] = {"y": y.detach(), "x_grad": x.grad, "expert_grad": layer.experts.weight.grad,
                  "gate_grad": getattr(layer.gate, "weight", torch.empty(0)).grad}
    a, s = out["all"], out[mode]
    # float32 sums of K = C·9 terms (outputs, input grads) and B·H·W terms (weight grads): |error| ≤ K·eps32·max
    eps = torch.finfo(torch.float32).eps
    k_out, k_w = kwargs["in_channels"] * 9, x0.shape[0] * grid[0] * grid[1]
    rel = {k: _rel(a[k], s[k]) for k in ("y", "x_grad", "expert_grad")}
    k_in = kwargs["num_experts"] * kwargs.get("out_per_expert", 1) * 9
    tol = {"y": k_out * eps, "x_grad": k_in * eps, "expert_grad": k_w * eps}
    gate_share = 1.0
    if a["gate_grad"] is not None and s["gate_grad"] is not None:
        scale = a["gate_grad"].abs().max().clamp_min(1e-30)
        gate_share = float(((a["gate_grad"] - s["gate_grad"]).abs() <= k_w * eps * scale).float().mean())
    passed = all(rel[k] <= tol[k] for k in rel) and gate_share >= SELECTED_GATE_SHARE
    layer = layers[mode]
    idx = layer.__dict__["_last_idx"]  # (1, E, H, W): the routing of that forward
    plan = layer.selected_plan(idx, x0.shape[0], layer.resolved_route_impl(x0) == "channels_last", None)
    return {"layer": name, "mode": mode, "kwargs": kwargs, "relative_difference": rel, "tolerance": tol,
            "gate_grad_share_within_tolerance": gate_share, "passed": passed,
            "used_experts": int(layer._used_experts(idx)[0].numel()), "selected_leaves": len(plan.leaves)}


def _path_network(mode: str, device: str, steps: int, reference: tuple[list[float], torch.nn.Module]
                  ) -> dict[str, Any]:
    """The SMoE-U-Net's ``steps`` Adam steps with every layer on ``mode`` against ``reference`` (on ``all``)."""
    def unet_on_path() -> torch.nn.Module:
        net = unet((8, 16, 32), True)
        for layer in smoe_layers(net):
            layer.expert_compute, layer.selected_overhead_macs = mode, 0.0
        return net

    all_losses, all_net = reference
    losses, net = _train(unet_on_path, device, steps)
    loss_rel = [abs(a - b) / abs(a) for a, b in zip(all_losses, losses, strict=True)]
    same = [float((a == b).all(0).float().mean()) for a, b in
            zip(_selected_sets(all_net), _selected_sets(net), strict=True)]
    print(f"{mode} unet: loss rel. diff step 1 {loss_rel[0]:.1e}, max {max(loss_rel):.1e}", flush=True)
    return {"network": "smoe_unet_8_16_32", "mode": mode, "loss_all": all_losses, "loss_mode": losses,
            "first_step_loss_relative_difference": loss_rel[0], "max_loss_relative_difference": max(loss_rel),
            "same_selected_set_share_per_layer": same,
            "passed": loss_rel[0] <= FORWARD_RTOL and min(same) >= SELECTED_GATE_SHARE}


def selected_check(device: str, steps: int) -> dict[str, Any]:
    """Every expert path (:func:`expert_paths`) against ``"all"`` on ``device``: layer outputs and gradients, then
    the SMoE-U-Net's ``steps`` Adam steps."""
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    modes = expert_paths()
    setup = device_record(device) | {"steps": steps, "tf32": False, "modes": list(modes)}
    layers = []
    for mode in modes:
        for name, kwargs in SELECTED_LAYERS.items():
            layers.append(_path_layer(name, kwargs, device, mode))
            print(f"{mode} layer {name}: {layers[-1]['relative_difference']}, passed {layers[-1]['passed']}",
                  flush=True)
    reference = _train(lambda: unet((8, 16, 32), True), device, steps)
    networks = [_path_network(mode, device, steps, reference) for mode in modes]
    return {"setup": setup, "layers": layers, "networks": networks,
            "passed": all(c["passed"] for c in layers + networks)}


def _selected_md(out: dict[str, Any]) -> list[str]:
    s = out["setup"]
    lines = [f"# SMoE layer: every expert path against expert_compute=\"all\" on {s.get('gpu', s['device'])}", ""]
    lines += [f"torch {s['torch']}; TF32 off. Layer rows: one forward + backward from the same weights and batch "
              "(batch 8 on 32×64, periodic longitude, a coherent gate over a two-continent land-sea prior); "
              "relative difference = max |all − path| / max |all|, "
              "tolerance K·eps32 (K: the summed terms). Gate gradient: share of elements within tolerance (an RC "
              f"flag at its quantile may flip), at least {SELECTED_GATE_SHARE}.", "",
              "| path | layer | used experts | leaves | output | input grad | expert grad | gate grad share | passed |",
              "|---|---|---:|---:|---:|---:|---:|---:|---|"]
    for c in out["layers"]:
        r = c["relative_difference"]
        lines.append(f"| {c['mode']} | {c['layer']} | {c['used_experts']} of {c['kwargs']['num_experts']} | "
                     f"{c['selected_leaves'] if c['mode'] == 'selected' else '–'} | {r['y']:.1e} | {r['x_grad']:.1e} | "
                     f"{r['expert_grad']:.1e} | {c['gate_grad_share_within_tolerance']:.4f} | "
                     f"{'yes' if c['passed'] else 'no'} |")
    lines.append("")
    for n in out["networks"]:
        lines.append(f"- `{n['mode']}`: SMoE-U-Net 8/16/32, {s['steps']} Adam steps from one seed: step-1 loss rel. "
                     f"diff {n['first_step_loss_relative_difference']:.1e} (≤ {FORWARD_RTOL:.0e}), max "
                     f"{n['max_loss_relative_difference']:.1e}, same expert sets at the end (min over layers) "
                     f"{min(n['same_selected_set_share_per_layer']):.1%}: {'passed' if n['passed'] else 'FAILED'}.")
    return lines


def resnet_maker(width: int, blocks: int, smoe: str | None) -> Callable[[], torch.nn.Module]:
    """A builder of the GCM configs' ResNet (34 → 2 channels) at ``width`` × ``blocks``, SMoE placed ``smoe``
    ("all", "last") with the land-sea gate prior, or dense (None)."""
    def build() -> torch.nn.Module:
        placement = SMoEPlacement.from_config({"placement": smoe, "experts_factor": 2, "gate_prior": "land_sea",
                                               "prior_strength": 1.0} if smoe else None)
        return WeatherBenchResNet(in_channels=34, out_channels=2, width=width, blocks=blocks, grid=GRID,
                                  smoe=placement, land_sea_prior=land_sea().long() if smoe else None)
    return build


GROUPS: dict[str, dict[str, Any]] = {
    "resnet": {"batch": 32, "in_channels": 34, "reference": "dense_16x3", "networks": {
        **{f"dense_{w}x3": resnet_maker(w, 3, None) for w in (8, 12, 16, 24, 32)},
        "dense_16x6": resnet_maker(16, 6, None),
        **{f"smoe_all_{w}x3": resnet_maker(w, 3, "all") for w in (8, 16)},
        **{f"smoe_last_{w}x3": resnet_maker(w, 3, "last") for w in (8, 16)}}},
    "unet": {"batch": 8, "in_channels": 8, "reference": "dense_8_16_32", "networks": {
        **{f"{'smoe' if smoe else 'dense'}_{'_'.join(map(str, w))}": partial(unet, w, smoe)
           for w, smoe in (((8, 16, 32), False), ((16, 32, 64), False), ((32, 64, 128), False),
                           ((8, 16, 32), True), ((16, 32, 64), True))}}},
}


class _Stepper:
    def __init__(self, make: Callable[[], torch.nn.Module], device: str, batch: int, in_channels: int) -> None:
        torch.manual_seed(0)
        self.device = device
        self.net = make().to(device)
        self.opt = torch.optim.Adam(self.net.parameters(), lr=1e-3)
        self.x = torch.randn(batch, in_channels, *GRID, device=device)
        self.y = torch.randn(batch, 2, *GRID, device=device)
        self.parameters = sum(p.numel() for p in self.net.parameters())

    def _sync(self) -> None:
        if self.device == "cuda":
            torch.cuda.synchronize()

    def step(self) -> None:
        self.opt.zero_grad(set_to_none=True)
        torch.nn.functional.mse_loss(self.net(self.x), self.y).backward()
        self.opt.step()

    def timed(self, steps: int) -> float:
        """Seconds per step of ``steps`` steps timed as one block (the device drained before and after)."""
        return block_seconds(self.step, steps, sync=self._sync)

    def peak_mib(self) -> float | None:
        if self.device != "cuda":
            return None
        self._sync()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        self.step()
        self._sync()
        return (torch.cuda.max_memory_allocated() - base) / 2**20


def step_costs(device: str, rounds: int, block: int, warmup: int) -> dict[str, Any]:
    groups = {}
    for group, spec in GROUPS.items():
        steppers = {k: _Stepper(m, device, spec["batch"], spec["in_channels"]) for k, m in spec["networks"].items()}
        for s in steppers.values():
            warm_up(s.step, warmup)
        times = interleave({k: partial(s.timed, block) for k, s in steppers.items()}, rounds)
        ref = spec["reference"]
        nets = {}
        for k, s in steppers.items():
            twin = k.replace("smoe_all_", "dense_").replace("smoe_last_", "dense_").replace("smoe_", "dense_")
            nets[k] = {"ms_per_step": times.median(k) * 1e3, "parameters": s.parameters,
                       "peak_mib": s.peak_mib(), "ratio_to_reference": times.ratio(k, ref),
                       "ratio_to_dense_twin": times.ratio(k, twin)}
            print(f"{group} {k}: {nets[k]['ms_per_step']:.2f} ms, ×{nets[k]['ratio_to_dense_twin']:.2f} twin",
                  flush=True)
        for k, v in nets.items():  # the dense network whose measured step time is closest
            if k.startswith("smoe"):
                dense = {d: w for d, w in nets.items() if d.startswith("dense")}
                v["equal_cost_dense"] = min(dense, key=lambda d: abs(dense[d]["ms_per_step"] - v["ms_per_step"]))
        groups[group] = {"batch": spec["batch"], "in_channels": spec["in_channels"], "reference": ref,
                         "networks": nets}
        del steppers
        if device == "cuda":
            torch.cuda.empty_cache()
    return {"setup": device_record(device) | {"rounds": rounds, "block": block, "warmup": warmup, "grid": list(GRID)},
            "groups": groups}


def profile_layer(device: str, steps: int = 10) -> str:
    """Profiler tables (top kernels by device time) of the benchmark SMoE layer (C = 128, |E| = 256, E = 128,
    batch 64, fp32, RC + damping) and the dense 256-filter conv, both routing paths, ``steps`` warm steps each:
    where the layer's time goes against the dense conv's, kernels against host-side launches."""
    from torch.profiler import ProfilerActivity, profile

    from smoeweather.nn import PeriodicLonConv2d, SpatialMoE2d

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    sort = "cuda_time_total" if device == "cuda" else "cpu_time_total"
    parts = []
    for impl in ("channels_last", "index_select"):
        torch.manual_seed(0)
        layout = torch.channels_last if impl == "channels_last" else torch.contiguous_format
        layers = {"smoe": (SpatialMoE2d(128, 256, 128, grid=GRID, padding="periodic_lon", rc=True, damping=0.1,
                                        route_impl=impl), 128),
                  "dense256": (PeriodicLonConv2d(128, 256, 3, bias=False), 256)}
        x = torch.randn(64, 128, *GRID, device=device).contiguous(memory_format=layout)
        for name, (layer, channels) in layers.items():
            layer = layer.to(device, memory_format=layout)
            opt = torch.optim.SGD(layer.parameters(), lr=1e-2)
            target = torch.randn(64, channels, *GRID, device=device).contiguous(memory_format=layout)

            def step(layer: torch.nn.Module = layer, opt: torch.optim.Optimizer = opt,
                     target: torch.Tensor = target, x: torch.Tensor = x) -> None:
                opt.zero_grad(set_to_none=True)
                torch.nn.functional.mse_loss(layer(x), target).backward()
                opt.step()

            for _ in range(5):
                step()
            if device == "cuda":
                torch.cuda.synchronize()
            with profile(activities=activities) as prof:
                for _ in range(steps):
                    step()
                if device == "cuda":
                    torch.cuda.synchronize()
            parts.append(f"=== {impl} {name} ({steps} steps, batch 64 fp32)\n"
                         + prof.key_averages().table(sort_by=sort, row_limit=14, max_name_column_width=60))
    return "\n".join(parts)


def _correctness_md(out: dict[str, Any]) -> list[str]:
    s, checks = out["setup"], verdicts(out["entries"])
    lines = [f"# SMoE networks: {s['device']} against CPU, {s['steps']} Adam steps, one seed", "",
             f"{s.get('gpu', s['device'])}, torch {s['torch']}; TF32 off; batch {s['batch']} on {s['grid']}. "
             f"CPU convolves only the selected experts, {s['device']} every expert. An SMoE network passes when "
             f"its first-step loss agrees within {FORWARD_RTOL:.0e} (float32 summation order) and its largest "
             f"loss difference over the steps is at most {TWIN_FACTOR:g}× its dense twin's (derivation in "
             "`benchmarks/gpu_check.py`).", ""]
    if s.get("dropout", 0.1) != 0.0:
        lines += ["**This run kept the ResNet's dropout (p = 0.1)**: each device drew its own masks, so the "
                  "ResNets (dense twin included) differ from the first step on, and their rows say nothing about "
                  "the code. The U-Nets have no dropout.", ""]
    lines += ["| network | step-1 loss rel. diff | max loss rel. diff | × dense twin | max / median param rel. "
              "diff | same expert sets (min over layers) | passed |", "|---|---:|---:|---:|---:|---:|---|"]
    for e in out["entries"]:
        same, check = e.get("same_selected_set_share_per_layer"), checks.get(e["network"])
        median = e.get("median_parameter_relative_difference")
        drift = f"{check['drift_to_twin']:.2f}" if check else "–"
        lines.append(f"| {e['network']} | {e['first_step_loss_relative_difference']:.1e} | "
                     f"{e['max_loss_relative_difference']:.1e} | {drift} | "
                     f"{e['max_parameter_relative_difference']:.1e} / {f'{median:.1e}' if median is not None else '–'} "
                     f"| {f'{min(same):.1%}' if same else '–'} | "
                     f"{('yes' if check['passed'] else 'no') if check else '–'} |")
    return lines


def _step_md(out: dict[str, Any]) -> list[str]:
    s = out["setup"]
    lines = [f"# Training-step cost on {s.get('gpu', s['device'])}: SMoE against dense networks", "",
             f"torch {s['torch']}; forward + MSE + backward + Adam, random inputs on the 32×64 grid; blocks of "
             f"{s['block']} steps interleaved over {s['rounds']} rounds (median). \"Equal-cost dense\": the dense "
             "network whose measured step time is closest.", ""]
    for group, g in out["groups"].items():
        lines += [f"## {group} (batch {g['batch']}, {g['in_channels']} input channels)", "",
                  f"| network | parameters | ms / step | × {g['reference']} | × dense twin | peak MiB | "
                  "equal-cost dense |", "|---|---:|---:|---:|---:|---:|---|"]
        for k, v in g["networks"].items():
            peak = f"{v['peak_mib']:.0f}" if v["peak_mib"] is not None else "–"
            lines.append(f"| {k} | {v['parameters']:,} | {v['ms_per_step']:.2f} | {v['ratio_to_reference']:.2f} | "
                         f"{v['ratio_to_dense_twin']:.2f} | {peak} | {v.get('equal_cost_dense', '')} |")
        lines.append("")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("part", choices=["correctness", "selected", "step", "profile", "render"],
                        help="render: rewrite the .md of a result .json (--json) fetched from the device")
    parser.add_argument("--json", type=Path, help="render: the gpu_correctness_*.json or gpu_step_*.json")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--steps", type=int, default=20, help="correctness: Adam steps per network")
    parser.add_argument("--rounds", type=int, default=5, help="step: interleaved rounds")
    parser.add_argument("--block", type=int, default=10, help="step: steps per timed block")
    parser.add_argument("--warmup", type=int, default=5, help="step: untimed steps per network")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    if args.part != "render" and args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: torch sees no CUDA device on this machine")
    if args.part == "render":
        if args.json is None:
            parser.error("render needs --json FILE (a gpu_correctness_*.json or gpu_step_*.json)")
        out = json.loads(args.json.read_text())
        md = _correctness_md if "entries" in out else _selected_md if "layers" in out else _step_md
        write_results(args.json, None, md(out))
        print(f"wrote {args.json.with_suffix('.md')}")
        return
    if args.part == "profile":
        path = write_report(args.out / f"gpu_profile_{args.device}.txt", profile_layer(args.device) + "\n")
        print(f"wrote {path}")
        return
    machine = Machine()
    if args.part == "correctness":
        out, md = correctness(args.device, args.steps), _correctness_md
    elif args.part == "selected":
        out, md = selected_check(args.device, args.steps), _selected_md
    else:
        out, md = step_costs(args.device, args.rounds, args.block, args.warmup), _step_md
    stem = f"gpu_{args.part}_{args.device}"
    write_results(args.out / stem, out, md(out), machine=machine)
    print(f"wrote {args.out / stem}.json and .md")


if __name__ == "__main__":
    main()
