"""Forecast runner and checkpoint loading: a forecast equals the network applied as in training, runs on a
store of another year with the CHECKPOINT's normalisation, handles ensembles, refuses bad input clearly;
`smoe forecast` → `smoe evaluate` end to end, checked by an independent xarray script."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import xarray as xr

from pipelines.prepare import write_store
from pipelines.world import simulate_world
from smoeweather.config import apply_overrides, read_config
from smoeweather.data.weather import WeatherBenchDataset
from smoeweather.evaluate.run import evaluate
from smoeweather.forecast import make_forecast, run_forecast
from smoeweather.training.checkpoint import load_trained
from smoeweather.training.run import train

REPO = Path(__file__).resolve().parents[2]
SMOE = (
    [str(REPO / ".venv" / "bin" / "smoe")]
    if (REPO / ".venv" / "bin" / "smoe").exists()
    else [sys.executable, "-m", "smoeweather.cli"]
)
EPS32 = float(np.finfo(np.float32).eps)
VARIABLES = "[geopotential_500, temperature_850, geopotential_250]"
TEST_INIT = ("2000-03-21", "2000-04-03")  # inside the test period of the tiny configs


def _store(path: Path, years: tuple[int, int], seed: int, n_steps: int, members: int = 0) -> str:
    ds = simulate_world(years, seed=seed, n_steps=n_steps)
    if members:  # an ensemble: the world plus member-wise perturbations (ERA5-EDA-like)
        rng = np.random.default_rng(seed)
        for v in ("geopotential", "temperature"):
            stacked = xr.concat([ds[v]] * members, "member").assign_coords(member=np.arange(members))
            noise = rng.normal(size=stacked.shape).astype(np.float32) * float(ds[v].std()) * 0.02
            ds[v] = (stacked + noise).transpose("time", "member", ...)
    write_store(lambda: ds, path, args={"test": "forecast"}, train_years=None, source="test", time_chunk=8,
                scheduler="synchronous", progress=False)
    return str(path)


@pytest.fixture(scope="module")
def other_year(tmp_path_factory: pytest.TempPathFactory) -> str:
    """Another run (seed 3) prepared for another year (2003, 30 days): never seen in training."""
    return _store(tmp_path_factory.mktemp("o") / "other.zarr", (2003, 2003), 3, 120)


def _train(config: str, world_store: str, out: Path, *extra: str) -> str:
    cfg = read_config(REPO / "configs" / "weatherbench" / f"{config}.yaml")
    overrides = [
        f"output_dir={out}", f"data.store={world_store}", "data.world=null", "data.sources=null",
        "data.num_workers=0", "data.batch_size=4", f"data.variables={VARIABLES}",
        "data.train_years=null", "data.valid_years=null", "data.test_years=null",
        "data.train_period=[2000-01-01, 2000-02-29T18:00]", "data.valid_period=[2000-03-01, 2000-03-20]",
        "data.test_period=[2000-03-21, 2000-04-09]", "data.lead_h=null", "data.lead_choices_h=[24, 48]",
        "model.width=8", "model.blocks=1", "trainer.accelerator=cpu", "trainer.devices=1",
        "trainer.max_epochs=1", "trainer.limit_train_batches=3", "trainer.limit_val_batches=1",
        "trainer.max_time=null", "trainer.enable_progress_bar=false", "trainer.deterministic=true",
        *extra,
    ]
    return train(apply_overrides(cfg, overrides)).last_checkpoint


@pytest.fixture(scope="module")
def dense(world_store: str, tmp_path_factory: pytest.TempPathFactory) -> str:
    """Continuous-lead dense ResNet (leads 24/48 h), 3 training steps."""
    return _train("world_dense", world_store, tmp_path_factory.mktemp("dense"))


@pytest.fixture(scope="module")
def smoe_fixed(world_store: str, tmp_path_factory: pytest.TempPathFactory) -> str:
    """Fixed-lead (24 h) SMoE ResNet with the land-sea prior, 3 training steps."""
    return _train("world_smoe_all_prior", world_store, tmp_path_factory.mktemp("smoe"), "data.lead_h=24")


def _net_forecast(ckpt: str, store: str, init: np.datetime64, lead: int, stats_store: str) -> np.ndarray:
    """The network applied exactly as in training: WeatherBenchDataset sample → net → denormalised."""
    trained = load_trained(ckpt)
    d = trained.config["data"]
    continuous = d.get("lead_h") is None
    lead_kw = {"lead_h": None, "lead_choices_h": [lead]} if continuous else {"lead_h": lead}
    ds = WeatherBenchDataset(store, d["variables"], d.get("target_variables"), d["input_offsets_h"],
                             constants=d["constants"], stats=xr.open_zarr(stats_store, group="statistics").load(),
                             **lead_kw)
    i = [k for k in range(len(ds)) if ds.init_time(k) == init][0]
    x, _ = ds[i]
    with torch.no_grad():
        return ds.denormalize_target(trained.model.net(x[None]))[0].numpy()


def _tolerance(ckpt: str) -> np.ndarray:
    """Per-target absolute tolerance: inputs normalised in float64 (dataset) vs float32 (model) differ by
    ≈ (|μ|/σ + 1)·eps32 ≲ 50 eps32 in normalised units; a tiny network amplifies that by < 10³ (generous),
    times σ of the target."""
    std = load_trained(ckpt).model.target_std.flatten().numpy()
    return 50 * EPS32 * 1e3 * std


def test_load_trained_rebuilds_the_training_module(dense: str, tmp_path: Path) -> None:
    t = load_trained(dense)
    assert t.task == "weatherbench" and not t.module.training and not t.model.training
    assert t.sha256 == hashlib.sha256(Path(dense).read_bytes()).hexdigest()  # the file's digest computed twice
    saved = torch.load(dense, map_location="cpu", weights_only=False)["state_dict"]
    for k, v in t.module.state_dict().items():
        assert torch.equal(v, saved[k]), k  # loaded, not computed: exact
    with pytest.raises(FileNotFoundError, match="nothere.ckpt"):
        load_trained(tmp_path / "nothere.ckpt")
    (tmp_path / "junk.ckpt").write_text("not a checkpoint")
    with pytest.raises(ValueError, match="junk.ckpt"):
        load_trained(tmp_path / "junk.ckpt")
    torch.save({"state_dict": {}}, tmp_path / "foreign.ckpt")
    with pytest.raises(ValueError, match="foreign.ckpt"):
        load_trained(tmp_path / "foreign.ckpt")


@pytest.mark.parametrize("which", ["dense", "smoe_fixed"])
def test_forecast_equals_network_as_in_training(which: str, request: pytest.FixtureRequest, world_store: str) -> None:
    ckpt = request.getfixturevalue(which)
    lead = 24
    fc = make_forecast(world_store, checkpoint=ckpt, init=TEST_INIT, every="24h", leads_h=(lead,), progress=False,
                       batch_size=3)
    assert fc.attrs["forecast_kind"] == "deterministic"
    assert list(fc["geopotential"].dims) == ["time", "prediction_timedelta", "level", "latitude", "longitude"]
    assert np.all(np.diff(fc["latitude"].values) > 0) and fc["geopotential"].attrs["units"] == "m**2 s**-2"
    tol = _tolerance(ckpt)
    for init in fc["time"].values[[0, -1]]:
        ref = _net_forecast(ckpt, world_store, init, lead, world_store)
        got = [fc["geopotential"].sel(time=init, level=500).isel(prediction_timedelta=0).values,
               fc["temperature"].sel(time=init, level=850).isel(prediction_timedelta=0).values]
        for c in range(2):
            np.testing.assert_allclose(got[c], ref[c], rtol=0, atol=tol[c])
    # levels that were not forecast are NaN (temperature only at 850 hPa)
    assert bool(fc["temperature"].sel(level=500).isnull().all())


def test_forecast_on_another_year_uses_checkpoint_normalisation(dense: str, world_store: str, other_year: str) -> None:
    fc = make_forecast(other_year, checkpoint=dense, init=("2003-01-02", "2003-01-20"), leads_h=("24h", "48h"),
                       progress=False)
    assert fc.sizes["time"] == 37 and np.isfinite(fc["geopotential"].sel(level=500)).all()
    init = fc["time"].values[5]
    ref = _net_forecast(dense, other_year, init, 48, stats_store=world_store)  # statistics of the TRAINING store
    got = fc["geopotential"].sel(time=init, level=500, prediction_timedelta=np.timedelta64(48, "h")).values
    np.testing.assert_allclose(got, ref[0], rtol=0, atol=_tolerance(dense)[0])
    fc.to_zarr(Path(other_year).with_suffix(".fc.zarr"), zarr_format=2)
    s = evaluate({"dense": Path(other_year).with_suffix(".fc.zarr")}, other_year, climatology=world_store)
    assert set(s["method"].values) == {"dense", "persistence", "climatology"}
    assert np.isfinite(s["rmse"].values).all() and np.isfinite(s["acc"].sel({"method": "dense"})).all()


def test_bad_requests_are_clear_errors(dense: str, smoe_fixed: str, world_store: str, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="fixed-lead model"):
        make_forecast(world_store, checkpoint=smoe_fixed, init=TEST_INIT, leads_h=(48,))
    with pytest.raises(ValueError, match=r"input at init -12 h"):
        make_forecast(world_store, checkpoint=dense, init=("2000-01-01", "2000-01-03"), leads_h=(24,))
    with pytest.raises(ValueError, match="truth"):
        make_forecast(world_store, checkpoint=dense, init=("2000-04-05", "2000-04-09"), leads_h=(48,))
    assert make_forecast(world_store, checkpoint=dense, init=("2000-04-05", "2000-04-09"), leads_h=(48,),
                         beyond_data=True, progress=False).sizes["time"] == 9
    xr.open_zarr(world_store).sel(level=[500, 850]).to_zarr(tmp_path / "no250.zarr", zarr_format=2)
    with pytest.raises(ValueError, match="geopotential_250"):
        make_forecast(tmp_path / "no250.zarr", checkpoint=dense, init=TEST_INIT, leads_h=(24,))
    xr.open_zarr(world_store).drop_vars("land_sea_mask").to_zarr(tmp_path / "nolsm.zarr", zarr_format=2)
    with pytest.raises(ValueError, match="land_sea_mask"):
        make_forecast(tmp_path / "nolsm.zarr", checkpoint=dense, init=TEST_INIT, leads_h=(24,))
    r = subprocess.run([*SMOE, "forecast", str(tmp_path / "missing.ckpt"), "--data", world_store, "--init", *TEST_INIT,
                        "--out", str(tmp_path / "x.zarr")], capture_output=True, text=True)
    assert r.returncode == 2 and "missing.ckpt" in r.stderr


def test_ensemble_store_gives_member_dim_and_crps(dense: str, tmp_path: Path) -> None:
    ens = _store(tmp_path / "ens.zarr", (2000, 2000), 0, 120, members=3)
    fc = make_forecast(ens, checkpoint=dense, init=("2000-01-05", "2000-01-10"), leads_h=(24,), progress=False)
    assert fc.attrs["forecast_kind"] == "ensemble" and fc.sizes["member"] == 3
    xr.open_zarr(ens).isel(member=0, drop=True).to_zarr(tmp_path / "m0.zarr", zarr_format=2)
    m0 = make_forecast(tmp_path / "m0.zarr", checkpoint=dense, init=("2000-01-05", "2000-01-10"), leads_h=(24,),
                       progress=False)
    np.testing.assert_allclose(fc["geopotential"].isel(member=0).values, m0["geopotential"].values, rtol=0,
                               atol=_tolerance(dense)[0])
    fc.to_zarr(tmp_path / "fc.zarr", zarr_format=2)
    truth = _store(tmp_path / "truth.zarr", (2000, 2000), 0, 120)
    s = evaluate({"ens": tmp_path / "fc.zarr"}, truth, references=False)
    assert {"crps", "spread_skill", "rmse"} <= set(s.data_vars)
    assert float(s["crps"].sel({"method": "ens"}).min()) > 0


INDEPENDENT_RMSE = '''
import sys, json, numpy as np, xarray as xr
fc, truth = xr.open_zarr(sys.argv[1]), xr.open_zarr(sys.argv[2])
out = {}
for var, level in (("geopotential", 500), ("temperature", 850)):
    f = fc[var].sel(level=level)
    t = truth[var].sel(level=level)
    w = np.cos(np.deg2rad(f.latitude))
    w = w / w.mean()
    for lead in f.prediction_timedelta.values:
        valid = f.time.values + lead
        keep = np.isin(valid, t.time.values)
        err = f.sel(prediction_timedelta=lead).isel(time=keep).values - t.sel(time=valid[keep]).values
        mse_t = (err.astype(np.float64) ** 2 * w.values[:, None]).mean(axis=(1, 2))
        out[f"{var}_{level} {int(lead / np.timedelta64(1, 'h'))}h"] = float(np.sqrt(mse_t.mean()))
print(json.dumps(out))
'''


def test_cli_forecast_evaluate_end_to_end_and_independent_script(dense: str, world_store: str, tmp_path: Path) -> None:
    fc, out = tmp_path / "fc.zarr", tmp_path / "scores"
    run = [*SMOE, "forecast", dense, "--data", world_store, "--init", *TEST_INIT, "--every", "12h", "--lead", "24h",
           "48h", "--out", str(fc), "--no-progress"]
    r = subprocess.run(run, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    r = subprocess.run([*SMOE, "evaluate", str(fc), "--truth", world_store, "--climatology", world_store,
                        "--out", str(out)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "persistence" in r.stdout and (out / "scores.json").is_file() and (out / "scores.md").is_file()
    # progress when piped: one line per stage, no carriage-return redraws
    assert "evaluate: scoring" in r.stderr and "\r" not in r.stderr
    ds = xr.open_zarr(fc)
    assert ds.attrs["checkpoint_sha256"] == hashlib.sha256(Path(dense).read_bytes()).hexdigest()
    assert ds.attrs["data_source"] == str(Path(world_store).resolve()) and ds.attrs["code_version"].startswith("0.")
    method = ds.attrs["method"]
    scores = xr.load_dataset(out / "scores.nc")
    r = subprocess.run([sys.executable, "-c", INDEPENDENT_RMSE, str(fc), world_store], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    import json

    independent = json.loads(r.stdout)
    for key, value in independent.items():
        field, lead = key.split()
        ours = scores["rmse"].sel({"method": method, "field": field, "region": "global",
                                   "prediction_timedelta": np.timedelta64(int(lead[:-1]), "h")}).item()
        # float64 sums of ~2·10⁴ float32 errors in both: rounding ≪ 1e-9 relative; allow 1e-9
        assert ours == pytest.approx(value, rel=1e-9), key


def test_persistence_reference_matches_numpy(dense: str, world_store: str, tmp_path: Path) -> None:
    """(Moved from the removed `smoe skill`.) Persistence beside a model: the numpy formula on the store."""
    fc = tmp_path / "skill_fc.zarr"
    run_forecast(world_store, checkpoint=dense, init=TEST_INIT, leads_h=(24,), out=fc, progress=False, name="dense")
    s = evaluate(fc, world_store, climatology=world_store)
    truth = xr.open_zarr(world_store)["geopotential"].sel(level=500).load()
    inits = xr.open_zarr(fc)["time"].values
    lead = np.timedelta64(24, "h")
    err = truth.sel(time=inits + lead).values.astype(np.float64) - truth.sel(time=inits).values
    w = np.cos(np.deg2rad(truth.latitude.values))
    w = (w / w.mean())[:, None]
    expected = float(np.sqrt((err**2 * w).mean(axis=(1, 2)).mean()))
    got = s["rmse"].sel({"method": "persistence", "field": "geopotential_500"}).item()
    assert got == pytest.approx(expected, rel=1e-9)
    assert int(s["n_time"].sel(field="geopotential_500").item()) == len(inits)
    model = s["rmse"].sel({"method": "dense"})
    assert np.isfinite(model).all() and float(s["rmse"].sel({"method": "climatology"}).min()) > 0
