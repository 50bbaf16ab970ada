"""The out-of-core EMOS fit holds its reduced training arrays in memory when they fit ``chunked.MEMORY_BYTES``
(no zarr staging) and fits their blocks on a thread pool; the coefficients are bit-identical to the disk-staged
path (budget 0), with missing members and observations, per grid point, global, members and rolling windows."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import xarray as xr
from test_postprocess_cli import gcm_ens_like
from test_postprocess_drn import _table

from smoeweather.cli import main
from smoeweather.data import forecast_stores
from smoeweather.postprocess import chunked, rolling
from smoeweather.postprocess.model_file import read_model


def _with_gaps(tmp_path: Path) -> tuple[xr.Dataset, xr.Dataset]:
    """A gcm_ens-like training set with a missing member, missing observations and one point without data."""
    path = gcm_ens_like(tmp_path / "a.nc", 2005, 0)
    fc = forecast_stores.open_ensemble(path).load()
    truth = forecast_stores.truth_at_valid_times(fc, forecast_stores.open_truth(None, path)).load()
    t = fc["temperature"].values
    t[2:5, :, 1, :, 3, 4] = np.nan  # one member missing at one point for 3 inits
    t[:, :, :, :, 6, 7] = np.nan  # a point without any forecast: NaN coefficients
    truth["temperature"].values[7:9, :, :, 1, :] = np.nan  # missing observations along a latitude row
    return fc, truth


@pytest.mark.parametrize(("local", "predictors", "rolled", "scheduler"), [
    (True, "mean", False, "threads"), (False, "mean", False, "threads"), (True, "members", False, "threads"),
    (True, "mean", True, "threads"), (True, "mean", False, None)])
def test_in_memory_stage_fits_bit_identical_to_disk_stage(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                          local: bool, predictors: str, rolled: bool,
                                                          scheduler: str | None) -> None:
    fc, truth = _with_gaps(tmp_path)
    monkeypatch.setattr(chunked, "BLOCK_BYTES", 2 * 8 * 3 * 24 * 4 * 12)  # several spatial blocks
    arrays = chunked.training_arrays(fc.chunk({"time": 5}), truth.chunk({"time": 5}), predictors)
    window = None
    if rolled:
        dates = pd.DatetimeIndex(fc["time"].values[8::4])
        window = (dates, *rolling.window_index(fc["time"].values, dates, pd.Timedelta("12D"), pd.Timedelta("2D")))
    members = [str(m) for m in fc["member"].values] if predictors == "members" else None
    fits, blocks = {}, {}
    with chunked.scheduler(scheduler) as client:
        for where, budget in (("memory", None), ("disk", 0.0)):
            staged, _ = chunked.stage_with(arrays, tmp_path / f"{where}.zarr", client, False, memory_bytes=budget)
            assert bool(staged.attrs.get(chunked.IN_MEMORY)) == (where == "memory")
            assert (tmp_path / f"{where}.zarr").exists() == (where == "disk")
            blocks[where] = staged["temperature__var"].chunks
            fits[where] = chunked.fit_staged(staged, list(fc.data_vars), local, client, False, window=window,
                                             members=members)
    assert blocks["memory"] == blocks["disk"] and len(blocks["disk"][-2]) > 1  # the same fit blocks either way
    xr.testing.assert_identical(fits["memory"], fits["disk"])
    for a, b in zip(fits["memory"].data_vars.values(), fits["disk"].data_vars.values(), strict=True):
        assert a.values.tobytes() == b.values.tobytes()
    if local and not rolled:
        assert np.isnan(fits["memory"]["temperature"].isel(latitude=6, longitude=7)).all()
        assert np.isfinite(fits["memory"]["temperature"].isel(latitude=3, longitude=4)).all()


def test_in_memory_needs_the_budget_and_a_local_scheduler() -> None:
    arrays = xr.Dataset({"x__var": (("time", "latitude"), np.zeros((4, 3)))})
    assert chunked.in_memory(arrays, None)
    assert not chunked.in_memory(arrays, None, memory_bytes=0)
    assert chunked.in_memory(arrays, None, memory_bytes=arrays["x__var"].nbytes)

    class External:  # a Client of an existing cluster (tcp://…): no ``cluster`` of its own
        cluster = None

    assert not chunked.in_memory(arrays, External())


@pytest.mark.parametrize("case", ["gridpoint", "rolling_site"])
def test_cli_fit_in_memory_equals_disk_staging(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, case: str) -> None:
    """`smoe postprocess fit`: the same model file with the default budget and with MEMORY_BYTES = 0."""
    if case == "gridpoint":
        args = ["--per-gridpoint", "--forecast", str(gcm_ens_like(tmp_path / "a.nc", 2005, 1))]
    else:
        _table(tmp_path / "t.csv", n_sites=6, n_days=40)
        args = ["--per-site", "--forecast", str(tmp_path / "t.csv"), "--window", "10D", "--lag", "2D", "--dates",
                "2004-01-20", "2004-02-05"]
    models = {}
    for where, budget in (("memory", chunked.MEMORY_BYTES), ("disk", 0.0)):
        monkeypatch.setattr(chunked, "MEMORY_BYTES", budget)
        out = tmp_path / f"{where}.nc"
        assert main(["postprocess", "fit", "--method", "emos", *args, "--out", str(out), "--scheduler", "threads",
                     "--quiet"]) == 0
        models[where] = read_model(out)[0]
    xr.testing.assert_identical(models["memory"], models["disk"])
    for a, b in zip(models["memory"].data_vars.values(), models["disk"].data_vars.values(), strict=True):
        assert a.values.tobytes() == b.values.tobytes()
