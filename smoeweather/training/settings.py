"""Typed ``smoe train`` configuration, validated once: :func:`load_config` / :meth:`TrainConfig.from_dict`.

A whole config is checked before anything runs (unknown keys with did-you-mean at every level, types, bounds,
the model's keys: :mod:`smoeweather.training.schema`) and returned as a :class:`TrainConfig`: ``task``,
``seed``, ``output_dir`` and the blocks ``data`` (its loader part typed, :class:`LoaderSettings`; the rest per
task), ``model`` (:class:`ModelBlock`), ``training`` (:class:`TrainingSettings`) and ``trainer``
(``lightning.Trainer`` keywords) with its ``logger`` parsed apart (:attr:`TrainConfig.trackers`,
:mod:`smoeweather.training.trackers`). Defaults and bounds live in :mod:`smoeweather.training.blocks`.
:meth:`TrainConfig.to_dict` gives the config exactly as written (with overrides), which is what checkpoints and
``config.yaml`` record. A :class:`TrainConfig` is read by attribute only (it is no mapping); the blocks whose keys
belong to someone else stay plain dicts, on purpose: ``data`` (each task's own keys), ``model.params`` (the
registered network's keywords) and ``trainer`` (``lightning.Trainer``'s keywords).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from smoeweather.config import ConfigError, parse_settings, read_config
from smoeweather.training.blocks import LoaderSettings, ModelBlock, TrainingSettings, training_settings
from smoeweather.training.schema import validate_train_config
from smoeweather.training.trackers import TrackerSettings, parse_trackers

__all__ = ["LoaderSettings", "ModelBlock", "TrainConfig", "TrainingSettings", "load_config", "training_settings"]


@dataclass(frozen=True)
class TrainConfig:
    """A validated ``smoe train`` config (see the module docstring), read by attribute; ``raw`` is the config
    as written (:meth:`to_dict` copies it)."""

    task: str
    raw: dict[str, Any]
    seed: int = 0
    output_dir: str | None = None
    data: dict[str, Any] = field(default_factory=dict)
    """The ``data`` block, a plain dict: its keys are the task's own (the loader keys are typed in :attr:`loader`)."""
    loader: LoaderSettings = field(default_factory=LoaderSettings)
    model: ModelBlock = field(default_factory=lambda: ModelBlock(None))
    training: TrainingSettings = field(default_factory=TrainingSettings)
    trainer: dict[str, Any] = field(default_factory=dict)
    """``lightning.Trainer`` keywords of the ``trainer`` block, less ``logger`` (:attr:`trackers`)."""
    trackers: tuple[TrackerSettings, ...] = field(default_factory=lambda: parse_trackers(None))
    """The experiment trackers of ``trainer.logger`` (default: csv)."""

    @classmethod
    def from_dict(cls, cfg: Mapping[str, Any] | TrainConfig) -> TrainConfig:
        """Validate ``cfg`` in full (:func:`~smoeweather.training.schema.validate_train_config`) and type it.
        A deprecated task alias is replaced (DeprecationWarning); YAML dates become strings."""
        if isinstance(cfg, TrainConfig):
            return cfg
        if not isinstance(cfg, Mapping):
            raise ConfigError(f"a training config must be a mapping, got {type(cfg).__name__}")
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
            trainer={k: v for k, v in (raw.get("trainer") or {}).items() if k != "logger"},
            trackers=parse_trackers((raw.get("trainer") or {}).get("logger")),
        )

    @property
    def run_dir(self) -> Path:
        """Where the run writes: ``output_dir``, default ``runs/<task>``."""
        return Path(self.output_dir or f"runs/{self.task}")

    def to_dict(self) -> dict[str, Any]:
        """The config as written (a deep copy): what ``config.yaml`` and checkpoints record."""
        return copy.deepcopy(self.raw)


def load_config(path: str | Path, overrides: list[str] | tuple[str, ...] = ()) -> TrainConfig:
    """A ``smoe train`` config (a YAML path or a built-in name, with ``a.b=value`` overrides: read by
    :func:`~smoeweather.config.read_config`), validated in full and typed; ConfigError naming the key otherwise."""
    return TrainConfig.from_dict(read_config(path, overrides))
