"""Data stores and splits for ``smoe train``: create a missing store from the config (``data.world``,
``data.sources``), cut train/valid/test by years and periods, read the land-sea mask."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
import xarray as xr
from filelock import FileLock
from torch.utils.data import Dataset, Subset

from smoeweather.training.datamodule import SPLITS


def ensure_store(dcfg: dict[str, Any]) -> str:
    """Path of ``dcfg['store']``, creating it first when missing and ``world``/``sources`` say how.

    Processes started together (the shards of one study) make a missing store once: the first takes a lock
    file beside it and writes it, the others wait and then use it.
    """
    store = Path(dcfg["store"])
    if not store.exists():
        if not (dcfg.get("world") or dcfg.get("sources")):
            raise FileNotFoundError(
                f"data store {store} does not exist and the config has no data.world or "
                "data.sources to create it (see `smoe data world` / `smoe data prepare`)"
            )
        store.parent.mkdir(parents=True, exist_ok=True)
        with FileLock(store.parent / f".{store.name}.lock"):
            if not store.exists():
                _make_store(store, dcfg)
                return str(store)
    if dcfg.get("sources") and not dcfg.get("world"):
        args = _source_args(dcfg)
        _check_store_matches_sources(store, args, args["sources"])
    return str(store)


def _make_store(store: Path, dcfg: dict[str, Any]) -> None:
    """Write ``store`` from ``dcfg['world']`` (a synthetic world) or ``dcfg['sources']`` (netCDF files)."""
    if dcfg.get("world"):
        from pipelines.world import generate_world

        world = dict(dcfg["world"] or {})
        if "years" in world:
            world["years"] = tuple(world["years"])
        if world.get("train_years") is not None:
            world["train_years"] = tuple(world["train_years"])
        generate_world(store, progress=False, **world)
    else:
        from pipelines.prepare import source_fingerprint, write_store
        from smoeweather.data.paths import check_data_files

        files = [str(Path(f).expanduser()) for f in dcfg["sources"]]
        check_data_files("data.sources", files)
        train_years = dcfg.get("statistics_years")

        def make() -> xr.Dataset:
            ds = xr.open_mfdataset(
                files,
                combine="nested",
                concat_dim="time",
                data_vars="minimal",
                coords="minimal",
                compat="override",
                chunks={},
            )
            keep = [v for v in dcfg.get("store_variables", list(ds.data_vars)) if v in ds.data_vars]
            return ds[keep]

        write_store(
            make,
            store,
            args=_source_args(dcfg),
            train_years=tuple(train_years) if train_years else None,
            source=", ".join(files),
            scheduler="threads",
            progress=False,
            fingerprint={"source": source_fingerprint(files)},
        )


def _source_args(dcfg: dict[str, Any]) -> dict[str, Any]:
    """What a store made from ``data.sources`` records of how it was made (compared on every later use)."""
    return {"kind": "netcdf", "sources": [str(Path(f).expanduser()) for f in dcfg["sources"]],
            "train_years": dcfg.get("statistics_years")}


def _check_store_matches_sources(store: Path, args: dict[str, Any], files: list[str]) -> None:
    """Raise when the existing ``store`` was made from other ``data.sources`` (or before they last changed):
    it is a cache of those files, and reusing it would silently train on the old data (e.g. after
    ``smoe data gcm-world`` wrote new files over the ones the store was made from)."""
    from pipelines.prepare import source_fingerprint, store_mismatch, stored_args

    recorded = stored_args(store)
    if recorded is None:
        return  # a store made by `smoe data prepare` or by hand: the user's own, used as it is
    present = all(Path(f).exists() for f in files)  # sources deleted since: only the arguments can be compared
    why = store_mismatch(store, args, {"source": source_fingerprint(files)} if present else None,
                         compare_source=present)
    if why:
        how = {"arguments": "with other data.sources or statistics years",
               "source": "from data.sources that have changed since (file sizes, contents or times differ)"}[why]
        raise FileExistsError(
            f"data.store {store} was made {how}: it is a cache of {recorded.get('sources')}, the config "
            f"now reads {files}. Delete {store} to rebuild it from data.sources, or set data.store to "
            "another path")


def time_subset(dataset: Any, period: list[str] | tuple[str, str]) -> Subset:
    """Samples of a WeatherBench/ENS-10 dataset whose init time ≥ start and valid time ≤ end (inclusive)."""
    start, end = np.datetime64(str(period[0])), np.datetime64(str(period[1]))
    valid = getattr(dataset, "valid_time", dataset.init_time)
    keep = [i for i in range(len(dataset)) if dataset.init_time(i) >= start and valid(i) <= end]
    if not keep:
        raise ValueError(f"no samples between {start} and {end} in {dataset.store}")
    return Subset(dataset, keep)


def _years(value: Any) -> tuple[int, int] | None:
    return None if value is None else (int(value[0]), int(value[-1]))


def year_splits(dcfg: dict[str, Any], make: Callable[[tuple[int, int] | None], Dataset]) -> dict[str, Dataset]:
    """One dataset per split from ``<split>_years`` and an optional ``<split>_period`` [start, end]."""
    out = {}
    for split in SPLITS:
        period = dcfg.get(f"{split}_period")
        years = _years(dcfg.get(f"{split}_years"))
        if period is not None and years is None:
            years = (int(str(period[0])[:4]), int(str(period[1])[:4]))
        ds = make(years)
        out[split] = time_subset(ds, period) if period is not None else ds
    return out


def base_dataset(ds: Dataset) -> Any:
    """The underlying dataset of a (possibly nested) Subset."""
    while isinstance(ds, Subset):
        ds = ds.dataset
    return ds


def land_sea_mask(store: str) -> torch.Tensor:
    """(H, W) land fraction of a prepared store."""
    with xr.open_zarr(store) as ds:
        return torch.as_tensor(ds["land_sea_mask"].values.astype(np.float32))
