"""Fault injection, data: broken station tables, gridded ensembles and model files are refused by
name in one line (exit 2), a fit is never written from zero valid cases, a partial gap is said and counted in
the model file, units come from the data or --units, and longitudes in −180…180 match every other input."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import xarray as xr
from test_postprocess_cli import LON, gcm_ens_like
from test_sites import srft_like

from smoeweather.cli import main

FAST = ["--quiet", "--scheduler", "threads"]
DRN = ["--method", "drn", "--drn-epochs", "1", "--drn-seeds", "1", "--quiet"]


@pytest.fixture(scope="module")
def table(tmp_path_factory: pytest.TempPathFactory) -> pd.DataFrame:
    """The srft-layout station table (4 stations × 30 days, 5 rows missing) every case below breaks."""
    return srft_like(tmp_path_factory.mktemp("t") / "t.csv", n_days=30, n_sites=4)


def _write(df: pd.DataFrame, path: Path) -> Path:
    df.to_csv(path, index=False)
    return path


def _fails(argv: list[str], capsys: pytest.CaptureFixture, *needles: str) -> str:
    """Run ``smoe argv``: exit 2, one line on stderr naming every needle, no traceback."""
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("smoe ")]
    assert len(lines) == 1 and "Traceback" not in err, err
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


def _fit(csv: Path, out: Path, *extra: str) -> list[str]:
    return ["postprocess", "fit", "--forecast", str(csv), "--out", str(out), *extra]


@pytest.mark.parametrize("method", ["emos", "drn"])
def test_all_missing_observations_are_refused_and_nothing_is_written(
        table: pd.DataFrame, tmp_path: Path, capsys: pytest.CaptureFixture, method: str) -> None:
    csv = _write(table.assign(observation=np.nan), tmp_path / "obs.csv")
    argv = _fit(csv, tmp_path / "m.nc", *(DRN if method == "drn" else ["--per-site", *FAST]))
    _fails(argv, capsys, str(csv), "every observation of '2m_temperature' is missing (120 of 120)")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["obs.csv"]  # no model, no staging


@pytest.mark.parametrize("method", ["emos", "drn"])
def test_an_all_missing_member_is_refused_by_name(table: pd.DataFrame, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture, method: str) -> None:
    csv = _write(table.assign(GFS=np.nan), tmp_path / "member.csv")
    argv = _fit(csv, tmp_path / "m.nc", *(DRN if method == "drn" else FAST))
    _fails(argv, capsys, str(csv), "member(s) ['GFS']", "hold no value")
    assert not (tmp_path / "m.nc").exists()


def test_partial_gaps_are_noted_and_counted_in_the_model(table: pd.DataFrame, tmp_path: Path,
                                                          capsys: pytest.CaptureFixture) -> None:
    df = table.copy()
    df.loc[df.index % 2 == 0, "observation"] = np.nan
    df.loc[1, "ETA"] = np.nan  # one more case without every member
    csv = _write(df, tmp_path / "half.csv")
    n_obs = int(df["observation"].notna().sum())
    assert main(_fit(csv, tmp_path / "m.nc", "--per-site", *FAST)) == 0
    cap = capsys.readouterr()
    attrs = xr.open_dataset(tmp_path / "m.nc").attrs
    total = 4 * 30  # every (station, date) of the table, rows missing from it included
    assert attrs["fit_cases"] == attrs["2m_temperature_fit_cases"] == n_obs - 1
    assert attrs["2m_temperature_cases_total"] == total
    assert attrs["2m_temperature_observations_missing"] == total - n_obs
    assert f"fitting on {n_obs - 1} of {total} cases ({total - n_obs} observations missing, 1 more" in cap.err
    assert f"on {n_obs - 1} cases" in cap.out
    assert np.isfinite(xr.open_dataset(tmp_path / "m.nc")["2m_temperature_a"]).all()


def test_rolling_windows_without_cases_are_counted_not_reported_as_fits(
        table: pd.DataFrame, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """Per site on rolling windows, a site whose window holds too few complete cases gets NaN coefficients:
    the summary and the file say how many, instead of counting them as converged fits."""
    df = table.copy()
    df.loc[df["station"].str.strip() == "K000", "observation"] = np.nan  # one station never observed
    csv = _write(df, tmp_path / "gap.csv")
    assert main(_fit(csv, tmp_path / "m.nc", "--per-site", "--window", "10D", *FAST)) == 0
    cap = capsys.readouterr()
    model = xr.open_dataset(tmp_path / "m.nc")
    nan = int(np.isnan(model["2m_temperature_a"]).sum())
    assert nan >= model.sizes["time"] and model.attrs["groups_without_data"] == nan
    assert f"{nan} without enough cases (NaN)" in cap.out and f"{nan} of" in cap.err


@pytest.mark.parametrize("cell", ["abc", "inf", "True"])
def test_a_garbage_cell_is_refused_by_column_and_row(table: pd.DataFrame, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture, cell: str) -> None:
    df = table.copy()
    df["GFS"] = df["GFS"].astype(object)
    df.loc[3, "GFS"] = cell
    csv = _write(df, tmp_path / "garbage.csv")
    _fails(_fit(csv, tmp_path / "m.nc", *FAST), capsys, str(csv), "column 'GFS', row 4 (line 5)",
           "is not a number")
    assert not (tmp_path / "m.nc").exists()


def test_empty_and_header_only_tables_and_a_bad_lead_name_what_is_wrong(
        table: pd.DataFrame, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    (tmp_path / "empty.csv").write_text("")
    _fails(_fit(tmp_path / "empty.csv", tmp_path / "m.nc", *FAST), capsys, "empty.csv: empty file")
    _write(table.iloc[:0], tmp_path / "header.csv")
    _fails(_fit(tmp_path / "header.csv", tmp_path / "m.nc", *FAST), capsys, "header.csv", "no rows")
    csv = _write(table, tmp_path / "t.csv")
    _fails(_fit(csv, tmp_path / "m.nc", "--table-lead", "abc", *FAST), capsys, "--table-lead 'abc'",
           "not a duration")
    df = table.copy()
    df["date"] = df["date"].astype(object)
    df.loc[2, "date"] = "someday"
    _fails(_fit(_write(df, tmp_path / "d.csv"), tmp_path / "m.nc", *FAST), capsys, "column 'date', row 3")


def test_units_come_from_units_option_never_a_hard_coded_kelvin(table: pd.DataFrame, tmp_path: Path) -> None:
    csv = _write(table.assign(observation=table["observation"].abs()), tmp_path / "wind.csv")
    assert main(_fit(csv, tmp_path / "wind.nc", "--table-variable", "10m_wind_speed", "--units", "m s-1",
                     *FAST)) == 0
    assert xr.open_dataset(tmp_path / "wind.nc")["10m_wind_speed_a"].attrs["units"] == "m s-1"
    assert main(_fit(csv, tmp_path / "none.nc", "--table-variable", "10m_wind_speed", *FAST)) == 0
    assert xr.open_dataset(tmp_path / "none.nc")["10m_wind_speed_a"].attrs.get("units", "") == ""


def test_model_files_that_are_not_models_are_named(table: pd.DataFrame, tmp_path: Path,
                                                    capsys: pytest.CaptureFixture) -> None:
    csv = _write(table, tmp_path / "t.csv")
    assert main(_fit(csv, tmp_path / "good.nc", *FAST)) == 0
    data = (tmp_path / "good.nc").read_bytes()
    (tmp_path / "trunc.nc").write_bytes(data[: len(data) // 2])
    (tmp_path / "model.txt").write_text("hello\n")
    (tmp_path / "model.yaml").write_text("a: 1\n")
    (tmp_path / "store.zarr").mkdir()
    out = ["--forecast", str(csv), "--out", str(tmp_path / "pp.zarr"), *FAST]
    cases = {("--emos", "model.txt"): "not a netCDF file", ("--drn", "model.yaml"): "not a netCDF file",
             ("--emos", "trunc.nc"): "cannot read this netCDF file (truncated or corrupt?",
             ("--drn", "store.zarr"): "a folder (a zarr store?), not a model file"}
    for (flag, name), needle in cases.items():
        line = _fails(["postprocess", "apply", flag, str(tmp_path / name), *out], capsys,
                      f"{flag} {tmp_path / name}", needle)
        assert "--trust" not in line and "IO backends" not in line
    assert not (tmp_path / "pp.zarr").exists()


def test_truncated_forecast_file_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    ens = gcm_ens_like(tmp_path / "ens.nc", 2005, 1, n_init=6)
    data = ens.read_bytes()
    (tmp_path / "cut.nc").write_bytes(data[: int(0.9 * len(data))])
    _fails(["postprocess", "fit", "--forecast", str(tmp_path / "cut.nc"), "--out", str(tmp_path / "m.nc"), *FAST],
           capsys, str(tmp_path / "cut.nc"), "truncated or corrupt")


def test_longitudes_minus_180_match_the_truth_inside_the_file(tmp_path: Path) -> None:
    """The same ensemble with longitudes 0…330 and −180…150: fit and apply agree to the bit."""
    east = gcm_ens_like(tmp_path / "east.nc", 2005, 1, n_init=8)
    west = gcm_ens_like(tmp_path / "west.nc", 2005, 1, n_init=8, lon=np.where(LON >= 180, LON - 360, LON))
    for ens in (east, west):
        assert main(["postprocess", "fit", "--per-gridpoint", "--forecast", str(ens), "--out",
                     str(tmp_path / f"{ens.stem}_model.nc"), *FAST]) == 0
        assert main(["postprocess", "apply", "--emos", str(tmp_path / f"{ens.stem}_model.nc"), "--forecast", str(ens),
                     "--out", str(tmp_path / f"{ens.stem}.zarr"), *FAST]) == 0
    a, b = xr.load_dataset(tmp_path / "east_model.nc"), xr.load_dataset(tmp_path / "west_model.nc")
    for v in a.data_vars:
        # the reader sorts longitudes to 0…330 first: both fits see the same arrays and run the same code, so the model
        # files and the outputs are the same bits
        np.testing.assert_array_equal(a[v].values, b[v].values)
    pa, pb = xr.open_zarr(tmp_path / "east.zarr").load(), xr.open_zarr(tmp_path / "west.zarr").load()
    np.testing.assert_array_equal(pa["longitude"].values, LON)
    for v in pa.data_vars:
        np.testing.assert_array_equal(pa[v].values, pb[v].values)
