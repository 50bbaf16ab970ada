"""``task: vision``: image classification with the vision MoE backbones (ViT, V-MoE, E³, ResBlock-MoE, EMoE,
SMoE-CNN). :func:`build_vision` turns a config into (data module, :class:`ClassificationModule`).

Config blocks: ``data`` (``dataset`` digits|cifar10|cifar100|mnist, ``path``, ``batch_size``,
``valid_fraction``, ``max_train``, ``resize`` [H, W] applied on the device, e.g. [224, 224] for ViT-S/16
on CIFAR), ``model`` (:func:`smoeweather.vision.models.build_vision_model`), ``training`` (lr, aux_weight,
...), ``trainer`` (Lightning: devices, precision ``bf16-mixed``, max_epochs/max_steps).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from smoeweather.config import Block, settings_specs
from smoeweather.training.base import SMoETrainingModule
from smoeweather.training.blocks import TrainingSettings, loader_specs
from smoeweather.training.registry import register_task
from smoeweather.training.schema import common, register_task_schema
from smoeweather.training.settings import TrainConfig

VISION_DATA = Block({
    "dataset": (str,), "path": (str, type(None)), **loader_specs(("batch_size", "num_workers")),
    "valid_fraction": (float,), "test_fraction": (float,), "max_train": (int, type(None)),
    "resize": (list, type(None)),
})
# ``model`` keys are checked by the model constructors (they depend on model.name)
VISION_TRAINING = Block(settings_specs(TrainingSettings, VISION_TRAINING_KEYS := (
    "lr", "plateau_factor", "plateau_patience", "aux_weight", "routing_log_every", "early_stopping_patience")))
"""``training`` keys the vision task uses (Adam with ReduceLROnPlateau): any other is refused, not ignored."""
register_task_schema("vision", lambda: common().extended(data=VISION_DATA, training=VISION_TRAINING))


def weighted_aux_loss(model: nn.Module, default_weight: float) -> torch.Tensor | None:
    """Σ over layers of ``aux_weight`` × ``aux_loss`` (a layer's own ``aux_weight``, e.g. ResBlock-MoE's
    w = 0.5, else ``default_weight``, the V-MoE 0.01) for the last training forward."""
    terms = [m.aux_loss.reshape(()) * float(getattr(m, "aux_weight", default_weight)) for m in model.modules()
             if isinstance(getattr(m, "aux_loss", None), torch.Tensor)]
    return torch.stack(terms).sum() if terms else None


def member_cross_entropy(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean over members of the cross-entropy of (M, B, K) logits (E³ training loss; = CE for M = 1)."""
    m, b, k = logits.shape
    return F.cross_entropy(logits.reshape(m * b, k).float(), labels.repeat(m))


def mean_probabilities(logits: torch.Tensor) -> torch.Tensor:
    """(B, K) prediction = mean of the member softmax probabilities of (M, B, K) logits."""
    return logits.float().softmax(dim=-1).mean(dim=0)


class ClassificationModule(SMoETrainingModule):
    """Lightning module: loss = mean member CE + Σ weighted aux losses; val/test: NLL and accuracy of the
    mean member prediction. ``resize`` (H, W) bilinearly resizes batches on the device first."""

    def __init__(self, model: nn.Module, resize: tuple[int, int] | None = None, recluster_emoe: bool = False,
                 **kwargs: Any) -> None:
        super().__init__(model, **kwargs)
        self.resize = tuple(resize) if resize else None
        self.recluster_emoe = recluster_emoe

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.resize is not None and tuple(x.shape[-2:]) != self.resize:
            x = F.interpolate(x, size=self.resize, mode="bilinear", align_corners=False)
        return self.model(x)

    def on_fit_start(self) -> None:
        if self.recluster_emoe and self.global_step == 0:  # group the (possibly just loaded) dense weights
            from smoeweather.vision.models import recluster_emoe

            recluster_emoe(self.model, seed=int(self.metadata.get("config", {}).get("seed", 0)))

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = member_cross_entropy(self(x), y)
        self.log("train_loss", loss, on_step=False, on_epoch=True, sync_dist=True)
        aux = weighted_aux_loss(self.model, self.aux_weight)
        if aux is None:
            return loss
        self.log("train_aux", aux, on_step=False, on_epoch=True, sync_dist=True)
        return loss + aux

    def _evaluate(self, batch: tuple[torch.Tensor, torch.Tensor], prefix: str) -> None:
        x, y = batch
        probs = mean_probabilities(self(x))
        nll = F.nll_loss(probs.clamp_min(1e-12).log(), y)
        acc = (probs.argmax(dim=1) == y).float().mean()
        self.log(f"{prefix}_loss", nll, prog_bar=True, sync_dist=True)
        self.log(f"{prefix}_acc", acc, prog_bar=True, sync_dist=True)

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        self._evaluate(batch, "val")

    def test_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        self._evaluate(batch, "test")


def build_vision(config: TrainConfig | Mapping[str, Any]) -> tuple[Any, ClassificationModule]:
    """(SplitDataModule, ClassificationModule) for a ``task: vision`` config."""
    from smoeweather.training.datamodule import SplitDataModule
    from smoeweather.vision.data import load_images, standardise
    from smoeweather.vision.models import build_vision_model

    cfg = TrainConfig.from_dict(config)
    dcfg = cfg.data
    splits = load_images(dcfg.get("dataset", "digits"), dcfg.get("path"), float(dcfg.get("valid_fraction", 0.1)),
                         float(dcfg.get("test_fraction", 0.2)), cfg.seed, dcfg.get("max_train"))
    datasets, mean, std = standardise(splits)
    c, h, w = splits.shape
    resize = tuple(dcfg["resize"]) if dcfg.get("resize") else None
    mcfg = cfg.model.to_dict()
    model = build_vision_model(mcfg, c, len(splits.classes), resize or (h, w))
    batch = 64 if cfg.loader.batch_size is None else cfg.loader.batch_size
    data = SplitDataModule(lambda: datasets, batch_size=batch, seed=cfg.seed, num_workers=cfg.loader.num_workers)
    metadata = {"task": "vision", "config": cfg.to_dict(), "classes": splits.classes, "source": splits.source,
                "normalisation": {"mean": mean.tolist(), "std": std.tolist()}}
    t = cfg.training.module_kwargs()
    module = ClassificationModule(  # Adam and ReduceLROnPlateau: other training keys are refused by the schema
        model, resize=resize, recluster_emoe=bool(mcfg.get("emoe")), metadata=metadata,
        **{k: t[k] for k in VISION_TRAINING_KEYS if k != "early_stopping_patience"},
    )
    return data, module


register_task("vision", build_vision)
