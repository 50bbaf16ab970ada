"""The ENS-10 post-processing U-Net (Ashkboos et al. 2022) and its SMoE version (paper §3.3).

Input (B, C, H, W): ensemble mean and std of the predictors (normalised); output (B, 2, H, W), turned
into a Gaussian (μ, σ) by :func:`gaussian_head` with the ensemble mean and spread of the target.
"""

from __future__ import annotations

from typing import Any, Literal

import torch
from torch import nn
from torch.nn import functional as F

from smoeweather.models.registry import parameters, register_model
from smoeweather.nn import SpatialMoE2d, TensorRoutingGate


class ConvBNReLU(nn.Module):
    """``layer`` (3×3 conv or SMoE) → BatchNorm → ReLU: (B, C_in, H, W) → (B, C_out, H, W)."""

    def __init__(self, layer: nn.Module, out_channels: int) -> None:
        super().__init__()
        self.layer = layer
        self.norm = nn.BatchNorm2d(out_channels)
        self.act = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.norm(self.layer(x)))


class PostprocessingUNet(nn.Module):
    """U-Net of the ENS-10 baselines (any ensemble source), optionally with every 3×3 conv replaced by an SMoE.

    Formerly named ``Ens10UNet``; the old name still imports, with a DeprecationWarning.

    Encoder level l (l = 0..levels−1): two [3×3 conv → BN → ReLU] to ``widths[l]``, 2×2 max-pool between
    levels. Decoder: two convs at the bottom (widths[-1] → widths[-1] → widths[-2]); at each higher level
    bilinear upsampling to the skip's size, concatenation with the skip, two convs (2·w_l → w_l →
    w_{l−1}, the last level stays at w_0); final 1×1 conv to 2 channels. Zero padding (as the reference).

    SMoE (``smoe=True``): every 3×3 conv → :class:`SpatialMoE2d` with |E| = experts_factor × filters and
    E = filters; tensor-routing gates are shared between the layers of equal (|E|, H, W), separately for
    the encoder and the decoder (``self.gates`` keys ``{enc|dec}_E{|E|}_H{H}_W{W}``).

    Args:
        in_channels: C.
        levels, widths: number of resolution levels and their filters (reference: 3, (32, 64, 128)).
        smoe, experts_factor: SMoE version and its |E|/E (paper: 4).
        grid: (H, W) of the input; needed for the gates (level l has (H // 2^l, W // 2^l)).
        rc, damping, quantile: passed to every SMoE layer. Defaults: RC on, q = 0.3, damping None (off),
            NOT the paper text's 0.1: in the post-processing study (3 seeds, docs/postprocessing-study.md)
            damping 0.1 raised the Z500 48 h CRPS of the SMoE-U-Net by 12 % and the paper's uniform gate init by
            35 % (see the design notes of :mod:`smoeweather.nn.smoe`).
        gate_init: ``coherent`` (default: one rank order of the experts everywhere, within each prior
            category) or ``uniform`` (the paper's per-location U(−b, b));
            :class:`~smoeweather.nn.gates.TensorRoutingGate`.
        land_sea_prior: (H, W) land fraction or 0/1 mask; every gate gets it as a categorical prior, pooled to
            its level's grid (area mean over 2^l × 2^l cells, land where ≥ 0.5). None = no prior.
        prior_strength: logit margin of the prior groups at init (1 = they outrank all others).
        share_gate: share one gate between the layers of equal (part, |E|, H, W) (default, the paper's
            sharing); False = one gate per layer.
        out_channels: 2 per target for the Gaussian head (μ, σ pairs, see :func:`gaussian_heads`).
        head_kernel: kernel of the final conv (1; the spcl/ens10 code uses 3).
        smoe_kwargs: further keyword arguments for :class:`SpatialMoE2d`.
        head_affine: a per-grid-point affine map of the raw outputs, o ← o·s(c, h, w) + t(c, h, w) (s = 1,
            t = 0 at init; needs ``grid``): every point's own offset and scale of μ and σ, the most that
            location-specific OUTPUT capacity can add (the headroom arm of the routing study).
        freeze_gate: keep every gate at its initialisation (no gate parameter trains; the same seed gives the
            same initial routing as the learned-gate twin), which isolates what LEARNED routing adds.
    """

    def __init__(
        self,
        in_channels: int,
        levels: int = 3,
        widths: tuple[int, ...] = (32, 64, 128),
        smoe: bool = False,
        experts_factor: int = 4,
        grid: tuple[int, int] | None = None,
        rc: bool = True,
        damping: float | None = None,
        quantile: float = 0.3,
        out_channels: int = 2,
        head_kernel: int = 1,
        smoe_kwargs: dict[str, Any] | None = None,
        gate_init: str = "coherent",
        land_sea_prior: torch.Tensor | None = None,
        prior_strength: float = 1.0,
        share_gate: bool = True,
        head_affine: bool = False,
        freeze_gate: bool = False,
    ) -> None:
        super().__init__()
        widths = tuple(int(w) for w in widths)
        if len(widths) != levels or levels < 1:
            raise ValueError(f"need one width per level: levels={levels}, widths={widths}")
        if smoe and grid is None:
            raise ValueError("the SMoE U-Net needs grid=(H, W) for its tensor-routing gates")
        self.levels, self.widths, self.smoe, self.experts_factor = levels, widths, smoe, experts_factor
        self.grid = None if grid is None else (int(grid[0]), int(grid[1]))
        self._smoe_args = dict(rc=rc, damping=damping, quantile=quantile, **(smoe_kwargs or {}))
        self.gate_init, self.prior_strength, self.share_gate = gate_init, float(prior_strength), bool(share_gate)
        self.land_sea_prior = None if land_sea_prior is None else torch.as_tensor(land_sea_prior, dtype=torch.float32)
        if smoe and self.land_sea_prior is not None and tuple(self.land_sea_prior.shape) != self.grid:
            raise ValueError(f"land_sea_prior has shape {tuple(self.land_sea_prior.shape)}; grid is {self.grid}")
        self.gates = nn.ModuleDict()

        self.encoder = nn.ModuleList()
        c = in_channels
        for lev, w in enumerate(widths):
            self.encoder.append(nn.Sequential(self._block("enc", lev, c, w), self._block("enc", lev, w, w)))
            c = w
        self.decoder = nn.ModuleList()
        for lev in reversed(range(levels)):
            w = widths[lev]
            c_in = w if lev == levels - 1 else 2 * w
            w_out = widths[lev - 1] if lev > 0 else w
            blocks = (self._block("dec", lev, c_in, w), self._block("dec", lev, w, w_out))
            self.decoder.append(nn.Sequential(*blocks))
        self.head = nn.Conv2d(widths[0], out_channels, head_kernel, padding=head_kernel // 2)
        self.head_scale: nn.Parameter | None = None
        self.head_offset: nn.Parameter | None = None
        if head_affine:
            if self.grid is None:
                raise ValueError("head_affine needs grid=(H, W): one offset and scale per grid point")
            self.head_scale = nn.Parameter(torch.ones(out_channels, *self.grid))
            self.head_offset = nn.Parameter(torch.zeros(out_channels, *self.grid))
        self.freeze_gate = bool(freeze_gate)
        if freeze_gate:
            if not smoe:
                raise ValueError("freeze_gate applies to the SMoE U-Net (smoe=true) only")
            for gate in self.gates.values():
                gate.requires_grad_(False)

    def level_grid(self, level: int) -> tuple[int, int]:
        assert self.grid is not None
        return self.grid[0] // 2**level, self.grid[1] // 2**level

    def level_prior(self, level: int) -> torch.Tensor | None:
        """Categorical land-sea map (H_l, W_l) of resolution level ``level`` (1 = land), or None."""
        if self.land_sea_prior is None:
            return None
        frac = F.adaptive_avg_pool2d(self.land_sea_prior[None, None], self.level_grid(level))[0, 0]
        return (frac >= 0.5).long()

    def _block(self, part: Literal["enc", "dec"], level: int, c_in: int, c_out: int) -> ConvBNReLU:
        if not self.smoe:
            return ConvBNReLU(nn.Conv2d(c_in, c_out, 3, padding=1), c_out)
        num_experts = self.experts_factor * c_out
        h, w = self.level_grid(level)
        key = f"{part}_E{num_experts}_H{h}_W{w}"
        if not self.share_gate:
            key += f"_{part}{level}_{len(self.gates)}"
        if key not in self.gates:
            self.gates[key] = TensorRoutingGate(num_experts, h, w, num_selected=c_out, init=self.gate_init,
                                                prior=self.level_prior(level), prior_strength=self.prior_strength)
        layer = SpatialMoE2d(c_in, num_experts, c_out, gate=self.gates[key], kernel_size=3, padding="zeros",
                             **self._smoe_args)
        return ConvBNReLU(layer, c_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(B, C, H, W) → (B, out_channels, H, W) raw outputs (see :func:`gaussian_head`)."""
        skips = []
        for lev, enc in enumerate(self.encoder):
            if lev > 0:
                x = F.max_pool2d(x, 2)
            x = enc(x)
            skips.append(x)
        for i, dec in enumerate(self.decoder):
            if i > 0:
                skip = skips[self.levels - 1 - i]
                x = F.interpolate(x, size=skip.shape[-2:], mode="bilinear", align_corners=False)
                x = torch.cat([skip, x], dim=1)
            x = dec(x)
        out = self.head(x)
        if self.head_scale is not None and self.head_offset is not None:
            out = torch.addcmul(self.head_offset, out, self.head_scale)
        return out


def gaussian_head(o: torch.Tensor, ens_mean: torch.Tensor, ens_std: torch.Tensor,
                  positive: Literal["softplus", "exp"] = "softplus",
                  eps: float = 1e-6) -> tuple[torch.Tensor, torch.Tensor]:
    """Gaussian forecast from the network output and the raw ensemble statistics of the target.

    ``o``: (B, 2, H, W); ``ens_mean``, ``ens_std``: (B, H, W) or (B, 1, H, W) in physical units.
    Returns μ = o₀·s_ens + m_ens and σ = f(o₁)·s_ens + eps, f = softplus (default) or exp (the ENS-10
    reference), each (B, H, W) in physical units.
    """
    if o.dim() != 4 or o.shape[1] != 2:
        raise ValueError(f"o must be (B, 2, H, W), got {tuple(o.shape)}")
    target_shape = o.shape[:1] + o.shape[2:]

    def squeeze(t: torch.Tensor, name: str) -> torch.Tensor:
        if t.dim() == 4 and t.shape[1] == 1:
            t = t[:, 0]
        if t.shape != target_shape:
            raise ValueError(f"{name} must be (B, H, W) = {tuple(target_shape)}, got {tuple(t.shape)}")
        return t

    m, s = squeeze(ens_mean, "ens_mean"), squeeze(ens_std, "ens_std")
    if positive == "softplus":
        scale = F.softplus(o[:, 1])
    elif positive == "exp":
        scale = torch.exp(o[:, 1])
    else:
        raise ValueError(f"positive must be 'softplus' or 'exp', got {positive!r}")
    return o[:, 0] * s + m, scale * s + eps


def gaussian_heads(o: torch.Tensor, ens_mean: torch.Tensor, ens_std: torch.Tensor,
                   eps: float = 1e-6) -> tuple[torch.Tensor, torch.Tensor]:
    """Gaussian forecasts of T targets: ``o`` (B, 2T, H, W) as (μ, σ) pairs per target, ``ens_mean`` and
    ``ens_std`` (B, T, H, W). Returns μ = o₂ₜ·s + m and σ = softplus(o₂ₜ₊₁)·s + eps, each (B, T, H, W),
    in the units of ``ens_mean`` (:func:`gaussian_head` per target)."""
    if o.dim() != 4 or o.shape[1] != 2 * ens_mean.shape[1] or ens_mean.shape != ens_std.shape:
        raise ValueError(f"o must be (B, 2T, H, W) for ens_mean/ens_std (B, T, H, W); got {tuple(o.shape)}, "
                         f"{tuple(ens_mean.shape)}, {tuple(ens_std.shape)}")
    loc, raw_scale = o[:, 0::2], o[:, 1::2]
    return loc * ens_std + ens_mean, F.softplus(raw_scale) * ens_std + eps


def _unet_arguments(cfg: dict[str, Any]) -> list[tuple[Any, Any, str]]:
    return [(PostprocessingUNet, cfg, ""), (SpatialMoE2d, cfg.get("smoe_kwargs"), ".smoe_kwargs")]


@register_model("weather", "unet", keys=parameters(PostprocessingUNet) | {"gate_prior"}, arguments=_unet_arguments,
                tiny={"in_channels": 4, "levels": 3, "widths": [4, 8, 16], "smoe": True, "experts_factor": 4,
                      "grid": [16, 32], "gate_prior": "land_sea"})
def _unet(cfg: dict[str, Any], land_sea_prior: torch.Tensor | None = None) -> nn.Module:
    """U-Net of the ensemble post-processing baselines, dense or with every 3×3 conv an SMoE (``smoe: true``)."""
    for key in ("grid", "widths"):
        if cfg.get(key) is not None:
            cfg[key] = tuple(cfg[key])
    prior = cfg.pop("gate_prior", None)
    if prior not in (None, "none", "land_sea"):
        raise ValueError(f"model.gate_prior must be 'land_sea' or null, got {prior!r}")
    if prior == "land_sea" and cfg.get("smoe"):
        if land_sea_prior is None:
            raise ValueError("model.gate_prior: land_sea needs a land-sea mask (data.static or data.constants)")
        cfg["land_sea_prior"] = land_sea_prior
    return PostprocessingUNet(**cfg)


_DEPRECATED_NAMES = {"Ens10UNet": "PostprocessingUNet"}


def __getattr__(name: str) -> object:
    """Old names of this module's classes (:data:`_DEPRECATED_NAMES`), with a DeprecationWarning."""
    if name in _DEPRECATED_NAMES:
        import warnings

        new = _DEPRECATED_NAMES[name]
        warnings.warn(f"smoeweather.models.unet.{name} is deprecated; it is {new} (the same network, for any "
                      "ensemble source)", DeprecationWarning, stacklevel=2)
        return globals()[new]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
