"""Site identifiers survive every post-processing path: station ids of different lengths, ids that share their
first character, non-ASCII station names, and the other CF coordinates (latitude, longitude, altitude with their
attributes) come out of every fit/apply form exactly as they went in: EMOS global, per site, member weights,
each with and without a rolling window, and the DRN. Read from a CF DSG file and from a plain table."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import xarray as xr

from smoeweather.cli import main
from smoeweather.data.sites import open_sites, read_site_table, station_ids, write_sites

IDS = ["3", "3AB", "K", "KSEA", "KS", "Köln-Süd-7"]  # lengths 1..10, shared first characters, non-ASCII
NAMES = ["Zürich Flughafen", "Ålesund", "São Paulo", "Seattle–Tacoma", "Kraków", "Köln/Bonn"]
MEMBERS = ["A", "B", "C", "D"]
FORMS = {"global": [], "per-site": ["--per-site"], "members": ["--predictors", "members"]}
DRN_FAST = ["--method", "drn", "--drn-epochs", "2", "--drn-seeds", "1", "--drn-hidden", "4"]


def _table(path: Path, n_days: int = 24, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    rows = []
    for s, sid in enumerate(IDS):
        for d in pd.date_range("2004-01-01", periods=n_days):
            obs = 270.0 + 2.0 * s + 3.0 * np.sin(d.day_of_year / 4.0) + rng.normal()
            rows.append([*(obs + rng.normal(0.3 * k, 1.0, 1)[0] for k in range(len(MEMBERS))), obs,
                         int(d.strftime("%Y%m%d00")), f"{sid} ", 40.0 + 1.5 * s, -120.0 + 0.25 * s, 10.0 * s + 0.5])
    pd.DataFrame(rows, columns=[*MEMBERS, "observation", "date", "station", "latitude", "longitude", "elevation"]
                 ).to_csv(path, index=False)


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("ids")
    _table(d / "t.csv")
    fc, obs = read_site_table(d / "t.csv")
    # the same sites in a CF DSG file with a station-name coordinate, sites in another order than the table's
    order = np.array([4, 0, 5, 2, 1, 3])
    fc, obs = fc.isel(site=order), obs.isel(site=order)
    names = ("site", np.array(NAMES)[order], {"long_name": "station name"})
    fc, obs = fc.assign_coords(station_name=names), obs.assign_coords(station_name=names)
    write_sites(fc, obs, d / "sites.nc")
    return {"table": d / "t.csv", "dsg": d / "sites.nc"}


def _cli(*args: object) -> None:
    assert main(["postprocess", *map(str, args), "--scheduler", "threads", "--quiet", "--overwrite"]) == 0


def _assert_site_coords(out: xr.Dataset, ref: xr.Dataset, where: str, string_kinds: str = "U") -> None:
    """Every site coordinate of ``ref`` in ``out``: same values (exactly), a string dtype of ``string_kinds``
    (unicode; a netCDF char array read by plain xarray is an object array of str), same attributes."""
    for c in [c for c in ref.coords if ref[c].dims == ("site",) and c != "site"]:
        assert c in out.coords, f"{where}: coordinate {c} lost"
        got, want = out[c].values, ref[c].values
        if want.dtype.kind in "OUS":
            assert got.dtype.kind in string_kinds, f"{where}: {c} has dtype {got.dtype}"
            assert all(isinstance(x, str) for x in got), f"{where}: {c} holds non-strings {list(got)}"
            assert [str(x) for x in got] == [str(x) for x in want], f"{where}: {c} {list(got)} != {list(want)}"
        else:
            np.testing.assert_array_equal(got, want, err_msg=f"{where}: {c}")
        for k, v in ref[c].attrs.items():
            assert out[c].attrs.get(k) == v, f"{where}: {c}.attrs[{k!r}] = {out[c].attrs.get(k)!r}, not {v!r}"


def test_station_ids_are_fixed_width_unicode() -> None:
    ids = station_ids(np.array(["3", "KSEA", b"K", "Köln"], dtype=object))
    assert ids.dtype == np.dtype("<U4") and list(ids) == ["3", "KSEA", "K", "Köln"]


def test_dsg_round_trip_keeps_every_site_coordinate(sources: dict[str, Path]) -> None:
    fc, obs = open_sites(sources["dsg"])
    assert list(fc["station_name"].values) == list(np.array(NAMES)[[4, 0, 5, 2, 1, 3]])
    assert fc["station_id"].dtype.kind == "U" and obs["station_name"].dtype.kind == "U"
    assert fc["station_id"].attrs["cf_role"] == "timeseries_id"


@pytest.mark.parametrize("source", ["dsg", "table"])
@pytest.mark.parametrize("rolling", [False, True], ids=["once", "rolling"])
@pytest.mark.parametrize("form", [*FORMS, "drn"])
def test_site_coordinates_survive_fit_and_apply(sources: dict[str, Path], tmp_path: Path, source: str,
                                                rolling: bool, form: str) -> None:
    src = sources[source]
    ref, _ = open_sites(src)
    extra = DRN_FAST if form == "drn" else FORMS[form]
    roll = ["--window", "10D", "--lag", "2D"] if rolling else []
    _cli("fit", "--forecast", src, *extra, *roll, "--out", tmp_path / "m.nc")
    with xr.open_dataset(tmp_path / "m.nc") as m:
        first = str(m["time"].values[0])[:10] if "time" in m.dims else str(ref["time"].values[0])[:10]
        _assert_site_coords(m, ref, f"{form} model file", string_kinds="UO")
    flag = "--drn" if form == "drn" else "--emos"
    _cli("apply", flag, tmp_path / "m.nc", "--forecast", src, "--apply-period", first,
         str(ref["time"].values[-1])[:10], "--out", tmp_path / "p.zarr", "--members", len(MEMBERS),
         "--quantiles", "0.1", "0.9")
    for store in ("p.zarr", "p_members.zarr", "p_quantiles.zarr"):
        with xr.open_zarr(tmp_path / store) as out:
            _assert_site_coords(out, ref, f"{form}{' rolling' if rolling else ''} {store}")
            assert np.isfinite(out["2m_temperature"].values).mean() > 0.5
