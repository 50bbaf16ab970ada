"""``smoe train --config X [--init-from CKPT] [--resume CKPT] key=value ...``: one entry for every task.

A config names ``task`` (``weatherbench``, ``postprocess``, ``heat``, ``vision``) and has the blocks ``data``,
``model``, ``training`` (lr, optimizer, plateau, early stopping, aux_weight, freeze_batchnorm), ``trainer``
(``lightning.Trainer`` arguments: devices, num_nodes, strategy, accelerator, max_epochs, max_steps,
precision, ...), ``seed`` and ``output_dir``; it is checked against its task's schema
(:mod:`smoeweather.training.schema`) before anything runs. Outputs (rank 0 only):
``<output_dir>/checkpoints/best-*.ckpt`` (best val_loss), ``last.ckpt`` (rewritten after EVERY epoch and
at the end of a fit, e.g. ``trainer.max_steps`` inside an epoch, so ``--resume`` never rolls back),
``config.yaml`` (the resolved config) and CSV logs under ``<output_dir>/logs``.

Layout: :mod:`~smoeweather.training.stores` (store creation, splits), :mod:`~smoeweather.training.tasks`
(one builder per task), :mod:`~smoeweather.training.init` (``--init-from``), this module (the trainer and
:func:`train`; the others' names are re-exported here), the CLI in :mod:`smoeweather.commands.train`.

Data stores are created when missing and the config says how: ``data.world`` (the embedded default
world, :func:`pipelines.world.generate_world` arguments), ``data.sources`` (canonical netCDF files, e.g.
the GCM world, merged along time) or ``data.generate`` (heat diffusion).
"""

from __future__ import annotations

import json
import logging
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import EarlyStopping, ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger
from lightning.pytorch.utilities import rank_zero_only

from pipelines.progress import interactive
from smoeweather.models.checkpoint_io import read_checkpoint
from smoeweather.models.loader import canonical_task, check_checkpoint
from smoeweather.training.callbacks import (
    BatchSeed,
    EpochLines,
    LastCheckpoint,
    SamplesPerSecond,
    SaveResolvedConfig,
)
from smoeweather.training.datamodule import SplitDataModule
from smoeweather.training.diagnostics import RoutingDiagnostics
from smoeweather.training.init import init_weights
from smoeweather.training.schema import validate_train_config
from smoeweather.training.tasks import build


class _WithoutLibraryChatter(logging.Filter):
    """Drops log records of a library whose message starts with one of ``prefixes``; all others pass."""

    def __init__(self, *prefixes: str) -> None:
        super().__init__()
        self.prefixes = prefixes

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(self.prefixes)


_QUIET_LOGGERS = {
    # Lightning 2.6 advertises litlogger/litmodels ("💡 Tip: For seamless cloud ...") at INFO on every fit,
    # through whichever of these two loggers lightning_utilities' rank_zero_info was pointed at last
    "lightning.pytorch.utilities.rank_zero": ("💡 Tip:",),
    "lightning.fabric.utilities.rank_zero": ("💡 Tip:",),
    # Lightning logs this at INFO whenever a checkpoint is saved without ``weights_only`` (every epoch here)
    "lightning.pytorch.trainer.connectors.checkpoint_connector": ("`weights_only` was not set",),
}
for _name, _prefixes in _QUIET_LOGGERS.items():
    _logger = logging.getLogger(_name)
    if not any(isinstance(f, _WithoutLibraryChatter) for f in _logger.filters):
        _logger.addFilter(_WithoutLibraryChatter(*_prefixes))

# torch (2.13 here) deprecates ``LeafSpec``, which Lightning's own pytree helper still builds on every fit: a
# FutureWarning for Lightning's code, not the user's
warnings.filterwarnings(
    "ignore", message=r"`isinstance\(treespec, LeafSpec\)` is deprecated", category=FutureWarning,
    module="lightning",
)

__all__ = ["TrainResult", "build_trainer", "train"]


@dataclass
class TrainResult:
    """What :func:`train` leaves behind."""

    trainer: L.Trainer
    module: L.LightningModule
    datamodule: SplitDataModule
    output_dir: Path
    best_checkpoint: str
    last_checkpoint: str


def build_trainer(
    cfg: dict[str, Any],
    output_dir: Path,
    batch_size_fn: Callable[[Any], int] | None = None,
    extra_callbacks: list[L.Callback] | None = None,
) -> L.Trainer:
    """A Lightning Trainer from ``cfg['trainer']`` with best/last checkpoints, early stopping, per-batch
    reseeding, throughput logging and the resolved config file."""
    t = cfg.get("training", {})
    checkpoint = ModelCheckpoint(
        dirpath=output_dir / "checkpoints",
        filename="best-{epoch:03d}",
        monitor="val_loss",
        mode="min",
        save_top_k=1,
        save_last=False,  # LastCheckpoint writes last.ckpt after EVERY epoch (save_last only with a new best)
    )
    callbacks: list[L.Callback] = [
        checkpoint,
        LastCheckpoint(output_dir / "checkpoints"),
        # checked after each validation only: a fit that ends inside an epoch (trainer.max_steps) has no new
        # val_loss at that epoch's end, which crashed the default train-epoch-end check
        EarlyStopping(monitor="val_loss", mode="min", patience=int(t.get("early_stopping_patience", 5)),
                      check_on_train_epoch_end=False),
        BatchSeed(int(cfg.get("seed", 0))),
        SamplesPerSecond(batch_size_fn),
        SaveResolvedConfig(cfg, output_dir),
        RoutingDiagnostics(),
        *(extra_callbacks or []),
    ]
    tcfg = {"enable_model_summary": False, **cfg.get("trainer", {})}
    if "enable_progress_bar" not in tcfg and not interactive():  # piped: a line per epoch, not a redrawn bar
        tcfg["enable_progress_bar"] = False
        callbacks.append(EpochLines())
    return L.Trainer(
        default_root_dir=output_dir, callbacks=callbacks, logger=CSVLogger(output_dir, name="logs"), **tcfg
    )


def train(
    cfg: dict[str, Any],
    init_from: str | Path | None = None,
    resume: str | Path | None = None,
    extra_callbacks: list[L.Callback] | None = None,
) -> TrainResult:
    """Seed, build, optionally initialise from ``init_from``, and fit (resuming from ``resume``)."""
    cfg = json.loads(json.dumps(cfg, default=str))  # plain types only (YAML dates → strings): safe to pickle
    cfg["task"] = canonical_task(cfg.get("task"))  # `ens10` → `postprocess` (DeprecationWarning)
    validate_train_config(cfg)  # unknown keys / wrong types: an error, not silently ignored
    for given in (init_from, resume):  # read as data before anything is built or written: a crafted file is
        if given is not None:  # refused here (UnsafeCheckpointError naming it) and no output directory appears
            check_checkpoint(read_checkpoint(given), str(given))
    seed = int(cfg.get("seed", 0))
    L.seed_everything(seed, workers=True, verbose=False)
    output_dir = Path(cfg.get("output_dir") or f"runs/{cfg.get('task')}")
    data, module = build(cfg)
    if init_from is not None:
        report = init_weights(module.model, init_from)
        module.metadata["init_from"] = str(init_from)
        rank_zero_only(print)(f"smoe train: initialised from {init_from}: {report}")
    trainer = build_trainer(cfg, output_dir, extra_callbacks=extra_callbacks)
    # Lightning reads the resume file again itself: with weights_only=True, its restricted unpickler too
    trainer.fit(module, datamodule=data, ckpt_path=str(resume) if resume is not None else None, weights_only=True)
    checkpoint = trainer.checkpoint_callback
    last = next(c for c in trainer.checkpoint_callbacks if isinstance(c, LastCheckpoint))
    return TrainResult(trainer, module, data, output_dir, checkpoint.best_model_path, last.last_model_path)
