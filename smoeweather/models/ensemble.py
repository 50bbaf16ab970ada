"""Ensemble forecast networks of the WeatherBench ResNet family, selected by ``model.name``.

* ``e3``: :class:`E3ResNet`, E³ (Allingham et al. 2022, "Sparse MoEs meet Efficient Ensembles") on the
  Spatial-MoE ResNet: the experts of every SMoE layer are split into M disjoint groups, the batch is tiled M
  times (member-major) at the first SMoE layer, and copy m routes only within group m, with its own tensor
  gate (the land-sea prior applies within each group). Every non-expert parameter (stem, BatchNorms, head,
  the dense convs) is shared by the members.
* ``deep_ensemble``: :class:`DeepEnsemble`, M independently initialised dense (or SMoE) ResNets.
* ``gaussian``: :class:`GaussianResNet`, one ResNet predicting μ and σ per target.
* ``mc_dropout``: :class:`MCDropoutResNet`, one ResNet with dropout kept on at inference (Gal & Ghahramani
  2016): M stochastic passes are the members.

Output convention of every network here, in normalised units: ``(B, M, C_out, H, W)``; for ``gaussian``
M = 2 holds (μ, σ) with σ > 0 (the registry entry's ``kind`` tells which). :func:`physical_members` turns that into
physical units through the :class:`~smoeweather.models.resnet.NormalizedModel` around the network.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any, Literal

import torch
from torch import nn
from torch.nn import functional as F

from smoeweather.models import registry
from smoeweather.models.registry import parameters, register_model
from smoeweather.models.resnet import (
    TINY_RESNET,
    NormalizedModel,
    SMoEPlacement,
    WeatherBenchResNet,
    build_layers,
    land_sea_categories,
    resnet_arguments,
)
from smoeweather.nn import PeriodicLonConv2d, SpatialMoE2d, TensorRoutingGate

EnsembleKind = Literal["ensemble", "gaussian"]
SIGMA_FLOOR = 1e-3
"""Smallest σ of the Gaussian head in normalised units (keeps the CRPS gradient finite)."""


class MemberSMoE(nn.Module):
    """One SMoE position of an E³ network: M :class:`SpatialMoE2d`, one per expert group.

    Input (M·B, C, H, W), member-major (rows m·B … (m+1)·B − 1 are member m); member m's rows go through
    ``layers[m]`` (its |E|/M experts and its gate only). Output (M·B, F_out, H, W).
    """

    def __init__(self, layers: list[SpatialMoE2d]) -> None:
        super().__init__()
        self.layers = nn.ModuleList(layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        m = len(self.layers)
        if x.shape[0] % m:
            raise ValueError(f"E3 layer expects a batch of M·B = {m}·B tiled rows, got {x.shape[0]}")
        return torch.cat([layer(part) for layer, part in zip(self.layers, x.chunk(m, dim=0))], dim=0)


class E3ResNet(nn.Module):
    """E³ on the WeatherBench ResNet: (B, C_in, H, W) → (B, M, C_out, H, W) normalised units.

    Layout as :class:`WeatherBenchResNet` (7×7 stem, ``blocks`` residual blocks, 3×3 head). ``smoe.placement``
    says which convs are SMoE layers (``all``: every 3×3 conv of the residual blocks; ``first``: one SMoE
    block after the stem; ``last``: one after the last residual block); the representation is tiled M times
    just before the first of them, so everything before it runs once per sample and everything after it
    once per member.

    Expert partition: ``smoe.experts_factor × width`` experts per SMoE position IN ALL (as in the E³ paper:
    the partition splits a layer's experts), ``experts_factor × width / M`` per member, of which each
    member selects ``width`` at every grid point; so ``experts_factor`` must be ≥ M (``experts_factor = 2M``
    gives every member the 2× expert pool of the SMoE ResNet). Each member has its own tensor gate per
    (|E|/M, H, W), shared by its layers when ``smoe.share_gate``; ``gates`` keys are ``M{m}_E{n}_H{h}_W{w}``.
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        members: int = 4,
        width: int = 128,
        blocks: int = 19,
        dropout: float = 0.0,
        smoe: SMoEPlacement | dict[str, Any] | str | None = "all",
        grid: tuple[int, int] = (32, 64),
        land_sea_prior: torch.Tensor | None = None,
    ) -> None:
        super().__init__()
        cfg = SMoEPlacement.from_config(smoe)
        if cfg.placement == "none":
            raise ValueError("model e3 needs SMoE layers: smoe.placement must be all, first or last")
        if cfg.upcycle:
            raise ValueError("model e3 does not support smoe.upcycle")
        if members < 2:
            raise ValueError(f"model e3 needs members >= 2, got {members}")
        total = cfg.experts_factor * width
        if total % members or total // members < width:
            raise ValueError(f"model e3: smoe.experts_factor × width = {total} experts must split into "
                             f"members={members} groups of at least width={width} (each member selects width "
                             f"experts per grid point): use experts_factor >= {members}, a multiple of it")
        cfg.check_prior(land_sea_prior)
        self.smoe_config, self.members, self.grid = cfg, int(members), (int(grid[0]), int(grid[1]))
        self.in_channels, self.out_channels, self.width = in_channels, out_channels, width
        self.group_experts = total // members
        self.gates = nn.ModuleDict()

        build_layers(self, in_channels, out_channels, width, blocks, dropout, cfg.placement, self._smoe,
                     lambda w: PeriodicLonConv2d(w, w, 3))
        if land_sea_prior is not None:
            categories = land_sea_categories(land_sea_prior)
            for gate in self.gates.values():
                gate.init_from_prior(categories, cfg.prior_strength)  # sea/land halves WITHIN the group

    def _gate(self, member: int) -> TensorRoutingGate:
        n, (h, w) = self.group_experts, self.grid
        key = f"M{member}_E{n}_H{h}_W{w}"
        if not self.smoe_config.share_gate:
            key = f"{key}_L{len(self.gates) // self.members}"
        if key not in self.gates:
            self.gates[key] = TensorRoutingGate(n, h, w, num_selected=self.width,
                                                frozen=self.smoe_config.random_fixed_gate,
                                                init=self.smoe_config.gate_init)
        return self.gates[key]  # type: ignore[return-value]

    def _smoe(self, width: int) -> MemberSMoE:
        cfg = self.smoe_config
        return MemberSMoE([
            SpatialMoE2d(width, self.group_experts, width, gate=self._gate(m), kernel_size=3,
                         padding="periodic_lon", rc=cfg.rc, damping=cfg.damping, quantile=cfg.quantile,
                         **cfg.layer_kwargs)
            for m in range(self.members)
        ])

    def member_gates(self, member: int) -> dict[str, TensorRoutingGate]:
        """The tensor gates of member ``member`` (0-based), keyed as in ``gates``."""
        if not 0 <= member < self.members:
            raise ValueError(f"member must be in 0..{self.members - 1}, got {member}")
        return {k: g for k, g in self.gates.items() if k.startswith(f"M{member}_")}  # type: ignore[misc]

    def _tile(self, x: torch.Tensor) -> torch.Tensor:
        return x.repeat(self.members, 1, 1, 1)  # member-major: (M·B, C, H, W)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(B, C_in, H, W) → (B, M, C_out, H, W), normalised units."""
        b = x.shape[0]
        x = self.stem(x)
        if self.first_smoe is not None or self.smoe_config.placement == "all":
            x = self._tile(x)
        if self.first_smoe is not None:
            x = self.first_smoe(x)
        x = self.blocks(x)
        if self.last_smoe is not None:
            x = self.last_smoe(self._tile(x))
        y = self.head(x)  # (M·B, C_out, H, W)
        return y.view(self.members, b, *y.shape[1:]).transpose(0, 1)


class DeepEnsemble(nn.Module):
    """M independently initialised ResNets (each its own parameters): (B, C_in, H, W) → (B, M, C_out, H, W).

    ``resnet``: keyword arguments of :class:`WeatherBenchResNet` shared by all members (dense by default).
    The members are built one after the other from the global RNG, so they start from different weights.
    """

    def __init__(self, members: int = 4, land_sea_prior: torch.Tensor | None = None, **resnet: Any) -> None:
        super().__init__()
        if members < 1:
            raise ValueError(f"model deep_ensemble needs members >= 1, got {members}")
        self.members = int(members)
        self.nets = nn.ModuleList(WeatherBenchResNet(land_sea_prior=land_sea_prior, **copy.deepcopy(resnet))
                                  for _ in range(members))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.stack([net(x) for net in self.nets], dim=1)


class GaussianResNet(nn.Module):
    """A ResNet with 2·C_out output planes read as (μ, σ): (B, C_in, H, W) → (B, 2, C_out, H, W).

    σ = softplus(raw) + :data:`SIGMA_FLOOR` (normalised units), μ the raw first C_out planes.
    """

    def __init__(self, out_channels: int, land_sea_prior: torch.Tensor | None = None, **resnet: Any) -> None:
        super().__init__()
        self.out_channels = int(out_channels)
        self.net = WeatherBenchResNet(out_channels=2 * self.out_channels, land_sea_prior=land_sea_prior, **resnet)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raw = self.net(x)
        mu, s = raw[:, : self.out_channels], raw[:, self.out_channels :]
        return torch.stack([mu, F.softplus(s) + SIGMA_FLOOR], dim=1)


class MCDropoutResNet(nn.Module):
    """A ResNet whose dropout stays on at inference: (B, C_in, H, W) → (B, M, C_out, H, W).

    Training (``self.training``): one pass, (B, 1, C_out, H, W), dropout on as usual. Evaluation: M passes with
    every Dropout layer sampling (BatchNorm keeps its running statistics), the M outputs are the members;
    they are random draws (seed torch's RNG for reproducible members).
    """

    def __init__(self, members: int = 4, dropout: float = 0.1, land_sea_prior: torch.Tensor | None = None,
                 **resnet: Any) -> None:
        super().__init__()
        if members < 2:
            raise ValueError(f"model mc_dropout needs members >= 2, got {members}")
        if not 0.0 < dropout < 1.0:
            raise ValueError(f"model mc_dropout needs 0 < dropout < 1, got {dropout}")
        self.members = int(members)
        self.net = WeatherBenchResNet(dropout=dropout, land_sea_prior=land_sea_prior, **resnet)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training:
            return self.net(x).unsqueeze(1)
        drops = [m for m in self.net.modules() if isinstance(m, nn.Dropout)]
        for m in drops:
            m.train()
        try:
            return torch.stack([self.net(x) for _ in range(self.members)], dim=1)
        finally:
            for m in drops:
                m.eval()


def uses_land_sea_prior(cfg: Mapping[str, Any]) -> bool:
    """Whether the network of a ``model`` block needs a land-sea map to be built: SMoE layers whose gates are
    initialised from it. The one answer for every weather network: ResNets and ensembles say so in
    ``smoe.gate_prior`` (with ``smoe.placement`` not ``none``), the U-Net in ``gate_prior`` with ``smoe: true``.
    A top-level ``gate_prior`` of a ResNet (which takes ``smoe.gate_prior``) is not a prior."""
    smoe = cfg.get("smoe")
    if isinstance(smoe, Mapping):
        return smoe.get("gate_prior") == "land_sea" and smoe.get("placement", "all") != "none"
    return cfg.get("name") == "unet" and cfg.get("gate_prior") == "land_sea" and bool(smoe)


def _ensemble_arguments(cfg: dict[str, Any]) -> list[tuple[Any, Any, str]]:
    """The ResNet's argument types for the keys an ensemble shares with it (``members`` is the ensemble's)."""
    return resnet_arguments({k: v for k, v in cfg.items() if k != "members"})


_SHARED_KEYS = parameters(WeatherBenchResNet) - {"location_embedding"}  # the ResNet keys ensembles pass on
_TINY = {**TINY_RESNET, "members": 2, "smoe": {"placement": "all"}}


def _prepared(cfg: dict[str, Any], land_sea_prior: torch.Tensor | None) -> torch.Tensor | None:
    if "grid" in cfg:
        cfg["grid"] = tuple(cfg["grid"])
    return land_sea_prior if uses_land_sea_prior(cfg) else None


@register_model("weather", "e3", keys=parameters(E3ResNet), arguments=_ensemble_arguments,
                tiny={**_TINY, "smoe": {"placement": "all", "experts_factor": 2}}, kind="ensemble")
def _e3(cfg: dict[str, Any], land_sea_prior: torch.Tensor | None = None) -> nn.Module:
    """E³ on the Spatial-MoE ResNet: the experts split into member groups, one tensor gate per member."""
    return E3ResNet(land_sea_prior=_prepared(cfg, land_sea_prior), **cfg)


@register_model("weather", "deep_ensemble", keys=_SHARED_KEYS | {"members"}, arguments=_ensemble_arguments,
                tiny=_TINY, kind="ensemble")
def _deep_ensemble(cfg: dict[str, Any], land_sea_prior: torch.Tensor | None = None) -> nn.Module:
    """M independently initialised ResNets (dense or SMoE)."""
    return DeepEnsemble(land_sea_prior=_prepared(cfg, land_sea_prior), **cfg)


@register_model("weather", "gaussian", keys=_SHARED_KEYS, arguments=_ensemble_arguments,
                tiny={**TINY_RESNET, "smoe": {"placement": "all"}}, kind="gaussian")
def _gaussian(cfg: dict[str, Any], land_sea_prior: torch.Tensor | None = None) -> nn.Module:
    """One ResNet predicting μ and σ > 0 per target."""
    return GaussianResNet(land_sea_prior=_prepared(cfg, land_sea_prior), **cfg)


@register_model("weather", "mc_dropout", keys=_SHARED_KEYS | {"members"}, arguments=_ensemble_arguments,
                tiny={**TINY_RESNET, "members": 2, "dropout": 0.1}, kind="ensemble")
def _mc_dropout(cfg: dict[str, Any], land_sea_prior: torch.Tensor | None = None) -> nn.Module:
    """One ResNet with dropout kept on at inference: M stochastic passes are the members."""
    return MCDropoutResNet(land_sea_prior=_prepared(cfg, land_sea_prior), **cfg)


def model_kind(cfg: Mapping[str, Any]) -> str:
    """``deterministic`` for a plain network config, else ``ensemble`` or ``gaussian`` (the registry's kind)."""
    entry = registry.entries_by_name("weather").get(cfg.get("name"))  # type: ignore[arg-type]
    return entry.kind if entry is not None else "deterministic"


def members_of(cfg: dict[str, Any]) -> int:
    """Number of members an ensemble model config produces (1 for deterministic and Gaussian models)."""
    return int(cfg.get("members", 4)) if model_kind(cfg) == "ensemble" else 1


def physical_members(model: NormalizedModel, x: torch.Tensor, kind: str) -> torch.Tensor:
    """Physical-unit outputs of an ensemble network inside ``model``: (B, M, C_out, H, W) members for
    ``ensemble``, (B, 2, C_out, H, W) = (μ, σ) for ``gaussian`` (σ scaled by the target std only)."""
    raw = model.net(model.normalize_input(x))
    if kind == "gaussian":
        return torch.stack([model.denormalize_output(raw[:, 0]), raw[:, 1] * model.target_std], dim=1)
    if kind != "ensemble":
        raise ValueError(f"kind must be 'ensemble' or 'gaussian', got {kind!r}")
    return model.denormalize_output(raw)
