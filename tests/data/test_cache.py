"""In-memory cache of WeatherBench datasets: identical samples, size limits, clear errors."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from pipelines.prepare import write_store
from pipelines.world import simulate_world
from smoeweather.data.cache import cache_bytes, cache_in_memory, time_range
from smoeweather.data.weather import WeatherBenchDataset


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("cache") / "world.zarr"
    ds = simulate_world((2000, 2000), seed=0, n_steps=120)
    write_store(lambda: ds, path, args={"test": "cache"}, train_years=None, source="test", time_chunk=8,
                scheduler="synchronous", progress=False)
    return str(path)


def make(store: str) -> WeatherBenchDataset:
    return WeatherBenchDataset(store, ["geopotential_500", "temperature_850"], lead_h=None,
                               lead_choices_h=[24, 48], input_offsets_h=[-12, 0])


def test_cached_samples_equal_streamed_samples(store: str) -> None:
    streamed, cached = make(store), cache_in_memory(make(store), True)
    lo, hi = time_range(streamed)
    assert lo == 0 and hi == 120  # first input at t−12 h of the first init, last target at the end
    # 2 variables (geopotential, temperature) × all levels × 32 × 64 float32 over 120 times
    assert cached.cached_bytes == cache_bytes(streamed) > 0
    for i in (0, 1, len(streamed) // 2, len(streamed) - 1):
        for a, b in zip(streamed[i], cached[i]):
            assert torch.equal(a, b)  # bit-identical: same float32 values through the same code


def test_cache_size_limit(store: str) -> None:
    need = cache_bytes(make(store))
    with pytest.raises(ValueError, match="data.cache.*GiB"):
        cache_in_memory(make(store), True, max_bytes=need - 1)
    auto = cache_in_memory(make(store), "auto", max_bytes=need - 1)
    assert not hasattr(auto, "cached_bytes")  # streams from zarr instead
    with pytest.raises(ValueError, match="false, true, auto"):
        cache_in_memory(make(store), "yes")


def test_cache_block_refuses_reads_outside(store: str, tmp_path: Path) -> None:
    ds = cache_in_memory(make(store), True)
    block = ds._reader.array("geopotential")
    with pytest.raises(IndexError, match="outside the cached block"):
        block[0 : block.shape[0] + 1]
