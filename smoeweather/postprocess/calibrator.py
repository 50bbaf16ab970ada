"""One calibrator interface over the post-processing methods, in memory:

    cal = fit(forecast, truth, {"method": "emos", "per_gridpoint": True})   # -> Calibrator
    pred = cal.apply(new_forecast)                                          # -> Predictive (family, μ, σ)
    pred.probabilities({"temperature": [273.15]}); pred.percentiles([10, 50, 90])
    cal.save("emos.nc"); load("emos.nc").apply(new_forecast)

Model files are data only (netCDF of float weights and plain attributes, opened with xarray, never unpickled):
the one format of :mod:`.model_file` (EMOS coefficients or DRN weights); :func:`load` tells them apart by their
``kind`` attribute. The out-of-core file drivers (``smoe postprocess fit/apply``: :mod:`.pipeline`, and
:func:`.pipeline.fit_drn_files`/:func:`.pipeline.apply_drn_files`) compute the same numbers on stores too large to hold.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import xarray as xr

from smoeweather.postprocess.distributions import Distribution, family
from smoeweather.postprocess.forms import percentile_dataset, probability_dataset


@dataclass(frozen=True)
class Predictive:
    """A predictive distribution forecast: ``family`` (:data:`.distributions.DISTRIBUTIONS`) with location
    ``mu`` and scale ``sigma`` (Datasets, one variable per field, in the field's units)."""

    family: str
    mu: xr.Dataset
    sigma: xr.Dataset

    def distribution(self, name: str) -> Distribution:
        """The :class:`~.distributions.Distribution` of field ``name`` (numpy arrays of its dims)."""
        return family(self.family, self.mu[name].values, self.sigma[name].transpose(*self.mu[name].dims).values)

    def probabilities(self, thresholds: Mapping[str, Sequence[float]], below: bool = False) -> dict[str, xr.Dataset]:
        """{field: P(Y > t) (``below``: P(Y ≤ t)) on a ``threshold`` dim} for the fields of ``thresholds``."""
        return {n: probability_dataset(self.mu[[n]], self.sigma[[n]], self.family, np.asarray(t, np.float64), below)
                for n, t in thresholds.items()}

    def percentiles(self, percentiles: Sequence[float]) -> xr.Dataset:
        """Percentiles (0–100) of every field on a ``percentile`` dim."""
        return percentile_dataset(self.mu, self.sigma, self.family, np.asarray(percentiles, np.float64))


class Calibrator(Protocol):
    """A fitted post-processing model: ``apply`` gives the predictive distribution of a raw ensemble."""

    method: str

    def apply(self, forecast: xr.Dataset) -> Predictive:
        """The predictive distribution of the raw ensemble ``forecast`` (dims of the training ensemble)."""
        ...

    def save(self, path: str | Path, overwrite: bool = False) -> Path:
        """Write the data-only model file."""
        ...


@dataclass
class EMOSCalibrator:
    """EMOS coefficients (:func:`.emos.fit_emos` form: global, per grid point or site, member weights, rolling
    dates) with their model-file attributes."""

    params: xr.Dataset
    attrs: dict[str, Any] = field(default_factory=dict)
    training: xr.Dataset | None = None  # the training ensemble's coordinates, for save
    method: str = "emos"

    def apply(self, forecast: xr.Dataset) -> Predictive:
        from smoeweather.postprocess.emos import apply_emos
        from smoeweather.postprocess.pipeline import _align_sites

        params = _align_sites(self.params, self.attrs, forecast) if "station_id" in self.attrs else self.params
        mu, sigma = apply_emos(params, forecast)
        return Predictive(str(self.attrs.get("distribution", "normal")), mu, sigma)

    def save(self, path: str | Path, overwrite: bool = False) -> Path:
        from smoeweather.postprocess.model_file import write_model

        if self.training is None:
            raise ValueError("EMOSCalibrator.save: a loaded model is already a file; save the one fit() returned")
        keep = {k: v for k, v in self.attrs.items() if isinstance(v, str | int | float)}
        return write_model(self.params, self.training, path, {"distribution": "normal", **keep}, overwrite=overwrite)


@dataclass
class DRNCalibrator:
    """Distributional regression network weights (:func:`.drn.fit_drn`, the model-file layout)."""

    model: xr.Dataset
    attrs: dict[str, Any] = field(default_factory=dict)
    training: xr.Dataset | None = None
    method: str = "drn"

    def apply(self, forecast: xr.Dataset) -> Predictive:
        from smoeweather.postprocess.drn import apply_drn, site_positions

        forecast = forecast.load()
        idx, _ = site_positions(self.attrs, forecast) if "station_id" in self.attrs else (None, [])
        mu, sigma = apply_drn(self.model, forecast, idx)
        return Predictive(str(self.attrs.get("distribution", self.model.attrs.get("distribution", "normal"))),
                          mu, sigma)

    def save(self, path: str | Path, overwrite: bool = False) -> Path:
        from smoeweather.postprocess.model_file import write_drn_model

        if self.training is None:
            raise ValueError("DRNCalibrator.save: a loaded model is already a file; save the one fit() returned")
        keep = {k: v for k, v in self.attrs.items() if isinstance(v, str | int | float)}
        return Path(write_drn_model(self.model, self.training, path, keep, overwrite=overwrite))


@dataclass
class NetworkCalibrator:
    """A post-processing network checkpoint of ``smoe train`` (U-Net, SMoE-U-Net; trained there, so ``save`` is
    the checkpoint itself); loaded without Lightning or pickle (:func:`smoeweather.models.loader.load_network`)."""

    checkpoint: Path
    batch_size: int = 8
    method: str = "network"

    def apply(self, forecast: xr.Dataset) -> Predictive:
        from smoeweather.postprocess.neural import apply_checkpoint

        mu, sigma, _ = apply_checkpoint(self.checkpoint, forecast, batch_size=self.batch_size)
        return Predictive("normal", mu.load(), sigma.load())

    def save(self, path: str | Path, overwrite: bool = False) -> Path:
        import shutil

        from smoeweather.io import atomic_path

        with atomic_path(Path(path), overwrite=overwrite) as tmp:
            shutil.copyfile(self.checkpoint, tmp)
        return Path(path)


def fit(forecast: xr.Dataset, truth: xr.Dataset, options: Mapping[str, Any] | None = None) -> Calibrator:
    """Fit ``options["method"]`` (``emos``, default, or ``drn``) on the ensemble ``forecast`` against ``truth`` at
    its valid times (same dims without ``member``), in memory. EMOS options: ``per_gridpoint``, ``iterations``;
    DRN options: the fields of :class:`.drn.DRNSettings`. ValueError naming an unknown method or option."""
    opts = dict(options or {})
    method = opts.pop("method", "emos")
    if method == "emos":
        from smoeweather.postprocess.emos import fit_emos

        unknown = set(opts) - {"per_gridpoint", "iterations"}
        if unknown:
            raise ValueError(f"fit(method='emos'): unknown option(s) {sorted(unknown)}; "
                             "expected per_gridpoint, iterations")
        params = fit_emos(forecast, truth, per_gridpoint=bool(opts.get("per_gridpoint", False)),
                          iterations=opts.get("iterations"))
        return EMOSCalibrator(params, {**params.attrs, "distribution": "normal", "predictors": "mean"}, forecast)
    if method == "drn":
        from smoeweather.postprocess.drn import DRNSettings, fit_drn

        settings = DRNSettings.of(opts)  # ConfigError naming 'drn.<option>'
        model = fit_drn(forecast, truth, settings)
        return DRNCalibrator(model, {"distribution": settings.distribution}, forecast)
    if method == "network":
        raise ValueError("fit: networks are trained with `smoe train` (configs/postprocess, configs/ens10); "
                         "load(CKPT) gives their calibrator")
    raise ValueError(f"fit: method {method!r} is not one of ['emos', 'drn'] (networks: `smoe train`)")


def load(path: str | Path) -> Calibrator:
    """The calibrator of a model file of ``smoe postprocess fit`` (EMOS or DRN, by its ``kind`` attribute) or of
    a network checkpoint (``*.ckpt``) of ``smoe train`` or its export folder (``smoe export``)."""
    from smoeweather.models.export_folder import is_export
    from smoeweather.postprocess.model_file import open_model_file, read_drn_model, read_model

    if Path(path).suffix == ".ckpt" or is_export(path):
        return NetworkCalibrator(Path(path))

    with open_model_file(Path(path), "model", "model") as ds:
        kind = str(ds.attrs.get("kind", ""))
    if "drn" in kind.lower():
        model, attrs = read_drn_model(path)
        return DRNCalibrator(model, attrs)
    params, attrs = read_model(path)
    return EMOSCalibrator(params, attrs)


__all__ = ["Calibrator", "DRNCalibrator", "EMOSCalibrator", "NetworkCalibrator", "Predictive", "fit", "load"]
