"""The embedded default world: a small synthetic global atmosphere on the WeatherBench 5.625° grid.

Fast (seconds for a few years), no downloads, deterministic for a seed, and written in the same canonical
zarr layout as prepared ERA5, so every downstream command runs on it out of the box. NOT ERA5: a toy
"weather" with location-dependent dynamics that a Spatial Mixture-of-Experts can exploit.

Dynamics (6-hourly steps, vectorised numpy, two prognostic anomaly fields on the 32×64 grid):

- ``psi`` (dimensionless, equivalent-barotropic streamfunction/height anomaly): Rossby waves advected in
  longitude, exactly in zonal-wavenumber space, with phase speed c = U(φ) − β/K² (westerly jets at ±45°,
  weak tropical easterlies, retrograde long waves), scale-selective hyperdiffusion, land-dependent grid-point
  diffusion, relaxation towards a seasonal land-sea equilibrium pattern (faster over land), and red-noise
  forcing strongest over the mid-latitude oceans (storm tracks).
- ``theta`` (K, lower-tropospheric temperature anomaly): advected by a weaker zonal flow, driven by the
  meridional wind of ``psi`` across the mean temperature gradient (warm advection ahead of troughs), and
  relaxed to a seasonal equilibrium in which continents warm in summer and cool in winter — 2 days over
  land, 10 days over sea.

Output fields (canonical names and units): ``geopotential`` (m² s⁻²) and ``temperature`` (K) at pressure
levels 250/500/700/850 hPa are a zonal-mean seasonal climate plus level-dependent multiples of ``psi`` and
``theta`` (hypsometric coupling), with a small diurnal cycle of low-level temperature over land; constants
``land_sea_mask`` (real GLOBE land fraction) and ``geopotential_at_surface`` (smooth synthetic mountains at
Earth-like places). Z500 mean ≈ 54,000 m² s⁻² (std ≈ 2,700), T850 mean ≈ 275 K.
"""

from __future__ import annotations

from collections.abc import Sequence
from importlib import resources
from pathlib import Path

import dask.array as da
import numpy as np
import pandas as pd
import xarray as xr
from scipy import ndimage

from pipelines.canonical import LATITUDE_ATTRS, LEVEL_ATTRS, LONGITUDE_ATTRS, TIME_ATTRS, VARIABLES
from pipelines.errors import DataError

A_EARTH = 6.371e6  # m
OMEGA = 7.292e-5  # s-1
G = 9.80665  # m s-2
R_DRY = 287.0  # J kg-1 K-1
STEP_H = 6
DT = STEP_H * 3600.0  # s
SPIN_UP_DAYS = 90

# Per level: zonal/global mean geopotential (m2 s-2), equator-pole contrast, wave amplitude per unit psi;
# mean temperature (K), contrast, response to theta. Loosely ERA5-like climatology.
LEVELS: dict[int, dict[str, float]] = {
    250: {
        "z_mean": 101_500.0,
        "z_grad": 14_000.0,
        "z_psi": 1_600.0,
        "t_mean": 222.0,
        "t_grad": 16.0,
        "t_theta": -0.2,
    },
    500: {
        "z_mean": 54_000.0,
        "z_grad": 7_200.0,
        "z_psi": 1_000.0,
        "t_mean": 253.0,
        "t_grad": 34.0,
        "t_theta": 0.5,
    },
    700: {
        "z_mean": 29_600.0,
        "z_grad": 3_800.0,
        "z_psi": 700.0,
        "t_mean": 268.0,
        "t_grad": 38.0,
        "t_theta": 0.8,
    },
    850: {
        "z_mean": 14_100.0,
        "z_grad": 1_700.0,
        "z_psi": 550.0,
        "t_mean": 275.0,
        "t_grad": 40.0,
        "t_theta": 1.0,
    },
}
DEFAULT_LEVELS = (250, 500, 700, 850)

# Smooth synthetic mountains (lat °N, lon °E, height m, half-width °): Tibet, Rockies, Andes, Greenland,
# East Africa; Antarctica is added as a polar cap.
MOUNTAINS = [
    (33, 88, 4_500, 9),
    (42, 250, 2_000, 8),
    (-20, 292, 3_000, 5),
    (72, 318, 2_500, 8),
    (5, 38, 1_500, 6),
]


def grid(resolution_deg: float = 5.625) -> tuple[np.ndarray, np.ndarray]:
    """Latitude (ascending, °N) and longitude ([0, 360), °E) cell centres of the equiangular grid."""
    lat = -90 + resolution_deg / 2 + resolution_deg * np.arange(round(180 / resolution_deg))
    lon = resolution_deg * np.arange(round(360 / resolution_deg))
    return lat, lon


def land_fraction() -> np.ndarray:
    """Real land fraction (1 = land) on the 32×64 grid, shipped in ``pipelines/resources``."""
    path = resources.files("pipelines") / "resources" / "lsm_5.625deg.nc"
    with resources.as_file(path) as p, xr.open_dataset(p) as ds:
        lsm = ds["lsm"].sortby("lat").transpose("lat", "lon").values.astype(np.float32)
    return lsm


def orography(lat: np.ndarray, lon: np.ndarray, land: np.ndarray) -> np.ndarray:
    """Synthetic surface height (m, dims lat × lon): Gaussian mountains on land, Antarctic plateau."""
    la, lo = np.meshgrid(lat, lon, indexing="ij")
    h = 2_800.0 * np.exp(-(((la + 90) / 14) ** 2))
    for lat0, lon0, height, width in MOUNTAINS:
        dlon = (lo - lon0 + 180) % 360 - 180
        h += height * np.exp(-((la - lat0) ** 2 + (dlon * np.cos(np.deg2rad(lat0))) ** 2) / width**2)
    return (h * np.clip(land * 1.5, 0, 1)).astype(np.float32)


def _season(times: pd.DatetimeIndex) -> np.ndarray:
    """+1 in mid-January, −1 in mid-July (dims: time)."""
    doy = times.day_of_year.values + times.hour.values / 24
    return np.cos(2 * np.pi * (doy - 15) / 365.25)


def _laplacian(x: np.ndarray) -> np.ndarray:
    """Grid-point Laplacian in index units, periodic in longitude, zero-flux at the poles."""
    up = np.concatenate([x[1:], x[-1:]], axis=0)
    down = np.concatenate([x[:1], x[:-1]], axis=0)
    return up + down + np.roll(x, 1, axis=1) + np.roll(x, -1, axis=1) - 4 * x


def _simulate(
    times: pd.DatetimeIndex, lat: np.ndarray, land: np.ndarray, seed: int
) -> tuple[np.ndarray, ...]:
    """Integrate psi (dimensionless) and theta (K); returns two float32 arrays (time, lat, lon)."""
    rng = np.random.default_rng(seed)
    n_lat, n_lon = land.shape
    phi = np.deg2rad(lat)[:, None]
    cos = np.cos(phi)
    k = np.arange(n_lon // 2 + 1)[None, :]
    kx = k / (A_EARTH * cos)  # zonal wavenumber, m-1 (lat × k)

    # Zonal flow (m s-1): westerly jets at ±45°, weak easterlies in the tropics.
    u = 22 * np.exp(-(((np.abs(lat) - 45) / 14) ** 2)) - 4 * np.exp(-((lat / 12) ** 2)) + 3
    beta = 2 * OMEGA * cos / A_EARTH
    ell = np.pi / 4.0e6  # meridional wavenumber of the waves, m-1
    c_psi = u[:, None] - beta / (kx**2 + ell**2)  # Rossby phase speed, m s-1
    hyper = np.exp(-DT / 86_400 * (kx * 2.0e6 / (2 * np.pi)) ** 4)  # waves < 2000 km damped in ~1 day
    shift_psi = np.exp(-1j * k * c_psi * DT / (A_EARTH * cos)) * hyper
    shift_theta = np.exp(-1j * k * 0.6 * u[:, None] * DT / (A_EARTH * cos)) * hyper

    # Location-dependent coefficients: land responds faster (relaxation, diffusion), oceans carry storms.
    storm = np.exp(-(((np.abs(lat) - 45) / 18) ** 2))[:, None]
    relax_psi = DT / 86_400 / np.where(land > 0.5, 4.0, 12.0)
    relax_theta = DT / 86_400 / np.where(land > 0.5, 2.0, 10.0)
    kappa = 0.04 + 0.10 * land
    sigma_psi = 0.16 * (0.25 + storm) * (1.0 - 0.6 * land)
    sigma_theta = 0.35 * (0.3 + storm)
    land_anom = land - land.mean(axis=1, keepdims=True)
    hemi = np.sign(lat)[:, None]
    gradient = 1.2 * np.sin(2 * np.abs(phi)) * hemi  # theta tendency per unit meridional wind of psi
    red = np.exp(-DT / (2 * 86_400))

    spin = pd.date_range(end=times[0] - pd.Timedelta(hours=STEP_H), periods=SPIN_UP_DAYS * 4, freq="6h")
    all_times = spin.append(times)
    season = _season(all_times)
    psi = np.zeros((n_lat, n_lon))
    theta = np.zeros((n_lat, n_lon))
    noise_psi = np.zeros((n_lat, n_lon))
    noise_theta = np.zeros((n_lat, n_lon))
    out_psi = np.empty((len(times), n_lat, n_lon), np.float32)
    out_theta = np.empty((len(times), n_lat, n_lon), np.float32)
    for i, s in enumerate(season):
        winter = hemi * s  # +1 in the local winter
        fp = np.fft.rfft(psi, axis=1)
        v = np.fft.irfft(1j * k * fp, n=n_lon, axis=1) / np.maximum(cos, 0.2)  # ∝ meridional wind
        psi = np.fft.irfft(fp * shift_psi, n=n_lon, axis=1)
        theta = np.fft.irfft(np.fft.rfft(theta, axis=1) * shift_theta, n=n_lon, axis=1)
        psi_eq = -0.9 * land_anom * storm * winter
        theta_eq = -12.0 * land * np.sqrt(np.abs(np.sin(phi))) * winter
        white = rng.standard_normal((2, n_lat, n_lon))
        white = ndimage.gaussian_filter(white, sigma=(0, 1.2, 1.5), mode=("nearest", "nearest", "wrap"))
        noise_psi = red * noise_psi + np.sqrt(1 - red**2) * white[0] * 3.0
        noise_theta = red * noise_theta + np.sqrt(1 - red**2) * white[1] * 3.0
        psi = psi + kappa * _laplacian(psi) - relax_psi * (psi - psi_eq) + sigma_psi * noise_psi
        theta = (
            theta
            + kappa * _laplacian(theta)
            - relax_theta * (theta - theta_eq)
            - 0.25 * gradient * v
            + sigma_theta * noise_theta
        )
        j = i - len(spin)
        if j >= 0:
            out_psi[j] = psi
            out_theta[j] = theta
    return out_psi, out_theta


def simulate_world(
    years: tuple[int, int] = (2000, 2003),
    seed: int = 0,
    levels: Sequence[int] = DEFAULT_LEVELS,
    time_chunk: int = 4,
    n_steps: int | None = None,
) -> xr.Dataset:
    """The default world as a lazy canonical Dataset (6-hourly, years inclusive; ``n_steps``: only the
    first n time steps, for quick tests).

    Dims ``time, level, latitude, longitude`` (latitude ascending, longitude [0, 360), level in hPa);
    ``geopotential`` (m² s⁻²), ``temperature`` (K), ``land_sea_mask`` (1), ``geopotential_at_surface``
    (m² s⁻²). The two prognostic anomaly fields live in memory (≈ 16 MB per year); the per-level fields are
    derived chunk by chunk with dask.
    """
    y0, y1 = int(years[0]), int(years[1])
    if y1 < y0:
        raise DataError(f"world years {y0}..{y1}: the end year must not precede the start year")
    unknown = sorted(set(levels) - set(LEVELS))
    if unknown:
        raise DataError(f"world levels {unknown} not available; choose from {sorted(LEVELS)} hPa")
    levels = sorted(int(p) for p in levels)
    lat, lon = grid()
    land = land_fraction()
    times = pd.date_range(f"{y0}-01-01", f"{y1}-12-31 18:00", freq=f"{STEP_H}h")[:n_steps]
    psi, theta = _simulate(times, lat, land, seed)

    dims = ("time", "latitude", "longitude")
    steps = time_chunk * max(1, 256 // time_chunk)  # dask tasks of ~8 MB per variable
    psi_x = xr.DataArray(da.from_array(psi, chunks=(steps, -1, -1)), dims=dims)
    theta_x = xr.DataArray(da.from_array(theta, chunks=(steps, -1, -1)), dims=dims)
    coef = {
        name: xr.DataArray([LEVELS[p][name] for p in levels], dims="level")
        for name in next(iter(LEVELS.values()))
    }
    phi = xr.DataArray(np.deg2rad(lat), dims="latitude")
    land_x = xr.DataArray(land, dims=("latitude", "longitude"))
    winter = np.sign(phi) * xr.DataArray(_season(times), dims="time")
    shape = np.cos(phi) ** 2 - 0.5  # zero mean over the equiangular grid
    thickness = R_DRY * np.log(1000.0 / xr.DataArray(levels, dims="level")) * 0.6  # m2 s-2 per K
    z = (
        coef["z_mean"]
        + coef["z_grad"] * shape
        - 0.17 * coef["z_grad"] * np.abs(np.sin(phi)) * winter
        + coef["z_psi"] * psi_x
        + thickness * theta_x
    )
    local_hour = xr.DataArray(times.hour.values, dims="time") + xr.DataArray(lon, dims="longitude") / 15
    diurnal = (
        np.cos(2 * np.pi * (local_hour - 15) / 24)
        * land_x
        * xr.DataArray([1.2 if p >= 700 else 0.0 for p in levels], dims="level")
    )
    t = (
        coef["t_mean"]
        + coef["t_grad"] * shape
        - 6.0 * np.abs(np.sin(phi)) * winter
        + coef["t_theta"] * theta_x
        + 1.2 * psi_x
        + diurnal
    )
    order = ("time", "level", "latitude", "longitude")
    ds = xr.Dataset(
        {
            "geopotential": z.transpose(*order)
            .astype(np.float32)
            .assign_attrs(units=VARIABLES["geopotential"][0], long_name="Geopotential"),
            "temperature": t.transpose(*order)
            .astype(np.float32)
            .assign_attrs(units=VARIABLES["temperature"][0], long_name="Temperature"),
            "land_sea_mask": land_x.astype(np.float32).assign_attrs(units="1", long_name="Land-sea mask"),
            "geopotential_at_surface": (G * xr.DataArray(orography(lat, lon, land), dims=land_x.dims))
            .astype(np.float32)
            .assign_attrs(
                units=VARIABLES["geopotential"][0], long_name="Geopotential at surface (orography)"
            ),
        },
        coords={
            "time": ("time", times.values, dict(TIME_ATTRS)),
            "level": ("level", np.asarray(levels, dtype=np.int64), dict(LEVEL_ATTRS)),
            "latitude": ("latitude", lat, dict(LATITUDE_ATTRS)),
            "longitude": ("longitude", lon, dict(LONGITUDE_ATTRS)),
        },
        attrs={
            "title": "smoeweather default world (synthetic, NOT ERA5)",
            "note": "toy global atmosphere with land-sea dependent dynamics; see pipelines/world.py",
            "world_seed": seed,
        },
    )
    return ds


def default_train_years(years: tuple[int, int]) -> tuple[int, int]:
    """World split: train on all but the last two years (at least the first year), then valid, test."""
    return int(years[0]), max(int(years[0]), int(years[1]) - 2)


def generate_world(
    out: str | Path,
    years: tuple[int, int] = (2000, 2003),
    seed: int = 0,
    levels: Sequence[int] = DEFAULT_LEVELS,
    train_years: tuple[int, int] | None = None,
    time_chunk: int = 4,
    overwrite: bool = False,
    progress: bool = True,
) -> Path:
    """Write the default world as a canonical analysis-ready zarr store (atomic, idempotent).

    Statistics are computed over ``train_years`` (default: all but the last two years). Re-running with the
    same arguments is a no-op; a store written with other arguments raises unless ``overwrite``.
    """
    from pipelines.prepare import write_store

    years = (int(years[0]), int(years[1]))
    train_years = tuple(train_years) if train_years is not None else default_train_years(years)
    args = {
        "kind": "world",
        "years": list(years),
        "seed": int(seed),
        "levels": sorted(int(p) for p in levels),
        "train_years": list(train_years),
        "time_chunk": int(time_chunk),
    }
    return write_store(
        lambda: simulate_world(years, seed, levels, time_chunk),
        out,
        args=args,
        train_years=train_years,
        time_chunk=time_chunk,
        overwrite=overwrite,
        scheduler="threads",
        progress=progress,
        source="smoeweather default world (pipelines/world.py)",
    )
