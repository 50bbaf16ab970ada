"""The README's researcher lines run as written.

The lines are parsed from README.md's researcher section, so this test breaks when the README drifts from the
configs: the prepare line (WeatherBench 2's ERA5 zarr in its bucket) runs on a small local zarr in the exact
WeatherBench 2 layout (40 years, a few days each), then the README's training line runs on the store it wrote. The
only change to a README line is ``--source`` (the test's zarr) and, for time, one appended override
(``trainer.max_epochs=1``).
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
import xarray as xr
from fake_layouts import wb2_dataset

from smoeweather.cli import main

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
README_SOURCE = "gs://weatherbench2/datasets/era5/1959-2022-6h-64x32_equiangular_conservative.zarr"
SECTION = "## I am a researcher"


def own_data_lines() -> list[str]:
    """The commands of the bash block of the README's researcher section (continuation lines joined)."""
    text = README.read_text()
    assert SECTION in text, f"README.md: no section {SECTION!r}"
    section = text.split(SECTION, 1)[1]
    block = re.search(r"```bash\n(.*?)```", section, re.S)
    assert block, f"README.md: no ```bash block under {SECTION!r}"
    joined = block.group(1).replace("\\\n", " ")
    return [" ".join(line.split("#", 1)[0].split()) for line in joined.splitlines() if line.strip()]


def readme_line(prefix: str) -> list[str]:
    hits = [line for line in own_data_lines() if line.startswith(prefix)]
    assert len(hits) == 1, f"README.md 'Your own data': expected one line starting {prefix!r}, found {hits}"
    return shlex.split(hits[0])


def write_wb2_years(path: Path, years: range, levels: list[int], steps: int = 24) -> dict[str, float]:
    """A WeatherBench 2 ERA5 zarr (its variable names, attributes, 64×32 grid and consolidated zarr v2) with
    ``steps`` 6-hourly times from 1 January of each year, ``levels`` and the constants the README keeps. Returns
    the true mean of Z and T at 500 hPa over 1979–2015 (the README's statistics years)."""
    ds = wb2_dataset(times=steps * len(years), levels=levels, seed=0)
    times = np.concatenate([pd.date_range(f"{y}-01-01", periods=steps, freq="6h").values for y in years])
    ds = ds.assign_coords(time=times)
    rng = np.random.default_rng(1)
    ds["geopotential_at_surface"] = (("latitude", "longitude"), rng.uniform(0, 3e4, (32, 64)).astype("float32"),
                                     {"long_name": "Geopotential at surface", "units": "m**2 s**-2"})
    ds.chunk({"time": steps}).to_zarr(path, mode="w", consolidated=True, zarr_format=2)
    train = ds.sel(time=ds.time.dt.year <= 2015, level=500)
    return {k: float(train[k].astype("float64").mean()) for k in ("geopotential", "temperature")}


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_readme_own_data_prepare_and_train_run_as_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    prepare = readme_line("smoe data prepare era5 --format wb2 --source")
    train = readme_line("smoe train --config weatherbench/")  # a built-in config, by name
    assert "data.store=era5.zarr" in train, f"README train line does not read the prepared store: {train}"
    evaluate = readme_line("smoe evaluate")
    assert "--climatology" in evaluate, f"README evaluate line has no --climatology (no ACC): {evaluate}"

    source = tmp_path / "era5_wb2.zarr"
    years = range(int(prepare[prepare.index("--years") + 1]), int(prepare[prepare.index("--years") + 2]) + 1)
    means = write_wb2_years(source, years, levels=[250, 500, 850, 1000])  # more levels than asked
    monkeypatch.chdir(tmp_path)

    prepare = [str(source) if a == README_SOURCE else a for a in prepare] + ["--quiet"]
    assert main(prepare[1:]) == 0
    store = xr.open_zarr(tmp_path / "era5.zarr")
    assert store["level"].values.tolist() == [500, 850]
    assert {"land_sea_mask", "geopotential_at_surface"} <= set(store.data_vars), (
        "the README prepare line must keep the constants that the ERA5 configs read (land_sea_mask, "
        "geopotential_at_surface)"
    )
    stats = xr.open_zarr(tmp_path / "era5.zarr", group="statistics")
    assert stats.attrs["train_years"] == [1979, 2015]
    for name, mean in means.items():  # float32 fields summed in float64 over 888 × 2048 values
        assert float(stats[name].sel(statistic="mean", level=500)) == pytest.approx(mean, rel=1e-9)

    assert main(train[1:] + ["trainer.max_epochs=1"]) == 0
    runs = sorted((tmp_path / "runs").rglob("last.ckpt"))
    assert len(runs) == 1, runs
    meta = torch.load(runs[0], map_location="cpu", weights_only=False)["smoeweather"]
    fields = ["geopotential_500", "geopotential_850", "temperature_500", "temperature_850"]
    assert meta["channel_names"] == [f"{f}@{o:+d}h" for o in (-12, -6, 0) for f in fields] + [
        "land_sea_mask", "geopotential_at_surface", "latitude", "lead_time/100h"]
    assert meta["target_names"] == ["geopotential_500", "temperature_850"]
    # the model normalises with the store's statistics over the README's --train-years
    assert meta["normalisation"]["input_mean"][fields.index("geopotential_500")] == pytest.approx(
        means["geopotential"], rel=1e-6)
