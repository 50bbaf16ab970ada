"""The GCM worlds generated on the CPU (``smoe data gcm-world`` / ``gcm-ens``, extra ``[gcm]``).

A few simulated days at T21 with a 60-minute step: the files have the layout of the shared ``gcm_world`` /
``gcm_ens`` files (names, dims, units, grid), the geopotential is hydrostatic with the temperature, the
forcing has the land-sea and seasonal terms the README describes, the imperfect model is what it says, and
runs are reproducible from their seed.
"""

from __future__ import annotations

import numpy as np
import pytest
import xarray as xr
from conftest import SHARED_DATA, needs_shared

from smoeweather.cli import main

pytest.importorskip("dinosaur_torch", reason="needs the [gcm] extra (dinosaur-torch): pip install -e '.[gcm]'")
gcm = pytest.importorskip("pipelines.gcm", reason="needs the [gcm] extra: pip install -e '.[gcm]'")

FAST = ["--truncation", "21", "--dt-minutes", "60", "--spin-up-days", "1", "--quiet"]
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> xr.Dataset:
    out = tmp_path_factory.mktemp("gcm_world")
    assert main(["data", "gcm-world", "--out", str(out), "--years", "1", "--days", "2", *FAST]) == 0
    return xr.load_dataset(out / "gcm_5.625deg_year1.nc")


@pytest.fixture(scope="module")
def ens(tmp_path_factory: pytest.TempPathFactory) -> xr.Dataset:
    out = tmp_path_factory.mktemp("gcm_ens")
    assert main(["data", "gcm-ens", "--out", str(out), "--year", "2005", "--days", "2", "--members", "3",
                 "--every-days", "2", *FAST]) == 0
    return xr.load_dataset(out / "gcm_ens_2005.nc")


def _layout(ds: xr.Dataset) -> dict:
    return {name: (var.dims, var.attrs.get("units")) for name, var in ds.data_vars.items()}


def test_world_file_has_the_shared_layout(world: xr.Dataset) -> None:
    assert world.sizes == {"time": 8, "level": 5, "latitude": 32, "longitude": 64}
    assert world["level"].values.tolist() == [250, 500, 700, 850, 925]
    assert np.allclose(world["latitude"], -87.1875 + 5.625 * np.arange(32))
    assert np.allclose(world["longitude"], 5.625 * np.arange(64))
    assert str(world["time"].values[0])[:10] == "2001-01-01"
    assert np.diff(world["time"].values).astype("timedelta64[h]").astype(int).tolist() == [6] * 7
    shared = SHARED_DATA / "gcm_world" / "gcm_5.625deg_year1.nc"
    if shared.exists():
        with xr.open_dataset(shared) as ref:
            assert _layout(world) == {k: v for k, v in _layout(ref).items()}
    # physically sensible magnitudes (isothermal rest + 3 days of forcing: far from the climate, near Earth's)
    z500 = world["geopotential"].sel(level=500)
    assert 48_000 < float(z500.mean()) < 60_000
    assert 200 < float(world["temperature"].min()) and float(world["temperature"].max()) < 320
    assert float(world["land_sea_mask"].max()) == pytest.approx(1.0) and float(world["land_sea_mask"].min()) == 0.0
    tibet = world["geopotential_at_surface"].sel(latitude=33, longitude=87, method="nearest")
    assert float(tibet) > 9.8 * 2000  # the Tibetan plateau (4500 m peak, smoothed by the T21 truncation)


def test_geopotential_is_hydrostatic(world: xr.Dataset) -> None:
    """Z850 − Z500 = R·T̄·ln(850/500), T̄ the ln p mean temperature of the layer (trapezoid in ln p between
    the levels' temperatures and the 700 hPa one: second order in the layer's lapse-rate curvature)."""
    t = world["temperature"]
    lnp = np.log([500.0, 700.0, 850.0])
    tm = ((t.sel(level=500) + t.sel(level=700)) * (lnp[1] - lnp[0]) / 2
          + (t.sel(level=700) + t.sel(level=850)) * (lnp[2] - lnp[1]) / 2) / (lnp[2] - lnp[0])
    thickness = world["geopotential"].sel(level=500) - world["geopotential"].sel(level=850)
    expected = 287.0 * tm * np.log(850 / 500)
    above = world["surface_pressure"] > 90_000  # where 850 hPa lies above the ground (no extrapolation)
    rel = np.abs(thickness - expected).where(above) / expected
    assert float(rel.max()) < 0.01


def test_forcing_has_land_drag_and_seasons() -> None:
    model = gcm.GCM(gcm.WorldPhysics(), truncation=21)
    kv = model._kv.numpy()[-1]  # lowest layer, (lon, lat)
    land = model._land_profile.numpy()[-1] > 0
    ratio = kv.max() / kv[~land].max()
    assert ratio == pytest.approx(2.5, rel=0.02)  # drag ×2.5 over full land
    imperfect = gcm.GCM(gcm.WorldPhysics().imperfect(), truncation=21)
    kv_imperfect = imperfect._kv.numpy()[-1]
    assert kv_imperfect.max() == pytest.approx(kv_imperfect[~land].max(), rel=1e-6)  # no extra land drag
    assert imperfect.physics.land_heat_factor == 0.3 and imperfect.physics.land_kt_frac == 0.0
    assert model._season(0.0) != model._season(model._day * 182)  # the cycle turns over half a year
    model.start_doy = 172.0
    assert model._season(0.0) == pytest.approx(1.0)  # northern summer solstice: land anomaly at its maximum


def test_ensemble_file_has_the_shared_layout(ens: xr.Dataset) -> None:
    assert ens["geopotential"].dims == ("time", "prediction_timedelta", "member", "level", "latitude", "longitude")
    assert ens.sizes["member"] == 3 and ens["level"].values.tolist() == [500, 850]
    assert (ens["prediction_timedelta"].values.astype("timedelta64[h]").astype(int)).tolist() == [24, 48]
    assert ens["truth_geopotential"].dims == ("valid_time", "level", "latitude", "longitude")
    shared = SHARED_DATA / "gcm_ens" / "gcm_ens_2005.nc"
    if shared.exists():
        with xr.open_dataset(shared) as ref:
            assert _layout(ens) == _layout(ref)
    spread = ens["temperature"].std("member").mean(["level", "latitude", "longitude"])
    assert float(spread.isel(time=0, prediction_timedelta=0)) > 0  # perturbed members differ
    err = (ens["temperature"].mean("member").isel(time=0)
           - ens["truth_temperature"].sel(valid_time=ens["time"][0] + ens["prediction_timedelta"]).values)
    assert float(abs(err).mean()) > 0  # the imperfect model drifts from the truth


def test_same_seed_same_file(tmp_path, world: xr.Dataset) -> None:
    assert main(["data", "gcm-world", "--out", str(tmp_path), "--years", "1", "--days", "2", *FAST]) == 0
    with xr.open_dataset(tmp_path / "gcm_5.625deg_year1.nc") as again:
        # the same seed and code on the same machine: a rerun is bit-identical
        xr.testing.assert_identical(again, world)  # every variable, constant and attribute
    assert main(["data", "gcm-world", "--out", str(tmp_path), "--years", "1", "--days", "2", *FAST]) == 2  # exists


def test_short_spin_up_is_labelled_an_unspun_preview(world: xr.Dataset) -> None:
    assert world.attrs["spun_up"] == "no" and world.attrs["title"].startswith("UNSPUN PREVIEW")
    assert "1 days of spin-up instead of 200" in world.attrs["preview"]


def test_defaults_are_the_published_configurations() -> None:
    import argparse

    from smoeweather.commands import data

    parser = argparse.ArgumentParser()
    data.add_parser(parser.add_subparsers(dest="command"))
    world = parser.parse_args(["data", "gcm-world", "--out", "x"])
    assert (world.truncation, world.dt_minutes, world.spin_up_days, world.preview) == (31, 20.0, None, False)
    ens = parser.parse_args(["data", "gcm-ens", "--out", "x"])
    assert (ens.truncation, ens.dt_minutes, ens.members, ens.every_days) == (21, 30.0, 10, 2)
    assert gcm.SPIN_UP_DAYS == 200.0 and gcm.FILTER == dict(tau=0.0087504, order=1.5, cutoff=0.8)
    assert (gcm.INIT_SEA_LEVEL_PA, gcm.INIT_PERTURBATION_PA) == (1.011e5, 5e3)
    assert gcm.WorldPhysics().imperfect().land_drag_factor == 1.0


def test_default_run_says_how_long_the_spin_up_takes(capsys: pytest.CaptureFixture[str]) -> None:
    import argparse

    from smoeweather.commands import data

    args = argparse.Namespace(data_verb="gcm-world", truncation=31, dt_minutes=20.0)
    data._announce(args, gcm, 200.0)
    err = capsys.readouterr().err
    assert "200 simulated days of spin-up" in err and " min " in err and "--preview" in err
    data._announce(args, gcm, 5.0)
    assert "UNSPUN PREVIEW" in capsys.readouterr().err


def test_orography_and_land_are_the_published_ones() -> None:
    """The six anisotropic mountains, spectrally filtered at T31, and the smoothed land fraction give the
    published files' constants (stored clipped at 0 m)."""
    model = gcm.GCM(gcm.WorldPhysics(), truncation=31, dt_minutes=20.0)
    phis = np.maximum(gcm.G * model.height_wb_smooth, 0.0)
    assert phis.max() == pytest.approx(33_677, rel=1e-3)  # the Tibetan peak after filtering
    assert 0 <= model.land_model.min() and model.land_model.max() <= 1
    shared = SHARED_DATA / "gcm_world" / "gcm_5.625deg_year1.nc"
    if not shared.exists():
        pytest.skip(needs_shared("gcm_world", shared.name) + " (to compare with the published constants)")
    with xr.open_dataset(shared) as ref:
        assert np.abs(phis - ref["geopotential_at_surface"].values).max() < 5.0  # m² s⁻²
        # land_wb is the shipped lsm file's float32 values, copied into the published files: no arithmetic
        assert np.array_equal(model.land_wb.astype("float32"), ref["land_sea_mask"].values)


def test_mass_is_conserved() -> None:
    """Global mean surface pressure over 2 simulated days stays within 0.005 % (the unfiltered orography
    lost 0.02 % a day to the step filter, and the world's Z500 sank by 10 % over a spin-up)."""
    import torch

    model = gcm.GCM(gcm.WorldPhysics(), truncation=21, dt_minutes=60.0)
    grid = model.grid

    def mass(state: object) -> float:
        return float(grid.to_modal(torch.exp(grid.to_nodal(state.log_surface_pressure)))[0, 0, 0])

    state = model.rest_state(0)
    m0 = mass(state)
    state = model.advance(state, 48)
    assert mass(state) / m0 == pytest.approx(1.0, abs=5e-5)


def test_missing_core_names_the_extra(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
                                      tmp_path) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "dinosaur_torch", None)
    assert main(["data", "gcm-ens", "--out", str(tmp_path), "--quiet"]) == 2
    assert "pip install -e .[gcm]" in capsys.readouterr().err
