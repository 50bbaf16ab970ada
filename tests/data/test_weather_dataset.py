"""Streaming datasets: no off-by-one between input and target times, normalisation, workers, splits."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch
import xarray as xr
from fake_layouts import EPS32, f32_atol
from torch.utils.data import DataLoader

from pipelines.prepare import write_store
from smoeweather.data.weather import WeatherBenchDataset
from smoeweather.training.datamodule import SplitDataModule

FIELDS = [("geopotential", 500), ("temperature", 850)]


def _store(path, ds: xr.Dataset, train_years=None) -> str:
    write_store(
        lambda: ds,
        path,
        args={"test": 1},
        train_years=train_years,
        source="test",
        time_chunk=8,
        scheduler="synchronous",
        progress=False,
        plausibility_check=False,  # random fields (any misalignment shows), not an atmosphere
    )
    return str(path)


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> str:
    """Random fields (any time misalignment shows) for the first 40 days of 2000, 2001 and 2002."""
    time = pd.date_range("2000-01-01", "2002-12-31 18:00", freq="6h")
    time = time[time.day_of_year <= 40]
    rng = np.random.default_rng(0)
    shape = (len(time), 2, 8, 16)
    ds = xr.Dataset(
        {
            "geopotential": (
                ("time", "level", "latitude", "longitude"),
                54_000 + 3_000 * rng.normal(size=shape),
            ),
            "temperature": (("time", "level", "latitude", "longitude"), 275 + 15 * rng.normal(size=shape)),
            "land_sea_mask": (("latitude", "longitude"), rng.uniform(size=(8, 16))),
            "geopotential_at_surface": (("latitude", "longitude"), 5_000 * rng.uniform(size=(8, 16))),
        },
        coords={
            "time": time,
            "level": [500, 850],
            "latitude": np.linspace(-78.75, 78.75, 8),
            "longitude": np.arange(16) * 22.5,
        },
    )
    return _store(tmp_path_factory.mktemp("wb") / "store.zarr", ds, train_years=(2000, 2001))


def test_no_off_by_one_persistence_equals_shifted_truth(store: str) -> None:
    truth = xr.open_zarr(store)
    ds = WeatherBenchDataset(store, FIELDS, lead_h=72, years=(2001, 2001))
    assert ds.channel_names[:3] == ["geopotential_500@-12h", "temperature_850@-12h", "geopotential_500@-6h"]
    assert ds.channel_names[-3:] == ["land_sea_mask", "geopotential_at_surface", "latitude"]
    assert len(ds) == 40 * 4 - 2 - 12  # inputs need t−12 h, targets t+72 h, all inside 2001
    n_in = len(FIELDS)
    errors_ds, errors_truth = [], []
    for i in range(0, len(ds), 7):
        x, y = ds[i]
        t0, t1 = ds.init_time(i), ds.valid_time(i)
        assert t1 - t0 == np.timedelta64(72, "h")
        # persistence forecast built from the dataset: the inputs at t, denormalised
        x_t = x[2 * n_in : 3 * n_in].numpy() * ds.input_std[:, None, None] + ds.input_mean[:, None, None]
        y_phys = ds.denormalize_target(y).numpy()
        for c, (name, level) in enumerate(FIELDS):
            at = truth[name].sel(level=level)
            tol = f32_atol(at.values, ds.input_mean[c])  # normalise, float32, denormalise
            np.testing.assert_allclose(x_t[c], at.sel(time=t0).values, rtol=0, atol=tol)
            y_want = at.sel(time=t0 + np.timedelta64(72, "h")).values
            np.testing.assert_allclose(y_phys[c], y_want, rtol=0, atol=tol)
            x_m12 = x[c].numpy() * ds.input_std[c] + ds.input_mean[c]
            np.testing.assert_allclose(x_m12, at.sel(time=t0 - np.timedelta64(12, "h")).values, rtol=0, atol=tol)
        errors_ds.append(y_phys - x_t)
        z = truth["geopotential"].sel(level=500)
        errors_truth.append(z.sel(time=t1).values - z.sel(time=t0).values)
    z_max = truth["geopotential"].values  # both terms of each difference carry float32 round trips
    np.testing.assert_allclose(np.stack(errors_ds)[:, 0], np.stack(errors_truth), rtol=0, atol=2 * f32_atol(z_max))


def test_normalisation_from_training_years_and_round_trip(store: str) -> None:
    stats = xr.open_zarr(store, group="statistics")
    assert stats.attrs["train_years"] == [2000, 2001]
    ds = WeatherBenchDataset(store, FIELDS, years=(2002, 2002))
    want_mean = float(stats["geopotential"].sel(statistic="mean", level=500))
    assert ds.target_mean[0] == pytest.approx(want_mean, rel=EPS32)  # float64 statistic held as float32
    x, y = ds[3]
    assert x.dtype == torch.float32 and x.shape == (3 * 2 + 3, 8, 16) and y.shape == (2, 8, 16)
    raw = ds.raw_target(3)
    np.testing.assert_allclose(ds.denormalize_target(y).numpy(), raw, rtol=0, atol=f32_atol(raw, ds.target_mean))
    assert abs(float(x[:6].mean())) < 0.2 and 0.8 < float(x[:6].std()) < 1.2


def test_continuous_lead_time(store: str) -> None:
    ds = WeatherBenchDataset(store, FIELDS[:1], lead_h=None, lead_choices_h=(6, 24, 120), years=(2000, 2000))
    assert len(ds) == 3 * (160 - 2 - 20)
    x, y = ds[4]  # second init, lead 24 h
    assert ds.lead_time(4) == np.timedelta64(24, "h") and ds.channel_names[-1] == "lead_time/100h"
    assert float(x[-1].mean()) == pytest.approx(0.24, rel=EPS32)  # 24/100 as float32
    assert ds.valid_time(4) - ds.init_time(4) == np.timedelta64(24, "h")
    want = xr.open_zarr(store)["geopotential"].sel(level=500, time=ds.valid_time(4)).values
    np.testing.assert_allclose(
        ds.denormalize_target(y).numpy()[0], want, rtol=0, atol=f32_atol(want, ds.target_mean)
    )


def test_dataloader_with_two_workers(store: str) -> None:
    ds = WeatherBenchDataset(store, FIELDS, years=(2000, 2000))
    loader = DataLoader(ds, batch_size=4, num_workers=2, shuffle=False)
    xb, yb = next(iter(loader))
    assert xb.shape == (4, 9, 8, 16)
    torch.testing.assert_close(xb[3], ds[3][0])
    torch.testing.assert_close(yb[1], ds[1][1])


def test_datamodule_year_splits(store: str) -> None:
    years = {"train": (2000, 2001), "valid": (2002, 2002), "test": (2002, 2002)}
    dm = SplitDataModule(
        lambda: {split: WeatherBenchDataset(store, FIELDS, years=y, lead_h=120) for split, y in years.items()},
        batch_size=8,
    )
    dm.setup("fit")
    years = {pd.Timestamp(dm.dataset("train").valid_time(i)).year for i in range(len(dm.dataset("train")))}
    assert years == {2000, 2001}
    xb, yb = next(iter(dm.val_dataloader()))
    assert xb.shape == (8, 9, 8, 16) and pd.Timestamp(dm.dataset("valid").init_time(0)).year == 2002


def test_bad_requests_are_clear_errors(store: str) -> None:
    with pytest.raises(ValueError, match=r"years \(1979, 2015\) are outside the data.*2000–2002"):
        WeatherBenchDataset(store, FIELDS, years=(1979, 2015))
    with pytest.raises(ValueError, match="specific_humidity"):
        WeatherBenchDataset(store, [("specific_humidity", 500)])
    with pytest.raises(ValueError, match="no level 250"):
        WeatherBenchDataset(store, [("geopotential", 250)])
    with pytest.raises(ValueError, match="no samples"):
        WeatherBenchDataset(store, FIELDS, lead_h=24 * 45, years=(2000, 2000))
    with pytest.raises(FileNotFoundError, match="nowhere"):
        WeatherBenchDataset("nowhere.zarr", FIELDS)


def test_ens10_store_mean_std_inputs_and_truth_target(tmp_path) -> None:
    """An ENS-10 store (one lead, ``<name>_truth`` on init times) goes through the one ensemble convention:
    x = [ens mean, ens std] normalised by the training statistics, y = the truth at init + lead."""
    from smoeweather.data.ensemble_dataset import open_ensemble_dataset

    time = pd.date_range("2016-01-04", periods=6, freq="3D4h")
    rng = np.random.default_rng(2)
    ens = 5_000 + 100 * rng.normal(size=(6, 5, 1, 4, 8))
    ds = xr.Dataset(
        {
            "geopotential": (("time", "member", "level", "latitude", "longitude"), ens),
            "geopotential_truth": (
                ("time", "level", "latitude", "longitude"),
                ens.mean(1) + rng.normal(size=(6, 1, 4, 8)),
            ),
        },
        coords={
            "time": time,
            "member": np.arange(5),
            "level": [500],
            "latitude": [-60.0, -20, 20, 60],
            "longitude": np.arange(8) * 45.0,
            "prediction_timedelta": np.timedelta64(48, "h"),
        },
    )
    store = _store(tmp_path / "ens.zarr", ds)
    data = open_ensemble_dataset(store, {"variables": ["geopotential_500"]})
    assert data.spec.leads_h == (48,)
    x, y, mu, sigma = data[2]
    assert x.shape == (2, 4, 8) and data.channel_names == [
        "geopotential_500_ens_mean@48h",
        "geopotential_500_ens_std@48h",
    ]
    mean, std = data.stats["geopotential_500"]
    ens32 = ens.astype(np.float32)  # the store holds float32
    tol = f32_atol(ens[2, :, 0], mean)  # normalise, float32, denormalise
    np.testing.assert_allclose(mu.numpy()[0] * std + mean, ens32[2, :, 0].astype(np.float64).mean(0), rtol=0,
                               atol=tol)
    np.testing.assert_allclose(mean, ens32.astype(np.float64).mean(1).mean(), rtol=0, atol=tol)
    spread = np.asarray(ens32[2, :, 0], np.float64).std(0, ddof=1)
    np.testing.assert_allclose(sigma.numpy()[0] * std, spread, rtol=4 * EPS32, atol=f32_atol(ens))
    truth = np.asarray(ds["geopotential_truth"][2, 0])
    np.testing.assert_allclose(y.numpy()[0] * std + mean, truth, rtol=0, atol=tol)
