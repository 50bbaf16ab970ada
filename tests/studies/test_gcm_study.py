"""`smoe data gcm-ens` → `smoe study --config configs/studies/gcm_ens_postprocess.yaml`, end to end.

Two tiny streams (a few days at T21, 3 members) stand in for gcm_ens_2005/2006; the study file is the
committed one, shortened and pointed at the generated files from the command line only (steps, seeds, one
variant, the data path and split), as a user would. The study's CRPS of the raw ensemble is checked against
properscoring's ensemble CRPS on the generated file.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import xarray as xr

from smoeweather.cli import main

pytest.importorskip("dinosaur_torch", reason="needs the [gcm] extra (dinosaur-torch): pip install -e '.[gcm]'")
REPO = Path(__file__).resolve().parents[2]
FAST = ["--truncation", "21", "--dt-minutes", "60", "--spin-up-days", "0", "--members", "3", "--quiet"]


@pytest.mark.slow
def test_generated_gcm_ens_runs_the_postprocess_study(tmp_path: Path) -> None:
    data = tmp_path / "gcm_ens"
    assert main(["data", "gcm-ens", "--out", str(data), "--year", "2005", "--days", "6", "--seed", "2", *FAST]) == 0
    assert main(["data", "gcm-ens", "--out", str(data), "--year", "2006", "--days", "6", "--seed", "5", *FAST]) == 0
    files = [data / "gcm_ens_2005.nc", data / "gcm_ens_2006.nc"]
    overrides = ["trainer.accelerator=cpu", "trainer.enable_progress_bar=false", "trainer.log_every_n_steps=1",
                 f'"data.source=[{files[0]},{files[1]}]"', '"data.train_period=[2005-01-01,2005-01-08]"',
                 '"data.valid_period=[2006-01-01,2006-01-03]"', '"data.test_period=[2006-01-04,2006-01-08]"',
                 "data.batch_size=2", '"model.widths=[4,8]"', "model.levels=2"]
    out = tmp_path / "study"
    argv = ["study", "--config", str(REPO / "configs/studies/gcm_ens_postprocess.yaml"), "--out", str(out),
            "steps=2", "val_every_steps=1", "seeds=[0]", "variants={unet: {config: ../postprocess/gcm_ens_unet.yaml}}",
            f"overrides=[{','.join(overrides)}]"]
    assert main(argv) == 0
    result = json.loads((out / "study.json").read_text())
    assert [(r["variant"], r["seed"]) for r in result["runs"]] == [("unet", 0)]
    assert set(result["references"]) >= {"raw", "emos_gridpoint"}
    assert "CRPS" in (out / "study.md").read_text()

    # the raw ensemble's CRPS on the test split (its one init, 2006-01-05), from the generated file itself
    import properscoring

    ds = xr.load_dataset(files[1])
    init = np.datetime64("2006-01-05")
    lead = np.timedelta64(48, "h").astype("timedelta64[ns]")
    fc = ds["geopotential"].sel(time=init, prediction_timedelta=lead, level=500).values  # (member, lat, lon)
    truth = ds["truth_geopotential"].sel(valid_time=init + lead, level=500).values
    crps = properscoring.crps_ensemble(truth, np.moveaxis(fc, 0, -1))
    w = np.cos(np.deg2rad(ds["latitude"].values))
    standard = float((crps * w[:, None]).sum() / (w.sum() * crps.shape[1]))
    raw = result["references"]["raw"]["48h"]["geopotential_500"]
    m = fc.shape[0]
    # the study reports the fair CRPS: standard − E|X−X'|/(2(m−1)), E over all m² member pairs
    spread = np.abs(fc[:, None] - fc[None, :]).sum((0, 1)) / (m * m)
    fair = float(((crps - spread / (2 * (m - 1))) * w[:, None]).sum() / (w.sum() * crps.shape[1]))
    assert fair < standard
    assert raw == pytest.approx(fair, rel=1e-4)  # float32 file values, float64 sums
