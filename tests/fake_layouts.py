"""Writers of tiny files in the EXACT published layouts (names, dims, attrs, GRIB keys).

Used by tests/pipelines/test_readers.py; each writer returns what it wrote (raw, before canonicalisation) so
tests can check that values survive reading. Values are random but reproducible (``seed``).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd
import xarray as xr

EPS32 = float(np.finfo(np.float32).eps)  # 1.19e-7: one float32 rounding errs by at most EPS32/2 (relative)
EPS64 = float(np.finfo(np.float64).eps)


def f32_atol(*arrays: object, ops: int = 4) -> float:
    """Absolute tolerance of ``ops`` float32 roundings (e.g. normalise (x − mean)/std, store as float32,
    denormalise x·std + mean) of quantities up to the largest |value| among ``arrays`` (fields and the
    mean they are normalised with)."""
    return ops * EPS32 * max(float(np.nanmax(np.abs(np.asarray(a, dtype=np.float64)))) for a in arrays)


def sum_rtol(n: int, eps: float = EPS64) -> float:
    """Relative tolerance of a sum/mean/std of ``n`` values computed in a precision with machine epsilon
    ``eps`` (the n·eps worst-case bound of recursive summation)."""
    return n * eps

# mean geopotential (m² s⁻²) per pressure level (hPa), loosely ERA5: every writer puts a level's field near its own
# height, so the files pass the plausibility check of `smoe data prepare` (54,000 at 850 hPa would be refused)
Z_MEAN = {250: 101_500.0, 500: 54_000.0, 700: 29_600.0, 850: 14_300.0, 925: 7_500.0, 1000: 1_100.0}


def z_mean(levels: Sequence[float]) -> np.ndarray:
    """Mean geopotential (m² s⁻²) at each of ``levels`` (hPa): ``Z_MEAN``, else the standard atmosphere's."""
    from pipelines.plausibility import G, standard_height

    return np.array([Z_MEAN.get(float(lv), round(G * standard_height(float(lv)), -2)) for lv in levels])


WB_LAT = -90 + 5.625 / 2 + 5.625 * np.arange(32)  # ascending, as WeatherBench v1/v2
WB_LON = 5.625 * np.arange(64)

# ------------------------------------------------------------------------------- WeatherBench v1


def _wb_file(
    name: str, data: np.ndarray, times: pd.DatetimeIndex, attrs: dict, level: int | Sequence[int] | None
) -> xr.Dataset:
    dims = ("time", "lat", "lon") if data.ndim == 3 else ("time", "level", "lat", "lon")
    coords: dict = {"time": times, "lat": WB_LAT, "lon": WB_LON}
    if level is not None:
        coords["level"] = level if np.ndim(level) == 0 else ("level", np.asarray(level, "int32"))
    ds = xr.Dataset({name: (dims, data.astype("float32"), attrs)}, coords=coords)
    ds.attrs = {
        "Conventions": "CF-1.6",
        "history": "2019-11-10 20:33:23 GMT by grib_to_netcdf-2.14.0: /opt/ecmwf/mars-client",
    }
    return ds


def write_weatherbench(
    root: Path, years: Sequence[int] = (1979, 1980), grid: str = "5.625deg", steps: int = 3, seed: int = 0
) -> dict[str, list[xr.Dataset]]:
    """WeatherBench v1 folders under ``root``: geopotential_500, temperature_850, temperature (3
    levels), 2m_temperature, toa_incident_solar_radiation, total_precipitation and constants.
    Hourly times (``steps`` per year, from 1 January 00Z). Returns {folder: [dataset per year]}."""
    rng = np.random.default_rng(seed)
    root = Path(root)
    spec = {  # folder: (file stem, var, attrs, level, mean, std)
        "geopotential_500": (
            "geopotential_500hPa",
            "z",
            {"units": "m**2 s**-2", "long_name": "Geopotential", "standard_name": "geopotential"},
            500,
            54000,
            3000,
        ),
        "temperature": (
            "temperature",
            "t",
            {"units": "K", "long_name": "Temperature", "standard_name": "air_temperature"},
            [500, 850, 1000],
            260,
            20,
        ),
        "temperature_850": (
            "temperature_850hPa",
            "t",
            {"units": "K", "long_name": "Temperature", "standard_name": "air_temperature"},
            850,
            275,
            15,
        ),
        "2m_temperature": (
            "2m_temperature",
            "t2m",
            {"units": "K", "long_name": "2 metre temperature"},
            None,
            280,
            20,
        ),
        "toa_incident_solar_radiation": (
            "toa_incident_solar_radiation",
            "tisr",
            {"units": "J m**-2", "long_name": "TOA incident solar radiation"},
            None,
            1e6,
            5e5,
        ),
        "total_precipitation": (
            "total_precipitation",
            "tp",
            {"units": "m", "long_name": "Total precipitation"},
            None,
            1e-4,
            1e-4,
        ),
    }
    written: dict[str, list[xr.Dataset]] = {}
    for folder, (stem, var, attrs, level, mean, std) in spec.items():
        (root / folder).mkdir(parents=True, exist_ok=True)
        written[folder] = []
        for i, year in enumerate(years):
            times = pd.date_range(f"{year}-01-01", periods=steps, freq="h")
            shape = (steps, 32, 64) if np.ndim(level) == 0 else (steps, len(level), 32, 64)
            data = mean + std * rng.standard_normal(shape)
            if var == "tp":
                data = np.abs(data)
            if folder == "temperature_850":  # the published single-level file is a slice of the 3-D one
                data = written["temperature"][i]["t"].sel(level=850).values
            ds = _wb_file(var, data, times, attrs, level)
            ds.to_netcdf(
                root / folder / f"{stem}_{year}_{grid}.nc",
                encoding={"time": {"units": "hours since 1900-01-01", "dtype": "int32"}},
            )
            written[folder].append(ds)
    (root / "constants").mkdir(parents=True, exist_ok=True)
    lat2d, lon2d = np.meshgrid(WB_LAT, WB_LON, indexing="ij")
    const = xr.Dataset(
        {
            "lsm": (
                ("lat", "lon"),
                rng.uniform(0, 1, (32, 64)).round().astype("float32"),
                {"units": "(0 - 1)", "long_name": "Land-sea mask", "standard_name": "land_binary_mask"},
            ),
            "orography": (
                ("lat", "lon"),
                rng.uniform(0, 3e4, (32, 64)).astype("float32"),
                {"units": "m**2 s**-2", "long_name": "Geopotential", "standard_name": "geopotential"},
            ),
            "slt": (
                ("lat", "lon"),
                rng.integers(0, 7, (32, 64)).astype("float32"),
                {"units": "~", "long_name": "Soil type"},
            ),
            "lat2d": (("lat", "lon"), lat2d),
            "lon2d": (("lat", "lon"), lon2d),
        },
        coords={"lat": WB_LAT, "lon": WB_LON},
    )
    const.to_netcdf(root / "constants" / f"constants_{grid}.nc")
    written["constants"] = [const]
    return written


# ----------------------------------------------------------------------------------------- WB2 zarr


def wb2_dataset(
    times: int = 8, levels: Sequence[int] = (500, 850), seed: int = 0, latitude_descending: bool = False
) -> xr.Dataset:
    """A WeatherBench 2 dataset (64×32 equiangular, 6-hourly) as stored in its zarr files."""
    rng = np.random.default_rng(seed)
    lat = WB_LAT[::-1] if latitude_descending else WB_LAT
    shape3, shape2 = (times, len(levels), 32, 64), (times, 32, 64)
    return xr.Dataset(
        {
            "geopotential": (
                ("time", "level", "latitude", "longitude"),
                (z_mean(levels)[None, :, None, None] + 3000 * rng.standard_normal(shape3)).astype("float32"),
                {
                    "long_name": "Geopotential",
                    "short_name": "z",
                    "standard_name": "geopotential",
                    "units": "m**2 s**-2",
                },
            ),
            "temperature": (
                ("time", "level", "latitude", "longitude"),
                (270 + 15 * rng.standard_normal(shape3)).astype("float32"),
                {
                    "long_name": "Temperature",
                    "short_name": "t",
                    "standard_name": "air_temperature",
                    "units": "K",
                },
            ),
            "2m_temperature": (
                ("time", "latitude", "longitude"),
                (280 + 15 * rng.standard_normal(shape2)).astype("float32"),
                {"long_name": "2 metre temperature", "short_name": "t2m", "units": "K"},
            ),
            "land_sea_mask": (
                ("latitude", "longitude"),
                rng.uniform(0, 1, (32, 64)).astype("float32"),
                {"long_name": "Land-sea mask", "short_name": "lsm", "units": "(0 - 1)"},
            ),
        },
        coords={
            "time": pd.date_range("2020-01-01", periods=times, freq="6h"),
            "level": ("level", np.asarray(levels, "int64")),
            "latitude": lat,
            "longitude": WB_LON,
        },
    )


def write_wb2_zarr(
    url: str,
    times: int = 8,
    levels: Sequence[int] = (500, 850),
    seed: int = 0,
    latitude_descending: bool = False,
    storage_options: dict | None = None,
) -> xr.Dataset:
    """Write ``wb2_dataset`` as WB2 does: zarr v2 with consolidated metadata, chunked by time."""
    ds = wb2_dataset(times, levels, seed, latitude_descending).chunk({"time": 4})
    if storage_options is None and url.startswith("file://"):
        storage_options = {"auto_mkdir": True}  # fsspec's local filesystem does not create folders
    ds.to_zarr(url, mode="w", consolidated=True, zarr_format=2, storage_options=storage_options)
    return ds.compute()


# --------------------------------------------------------------------------------------------- GRIB

GRIB_10DEG = {
    "Ni": 36,
    "Nj": 19,
    "latitudeOfFirstGridPointInDegrees": 90.0,
    "latitudeOfLastGridPointInDegrees": -90.0,
    "longitudeOfFirstGridPointInDegrees": 0.0,
    "longitudeOfLastGridPointInDegrees": 350.0,
    "iDirectionIncrementInDegrees": 10.0,
    "jDirectionIncrementInDegrees": 10.0,
}


def write_grib(path: Path, messages: list[dict], grid: dict = GRIB_10DEG) -> None:
    """Write GRIB1 messages with eccodes: each dict holds ECMWF keys + "values" (Nj×Ni, north first).

    Pressure-level messages start from the ``regular_ll_pl_grib1`` sample, surface ones (``level``
    absent) from ``regular_ll_sfc_grib1``; ensemble messages use ECMWF local definition 1.
    """
    import eccodes

    with open(path, "wb") as f:
        for msg in messages:
            keys = dict(msg)
            values = np.asarray(keys.pop("values"), dtype="float64")
            sample = "regular_ll_pl_grib1" if "level" in keys else "regular_ll_sfc_grib1"
            h = eccodes.codes_grib_new_from_samples(sample)
            eccodes.codes_set(h, "localDefinitionNumber", 1)
            for k, v in {**grid, **keys}.items():
                eccodes.codes_set(h, k, v)
            eccodes.codes_set(h, "bitsPerValue", 24)
            eccodes.codes_set_values(h, values.ravel())
            eccodes.codes_write(h, f)
            eccodes.codes_release(h)


def write_ens10(
    folder: Path,
    years: Sequence[int] = (2016, 2017),
    month_day: str = "0102",
    members: int = 10,
    levels: Sequence[int] = (500, 850),
    seed: int = 0,
) -> dict[str, Path]:
    """ENS-10 files for one hindcast day-of-year: ``output.pl.2018MMDD`` (z, t on ``levels``) and
    ``output.sfc.2018MMDD`` (t2m), stream enfh, type pf, ``number`` 1…members, steps 0/24/48 h,
    one init (00Z) per hindcast year. 10° grid here (0.5° in the real data)."""
    rng = np.random.default_rng(seed)
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    common = {"stream": "enfh", "type": "pf", "numberOfForecastsInEnsemble": members, "dataTime": 0}
    pl, sfc = [], []
    for year in years:
        for number in range(1, members + 1):
            for step in (0, 24, 48):
                base = {
                    **common,
                    "dataDate": int(f"{year}{month_day}"),
                    "number": number,
                    "stepRange": str(step),
                }
                for level in levels:
                    pl.append(
                        {
                            **base,
                            "shortName": "z",
                            "typeOfLevel": "isobaricInhPa",
                            "level": level,
                            "values": z_mean([level])[0] + 1000 * rng.standard_normal((19, 36)),
                        }
                    )
                    pl.append(
                        {
                            **base,
                            "shortName": "t",
                            "typeOfLevel": "isobaricInhPa",
                            "level": level,
                            "values": 250 + 10 * rng.standard_normal((19, 36)),
                        }
                    )
                sfc.append({**base, "shortName": "2t", "values": 280 + 10 * rng.standard_normal((19, 36))})
    paths = {"pl": folder / f"output.pl.2018{month_day}", "sfc": folder / f"output.sfc.2018{month_day}"}
    write_grib(paths["pl"], pl)
    write_grib(paths["sfc"], sfc)
    return paths


def era5_truth_10deg(
    times: pd.DatetimeIndex, levels: Sequence[int] = (500, 850), seed: int = 1
) -> xr.Dataset:
    """A canonical ERA5-like truth on the 10° grid of ``write_ens10`` (latitude ascending)."""
    rng = np.random.default_rng(seed)
    lat, lon = np.arange(-90.0, 91.0, 10.0), np.arange(0.0, 360.0, 10.0)
    n = len(times)
    return xr.Dataset(
        {
            "geopotential": (
                ("time", "level", "latitude", "longitude"),
                z_mean(levels)[None, :, None, None] + 1000 * rng.standard_normal((n, len(levels), 19, 36)),
                {"units": "m**2 s**-2"},
            ),
            "temperature": (
                ("time", "level", "latitude", "longitude"),
                250 + 10 * rng.standard_normal((n, len(levels), 19, 36)),
                {"units": "K"},
            ),
            "2m_temperature": (
                ("time", "latitude", "longitude"),
                280 + 10 * rng.standard_normal((n, 19, 36)),
                {"units": "K"},
            ),
        },
        coords={"time": times, "level": np.asarray(levels, "int64"), "latitude": lat, "longitude": lon},
    )


# ---------------------------------------------------------------------------------------- CDS netCDF


def write_cds_netcdf(path: Path, seed: int = 0) -> xr.Dataset:
    """A CDS (2024+) ERA5 pressure-level netCDF: dims (valid_time, pressure_level, latitude,
    longitude), latitude descending 90…-90, ``number`` and ``expver`` coords, 10° grid."""
    rng = np.random.default_rng(seed)
    times = pd.date_range("2021-06-01", periods=3, freq="6h")
    lat, lon = np.arange(90.0, -91.0, -10.0), np.arange(0.0, 360.0, 10.0)
    ds = xr.Dataset(
        {
            "z": (
                ("valid_time", "pressure_level", "latitude", "longitude"),
                (z_mean([850, 500])[None, :, None, None] + 1000 * rng.standard_normal((3, 2, 19, 36))).astype(
                    "float32"),
                {
                    "GRIB_paramId": 129,
                    "GRIB_shortName": "z",
                    "units": "m**2 s**-2",
                    "long_name": "Geopotential",
                    "standard_name": "geopotential",
                },
            ),
            "t": (
                ("valid_time", "pressure_level", "latitude", "longitude"),
                (250 + 10 * rng.standard_normal((3, 2, 19, 36))).astype("float32"),
                {
                    "GRIB_paramId": 130,
                    "GRIB_shortName": "t",
                    "units": "K",
                    "long_name": "Temperature",
                    "standard_name": "air_temperature",
                },
            ),
        },
        coords={
            "number": 0,
            "valid_time": times,
            "pressure_level": ("pressure_level", [850.0, 500.0], {"units": "hPa", "long_name": "pressure"}),
            "latitude": ("latitude", lat, {"units": "degrees_north"}),
            "longitude": ("longitude", lon, {"units": "degrees_east"}),
            "expver": ("valid_time", np.array(["0001"] * 3)),
        },
        attrs={
            "GRIB_centre": "ecmf",
            "Conventions": "CF-1.7",
            "institution": "European Centre for Medium-Range Weather Forecasts",
            "history": "2024-09-10 GRIB to CDM+CF via cfgrib-0.9.14.0/ecCodes-2.36.0",
        },
    )
    ds.to_netcdf(path, encoding={"valid_time": {"units": "seconds since 1970-01-01", "dtype": "int64"}})
    return ds


# ----------------------------------------------------------------------------------------- CMIP6 CMOR


def write_cmip6(
    folder: Path, variable: str = "zg", calendar: str = "noleap", days: int = 6, files: int = 2, seed: int = 0
) -> tuple[list[Path], xr.Dataset]:
    """CMOR-style daily CMIP6 files split in time (``files`` pieces): ``zg`` (plev in Pa, m) or
    ``tas`` (with scalar ``height``), on a 15° grid with lon 7.5…352.5 (so regridding to the WB
    grid needs the periodic wrap). Returns (paths, full dataset as written)."""
    rng = np.random.default_rng(seed)
    lat, lon = np.arange(-82.5, 83.0, 15.0), np.arange(7.5, 360.0, 15.0)
    import cftime

    times = [
        cftime.datetime(1850, 1, 1, 12, calendar=calendar) + pd.Timedelta(days=d).to_pytimedelta()
        for d in range(days)
    ]
    bnds = np.array(
        [
            [t - pd.Timedelta(hours=12).to_pytimedelta(), t + pd.Timedelta(hours=12).to_pytimedelta()]
            for t in times
        ]
    )
    coords = {
        "time": (
            "time",
            times,
            {"axis": "T", "standard_name": "time", "long_name": "time", "bounds": "time_bnds"},
        ),
        "lat": (
            "lat",
            lat,
            {
                "axis": "Y",
                "units": "degrees_north",
                "standard_name": "latitude",
                "long_name": "Latitude",
                "bounds": "lat_bnds",
            },
        ),
        "lon": (
            "lon",
            lon,
            {
                "axis": "X",
                "units": "degrees_east",
                "standard_name": "longitude",
                "long_name": "Longitude",
                "bounds": "lon_bnds",
            },
        ),
    }
    if variable == "zg":
        coords["plev"] = (
            "plev",
            np.array([85000.0, 50000.0]),
            {
                "axis": "Z",
                "units": "Pa",
                "positive": "down",
                "standard_name": "air_pressure",
                "long_name": "pressure",
            },
        )
        data = (
            np.array([1500.0, 5600.0])[None, :, None, None]
            + 50 * rng.standard_normal((days, 2, lat.size, lon.size))
        ).astype("float32")
        dims = ("time", "plev", "lat", "lon")
        attrs = {
            "standard_name": "geopotential_height",
            "long_name": "Geopotential Height",
            "units": "m",
            "cell_methods": "time: mean",
            "cell_measures": "area: areacella",
        }
        table = "day"
    else:
        coords["height"] = ((), 2.0, {"units": "m", "axis": "Z", "positive": "up", "standard_name": "height"})
        data = (280 + 10 * rng.standard_normal((days, lat.size, lon.size))).astype("float32")
        dims = ("time", "lat", "lon")
        attrs = {
            "standard_name": "air_temperature",
            "long_name": "Near-Surface Air Temperature",
            "units": "K",
            "cell_methods": "area: time: mean",
            "coordinates": "height",
        }
        table = "day"
    full = xr.Dataset(
        {
            variable: (dims, data, attrs),
            "time_bnds": (("time", "bnds"), bnds),
            "lat_bnds": (("lat", "bnds"), np.stack([lat - 7.5, lat + 7.5], 1)),
            "lon_bnds": (("lon", "bnds"), np.stack([lon - 7.5, lon + 7.5], 1)),
        },
        coords=coords,
        attrs={
            "Conventions": "CF-1.7 CMIP-6.2",
            "activity_id": "CMIP",
            "experiment_id": "historical",
            "frequency": "day",
            "grid_label": "gn",
            "institution_id": "MPI-M",
            "mip_era": "CMIP6",
            "source_id": "MPI-ESM1-2-HR",
            "table_id": table,
            "variable_id": variable,
            "variant_label": "r1i1p1f1",
            "nominal_resolution": "1500 km",
        },
    )
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for piece in np.array_split(np.arange(days), files):
        part = full.isel(time=piece)
        t0, t1 = part["time"].values[0], part["time"].values[-1]
        path = folder / (
            f"{variable}_{table}_MPI-ESM1-2-HR_historical_r1i1p1f1_gn_"
            f"{t0.strftime('%Y%m%d')}-{t1.strftime('%Y%m%d')}.nc"
        )
        enc = {
            "time": {"units": "days since 1850-01-01", "calendar": calendar, "dtype": "float64"},
            "time_bnds": {"units": "days since 1850-01-01", "calendar": calendar, "dtype": "float64"},
            variable: {"_FillValue": np.float32(1e20)},
        }
        part.to_netcdf(path, encoding=enc, unlimited_dims=["time"])
        paths.append(path)
    return paths, full
