"""Small Lightning callbacks: per-batch reseeding (exact resume), ``last.ckpt`` after every epoch, throughput,
the resolved config file; and the checkpoint writer that makes every checkpoint file appear whole or not at all
(:class:`AtomicCheckpointIO`)."""

from __future__ import annotations

import os
import random
import sys
import time
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import torch
import yaml
from lightning.pytorch.callbacks import Checkpoint
from lightning.pytorch.plugins.io import TorchCheckpointIO

from pipelines.progress import StageLines
from smoeweather.io import atomic_path, write_text


class AtomicCheckpointIO(TorchCheckpointIO):
    """Writes every checkpoint of a fit (the best ``best-*.ckpt``, ``last.ckpt``, any ``trainer.save_checkpoint``)
    to a hidden staging file beside it, flushed to disk, then renamed onto its name
    (:func:`smoeweather.io.atomic_path`): a full disk or a kill mid-write leaves the previous checkpoint intact and
    no truncated file. (Lightning's own writer stages in the system temp folder and *copies* it across file
    systems, so a full disk left a truncated ``best-epoch=000.ckpt``.) URLs go to Lightning's writer."""

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any | None = None) -> None:
        if storage_options is not None or "://" in str(path):
            super().save_checkpoint(checkpoint, path, storage_options)
            return
        with atomic_path(Path(path), overwrite=True) as tmp, open(tmp, "wb") as f:
            torch.save(checkpoint, f)
            f.flush()
            os.fsync(f.fileno())


class BatchSeed(L.Callback):
    """Reseed torch / numpy / random before every training batch from (seed, epoch, batch, global rank).

    Dropout masks and gate noise then depend only on these numbers, not on what ran before (validation,
    checkpointing, DataLoader iterators all draw from the global generators at moments that differ
    between an uninterrupted and a resumed run), so a run resumed from a checkpoint continues bit for bit.
    The data order comes from the seeded sampler of :class:`~smoeweather.training.datamodule.SplitDataModule`;
    DataLoader worker seeds are not covered (the datasets here draw no random numbers).
    """

    def __init__(self, seed: int) -> None:
        self.seed = int(seed)

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        key = (
            (self.seed * 1_000_003 + trainer.current_epoch) * 100_003 + batch_idx
        ) * 101 + trainer.global_rank
        s = key % 2**31
        random.seed(s)
        np.random.seed(s)
        torch.manual_seed(s)


class SamplesPerSecond(L.Callback):
    """Logs training throughput ``samples_per_s`` (all ranks together, since the epoch start) to the
    logger and the progress bar; ``batch_size_fn(batch)`` gives the samples of one rank's batch."""

    def __init__(self, batch_size_fn: Any = None) -> None:
        self.batch_size_fn = batch_size_fn or (lambda batch: int(batch[0].shape[0]))
        self._start, self._samples = 0.0, 0

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._start, self._samples = time.perf_counter(), 0

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self._samples += self.batch_size_fn(batch) * trainer.world_size
        elapsed = max(time.perf_counter() - self._start, 1e-9)
        pl_module.log(
            "samples_per_s",
            self._samples / elapsed,
            prog_bar=True,
            on_step=True,
            on_epoch=False,
            rank_zero_only=True,
        )


class SaveResolvedConfig(L.Callback):
    """Writes the resolved config to ``<output_dir>/config.yaml`` (rank 0 only, atomically)."""

    def __init__(self, config: dict[str, Any], output_dir: str | Path) -> None:
        self.config, self.output_dir = config, Path(output_dir)

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.is_global_zero:
            write_text(self.output_dir / "config.yaml", yaml.safe_dump(self.config, sort_keys=False))


class LastCheckpoint(Checkpoint):
    """Writes ``<dirpath>/last.ckpt`` at the end of every training epoch, after a validation inside an epoch,
    and when fit ends (e.g. ``trainer.max_steps`` inside an epoch), whether or not val_loss improved.

    Lightning's ``ModelCheckpoint(save_last=True)`` rewrites ``last.ckpt`` only when it saves a new top-k
    checkpoint, so after non-improving epochs ``--resume last.ckpt`` silently restarted from an older state.
    It is a :class:`Checkpoint`, so Lightning runs it after the other callbacks (and after the best-model
    ``ModelCheckpoint`` listed before it): the file holds their up-to-date state. Written to a temporary
    name and renamed by rank 0 (atomic; on a failed write the temporary file is removed and the previous
    ``last.ckpt`` stays); ``trainer.save_checkpoint`` is collective, so every rank calls it.
    """

    FILENAME = "last.ckpt"

    def __init__(self, dirpath: str | Path) -> None:
        self.dirpath = Path(dirpath)
        self.last_model_path = ""
        self._saved_step = -1

    def _save(self, trainer: L.Trainer) -> None:
        if trainer.state.fn != "fit" or trainer.sanity_checking or trainer.fast_dev_run:
            return
        if trainer.global_step == self._saved_step:
            return
        path = self.dirpath / self.FILENAME
        tmp = self.dirpath / f".{self.FILENAME}.tmp"
        try:
            trainer.save_checkpoint(tmp)  # whole or not at all (AtomicCheckpointIO)
        except BaseException:
            if trainer.is_global_zero:
                tmp.unlink(missing_ok=True)  # a writer that is not atomic: no truncated file left either
            raise
        if trainer.is_global_zero:
            os.replace(tmp, path)
        trainer.strategy.barrier("LastCheckpoint")
        self.last_model_path, self._saved_step = str(path), trainer.global_step

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        # the last step of a fit that stops inside an epoch (max_steps): saved HERE, while Lightning's loops
        # still record the epoch as running, so a resume continues the epoch instead of starting the next one
        done = trainer.fit_loop.epoch_loop.batch_progress.current.processed
        if 0 < trainer.max_steps <= trainer.global_step and done < trainer.num_training_batches:
            self._save(trainer)

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._save(trainer)  # after the epoch-end validation and EarlyStopping, like ModelCheckpoint

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.fit_loop.epoch_loop.batch_progress.current.processed < trainer.num_training_batches:
            self._save(trainer)  # validation inside an epoch (val_check_interval < 1)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._save(trainer)


class PipedProgress(L.Callback):
    """Progress of a piped run, in the style of :mod:`pipelines.progress` (stderr, no carriage-return redraws,
    which flood a log file): ``smoe train (N step) ...`` at the start, a line each ``every_percent`` of the
    optimizer steps (with the last train loss), a line per epoch (train and validation loss), and
    ``smoe train: done, N step in T s`` at the end. On a terminal, Lightning's own bar is used instead."""

    def __init__(self, every_percent: float = 5.0) -> None:
        self.every_percent, self.bar = every_percent, None

    @staticmethod
    def total_steps(trainer: L.Trainer) -> int | None:
        """Optimizer steps the fit will take at most: ``max_steps``, else ``max_epochs`` × batches per epoch
        (None when neither bounds it)."""
        batches, epochs = trainer.num_training_batches, trainer.max_epochs
        by_epochs = (int(epochs * batches) if epochs is not None and epochs > 0 and batches not in (None, float("inf"))
                     else None)
        if trainer.max_steps is not None and trainer.max_steps > 0:
            return min(trainer.max_steps, by_epochs) if by_epochs else trainer.max_steps
        return by_epochs

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not trainer.is_global_zero:
            return
        self.bar = StageLines(self.total_steps(trainer), "smoe train", "step", sys.stderr, self.every_percent)
        if trainer.global_step:  # a resumed run starts where its checkpoint stopped
            self.bar.update(trainer.global_step)

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if self.bar is None or trainer.global_step <= self.bar.n:
            return
        loss = trainer.callback_metrics.get("train_loss")
        if loss is not None:
            self.bar.set_postfix(train_loss=float(loss))
        self.bar.update(trainer.global_step - self.bar.n)

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not trainer.is_global_zero:
            return
        metrics = {k: float(v) for k, v in trainer.callback_metrics.items() if k in ("train_loss", "val_loss")}
        shown = ", ".join(f"{k} {v:.6g}" for k, v in sorted(metrics.items()))
        print(f"epoch {trainer.current_epoch}: step {trainer.global_step}" + (f", {shown}" if shown else ""),
              file=sys.stderr, flush=True)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None
