"""Property tests of the input readers: random missing-data patterns and random garbage
cells fed to the station-table reader and to a gridded ensemble file end either refused by name (the column
and row, or the variable and member) or read correctly, with the case counts of the fit checks exact."""

from __future__ import annotations

import contextlib
import io
import re
import uuid
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import xarray as xr
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipelines.errors import DataError
from smoeweather.data.sites import read_site_table
from smoeweather.postprocess.validate import check_fit_data, data_counts

SITES, DAYS, MEMBERS = 3, 5, ["m0", "m1", "m2"]
GARBAGE = ["abc", "inf", "-inf", "1e400", "--", "TRUE", "1,5", "x1"]
PROPERTY = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def _expected_counts(ens: np.ndarray, obs: np.ndarray) -> tuple[str | None, int]:
    """(the refusal a fit must give or None, the number of complete cases) of ens (..., member) and obs (...)."""
    total = obs.size
    if np.isnan(obs).all():
        return "every observation", 0
    if np.isnan(ens).reshape(-1, ens.shape[-1]).all(0).any():
        return "hold no value", 0
    complete = int((np.isfinite(ens).all(-1) & np.isfinite(obs)).sum())
    return ("no case of" if complete == 0 else None), complete if total else 0


def _check(fc: xr.Dataset, truth_at: xr.Dataset, ens: np.ndarray, obs: np.ndarray, where: str) -> None:
    refusal, complete = _expected_counts(ens, obs)
    counts = data_counts(fc, truth_at, where).compute()
    if refusal is not None:
        with pytest.raises(DataError, match=re.escape(where)) as err:
            check_fit_data(counts, fc, where, quiet=True)
        assert refusal in str(err.value)
        return
    name = next(iter(fc.data_vars))
    report = check_fit_data(counts, fc, where, quiet=True)[name]
    assert report["cases"] == complete and report["cases_total"] == obs.size
    assert report["observations_missing"] == int(np.isnan(obs).sum())
    assert report["forecast_values_missing"] == int(np.isnan(ens).sum())


@st.composite
def tables(draw: st.DrawFn) -> tuple[pd.DataFrame, np.ndarray]:
    """A station table as strings (every cell as a CSV holds it) and the (row, column) cell kinds:
    0 a number, 1 missing (empty), 2 garbage."""
    n = SITES * DAYS
    cols = [*MEMBERS, "observation"]
    kinds = np.array(draw(st.lists(st.sampled_from([0, 0, 0, 0, 1, 1, 2]), min_size=n * len(cols),
                                   max_size=n * len(cols)))).reshape(n, len(cols))
    if draw(st.booleans()):  # often no garbage at all: the read must then be exact
        kinds[kinds == 2] = 0
    junk = draw(st.lists(st.sampled_from(GARBAGE), min_size=kinds.size, max_size=kinds.size))
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    values = np.round(270.0 + 10.0 * rng.standard_normal((n, len(cols))), 3)
    cells = np.where(kinds == 0, values.astype(str), np.where(kinds == 1, "", np.array(junk).reshape(kinds.shape)))
    dates = pd.date_range("2004-01-01", periods=DAYS, freq="D").strftime("%Y%m%d00")
    df = pd.DataFrame(cells, columns=cols)
    df["date"] = np.tile(dates, SITES)
    df["station"] = np.repeat([f"S{s}" for s in range(SITES)], DAYS)
    df["latitude"], df["longitude"] = 45.0, -120.0
    return df, kinds


@PROPERTY
@given(case=tables())
def test_station_table_refused_by_name_or_correct(case: tuple[pd.DataFrame, np.ndarray], tmp_path: Path) -> None:
    df, kinds = case
    path = tmp_path / "t.csv"
    df.to_csv(path, index=False)
    garbage = np.argwhere(kinds == 2)
    if len(garbage):  # refused, naming the first garbage cell in column order (members, then observation)
        row, col = sorted(garbage.tolist(), key=lambda rc: (rc[1], rc[0]))[0]
        with pytest.raises(DataError) as err:
            read_site_table(path, members=MEMBERS)
        assert f"column {df.columns[col]!r}, row {row + 1} (line {row + 2})" in str(err.value)
        return
    fc, obs = read_site_table(path, members=MEMBERS)
    assert list(fc["member"].values) == MEMBERS
    want = np.where(kinds == 1, np.nan, df[[*MEMBERS, "observation"]].replace("", np.nan).astype(float).values)
    got_ens = fc["2m_temperature"].isel(prediction_timedelta=0).transpose("site", "time", "member").values
    # the cells are numbers of at most 7 significant digits: pandas' parser and float() both give the nearest float64
    np.testing.assert_array_equal(got_ens.reshape(-1, len(MEMBERS)), want[:, :3])
    np.testing.assert_array_equal(obs["2m_temperature"].transpose("site", "time").values.ravel(), want[:, 3])
    truth_at = obs.assign_coords(time=fc["time"].values).expand_dims(
        prediction_timedelta=fc["prediction_timedelta"].values, axis=1)
    _check(fc, truth_at, got_ens.reshape(-1, len(MEMBERS)), want[:, 3], str(path))


@PROPERTY
@given(case=tables())
def test_default_members_never_drop_a_column_silently(case: tuple[pd.DataFrame, np.ndarray],
                                                      tmp_path: Path) -> None:
    """Without --table-members a column with a stray text cell is still a member (and its cell is refused);
    a column without any number is named on stderr, never dropped in silence."""
    df, kinds = case
    path = tmp_path / "t.csv"
    df.to_csv(path, index=False)
    numeric = [m for i, m in enumerate(MEMBERS) if (kinds[:, i] == 0).any()]
    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr):
        try:
            fc, _ = read_site_table(path)
        except DataError as err:
            assert re.search(r"column '(m\d|observation)', row \d+ \(line \d+\)", str(err)) or "member" in str(err)
            return
    assert list(fc["member"].values) == numeric
    for m in set(MEMBERS) - set(numeric):
        assert f"'{m}'" in stderr.getvalue()


@st.composite
def grids(draw: st.DrawFn) -> tuple[np.ndarray, np.ndarray, bool]:
    """An ensemble (time 4, member 3, lat 2, lon 4) and its truth with random NaN and ±inf cells, and whether the
    file's longitudes run −180…180."""
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    ens = 280.0 + rng.standard_normal((4, 3, 2, 4))
    obs = 280.0 + rng.standard_normal((4, 2, 4))
    for a in (ens, obs):
        flat = a.reshape(-1)
        nan = draw(st.lists(st.integers(0, flat.size - 1), max_size=flat.size))
        flat[nan] = np.nan
        if draw(st.integers(0, 3)) == 0:
            flat[draw(st.integers(0, flat.size - 1))] = draw(st.sampled_from([np.inf, -np.inf]))
    if draw(st.booleans()):  # a whole member missing
        ens[:, draw(st.integers(0, 2))] = np.nan
    return ens, obs, draw(st.booleans())


@PROPERTY
@given(case=grids())
def test_gridded_file_refused_by_name_or_correct(case: tuple[np.ndarray, np.ndarray, bool], tmp_path: Path) -> None:
    from smoeweather.postprocess.pipeline import open_forecast_and_truth, truth_on_valid_times

    ens, obs, west = case
    lon = np.array([0.0, 90.0, 180.0, 270.0])
    init = pd.date_range("2005-01-01", periods=4, freq="D")
    lead = pd.to_timedelta([24], "h")
    file_lon = np.where(lon >= 180, lon - 360, lon) if west else lon
    ds = xr.Dataset({"temperature": (("time", "prediction_timedelta", "member", "latitude", "longitude"),
                                     ens[:, None], {"units": "K"}),
                     "truth_temperature": (("valid_time", "latitude", "longitude"), obs, {"units": "K"})},
                    coords={"time": init, "prediction_timedelta": lead, "member": np.arange(3),
                            "latitude": [-45.0, 45.0], "longitude": file_lon, "valid_time": init + lead[0]})
    path = tmp_path / f"ens_{uuid.uuid4().hex}.nc"  # a new file per example: xarray caches open handles
    ds.to_netcdf(path)
    fc, truth = open_forecast_and_truth([path], None, None, {})
    truth_at = truth_on_valid_times(fc, truth)
    np.testing.assert_array_equal(fc["longitude"].values, lon)  # one convention for forecast and truth
    # the file's values reordered, no arithmetic: exact below
    got = fc["temperature"].isel(prediction_timedelta=0).values
    np.testing.assert_array_equal(got, ens)  # the file's longitude order was already 0…270 after the modulo
    np.testing.assert_array_equal(truth_at["temperature"].isel(prediction_timedelta=0).values, obs)
    where = str(path)
    bad_member = [str(m) for m in range(3) if np.isinf(ens[:, m]).any()]
    if bad_member or np.isinf(obs).any():
        with pytest.raises(DataError, match=re.escape(where)) as err:
            check_fit_data(data_counts(fc, truth_at, where).compute(), fc, where, quiet=True)
        assert "infinite" in str(err.value)
        assert (f"member(s) {bad_member}" in str(err.value)) if bad_member else "observations" in str(err.value)
        return
    _check(fc, truth_at, np.moveaxis(ens, 1, -1), obs, where)
