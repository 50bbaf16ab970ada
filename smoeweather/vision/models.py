"""Image classifiers for the vision MoE baselines; every model maps (B, C, H, W) → member logits (M, B, K).

``build_vision_model(cfg, in_channels, num_classes, image_size)`` with ``cfg["name"]`` a network registered
for task ``vision`` (:mod:`smoeweather.models.registry`):

* ``vit`` / ``vmoe`` / ``e3``: :class:`smoeweather.nn.vit.ViTClassifier` (dense, V-MoE, E³ with
  ``ensemble`` = M ≥ 2); remaining keys are its arguments.
* ``cifar_resnet``: CIFAR-style ResNet (3×3 stem, ``widths`` stages of ``blocks`` BasicBlocks); ``moe`` (a dict
  of :class:`smoeweather.nn.resblock_moe.ResBlockMoE` arguments plus ``position`` 1..len(widths)) inserts
  a ResBlock-MoE layer after that stage.
* ``cnn``: three 3×3 conv layers of ``channels`` filters with BN + ReLU, GAP and a linear head (SMoE
  paper App. D); ``smoe`` (dict) replaces every conv by a :class:`SpatialMoE2d` with 2·channels experts
  selecting ``channels`` and one tensor-routing gate shared by all layers (App. D / Table D.1);
  ``smoe.gate_init`` (``uniform`` | ``coherent``) and ``smoe.gate_frozen`` set that gate, the other
  ``smoe`` keys are :class:`SpatialMoE2d` arguments (configs/vision/smoe_cnn.yaml turns damping off:
  docs/smoe-weather-findings.md, Finding 6).

Any model takes ``emoe: {experts: N, k: k, blocks: [...]}``: the FFNs of those ViT blocks (or, for
``cnn``, the conv layers with those indices) become EMoE layers; :func:`recluster_emoe` regroups them
from the current (trained) weights.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from smoeweather.models import registry
from smoeweather.models.registry import register_model
from smoeweather.nn.emoe import EMoEActivation, balanced_kmeans, emoe_conv, emoe_mlp, fold_bn_keys
from smoeweather.nn.gates import TensorRoutingGate
from smoeweather.nn.resblock_moe import ResBlockMoE
from smoeweather.nn.smoe import SpatialMoE2d
from smoeweather.nn.vit import ViTClassifier


class BasicBlock(nn.Module):
    """ResNet basic block, (B, C_in, H, W) → (B, C_out, H/stride, W/stride), projection shortcut if needed."""

    def __init__(self, cin: int, cout: int, stride: int = 1) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True),
            nn.Conv2d(cout, cout, 3, 1, 1, bias=False), nn.BatchNorm2d(cout),
        )
        self.short = nn.Identity() if stride == 1 and cin == cout else nn.Sequential(
            nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.body(x) + self.short(x))


class CifarResNet(nn.Module):
    """CIFAR-style ResNet classifier with an optional ResBlock-MoE after stage ``moe['position']``."""

    def __init__(self, in_channels: int, num_classes: int, widths: tuple[int, ...] = (16, 32, 64), blocks: int = 1,
                 moe: dict[str, Any] | None = None) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(in_channels, widths[0], 3, padding=1, bias=False),
                                  nn.BatchNorm2d(widths[0]), nn.ReLU(inplace=True))
        stages, cin = [], widths[0]
        moe = dict(moe or {})
        position = int(moe.pop("position", 0)) if moe else 0
        if moe and not 1 <= position <= len(widths):
            raise ValueError(f"model.moe.position must be in 1..{len(widths)}, got {position}")
        for s, w in enumerate(widths):
            layers: list[nn.Module] = [BasicBlock(cin if b == 0 else w, w, 2 if (b == 0 and s > 0) else 1)
                                       for b in range(blocks)]
            if s + 1 == position:
                layers.append(ResBlockMoE(w, **moe))
            stages.append(nn.Sequential(*layers))
            cin = w
        self.stages = nn.Sequential(*stages)
        self.head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.stages(self.stem(x))).unsqueeze(0)


class ThreeLayerCNN(nn.Module):
    """Three 3×3 conv (or SMoE) layers + BN + ReLU, GAP, linear (SMoE paper App. D)."""

    def __init__(self, in_channels: int, num_classes: int, image_size: tuple[int, int], channels: int = 64,
                 smoe: dict[str, Any] | None = None) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        gate = None
        if smoe is not None:
            smoe = dict(smoe)
            experts = int(smoe.pop("num_experts", 2 * channels))
            gate = TensorRoutingGate(experts, *image_size, num_selected=channels, init=smoe.pop("gate_init", "uniform"),
                                     frozen=bool(smoe.pop("gate_frozen", False)))
        cin = in_channels
        for _ in range(3):
            if gate is None:
                conv: nn.Module = nn.Conv2d(cin, channels, 3, padding=1, bias=False)
            else:
                conv = SpatialMoE2d(cin, gate.num_experts, channels, gate=gate, **(smoe or {}))
            layers.append(nn.Sequential(conv, nn.BatchNorm2d(channels), nn.ReLU()))
            cin = channels
        self.layers = nn.Sequential(*layers)
        self.head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(channels, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.layers(x)).unsqueeze(0)


def build_vision_model(cfg: dict[str, Any], in_channels: int, num_classes: int,
                       image_size: tuple[int, int]) -> nn.Module:
    """The classifier ``cfg['name']`` (see module docstring) for C=``in_channels`` (H, W) images; an ``emoe``
    block turns its layers into EMoE layers (:func:`apply_emoe`)."""
    cfg = dict(cfg)
    emoe = cfg.pop("emoe", None)
    try:
        model = registry.build("vision", cfg, in_channels=in_channels, num_classes=num_classes,
                               image_size=image_size)
    except TypeError as err:  # an unknown or misspelt model key: a user error, named
        raise ValueError(f"model {cfg.get('name')!r}: {err}") from err
    return apply_emoe(model, **emoe) if emoe else model


def _arguments(model: Any) -> Any:
    """(constructor, mapping, suffix) of a vision ``model`` block: the network's, its ResBlock-MoE's, EMoE's."""

    def arguments(cfg: dict[str, Any]) -> list[tuple[Any, Any, str]]:
        out: list[tuple[Any, Any, str]] = [(model, cfg, "")]
        if model is CifarResNet and isinstance(cfg.get("moe"), dict):
            out.append((ResBlockMoE, cfg["moe"], ".moe"))
        return out + [(apply_emoe, cfg.get("emoe"), ".emoe")]

    return arguments


def _vit_family(name: str, cfg: dict[str, Any], in_channels: int, num_classes: int,
                image_size: tuple[int, int]) -> nn.Module:
    if name == "vit" and cfg.get("num_experts"):
        raise ValueError("model 'vit' is dense: drop num_experts or use name vmoe/e3")
    if name != "vit" and not cfg.get("num_experts"):
        raise ValueError(f"model {name!r} needs model.num_experts > 0")
    cfg.pop("image_size", None)
    return ViTClassifier(in_channels, num_classes, image_size, **cfg)


@register_model("vision", "vit", arguments=_arguments(ViTClassifier), tiny={"dim": 16, "depth": 1, "heads": 2,
                                                                             "patch": 4})
def _vit(cfg: dict[str, Any], in_channels: int, num_classes: int, image_size: tuple[int, int]) -> nn.Module:
    """Vision Transformer classifier (dense)."""
    return _vit_family("vit", cfg, in_channels, num_classes, image_size)


@register_model("vision", "vmoe", arguments=_arguments(ViTClassifier),
                tiny={"dim": 16, "depth": 2, "heads": 2, "patch": 4, "num_experts": 4})
def _vmoe(cfg: dict[str, Any], in_channels: int, num_classes: int, image_size: tuple[int, int]) -> nn.Module:
    """V-MoE: a ViT whose MoE blocks route tokens to ``num_experts`` FFN experts (Riquelme et al. 2021)."""
    return _vit_family("vmoe", cfg, in_channels, num_classes, image_size)


@register_model("vision", "e3", arguments=_arguments(ViTClassifier),
                tiny={"dim": 16, "depth": 2, "heads": 2, "patch": 4, "num_experts": 4, "ensemble": 2})
def _e3(cfg: dict[str, Any], in_channels: int, num_classes: int, image_size: tuple[int, int]) -> nn.Module:
    """E³ on V-MoE: the experts partitioned into ``ensemble`` ≥ 2 member groups (Allingham et al. 2022)."""
    if int(cfg.get("ensemble", 2)) < 2:
        raise ValueError("model 'e3' needs model.ensemble >= 2")
    cfg.setdefault("ensemble", 2)
    return _vit_family("e3", cfg, in_channels, num_classes, image_size)


@register_model("vision", "cifar_resnet", arguments=_arguments(CifarResNet), tiny={"widths": [4, 8, 8]})
def _cifar_resnet(cfg: dict[str, Any], in_channels: int, num_classes: int, image_size: tuple[int, int]) -> nn.Module:
    """CIFAR-style ResNet classifier, optionally with a ResBlock-MoE after one stage (``moe``)."""
    widths = tuple(cfg.pop("widths", (16, 32, 64)))
    return CifarResNet(in_channels, num_classes, widths, **cfg)


@register_model("vision", "cnn", arguments=_arguments(ThreeLayerCNN), tiny={"channels": 4, "smoe": {}})
def _cnn(cfg: dict[str, Any], in_channels: int, num_classes: int, image_size: tuple[int, int]) -> nn.Module:
    """Three 3×3 conv layers, GAP and a linear head; ``smoe`` makes every conv an SMoE layer (SMoE App. D)."""
    return ThreeLayerCNN(in_channels, num_classes, image_size, **cfg)


def apply_emoe(model: nn.Module, experts: int = 4, k: int = 2, blocks: list[int] | None = None,
               seed: int = 0) -> nn.Module:
    """Turn the FFNs of ViT ``blocks`` (default: the last) or the conv layers of a ``cnn`` with those
    indices (default: the last) into EMoE layers, in place, clustering the current weights."""
    if isinstance(model, ViTClassifier):
        ids = blocks if blocks is not None else [len(model.blocks) - 1]
        for i in ids:
            mlp = model.blocks[i].mlp
            if not hasattr(mlp, "fc1"):
                raise ValueError(f"EMoE needs a dense FFN in block {i}; it holds {type(mlp).__name__}")
            emoe_mlp(mlp, experts, k, seed)
    elif isinstance(model, ThreeLayerCNN):
        ids = blocks if blocks is not None else [len(model.layers) - 1]
        for i in ids:
            if not isinstance(model.layers[i][0], nn.Conv2d):
                raise ValueError(f"EMoE needs a dense conv in layer {i}")
            emoe_conv(model.layers[i], experts, k, seed)
    else:
        raise ValueError(f"EMoE conversion supports vit and cnn models, not {type(model).__name__}")
    return model


@torch.no_grad()
def recluster_emoe(model: nn.Module, seed: int = 0) -> int:
    """Regroup every EMoE layer from the model's current weights (after loading a trained dense model).
    Returns the number of layers reclustered."""
    done = 0
    for parent in model.modules():
        act = getattr(parent, "act", None)
        if isinstance(act, EMoEActivation) and hasattr(parent, "fc1"):
            keys = parent.fc1.weight
        elif isinstance(parent, nn.Sequential) and any(isinstance(m, EMoEActivation) for m in parent):
            act = next(m for m in parent if isinstance(m, EMoEActivation))
            bn = parent[1] if isinstance(parent[1], nn.BatchNorm2d) else None
            keys = fold_bn_keys(parent[0], bn)
        else:
            continue
        groups = balanced_kmeans(keys, act.num_experts, seed=seed).to(act.groups.device)
        onehot = nn.functional.one_hot(groups, act.num_experts).to(act.average)
        act.groups.copy_(groups)
        act.average.copy_(onehot / onehot.sum(dim=0))
        done += 1
    return done
