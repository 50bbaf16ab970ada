"""Models of the location-dependent heat-diffusion benchmark (paper §3.1, Fig. 3, Tables 1 and 2).

Every model maps frame t (B, 1, S, S) → frame t+1 (B, 1, S, S). :func:`build_heat_model` builds one row
of the benchmark by name; keyword overrides go to that row's constructor (e.g. ``layers=1`` for the
conv baselines, ``quantile=0.3`` or ``damping=0.0`` for the SMoE rows).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import torch
from torch import nn

from smoeweather.models import registry
from smoeweather.models.registry import register_model
from smoeweather.nn.baselines import CondConv2d, FullyConnected2d, LowRankLocallyConnected2d
from smoeweather.nn.gates import CoordConv2d, LocallyConnected2d, build_gate
from smoeweather.nn.smoe import SpatialMoE2d
from smoeweather.nn.vit import ViT, VMoE


class SumChannels(nn.Module):
    """(B, C, H, W) → (B, 1, H, W): sum of the channels (SMoE with E·F > 1 outputs, paper §3.1 case 3)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.sum(dim=1, keepdim=True)


def reference_init(model: nn.Module) -> nn.Module:
    """The reference code's ``--initialization default`` on ``model`` (in place; returns it).

    Every Conv2d / Linear weight gets Kaiming-uniform with the ReLU gain (bound sqrt(6 / fan_in)) except
    the LAST one (in module order), which gets the linear gain (bound sqrt(3 / fan_in)) — the reference
    names its output layer ``*_end``; biases are zeroed. For the one-layer SMoE the experts are that last
    layer (linear gain); the tensor-routing gate is not a Conv2d and keeps its own init.
    """
    layers = [m for m in model.modules() if isinstance(m, (nn.Conv2d, nn.Linear))]
    for i, layer in enumerate(layers):
        nn.init.kaiming_uniform_(layer.weight, nonlinearity="linear" if i == len(layers) - 1 else "relu")
        if layer.bias is not None:
            nn.init.zeros_(layer.bias)
    return model


def count_parameters(model: nn.Module, trainable_only: bool = False) -> int:
    """Number of parameter elements (shared tensors counted once); ``trainable_only``: requiring grad."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad or not trainable_only)


def _smoe(size: int, gate_kind: str = "tensor", *, num_experts: int = 3, num_selected: int = 1,
          out_per_expert: int = 1, rc: bool = True, damping: float | None = 0.1, quantile: float = 0.3,
          **kwargs: Any) -> nn.Module:
    """One SMoE layer, 3×3 experts, zero padding, unweighted, no bias (overridable via ``kwargs``)."""
    gate = build_gate(gate_kind, 1, num_experts, size, size, num_selected, out_per_expert)
    kwargs = {"kernel_size": 3, "padding": "zeros", "weighted": False, "bias": False, "expert_init": "reference",
              **kwargs}
    layer = SpatialMoE2d(1, num_experts, num_selected, gate=gate, out_per_expert=out_per_expert, rc=rc,
                         damping=damping, quantile=quantile, **kwargs)
    return layer if layer.out_channels == 1 else nn.Sequential(layer, SumChannels())


def _stack(make: Callable[[int, int, bool], nn.Module], layers: int, hidden: int) -> nn.Module:
    """``layers`` layers made by ``make(in, out, bias)``: 1 → hidden → … → 1, BatchNorm + ReLU after all
    but the last (those get no bias, BatchNorm has one). ``layers=1`` is a single 1 → 1 layer."""
    if layers < 1:
        raise ValueError(f"layers must be >= 1, got {layers}")
    channels = [1] + [hidden] * (layers - 1) + [1]
    modules: list[nn.Module] = []
    for i, (c_in, c_out) in enumerate(zip(channels[:-1], channels[1:])):
        last = i == layers - 1
        modules.append(make(c_in, c_out, last))
        if not last:
            modules += [nn.BatchNorm2d(c_out), nn.ReLU()]
    return nn.Sequential(*modules)


def _conv(size: int, *, layers: int = 3, hidden: int = 12, kernel_size: int = 3) -> nn.Module:
    def make(i: int, o: int, b: bool) -> nn.Module:
        return nn.Conv2d(i, o, kernel_size, padding=kernel_size // 2, bias=b)

    return _stack(make, layers, hidden)


def _coordconv(size: int, *, layers: int = 3, hidden: int = 12, kernel_size: int = 3) -> nn.Module:
    return _stack(lambda i, o, b: CoordConv2d(i, o, kernel_size, bias=b), layers, hidden)


def _condconv(size: int, *, layers: int = 3, hidden: int = 12, kernel_size: int = 3,
              num_experts: int = 3) -> nn.Module:
    return _stack(lambda i, o, b: CondConv2d(i, o, kernel_size, num_experts, bias=b), layers, hidden)


def _lrlcn(size: int, *, layers: int = 3, hidden: int = 12, kernel_size: int = 3, rank: int = 3,
           input_dependent: bool = True) -> nn.Module:
    def make(i: int, o: int, b: bool) -> nn.Module:
        return LowRankLocallyConnected2d(i, o, size, size, kernel_size, rank, input_dependent, bias=b)

    return _stack(make, layers, hidden)


def _lrlcn_nd(size: int, *, kernel_size: int = 3, rank: int = 3, bias: bool = False) -> nn.Module:
    return LowRankLocallyConnected2d(1, 1, size, size, kernel_size, rank, input_dependent=False, bias=bias)


def _lcn(size: int, *, kernel_size: int = 3, bias: bool = False) -> nn.Module:
    return LocallyConnected2d(1, 1, size, size, kernel_size, bias=bias)


def _fc(size: int, *, bias: bool = True) -> nn.Module:
    return FullyConnected2d(1, 1, size, size, bias=bias)


def _vit(size: int, **kwargs: Any) -> nn.Module:
    kwargs = {"patch": 4, "dim": 128, "depth": 1, "heads": 4, **kwargs}
    return ViT(1, 1, (size, size), **kwargs)


def _vmoe(size: int, **kwargs: Any) -> nn.Module:
    kwargs = {"patch": 4, "dim": 128, "depth": 1, "heads": 4, "num_experts": 3, "k": 1, **kwargs}
    return VMoE(1, 1, (size, size), **kwargs)


def _register(name: str, row: Callable[..., nn.Module], doc: str) -> None:
    """Register the benchmark row ``name``: ``row(size, **overrides)`` builds it for an S×S grid."""

    def build(cfg: dict[str, Any], size: int = 64) -> nn.Module:
        return row(size, **cfg)

    build.__doc__ = doc
    register_model("heat", name, arguments=lambda cfg: [(row, cfg, "")], tiny={})(build)


_ROWS: tuple[tuple[str, Callable[..., nn.Module], str], ...] = (
    ("smoe", _smoe, "SMoE with RC loss and expert error damping (paper §3.1)"),
    ("smoe_no_rc_no_damping", partial(_smoe, rc=False, damping=None), "SMoE without RC loss or damping"),
    ("smoe_rc_only", partial(_smoe, rc=True, damping=None), "SMoE with the RC loss only"),
    ("smoe_damping_only", partial(_smoe, rc=False, damping=0.1), "SMoE with expert error damping only"),
    # the paper text's reading of q (flag only the 30 % largest errors); see smoeweather/nn/smoe.py
    ("smoe_q07", partial(_smoe, quantile=0.7), "SMoE with RC quantile q = 0.7"),
    *((f"gate_{k}", partial(_smoe, gate_kind=k), f"SMoE with a {k} gate (Table 2)")
      for k in ("fc", "conv", "coordconv", "lcn", "coordconv3")),
    ("conv", _conv, "3×3 conv stack"),
    ("coordconv", _coordconv, "CoordConv stack"),
    ("condconv", _condconv, "CondConv stack"),
    ("lrlcn", _lrlcn, "low-rank locally connected stack (input-dependent)"),
    ("lrlcn_nd", _lrlcn_nd, "low-rank locally connected layer (input-independent)"),
    ("lcn", _lcn, "locally connected layer"),
    ("fc", _fc, "fully connected layer"),
    ("vit", _vit, "ViT, one block"),
    ("vmoe", _vmoe, "V-MoE, one block"),
)
for _name, _row, _doc in _ROWS:
    _register(_name, _row, _doc)


def build_heat_model(name: str, size: int = 64, init: str = "torch", **overrides: Any) -> nn.Module:
    """The heat-diffusion benchmark model ``name`` (registered for task ``heat``) for an S×S grid, S=``size``.

    Returns a module mapping (B, 1, S, S) → (B, 1, S, S). ``overrides`` are keyword arguments of that
    model's constructor (unknown ones raise TypeError). Defaults follow paper §3.1: SMoE rows are one
    SpatialMoE2d with |E|=3, E=1, 3×3 experts without bias, unweighted, q=0.3, and the row's RC/damping
    setting and gate; conv/coordconv/condconv/lrlcn have ``layers`` (default 3) 3×3 layers with
    ``hidden``=12 filters, BatchNorm and ReLU; vit/vmoe have one block, patch 4, dim 128, 4 heads.
    ``init``: ``torch`` (each module's own init) or ``reference`` (:func:`reference_init`, the reference
    code's heat runs: linear gain on the last layer, i.e. on the SMoE experts).
    """
    if init not in ("torch", "reference"):
        raise ValueError(f"init must be 'torch' or 'reference', got {init!r}")
    model = registry.build("heat", {**overrides, "name": name}, size=size)
    return reference_init(model) if init == "reference" else model
