"""``smoe study``: a tiny grid end to end on CPU, resuming, and the summary statistics."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import xarray as xr
import yaml
from scipy import stats

from smoeweather.cli import main
from smoeweather.studies.run import load_study, markdown, paired_differences, run_study, summarise
from smoeweather.training.run import train

REPO = Path(__file__).resolve().parents[2]
STEPS = 4


def tiny_study(tmp_path: Path, store: str, **extra: object) -> Path:
    """A 2-variant × 2-seed study of 4-step runs on the test world, written next to the repo configs."""
    common = [
        f"data.store={store}", "data.world=null", "data.num_workers=0", "data.batch_size=4",
        "data.train_years=null", "data.valid_years=null", "data.test_years=null",
        "data.train_period=[2000-01-01, 2000-02-29T18:00]", "data.valid_period=[2000-03-01, 2000-03-20]",
        "data.test_period=[2000-03-21, 2000-04-09]",
        "data.variables=[geopotential_500, temperature_850, geopotential_250]", "data.lead_choices_h=[72, 120]",
        "model.width=8", "model.blocks=1", "trainer.limit_val_batches=2", "trainer.enable_progress_bar=false",
        "trainer.log_every_n_steps=1", "data.cache=true",
    ]
    study = {
        "name": "tiny", "seeds": [0, 1], "steps": STEPS, "val_every_steps": 2, "baseline": "dense",
        "overrides": common, "scoring": "forecast",
        "variants": {
            "dense": {"config": str(REPO / "configs/weatherbench/world_dense.yaml")},
            "smoe_all_prior": {"config": str(REPO / "configs/weatherbench/world_smoe_all_prior.yaml")},
        },
        **extra,
    }
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump(study))
    return path


def test_tiny_study_end_to_end_then_resume(world_store: str, tmp_path: Path) -> None:
    config = tiny_study(tmp_path, world_store)
    out = tmp_path / "out"
    assert main(["study", "--config", str(config), "--out", str(out)]) == 0
    result = json.loads((out / "study.json").read_text())
    assert {(r["variant"], r["seed"]) for r in result["runs"]} == {
        (v, s) for v in ("dense", "smoe_all_prior") for s in (0, 1)
    }
    for r in result["runs"]:
        assert r["steps"] == STEPS
        for lead in ("72h", "120h"):
            assert set(r["scores"][lead]) == {f"{t}{region}" for t in ("geopotential_500", "temperature_850")
                                              for region in ("", "/land", "/sea")}
            # physical units: Z500 errors are geopotential (m² s⁻²), far above normalised O(1) values
            assert r["scores"][lead]["geopotential_500"] > 10.0
            assert 0.0 < r["scores"][lead]["temperature_850"] < 100.0
    assert "Paired difference" in (out / "study.md").read_text()
    # cost measured before training (a forecasting ResNet and its SMoE twin): more parameters and FLOPs for the SMoE
    cost = result["cost"]["arms"]
    assert cost["dense"]["train_step_ratio"] == 1.0 and result["environment"]["threads"] == 1
    assert cost["smoe_all_prior"]["parameters"] > cost["dense"]["parameters"]
    assert cost["smoe_all_prior"]["train_flops"] > cost["dense"]["train_flops"] > 0
    # the score is the latitude-weighted RMSE (sqrt after the time mean) of the written forecast vs the truth
    run = out / "runs/dense/seed1"
    fc = xr.open_zarr(run / "forecast.zarr")["geopotential"].sel(level=500, drop=True)
    truth = xr.open_zarr(world_store)["geopotential"].sel(level=500, drop=True)
    lead = np.timedelta64(72, "h")
    f = fc.sel(prediction_timedelta=lead).astype("f8")
    t = truth.sel(time=f["time"] + lead).assign_coords(time=f["time"]).astype("f8")
    w = np.cos(np.deg2rad(truth["latitude"]))
    mse = ((f - t) ** 2).weighted(w / w.mean()).mean(["latitude", "longitude"]).mean("time")
    got = next(r for r in result["runs"] if (r["variant"], r["seed"]) == ("dense", 1))["scores"]["72h"]
    # float32 forecast values (~5e4 m² s⁻²) and errors: relative 1e-5 covers the float32 rounding
    assert got["geopotential_500"] == pytest.approx(float(np.sqrt(mse)), rel=1e-5)
    # land and sea: the same mean weighted by cos(lat) × land fraction, and by cos(lat) × (1 − land fraction)
    land = xr.open_zarr(world_store)["land_sea_mask"].astype("f8")
    assert 0 < float(land.mean()) < 1
    for region, frac in (("land", land), ("sea", 1 - land)):
        mse_r = ((f - t) ** 2).weighted(w * frac).mean(["latitude", "longitude"]).mean("time")
        assert got[f"geopotential_500/{region}"] == pytest.approx(float(np.sqrt(mse_r)), rel=1e-5)
    assert set(result["summary_regions"]["smoe_all_prior"]) == {
        f"{t}/{r}@{lead}" for t in ("geopotential_500", "temperature_850") for r in ("land", "sea")
        for lead in ("72h", "120h")}
    assert "diff_to_baseline" in result["summary_regions"]["smoe_all_prior"]["geopotential_500/land@72h"]
    assert "By region (land, sea" in (out / "study.md").read_text()
    assert result["references"]["persistence"]["72h"]["geopotential_500"] > 0
    # equal-step budget: the resolved run config has no wall-clock or early-stop limit
    cfg = yaml.safe_load((out / "runs/smoe_all_prior/seed1/config.yaml").read_text())
    assert cfg["trainer"]["max_steps"] == STEPS and cfg["trainer"]["max_time"] is None and cfg["seed"] == 1

    # resume: finished runs are skipped, a run without result.json continues from its last.ckpt
    calls: list[object] = []

    def counting_train(cfg: dict, resume: object = None, **kw: object) -> object:
        calls.append(resume)
        return train(cfg, resume=resume, **kw)

    interrupted = out / "runs/smoe_all_prior/seed0"
    before = json.loads((interrupted / "result.json").read_text())
    (interrupted / "result.json").unlink()
    again = run_study(load_study(config), out, train_fn=counting_train, log=lambda _: None)
    assert calls == [interrupted / "checkpoints" / "last.ckpt"]
    rerun = next(r for r in again["runs"] if (r["variant"], r["seed"]) == ("smoe_all_prior", 0))
    assert rerun["steps"] == STEPS  # nothing trained beyond the budget
    assert rerun["scores"] == before["scores"]  # same best checkpoint, same scores


def test_summary_matches_scipy() -> None:
    rng = np.random.default_rng(0)
    runs = []
    for variant in ("dense", "smoe"):
        for seed in range(4):
            runs.append({"variant": variant, "seed": seed,
                         "scores": {"72h": {"z": float(rng.normal(600, 10))}}})
    summary = summarise(runs, "dense", ["72h"], ["z"])
    z = {v: np.array([r["scores"]["72h"]["z"] for r in runs if r["variant"] == v]) for v in ("dense", "smoe")}
    got = summary["smoe"]["z@72h"]
    rtol = 8 * 2.2e-16 * 100  # a handful of float64 ops on values ~600
    assert got["mean"] == pytest.approx(z["smoe"].mean(), rel=rtol)
    assert got["std"] == pytest.approx(z["smoe"].std(ddof=1), rel=rtol)
    d = z["smoe"] - z["dense"]
    assert got["diff_to_baseline"]["mean"] == pytest.approx(d.mean(), rel=rtol)
    assert got["diff_to_baseline"]["se"] == pytest.approx(stats.sem(d), rel=rtol)
    assert got["diff_to_baseline"]["n"] == 4
    assert "diff_to_baseline" not in summary["dense"]["z@72h"]
    # one seed only: std and SE undefined, not zero
    single = summarise(runs[:1] + runs[4:5], "dense", ["72h"], ["z"])
    assert math.isnan(single["smoe"]["z@72h"]["std"]) and math.isnan(single["smoe"]["z@72h"]["diff_to_baseline"]["se"])


def test_further_pairs_match_scipy() -> None:
    """``pairs``: a − b over the seeds both arms have, a t-interval as scipy gives it, in study.md."""
    rng = np.random.default_rng(1)
    runs = [{"variant": v, "seed": seed, "scores": {"48h": {"z": float(rng.normal(20, 1)),
                                                            "z/land": float(rng.normal(30, 2))}}}
            for v, seeds in (("smoe", range(5)), ("frozen", range(1, 6)), ("dense", range(5))) for seed in seeds]
    (pair,) = paired_differences(runs, [("smoe", "frozen")], ["48h"], ["z", "z/land"])
    score = {(r["variant"], r["seed"]): r["scores"]["48h"] for r in runs}
    for key in ("z", "z/land"):
        d = np.array([score["smoe", k][key] - score["frozen", k][key] for k in (1, 2, 3, 4)])  # seeds in both
        lo, hi = stats.t.interval(0.95, len(d) - 1, loc=d.mean(), scale=stats.sem(d))
        got = pair["diff"][f"{key}@48h"]
        rtol = 16 * 2.2e-16 * 30  # a few float64 ops on values ~30
        assert (got["n"], got["seeds"]) == (4, [1, 2, 3, 4])
        assert got["mean"] == pytest.approx(d.mean(), rel=rtol, abs=rtol)
        assert (got["lo"], got["hi"]) == pytest.approx((lo, hi), rel=1e-12)
    study = {"name": "s", "steps": 1, "leads": ["48h"], "targets": ["z"], "baseline": "dense",
             "summary": summarise(runs, "dense", ["48h"], ["z"]), "pairs": [pair]}
    text = markdown(study)
    assert "| smoe − frozen | " in text and "z/land@48h" in text


def test_bad_study_configs_are_clear_errors(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    config = tiny_study(tmp_path, "unused.zarr", baseline="nope")
    assert main(["study", "--config", str(config), "--out", str(tmp_path / "o")]) == 2
    assert "baseline 'nope' is not a variant" in capsys.readouterr().err
    config = tiny_study(tmp_path, "unused.zarr", val_every_steps=3)
    assert main(["study", "--config", str(config), "--out", str(tmp_path / "o")]) == 2
    assert "must divide steps" in capsys.readouterr().err
    assert main(["study", "--config", str(tmp_path / "missing.yaml"), "--out", str(tmp_path / "o")]) == 2
    assert "does not exist" in capsys.readouterr().err
    config = tiny_study(tmp_path, "unused.zarr", pairs=[["smoe_all_prior", "nope"]])
    assert main(["study", "--config", str(config), "--out", str(tmp_path / "o")]) == 2
    assert "pairs must be a list of [variant, other variant]" in capsys.readouterr().err


@pytest.mark.parametrize("n_variants,n_shards", [(2, 2), (3, 2), (4, 2), (3, 3), (9, 2), (2, 4)])
def test_shards_cover_the_grid_once_and_each_trains_every_arm(n_variants: int, n_shards: int) -> None:
    """The shards partition the grid, give each process a share within one run per seed of the others', and
    rotate over the arms: with two arms and two shards (every 2nd run in order would give shard 0 all of one
    arm) each shard trains both arms, on alternating seeds."""
    from types import SimpleNamespace

    from smoeweather.studies.run import shard_runs

    study = SimpleNamespace(seeds=[0, 1, 2, 3, 4], variants=[f"arm{v}" for v in range(n_variants)])
    shares = [shard_runs(study, k, n_shards) for k in range(n_shards)]
    grid = [(s, v) for s in study.seeds for v in study.variants]
    assert sorted(r for share in shares for r in share) == sorted(grid)  # every run exactly once
    for share in shares:
        assert share == [r for r in grid if r in share]  # seed-major within a shard
        for seed in study.seeds:
            assert len([r for r in share if r[0] == seed]) in {n_variants // n_shards, -(-n_variants // n_shards)}
        if len(study.seeds) >= n_shards and n_variants >= n_shards:
            assert {v for _, v in share} == set(study.variants)
    if (n_variants, n_shards) == (2, 2):
        assert shares[0] == [(0, "arm0"), (1, "arm1"), (2, "arm0"), (3, "arm1"), (4, "arm0")]


@pytest.mark.parametrize("name", [p.stem for p in sorted((REPO / "configs/studies").glob("*.yaml"))])
def test_committed_study_configs_resolve(name: str, tmp_path: Path) -> None:
    study = load_study(REPO / "configs/studies" / f"{name}.yaml")
    assert len(study.seeds) >= 3 and study.baseline in {v.name for v in study.variants}
    for variant in study.variants:
        cfg = study.run_config(variant, study.seeds[-1], tmp_path)
        assert cfg["trainer"]["max_steps"] == study.steps and cfg["trainer"]["max_time"] is None
        assert cfg["seed"] == study.seeds[-1]
    if name == "gcm_128x19":
        smoe = study.run_config(study.variants[1], 0, tmp_path)["model"]
        assert (smoe["width"], smoe["blocks"], smoe["smoe"]["placement"], smoe["smoe"]["gate_prior"]) == (
            128, 19, "all", "land_sea")
