"""A DataModule over ready-made split datasets with a seeded, rank-aware training order."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import lightning as L
import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from smoeweather.data.sampling import DEFAULT_SAMPLER, block_order, check_sampling, rank_share, sample_read_starts

SPLITS = ("train", "valid", "test")


class SkippingSampler(DistributedSampler):
    """:class:`DistributedSampler` that leaves out the first ``skip`` indices of its next epoch (once): the
    part of an interrupted epoch that a resumed run has already trained on."""

    skip: int = 0

    def epoch_indices(self) -> list[int]:
        """This rank's indices of the current epoch (before ``skip``)."""
        return list(super().__iter__())

    def __iter__(self) -> Any:
        indices = self.epoch_indices()
        skip, self.skip = self.skip, 0
        return iter(indices[skip:])


class TimeBlockSampler(SkippingSampler):
    """The ``data.sampler: time_blocks`` order (:mod:`smoeweather.data.sampling`): shuffled blocks of
    ``block_size`` consecutive samples, chunk-aligned, batches of whole blocks dealt to the ranks in turn.

    A :class:`DistributedSampler` (so Lightning's ``use_distributed_sampler`` leaves it in place under DDP:
    it only replaces samplers that are not one) and a :class:`SkippingSampler` (mid-epoch resume). Epoch e's
    order depends on (seed, e) only; ``len`` and the padding/truncation per rank are DistributedSampler's.
    """

    def __init__(self, dataset: Dataset, *, num_replicas: int, rank: int, seed: int, batch_size: int,
                 block_size: int | None = None, drop_last: bool = True) -> None:
        super().__init__(dataset, num_replicas=num_replicas, rank=rank, shuffle=True, seed=seed,
                         drop_last=drop_last)
        self.batch_size = int(batch_size)
        _, block = check_sampling("time_blocks", block_size, self.batch_size)
        self.block_size = self.batch_size if block is None else block
        self.read_starts = sample_read_starts(dataset)  # once, in the main process

    def epoch_indices(self) -> list[int]:
        order = block_order(len(self.dataset), self.block_size, self.seed, self.epoch, self.read_starts)
        return rank_share(order, self.num_replicas, self.rank, self.batch_size, self.total_size).tolist()


class ResumableDataLoader(DataLoader):
    """Training loader whose position inside the epoch goes into Lightning checkpoints (``state_dict``), so a
    run resumed from a mid-epoch checkpoint (``trainer.max_steps`` inside an epoch, validation inside an
    epoch) continues with the next unseen batch instead of restarting the epoch's order.

    ``batches_done()`` is the number of batches of the current epoch already trained on (0 at an epoch end).
    ``len()`` stays the full epoch: Lightning counts the skipped batches as done.
    """

    def __init__(self, *args: Any, batches_done: Callable[[], int], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.batches_done = batches_done

    def state_dict(self) -> dict[str, int]:
        return {"batches_done": int(self.batches_done())}

    def load_state_dict(self, state: dict[str, int]) -> None:
        if not isinstance(self.sampler, SkippingSampler):
            raise TypeError("ResumableDataLoader needs a SkippingSampler to resume inside an epoch")
        self.sampler.skip = int(state.get("batches_done", 0)) * int(self.batch_size or 1)


class SplitDataModule(L.LightningDataModule):
    """Train / valid / test loaders over the datasets returned by ``make_datasets()`` (built lazily in each
    process, so DDP ranks and DataLoader workers open their stores themselves).

    The training order is a :class:`DistributedSampler` with ``seed`` on every run, one process or many
    (num_replicas = world size): epoch e's permutation depends only on (seed, e). Consequences, both
    tested: a run resumed from an epoch-end or a mid-epoch checkpoint (:class:`ResumableDataLoader`) sees the
    same batches as an uninterrupted one, and
    N ranks with batch b see, step by step, exactly the samples one process with batch N·b sees.
    Lightning calls ``set_epoch`` on the sampler and shards the valid/test loaders itself.
    ``drop_last`` (default, needed for the DDP equality): incomplete training batches are dropped, and a
    batch larger than the training set is an error; ``drop_last=False`` trains on the last partial batch.

    ``sampler``: ``"random"`` (the above) or ``"time_blocks"`` (:class:`TimeBlockSampler`, for stores
    streamed from disk; same properties, batches of consecutive times); ``block_size`` its block in samples
    (default: ``batch_size``); from ``data.sampler`` / ``data.block_size``; None = ``"random"``.
    ``pin_memory`` is on whenever CUDA is; workers prefetch DataLoader's default 2 batches each.
    """

    def __init__(
        self,
        make_datasets: Callable[[], dict[str, Dataset]],
        batch_size: int,
        seed: int = 0,
        num_workers: int = 0,
        collate_fn: Callable[[Any], Any] | None = None,
        drop_last: bool = True,
        sampler: str | None = None,
        block_size: int | None = None,
    ) -> None:
        super().__init__()
        if sampler is not None or block_size is not None:
            check_sampling(sampler or DEFAULT_SAMPLER, block_size, int(batch_size))
        self.sampler_name, self.block_size = sampler, block_size
        self.drop_last = bool(drop_last)
        self.make_datasets = make_datasets
        self.batch_size, self.seed, self.num_workers = int(batch_size), int(seed), int(num_workers)
        self.collate_fn = collate_fn
        self.datasets: dict[str, Dataset] = {}

    def setup(self, stage: str | None = None) -> None:
        if not self.datasets:
            self.datasets = dict(self.make_datasets())

    def dataset(self, split: str) -> Dataset:
        self.setup()
        if split not in self.datasets:
            raise ValueError(f"no {split!r} split; have {sorted(self.datasets)}")
        return self.datasets[split]

    def _loader(self, split: str, sampler: DistributedSampler | None = None, **extra: Any) -> DataLoader:
        cls = ResumableDataLoader if "batches_done" in extra else DataLoader
        return cls(
            self.dataset(split),
            batch_size=self.batch_size,
            sampler=sampler,
            drop_last=sampler is not None and self.drop_last,
            num_workers=self.num_workers,
            persistent_workers=self.num_workers > 0,
            collate_fn=self.collate_fn,
            pin_memory=torch.cuda.is_available(),
            **extra,
        )

    def train_dataloader(self) -> DataLoader:
        trainer = self.trainer
        world, rank = (trainer.world_size, trainer.global_rank) if trainer is not None else (1, 0)
        kind, block_size = self.sampling()
        sampler: SkippingSampler
        if kind == "time_blocks":
            sampler = TimeBlockSampler(
                self.dataset("train"), num_replicas=world, rank=rank, seed=self.seed, batch_size=self.batch_size,
                block_size=block_size, drop_last=self.drop_last,
            )
        else:
            sampler = SkippingSampler(
                self.dataset("train"), num_replicas=world, rank=rank, shuffle=True, seed=self.seed,
                drop_last=self.drop_last,
            )
        if self.drop_last and len(sampler) < self.batch_size:  # drop_last would leave an epoch of zero steps and exit 0
            n = len(self.dataset("train"))
            raise ValueError(
                f"data.batch_size={self.batch_size} is larger than the {len(sampler)} training samples per "
                f"process ({n} samples over {world} process(es)): no full batch to train on; lower "
                "data.batch_size or widen the training period"
            )
        return self._loader("train", sampler, batches_done=self._batches_done)

    def sampling(self) -> tuple[str, int | None]:
        """(sampler, block_size) of the training loader; ``("random", None)`` unless configured."""
        return check_sampling(self.sampler_name or DEFAULT_SAMPLER, self.block_size, self.batch_size)

    def _batches_done(self) -> int:
        """Batches of the current training epoch already trained on; 0 once the epoch is complete."""
        trainer = self.trainer
        if trainer is None:
            return 0
        done = trainer.fit_loop.epoch_loop.batch_progress.current.processed  # set before on_train_batch_end
        return 0 if done >= trainer.num_training_batches else int(done)

    def val_dataloader(self) -> DataLoader:
        return self._loader("valid")

    def test_dataloader(self) -> DataLoader:
        return self._loader("test")
