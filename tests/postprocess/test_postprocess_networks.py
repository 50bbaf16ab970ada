"""Post-processing networks through the one ensemble convention: train on one gcm_ens-layout stream, apply the
checkpoint to another, per-level land-sea gate priors, lead modes, refusals."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
import xarray as xr

from smoeweather.cli import main
from smoeweather.data import forecast_stores
from smoeweather.data.ensemble_dataset import EnsembleSpec, open_ensemble_dataset
from smoeweather.data.forecast_stores import split_times
from smoeweather.models.unet import PostprocessingUNet, gaussian_heads
from smoeweather.postprocess.neural import apply_checkpoint

REPO = Path(__file__).resolve().parents[2]
EPS32 = float(np.finfo(np.float32).eps)


def write_gcm_ens(path: Path, start: str, inits: int = 24, members: int = 4, seed: int = 0,
                  grid: tuple[int, int] = (8, 16)) -> Path:
    """A file in the exact layout of ../shared/data/gcm_ens: forecasts (time, prediction_timedelta, member,
    level, latitude, longitude) and ``truth_<name>`` on ``valid_time``, CF-packed int16, constants, latitude
    ascending; the forecast has a land-dependent bias, so post-processing has something to learn."""
    rng = np.random.default_rng(seed)
    ny, nx = grid
    lat = np.linspace(-90 + 90 / ny, 90 - 90 / ny, ny)
    lon = np.arange(nx) * 360.0 / nx
    land = (np.sin(np.deg2rad(lon))[None, :] * np.cos(np.deg2rad(lat))[:, None] > 0.3).astype(np.float32)
    time = pd.date_range(start, periods=inits, freq="2D")
    valid = pd.date_range(start, periods=2 * inits + 2, freq="1D")
    base = {"geopotential": np.array([54000.0, 14000.0]), "temperature": np.array([252.0, 275.0])}
    amp = {"geopotential": 400.0, "temperature": 4.0}
    truth, fc = {}, {}
    for name in base:
        walk = np.cumsum(rng.normal(size=(len(valid), 2, ny, nx)), axis=0) * 0.2
        truth[name] = base[name][None, :, None, None] + amp[name] * (walk + np.sin(np.deg2rad(lat))[:, None])
        f = np.empty((inits, 2, members, 2, ny, nx))
        for k, lead in enumerate((1, 2)):
            later = truth[name][2 * np.arange(inits) + lead]  # (T, level, H, W)
            bias = 0.3 * amp[name] * land * lead  # imperfect model: error over land grows with lead
            f[:, k] = (later + bias)[:, None] + 0.1 * amp[name] * lead * rng.normal(size=(inits, members, 2, ny, nx))
        fc[name] = f
    enc = {"geopotential": 10.0, "temperature": 0.02}
    data = {}
    for name in base:
        data[name] = (("time", "prediction_timedelta", "member", "level", "latitude", "longitude"), fc[name],
                      {"units": "m2 s-2" if name == "geopotential" else "K"})
        data["truth_" + name] = (("valid_time", "level", "latitude", "longitude"), truth[name],
                                 {"units": "m2 s-2" if name == "geopotential" else "K"})
    data["land_sea_mask"] = (("latitude", "longitude"), land)
    data["geopotential_at_surface"] = (("latitude", "longitude"), 9.81 * 500 * land)
    ds = xr.Dataset(data, coords={"time": time, "prediction_timedelta": pd.to_timedelta([24, 48], "h"),
                                  "member": np.arange(members), "level": np.array([500, 850], np.int32),
                                  "latitude": lat, "longitude": lon, "valid_time": valid})
    encoding = {}
    for name in base:
        offset = float(np.round(base[name].mean()))
        for var in (name, "truth_" + name):
            encoding[var] = {"dtype": "int16", "scale_factor": enc[name], "add_offset": offset, "_FillValue": -32768}
    ds.to_netcdf(path, encoding=encoding)
    return path


@pytest.fixture(scope="module")
def streams(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("gcm_ens")
    return {"a": write_gcm_ens(folder / "ens_2005.nc", "2005-01-01", seed=1),
            "b": write_gcm_ens(folder / "ens_2006.nc", "2006-01-01", seed=2)}


def test_open_ensemble_convention_and_several_files(streams: dict[str, Path]) -> None:
    fc = forecast_stores.open_ensemble([streams["a"], streams["b"]])
    assert list(fc["geopotential"].dims) == ["time", "prediction_timedelta", "member", "level", "latitude",
                                             "longitude"]
    assert fc.sizes["time"] == 48 and fc.attrs["forecast_kind"] == "ensemble"
    truth = forecast_stores.open_truth(None, [streams["a"], streams["b"]])
    at_valid = forecast_stores.truth_at_valid_times(fc, truth)
    raw = xr.load_dataset(streams["b"])
    t0 = raw["time"].values[3] + np.timedelta64(48, "h")
    np.testing.assert_array_equal(at_valid["temperature"].sel(time=raw["time"].values[3]).isel(prediction_timedelta=1),
                                  raw["truth_temperature"].sel(valid_time=t0))
    with pytest.raises(ValueError, match="repeat"):
        forecast_stores.open_ensemble([streams["a"], streams["a"]])


def test_split_times_bound_valid_times() -> None:
    t = pd.date_range("2006-01-01", periods=10, freq="2D").values
    keep = split_times(t, 48, period=["2006-01-03", "2006-01-11"])
    # inits ≥ Jan 3 whose 48 h valid time is ≤ Jan 11: Jan 3, 5, 7, 9
    assert [str(x)[:10] for x in t[keep]] == ["2006-01-03", "2006-01-05", "2006-01-07", "2006-01-09"]


def test_lead_as_input_samples(streams: dict[str, Path]) -> None:
    cfg = {"variables": ["geopotential_500", "temperature_850"], "leads_h": [24, 48], "lead_as_input": True}
    data = open_ensemble_dataset(streams["a"], cfg)
    assert len(data) == 2 * 24
    x, y, m, s = data[1]  # init 0, lead 48 h
    assert x.shape == (2 * 2 + 1, 8, 16) and y.shape == (2, 8, 16)
    assert torch.all(x[-1] == 1.0) and torch.all(data[0][0][-1] == 0.5)  # lead / longest lead
    stacked = open_ensemble_dataset(streams["a"], {**cfg, "lead_as_input": False})
    assert len(stacked) == 24 and stacked[0][0].shape == (2 * 2 * 2, 8, 16)
    torch.testing.assert_close(stacked[0][1][2:], y)  # targets of the 48 h lead, same normalisation


def test_gaussian_heads_closed_form() -> None:
    o = torch.tensor([0.5, 0.0, -1.0, 2.0]).view(1, 4, 1, 1)
    m, s = torch.tensor([1.0, 10.0]).view(1, 2, 1, 1), torch.tensor([2.0, 3.0]).view(1, 2, 1, 1)
    mu, sigma = gaussian_heads(o, m, s, eps=0.0)
    torch.testing.assert_close(mu.flatten(), torch.tensor([1.0 + 0.5 * 2, 10.0 - 3.0]))
    softplus = torch.log1p(torch.exp(torch.tensor([0.0, 2.0])))
    torch.testing.assert_close(sigma.flatten(), softplus * torch.tensor([2.0, 3.0]))
    with pytest.raises(ValueError, match="2T"):
        gaussian_heads(o[:, :3], m, s)


def test_unet_gate_prior_at_every_level() -> None:
    """Each resolution level's gate gets the land-sea mask pooled to its grid; with a coherent init the
    land group's experts outrank every other at each land point (and the sea group's at sea points)."""
    grid = (8, 16)
    land = torch.zeros(grid)
    land[:, 8:] = 1.0
    torch.manual_seed(0)
    net = PostprocessingUNet(3, levels=3, widths=(4, 8, 16), smoe=True, grid=grid, gate_init="coherent",
                             land_sea_prior=land)
    assert {(k[:3], g.height) for k, g in net.gates.items()} == {(p, h) for p in ("enc", "dec") for h in (8, 4, 2)}
    for key, gate in net.gates.items():
        level = {8: 0, 4: 1, 2: 2}[gate.height]
        prior = net.level_prior(level)
        assert prior.shape == (gate.height, gate.width) and prior[:, -1].all() and not prior[:, 0].any()
        e_sel = gate.num_experts // 4
        top = gate.top_indices(e_sel)[0][0]  # (E, H, W) selected experts
        # the selected experts at a land point and at a sea point are disjoint sets (two prior groups)
        land_sel = set(top[:, 0, -1].tolist())
        sea_sel = set(top[:, 0, 0].tolist())
        assert not land_sel & sea_sel, key
        # coherent: the same experts at every point of a category
        assert all(set(top[:, i, j].tolist()) == (land_sel if prior[i, j] else sea_sel)
                   for i in range(gate.height) for j in range(gate.width))
    with pytest.raises(ValueError, match="shape"):
        PostprocessingUNet(3, levels=2, widths=(4, 8), smoe=True, grid=grid, land_sea_prior=torch.zeros(4, 4))


def _train(tmp: Path, source: Path, smoe: bool) -> Path:
    config = REPO / "configs" / "postprocess" / ("gcm_ens_smoe_unet.yaml" if smoe else "gcm_ens_unet_static.yaml")
    args = ["train", "--config", str(config), f"output_dir={tmp}", f"data.source={source}",
            "data.train_period=[2005-01-01, 2005-01-28]", "data.valid_period=[2005-01-29, 2005-02-08]",
            "data.test_period=[2005-02-09, 2005-02-20]", "data.batch_size=4", "model.widths=[4, 8]", "model.levels=2",
            "trainer.max_steps=6", "trainer.val_check_interval=3", "trainer.enable_progress_bar=false",
            "trainer.accelerator=cpu", "trainer.log_every_n_steps=1"]
    if smoe:
        args += ["model.gate_prior=land_sea", "model.gate_init=coherent", "model.damping=null"]
    assert main(args) == 0
    return tmp / "checkpoints" / "last.ckpt"


@pytest.mark.parametrize("smoe", [False, True], ids=["unet_static", "smoe_unet_prior"])
def test_checkpoint_applies_to_another_stream(streams: dict[str, Path], tmp_path: Path, smoe: bool) -> None:
    """Train on stream a, apply to stream b (never seen): μ, σ equal the network run on b's samples built with
    the checkpoint's statistics; levels that are not targets stay NaN; mismatches are refused by name."""
    from smoeweather.training.checkpoint import load_trained

    ckpt = _train(tmp_path / "run", streams["a"], smoe)
    fc_b = forecast_stores.open_ensemble(streams["b"])
    mu, sigma, attrs = apply_checkpoint(ckpt, fc_b, batch_size=5)
    assert attrs["smoe"] == int(smoe) and attrs["members"] == 4
    assert mu["geopotential"].dims == ("time", "prediction_timedelta", "level", "latitude", "longitude")
    # targets Z500 and T850: one level coordinate, NaN where a level is not a target of that variable
    for name, target, other in (("geopotential", 500, 850), ("temperature", 850, 500)):
        assert bool(mu[name].sel(level=other).isnull().all()) and bool(mu[name].sel(level=target).notnull().all())
    assert float(sigma["temperature"].min()) > 0

    trained = load_trained(ckpt)
    meta = trained.metadata
    stats = {k: tuple(v) for k, v in meta["stats"].items()}
    data = open_ensemble_dataset(streams["b"], meta["spec"], stats=stats)
    i = 7
    x, _, m, s = data[i]
    with torch.no_grad():
        n_mu, n_sigma = trained.model(x[None], m[None], s[None])
    mean, std = stats["temperature_850"]
    # target order: lead-major (24 h: Z500, T850; 48 h: Z500, T850) → T850 at 48 h is channel 3
    got_mu = mu["temperature"].sel(level=850).isel(time=i, prediction_timedelta=1).values
    want = n_mu[0, 3].numpy().astype(np.float64) * std + mean
    tol = 8 * EPS32 * abs(mean)  # float32 outputs denormalised in float32 vs float64
    np.testing.assert_allclose(got_mu, want, rtol=0, atol=tol)
    np.testing.assert_allclose(sigma["temperature"].sel(level=850).isel(time=i, prediction_timedelta=1).values,
                               n_sigma[0, 3].numpy() * std, rtol=8 * EPS32)

    if smoe:  # `smoe plot routing` maps the gate of every U-Net level, each with its level's prior
        out = tmp_path / "maps"
        assert main(["plot", "routing", str(ckpt), "--out", str(out)]) == 0
        heights = set()
        for nc in sorted(out.glob("routing_*.nc")):
            with xr.open_dataset(nc) as r:
                assert "prior_category" in r, nc
                h = r.sizes["latitude"]
                heights.add(h)
                pooled = (xr.load_dataset(streams["a"])["land_sea_mask"].values
                          .reshape(h, 8 // h, 2 * h, 8 // h).mean((1, 3)) >= 0.5)
                np.testing.assert_array_equal(r["prior_category"].values, pooled.astype(int))
                # trained 6 steps from a coherent prior init: routing still follows the prior everywhere
                assert int(r["n_experts_outside_prior_group"].max()) == 0
        assert heights == {8, 4}

    with pytest.raises(ValueError, match="members"):
        apply_checkpoint(ckpt, fc_b.isel(member=slice(0, 3)))
    with pytest.raises(ValueError, match="latitude"):
        apply_checkpoint(ckpt, fc_b.isel(latitude=slice(0, 6)))
    with pytest.raises(ValueError, match="no lead 48 h"):
        apply_checkpoint(ckpt, fc_b.isel(prediction_timedelta=[0]))
    with pytest.raises(ValueError, match="temperature"):
        apply_checkpoint(ckpt, fc_b[["geopotential"]])


def test_ensemble_spec_names() -> None:
    spec = EnsembleSpec.from_config({"variables": ["geopotential_500"], "target_variables": ["temperature_850"],
                                     "leads_h": [24, 48]})
    assert spec.channel_names == ["geopotential_500_ens_mean@24h", "geopotential_500_ens_std@24h",
                                  "geopotential_500_ens_mean@48h", "geopotential_500_ens_std@48h"]
    assert spec.target_names == ["temperature_850@24h", "temperature_850@48h"]


@pytest.mark.shared_data
def test_real_files_train_the_same_networks(shared_data: Path) -> None:
    """The shared gcm_ens stream and the real SEAS5 hindcast file (monthly leads, truth inside) open as
    training samples through the same convention."""
    seas5 = open_ensemble_dataset(shared_data / "cstools_seas5_era5_tas_med.nc", {"variables": ["2m_temperature"]})
    assert seas5.spec.leads_h == (0, 720, 1464) and seas5.members == 15
    x, y, m, s = seas5[0]
    assert x.shape == (6, 22, 53) and y.shape == m.shape == s.shape == (3, 22, 53)
    assert torch.isfinite(y).all() and bool((s > 0).all())
    gcm = open_ensemble_dataset(shared_data / "gcm_ens" / "gcm_ens_2006.nc",
                                {"variables": ["geopotential_500", "temperature_850"], "leads_h": [48]},
                                period=["2006-01-01", "2006-02-28"])
    assert gcm.grid == (32, 64) and gcm.members == 10 and len(gcm) == 29
    x, y, _, _ = gcm[0]
    assert x.shape == (4, 32, 64) and y.shape == (2, 32, 64)


def test_postprocess_study_in_two_shards(streams: dict[str, Path], tmp_path: Path) -> None:
    """`smoe study` on post-processing configs, run as two shards: every run scored by the latitude-weighted
    Gaussian CRPS (checked against properscoring), the raw/EMOS references and the paired differences."""
    import properscoring
    import yaml

    from smoeweather.postprocess.scoring import split_forecast

    common = [f"data.source={streams['a']}", "data.train_period=[2005-01-01, 2005-01-28]",
              "data.valid_period=[2005-01-29, 2005-02-08]", "data.test_period=[2005-02-09, 2005-02-20]",
              "data.batch_size=4", "model.widths=[4, 8]", "model.levels=2", "trainer.accelerator=cpu",
              "trainer.enable_progress_bar=false", "trainer.log_every_n_steps=1"]
    study = {"name": "tiny_pp", "seeds": [0, 1], "steps": 4, "val_every_steps": 2, "baseline": "unet",
             "reference_baseline": "emos_gridpoint", "scoring": "postprocess", "leads_h": [24, 48],
             "targets": ["geopotential_500", "temperature_850"], "overrides": common,
             "variants": {"unet": {"config": str(REPO / "configs/postprocess/gcm_ens_unet.yaml")},
                          "smoe": {"config": str(REPO / "configs/postprocess/gcm_ens_smoe_unet_prior.yaml")}}}
    config = tmp_path / "study.yaml"
    config.write_text(yaml.safe_dump(study))
    out = tmp_path / "out"
    for shard in ("0/2", "1/2"):
        assert main(["study", "--config", str(config), "--out", str(out), "--shard", shard]) == 0
    result = json.loads((out / "study.json").read_text())
    assert {(r["variant"], r["seed"]) for r in result["runs"]} == {(v, s) for v in ("unet", "smoe") for s in (0, 1)}
    assert set(result["references"]) == {"raw", "emos_global", "emos_gridpoint"}
    entry = result["summary"]["smoe"]["geopotential_500@48h"]
    assert entry["diff_to_baseline"]["n"] == 2 and entry["diff_to_reference"]["reference"] == "emos_gridpoint"
    assert "spread_skill" in result["extra_means"] and "CRPS" in (out / "study.md").read_text()

    run = next(r for r in result["runs"] if r["variant"] == "unet" and r["seed"] == 1)
    cfg = yaml.safe_load((out / "runs/unet/seed1/config.yaml").read_text())
    fc, truth, _ = split_forecast(cfg["data"], "test")
    mu, sigma, _ = apply_checkpoint(out / run["best_checkpoint"], fc)  # relative to the study folder
    lead = np.timedelta64(48, "h").astype("timedelta64[ns]")
    pick = {"level": 850, "prediction_timedelta": lead}
    crps = properscoring.crps_gaussian(truth["temperature"].sel(pick).values, mu["temperature"].sel(pick).values,
                                       sigma["temperature"].sel(pick).values)  # (time, lat, lon)
    w = np.cos(np.deg2rad(truth["latitude"].values))
    want = float((crps.mean(0) * w[:, None]).sum() / (w.sum() * crps.shape[2]))
    # both float64 means over ~10³ terms: summation order differs, error ≲ n·eps64 ≈ 1e-13 relative
    np.testing.assert_allclose(run["scores"]["48h"]["temperature_850"], want, rtol=1e-11)


def test_members_of_a_network_with_fewer_leads_than_the_forecast(tmp_path: Path) -> None:
    """A network that calibrates only the 48 h lead of a 24/48 h forecast: its ECC-Q members reorder the raw
    members of that lead alone (the same members as with the raw ensemble cut to 48 h first)."""
    from smoeweather.postprocess.forms import Outputs, Predictive

    rng = np.random.default_rng(3)
    leads = np.array([24, 48], "timedelta64[h]").astype("timedelta64[ns]")
    raw = xr.Dataset({"temperature": (("time", "prediction_timedelta", "member", "latitude", "longitude"),
                                      rng.normal(280, 2, (3, 2, 4, 2, 3)))},
                     coords={"time": pd.date_range("2005-01-01", periods=3), "prediction_timedelta": leads,
                             "member": np.arange(4), "latitude": [10.0, 20.0], "longitude": [0.0, 1.0, 2.0]})
    at48 = raw.isel(prediction_timedelta=[1])
    mu = at48.mean("member") + 0.5
    sigma = at48.std("member", ddof=1) + 1.0
    outputs = Outputs(out=tmp_path / "pp.zarr", members_out=tmp_path / "pp_members.zarr", members=4)
    pred = Predictive("normal", mu, sigma, {"method": "unet"})
    members = {kind: ds for ds, _, kind, _ in pred.stores(raw, outputs)}["ensemble"]
    want = {kind: ds for ds, _, kind, _ in pred.stores(at48, outputs)}["ensemble"]
    assert members.sizes["prediction_timedelta"] == 1
    xr.testing.assert_identical(members, want)  # the same function on the same mu/sigma: the same bits
