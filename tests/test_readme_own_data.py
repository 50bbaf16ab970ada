"""The README's "Your own data" lines run as written.

The lines are parsed from README.md, so this test breaks when the README drifts from the configs: the
WeatherBench prepare line runs on a small store in the exact WeatherBench v1 layout (40 years, a few days
each), then the README's ERA5 training line runs on the store it wrote. The only change to a README line is
``--source`` (the test's folder) and, for time, one appended override (``trainer.max_epochs=1``).
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
from fake_layouts import WB_LAT, WB_LON, _wb_file

from smoeweather.cli import main

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
README_SOURCE = "/data/weatherbench/5.625deg"


def own_data_lines() -> list[str]:
    """The commands of the README's "## Your own data" bash block (continuation lines joined)."""
    text = README.read_text()
    section = text.split("## Your own data", 1)[1]
    block = re.search(r"```bash\n(.*?)```", section, re.S)
    assert block, "README.md: no ```bash block under '## Your own data'"
    joined = block.group(1).replace("\\\n", " ")
    return [" ".join(line.split("#", 1)[0].split()) for line in joined.splitlines() if line.strip()]


def readme_line(prefix: str) -> list[str]:
    hits = [line for line in own_data_lines() if line.startswith(prefix)]
    assert len(hits) == 1, f"README.md 'Your own data': expected one line starting {prefix!r}, found {hits}"
    return shlex.split(hits[0])


def write_weatherbench_years(root: Path, years: range, levels: list[int], steps: int = 24) -> dict[str, float]:
    """WeatherBench v1 ``geopotential`` and ``temperature`` folders (all ``levels``, 6-hourly, ``steps`` times
    from 1 January of each year) and the constants file. Returns the true mean of Z and T at 500 hPa over
    1979–2015 (the README's statistics years)."""
    rng = np.random.default_rng(0)
    sums: dict[str, list[np.ndarray]] = {"geopotential": [], "temperature": []}
    for folder, var, units, mean, std in (
        ("geopotential", "z", "m**2 s**-2", 54000.0, 3000.0),
        ("temperature", "t", "K", 260.0, 20.0),
    ):
        (root / folder).mkdir(parents=True)
        for year in years:
            times = pd.date_range(f"{year}-01-01", periods=steps, freq="6h")
            data = (mean + std * rng.standard_normal((steps, len(levels), 32, 64))).astype("float32")
            ds = _wb_file(var, data, times, {"units": units}, levels)
            ds.to_netcdf(
                root / folder / f"{folder}_{year}_5.625deg.nc",
                encoding={"time": {"units": "hours since 1900-01-01", "dtype": "int32"}},
            )
            if year <= 2015:
                sums[folder].append(data[:, levels.index(500)].astype(np.float64))
    (root / "constants").mkdir()
    xr.Dataset(
        {
            "lsm": (("lat", "lon"), rng.uniform(0, 1, (32, 64)).round().astype("float32"), {"units": "(0 - 1)"}),
            "orography": (("lat", "lon"), rng.uniform(0, 3e4, (32, 64)).astype("float32"), {"units": "m**2 s**-2"}),
        },
        coords={"lat": WB_LAT, "lon": WB_LON},
    ).to_netcdf(root / "constants" / "constants_5.625deg.nc")
    return {k: float(np.mean(v)) for k, v in sums.items()}


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_readme_own_data_prepare_and_train_run_as_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    prepare = readme_line("smoe data prepare era5 --source")
    train = readme_line("smoe train --config weatherbench/")  # a built-in config, by name
    assert "data.store=era5.zarr" in train, f"README train line does not read the prepared store: {train}"

    source = tmp_path / "weatherbench"
    years = range(int(prepare[prepare.index("--years") + 1]), int(prepare[prepare.index("--years") + 2]) + 1)
    means = write_weatherbench_years(source, years, levels=[250, 500, 850, 1000])  # more levels than asked
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
