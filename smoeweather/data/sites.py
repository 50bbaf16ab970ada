"""Ensemble forecasts and observations at sites (stations): the CF discrete-sampling-geometry file and a reader
for plain tables (CSV or Parquet).

In memory a site forecast is a Dataset in the post-processing conventions with ``site`` in place of the grid:
``<name>`` (time, prediction_timedelta, member, site) with ``time`` = initialisation, and the observations as
a separate Dataset on ``time`` = VALID time (time, site), like every other truth. Site coordinates:
``station_id`` (str), ``latitude``, ``longitude`` (degrees) and ``altitude`` (m) on ``site``.

On disk (:func:`write_sites`, :func:`open_sites`): CF-1.8 netCDF, ``featureType = "timeSeries"``, one time
series per site (``station_id`` with ``cf_role = "timeseries_id"``), the forecast ``<name>`` on
(site, time, prediction_timedelta, member) with ``coordinates = "latitude longitude altitude station_id"``
and the observation ``<name>_observation`` on (site, time, prediction_timedelta): the value observed at
time + lead, aligned with the forecast it verifies.

Tables (:func:`read_site_table`): one row per station and date, one column per member, an observation
column, station id, latitude, longitude and elevation/altitude columns; the date is the VALID date by default
(ensembleBMA's ``srft``) or the initialisation date (``time_kind="init"``); one lead for the whole table.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd
import xarray as xr

from pipelines.errors import DataError

OBS_SUFFIX = "_observation"
SITE_COORDS = ("station_id", "latitude", "longitude", "altitude")
TABLE_SUFFIXES = (".csv", ".parquet", ".pq")
STATION_COLUMNS = ("station", "station_id", "site", "id")
NON_MEMBER_COLUMNS = {"observation", "obs", "date", "time", "valid_time", "init_time", "station", "station_id",
                      "site", "id", "latitude", "lat", "longitude", "lon", "elevation", "altitude", "alt", "type",
                      "network", "idate", "vdate"}


def is_site_source(path: str | Path) -> bool:
    """True for a table (.csv/.parquet) or a netCDF with ``featureType = timeSeries``."""
    p = Path(path)
    if p.suffix.lower() in TABLE_SUFFIXES:
        return True
    if p.is_file() and p.suffix.lower() in (".nc", ".nc4", ".cdf"):
        from pipelines.readers._files import open_data

        with open_data(p) as ds:  # an empty, text or unreadable file: a one-line error naming it
            return str(ds.attrs.get("featureType", "")).lower() == "timeseries"
    return False


def _column(df: pd.DataFrame, names: Sequence[str], what: str, path: Path) -> str:
    for n in names:
        if n in df.columns:
            return n
    raise DataError(f"{path}: no {what} column; expected one of {list(names)} (columns: {list(df.columns)})")


def _row(path: Path, i: int) -> str:
    """Row ``i`` (0-based, of the data) as a user finds it: the line of a CSV file (header = line 1)."""
    return f"row {i + 1} (line {i + 2})" if path.suffix.lower() == ".csv" else f"row {i + 1}"


def _read_table(path: Path) -> pd.DataFrame:
    """The rows of a CSV/Parquet table; DataError naming the file when it is empty, unreadable or has no rows."""
    what = "Parquet" if path.suffix.lower() in (".parquet", ".pq") else "CSV"
    try:
        # station ids as text: WMO ids such as 01001 keep their leading zero (a CF file's ids are text)
        df = pd.read_parquet(path) if what == "Parquet" else pd.read_csv(path, dtype=dict.fromkeys(STATION_COLUMNS,
                                                                                                      str))
    except pd.errors.EmptyDataError:
        raise DataError(f"{path}: empty file; expected a {what} table with a header row (member columns, "
                        "observation, date, station, latitude, longitude)") from None
    except (pd.errors.ParserError, UnicodeDecodeError, OSError, ValueError) as err:
        reason = " ".join(str(err).split())
        raise DataError(f"{path}: not a readable {what} table ({reason})") from None
    if df.empty:
        raise DataError(f"{path}: the table has a header but no rows; expected one row per station and date")
    return df


def numeric_column(df: pd.DataFrame, col: str, path: Path) -> np.ndarray:
    """Column ``col`` as float64, empty cells NaN; DataError naming the column and the first row whose cell is
    not a finite number (text, ``inf``, a boolean)."""
    s = df[col]
    if pd.api.types.is_bool_dtype(s):
        bad = np.ones(len(s), bool)
        vals = np.full(len(s), np.nan)
    elif pd.api.types.is_numeric_dtype(s):
        vals = s.to_numpy(np.float64, na_value=np.nan)
        bad = np.isinf(vals)
    else:
        vals = pd.to_numeric(s, errors="coerce").to_numpy(np.float64, na_value=np.nan)
        filled = s.notna().to_numpy() & (s.astype(str).str.strip() != "").to_numpy()
        bad = (np.isnan(vals) & filled) | np.isinf(vals)
    if bad.any():
        i = int(np.argmax(bad))
        raise DataError(f"{path}: column {col!r}, {_row(path, i)}: {s.iloc[i]!r} is not a number; expected a "
                        "finite number, or an empty cell for a missing value")
    return vals


def _default_members(df: pd.DataFrame, excluded: set[str], path: Path) -> list[str]:
    """Every column not in ``excluded`` that holds a number (a column with a stray text cell included, so that
    the cell is refused by name rather than the member dropped); columns without any number are named."""
    members, texts = [], []
    for c in df.columns:
        if str(c).lower() in NON_MEMBER_COLUMNS or c in excluded:
            continue
        if pd.api.types.is_numeric_dtype(df[c]) and not pd.api.types.is_bool_dtype(df[c]):
            members.append(c)
        elif pd.to_numeric(df[c], errors="coerce").notna().any():
            members.append(c)
        else:
            texts.append(c)
    if texts:
        print(f"note: {path}: column(s) {texts} hold no number and are not read as members (name the members "
              "with --table-members)", file=sys.stderr)
    return members


def _parse_dates(df: pd.DataFrame, tcol: str, path: Path) -> pd.Series:
    """The date column as datetimes (``YYYYMMDDHH`` integers or ISO strings); DataError naming a bad row."""
    raw = df[tcol]
    text = raw.astype(str).str.strip()
    compact = text.str.fullmatch(r"\d{10}")  # YYYYMMDDHH, also in a column a stray text cell made non-numeric
    fmt = "%Y%m%d%H" if pd.api.types.is_integer_dtype(raw) or compact.any() else None
    times = pd.to_datetime(text.where(raw.notna()), format=fmt, errors="coerce")
    bad = times.isna().to_numpy()
    if bad.any():
        i = int(np.argmax(bad))
        raise DataError(f"{path}: column {tcol!r}, {_row(path, i)}: {raw.iloc[i]!r} is not a date; expected "
                        "YYYYMMDDHH or an ISO date such as 2004-01-31")
    return times


def _lead(lead: str) -> pd.Timedelta:
    try:
        td = pd.Timedelta(lead)
    except ValueError:
        raise DataError(f"--table-lead {lead!r}: not a duration; expected e.g. 48h or 2D") from None
    if td < pd.Timedelta(0) or pd.isna(td):
        raise DataError(f"--table-lead {lead!r}: a lead time cannot be negative; expected e.g. 48h")
    return td


def read_site_table(path: str | Path, variable: str = "2m_temperature", lead: str = "48h",
                    time_kind: str = "valid", members: Sequence[str] | None = None,
                    observation: str | None = None, units: str | None = None) -> tuple[xr.Dataset, xr.Dataset]:
    """(forecast, observations on valid times) of a CSV/Parquet table with one row per station and date.

    ``members``: the member columns (default: every column that holds numbers and is not a known non-member
    column such as observation, date, station, latitude, longitude, elevation, type). Dates ``YYYYMMDDHH``
    integers or ISO strings. Rows missing for a station and date become NaN, as do empty cells; a cell that is
    not a finite number, a bad date and repeated (station, date) rows are refused by column and row.
    ``units``: of the values (``--units``; a table carries none, so without it the units are left unset).
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"site table {path} does not exist")
    if time_kind not in ("valid", "init"):
        raise ValueError(f"time_kind must be 'valid' or 'init', got {time_kind!r}")
    lead_td = _lead(lead)
    df = _read_table(path)
    tcol = _column(df, ("date", "time", "valid_time" if time_kind == "valid" else "init_time", "vdate", "idate"),
                   "date", path)
    scol = _column(df, STATION_COLUMNS, "station id", path)
    ocol = observation or _column(df, ("observation", "obs"), "observation", path)
    if ocol not in df.columns:
        raise DataError(f"{path}: no observation column {ocol!r} (columns: {list(df.columns)})")
    latc, lonc = _column(df, ("latitude", "lat"), "latitude", path), _column(df, ("longitude", "lon"), "longitude",
                                                                             path)
    altc = next((c for c in ("altitude", "elevation", "alt") if c in df.columns), None)
    if members is None:
        members = _default_members(df, {ocol, tcol, scol, latc, lonc, *([altc] if altc else [])}, path)
    missing = [m for m in members if m not in df.columns]
    if missing:
        raise DataError(f"{path}: no member column(s) {missing} (columns: {list(df.columns)})")
    if len(members) < 2:
        raise DataError(f"{path}: {len(members)} member column(s) {list(members)}; an ensemble needs at least 2")
    values = {c: numeric_column(df, c, path) for c in [*members, ocol, latc, lonc, *([altc] if altc else [])]}
    empty_id = df[scol].isna().to_numpy() | (df[scol].astype(str).str.strip() == "").to_numpy()
    if empty_id.any():
        i = int(np.argmax(empty_id))
        raise DataError(f"{path}: column {scol!r}, {_row(path, i)}: no station id; every row needs one")
    df = pd.DataFrame({"_t": _parse_dates(df, tcol, path).values, "_s": df[scol].astype(str).str.strip().values,
                       **{c: v for c, v in values.items()}})
    dup = df.duplicated(["_t", "_s"])
    if dup.any():
        first = df[dup].iloc[0]
        raise DataError(f"{path}: station {first['_s']!r} has more than one row for {first['_t']}")
    t_index = pd.DatetimeIndex(sorted(df["_t"].unique())).as_unit("ns")
    sites = sorted(df["_s"].unique())
    # station metadata: the most frequent value per station (a few stations list slightly different positions)
    cols = [c for c in (latc, lonc, altc) if c]
    meta = (df.groupby(["_s", *cols], dropna=False).size().reset_index(name="_n")
            .sort_values(["_n", *cols], ascending=False, kind="stable").drop_duplicates("_s").set_index("_s")
            .loc[sites])
    ti, si = t_index.get_indexer(df["_t"]), pd.Index(sites).get_indexer(df["_s"])
    ens = np.full((len(t_index), len(members), len(sites)), np.nan, np.float64)
    ens[ti, :, si] = df[list(members)].to_numpy(np.float64)
    obs = np.full((len(t_index), len(sites)), np.nan, np.float64)
    obs[ti, si] = df[ocol].to_numpy(np.float64)
    valid = t_index if time_kind == "valid" else t_index + lead_td
    init = valid - lead_td
    coords = site_coords(sites, meta[latc].to_numpy(), meta[lonc].to_numpy(),
                         meta[altc].to_numpy() if altc else np.full(len(sites), np.nan))
    attrs = {**({"units": units} if units else {}), "long_name": variable}
    fc = xr.Dataset({variable: (("time", "prediction_timedelta", "member", "site"), ens[:, None], attrs)},
                    coords={"time": init.values,
                            "prediction_timedelta": [lead_td.to_timedelta64().astype("timedelta64[ns]")],
                            "member": list(members), **coords})
    fc.attrs = {"forecast_kind": "ensemble", "featureType": "timeSeries", "source_files": str(path)}
    truth = xr.Dataset({variable: (("time", "site"), obs, attrs)}, coords={"time": valid.values, **coords})
    return fc, truth


def site_coord_names(ds: xr.Dataset) -> list[str]:
    """The site coordinates of a site Dataset: :data:`SITE_COORDS`, then any other coordinate on (site,) alone
    (e.g. a station name)."""
    return [*SITE_COORDS, *(c for c in ds.coords if ds[c].dims == ("site",) and c not in ("site", *SITE_COORDS))]


def station_ids(ids: Sequence[object] | np.ndarray) -> np.ndarray:
    """Station ids as a fixed-width unicode array (``<U{longest}``), never ``object``: an object array that dask
    chunks has no known string width, and casting it to ``str`` lazily gives ``<U1``, ids cut to their first
    character."""
    values = [v.decode() if isinstance(v, bytes) else str(v) for v in np.asarray(ids, dtype=object).ravel()]
    return np.array(values, dtype=f"<U{max([1, *map(len, values)])}")


def unicode_strings(ds: xr.Dataset) -> xr.Dataset:
    """``ds`` with every string variable and coordinate as fixed-width unicode (:func:`station_ids`): netCDF
    char arrays and variable-length strings both read back as ``object`` arrays."""
    from pipelines.atomic import string_variables

    fixed = {n: (ds[n].dims, station_ids(ds[n].values).reshape(ds[n].shape), ds[n].attrs)
             for n in string_variables(ds)}
    return ds.assign({n: v for n, v in fixed.items() if n in ds.data_vars}).assign_coords(
        {n: v for n, v in fixed.items() if n in ds.coords})


def site_coords(ids: Sequence[str], lat: np.ndarray, lon: np.ndarray, alt: np.ndarray) -> dict[str, tuple]:
    """Coordinates on ``site`` with CF attributes (station_id, latitude, longitude, altitude)."""
    return {"site": ("site", np.arange(len(ids))),
            "station_id": ("site", station_ids(ids), {"cf_role": "timeseries_id",
                                                                  "long_name": "station identifier"}),
            "latitude": ("site", np.asarray(lat, np.float64), {"units": "degrees_north",
                                                              "standard_name": "latitude"}),
            "longitude": ("site", np.asarray(lon, np.float64), {"units": "degrees_east",
                                                               "standard_name": "longitude"}),
            "altitude": ("site", np.asarray(alt, np.float64), {"units": "m", "standard_name": "height",
                                                              "positive": "up", "axis": "Z"})}


def write_sites(forecast: xr.Dataset, truth: xr.Dataset, out: str | Path, overwrite: bool = False) -> Path:
    """Write a site forecast and its observations (valid times) as a CF DSG ``timeSeries`` netCDF (atomically)."""
    from smoeweather.io import write_netcdf

    valid = forecast["time"] + forecast["prediction_timedelta"]
    names = site_coord_names(forecast)
    ds = xr.Dataset(coords={c: forecast[c] for c in ("site", *names)})
    for c in names:
        if ds[c].dtype.kind in "OUS":
            ds = ds.assign_coords({c: ("site", station_ids(ds[c].values), ds[c].attrs)})
    for n in forecast.data_vars:
        ds[n] = forecast[n].transpose("site", "time", "prediction_timedelta", "member")
        ds[n].attrs = {**forecast[n].attrs, "coordinates": " ".join(names)}
        obs = truth[n].reindex(time=np.unique(valid.values)).sel(time=valid).drop_vars("time")
        ds[n + OBS_SUFFIX] = obs.transpose("site", "time", "prediction_timedelta").assign_attrs(
            {**truth[n].attrs, "long_name": f"observed {n} at time + prediction_timedelta",
             "coordinates": " ".join(names)})
    ds["member"] = ds["member"].astype(str)
    ds.attrs = {"Conventions": "CF-1.8", "featureType": "timeSeries", "forecast_kind": "ensemble",
                "title": "ensemble forecasts and observations at sites (smoeweather.data.sites)"}
    return write_netcdf(ds, out, overwrite=overwrite)


def open_sites(path: str | Path, **table_options: object) -> tuple[xr.Dataset, xr.Dataset]:
    """(forecast, observations on valid times) of a CF DSG site file (:func:`write_sites`) or a table
    (:func:`read_site_table`, with ``table_options``)."""
    path = Path(path)
    if path.suffix.lower() in TABLE_SUFFIXES:
        return read_site_table(path, **table_options)  # type: ignore[arg-type]
    if not path.is_file():
        raise FileNotFoundError(f"site file {path} does not exist")
    with xr.open_dataset(path) as raw:
        ds = raw.load()
    if str(ds.attrs.get("featureType", "")).lower() != "timeseries" or "site" not in ds.dims:
        raise ValueError(f"{path}: not a site file (expected featureType = 'timeSeries' and a 'site' dimension)")
    names = [n for n in ds.data_vars if "member" in ds[n].dims]
    if not names:
        raise ValueError(f"{path}: no variable with a 'member' dimension (an ensemble forecast was expected)")
    fc = xr.Dataset({n: ds[n].transpose("time", "prediction_timedelta", "member", "site") for n in names})
    for n in names:
        fc[n].attrs = {k: v for k, v in ds[n].attrs.items() if k != "coordinates"}
    fc.attrs = {"forecast_kind": "ensemble", "featureType": "timeSeries", "source_files": str(path)}
    valid = (ds["time"] + ds["prediction_timedelta"]).values  # (time, lead)
    vt = pd.DatetimeIndex(np.unique(valid))
    # every variable on (site,) alone is a site coordinate (CF: station_id, latitude, ..., e.g. station_name)
    cnames = [*SITE_COORDS, *(v for v in ds.variables if ds[v].dims == ("site",) and v not in ("site", *SITE_COORDS))]
    lacking = [c for c in SITE_COORDS if c not in ds.variables]
    if lacking:
        raise ValueError(f"{path}: no site coordinate(s) {lacking} on the 'site' dimension (a site file carries "
                         f"{list(SITE_COORDS)})")
    ds = ds.set_coords(cnames)
    for c in cnames:  # strings as fixed-width unicode (netCDF strings are read as objects)
        if ds[c].dtype.kind in "OUS":
            ds = ds.assign_coords({c: ("site", station_ids(ds[c].values), ds[c].attrs)})
    fc = fc.assign_coords({c: ds[c] for c in cnames})
    coords = {c: ds[c] for c in ("site", *cnames)}
    truth = xr.Dataset(coords={"time": vt, **coords})
    for n in names:
        key = n + OBS_SUFFIX
        if key not in ds:
            raise ValueError(f"{path}: no observation variable {key!r} for the forecast {n!r}")
        obs = np.full((len(vt), ds.sizes["site"]), np.nan)
        vals = ds[key].transpose("time", "prediction_timedelta", "site").values
        idx = vt.get_indexer(valid.ravel())
        flat = vals.reshape(-1, ds.sizes["site"])
        rows, cols = np.nonzero(np.isfinite(flat))  # a valid time seen at several (init, lead): any value it has
        obs[idx[rows], cols] = flat[rows, cols]
        truth[n] = (("time", "site"), obs, {k: v for k, v in ds[key].attrs.items()
                                            if k not in ("coordinates", "long_name")})
    return fc, truth
