"""In-memory cache for :class:`~smoeweather.data.weather.WeatherBenchDataset`: load the time block a split
needs ONCE into RAM (one contiguous read per variable), then serve every sample from memory.

The GCM world is ~240 MB and a WeatherBench split at 5.625° with a few dozen fields is a few GB, so the
zarr decode per sample (the loader's cost: ~40 samples/s per 2 workers with 117 channels) is avoidable
whenever the block fits. DataLoader workers started by ``fork`` share the cached arrays copy-on-write
(nothing is copied: the arrays are only read).

Config: ``data.cache: false | true | auto`` (``true``: cache or fail with the size; ``auto``: cache when it
fits, else stream from zarr) and ``data.cache_max_gb`` (default: half the machine's physical memory).
Splits streamed from zarr that do not fit read far less with ``data.sampler: time_blocks``
(:mod:`smoeweather.data.sampling`).
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

CACHE_MODES = (False, True, "auto")


class TimeBlock:
    """A numpy array covering store time indices [start, start + len) that answers the zarr-array slices
    the dataset issues: ``block[lo:hi]`` (store time indices) and ``block[...]``. A slice is a view (no copy,
    no decode): ``in_memory`` tells batched reads to take one slice over all the times a batch needs."""

    in_memory = True

    def __init__(self, data: np.ndarray, start: int) -> None:
        self.data, self.start = data, int(start)

    @property
    def shape(self) -> tuple[int, ...]:
        return self.data.shape

    def __getitem__(self, key: Any) -> np.ndarray:
        if key is Ellipsis:
            return self.data
        if not isinstance(key, slice) or key.step not in (None, 1):
            raise TypeError(f"TimeBlock supports [lo:hi] and [...], got {key!r}")
        lo, hi = key.start - self.start, key.stop - self.start
        if lo < 0 or hi > len(self.data):
            raise IndexError(f"time indices {key.start}:{key.stop} outside the cached block "
                             f"{self.start}:{self.start + len(self.data)}")
        return self.data[lo:hi]


class InMemoryReader:
    """Stands in for :class:`~smoeweather.data.weather.StoreReader`: ``array(name)`` from RAM."""

    def __init__(self, store: str, arrays: dict[str, Any]) -> None:
        self.store, self.arrays = store, arrays

    def array(self, name: str) -> Any:
        if name not in self.arrays:
            raise KeyError(f"variable {name!r} is not in the in-memory cache of {self.store}")
        return self.arrays[name]


def time_range(dataset: Any) -> tuple[int, int]:
    """[lo, hi) store time indices of every input and target time of ``dataset``'s samples."""
    inits = dataset.init_indices
    positions = [dataset._index_of[o][inits] for o in dataset.input_offsets_h]
    positions += [dataset._index_of[lead][inits] for lead in dataset.leads_h]
    every = np.concatenate(positions)
    return int(every.min()), int(every.max()) + 1


def cache_bytes(dataset: Any) -> int:
    """Bytes the cache of ``dataset`` would hold (time-dependent variables over :func:`time_range`)."""
    lo, hi = time_range(dataset)
    total = 0
    for name in _time_variables(dataset):
        arr = dataset._reader.array(name)
        total += (hi - lo) * int(np.prod(arr.shape[1:])) * np.dtype(arr.dtype).itemsize
    return total


def _time_variables(dataset: Any) -> list[str]:
    return sorted({name for name, _ in dataset.variables + dataset.target_variables})


def default_max_bytes() -> int:
    """Half the physical memory of this machine."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2
    except (ValueError, OSError, AttributeError):  # pragma: no cover - non-POSIX
        return 4 << 30


def cache_in_memory(dataset: Any, mode: bool | str = True, max_bytes: int | None = None) -> Any:
    """Load the time block ``dataset`` needs into RAM and serve samples from it; returns ``dataset``.

    ``mode``: False (no-op), True (cache; ValueError naming the size when over ``max_bytes``) or
    ``"auto"`` (cache only when it fits). Samples are bit-identical to the streamed ones (same float32
    values, same normalisation code path).
    """
    if mode not in CACHE_MODES:
        raise ValueError(f"data.cache must be one of false, true, auto; got {mode!r}")
    if mode is False:
        return dataset
    limit = default_max_bytes() if max_bytes is None else int(max_bytes)
    need = cache_bytes(dataset)
    if need > limit:
        if mode == "auto":
            return dataset
        raise ValueError(f"data.cache: the split of {dataset.store} needs {need / 2**30:.2f} GiB in memory, more "
                         f"than data.cache_max_gb={limit / 2**30:.2f} GiB; set data.cache=auto or raise the limit")
    dataset._constant_fields()  # constants are read once and kept by the dataset itself
    lo, hi = time_range(dataset)
    arrays = {name: TimeBlock(np.asarray(dataset._reader.array(name)[lo:hi]), lo)
              for name in _time_variables(dataset)}  # one contiguous read per variable
    dataset._reader = InMemoryReader(dataset.store, arrays)
    dataset.cached_bytes = need
    return dataset


def cache_from_config(dataset: Any, dcfg: dict[str, Any]) -> Any:
    """:func:`cache_in_memory` with ``dcfg["cache"]`` and ``dcfg["cache_max_gb"]`` (data config block)."""
    mode = dcfg.get("cache", False)
    gb = dcfg.get("cache_max_gb")
    return cache_in_memory(dataset, mode, None if gb is None else int(float(gb) * 2**30))
