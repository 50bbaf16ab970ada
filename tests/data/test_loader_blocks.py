"""``data.sampler: time_blocks``: every sample once per epoch, batches bit-identical to ``dataset[i]``, the same
order for any number of workers, disjoint and complete DDP shares, and fewer store reads per batch."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch
from lightning.pytorch.trainer.connectors.data_connector import _DataConnector
from torch.utils.data import DataLoader, DistributedSampler

from pipelines.prepare import write_store
from pipelines.world import simulate_world
from smoeweather.config import ConfigError, apply_overrides, read_config, validate
from smoeweather.data.cache import cache_in_memory
from smoeweather.data.sampling import CountingReader, block_order, rank_share, sample_read_starts
from smoeweather.data.weather import WeatherBenchDataset
from smoeweather.training.datamodule import SkippingSampler, SplitDataModule, TimeBlockSampler
from smoeweather.training.run import train
from smoeweather.training.schema import schema_for
from smoeweather.training.stores import time_subset

REPO = Path(__file__).resolve().parents[2]
FIELDS = ["geopotential_500", "temperature_850"]  # 2 store arrays: geopotential, temperature
CHUNK = 4  # pipelines' default time chunk


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("blocks") / "world.zarr"
    ds = simulate_world((2000, 2000), seed=0, n_steps=150)
    write_store(lambda: ds, path, args={"test": "blocks"}, train_years=None, source="test", time_chunk=CHUNK,
                scheduler="synchronous", progress=False)
    return str(path)


def make(store: str, **kwargs: Any) -> WeatherBenchDataset:
    return WeatherBenchDataset(store, FIELDS, **kwargs)


def blocks_sampler(ds: Any, batch: int, world: int = 1, rank: int = 0, block: int | None = None,
                   drop_last: bool = True, seed: int = 3) -> TimeBlockSampler:
    return TimeBlockSampler(ds, num_replicas=world, rank=rank, seed=seed, batch_size=batch, block_size=block,
                            drop_last=drop_last)


# ---- the order ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("kwargs", [{}, {"lead_h": None, "lead_choices_h": [24, 48, 72]}])
@pytest.mark.parametrize("block", [4, 8, 16])
def test_every_sample_exactly_once_per_epoch_in_aligned_blocks(store: str, kwargs: dict, block: int) -> None:
    ds = make(store, **kwargs)
    starts, chunk = sample_read_starts(ds)
    assert chunk == CHUNK
    n_leads = len(ds.leads_h)
    for epoch in range(4):
        sampler = blocks_sampler(ds, batch=16, block=block, drop_last=False)
        sampler.set_epoch(epoch)
        order = list(sampler)
        assert sorted(order) == list(range(len(ds)))  # the random sampler's multiset: every sample once
        assert order == block_order(len(ds), block, 3, epoch, (starts, chunk)).tolist()
        blocks = np.asarray(order[: len(ds) // block * block]).reshape(-1, block)
        times = np.sort(starts[blocks], axis=1)
        span = times[:, -1] - times[:, 0] + 1  # init times a block covers
        contiguous = span <= -(-block // n_leads) + (n_leads > 1)  # consecutive times (leads may be cut)
        assert contiguous.sum() >= len(times) - 1  # all but the wrap-around block (end + start of the split)
        if (block // n_leads) % CHUNK == 0 and block % n_leads == 0:  # whole chunks per block
            assert (times[contiguous, 0] % CHUNK == 0).all()  # every block's first read on a chunk edge
    orders = {e: block_order(len(ds), block, 3, e, (starts, chunk)).tolist() for e in (0, 1)}
    assert orders[0] != orders[1]  # reshuffled every epoch
    assert orders[0] == block_order(len(ds), block, 3, 0, (starts, chunk)).tolist()  # seeded
    assert orders[0] != block_order(len(ds), block, 4, 0, (starts, chunk)).tolist()


def test_block_size_must_divide_the_batch(store: str) -> None:
    with pytest.raises(ValueError, match="block_size=12 must divide data.batch_size=16"):
        blocks_sampler(make(store), batch=16, block=12)
    with pytest.raises(ValueError, match="random, time_blocks"):
        SplitDataModule(dict, batch_size=8, sampler="blocks")


# ---- batches equal samples ----------------------------------------------------------------------------
@pytest.mark.parametrize("variant", ["fixed_lead", "continuous", "cached", "period_subset", "target_only"])
def test_batches_bitwise_equal_getitem(store: str, variant: str) -> None:
    kwargs: dict[str, Any] = {}
    if variant == "continuous":
        kwargs = {"lead_h": None, "lead_choices_h": [24, 48]}
    elif variant == "target_only":  # a target array that is no input array (e.g. precipitation, t2m)
        kwargs = {"target_variables": ["temperature_850"]}
    if variant in ("continuous", "target_only"):
        ds = WeatherBenchDataset(store, FIELDS[:1], **kwargs) if variant == "target_only" else make(store, **kwargs)
    elif variant == "cached":
        ds = cache_in_memory(make(store), True)
    elif variant == "period_subset":
        ds = time_subset(make(store), ["2000-01-05", "2000-02-01"])
    else:
        ds = make(store)
    reference = WeatherBenchDataset(store, FIELDS[:1] if variant == "target_only" else FIELDS, **kwargs)
    index = ds.indices if variant == "period_subset" else range(len(ds))
    sampler = blocks_sampler(ds, batch=8, drop_last=False)
    seen = []
    for (xb, yb), idx in zip(DataLoader(ds, batch_size=8, sampler=sampler), _batches(sampler, 8)):
        x = torch.stack([reference[index[i]][0] for i in idx])
        y = torch.stack([reference[index[i]][1] for i in idx])
        assert torch.equal(xb, x) and torch.equal(yb, y)  # bit-identical, per index __getitem__
        seen += idx
    assert sorted(seen) == list(range(len(ds)))


def _batches(sampler: Any, batch: int) -> list[list[int]]:
    order = list(sampler)
    return [order[i : i + batch] for i in range(0, len(order), batch)]


def test_same_batches_for_0_and_2_workers(store: str) -> None:
    ds = make(store)
    runs = {}
    for workers in (0, 2):
        sampler = blocks_sampler(ds, batch=8)
        loader = DataLoader(ds, batch_size=8, sampler=sampler, drop_last=True, num_workers=workers)
        batches = []
        for epoch in (0, 1):
            sampler.set_epoch(epoch)
            batches += [(xb.clone(), yb.clone()) for xb, yb in loader]
        runs[workers] = batches
    assert len(runs[0]) == len(runs[2]) == 2 * (len(ds) // 8)
    for (x0, y0), (x2, y2) in zip(runs[0], runs[2]):
        assert torch.equal(x0, x2) and torch.equal(y0, y2)  # copies of stored samples, whatever the worker count


# ---- DDP ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize("drop_last", [True, False])
def test_ddp_ranks_disjoint_complete_and_equal_one_process_with_combined_batch(
    store: str, world: int, drop_last: bool
) -> None:
    ds, batch = make(store), 8
    shares = [list(blocks_sampler(ds, batch, world, rank, drop_last=drop_last)) for rank in range(world)]
    reference = DistributedSampler(ds, num_replicas=world, rank=0, drop_last=drop_last)
    assert {len(s) for s in shares} == {len(reference)}  # DistributedSampler's length per rank
    every = sum(shares, [])
    if drop_last:
        assert len(set(every)) == len(every) == reference.total_size  # disjoint, len % world left out
    else:
        assert set(every) == set(range(len(ds)))  # complete; the padding repeats a few samples
    starts, _ = sample_read_starts(ds)
    owner = {}
    for rank, share in enumerate(shares):
        for j in range(len(share) // batch):
            run = sorted(starts[share[j * batch : (j + 1) * batch]])
            if run[-1] - run[0] == batch - 1:  # one block of consecutive times
                assert owner.setdefault(run[0], rank) == rank  # read by one rank only
    assert len(owner) >= world * (len(shares[0]) // batch) - 1  # all blocks but the wrap-around one
    # one process with batch world·8 sees, step by step, what the ranks see together
    one = list(blocks_sampler(ds, batch * world, 1, 0, block=batch, drop_last=drop_last))
    for j in range(len(shares[0]) // batch):
        combined = sum((s[j * batch : (j + 1) * batch] for s in shares), [])
        assert one[j * batch * world : (j + 1) * batch * world] == combined


def test_rank_share_pads_like_distributed_sampler() -> None:
    order = np.arange(10)[::-1]
    parts = [rank_share(order, 3, r, 2, 12).tolist() for r in range(3)]
    assert parts == [[9, 8, 3, 2], [7, 6, 1, 0], [5, 4, 9, 8]]
    assert sorted(sum(parts, [])) == sorted(list(range(10)) + [9, 8])


def test_lightning_keeps_the_block_sampler_under_ddp(store: str) -> None:
    """``use_distributed_sampler`` replaces a loader's sampler only when it is not a DistributedSampler."""
    ds = make(store)
    stub = SimpleNamespace(trainer=SimpleNamespace(
        _accelerator_connector=SimpleNamespace(use_distributed_sampler=True, is_distributed=True)))
    dm = SplitDataModule(lambda: {"train": ds, "valid": ds}, batch_size=8, sampler="time_blocks")
    dm.trainer = SimpleNamespace(world_size=2, global_rank=1)
    loader = dm.train_dataloader()
    assert isinstance(loader.sampler, TimeBlockSampler) and loader.sampler.rank == 1
    assert loader.sampler.num_replicas == 2 and loader.sampler.block_size == 8
    assert not _DataConnector._requires_distributed_sampler(stub, loader)
    assert _DataConnector._requires_distributed_sampler(stub, DataLoader(ds, batch_size=8))  # the check works
    loader.load_state_dict({"batches_done": 2})  # mid-epoch resume skips the batches already trained on
    assert list(loader.sampler) == loader.sampler.epoch_indices()[16:]


def test_config_selects_the_sampler(store: str) -> None:
    schema = schema_for("weatherbench")
    validate({"task": "weatherbench", "data": {"sampler": "time_blocks", "block_size": 8}}, schema)
    with pytest.raises(ConfigError, match="block_size"):
        validate({"task": "weatherbench", "data": {"block_size": "8"}}, schema)
    with pytest.raises(ValueError, match="data.sampler must be one of random, time_blocks"):
        SplitDataModule(lambda: {"train": make(store)}, batch_size=8, sampler="shuffled")
    subset = time_subset(make(store), ["2000-01-05", "2000-02-01"])
    dm = SplitDataModule(lambda: {"train": subset}, batch_size=8, sampler="time_blocks", block_size=4)
    assert dm.sampling() == ("time_blocks", 4)
    assert isinstance(dm.train_dataloader().sampler, TimeBlockSampler)
    default = SplitDataModule(lambda: {"train": make(store)}, batch_size=8).train_dataloader().sampler
    assert type(default) is SkippingSampler  # data.sampler defaults to random


def test_smoe_train_uses_time_blocks_from_the_config(store: str, tmp_path: Path) -> None:
    cfg = apply_overrides(read_config(REPO / "configs/weatherbench/world_smoe_all_prior.yaml"), [
        f"output_dir={tmp_path}", f"data.store={store}", "data.world=null", "data.sources=null",
        "data.train_years=null", "data.valid_years=null", "data.test_years=null",
        "data.train_period=[2000-01-01, 2000-01-25]", "data.valid_period=[2000-01-26, 2000-02-06]",
        "data.test_period=[2000-01-26, 2000-02-06]", "data.variables=[geopotential_500, temperature_850]",
        "data.batch_size=8", "data.num_workers=0", "data.sampler=time_blocks", "data.block_size=4",
        "model.width=8", "model.blocks=1", "trainer.accelerator=cpu", "trainer.devices=1",
        "trainer.strategy=auto", "trainer.max_epochs=1", "trainer.limit_train_batches=2",
        "trainer.limit_val_batches=1", "trainer.max_time=null", "trainer.enable_progress_bar=false",
        "trainer.precision=32-true", "trainer.num_nodes=1", "trainer.log_every_n_steps=1",
    ])
    result = train(cfg)
    sampler = result.trainer.train_dataloader.sampler
    assert isinstance(sampler, TimeBlockSampler) and sampler.block_size == 4 and sampler.batch_size == 8
    assert result.trainer.global_step == 2


# ---- reads ----------------------------------------------------------------------------------------------
def test_reads_per_batch(store: str) -> None:
    """Random order, per-sample reads: 2 arrays × (inputs + target) = 4 reads per sample, 64 per batch of 16.
    Time blocks of 16 consecutive times: ONE read per array per batch, decoding (16 + 2 + 12 halo) / 4 → 8
    chunks per array."""
    batch = 16
    ds = make(store)
    counter = ds._reader = CountingReader(ds._reader, CHUNK)
    random_order = list(SkippingSampler(ds, num_replicas=1, rank=0, shuffle=True, seed=3))
    for i in random_order[: 4 * batch]:
        ds[i]
    assert counter.reads == 4 * 4 * batch
    per_sample_chunks = counter.chunks

    counter.reads = counter.chunks = 0
    sampler = blocks_sampler(ds, batch)
    n_batches = 0
    consecutive = 0
    for idx in _batches(sampler, batch):
        if len(idx) < batch:
            continue
        before = counter.reads, counter.chunks
        ds.__getitems__(idx)
        reads, chunks = counter.reads - before[0], counter.chunks - before[1]
        n_batches += 1
        times = sorted(ds.init_indices[idx])
        if times[-1] - times[0] == batch - 1:
            consecutive += 1
            assert reads == 2  # one read per store array for the whole batch
            assert chunks == 2 * 8  # aligned: 30 times = 8 chunks of 4 per array
        else:
            assert reads <= 2 * 4  # the wrap-around block: the split's end and start, inputs and targets
    assert consecutive >= n_batches - 1
    assert per_sample_chunks >= 4 * 4 * batch  # random, per sample: ≥ 4 chunk decodes (blocks: 1 per sample)
