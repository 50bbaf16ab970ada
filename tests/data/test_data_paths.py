"""Configs a clone can run: the GCM configs read the files `smoe data gcm-world` / `gcm-ens` write inside the
clone, and a missing data file is reported with the config key and the command that makes it."""

from __future__ import annotations

from pathlib import Path

import pytest

from smoeweather.cli import main
from smoeweather.data.paths import check_data_files, make_command

REPO = Path(__file__).resolve().parents[2]


def test_no_committed_config_reads_the_shared_folder() -> None:
    readers = [p.relative_to(REPO) for p in (REPO / "configs").rglob("*.yaml")
               if "../shared" in "".join(line.split("#")[0] for line in p.read_text().splitlines())]
    assert readers == []


def test_make_command_names_the_generator() -> None:
    assert make_command("data/gcm_world/gcm_5.625deg_year2.nc") == "smoe data gcm-world --out data/gcm_world"
    assert make_command("data/gcm_ens/gcm_ens_2006.nc") == "smoe data gcm-ens --out data/gcm_ens --year 2006 --seed 5"
    assert make_command("x/other.nc") is None


def test_missing_file_names_key_and_command(tmp_path: Path) -> None:
    present = tmp_path / "a.nc"
    present.write_bytes(b"")
    check_data_files("data.source", [present, "https://example.org/x.nc", str(tmp_path / "*.zarr")])  # no error
    with pytest.raises(FileNotFoundError, match=r"config key data.sources: .*gcm_5.625deg_year1.nc does not exist; "
                       r"make it with `smoe data gcm-world --out"):
        check_data_files("data.sources", [present, tmp_path / "gcm_5.625deg_year1.nc"])


def test_train_in_a_clone_without_data_says_how_to_make_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["train", "--config", str(REPO / "configs/postprocess/gcm_ens_unet.yaml"),
                 "trainer.accelerator=cpu"]) != 0
    err = capsys.readouterr().err
    assert "config key data.source: data file data/gcm_ens/gcm_ens_2005.nc does not exist" in err
    assert "smoe data gcm-ens --out data/gcm_ens --year 2005 --seed 2" in err


def _gcm_file(path: Path, offset: float) -> Path:
    """A two-day GCM-world-like file: Z500 and T850 on a 4 × 8 grid, 6-hourly, plus a land-sea mask."""
    import numpy as np
    import xarray as xr

    time = np.arange(np.datetime64("2001-01-01T00", "ns"), np.datetime64("2001-01-03T00", "ns"),
                     np.timedelta64(6, "h"))
    shape = (len(time), 1, 4, 8)
    ds = xr.Dataset({"geopotential": (("time", "level", "latitude", "longitude"),
                                      np.full(shape, 5e4 + offset, np.float32)),
                     "temperature": (("time", "level", "latitude", "longitude"), np.full(shape, 280.0, np.float32)),
                     "land_sea_mask": (("latitude", "longitude"), np.zeros((4, 8), np.float32))},
                    coords={"time": time, "level": [500], "latitude": [-67.5, -22.5, 22.5, 67.5],
                            "longitude": np.arange(8) * 45.0})
    ds.to_netcdf(path)
    return path


def test_a_store_made_from_other_sources_is_not_reused(tmp_path: Path) -> None:
    """data.store is a cache of data.sources: after the source files change (a new `smoe data gcm-world` run),
    training refuses the stale store and says how to rebuild it, instead of training on the old data."""
    import xarray as xr

    from smoeweather.training.stores import ensure_store

    src = _gcm_file(tmp_path / "gcm_5.625deg_year1.nc", 0.0)
    dcfg = {"store": str(tmp_path / "store.zarr"), "sources": [str(src)], "statistics_years": [2001, 2001]}
    assert ensure_store(dcfg) == dcfg["store"] and ensure_store(dcfg) == dcfg["store"]  # made, then reused
    with xr.open_zarr(dcfg["store"]) as ds:
        # 256 cells of 5e4 = 2^4 · 3125: every partial sum k · 5e4 (k ≤ 256) and the mean are exact in float32
        assert float(ds["geopotential"].mean()) == 5e4
    _gcm_file(src, 100.0)  # the file is regenerated with other values
    with pytest.raises(FileExistsError, match=r"data.store .*store.zarr was made from data.sources that have "
                                              r"changed since.*Delete .*store.zarr to rebuild"):
        ensure_store(dcfg)
    other = _gcm_file(tmp_path / "other.nc", 0.0)
    with pytest.raises(FileExistsError, match="with other data.sources"):
        ensure_store({**dcfg, "sources": [str(other)]})


def test_shards_started_together_make_a_missing_store_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The shards of one study start at once with no store yet: one writes it, the others wait for its lock
    and reuse it (two writers would swap the store under each other's feet)."""
    import threading

    import pipelines.prepare
    from smoeweather.training.stores import ensure_store

    real_write_store = pipelines.prepare.write_store
    writes: list[str] = []
    started = threading.Barrier(2)

    def counted_write_store(*args: object, **kwargs: object) -> object:
        writes.append(str(args[1]))
        return real_write_store(*args, **kwargs)

    monkeypatch.setattr(pipelines.prepare, "write_store", counted_write_store)
    src = _gcm_file(tmp_path / "gcm_5.625deg_year1.nc", 0.0)
    dcfg = {"store": str(tmp_path / "made" / "store.zarr"), "sources": [str(src)], "statistics_years": [2001, 2001]}
    results: list[str] = []

    def shard() -> None:
        started.wait()
        results.append(ensure_store(dcfg))

    threads = [threading.Thread(target=shard) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [dcfg["store"]] * 2
    assert writes == [dcfg["store"]]


def test_a_missing_store_with_no_recipe_is_an_error_that_writes_nothing(tmp_path: Path) -> None:
    from smoeweather.training.stores import ensure_store

    with pytest.raises(FileNotFoundError, match=r"store.zarr does not exist and the config has no data.world or "
                                                r"data.sources"):
        ensure_store({"store": str(tmp_path / "new" / "store.zarr")})
    assert not (tmp_path / "new").exists()
