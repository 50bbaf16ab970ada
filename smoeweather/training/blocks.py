"""The typed blocks of a ``smoe train`` config: one dataclass per block, each default and bound set once, here.

:class:`TrainingSettings` (``training``), :class:`LoaderSettings` (the loader keys of ``data``) and
:class:`ModelBlock` (``model``: the network's name and keywords). Parsed and validated by
:func:`smoeweather.config.parse_settings`; put together in :class:`smoeweather.training.settings.TrainConfig`.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from smoeweather.config import Bounded, parse_settings, setting, settings_specs

ROUTING_LOG_EVERY = 10
"""Default ``training.routing_log_every``: the logged per-batch routing values (RC loss, flagged share, label
information) are read on every 10th training batch. Reading them costs a pass over every gate, 5–6 % of an
SMoE-U-Net 16/32/64 ``smoe train`` step on one CPU thread (benchmarks/postprocess_train_loop.py)."""


@dataclass(frozen=True)
class TrainingSettings:
    """The ``training`` block: optimiser, learning-rate schedule, early stopping and routing losses."""

    lr: float = setting(1e-3, gt=0, doc="learning rate")
    plateau_factor: float = setting(0.2, gt=0, lt=1, doc="ReduceLROnPlateau factor")
    plateau_patience: int = setting(2, ge=0, doc="validations without improvement before the rate drops")
    lr_schedule: Literal["plateau", "cosine"] = setting("plateau", doc="plateau, or warm-up + cosine decay")
    warmup_steps: int = setting(0, ge=0, doc="cosine: linear warm-up over the first N optimizer steps")
    min_lr_factor: float = setting(0.0, ge=0, le=1, doc="cosine: the last step's rate as a fraction of lr")
    early_stopping_patience: int = setting(5, ge=0, doc="validations without improvement before stopping")
    aux_weight: float = setting(0.01, ge=0, doc="weight of the auxiliary routing losses")
    freeze_batchnorm: bool = setting(False, doc="BatchNorm in eval mode (running statistics)")
    optimizer: Literal["adam", "sgd"] = setting("adam", doc="adam, or plain sgd")
    diagnose_error_scale: bool = setting(False, doc="measure dL/dy at the SMoE layers")
    gate_lr_factor: float = setting(1.0, gt=0, doc="learning rate of the SMoE gates = lr × this")
    routing_log_every: int = setting(ROUTING_LOG_EVERY, ge=1, doc="read routing values every N batches")
    loss: Literal["mse", "crps", "gaussian_crps"] | None = setting(
        None, example="crps", doc="ensemble models: mse, crps or gaussian_crps (default: per model)")
    crps_alpha: float = setting(0.0, ge=0, le=1, doc="almost-fair CRPS weight on the fair score")

    def module_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of :class:`~smoeweather.training.base.SMoETrainingModule` from this block."""
        keys = ("lr", "plateau_factor", "plateau_patience", "aux_weight", "freeze_batchnorm", "optimizer",
                "gate_lr_factor", "routing_log_every", "lr_schedule", "warmup_steps", "min_lr_factor")
        return {k: getattr(self, k) for k in keys}


@dataclass(frozen=True)
class LoaderSettings:
    """The loader keys of every task's ``data`` block (the rest of ``data`` is the task's own)."""

    batch_size: int | None = setting(None, example=32, ge=1, doc="samples per batch (default: per task)")
    num_workers: int = setting(0, ge=0, doc="data-loader worker processes")
    sampler: Literal["random", "time_blocks"] | None = setting(None, example="random",
                                                              doc="random, or blocks of consecutive times")
    block_size: int | None = setting(None, example=8, ge=1, doc="time_blocks: samples per block")

    KEYS = ("batch_size", "num_workers", "sampler", "block_size")

    @classmethod
    def of(cls, data: Mapping[str, Any] | None) -> LoaderSettings:
        """The loader keys of a ``data`` block, validated."""
        data = data or {}
        return parse_settings(cls, {k: data[k] for k in cls.KEYS if k in data}, "data")


def uses_land_sea_prior(model: Mapping[str, Any]) -> bool:
    """Whether the network of a ``model`` block needs a land-sea map: the gate prior of its SMoE layers."""
    from smoeweather.models.ensemble import uses_land_sea_prior as uses

    return uses(model)


@dataclass(frozen=True)
class ModelBlock:
    """The ``model`` block: ``name`` picks the network; ``params`` are its constructor's keywords (checked
    against that constructor's keys and type hints by the task's schema)."""

    name: str | None
    params: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, model: Mapping[str, Any] | None) -> ModelBlock:
        model = dict(model or {})
        return cls(model.pop("name", None), model)

    @property
    def uses_land_sea_prior(self) -> bool:
        return uses_land_sea_prior(self.to_dict())

    def to_dict(self) -> dict[str, Any]:
        return {**({"name": self.name} if self.name is not None else {}), **copy.deepcopy(self.params)}

def loader_specs(keys: tuple[str, ...] = LoaderSettings.KEYS) -> dict[str, Any]:
    """Schema specs (:class:`~smoeweather.config.Block`) of the loader keys of ``data``: a number of the wrong
    type or out of bounds names the key (``data.batch_size`` must be a number here, not null)."""
    specs: dict[str, Any] = settings_specs(LoaderSettings, keys)
    if "batch_size" in keys:
        specs["batch_size"] = Bounded((int,), example=32, ge=1)
    return specs


def training_settings(cfg: Mapping[str, Any]) -> TrainingSettings:
    """The typed ``training`` block of a config mapping as written (a checkpoint's ``config``; a
    :class:`~smoeweather.training.settings.TrainConfig` has it as ``.training``)."""
    return parse_settings(TrainingSettings, cfg.get("training"), "training")
