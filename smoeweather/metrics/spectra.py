"""Zonal energy spectra (pure xarray, dask-friendly), with WeatherBench 2's ``ZonalEnergySpectrum`` conventions.

Let f[l], l = 0 … L − 1, be a field's values along the circle of latitude φ (regular longitudes), of
circumference C(φ) = 2π R cos φ (R = 6 371 km, WB2's ``EARTH_RADIUS_M``). The DFT is
F[k] = (1/L) Σₗ f[l] e^(−2πikl/L), and the energy spectrum

    S[0] = C |F[0]|²,   S[k] = 2 C |F[k]|²  for k = 1 … L // 2

(positive and negative wavenumbers counted together; like WB2 the Nyquist term, for even L, is doubled too).
Units: those of the field squared times metres. A single zonal wave A cos(2π k₀ λ/360) gives S[k₀] = C A²/2 and
0 elsewhere; by Parseval Σₖ S[k] = C · mean(f²) (up to the Nyquist doubling). The wavenumber k is the number
of waves around the circle; its wavelength C(φ)/k (m) depends on the latitude.

A latitude band (WB2 plots 30–60°) is summarised by the cos φ-weighted mean over its latitudes AT EQUAL
WAVENUMBER k by default (the same structure, e.g. a wave-number-6 trough pattern, is averaged), or with
``recipe="wb2"`` as WB2 does: every latitude's spectrum, a function of the zonal frequency k / C(φ), is
interpolated linearly onto common frequencies (0 … the smallest of the latitudes' Nyquist frequencies, as many as
wavenumbers) and then averaged; those curves can be laid on WB2's. At a single latitude the two agree exactly.
The ``wavelength`` coordinate is that of the band's
mean circumference, for labelling. The mean over initialisations (and members, for ensembles: the spectrum of
each member, not of the smoothed ensemble mean) is taken after squaring.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import numpy as np
import xarray as xr

EARTH_RADIUS_M = 6_371_000.0
DEFAULT_BAND: tuple[float, float] = (30.0, 60.0)


def _spectrum_np(x: np.ndarray, circumference: np.ndarray) -> np.ndarray:
    """S[k] of x (..., latitude, longitude) with per-latitude circumference (latitude,), float64."""
    big_l = x.shape[-1]
    f = np.fft.rfft(np.asarray(x, np.float64), axis=-1) / big_l
    s = np.abs(f) ** 2 * circumference[:, None]
    s[..., 1:] *= 2.0
    return s


RECIPES = ("wavenumber", "wb2")
"""Latitude averages of a band: at equal zonal wavenumber (default), or WB2's: every latitude's spectrum
interpolated to common zonal frequencies first (``interpolate_spectral_frequencies``)."""


def _wb2_band_mean(spec: xr.DataArray, circ: np.ndarray, weights: xr.DataArray) -> xr.DataArray:
    """WB2's recipe: S(k, φ) at frequency k / C(φ) (1/m), interpolated linearly onto ``nk`` frequencies from 0
    to the smallest of the latitudes' largest (WB2's default grid), then the weighted latitude mean. The
    ``wavenumber`` dim indexes those frequencies; ``wavelength`` = 1 / frequency (m)."""
    nk = spec.sizes["wavenumber"]
    k = np.arange(nk, dtype=np.float64)
    freq = k[None, :] / circ[:, None]  # (latitude, wavenumber)
    common = np.linspace(0.0, freq[:, -1].min(), nk)

    def interp(s: np.ndarray) -> np.ndarray:  # (..., latitude, wavenumber)
        out = np.empty(s.shape, np.float64)
        for i in range(s.shape[-2]):
            out[..., i, :] = np.apply_along_axis(lambda row, f=freq[i]: np.interp(common, f, row), -1, s[..., i, :])
        return out

    on_common = xr.apply_ufunc(interp, spec, input_core_dims=[["latitude", "wavenumber"]],
                               output_core_dims=[["latitude", "wavenumber"]], dask="parallelized",
                               output_dtypes=[np.float64], dask_gufunc_kwargs={"allow_rechunk": True})
    out = on_common.weighted(weights).mean("latitude")
    with np.errstate(divide="ignore"):
        wavelength = np.where(common > 0, 1.0 / np.maximum(common, 1e-300), np.inf)
    out = out.assign_coords(wavelength=("wavenumber", wavelength))
    out["wavelength"].attrs = {"units": "m", "long_name": "zonal wavelength of the common frequency (WB2 recipe)"}
    return out


def zonal_energy_spectrum(field: xr.DataArray, band: tuple[float, float] | None = DEFAULT_BAND,
                          mean_dims: Sequence[Hashable] = (), recipe: str = "wavenumber") -> xr.DataArray:
    """Zonal energy spectrum of ``field`` (…, latitude, longitude), new dim ``wavenumber`` (0 … L // 2)
    replacing longitude (see the module docstring for the conventions).

    ``band`` (lat0, lat1), inclusive: keep these latitudes and average them (cos φ weights) into one
    spectrum; None keeps every latitude. ``mean_dims`` (e.g. ``time``, ``member``): averaged after squaring.
    ``recipe``: ``"wavenumber"`` averages the band's latitudes at equal wavenumber; ``"wb2"`` interpolates each
    latitude to common zonal frequencies first, as WB2 (:data:`RECIPES`).
    Longitudes must be regular and cover the circle; ValueError otherwise or when no latitude lies in the band.
    """
    lon = np.asarray(field["longitude"].values, np.float64)
    step = np.diff(lon)
    if lon.size < 2 or not np.allclose(step, step[0], rtol=1e-4) or not np.isclose(step[0] * lon.size, 360.0,
                                                                                     rtol=1e-4):
        raise ValueError(f"--spectra: zonal spectra need regular longitudes covering the circle; this field has "
                         f"{lon.size} longitude(s) ({lon.min() if lon.size else '-'}..{lon.max() if lon.size else '-'}"
                         "); score it without --spectra")
    if band is not None:
        lo, hi = sorted(band)
        lat = field["latitude"]
        field = field.isel(latitude=np.flatnonzero(((lat >= lo - 1e-9) & (lat <= hi + 1e-9)).values))
        if field.sizes["latitude"] == 0:
            raise ValueError(f"no grid latitude lies in the band {lo:g}..{hi:g} degrees")
    lat = np.asarray(field["latitude"].values, np.float64)
    circ = 2.0 * np.pi * EARTH_RADIUS_M * np.cos(np.deg2rad(lat))
    nk = lon.size // 2 + 1
    spec = xr.apply_ufunc(
        _spectrum_np, field, kwargs={"circumference": circ},
        input_core_dims=[["latitude", "longitude"]], output_core_dims=[["latitude", "wavenumber"]],
        dask="parallelized", output_dtypes=[np.float64],
        dask_gufunc_kwargs={"allow_rechunk": True, "output_sizes": {"wavenumber": nk}},
    )
    spec = spec.assign_coords(wavenumber=np.arange(nk))
    present = [d for d in mean_dims if d in spec.dims]
    if present:
        spec = spec.mean(present)
    if recipe not in RECIPES:
        raise ValueError(f"--spectra-recipe must be one of {RECIPES}, got {recipe!r}")
    if band is not None and recipe == "wb2":
        w = xr.DataArray(np.cos(np.deg2rad(lat)), dims="latitude", coords={"latitude": field["latitude"]})
        spec = _wb2_band_mean(spec, circ, w)
    elif band is not None:
        w = xr.DataArray(np.cos(np.deg2rad(lat)), dims="latitude", coords={"latitude": field["latitude"]})
        spec = spec.weighted(w).mean("latitude")
        mean_circ = float((circ * np.cos(np.deg2rad(lat))).sum() / np.cos(np.deg2rad(lat)).sum())
        k = np.arange(nk, dtype=np.float64)
        with np.errstate(divide="ignore"):
            spec = spec.assign_coords(wavelength=("wavenumber", np.where(k > 0, mean_circ / np.maximum(k, 1),
                                                                         np.inf)))
        spec["wavelength"].attrs = {"units": "m", "long_name": "zonal wavelength at the band's mean circumference"}
    spec.attrs = {"long_name": "zonal energy spectrum (WeatherBench 2 convention)",
                  "units": "(units of the field)**2 m"}
    return spec


__all__ = ["DEFAULT_BAND", "EARTH_RADIUS_M", "RECIPES", "zonal_energy_spectrum"]
