"""``smoe train --config X [--init-from CKPT] [--resume CKPT] key=value ...``: one entry for every task.

A config names ``task`` (``weatherbench``, ``postprocess``, ``heat``, ``vision``) and has the blocks ``data``,
``model``, ``training`` (lr, optimizer, plateau, early stopping, aux_weight, freeze_batchnorm), ``trainer``
(``lightning.Trainer`` arguments: devices, num_nodes, strategy, accelerator, max_epochs, max_steps,
precision, ...), ``seed`` and ``output_dir``; it is checked against its task's schema
(:mod:`smoeweather.training.schema`) before anything runs. Outputs (rank 0 only):
``<output_dir>/checkpoints/best-*.ckpt`` (best val_loss), ``last.ckpt`` (rewritten after EVERY epoch and
at the end of a fit, e.g. ``trainer.max_steps`` inside an epoch, so ``--resume`` never rolls back),
``config.yaml`` (the resolved config) and the logs of ``trainer.logger``'s experiment trackers: by default CSV
under ``<output_dir>/logs``; TensorBoard, MLflow, W&B on request (:mod:`~smoeweather.training.trackers`).

Layout: :mod:`~smoeweather.training.stores` (store creation, splits), :mod:`~smoeweather.training.tasks`
(one builder per task), :mod:`~smoeweather.training.init` (``--init-from``), this module (the trainer and
:func:`train`; the others' names are re-exported here), the CLI in :mod:`smoeweather.commands.train`.

Data stores are created when missing and the config says how: ``data.world`` (the embedded default
world, :func:`pipelines.world.generate_world` arguments), ``data.sources`` (canonical netCDF files, e.g.
the GCM world, merged along time) or ``data.generate`` (heat diffusion).
"""

from __future__ import annotations

import logging
import shutil
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import EarlyStopping, ModelCheckpoint
from lightning.pytorch.utilities import rank_zero_only

from pipelines.progress import interactive
from smoeweather.config import flatten
from smoeweather.models.checkpoint_io import read_checkpoint
from smoeweather.models.loader import canonical_task, check_checkpoint
from smoeweather.training.callbacks import (
    AtomicCheckpointIO,
    BatchSeed,
    LastCheckpoint,
    PipedProgress,
    SamplesPerSecond,
    SaveResolvedConfig,
)
from smoeweather.training.datamodule import SplitDataModule
from smoeweather.training.diagnostics import RoutingDiagnostics
from smoeweather.training.init import init_weights
from smoeweather.training.schema import check_accelerator
from smoeweather.training.settings import TrainConfig
from smoeweather.training.tasks import build
from smoeweather.training.trackers import TrackerLogging, build_loggers


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
    cfg: TrainConfig | Mapping[str, Any],
    output_dir: Path,
    batch_size_fn: Callable[[Any], int] | None = None,
    extra_callbacks: list[L.Callback] | None = None,
) -> L.Trainer:
    """A Lightning Trainer from ``cfg.trainer`` with best/last checkpoints (each written atomically,
    :class:`~smoeweather.training.callbacks.AtomicCheckpointIO`), early stopping, per-batch reseeding,
    throughput logging, the resolved config file and the loggers of ``trainer.logger``."""
    cfg = TrainConfig.from_dict(cfg)
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
        EarlyStopping(monitor="val_loss", mode="min", patience=cfg.training.early_stopping_patience,
                      check_on_train_epoch_end=False),
        BatchSeed(cfg.seed),
        SamplesPerSecond(batch_size_fn),
        SaveResolvedConfig(cfg.to_dict(), output_dir),
        RoutingDiagnostics(),
        TrackerLogging(cfg.to_dict(), cfg.trackers, output_dir),
        *(extra_callbacks or []),
    ]
    tcfg = {"enable_model_summary": False, **cfg.trainer}
    given = tcfg.get("plugins")
    given = [] if given is None else list(given) if isinstance(given, list | tuple) else [given]
    tcfg["plugins"] = [*given, AtomicCheckpointIO()]  # every checkpoint written whole or not at all
    if "enable_progress_bar" not in tcfg and not interactive():  # piped: lines, not a redrawn bar
        tcfg["enable_progress_bar"] = False
        callbacks.append(PipedProgress())
    loggers = build_loggers(cfg.trackers, output_dir)
    return L.Trainer(default_root_dir=output_dir, callbacks=callbacks, logger=loggers or False, **tcfg)


RESUME_KEYS = ("model", "data.variables", "data.target_variables", "data.input_offsets_h", "data.lead_h",
               "data.constants", "data.static", "data.leads_h")
"""Config keys that shape the network: ``--resume`` refuses a config that changes one of them."""


def check_resume_config(meta: Mapping[str, Any], cfg: TrainConfig, where: str) -> None:
    """ValueError (one line) when ``cfg`` sets a key of :data:`RESUME_KEYS` that the checkpoint's own config
    (``meta["config"]``) sets to another value, before anything is built."""
    old = meta.get("config")
    if not isinstance(old, Mapping):
        return
    if canonical_task(old.get("task"), where) != cfg.task:
        raise ValueError(f"--resume {where} is a {old.get('task')!r} checkpoint, the config is task {cfg.task!r}: "
                         "resume with the checkpoint's own config.yaml, or train afresh without --resume")
    was, now = flatten(old), flatten(cfg.raw)
    for key in sorted(set(was) & set(now)):
        if key.startswith(RESUME_KEYS) and was[key] != now[key]:
            raise ValueError(f"--resume {where} was trained with {key}={was[key]!r}, the config says {now[key]!r}: "
                             f"resume with the checkpoint's config (set {key}={was[key]!r}, or use its run's "
                             "config.yaml), or train afresh without --resume")


def check_resume_weights(checkpoint: Mapping[str, Any], module: L.LightningModule, where: str) -> None:
    """ValueError (one line) naming the first weight whose name or shape differs between ``checkpoint`` and
    the module built from the config (instead of Lightning's size-mismatch traceback)."""
    saved = checkpoint.get("state_dict") or {}
    built = module.state_dict()
    fix = "resume with the checkpoint's own config.yaml, or train afresh without --resume"
    for name in sorted(set(saved) | set(built)):
        if name not in built or name not in saved:
            side = "the checkpoint only" if name not in built else "the config's model only"
            raise ValueError(f"--resume {where} does not fit the config: weight {name!r} is in {side}; {fix}")
        have, want = tuple(saved[name].shape), tuple(built[name].shape)
        if have != want:
            raise ValueError(f"--resume {where} does not fit the config: weight {name!r} has shape {have} in the "
                             f"checkpoint, {want} in the model built from the config; {fix}")


@rank_zero_only
def remove_unfinished_run(output_dir: Path) -> None:
    """Remove a run folder this run created when it failed before writing any checkpoint (its config.yaml and
    logs/ alone are no run): a failed run leaves nothing new behind. One with a checkpoint stays, to resume."""
    if output_dir.is_dir() and not any(output_dir.rglob("*.ckpt")):
        shutil.rmtree(output_dir, ignore_errors=True)


def train(
    cfg: TrainConfig | Mapping[str, Any],
    init_from: str | Path | None = None,
    resume: str | Path | None = None,
    extra_callbacks: list[L.Callback] | None = None,
) -> TrainResult:
    """Validate ``cfg`` in full, seed, build, optionally initialise from ``init_from``, and fit (resuming from
    ``resume``)."""
    cfg = TrainConfig.from_dict(cfg)  # unknown keys / wrong types / bounds: an error before anything runs
    check_accelerator(cfg.trainer.get("accelerator"), here=True)  # tpu without torch_xla, cuda on a CPU build
    resumed = None
    for given in (init_from, resume):  # read as data before anything is built or written: a crafted file is
        if given is not None:  # refused here (UnsafeCheckpointError naming it) and no output directory appears
            checkpoint = read_checkpoint(given)
            meta = check_checkpoint(checkpoint, str(given))
            if given is resume:
                check_resume_config(meta, cfg, str(given))
                resumed = checkpoint
    L.seed_everything(cfg.seed, workers=True, verbose=False)
    output_dir = cfg.run_dir
    data, module = build(cfg)
    if resumed is not None:
        check_resume_weights(resumed, module, str(resume))
    if init_from is not None:
        report = init_weights(module.model, init_from)
        module.metadata["init_from"] = str(init_from)
        rank_zero_only(print)(f"smoe train: initialised from {init_from}: {report}")
    created = not Path(output_dir).exists()
    try:
        trainer = build_trainer(cfg, output_dir, extra_callbacks=extra_callbacks)
        with warnings.catch_warnings():
            if resume is not None:  # a resumed run writes on into its own checkpoints folder: not empty, by design
                warnings.filterwarnings("ignore", message=r"Checkpoint directory .* exists and is not empty")
            # Lightning reads the resume file again itself: with weights_only=True, its restricted unpickler too
            trainer.fit(module, datamodule=data, ckpt_path=str(resume) if resume is not None else None,
                        weights_only=True)
    except BaseException:
        if created:
            remove_unfinished_run(Path(output_dir))
        raise
    checkpoint = trainer.checkpoint_callback
    last = next(c for c in trainer.checkpoint_callbacks if isinstance(c, LastCheckpoint))
    return TrainResult(trainer, module, data, output_dir, checkpoint.best_model_path, last.last_model_path)
