"""The Rasp & Thuerey WeatherBench ResNet and its SMoE variants (paper §3.2), as plain nn.Modules.

Shapes: input (B, C_in, H=lat, W=lon) in normalised units, output (B, C_out, H, W). Every convolution is
periodic in longitude and zero-padded in latitude. :class:`NormalizedModel` wraps a network so that it
maps physical units to physical units and carries its normalisation statistics in the state_dict.

Continuous lead time (Rasp & Thuerey): the lead time τ/100 h is just one extra input channel built by
the data pipeline; nothing in the model changes (count it in ``in_channels``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Literal

import torch
from torch import nn

from smoeweather.models.registry import parameters, register_model
from smoeweather.nn import PeriodicLonConv2d, SpatialMoE2d, TensorRoutingGate, pad_periodic_lon

Placement = Literal["none", "first", "last", "all"]
ConvKind = Literal["conv", "lrlcn"]


@dataclass
class SMoEPlacement:
    """Where and how the ResNet uses Spatial Mixture-of-Experts layers (paper §3.2, Table 3).

    placement: ``none``; ``first``: one SMoE block after the stem ("SMoE after first layer"); ``last``:
        one SMoE block after the last residual block, before the head ("last layer SMoE"); ``all``: every
        3×3 conv of the residual blocks becomes an SMoE ("3×3 convs → SMoE").
    experts_factor: |E| = experts_factor × filters; E = filters, so the width is unchanged (paper: 2).
    gate_prior: ``land_sea`` initialises every gate from a land-sea map (sea → first half of the
        experts, land → second half), see :meth:`TensorRoutingGate.init_from_prior`.
    prior_strength: strength of that prior (≥ 1: the group outranks all other experts at init).
    gate_init: ``uniform`` (paper: U(−b, b) per expert and location) or ``coherent`` (one score per
        expert shared by all locations: the same expert rank order, hence the same meaning of every output
        plane, everywhere within a prior category), see :class:`TensorRoutingGate`.
    share_gate: one gate for all SMoE layers with the same |E| (paper §3.2) or one gate per layer.
    upcycle: start every SMoE layer as the dense conv it replaces (sparse upcycling, Komatsuzaki et al.
        2023): with a categorical prior of K categories, the K expert groups get identical weights and
        identical routing scores, so output plane j is the same filter in every category and the network
        computes exactly what a dense ResNet with those filters computes; training then lets the groups
        diverge only where the data asks. Needs ``gate_init="coherent"`` and ``gate_prior="land_sea"``.
    random_fixed_gate: frozen random gate (ablation "rand fixed gate init").
    rc, damping, quantile: routing-classification loss, expert error damping factor, quantile q.
    layer_kwargs: further keyword arguments for :class:`SpatialMoE2d` (e.g. ``weighted``, ``noise``).
    """

    placement: Placement = "all"
    experts_factor: int = 2
    gate_prior: Literal["none", "land_sea"] = "none"
    prior_strength: float = 1.0
    gate_init: Literal["uniform", "coherent"] = "uniform"
    share_gate: bool = True
    upcycle: bool = False
    random_fixed_gate: bool = False
    rc: bool = True
    damping: float | None = 0.1
    quantile: float = 0.3
    layer_kwargs: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.placement not in ("none", "first", "last", "all"):
            raise ValueError(f"placement must be none, first, last or all, got {self.placement!r}")
        if self.gate_prior not in ("none", "land_sea"):
            raise ValueError(f"gate_prior must be 'none' or 'land_sea', got {self.gate_prior!r}")
        if self.gate_init not in ("uniform", "coherent"):
            raise ValueError(f"gate_init must be 'uniform' or 'coherent', got {self.gate_init!r}")
        for name in ("share_gate", "upcycle", "random_fixed_gate", "rc"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"smoe.{name} must be true or false, got {getattr(self, name)!r}")
        if self.upcycle and (self.gate_init != "coherent" or self.gate_prior != "land_sea"):
            raise ValueError("smoe.upcycle needs gate_init='coherent' and gate_prior='land_sea'")
        if self.experts_factor < 1:
            raise ValueError(f"experts_factor must be >= 1, got {self.experts_factor}")

    @classmethod
    def from_config(cls, cfg: SMoEPlacement | dict[str, Any] | str | None) -> SMoEPlacement:
        """Build from a dataclass, a dict (unknown keys are an error), a placement name, or None (= none)."""
        if cfg is None:
            return cls(placement="none")
        if isinstance(cfg, SMoEPlacement):
            return cfg
        if isinstance(cfg, str):
            return cls(placement=cfg)  # type: ignore[arg-type]
        known = {f.name for f in fields(cls)}
        unknown = set(cfg) - known
        if unknown:
            raise ValueError(f"unknown SMoE config keys {sorted(unknown)}; expected some of {sorted(known)}")
        return cls(**cfg)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def check_prior(self, land_sea_prior: torch.Tensor | None) -> None:
        """ValueError when ``land_sea_prior`` is given without ``gate_prior='land_sea'``, or is missing where
        that prior initialises SMoE layers."""
        if land_sea_prior is not None and self.gate_prior != "land_sea":
            raise ValueError("land_sea_prior given but smoe.gate_prior is not 'land_sea'")
        if self.gate_prior == "land_sea" and self.placement != "none" and land_sea_prior is None:
            raise ValueError("smoe.gate_prior='land_sea' needs land_sea_prior, an (H, W) land-sea map")


def land_sea_categories(land_sea_prior: torch.Tensor | Any) -> torch.Tensor:
    """(H, W) prior categories of the gates: a floating land-sea map is land (1) above 0.5, sea (0) elsewhere;
    an integer map is taken as it is."""
    prior = torch.as_tensor(land_sea_prior)
    return (prior > 0.5).long() if prior.is_floating_point() else prior.long()


class ConvBlock(nn.Module):
    """``layer`` → LeakyReLU(0.3) → BatchNorm → Dropout: (B, C_in, H, W) → (B, width, H, W)."""

    def __init__(self, layer: nn.Module, width: int, dropout: float) -> None:
        super().__init__()
        self.layer = layer
        self.act = nn.LeakyReLU(0.3)
        self.norm = nn.BatchNorm2d(width)
        self.drop = nn.Dropout(dropout) if dropout > 0 else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.norm(self.act(self.layer(x))))


class ResBlock(nn.Module):
    """Two :class:`ConvBlock` with an identity skip: (B, width, H, W) → (B, width, H, W)."""

    def __init__(self, block1: ConvBlock, block2: ConvBlock) -> None:
        super().__init__()
        self.block1, self.block2 = block1, block2

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.block2(self.block1(x))


class PeriodicLonLRLCN(nn.Module):
    """:class:`~smoeweather.nn.baselines.LowRankLocallyConnected2d` with periodic-longitude padding.

    Holds the LRLCN (its parameters, state_dict keys ``lrlcn.*``) and runs its computation on a
    longitude-periodically padded input (its own convs then use no padding).
    (B, C_in, H, W) → (B, C_out, H, W).
    """

    def __init__(self, in_channels: int, out_channels: int, grid: tuple[int, int], rank: int = 3,
                 kernel_size: int = 3) -> None:
        super().__init__()
        from smoeweather.nn.baselines import LowRankLocallyConnected2d

        self.lrlcn = LowRankLocallyConnected2d(in_channels, out_channels, *grid, kernel_size=kernel_size,
                                               rank=rank)
        self.pad = kernel_size // 2
        for conv in (self.lrlcn.basis, self.lrlcn.combiner):
            if conv is not None:
                conv.padding = (0, 0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        m = self.lrlcn
        b, _, h, w = x.shape
        if (h, w) != (m.height, m.width):
            raise ValueError(f"LRLCN is for a {m.height}x{m.width} grid, got input {tuple(x.shape)}")
        xp = pad_periodic_lon(x, self.pad)
        basis = m.basis(xp).view(b, m.rank, m.out_channels, h, w)
        logits = m.location_logits.unsqueeze(0)
        if m.combiner is not None:
            logits = logits + m.combiner(xp)
        y = (basis * logits.softmax(dim=1).unsqueeze(2)).sum(dim=1)
        return y if m.bias is None else y + m.bias.view(1, -1, 1, 1)


def build_layers(net: nn.Module, in_channels: int, out_channels: int, width: int, blocks: int, dropout: float,
                 placement: Placement, smoe: Callable[[int], nn.Module], conv3: Callable[[int], nn.Module]) -> None:
    """Give ``net`` the layers of the WeatherBench ResNet family, created in this order (the same seed, the same
    weights): ``stem`` (7×7 conv), ``first_smoe`` (``smoe(width)`` with placement ``first``, else None),
    ``blocks`` (``blocks`` residual blocks of two 3×3 layers: ``smoe(width)`` with placement ``all``, else
    ``conv3(width)``), ``last_smoe`` (with placement ``last``, else None) and the 3×3 ``head``."""
    net.stem = ConvBlock(PeriodicLonConv2d(in_channels, width, 7), width, dropout)
    net.first_smoe = ConvBlock(smoe(width), width, dropout) if placement == "first" else None
    res = []
    for _ in range(blocks):
        layers = [smoe(width) if placement == "all" else conv3(width) for _ in range(2)]
        res.append(ResBlock(*(ConvBlock(layer, width, dropout) for layer in layers)))
    net.blocks = nn.Sequential(*res)
    net.last_smoe = ConvBlock(smoe(width), width, dropout) if placement == "last" else None
    net.head = PeriodicLonConv2d(width, out_channels, 3)


class WeatherBenchResNet(nn.Module):
    """Rasp & Thuerey (2021) ResNet with optional SMoE layers (paper §3.2).

    7×7 stem conv (``width``) → LeakyReLU(0.3) → BN → Dropout, ``blocks`` residual blocks of two
    [3×3 conv → LeakyReLU(0.3) → BN → Dropout] with identity add, 3×3 head conv to ``out_channels``.
    Convs have biases (as in the Keras original); SMoE experts have none (a BatchNorm follows).

    Args:
        in_channels, out_channels: C_in, C_out (paper: 117 inputs; 2 outputs, Z500 and T850).
        width: filters of every conv but the head (paper 128; the "2× wide" baseline is 256).
        blocks: residual blocks (paper 19).
        dropout: dropout probability (paper 0.1).
        smoe: :class:`SMoEPlacement`, a dict for it, a placement name, or None (dense).
        grid: (H, W) = (lat, lon); needed for the tensor-routing gates and LRLCN layers.
        land_sea_prior: (H, W) land-sea map (1/True = land; fractions are thresholded at 0.5), used when
            ``smoe.gate_prior == "land_sea"``.
        conv: ``conv`` or ``lrlcn`` (the 3×3 convs of the residual blocks become low-rank locally
            connected layers, Elsayed et al. 2020, periodic in longitude: :class:`PeriodicLonLRLCN`).
        lrlcn_rank: number of basis filters of the LRLCN layers.
        location_embedding: k > 0 adds k learned input channels, one value per grid point and channel
            (``self.location_embedding``, (k, H, W), zero at init, so the network starts as the plain one
            apart from the stem's extra input weights): the dense net's own per-location information, the
            headroom arm of the routing study. 0 (default) = none.

    Gates: one :class:`TensorRoutingGate` per (|E|, H, W), shared by all SMoE layers with that size (paper),
    or one per layer with ``smoe.share_gate=false``; listed in ``self.gates`` (a ModuleDict keyed
    ``E{|E|}_H{H}_W{W}``, plus ``_L{n}`` per layer when not shared).
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        width: int = 128,
        blocks: int = 19,
        dropout: float = 0.1,
        smoe: SMoEPlacement | dict[str, Any] | str | None = None,
        grid: tuple[int, int] = (32, 64),
        land_sea_prior: torch.Tensor | None = None,
        conv: ConvKind = "conv",
        lrlcn_rank: int = 3,
        location_embedding: int = 0,
    ) -> None:
        super().__init__()
        self.smoe_config = SMoEPlacement.from_config(smoe)
        self.grid = (int(grid[0]), int(grid[1]))
        self.in_channels, self.out_channels, self.width = in_channels, out_channels, width
        if conv not in ("conv", "lrlcn"):
            raise ValueError(f"conv must be 'conv' or 'lrlcn', got {conv!r}")
        if conv == "lrlcn" and self.smoe_config.placement == "all":
            raise ValueError("conv='lrlcn' replaces the same 3x3 convs as placement='all'; pick one")
        cfg = self.smoe_config
        cfg.check_prior(land_sea_prior)
        self.gates = nn.ModuleDict()
        self._conv_kind, self._lrlcn_rank = conv, lrlcn_rank

        if location_embedding < 0:
            raise ValueError(f"location_embedding must be >= 0 channels, got {location_embedding}")
        self.location_embedding = (nn.Parameter(torch.zeros(location_embedding, *self.grid))
                                   if location_embedding else None)
        build_layers(self, in_channels + location_embedding, out_channels, width, blocks, dropout, cfg.placement,
                     self._smoe, self._conv3)

        if cfg.gate_prior == "land_sea" and land_sea_prior is not None:
            categories = land_sea_categories(land_sea_prior)
            if cfg.upcycle:
                self._upcycle(num_groups=int(categories.max()) + 1)
            for gate in self.gates.values():
                gate.init_from_prior(categories, cfg.prior_strength)

    @torch.no_grad()
    def _upcycle(self, num_groups: int) -> None:
        """Make the ``num_groups`` contiguous expert groups of every gate and SMoE layer copies of group 0
        (scores and weights), before the prior offsets are added (see ``SMoEPlacement.upcycle``)."""
        for gate in self.gates.values():
            n = gate.num_experts
            if n % num_groups:
                raise ValueError(f"smoe.upcycle needs |E| = {n} divisible by the {num_groups} prior categories")
            size = n // num_groups
            gate.weight.copy_(gate.weight[:size].repeat(num_groups, 1, 1))
        for module in self.modules():
            if isinstance(module, SpatialMoE2d):
                weight = module.experts.weight  # (|E|·F, C, k, k), expert-major
                size = weight.shape[0] // num_groups
                weight.copy_(weight[:size].repeat(num_groups, 1, 1, 1))
                if module.experts.bias is not None:
                    module.experts.bias.copy_(module.experts.bias[:size].repeat(num_groups))

    def _conv3(self, width: int) -> nn.Module:
        if self._conv_kind == "lrlcn":
            return PeriodicLonLRLCN(width, width, self.grid, rank=self._lrlcn_rank)
        return PeriodicLonConv2d(width, width, 3)

    def _gate(self, num_experts: int, num_selected: int) -> TensorRoutingGate:
        key = f"E{num_experts}_H{self.grid[0]}_W{self.grid[1]}"
        if not self.smoe_config.share_gate:
            key = f"{key}_L{len(self.gates)}"
        if key not in self.gates:
            self.gates[key] = TensorRoutingGate(num_experts, *self.grid, num_selected=num_selected,
                                                frozen=self.smoe_config.random_fixed_gate,
                                                init=self.smoe_config.gate_init)
        return self.gates[key]  # type: ignore[return-value]

    def _smoe(self, width: int) -> SpatialMoE2d:
        cfg = self.smoe_config
        num_experts = cfg.experts_factor * width
        return SpatialMoE2d(width, num_experts, width, gate=self._gate(num_experts, width), kernel_size=3,
                            padding="periodic_lon", rc=cfg.rc, damping=cfg.damping, quantile=cfg.quantile,
                            **cfg.layer_kwargs)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(B, C_in, H, W) normalised inputs → (B, C_out, H, W) normalised outputs."""
        if self.location_embedding is not None:
            if x.shape[-2:] != self.location_embedding.shape[-2:]:
                raise ValueError(f"location_embedding is for the grid {tuple(self.location_embedding.shape[-2:])}, "
                                 f"got input {tuple(x.shape)}")
            embedding = self.location_embedding.to(x.dtype).unsqueeze(0).expand(x.shape[0], -1, -1, -1)
            x = torch.cat([x, embedding], dim=1)
        x = self.stem(x)
        if self.first_smoe is not None:
            x = self.first_smoe(x)
        x = self.blocks(x)
        if self.last_smoe is not None:
            x = self.last_smoe(x)
        return self.head(x)


def dense_resnet_param_count(in_channels: int, out_channels: int, width: int, blocks: int) -> int:
    """Closed-form parameter count of the dense :class:`WeatherBenchResNet` (convs with bias, BN affine)."""
    stem = in_channels * width * 49 + width + 2 * width
    block = 2 * (width * width * 9 + width + 2 * width)
    head = width * out_channels * 9 + out_channels
    return stem + blocks * block + head


def _channel_stats(values: torch.Tensor | Any, name: str) -> torch.Tensor:
    t = torch.as_tensor(values, dtype=torch.float32)
    if t.dim() == 1:
        t = t.view(-1, 1, 1)
    if t.dim() != 3 or t.shape[1:] != (1, 1):
        raise ValueError(f"{name} must have shape (C,) or (C, 1, 1), got {tuple(t.shape)}")
    return t.clone()


class NormalizedModel(nn.Module):
    """Physical units in, physical units out: y = net((x − μ_in)/σ_in) · σ_out + μ_out.

    The statistics are buffers of shape (C, 1, 1), so they travel with the state_dict / checkpoint.
    ``x``: (B, C_in, H, W) physical units → (B, C_out, H, W) physical units. Standard deviations must be
    positive (drop or re-scale constant channels before building the model).
    """

    def __init__(self, net: nn.Module, input_mean: torch.Tensor, input_std: torch.Tensor,
                 target_mean: torch.Tensor, target_std: torch.Tensor) -> None:
        super().__init__()
        self.net = net
        stats = {"input_mean": input_mean, "input_std": input_std,
                 "target_mean": target_mean, "target_std": target_std}
        for name, value in stats.items():
            t = _channel_stats(value, name)
            if name.endswith("std") and not bool((t > 0).all()):
                raise ValueError(f"{name} must be positive everywhere")
            self.register_buffer(name, t)
        if self.input_mean.shape != self.input_std.shape or self.target_mean.shape != self.target_std.shape:
            raise ValueError("mean and std must have the same number of channels")

    def normalize_input(self, x: torch.Tensor) -> torch.Tensor:
        return (x - self.input_mean) / self.input_std

    def denormalize_output(self, y: torch.Tensor) -> torch.Tensor:
        return y * self.target_std + self.target_mean

    def normalize_target(self, y: torch.Tensor) -> torch.Tensor:
        """Physical targets → the network's normalised output space (for a loss in normalised units)."""
        return (y - self.target_mean) / self.target_std

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.denormalize_output(self.net(self.normalize_input(x)))


def resnet_arguments(cfg: dict[str, Any]) -> list[tuple[Any, Any, str]]:
    """What a ResNet ``model`` block's keys go to (:class:`~smoeweather.models.registry.ModelEntry`): the
    ResNet, its ``smoe`` block (:class:`SMoEPlacement`) and that block's ``layer_kwargs`` (the SMoE layer)."""
    out: list[tuple[Any, Any, str]] = [(WeatherBenchResNet, cfg, "")]
    smoe = cfg.get("smoe")
    if isinstance(smoe, dict):
        out += [(SMoEPlacement, smoe, ".smoe"), (SpatialMoE2d, smoe.get("layer_kwargs"), ".smoe.layer_kwargs")]
    return out


TINY_RESNET = {"in_channels": 5, "out_channels": 2, "width": 8, "blocks": 2, "grid": [16, 32]}
"""A tiny ResNet block (16 × 32 grid) for tests and examples."""


@register_model("weather", "resnet", keys=parameters(WeatherBenchResNet), arguments=resnet_arguments,
                tiny={**TINY_RESNET, "smoe": {"placement": "all", "gate_prior": "land_sea"}})
def _resnet(cfg: dict[str, Any], land_sea_prior: torch.Tensor | None = None) -> nn.Module:
    """WeatherBench ResNet (Rasp & Thuerey 2021), dense or with Spatial-MoE layers placed by ``smoe``."""
    smoe = SMoEPlacement.from_config(cfg.pop("smoe", None))
    if "grid" in cfg:
        cfg["grid"] = tuple(cfg["grid"])
    use_prior = smoe.gate_prior == "land_sea" and smoe.placement != "none"
    return WeatherBenchResNet(smoe=smoe, land_sea_prior=land_sea_prior if use_prior else None, **cfg)
