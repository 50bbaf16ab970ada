"""Typed ``smoe train`` configuration: one dataclass per block, each default and bound set once, here.

:func:`load_train_config` (or :meth:`TrainConfig.from_dict`) validates a whole config before anything runs
(unknown keys with did-you-mean at every level, types, bounds, the model's keys) and returns a
:class:`TrainConfig`: ``task``, ``seed``, ``output_dir`` and the blocks ``data`` (its loader part typed,
:class:`LoaderSettings`; the rest per task, checked by :mod:`smoeweather.training.schema`), ``model``
(:class:`ModelBlock`), ``training`` (:class:`TrainingSettings`) and ``trainer`` (``lightning.Trainer``
keywords). :meth:`TrainConfig.to_dict` gives the config exactly as written (with overrides), which is what
checkpoints and ``config.yaml`` record; a :class:`TrainConfig` also reads as that mapping (``cfg["data"]``)
for code that takes a dict.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from smoeweather.config import ConfigError, load_config, parse_settings, setting

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


@dataclass(frozen=True)
class TrainConfig(Mapping[str, Any]):
    """A validated ``smoe train`` config (see the module docstring). Reads as the raw mapping too."""

    task: str
    raw: dict[str, Any]
    seed: int = 0
    output_dir: str | None = None
    data: dict[str, Any] = field(default_factory=dict)
    loader: LoaderSettings = field(default_factory=LoaderSettings)
    model: ModelBlock = field(default_factory=lambda: ModelBlock(None))
    training: TrainingSettings = field(default_factory=TrainingSettings)
    trainer: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, cfg: Mapping[str, Any] | TrainConfig) -> TrainConfig:
        """Validate ``cfg`` in full (:func:`~smoeweather.training.schema.validate_train_config`) and type it.
        A deprecated task alias is replaced (DeprecationWarning); YAML dates become strings."""
        if isinstance(cfg, TrainConfig):
            return cfg
        if not isinstance(cfg, Mapping):
            raise ConfigError(f"a training config must be a mapping, got {type(cfg).__name__}")
        from smoeweather.training.schema import validate_train_config

        raw = json.loads(json.dumps(dict(cfg), default=str))  # plain types only: safe to pickle and compare
        validate_train_config(raw)  # sets raw["task"] to the canonical name
        return cls(
            task=raw["task"],
            raw=raw,
            seed=int(raw.get("seed", 0)),
            output_dir=raw.get("output_dir"),
            data=dict(raw.get("data") or {}),
            loader=LoaderSettings.of(raw.get("data")),
            model=ModelBlock.of(raw.get("model")),
            training=parse_settings(TrainingSettings, raw.get("training"), "training"),
            trainer=dict(raw.get("trainer") or {}),
        )

    @property
    def run_dir(self) -> Path:
        """Where the run writes: ``output_dir``, default ``runs/<task>``."""
        return Path(self.output_dir or f"runs/{self.task}")

    def to_dict(self) -> dict[str, Any]:
        """The config as written (a deep copy): what ``config.yaml`` and checkpoints record."""
        return copy.deepcopy(self.raw)

    def __getitem__(self, key: str) -> Any:
        return self.raw[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.raw)

    def __len__(self) -> int:
        return len(self.raw)


def training_settings(cfg: Mapping[str, Any]) -> TrainingSettings:
    """The typed ``training`` block of a config (a :class:`TrainConfig` or a mapping, e.g. a checkpoint's)."""
    if isinstance(cfg, TrainConfig):
        return cfg.training
    return parse_settings(TrainingSettings, cfg.get("training"), "training")


def load_train_config(path: str | Path, overrides: list[str] | tuple[str, ...] = ()) -> TrainConfig:
    """:func:`~smoeweather.config.load_config` of a ``smoe train`` config, validated in full and typed."""
    return TrainConfig.from_dict(load_config(path, overrides))
