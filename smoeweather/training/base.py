"""Shared pieces of the Lightning modules: SMoE routing losses, Adam + ReduceLROnPlateau, frozen BatchNorm
and versioned checkpoint metadata (resolved config, normalisation statistics, channel names)."""

from __future__ import annotations

import math
import warnings
from typing import Any

import lightning as L
import torch
from torch import nn

from smoeweather.models.checkpoint_io import plain
from smoeweather.models.loader import FORMAT_VERSION, METADATA_KEY, check_checkpoint
from smoeweather.nn.smoe import SpatialMoE2d, rc_loss_value, set_loss_scale
from smoeweather.training.blocks import ROUTING_LOG_EVERY, TrainingSettings  # noqa: F401 - re-exported

_DEFAULTS = TrainingSettings()  # the defaults of the ``training`` block, set once in TrainingSettings

warnings.filterwarnings("ignore", message=r".*ReduceLROnPlateau conditioned on metric val_loss which is not "
                        r"available but strict is set to `False`.*")


def auxiliary_loss(model: nn.Module) -> torch.Tensor | None:
    """Sum of the ``aux_loss`` tensors left by the last forward (SMoE App. C.1 losses, V-MoE losses)."""
    terms = [m.aux_loss for m in model.modules() if isinstance(getattr(m, "aux_loss", None), torch.Tensor)]
    return torch.stack([t.reshape(()) for t in terms]).sum() if terms else None


OPTIMIZERS: dict[str, type[torch.optim.Optimizer]] = {"adam": torch.optim.Adam, "sgd": torch.optim.SGD}
"""``training.optimizer`` choices."""

LR_SCHEDULES = ("plateau", "cosine")
"""``training.lr_schedule`` choices: ``plateau`` (ReduceLROnPlateau on ``val_loss``, ``plateau_factor`` and
``plateau_patience``; the default of ``smoe train``) or ``cosine`` (linear warm-up over ``warmup_steps``, then
cosine decay from ``lr`` to ``lr × min_lr_factor`` at the last optimizer step, ``trainer.max_steps``)."""


def cosine_lr_factor(step: int, total: int, warmup: int = 0, min_factor: float = 0.0) -> float:
    """Learning-rate multiplier of optimizer step ``step`` (0-based) of ``total``: ``(step + 1) / warmup``
    during the warm-up, then ``min_factor + (1 − min_factor) · (1 + cos(π p)) / 2`` with ``p`` going from 0
    (first step after the warm-up) to 1 (step ``total``); constant ``min_factor`` beyond ``total``."""
    if warmup > 0 and step < warmup:
        return (step + 1) / warmup
    span = total - warmup
    if span <= 0:
        return 1.0
    progress = min(1.0, (step - warmup) / span)
    return min_factor + (1.0 - min_factor) * 0.5 * (1.0 + math.cos(math.pi * progress))


def parameter_groups(model: nn.Module, lr: float, gate_lr_factor: float = 1.0) -> list[dict[str, Any]]:
    """Optimizer groups: the trainable gate parameters (tensor-routing and other SMoE gates) at
    ``lr × gate_lr_factor``, everything else at ``lr``; one group when the factor is 1 (or no gate trains), so
    a default run's optimizer state is what it always was."""
    gate_ids = {id(p) for m in model.modules() if isinstance(m, SpatialMoE2d) for p in m.gate.parameters()}
    trainable = [p for p in model.parameters() if p.requires_grad]
    gates = [p for p in trainable if id(p) in gate_ids]
    if gate_lr_factor == 1.0 or not gates:
        return [{"params": trainable}]
    return [{"params": [p for p in trainable if id(p) not in gate_ids]},
            {"params": gates, "lr": lr * gate_lr_factor, "name": "gates"}]


class MetadataCheckpointMixin:
    """Adds ``self.metadata`` (a JSON-able dict) and the format version to every checkpoint; refuses to
    load a checkpoint of another format version. Mix in before a LightningModule."""

    metadata: dict[str, Any]

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        # plain data only (numpy → lists, paths → str): the file then loads with weights_only=True anywhere
        checkpoint[METADATA_KEY] = plain({"format_version": FORMAT_VERSION, **self.metadata})

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        check_checkpoint(checkpoint)


class SMoETrainingModule(MetadataCheckpointMixin, L.LightningModule):
    """Base of the weather modules: ``self.model`` plus the training plumbing every task shares.

    Adds the auxiliary routing losses (× ``aux_weight``) to the task loss (the RC loss and damping act
    inside the SMoE layers' backward), keeps the SMoE loss scale in sync with an fp16 GradScaler, logs the
    RC loss (epoch mean over every ``routing_log_every``-th batch), uses Adam (or plain SGD,
    ``optimizer="sgd"``: updates linear in the gradient, which tests of gradient reduction need) with
    ReduceLROnPlateau on ``val_loss`` or, ``lr_schedule="cosine"``, warm-up + cosine decay per optimizer step
    (:data:`LR_SCHEDULES`). ``freeze_batchnorm`` keeps every BatchNorm
    in eval mode (running statistics, affine parameters still trained): per-rank batch statistics then no
    longer differ between DDP and one process.
    """

    def __init__(
        self,
        model: nn.Module,
        lr: float = _DEFAULTS.lr,
        plateau_factor: float = _DEFAULTS.plateau_factor,
        plateau_patience: int = _DEFAULTS.plateau_patience,
        aux_weight: float = _DEFAULTS.aux_weight,
        freeze_batchnorm: bool = _DEFAULTS.freeze_batchnorm,
        metadata: dict[str, Any] | None = None,
        optimizer: str = _DEFAULTS.optimizer,
        gate_lr_factor: float = _DEFAULTS.gate_lr_factor,
        routing_log_every: int = _DEFAULTS.routing_log_every,
        lr_schedule: str = _DEFAULTS.lr_schedule,
        warmup_steps: int = _DEFAULTS.warmup_steps,
        min_lr_factor: float = _DEFAULTS.min_lr_factor,
    ) -> None:
        super().__init__()
        if lr_schedule not in LR_SCHEDULES:
            raise ValueError(f"training.lr_schedule must be one of {', '.join(LR_SCHEDULES)}, got {lr_schedule!r}")
        if int(warmup_steps) < 0 or not 0.0 <= float(min_lr_factor) <= 1.0:
            raise ValueError(f"training.warmup_steps must be >= 0 and training.min_lr_factor in [0, 1], got "
                             f"{warmup_steps} and {min_lr_factor}")
        self.lr_schedule, self.warmup_steps, self.min_lr_factor = str(lr_schedule), int(warmup_steps), float(
            min_lr_factor)
        if optimizer not in OPTIMIZERS:
            raise ValueError(f"training.optimizer must be one of {', '.join(OPTIMIZERS)}, got {optimizer!r}")
        self.optimizer_name = optimizer
        self.model = model
        self.lr, self.plateau_factor, self.plateau_patience = (
            float(lr),
            float(plateau_factor),
            int(plateau_patience),
        )
        self.aux_weight, self.freeze_batchnorm = float(aux_weight), bool(freeze_batchnorm)
        if not gate_lr_factor > 0:
            raise ValueError(f"training.gate_lr_factor must be > 0, got {gate_lr_factor}")
        self.gate_lr_factor = float(gate_lr_factor)
        if int(routing_log_every) < 1:
            raise ValueError(f"training.routing_log_every must be an integer >= 1, got {routing_log_every}")
        self.routing_log_every = int(routing_log_every)
        self.metadata = dict(metadata or {})

    def train(self, mode: bool = True) -> SMoETrainingModule:
        super().train(mode)
        if mode and self.freeze_batchnorm:
            self._freeze_batchnorm()
        return self

    def _freeze_batchnorm(self) -> None:
        for m in self.modules():
            if isinstance(m, nn.modules.batchnorm._BatchNorm):
                m.eval()

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        if self.freeze_batchnorm:  # Lightning restores per-module modes after validation: enforce eval
            self._freeze_batchnorm()

    def with_aux(self, loss: torch.Tensor) -> torch.Tensor:
        """``loss`` + aux_weight × the auxiliary routing losses of the last forward (if any)."""
        aux = auxiliary_loss(self.model)
        if aux is None:
            return loss
        self.log("train_aux", aux, on_step=False, on_epoch=True, sync_dist=True)
        return loss + self.aux_weight * aux

    def on_before_backward(self, loss: torch.Tensor) -> None:
        scaler = getattr(self.trainer.precision_plugin, "scaler", None)
        set_loss_scale(self.model, scaler.get_scale() if scaler is not None else 1.0)

    def logs_routing(self, batch_idx: int) -> bool:
        """Whether the per-batch routing values (``train_rc``, :class:`RoutingDiagnostics` sums) are read after
        training batch ``batch_idx``: every ``routing_log_every``-th batch of an epoch, from its first. They are
        computed only when read (the RC loss is a pass over every gate), so their epoch means are over these
        batches; training itself does not depend on them."""
        return batch_idx % self.routing_log_every == 0

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        if not self.logs_routing(batch_idx):
            return
        rc = rc_loss_value(self.model)
        if rc is not None:
            self.log("train_rc", rc, on_step=False, on_epoch=True, sync_dist=True)

    def schedule_steps(self) -> int:
        """Optimizer steps the cosine schedule spans: ``trainer.max_steps``, else Lightning's estimate."""
        trainer = self.trainer
        if trainer.max_steps is not None and trainer.max_steps > 0:
            return int(trainer.max_steps)
        total = trainer.estimated_stepping_batches
        if not math.isfinite(total):
            raise ValueError("training.lr_schedule=cosine needs a finite run: set trainer.max_steps (or max_epochs)")
        return int(total)

    def configure_optimizers(self) -> dict[str, Any]:
        optimizer = OPTIMIZERS[self.optimizer_name](parameter_groups(self.model, self.lr, self.gate_lr_factor),
                                                     lr=self.lr)
        if self.lr_schedule == "cosine":
            total, warmup, floor = self.schedule_steps(), self.warmup_steps, self.min_lr_factor
            cosine = torch.optim.lr_scheduler.LambdaLR(
                optimizer, lambda step: cosine_lr_factor(step, total, warmup, floor))
            # stepped after every optimizer step; its state (the step count) is in last.ckpt, so a resume continues
            return {"optimizer": optimizer, "lr_scheduler": {"scheduler": cosine, "interval": "step"}}
        scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(
            optimizer, factor=self.plateau_factor, patience=self.plateau_patience
        )
        # strict=False: with validation every N steps (trainer.val_check_interval, `smoe study`) an epoch can end
        # before the first validation; the plateau scheduler then waits for a val_loss instead of aborting
        # the run (Lightning's "Skipping learning rate update" warning for it is filtered below).
        return {"optimizer": optimizer,
                "lr_scheduler": {"scheduler": scheduler, "monitor": "val_loss", "strict": False}}
