"""Studies whose numbers survive a re-run and verdicts on a skill-against-cost frontier: pinned threads (a
re-run gives bit-identical scores), the cosine learning-rate schedule, Student-t intervals of paired
differences, the cost of every arm, and `smoe plot frontier` with its pairing to the dense frontier."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest
import torch
from test_postprocess_cli import gcm_ens_like

from smoeweather.metrics.significance import t_interval
from smoeweather.plotting.frontier import Arm, frontier_table, pair_to_frontier, plot_frontier
from smoeweather.studies.run import THREAD_ENV, load_study, run_study
from smoeweather.training.base import cosine_lr_factor

REPO = Path(__file__).resolve().parents[2]


# ---- intervals ---------------------------------------------------------------------------------------
def test_t_interval_matches_the_hand_computed_interval() -> None:
    # d = 1, 2, 3, 4: mean 2.5, s = sqrt(5/3) = 1.29099, SE = s/2 = 0.645497; t(0.975, 3 dof) = 3.182446
    # (tables): 2.5 ± 2.054260 = [0.445740, 4.554260]
    t = t_interval([1.0, 2.0, 3.0, 4.0])
    assert t["mean"] == pytest.approx(2.5)
    assert t["se"] == pytest.approx(0.645497, abs=1e-6)
    assert t["t"] == pytest.approx(3.182446, abs=1e-6)
    assert (t["lo"], t["hi"]) == (pytest.approx(0.445740, abs=1e-5), pytest.approx(4.554260, abs=1e-5))
    assert t["excludes_zero"]
    # three seeds, a mean 2.5 SE from zero: "beyond 2 SE" but NOT a 95 % statement (t(0.975, 2) = 4.303)
    # d = 1, 2, 3: mean 2, SE 1/sqrt(3) = 0.577 (3.5 SE from zero), t(0.975, 2) = 4.302653: [-0.484, 4.484]
    wide = t_interval([1.0, 2.0, 3.0])
    assert wide["mean"] > 2 * wide["se"] and not wide["excludes_zero"]
    assert wide["lo"] == pytest.approx(2 - 4.302653 / math.sqrt(3), abs=1e-5)
    assert math.isnan(t_interval([1.0])["lo"]) and not t_interval([1.0])["excludes_zero"]


# ---- learning-rate schedule ---------------------------------------------------------------------------
def test_cosine_schedule_warms_up_and_decays_to_the_floor() -> None:
    f = [cosine_lr_factor(s, 100, warmup=10, min_factor=0.1) for s in range(100)]
    assert f[0] == pytest.approx(0.1) and f[9] == pytest.approx(1.0)  # linear warm-up (step + 1) / 10
    assert f[10] == pytest.approx(1.0)  # the decay starts at the full rate
    assert f[55] == pytest.approx(0.1 + 0.9 * 0.5)  # half way through the decay: half way down
    assert all(a >= b for a, b in zip(f[10:], f[11:]))  # monotone after the warm-up
    assert cosine_lr_factor(100, 100, 10, 0.1) == pytest.approx(0.1)  # the last step reaches lr × min_factor
    assert cosine_lr_factor(0, 1) == 1.0 and cosine_lr_factor(5, 5, warmup=5) == 1.0


# ---- a tiny post-processing study, run twice -----------------------------------------------------------
def _tiny_study(tmp_path: Path, files: tuple[Path, Path], extra: list[str] = ()) -> Path:
    study = tmp_path / "tiny.yaml"
    unet = REPO / "configs/postprocess/gcm_ens_unet.yaml"
    study.write_text(f"""
name: tiny_frontier
seeds: [0, 1]
steps: 6
val_every_steps: 3
baseline: unet_4_8
scoring: postprocess
leads_h: [48]
targets: [geopotential_500]
threads: 1
lr_schedule: cosine
warmup_steps: 2
cost: {{steps: 1, rounds: 2, warmup: 1}}
overrides:
  - trainer.accelerator=cpu
  - trainer.enable_progress_bar=false
  - trainer.log_every_n_steps=1
  - "data.source=[{files[0]}, {files[1]}]"
  - "data.train_period=[2005-01-01, 2005-02-28]"
  - "data.valid_period=[2006-01-01, 2006-01-20]"
  - "data.test_period=[2006-01-21, 2006-02-28]"
  - "data.target_variables=[geopotential_500]"
  - "data.leads_h=[48]"
  - data.batch_size=4
  - model.levels=2
variants:
  unet_4_8: {{config: {unet}, overrides: ["model.widths=[4, 8]"]}}
  unet_8_16: {{config: {unet}, overrides: ["model.widths=[8, 16]"]}}
  smoe_4_8:
    config: {REPO / 'configs/postprocess/gcm_ens_smoe_unet_prior.yaml'}
    overrides: ["model.widths=[4, 8]"]
""")
    return study


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, dict, Path]:
    tmp = tmp_path_factory.mktemp("study")
    files = (gcm_ens_like(tmp / "ens_2005.nc", 2005, 1), gcm_ens_like(tmp / "ens_2006.nc", 2006, 2))
    study = load_study(_tiny_study(tmp, files))
    threads = torch.get_num_threads()
    env = {k: os.environ.get(k) for k in THREAD_ENV}
    try:
        first = run_study(study, tmp / "a", log=lambda m: None)
        second = run_study(load_study(_tiny_study(tmp, files), ["cost=false"]), tmp / "b", log=lambda m: None)
    finally:  # the runs pinned this process to 1 thread: give the other tests theirs back
        torch.set_num_threads(threads)
        for k, v in env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return first, second, tmp / "a"


def test_a_rerun_gives_bit_identical_scores_and_records_its_environment(two_runs: tuple[dict, dict, Path]) -> None:
    first, second, out = two_runs
    key = lambda r: (r["variant"], r["seed"])  # noqa: E731
    a = {key(r): (r["scores"], r["val_loss"]) for r in first["runs"]}
    b = {key(r): (r["scores"], r["val_loss"]) for r in second["runs"]}
    assert len(a) == 6 and a == b  # exact float equality, every arm and seed
    assert len({r["scores"]["48h"]["geopotential_500"] for r in first["runs"]}) == 6  # the runs differ
    env = first["environment"]
    assert env["threads"] == 1 and env["cpu"] and env["code_version"]
    assert env["cpu_capability"] == torch.backends.cpu.get_cpu_capability()  # e.g. AVX2 or AVX512
    md = (out / "study.md").read_text()
    assert f"CPU {env['cpu']} ({env['cpu_capability']})" in md  # the runs' machine
    assert f"on {env['cpu']} {env['cpu_capability']}:" in md  # the cost measurement's machine
    assert first["lr_schedule"].startswith("cosine")
    assert not any(Path(v["config"]).is_absolute() for v in first["variants"].values())
    diff = first["summary"]["unet_8_16"]["geopotential_500@48h"]["diff_to_baseline"]
    d = [r["scores"]["48h"]["geopotential_500"] for r in first["runs"] if r["variant"] == "unet_8_16"]
    base = [r["scores"]["48h"]["geopotential_500"] for r in first["runs"] if r["variant"] == "unet_4_8"]
    assert diff["mean"] == pytest.approx(sum(x - y for x, y in zip(d, base)) / 2)
    assert diff["lo"] < diff["mean"] < diff["hi"] and diff["t"] == pytest.approx(12.7062, abs=1e-4)


def test_the_cosine_schedule_reaches_its_floor_in_training(two_runs: tuple[dict, dict, Path]) -> None:
    _, _, out = two_runs
    state = torch.load(out / "runs/unet_4_8/seed0/checkpoints/last.ckpt", weights_only=False)
    scheduler = state["lr_schedulers"][0]
    assert scheduler["last_epoch"] == 6  # stepped once per optimizer step
    assert scheduler["_last_lr"][0] == pytest.approx(1e-3 * cosine_lr_factor(6, 6, 2, 0.0), abs=1e-12)


def test_cost_is_measured_three_ways(two_runs: tuple[dict, dict, Path]) -> None:
    first, _, _ = two_runs
    cost = first["cost"]
    arms = cost["arms"]
    assert cost["reference"] == "unet_4_8" and cost["threads"] == 1
    assert arms["unet_4_8"]["train_step_ratio"] == 1.0 and arms["unet_4_8"]["infer_ratio"] == 1.0
    # doubling every width roughly quadruples the convolutions: parameters and FLOPs grow 3-4.5x
    assert 3.0 < arms["unet_8_16"]["parameters"] / arms["unet_4_8"]["parameters"] < 4.5
    assert 3.0 < arms["unet_8_16"]["train_flops"] / arms["unet_4_8"]["train_flops"] < 4.5
    # the SMoE holds |E| = 4 x filters experts: more parameters than its dense twin, not 4x the FLOPs
    assert arms["smoe_4_8"]["parameters"] > 2 * arms["unet_4_8"]["parameters"]
    assert arms["smoe_4_8"]["train_flops"] < 4 * arms["unet_4_8"]["train_flops"]
    assert first["variants"]["smoe_4_8"]["family"] == "smoe" and first["variants"]["unet_8_16"]["family"] == "dense"
    assert all(v["train_step_s"] > 0 and v["infer_s"] > 0 for v in arms.values())


def test_plot_frontier_writes_figure_and_table(two_runs: tuple[dict, dict, Path], tmp_path: Path) -> None:
    _, _, out = two_runs
    from smoeweather.cli import main

    assert main(["plot", "frontier", str(out / "study.json"), "--cost", "params", "--out", str(tmp_path)]) == 0
    png = tmp_path / "tiny_frontier_frontier_params.png"
    assert png.stat().st_size > 10_000
    table = json.loads((tmp_path / "tiny_frontier_frontier_params.json").read_text())
    assert [p["arm"] for p in table["pairs"]] == ["smoe_4_8"]
    assert "paired by seed" in (tmp_path / "tiny_frontier_frontier_params.md").read_text()
    # the land score of every seed, as the runs recorded it
    assert main(["plot", "frontier", str(out / "study.json"), "--cost", "params", "--metric",
                 "geopotential_500/land@48h", "--name", "land", "--out", str(tmp_path)]) == 0
    land = json.loads((tmp_path / "land_params.json").read_text())
    runs = json.loads((out / "study.json").read_text())["runs"]
    assert land["metric"] == "geopotential_500/land@48h"
    assert {a["arm"]: a["scores"] for a in land["arms"]}["smoe_4_8"] == {
        str(r["seed"]): r["scores"]["48h"]["geopotential_500/land"] for r in runs if r["variant"] == "smoe_4_8"}
    from smoeweather.plotting.frontier import load_arms

    with pytest.raises(ValueError, match="regional scores"):
        load_arms([json.loads((out / "study.json").read_text())], "params", "geopotential_500/arctic@48h")


# ---- pairing with the dense frontier -----------------------------------------------------------------
def test_pairing_interpolates_in_log_cost_seed_by_seed() -> None:
    dense = [Arm("", "d1", "dense", 10.0, {0: 20.0, 1: 21.0, 2: 22.0}),
             Arm("", "d2", "dense", 1000.0, {0: 18.0, 1: 18.0, 2: 19.0})]
    smoe = Arm("", "s", "smoe", 100.0, {0: 18.5, 1: 19.0, 2: 20.0})  # log-cost half way: weight 0.5
    row = pair_to_frontier(smoe, dense)
    assert row["weight"] == pytest.approx(0.5) and row["against"] == ["d1", "d2"]
    # dense at cost 100: 19.0, 19.5, 20.5 → differences -0.5, -0.5, -0.5
    assert row["dense_at_cost"] == pytest.approx([19.0, 19.5, 20.5])
    assert row["mean"] == pytest.approx(-0.5) and row["se"] == pytest.approx(0.0)
    near = pair_to_frontier(smoe, dense, "nearest")  # equidistant in log-cost: the first (cheaper) one
    assert near["against"] == ["d1"] and near["mean"] == pytest.approx((-1.5 - 2.0 - 2.0) / 3)
    outside = pair_to_frontier(Arm("", "big", "smoe", 5000.0, {0: 17.0, 1: 18.0}), dense)
    assert outside["against"] == ["d2"] and "outside the dense range" in outside["method"]
    assert outside["mean"] == pytest.approx(-0.5) and outside["n"] == 2
    assert [r["arm"] for r in frontier_table([*dense, smoe])] == ["s"]


def test_plot_frontier_rejects_studies_without_cost(tmp_path: Path) -> None:
    study = {"name": "x", "targets": ["t"], "leads": ["48h"], "variants": {}, "runs": [], "cost": None}
    path = tmp_path / "study.json"
    path.write_text(json.dumps(study))
    with pytest.raises(ValueError, match="no measured cost"):
        plot_frontier([path], tmp_path)


def test_frontier_of_deep_ensembles_pairs_e3_and_singles_with_them(tmp_path: Path) -> None:
    """--frontier ensemble: the deep ensembles are the line; E³ (and a single network) are paired with them."""
    seeds = [0, 1, 2]
    arms = {"dense_16": ("dense", 1.0, [300.0, 302.0, 301.0]),
            "de_2": ("ensemble", 2.0, [240.0, 241.0, 242.0]), "de_4": ("ensemble", 4.0, [220.0, 222.0, 221.0]),
            "e3_4": ("smoe_ensemble", 2.0 ** 1.5, [228.0, 232.0, 230.0])}  # log-cost half way between de_2, de_4
    study = {"name": "ens", "targets": ["z500"], "leads": ["120h"], "label": "",
             "variants": {k: {"family": f} for k, (f, _, _) in arms.items()},
             "runs": [{"variant": k, "seed": s, "scores": {"120h": {"z500": v[s]}}}
                      for k, (_, _, v) in arms.items() for s in seeds],
             "cost": {"arms": {k: {"train_step_ratio": c} for k, (_, c, _) in arms.items()}}}
    path = tmp_path / "study.json"
    path.write_text(json.dumps(study))
    files = plot_frontier([path], tmp_path, cost="time", frontier="ensemble")
    assert [f.name for f in files][0] == "ens_frontier_vs_ensemble_time.png"
    pairs = {p["arm"]: p for p in json.loads(files[2].read_text())["pairs"]}
    assert set(pairs) == {"dense_16", "e3_4"}
    # E³ − the mean of de_2 and de_4 per seed: 228 − 230, 232 − 231.5, 230 − 231.5
    assert pairs["e3_4"]["against"] == ["de_2", "de_4"] and pairs["e3_4"]["weight"] == pytest.approx(0.5)
    assert pairs["e3_4"]["mean"] == pytest.approx((-2.0 + 0.5 - 1.5) / 3)
    assert pairs["dense_16"]["against"] == ["de_2"] and "outside the ensemble range" in pairs["dense_16"]["method"]
    assert "ensemble frontier" in files[1].read_text()
    with pytest.raises(ValueError, match="no smoe arm"):
        plot_frontier([path], tmp_path, cost="time", frontier="smoe")
    # --score: another score the runs recorded (here the ECDF CRPS = the main score + 100)
    for r in study["runs"]:
        r["extra"] = {"crps_ecdf": {"120h": {"z500": r["scores"]["120h"]["z500"] + 100.0}}}
    path.write_text(json.dumps(study))
    files = plot_frontier([path], tmp_path, cost="time", frontier="ensemble", score="crps_ecdf")
    table = json.loads(files[2].read_text())
    assert files[0].name == "ens_frontier_vs_ensemble_crps_ecdf_time.png" and table["score"] == "crps_ecdf"
    assert {a["arm"]: a["scores"]["0"] for a in table["arms"]}["e3_4"] == pytest.approx(328.0)
    assert {p["arm"]: p["mean"] for p in table["pairs"]}["e3_4"] == pytest.approx((-2.0 + 0.5 - 1.5) / 3)
    with pytest.raises(ValueError, match="no rmse score"):
        plot_frontier([path], tmp_path, cost="time", score="rmse")


# ---- land and sea in post-processing studies; re-scoring ------------------------------------------------
def test_postprocess_scores_land_and_sea_as_hand_computed_masked_means() -> None:
    """With a land-sea mask, the post-processing scores add TARGET/land and TARGET/sea: the closed-form Gaussian
    CRPS (properscoring, independent) averaged with weights cos(lat) × land fraction (or its complement)."""
    import numpy as np
    import properscoring
    import xarray as xr

    from smoeweather.postprocess.scoring import score_gaussian

    rng = np.random.default_rng(3)
    lat, lon = np.linspace(-80.0, 80.0, 9), np.arange(0.0, 360.0, 30.0)
    dims = ("time", "prediction_timedelta", "latitude", "longitude")
    coords = {"time": np.arange(5), "prediction_timedelta": [np.timedelta64(48, "h")], "latitude": lat,
              "longitude": lon}
    shape = (5, 1, lat.size, lon.size)
    y, mu, sd = rng.normal(size=shape), rng.normal(size=shape), rng.uniform(0.5, 2.0, size=shape)
    land = xr.DataArray(rng.uniform(0.0, 1.0, size=(lat.size, lon.size)).round(1), dims=("latitude", "longitude"),
                        coords={"latitude": lat, "longitude": lon})
    ds = lambda a: xr.Dataset({"t2m": (dims, a)}, coords=coords)  # noqa: E731
    out = score_gaussian(ds(mu), ds(sd), ds(y), [("t2m", None)], land_sea_mask=land)["crps"]["48h"]
    crps = properscoring.crps_gaussian(y, mu, sd)[:, 0]  # (time, lat, lon)
    wlat = np.cos(np.deg2rad(lat))[:, None] * np.ones(lon.size)
    for key, w in (("t2m", wlat), ("t2m/land", wlat * land.values), ("t2m/sea", wlat * (1 - land.values))):
        expected = np.mean([(c * w).sum() / w.sum() for c in crps])
        assert out[key] == pytest.approx(expected, rel=1e3 * np.finfo(np.float64).eps), key


def test_rescore_adds_regions_and_keeps_the_training_record(two_runs: tuple[dict, dict, Path],
                                                           tmp_path: Path) -> None:
    """`smoe study --rescore` scores the finished runs' checkpoints again (no training): a record written before
    the land and sea scores gains them, the global score and the training record (steps, time, validation loss)
    stay as they were."""
    import shutil

    from smoeweather.studies.run import rescore_study

    first, _, out = two_runs
    assert set(first["summary_regions"]["unet_8_16"]) == {"geopotential_500/land@48h", "geopotential_500/sea@48h"}
    copy = tmp_path / "study"
    shutil.copytree(out, copy)
    path = copy / "runs/unet_4_8/seed0/result.json"
    old = json.loads(path.read_text())
    old["scores"]["48h"] = {"geopotential_500": old["scores"]["48h"]["geopotential_500"]}  # an old record,
    old["best_checkpoint"] = "elsewhere/" + old["best_checkpoint"]  # its checkpoint recorded from another folder
    path.write_text(json.dumps(old))
    study_file = next(out.parent.glob("tiny.yaml"))
    threads = torch.get_num_threads()
    try:
        again = rescore_study(load_study(study_file), copy, log=lambda m: None)
    finally:
        torch.set_num_threads(threads)
    new = json.loads(path.read_text())
    assert set(new["scores"]["48h"]) == {"geopotential_500", "geopotential_500/land", "geopotential_500/sea"}
    assert new["scores"]["48h"]["geopotential_500"] == old["scores"]["48h"]["geopotential_500"]
    assert (new["steps"], new["train_seconds"], new["val_loss"]) == (old["steps"], old["train_seconds"],
                                                                    old["val_loss"])
    with pytest.raises(ValueError, match="no finished run"):
        rescore_study(load_study(study_file), tmp_path / "empty", log=lambda m: None)
    assert {r["variant"] for r in again["runs"]} == {"unet_4_8", "unet_8_16", "smoe_4_8"}
    assert again["summary_regions"]["smoe_4_8"]["geopotential_500/sea@48h"]["n"] == 2


def test_frontier_labels_do_not_overlap_in_a_crowded_plot() -> None:
    """Twin arms at almost one cost and score (a learned and a frozen gate) get labels that do not overlap."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from smoeweather.plotting.frontier import _place_labels

    fig, ax = plt.subplots(figsize=(7.0, 4.6))
    items = [("dense_a", 1.0, 20.0, 19.5, 20.5, "C0"), ("dense_b", 2.0, 19.0, 18.5, 19.5, "C0"),
             ("smoe_twin", 1.1, 19.6, 19.0, 20.2, "C3"), ("smoe_twin_frozen", 1.12, 19.65, 19.0, 20.3, "C3"),
             ("smoe_other", 1.15, 19.55, 19.1, 20.0, "C3")]
    ax.errorbar([1.0, 2.0], [20.0, 19.0], yerr=0.5, fmt="o-")
    ax.errorbar([1.1, 1.12, 1.15], [19.6, 19.65, 19.55], yerr=0.5, fmt="s", linestyle="none")
    ax.set_xscale("log")
    fig.tight_layout()
    _place_labels(fig, ax, items)
    renderer = fig.canvas.get_renderer()
    boxes = [t.get_window_extent(renderer) for t in ax.texts]
    assert sorted(t.get_text() for t in ax.texts) == sorted(i[0] for i in items)  # one label per arm
    for i, a in enumerate(boxes):
        for b in boxes[i + 1:]:
            assert not a.overlaps(b), (a, b)
    plt.close(fig)


def test_a_study_refuses_runs_scored_on_other_data(two_runs: tuple[dict, dict, Path], tmp_path: Path) -> None:
    """A run trained and scored on another store (here: its reference scores 2 % off, as two GCM worlds are) is
    not paired with the rest: writing the study names the run and says what to do."""
    import shutil

    from smoeweather.studies.run import finished_records, write_study

    _, _, out = two_runs
    copy = tmp_path / "study"
    shutil.copytree(out, copy)
    study = load_study(next(out.parent.glob("tiny.yaml")))
    write_study(study, finished_records(study, copy), copy)  # one dataset: fine
    path = copy / "runs/unet_8_16/seed1/result.json"
    record = json.loads(path.read_text())
    method = next(iter(record["references"]))
    lead = next(iter(record["references"][method]))
    record["references"][method][lead]["geopotential_500"] *= 1.02
    path.write_text(json.dumps(record))
    with pytest.raises(ValueError, match=r"study tiny_frontier: run unet_8_16 seed 1 was scored on other data than "
                                         r"run unet_4_8 seed 0 \(reference .*geopotential_500.*delete the runs"):
        write_study(study, finished_records(study, copy), copy)
