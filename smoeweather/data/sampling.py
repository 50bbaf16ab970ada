"""Training order in contiguous time blocks (``data.sampler: time_blocks``) for streamed zarr stores.

Why: a shuffled epoch over a streamed store (``data.sampler: random``, ``data.cache: false``) reads every
sample on its own: one read of t−12 h … t per input variable and one of t + lead per target variable, each
decoding the whole time chunk(s) it touches (4 times per chunk from ``pipelines``). With the 117-channel
WeatherBench inputs that is 10 reads and ~14 chunk decodes per sample, 320 reads per batch of 32. In
``time_blocks`` order a batch is made of whole blocks of ``block_size`` consecutive samples (consecutive
initialisation times), and :meth:`~smoeweather.data.weather.WeatherBenchDataset.__getitems__` reads each
variable ONCE per block, inputs, halo (t−12 h before the block) and targets (t + lead after it) together:
8 reads per batch of 32.

The order of epoch ``e`` (a function of ``(seed, e)`` only; neither the number of workers nor the number of
ranks changes it):

1. the samples in chronological order are cut into blocks of ``block_size``, starting at an offset drawn
   per epoch among those that put a block's first read time on a zarr time-chunk boundary (so with
   ``block_size`` a multiple of the time chunk every full block starts on a chunk edge). The samples before
   the offset and after the last full block form the leftover (the split's two ends): one more full block
   when there are ``block_size`` of them, the rest a partial block;
2. the full blocks are shuffled, the samples inside every block are shuffled, and the partial block goes
   last (with ``drop_last`` it is what an epoch leaves out, as the random sampler leaves out
   ``len % batch`` random samples; here the left-out samples lie at the split's ends, a different
   number at each end from epoch to epoch);
3. ranks take turns by batch: run ``j`` of ``batch_size`` samples goes to rank ``j mod world`` (the
   padding/truncation to a multiple of the world size is :class:`DistributedSampler`'s). With
   ``block_size`` dividing ``batch_size`` every rank reads whole blocks of its own, and N ranks with batch
   b see step by step the samples one process with batch N·b and the same ``block_size`` sees (as with
   the random sampler; set ``data.block_size`` explicitly for that comparison, its default follows the
   batch size).

Every sample appears exactly once per epoch (the same multiset as the random sampler before ``drop_last``).

Default ``data.sampler: random``. Blocks make a batch out of ``batch_size / block_size`` stretches of
consecutive 6-hourly times (one stretch of 8 days with the default block = batch), so its samples are
correlated and the gradient noisier than with independent draws; the random order is the reference
WeatherBench setup, and existing runs, results and resumable checkpoints rely on it. Where the split fits
in memory (the GCM world, 240 MB; a 5.625° split with a few dozen fields), ``data.cache`` removes the reads
altogether and keeps the random order. ``time_blocks`` is the option for stores streamed from disk that do
not fit (ERA5 at 5.625° with 117 channels over 40 years, ~70 GB); a smaller ``block_size`` (e.g. 8) mixes
more periods per batch at ``batch_size / block_size`` reads per variable. ``data.block_size`` defaults to
``data.batch_size`` (one read per variable per batch, the fewest); it must divide the batch size.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from torch.utils.data import Subset

SAMPLERS = ("random", "time_blocks")
DEFAULT_SAMPLER = "random"


def check_sampling(sampler: Any, block_size: Any, batch_size: int | None = None) -> tuple[str, int | None]:
    """``(sampler, block_size)`` validated; ValueError naming the ``data.*`` key otherwise."""
    if sampler not in SAMPLERS:
        raise ValueError(f"data.sampler must be one of {', '.join(SAMPLERS)}; got {sampler!r}")
    if block_size is not None and sampler != "time_blocks":
        raise ValueError(f"data.block_size only applies to data.sampler: time_blocks (got sampler {sampler!r})")
    if block_size is not None:
        if isinstance(block_size, bool) or not isinstance(block_size, int | np.integer) or block_size < 1:
            raise ValueError(f"data.block_size must be a positive integer (samples) or null; got {block_size!r}")
        if batch_size is not None and batch_size % int(block_size):
            raise ValueError(
                f"data.block_size={block_size} must divide data.batch_size={batch_size} (a batch is whole blocks: "
                "a block cut between batches is read once per batch)"
            )
    return str(sampler), None if block_size is None else int(block_size)


def sample_read_starts(dataset: Any) -> tuple[np.ndarray, int] | None:
    """(store time index of each sample's first input time, store time chunk) of a WeatherBench-like dataset,
    through nested :class:`Subset` s; None for datasets without time indices (the order then ignores chunks)."""
    index = np.arange(len(dataset))
    base = dataset
    while isinstance(base, Subset):
        index = np.asarray(base.indices, dtype=np.int64)[index]
        base = base.dataset
    if not all(hasattr(base, a) for a in ("init_indices", "leads_h", "input_offsets_h", "_index_of")):
        return None
    inits = base.init_indices[index // len(base.leads_h)]
    first = base._index_of[min(base.input_offsets_h)][inits]
    return np.asarray(first, dtype=np.int64), int(getattr(base, "time_chunk", 1))


def block_order(n: int, block_size: int, seed: int, epoch: int,
                read_starts: tuple[np.ndarray, int] | None = None) -> np.ndarray:
    """The epoch's order of samples ``0..n-1`` in shuffled blocks (module docstring, steps 1–2)."""
    if n == 0:
        return np.zeros(0, np.int64)
    size = int(block_size)
    rng = np.random.default_rng([int(seed), int(epoch)])
    if read_starts is None:
        chron, candidates = np.arange(n), np.arange(min(size, n))
    else:
        starts, chunk = read_starts
        chron = np.argsort(starts, kind="stable")
        t = starts[chron]
        first_at_time = np.r_[True, t[1:] != t[:-1]]  # don't cut between the leads of one init time
        window = np.arange(min(size, n))
        candidates = window[first_at_time[window] & (t[window] % max(chunk, 1) == 0)]
        if len(candidates) == 0:
            candidates = window[first_at_time[window]]
    origin = int(rng.choice(candidates))
    n_full = (n - origin) // size
    body = chron[origin : origin + n_full * size].reshape(n_full, size)
    leftover = np.concatenate([chron[origin + n_full * size :], chron[:origin]])  # split end, then split start
    blocks = list(body)
    if len(leftover) >= size:
        blocks.append(leftover[:size])
        leftover = leftover[size:]
    parts = [rng.permutation(blocks[b]) for b in rng.permutation(len(blocks))]
    parts.append(rng.permutation(leftover))
    return np.concatenate(parts).astype(np.int64)


def rank_share(order: np.ndarray, num_replicas: int, rank: int, batch_size: int, total_size: int) -> np.ndarray:
    """Rank ``rank``'s part of the global ``order``: padded (repeating its start) or cut to ``total_size``
    (as :class:`DistributedSampler`), then runs of ``batch_size`` dealt to the ranks in turn; the last
    incomplete round is split in equal contiguous parts. Every rank gets ``total_size / num_replicas``."""
    n = len(order)
    order = np.concatenate([order, np.resize(order, total_size - n)]) if total_size > n else order[:total_size]
    per = total_size // num_replicas
    rounds = per // batch_size
    cut = rounds * num_replicas * batch_size
    dealt = order[:cut].reshape(rounds, num_replicas, batch_size)[:, rank].ravel()
    q = per - rounds * batch_size
    return np.concatenate([dealt, order[cut + rank * q : cut + (rank + 1) * q]])


class CountingReader:
    """Diagnostics (tests, benchmarks/loader.py): wraps a dataset's reader and counts array slices (reads)
    and the time chunks they touch (decodes)."""

    def __init__(self, reader: Any, chunk: int) -> None:
        self.reader, self.chunk, self.reads, self.chunks = reader, chunk, 0, 0

    def array(self, name: str) -> Any:
        array, outer = self.reader.array(name), self

        class Counted:
            shape, dtype = array.shape, array.dtype

            def __getitem__(self, key: Any) -> Any:
                if isinstance(key, slice):
                    outer.reads += 1
                    outer.chunks += (key.stop - 1) // outer.chunk - key.start // outer.chunk + 1
                return array[key]

        return Counted()
