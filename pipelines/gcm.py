"""GCM worlds: a dry primitive-equation model world and ensemble reforecasts of it (raw-data source).

A spectral dynamical core (``dinosaur-torch``, the PyTorch rewrite of Dinosaur, the core behind NeuralGCM;
optional extra ``pip install -e .[gcm]``) integrates the dry primitive equations on sigma levels under
Held–Suarez (1994) forcing made location- and season-dependent. The defaults are the configuration the
published worlds were made with (JAX dinosaur; ``docs/guide/gcm-worlds.md`` lists it), set explicitly where
the two cores' defaults differ:

* surface (Rayleigh) drag ×2.5 over land, faster boundary-layer thermal relaxation over land;
* a seasonal cycle: the equilibrium temperature gets a hemispheric asymmetry −ε(t)·sin φ with
  ε(t) = −6 K·cos(2π(doy − 172)/365.25), and over land an anomaly
  land·(3 K·cos 2φ + 24 K·sin φ·cos(2π(doy − 172)/365.25))·clip((σ − 0.3)/0.7, 0, 1): continents warm in
  summer and cool in winter;
* six anisotropic Gaussian mountains at Earth-like places (:data:`MOUNTAINS`), spectrally filtered, on the
  real land fraction shipped in ``pipelines/resources`` (bilinear to the model grid, spectrally smoothed).

``generate_world`` writes one file per model year in the layout of ``gcm_world`` (``gcm_5.625deg_yearN.nc``:
``geopotential``, ``temperature`` on 250/500/700/850/925 hPa, ``surface_pressure``, constants
``land_sea_mask`` and ``geopotential_at_surface``; WeatherBench 5.625° grid, latitude ascending, 6-hourly).
``generate_ensemble`` writes the layout of ``gcm_ens`` (``gcm_ens_<year>.nc``: an imperfect forecast model,
the same core with almost no land coupling, 10 members perturbed by 0.05 K temperature noise, 24 h and 48 h
leads every 2 days, with the truth run daily). Fields are evaluated from the model's spherical harmonics
exactly at the WeatherBench nodes, and interpolated from sigma to pressure linearly in ln p (below the lowest
model level: a 6.5 K/km lapse rate).

Units as ERA5 (geopotential m² s⁻², temperature K, pressure Pa). Dates are model-calendar labels.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import xarray as xr

from pipelines.atomic import write_netcdf
from pipelines.errors import DataError
from pipelines.gcm_restart import EVERY_DAYS, Restart, restore_state, unstack
from pipelines.world import grid as wb_grid
from pipelines.world import land_fraction

WORLD_LEVELS = (250, 500, 700, 850, 925)
ENS_LEVELS = (500, 850)
SIGMA_BOUNDARIES = (0.0, 0.05, 0.12, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.88, 0.95, 1.0)
# The six mountains of the published worlds: (lat0 °N, lon0 °E, height m, σy °, σx ° along the great circle);
# each is h·exp(−(x/σx)² − (y/σy)²) with x = Δlon·cos(lat0), y = Δlat in degrees.
MOUNTAINS = ((33.0, 87.0, 4500.0, 6.0, 11.0),    # Tibetan plateau / Himalaya
             (43.0, 249.0, 2200.0, 13.0, 5.0),   # Rocky Mountains
             (-22.0, 292.0, 3000.0, 17.0, 4.5),  # Andes
             (73.0, 318.0, 2400.0, 7.0, 5.0),    # Greenland
             (-84.0, 60.0, 2800.0, 14.0, 14.0),  # Antarctica
             (5.0, 38.0, 1300.0, 7.0, 5.0))      # East African / Ethiopian highlands
# Spectral smoothing (exponential filter: attenuation, order) of the orography and of the land fraction on the
# model grid. Unsmoothed orography leaves power at the highest wavenumbers, where the step filter damps
# log surface pressure every step and so removes mass (−0.02 % a day at T21): the world's surface pressure and
# Z500 sink over the spin-up.
OROGRAPHY_FILTER = (16.0, 4.0)
LAND_FILTER = (16.0, 2.0)
# Initial state: isothermal (288 K) rest, sea-level pressure and the amplitude of the surface-pressure bump
INIT_SEA_LEVEL_PA = 1.011e5
INIT_PERTURBATION_PA = 5e3
# Time stepping of the published worlds: filter (tau in the core's time units, order, cutoff)
FILTER = dict(tau=0.0087504, order=1.5, cutoff=0.8)
WORLD_TRUNCATION, WORLD_DT_MINUTES = 31, 20.0
ENS_TRUNCATION, ENS_DT_MINUTES = 21, 30.0
G = 9.80665  # m s⁻², ERA5's geopotential = g · height
R_DRY = 287.0  # J kg⁻¹ K⁻¹
LAPSE = 0.0065  # K m⁻¹, below the lowest model level
NO_CORE = ("the GCM worlds need the spectral dynamical core dinosaur-torch: pip install -e .[gcm] "
           "(or pip install dinosaur-torch)")


@dataclass(frozen=True)
class WorldPhysics:
    """Forcing of the GCM world: Held–Suarez (1994) with land-sea, seasonal and mountain terms.

    Rates per day, temperatures in K; ``land_*`` terms are scaled by the land fraction. ``land_heat_factor``
    scales both land equilibrium-temperature anomalies (1 in the truth, 0.3 in the imperfect model).
    """

    kf_per_day: float = 1.0
    ka_per_day: float = 1 / 40
    ks_per_day: float = 1 / 4
    sigma_b: float = 0.7
    max_t: float = 315.0
    min_t: float = 200.0
    d_ty: float = 60.0
    d_thz: float = 10.0
    land_drag_factor: float = 2.5
    eps_season_k: float = 6.0
    land_season_amp_k: float = 24.0
    land_mean_amp_k: float = 3.0
    land_kt_frac: float = 1.0
    land_sigma_top: float = 0.3
    land_heat_factor: float = 1.0
    solstice_doy: float = 172.0
    year_days: float = 365.25

    def imperfect(self) -> WorldPhysics:
        """The forecast model of ``gcm_ens``: almost no land coupling (drag ×1, land heating ×0.3, no
        faster land boundary-layer relaxation)."""
        return dataclasses.replace(self, land_drag_factor=1.0, land_heat_factor=0.3, land_kt_frac=0.0)


def _core() -> Any:
    try:
        import dinosaur_torch  # noqa: F401
    except ImportError as err:
        raise ImportError(NO_CORE) from err
    from dinosaur_torch import (
        coordinate_systems,
        filtering,
        primitive_equations,
        scales,
        sigma_coordinates,
        spherical_harmonic,
        time_integration,
        units,
    )

    return dict(cs=coordinate_systems, pe=primitive_equations, scales=scales, sc=sigma_coordinates,
                sh=spherical_harmonic, ti=time_integration, units=units, filtering=filtering)


def mountains(lat: np.ndarray, lon: np.ndarray) -> np.ndarray:
    """Surface height (m, lat × lon) of the six anisotropic Gaussian mountains at ``lat``/``lon`` (degrees),
    before spectral filtering."""
    la, lo = np.meshgrid(lat, lon, indexing="ij")
    h = np.zeros_like(la, dtype=np.float64)
    for lat0, lon0, height, sig_y, sig_x in MOUNTAINS:
        x = ((lo - lon0 + 180) % 360 - 180) * np.cos(np.deg2rad(lat0))
        y = la - lat0
        h += height * np.exp(-((x / sig_x) ** 2) - (y / sig_y) ** 2)
    return h


def _to_nodes(field: np.ndarray, lat: np.ndarray, lon: np.ndarray, to_lat: np.ndarray,
              to_lon: np.ndarray) -> np.ndarray:
    """Bilinear interpolation of a (lat, lon) field to (to_lon, to_lat) nodes (dinosaur's nodal order),
    periodic in longitude."""
    from scipy.interpolate import RegularGridInterpolator

    lon_ext = np.concatenate([lon - 360, lon, lon + 360])
    f = RegularGridInterpolator((lat, lon_ext), np.concatenate([field] * 3, axis=1), bounds_error=False,
                                fill_value=None)
    lo, la = np.meshgrid(to_lon, to_lat, indexing="ij")
    return f(np.stack([la, lo], axis=-1))


class GCM:
    """One configured model world: grid, forcing, time stepper and output on pressure levels.

    ``truncation`` 21/31/42 (T21 = 64 × 32 Gaussian grid), ``dt_minutes`` the time step, ``physics`` the
    forcing. Works on float32 tensors on the CPU; states may carry a leading member axis.
    """

    def __init__(self, physics: WorldPhysics = WorldPhysics(), truncation: int = WORLD_TRUNCATION,
                 dt_minutes: float = WORLD_DT_MINUTES, filter_tau: float = FILTER["tau"],
                 filter_order: float = FILTER["order"], filter_cutoff: float = FILTER["cutoff"]) -> None:
        import torch

        m = self.m = _core()
        self.torch = torch
        self.physics = physics
        self.truncation = truncation
        if not (math.isfinite(dt_minutes) and dt_minutes > 0):
            raise ValueError(f"--dt-minutes {dt_minutes:g}: expected a positive time step in minutes (e.g. 20)")
        self.dt_minutes = dt_minutes
        u = m["scales"].units
        self.specs = specs = m["units"].SimUnits.from_si()
        self.dtype = torch.float32
        try:
            spec = getattr(m["sh"].GridSpec, f"T{truncation}")()
        except AttributeError as err:
            raise ValueError(f"--truncation {truncation}: expected one of 21, 31, 42, 85") from err
        grid = m["sh"].Grid(spec, dtype=self.dtype)
        vertical = m["sc"].SigmaLevels(m["sc"].SigmaCoordinates(np.array(SIGMA_BOUNDARIES)), dtype=self.dtype)
        self.coords = coords = m["cs"].CoordinateSystem(grid, vertical)
        self.grid = grid
        out_spec = m["sh"].GridSpec(spec.longitude_wavenumbers, spec.total_wavenumbers, 64, 32,
                                    latitude_spacing="equiangular")
        self.out_grid = m["sh"].Grid(out_spec, dtype=torch.float64)
        lat_wb, lon_wb = wb_grid()
        assert np.allclose(np.rad2deg(np.arcsin(out_spec.nodal_axes[1])), lat_wb, atol=1e-9)
        self.lat_wb, self.lon_wb = lat_wb, lon_wb

        # land fraction: the 5.625° mask (the files' constant), bilinear to the model nodes, spectrally smoothed
        # and clipped to [0, 1]; mountains: evaluated on the model nodes, spectrally filtered
        t = lambda a: torch.as_tensor(np.asarray(a, np.float64), dtype=self.dtype)  # noqa: E731
        smooth = lambda x, a, o: m["filtering"].exponential_filter(grid, a, o)(x)  # noqa: E731
        self.land_wb = land_fraction().astype(np.float64)
        lon_m, sin_lat_m = spec.nodal_axes
        lat_m = np.rad2deg(np.arcsin(sin_lat_m))
        lon_m = np.rad2deg(lon_m)
        land = _to_nodes(self.land_wb, lat_wb, lon_wb, lat_m, lon_m)
        land = np.clip(grid.to_nodal(smooth(grid.to_modal(t(land)), *LAND_FILTER)).double().numpy(), 0, 1)
        self.land_model = land
        height = mountains(lat_m, lon_m).T  # (lon, lat)
        modal_oro = smooth(grid.to_modal(t(specs.nondimensionalize(height * u.m))), *OROGRAPHY_FILTER)
        self.nodal_orography = grid.to_nodal(modal_oro)
        self.height_wb_smooth = self._to_wb(modal_oro.double()[None])[0] / specs.nondimensionalize(1.0 * u.m)
        self.t_ref = np.full(vertical.layers, 288.0)
        self.equation = m["pe"].PrimitiveEquations(self.t_ref, modal_oro, coords, specs)
        self.geopotential = m["pe"].Geopotential(vertical.coordinates, specs.g, specs.R, dtype=self.dtype)

        # forcing coefficients on (layer, lon, lat)
        sigma = vertical.coordinates.centers[:, None, None]
        lat_r = np.deg2rad(lat_m)[None, None, :]
        land3 = land[None]
        day = specs.nondimensionalize(1 * u.day)
        p = physics
        cut = np.maximum(0.0, (sigma - p.sigma_b) / (1 - p.sigma_b))
        kt = p.ka_per_day + (p.ks_per_day - p.ka_per_day) * cut * np.cos(lat_r) ** 4
        kt = kt + land3 * p.land_kt_frac * (p.ks_per_day - p.ka_per_day) * cut * (1 - np.cos(lat_r) ** 4)
        kv = p.kf_per_day * cut * (1 + (p.land_drag_factor - 1) * land3)
        self._kt, self._kv = t(kt / day), t(kv / day)
        self._sigma, self._sin, self._cos2 = t(sigma), t(np.sin(lat_r)), t(np.cos(lat_r) ** 2)
        self._land_profile = t(land3 * np.clip((sigma - p.land_sigma_top) / (1 - p.land_sigma_top), 0, 1))
        self._cos2lat = t(np.cos(2 * lat_r))
        self._p0 = specs.nondimensionalize(1e5 * u.pascal)
        self._day = day
        self.start_doy = 0.0  # day of year of sim_time 0 (set by the runners)

        self.dt = specs.nondimensionalize(dt_minutes * u.minute)
        forcing = m["ti"].ExplicitODE.from_functions(self._forcing)
        ode = m["ti"].compose_equations([self.equation, forcing])
        step = m["ti"].imex_rk_sil3(ode, self.dt)
        filt = m["ti"].exponential_step_filter(grid, self.dt, tau=filter_tau, order=filter_order,
                                               cutoff=filter_cutoff)
        self._step = m["ti"].step_with_filters(step, [filt])
        self.steps_per_6h = round(6 * 60 / dt_minutes)
        if not math.isclose(self.steps_per_6h * dt_minutes, 360):
            raise ValueError(f"dt {dt_minutes} min does not divide 6 h")

    # ---- physics -------------------------------------------------------------------------------------
    def _season(self, sim_time: Any) -> Any:
        doy = self.start_doy + sim_time / self._day
        return math.cos(2 * math.pi * (float(doy) - self.physics.solstice_doy) / self.physics.year_days)

    def _forcing(self, state: Any) -> Any:
        """Explicit tendencies: Newtonian cooling to T_eq(φ, σ, p_s, season, land), Rayleigh drag (land ×)."""
        torch, grid, p = self.torch, self.grid, self.physics
        aux = self.m["pe"].compute_diagnostic_state(state, self.coords)
        season = self._season(state.sim_time)
        ps = torch.exp(grid.to_nodal(state.log_surface_pressure))
        p_over_p0 = self._sigma * ps / self._p0
        eps = -p.eps_season_k * season
        teq = p_over_p0 ** self.specs.kappa * (
            p.max_t - p.d_ty * self._sin**2 - eps * self._sin - p.d_thz * torch.log(p_over_p0) * self._cos2)
        teq = teq + p.land_heat_factor * self._land_profile * (
            p.land_mean_amp_k * self._cos2lat + p.land_season_amp_k * self._sin * season)
        teq = torch.clamp(teq, min=p.min_t)
        temperature = aux.temperature_variation + torch.as_tensor(self.t_ref[:, None, None], dtype=self.dtype)
        dtemp = grid.to_modal(-self._kt * (temperature - teq))
        velocity = tuple(grid.to_modal(-self._kv * x / grid.cos_lat**2) for x in aux.cos_lat_u)
        return self.m["pe"].State(
            vorticity=grid.curl_cos_lat(velocity),
            divergence=grid.div_cos_lat(velocity),
            temperature_variation=dtemp,
            log_surface_pressure=torch.zeros_like(state.log_surface_pressure),
            tracers={},
            sim_time=None if state.sim_time is None else 0.0,
        )

    # ---- states --------------------------------------------------------------------------------------
    def rest_state(self, seed: int, sea_level_pa: float = INIT_SEA_LEVEL_PA,
                   perturbation_pa: float = INIT_PERTURBATION_PA) -> Any:
        """The published worlds' initial state (dinosaur's ``isothermal_rest_atmosphere(p0, p1,
        surface_height)``): 288 K at rest, surface pressure of the standard atmosphere over the (filtered)
        mountains, plus a ``perturbation_pa`` bump exp(−(Δλ² + Δφ²)/(2 (π/20)²))·sin(4 Δλ) at a seeded
        random place (λ0 in [π/2, 3π/2], φ0 in [−π/4, π/4]) that breaks the symmetry."""
        torch, grid, u = self.torch, self.grid, self.m["scales"].units
        rng = np.random.default_rng(seed)
        lat0 = rng.uniform(-np.pi / 4, np.pi / 4)
        lon0 = rng.uniform(np.pi / 2, 3 * np.pi / 2)
        altitude = self.specs.dimensionalize(self.nodal_orography.double().numpy(), u.m).m
        g, cp, t0, molar, r0 = 9.80665, 1004.68506, 288.16, 0.02896968, 8.314462618
        ps = sea_level_pa * (1 - g * altitude / (cp * t0)) ** (cp * molar / r0)
        lon, sin_lat = self.grid.spec.nodal_mesh
        lat = np.arcsin(sin_lat)
        std = np.pi / 20
        bump = np.exp(-((lon - lon0) ** 2) / (2 * std**2)) * np.exp(-((lat - lat0) ** 2) / (2 * std**2)) \
            * np.sin(4 * (lon - lon0))
        ps = ps + perturbation_pa * bump
        lsp = np.log(self.specs.nondimensionalize(ps * u.pascal))
        zeros = torch.zeros(self.coords.modal_shape, dtype=self.dtype)
        return self.m["pe"].State(vorticity=zeros, divergence=zeros.clone(), temperature_variation=zeros.clone(),
                                  log_surface_pressure=grid.to_modal(torch.as_tensor(lsp[None], dtype=self.dtype)),
                                  tracers={}, sim_time=0.0)

    def _total_wavenumber(self) -> np.ndarray:
        _, total = self.grid.modal_axes
        return np.broadcast_to(total[None, :], self.grid.modal_shape)

    def perturb(self, state: Any, members: int, seed: int, std_k: float = 0.05, min_wavenumber: int = 3) -> Any:
        """``members`` copies of ``state`` (leading member axis) with random temperature noise of
        ``std_k`` K per spectral coefficient (the core's normalisation) at total wavenumbers ≥ ``min_wavenumber``
        on every layer. That is the published ensembles' perturbation: about 0.32 K at a grid point at T21;
        scaling the noise to a 0.05 K grid-point deviation instead left the 24 h spread 6 times too small."""
        torch = self.torch
        gen = torch.Generator().manual_seed(int(seed))
        noise = torch.randn((members, *self.coords.modal_shape), generator=gen, dtype=self.dtype)
        modal = noise * std_k * torch.as_tensor(self._total_wavenumber() >= min_wavenumber, dtype=self.dtype)
        rep = lambda x: x.unsqueeze(0).repeat(members, *([1] * x.ndim))  # noqa: E731
        return self.m["pe"].State(vorticity=rep(state.vorticity), divergence=rep(state.divergence),
                                  temperature_variation=rep(state.temperature_variation) + modal,
                                  log_surface_pressure=rep(state.log_surface_pressure), tracers={},
                                  sim_time=state.sim_time)

    def advance(self, state: Any, steps: int) -> Any:
        with self.torch.no_grad():
            for _ in range(steps):
                state = self._step(state)
        if not bool(self.torch.isfinite(state.temperature_variation).all()):
            raise FloatingPointError("the GCM blew up (non-finite temperature); use a smaller --dt-minutes")
        return state

    # ---- output --------------------------------------------------------------------------------------
    def _to_wb(self, modal: Any) -> np.ndarray:
        """Modal (..., M, L) → nodal on the WeatherBench grid, (..., lat, lon) float64."""
        return self.out_grid.to_nodal(modal.double()).numpy().swapaxes(-1, -2)

    def fields(self, state: Any, levels: Sequence[int]) -> dict[str, np.ndarray]:
        """Geopotential (m² s⁻²) and temperature (K) on ``levels`` hPa and surface pressure (Pa) on the
        WeatherBench grid: arrays (..., level, lat, lon) and (..., lat, lon)."""
        u = self.m["scales"].units
        sp = self.specs
        temp_modal = state.temperature_variation.double()
        temperature = self._to_wb(temp_modal) + self.t_ref[:, None, None]  # (..., layer, lat, lon)
        ps = np.exp(self._to_wb(state.log_surface_pressure.double()))[..., 0, :, :]
        ps = sp.dimensionalize(ps, u.pascal).m
        # geopotential on layers: Φ_s + ∫ R T d ln σ (hydrostatic, the core's own weights)
        weights = self.geopotential.weights.double().numpy()
        phi_s = G * self.height_wb_smooth
        r_dry = sp.dimensionalize(sp.R, u.J / u.kg / u.K).m
        phi = phi_s + np.einsum("gh,...hij->...gij", weights / sp.R * r_dry, temperature)
        sigma = np.asarray(SIGMA_BOUNDARIES)
        centers = (sigma[1:] + sigma[:-1]) / 2
        z, t = _sigma_to_pressure(phi, temperature, ps, centers, levels, r_dry)
        return {"geopotential": z, "temperature": t, "surface_pressure": ps}


def _sigma_to_pressure(phi: np.ndarray, temp: np.ndarray, ps: np.ndarray, centers: np.ndarray,
                       levels: Sequence[int], r_dry: float) -> tuple[np.ndarray, np.ndarray]:
    """Linear-in-ln(p) interpolation from sigma layer centres to pressure ``levels`` (hPa); below the lowest
    layer, a 6.5 K/km lapse rate for T and the matching hypsometric Φ. Arrays (..., layer, lat, lon)."""
    lnp = np.log(centers[:, None, None] * ps[..., None, :, :])  # (..., layer, lat, lon), ascending in p
    out_z, out_t = [], []
    expo = r_dry * LAPSE / G
    for level in levels:
        target = np.log(level * 100.0)
        idx = np.clip((lnp < target).sum(axis=-3), 1, len(centers) - 1)  # upper index of the bracketing pair
        lo = np.take_along_axis(lnp, idx[..., None, :, :] - 1, axis=-3)[..., 0, :, :]
        hi = np.take_along_axis(lnp, idx[..., None, :, :], axis=-3)[..., 0, :, :]
        w = np.clip((target - lo) / (hi - lo), 0.0, 1.0)
        pick = lambda a, i: np.take_along_axis(a, i[..., None, :, :], axis=-3)[..., 0, :, :]  # noqa: E731
        t = (1 - w) * pick(temp, idx - 1) + w * pick(temp, idx)
        z = (1 - w) * pick(phi, idx - 1) + w * pick(phi, idx)
        below = target > lnp[..., -1, :, :]
        t_n, z_n = temp[..., -1, :, :], phi[..., -1, :, :]
        ratio = np.exp(target - lnp[..., -1, :, :])
        t = np.where(below, t_n * ratio**expo, t)
        z = np.where(below, z_n - G / LAPSE * t_n * (ratio**expo - 1), z)
        out_z.append(z)
        out_t.append(t)
    return np.stack(out_z, axis=-3), np.stack(out_t, axis=-3)


# ---------------------------------------------------------------------------------------------- runners
def _progress(total: int, desc: str, enabled: bool) -> Any:
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, unit="day", disable=not enabled)


def _constants(model: GCM) -> dict[str, Any]:
    dims = ("latitude", "longitude")
    return {
        "land_sea_mask": (dims, model.land_wb.astype("float32"), {"units": "1", "long_name": "Land-sea mask"}),
        # the filtered orography rings slightly below 0 m at sea; the files store it clipped at 0, as the
        # published ones (the model itself integrates the unclipped spectral orography)
        "geopotential_at_surface": (dims, np.maximum(G * model.height_wb_smooth, 0.0).astype("float32"),
                                    {"units": "m**2 s**-2", "long_name": "Geopotential at surface"}),
    }


def _coords(model: GCM) -> dict[str, Any]:
    return {"latitude": ("latitude", model.lat_wb, {"units": "degrees_north"}),
            "longitude": ("longitude", model.lon_wb, {"units": "degrees_east"})}


def _write(ds: xr.Dataset, path: Path, overwrite: bool) -> None:
    """Atomic netCDF write (float32, zlib): a failed run leaves no half-written file; without ``overwrite`` a
    file another run wrote meanwhile is refused at the write, never replaced."""
    write_netcdf(ds, path, overwrite=overwrite, encoding={v: {"zlib": True, "complevel": 4} for v in ds.data_vars})


def _check_out(out: Path, names: Sequence[str], overwrite: bool, written: Sequence[str] = ()) -> None:
    """Refuse to replace existing output files unless ``overwrite`` (``written``: this resumed run's own)."""
    out.mkdir(parents=True, exist_ok=True)
    existing = [n for n in names if (out / n).exists() and n not in written]
    if existing and not overwrite:
        raise FileExistsError(f"{out}: {existing} exist; pass --overwrite to replace them")


SPIN_UP_DAYS = 200.0  # the published worlds' discarded spin-up
# Wall seconds per simulated day of one run on one thread (this project's 2-core machine with one other job,
# load average 2-4: the spin-ups of the default gcm-ens and gcm-world runs). Used for the up-front estimate;
# the run then measures its own.
SECONDS_PER_DAY = {(21, 30.0): 3.1, (31, 20.0): 6.8}
ENSEMBLE_COST = 5.0  # a 10-member batch costs about this many single runs


def estimate_seconds_per_day(truncation: int, dt_minutes: float) -> float:
    """Documented wall seconds per simulated day (one thread) for a truncation and step; other settings are
    scaled from the nearest by steps per day."""
    if (truncation, float(dt_minutes)) in SECONDS_PER_DAY:
        return SECONDS_PER_DAY[(truncation, float(dt_minutes))]
    (t, dt), rate = min(SECONDS_PER_DAY.items(), key=lambda kv: abs(kv[0][0] - truncation))
    return rate * (dt / dt_minutes) * (truncation / t) ** 2


def is_preview(spin_up_days: float) -> bool:
    """Whether a run is an unspun preview (less spin-up than the published worlds)."""
    return spin_up_days < SPIN_UP_DAYS


def _attrs(model: GCM, kind: str, seed: int, spin_up_days: float, config: dict[str, Any]) -> dict[str, str]:
    from importlib.metadata import version

    attrs = {
        "title": f"Synthetic GCM world ({kind}), generated by smoe data gcm-{kind}",
        "note": "SYNTHETIC MODEL WORLD - NOT ERA5 and not observations. Dates are model-calendar labels.",
        "generator": f"dinosaur-torch {version('dinosaur-torch')}, pipelines/gcm.py",
        "model": f"dry spectral primitive equations, T{model.truncation}, {len(SIGMA_BOUNDARIES) - 1} sigma layers, "
                 f"imex_rk_sil3 dt={model.dt_minutes} min, exponential step filter (tau={FILTER['tau']}, "
                 f"order={FILTER['order']}, cutoff={FILTER['cutoff']})",
        "forcing": json.dumps(dataclasses.asdict(model.physics)),
        "orography": json.dumps({"mountains (lat0, lon0, height m, sigma_y deg, sigma_x deg)": MOUNTAINS,
                                 "spectral filter (attenuation, order)": OROGRAPHY_FILTER}),
        "spin_up": f"{spin_up_days} simulated days from isothermal rest (p0 {INIT_SEA_LEVEL_PA} Pa, "
                   f"p1 {INIT_PERTURBATION_PA} Pa), discarded",
        "spun_up": "no" if is_preview(spin_up_days) else "yes",
        "stream": f"seed={seed}",
        "config_json": json.dumps(config),
    }
    if is_preview(spin_up_days):
        attrs["title"] = "UNSPUN PREVIEW - " + attrs["title"]
        attrs["preview"] = (f"UNSPUN PREVIEW: {spin_up_days:g} days of spin-up instead of {SPIN_UP_DAYS:g}; the "
                            "circulation is still adjusting from rest, so its statistics are not the world's")
    return attrs


def _spin_up(model: GCM, seed: int, start: pd.Timestamp, days: float, progress: bool, what: str,
             log: Callable[[str], None] | None = None, restart: Restart | None = None,
             saved: dict[str, Any] | None = None) -> Any:
    """Spin ``model`` up for ``days`` from the seeded rest state (or from a ``saved`` restart in the spin-up)."""
    import time

    if saved is not None and saved["position"]["phase"] == "run":  # spun up before the interruption
        model.start_doy = float(start.day_of_year - 1)
        return restore_state(saved, model.m["pe"].State)
    model.start_doy = float(start.day_of_year - 1) - days  # sim_time 0 is `days` before `start`
    n = int(round(days))
    first = 0
    if saved is not None and saved["position"]["phase"] == "spin-up":
        state, first = restore_state(saved, model.m["pe"].State), int(saved["position"]["day"])
        if log is not None:
            log(f"{what}: resuming the spin-up at day {first} of {n} from {restart.path if restart else ''}")
    else:
        state = model.rest_state(seed)
    t0 = time.perf_counter()
    with _progress(n, f"{what}: spin-up", progress) as bar:
        bar.update(first)
        for i in range(first, n):
            state = model.advance(state, 4 * model.steps_per_6h)
            bar.update(1)
            if i == first and n - first > 1 and log is not None:
                rate = time.perf_counter() - t0
                log(f"{what}: spin-up measured at {rate:.1f} s per simulated day: about "
                    f"{rate * (n - first - 1) / 60:.0f} min more before the first output")
            if restart is not None and (i + 1) % EVERY_DAYS == 0 and i + 1 < n:
                restart.save({"phase": "spin-up", "day": i + 1}, state, {})
    model.start_doy = float(start.day_of_year - 1)
    state = dataclasses.replace(state, sim_time=0.0)
    return state


def generate_world(out: str | Path, years: int = 2, days_per_year: int = 365, seed: int = 0,
                   truncation: int = WORLD_TRUNCATION, dt_minutes: float = WORLD_DT_MINUTES,
                   spin_up_days: float = SPIN_UP_DAYS, start: str = "2001-01-01",
                   levels: Sequence[int] = WORLD_LEVELS, overwrite: bool = False, progress: bool = True,
                   log: Callable[[str], None] | None = None) -> list[Path]:
    """Simulate the GCM world and write ``out/gcm_5.625deg_yearN.nc`` (N = 1 … ``years``), 6-hourly.

    One continuous run (year N + 1 follows year N) after ``spin_up_days`` of spin-up. ``days_per_year``
    shortens each file (tests, previews). An interrupted run resumes from its restart file
    (:mod:`pipelines.gcm_restart`) when started again with the same settings. Returns the written paths.
    """
    out = Path(out)
    if years < 1 or days_per_year < 1:
        raise ValueError(f"--years {years} / --days {days_per_year}: expected positive numbers")
    names = [f"gcm_5.625deg_year{n}.nc" for n in range(1, years + 1)]
    config = dict(truncation=truncation, dt_minutes=dt_minutes, seed=seed, spin_up_days=spin_up_days,
                  years=years, days_per_year=days_per_year, levels=list(levels), start=start,
                  mountains=[list(x) for x in MOUNTAINS])
    restart = Restart(out / ".gcm_world.restart.npz", _restart_key(config, WorldPhysics()))
    saved = restart.load()
    written = list(saved["position"].get("written", [])) if saved else []
    _check_out(out, names, overwrite, written)
    model = GCM(WorldPhysics(), truncation=truncation, dt_minutes=dt_minutes)
    start_ts = pd.Timestamp(start)
    state = _spin_up(model, seed, start_ts, spin_up_days, progress, "gcm-world", log, restart, saved)
    first_year, first_step = 1, 0
    if saved is not None and saved["position"]["phase"] == "run":
        first_year, first_step = int(saved["position"]["year"]), int(saved["position"]["step"])
        if log is not None:
            log(f"gcm-world: resuming year {first_year} at day {first_step // 4} from {restart.path}")
    paths = [out / n for n in names[: first_year - 1]]
    t0 = start_ts + pd.Timedelta(days=days_per_year * (first_year - 1))
    for n, name in enumerate(names, 1):
        if n < first_year:
            continue
        times = pd.date_range(t0, periods=4 * days_per_year, freq="6h")
        resumed = saved is not None and n == first_year and first_step > 0
        z, t, ps = ([unstack(saved, k) for k in ("z", "t", "ps")] if resumed else ([], [], []))
        with _progress(days_per_year, f"gcm-world: year {n}/{years}", progress) as bar:
            bar.update(first_step // 4 if resumed else 0)
            for i in range(first_step if resumed else 0, len(times)):
                f = model.fields(state, levels)
                z.append(f["geopotential"]), t.append(f["temperature"]), ps.append(f["surface_pressure"])
                state = model.advance(state, model.steps_per_6h)
                if i % 4 == 3:
                    bar.update(1)
                    if (i + 1) % (4 * EVERY_DAYS) == 0 and i + 1 < len(times):
                        restart.save({"phase": "run", "year": n, "step": i + 1, "written": written}, state,
                                     {"z": z, "t": t, "ps": ps})
        dims = ("time", "level", "latitude", "longitude")
        ds = xr.Dataset(
            {"geopotential": (dims, np.stack(z).astype("float32"),
                              {"units": "m**2 s**-2", "long_name": "Geopotential"}),
             "temperature": (dims, np.stack(t).astype("float32"), {"units": "K", "long_name": "Temperature"}),
             "surface_pressure": (dims[:1] + dims[2:], np.stack(ps).astype("float32"),
                                  {"units": "Pa", "long_name": "Surface pressure"}),
             **_constants(model)},
            coords={"time": times, "level": ("level", np.asarray(levels, "int32"), {"units": "hPa"}), **_coords(model)},
            attrs=_attrs(model, "world", seed, spin_up_days, config),
        )
        _write(ds, out / name, overwrite)
        paths.append(out / name)
        written.append(name)
        t0 = times[-1] + pd.Timedelta(hours=6)
        if n < years:
            restart.save({"phase": "run", "year": n + 1, "step": 0, "written": written}, state, {})
    restart.remove()
    return paths


def generate_ensemble(out: str | Path, year: int = 2005, days: int = 300, seed: int = 2, members: int = 10,
                      every_days: int = 2, leads_h: Sequence[int] = (24, 48),
                      truncation: int = ENS_TRUNCATION, dt_minutes: float = ENS_DT_MINUTES,
                      spin_up_days: float = SPIN_UP_DAYS, levels: Sequence[int] = ENS_LEVELS,
                      overwrite: bool = False, progress: bool = True,
                      on_day: Callable[[int], None] | None = None, log: Callable[[str], None] | None = None) -> Path:
    """Ensemble reforecasts of the GCM world by its imperfect forecast model → ``out/gcm_ens_<year>.nc``.

    A truth run (``seed``) after ``spin_up_days``; every ``every_days`` days from 1 January of ``year``, a
    ``members``-member ensemble starts from the truth plus 0.05 K temperature noise (total wavenumber ≥ 3)
    and runs ``leads_h`` with the imperfect physics (:meth:`WorldPhysics.imperfect`). The truth is stored
    daily at 00 UTC (``valid_time``) for verification at init + lead. An interrupted run resumes from its
    restart file (:mod:`pipelines.gcm_restart`) when started again with the same settings.
    """
    out = Path(out)
    if days < max(leads_h) / 24 or members < 2 or every_days < 1:
        raise ValueError(f"--days {days}, --members {members}, --every-days {every_days}: need days ≥ the longest "
                         "lead, at least 2 members and a positive init spacing")
    if any(h % 24 for h in leads_h):
        raise ValueError(f"leads {list(leads_h)} h: expected whole days")
    name = f"gcm_ens_{year}.nc"
    _check_out(out, [name], overwrite)
    config = dict(truncation=truncation, dt_minutes=dt_minutes, seed=seed, members=members, every_days=every_days,
                  leads_h=list(leads_h), days=days, spin_up_days=spin_up_days, levels=list(levels))
    restart = Restart(out / f".{name}.restart.npz", _restart_key(config, WorldPhysics(), WorldPhysics().imperfect()))
    saved = restart.load()
    truth = GCM(WorldPhysics(), truncation=truncation, dt_minutes=dt_minutes)
    forecast = GCM(WorldPhysics().imperfect(), truncation=truncation, dt_minutes=dt_minutes)
    start = pd.Timestamp(f"{year}-01-01")
    state = _spin_up(truth, seed, start, spin_up_days, progress, "gcm-ens", log, restart, saved)
    forecast.start_doy = truth.start_doy
    steps_day = 4 * truth.steps_per_6h
    n_truth = days + max(leads_h) // 24  # days 0 … days − 1 + the longest lead (302 for 300 days, as gcm_ens)
    inits = list(range(0, days, every_days))
    tz, tt, fz, ft = [], [], [], []
    first = 0
    if saved is not None and saved["position"]["phase"] == "run":
        first = int(saved["position"]["day"])
        tz, tt, fz, ft = (unstack(saved, k) for k in ("tz", "tt", "fz", "ft"))
        if log is not None:
            log(f"gcm-ens {year}: resuming at day {first} of {n_truth} from {restart.path}")
    with _progress(n_truth, f"gcm-ens {year}", progress) as bar:
        bar.update(first)
        for d in range(first, n_truth):
            f = truth.fields(state, levels)
            tz.append(f["geopotential"]), tt.append(f["temperature"])
            if d in inits:
                ens = forecast.perturb(state, members, seed=seed * 100_003 + d)
                by_lead = []
                done = 0
                for lead in sorted(leads_h):
                    ens = forecast.advance(ens, (lead // 24 - done) * steps_day)
                    done = lead // 24
                    by_lead.append(forecast.fields(ens, levels))
                fz.append(np.stack([b["geopotential"] for b in by_lead]))
                ft.append(np.stack([b["temperature"] for b in by_lead]))
            state = truth.advance(state, steps_day)
            bar.update(1)
            if (d + 1) % EVERY_DAYS == 0 and d + 1 < n_truth:
                restart.save({"phase": "run", "day": d + 1}, state, {"tz": tz, "tt": tt, "fz": fz, "ft": ft})
            if on_day is not None:
                on_day(d)
    valid = pd.date_range(start, periods=n_truth, freq="D")
    fdims = ("time", "prediction_timedelta", "member", "level", "latitude", "longitude")
    tdims = ("valid_time", "level", "latitude", "longitude")
    ds = xr.Dataset(
        {"geopotential": (fdims, np.stack(fz).astype("float32"), {"units": "m**2 s**-2"}),
         "temperature": (fdims, np.stack(ft).astype("float32"), {"units": "K"}),
         "truth_geopotential": (tdims, np.stack(tz).astype("float32"), {"units": "m**2 s**-2"}),
         "truth_temperature": (tdims, np.stack(tt).astype("float32"), {"units": "K"}),
         **_constants(truth)},
        coords={"time": start + pd.to_timedelta(inits, unit="D"),
                "prediction_timedelta": pd.to_timedelta(sorted(leads_h), unit="h"),
                "member": np.arange(members), "level": ("level", np.asarray(levels, "int32"), {"units": "hPa"}),
                "valid_time": valid, **_coords(truth)},
        attrs={**_attrs(truth, "ens", seed, spin_up_days, config),
               "forecast_model": "same core, almost no land coupling: "
               + json.dumps(dataclasses.asdict(forecast.physics)),
               "perturbation": "0.05 K random temperature noise (total wavenumber >= 3), all layers",
               "lead_times": f"{', '.join(map(str, sorted(leads_h)))} h; truth daily at 00 UTC"},
    )
    _write(ds, out / name, overwrite)
    restart.remove()
    return out / name


def _restart_key(config: dict[str, Any], *physics: WorldPhysics) -> dict[str, Any]:
    """What a restart must match to be resumed: the run's settings, its physics and the core's version."""
    from importlib.metadata import version

    return {"config": config, "physics": [dataclasses.asdict(p) for p in physics],
            "core": f"dinosaur-torch {version('dinosaur-torch')}", "mountains": [list(x) for x in MOUNTAINS],
            "filters": [FILTER, list(OROGRAPHY_FILTER), list(LAND_FILTER)]}


def check_core() -> None:
    """DataError-free check that the optional core is importable (ImportError naming the extra)."""
    _core()


__all__ = ["GCM", "WorldPhysics", "generate_world", "generate_ensemble", "mountains", "DataError"]


def world_statistics(paths: Sequence[str | Path], days: int | None = None) -> dict[str, float]:
    """Statistics that characterise a GCM world file set, for comparing a generated world with another:
    Z500 and T850 mean and standard deviation (over time and the globe, latitude-weighted), and the
    latitude-weighted RMSE of persistence at 72 h / 120 h and of the period's mean state ("climatology":
    the time mean at each grid point over the same files). ``days`` keeps the first days only."""
    ds = xr.open_mfdataset([str(p) for p in paths], combine="by_coords") if len(paths) > 1 else \
        xr.open_dataset(paths[0])
    if days is not None:
        ds = ds.isel(time=slice(0, 4 * days))
    w = np.cos(np.deg2rad(ds["latitude"].values))[:, None] * np.ones(ds.sizes["longitude"])
    w = w / w.sum()
    out: dict[str, float] = {}
    for name, var, level in (("Z500", "geopotential", 500), ("T850", "temperature", 850)):
        x = ds[var].sel(level=level).values.astype(np.float64)  # (time, lat, lon)
        mean = float((x.mean(0) * w).sum())
        out[f"{name} mean"] = mean
        out[f"{name} std"] = float(np.sqrt((((x - mean) ** 2).mean(0) * w).sum()))
        for hours in (72, 120):
            k = hours // 6
            err2 = ((x[k:] - x[:-k]) ** 2 * w).sum((1, 2))
            out[f"{name} persistence {hours} h RMSE"] = float(np.sqrt(err2).mean())
        clim = ((x - x.mean(0)) ** 2 * w).sum((1, 2))
        out[f"{name} climatology RMSE"] = float(np.sqrt(clim).mean())
    out["days"] = ds.sizes["time"] / 4
    return out
