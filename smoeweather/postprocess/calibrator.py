"""One calibrator interface over the post-processing methods, in memory and on files:

    cal = fit(forecast, truth, {"method": "emos", "per_gridpoint": True})   # -> Calibrator
    pred = cal.apply(new_forecast)                                          # -> Predictive (family, μ, σ)
    pred.probabilities({"temperature": [273.15]}); pred.percentiles([10, 50, 90])
    cal.save("emos.nc"); load("emos.nc").apply(new_forecast)

A :class:`Calibrator` is built from its typed option block (:mod:`.options`: :class:`~.options.EMOSSettings`,
:class:`~.options.DRNSettings`, :class:`~.options.NetworkSettings`) and has ``fit`` (on :class:`.pipeline.Training`
data), ``apply`` (the :class:`.forms.Predictive` of a raw ensemble, from which every output form is computed),
``save`` and ``load``: :class:`EMOSCalibrator` (global, per grid point, per site, rolling; fitted out of core on
dask, :mod:`.chunked`, by the Newton solver of :mod:`.newton`), :class:`DRNCalibrator` (:mod:`.drn`) and
:class:`NetworkCalibrator` (a network checkpoint of ``smoe train``). ``smoe postprocess fit/apply`` build one
from the command line and run :func:`fit_files` / :func:`apply_files`, which open the inputs, check them and
write the outputs the one way every method shares (:mod:`.pipeline`).

Model files are data only (netCDF of float weights and plain attributes, opened with xarray, never unpickled):
the one format of :mod:`.model_file` (EMOS coefficients or DRN weights); :func:`load` tells them apart by their
``kind`` attribute.
"""

from __future__ import annotations

import contextlib
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, ClassVar, Protocol

import xarray as xr

from smoeweather.data.sites import station_ids
from smoeweather.io import atomic_path
from smoeweather.postprocess import chunked, validate
from smoeweather.postprocess.forms import Outputs, Predictive
from smoeweather.postprocess.options import FIT_METHODS, SETTINGS, DRNSettings, EMOSSettings, NetworkSettings, Settings
from smoeweather.postprocess.pipeline import (
    LOCAL,
    Run,
    Training,
    check_member_count,
    from_model_units,
    open_gridded,
    open_to_apply,
    open_training,
    write_products,
)
from smoeweather.units import units_of


class Calibrator(Protocol):
    """A post-processing model: ``fit`` on training data, ``apply`` to a raw ensemble (its predictive
    distribution), ``save``/``load`` its data-only model file; ``open_forecast`` opens and checks the files
    an apply reads; ``description``: one line on the last fit (what ``smoe postprocess fit`` prints)."""

    method: ClassVar[str]
    scheduled: ClassVar[bool]  # whether its stores are written on the --scheduler cluster (else: no cluster)
    settings: Settings
    description: str

    def training_options(self) -> dict[str, Any]:
        """What :func:`.pipeline.open_training` must read for this fit (distribution, extra variables, maps)."""
        ...

    def fit(self, data: Training, run: Run = LOCAL) -> Calibrator:
        """Fit on ``data``; ``self``."""
        ...

    def open_forecast(self, paths: Sequence[Path], *, apply_period: Sequence[str] | None = None,
                      members: int | None = None, table: dict[str, Any] | None = None) -> tuple[xr.Dataset, str]:
        """(the forecast files ``paths`` to calibrate, checked against the model, the sources as one string)."""
        ...

    def apply(self, forecast: xr.Dataset, progress: bool = False) -> Predictive:
        """The predictive distribution of the raw ensemble ``forecast`` (dims of the training ensemble)."""
        ...

    def save(self, path: str | Path, overwrite: bool = False) -> Path:
        """Write the data-only model file."""
        ...


TRAINED_ELSEWHERE = ("fit: networks are trained with `smoe train` (configs/postprocess, configs/ens10); load(CKPT) "
                     "gives their calibrator")


@contextlib.contextmanager
def _staging(run: Run) -> Iterator[Path]:
    """The folder an out-of-core fit stages its data in: beside ``run.staging``, or a temporary one."""
    if run.staging is not None:
        with chunked.staging_dir(Path(run.staging)) as path:
            yield path
        return
    with tempfile.TemporaryDirectory(prefix="smoe-staging-") as path:
        yield Path(path)


def _copy(source: Path | None, path: str | Path, overwrite: bool, what: str) -> Path:
    """``source`` copied to ``path`` atomically: the save of a loaded model (its file is the model)."""
    if source is None:
        raise ValueError(f"{what}.save: nothing to save; fit it or load a model file first")
    with atomic_path(Path(path), overwrite=overwrite) as tmp:
        shutil.copyfile(source, tmp)
    return Path(path)


def _station_ids(attrs: dict[str, Any], training: xr.Dataset | None) -> list[str]:
    """The station ids of a model: its file's (``attrs``), or its training ensemble's."""
    if "station_id" in attrs:
        return list(attrs["station_id"])
    return station_ids(training["station_id"].values) if training is not None else []


def _where(path: Path | None, what: str) -> Path:
    """The model file an apply checks the forecast against; ValueError for a model not saved yet."""
    if path is None:
        raise ValueError(f"{what}.open_forecast checks a forecast against a model file: save the fitted "
                         "calibrator and load it")
    return path


@dataclass
class EMOSCalibrator:
    """EMOS (:mod:`.emos`): global, per grid point or per site, mean/spread or member-weight predictors, normal or
    truncated normal, once or on rolling windows; fitted out of core on dask (:mod:`.chunked`). ``params``: the
    coefficients (:func:`.emos.fit_emos` form); ``attrs``: the model file's attributes."""

    settings: EMOSSettings = field(default_factory=EMOSSettings)
    params: xr.Dataset | None = None
    attrs: dict[str, Any] = field(default_factory=dict)
    training: xr.Dataset | None = None  # the training ensemble (its coordinates are saved with the model)
    path: Path | None = None  # the model file it was loaded from
    description: str = ""
    method: ClassVar[str] = "emos"
    scheduled: ClassVar[bool] = True

    def training_options(self) -> dict[str, Any]:
        return {"distribution": self.settings.distribution}

    def fit(self, data: Training, run: Run = LOCAL) -> EMOSCalibrator:
        """Stage the training data (member moments, truth at the valid times) and fit every group
        (:func:`.chunked.fit_staged`); refuses too little data before fitting (:mod:`.validate`)."""
        s = self.settings.check()
        forecast, window = data.forecast, data.window
        members = [str(m) for m in forecast["member"].values] if s.predictors == "members" else None
        names = list(forecast.data_vars)
        with chunked.scheduler(run.scheduler) as client, _staging(run) as tmp:
            fc_dask, truth_dask = chunked.as_dask(forecast), chunked.as_dask(data.truth_at)
            arrays = chunked.training_arrays(fc_dask, truth_dask, s.predictors)
            factor = window[1].shape[0] * window[1].shape[1] // max(forecast.sizes["time"], 1) if window else 1
            staged, counts = chunked.stage_with(arrays, tmp / "training.zarr", client, run.progress, max(1, factor),
                                                extra=validate.data_counts(fc_dask, truth_dask, data.sources))
            report = validate.check_fit_data(counts, forecast, data.sources)  # refuses before anything is fitted
            params = chunked.fit_staged(staged, names, s.per_gridpoint, client, run.progress, window=window,
                                        members=members, iterations=s.iterations, distribution=s.distribution)
        validate.check_fitted_groups(params.attrs, data.sources)
        for n in names:
            params[n].attrs["units"] = units_of(forecast[n])  # the units it is fitted in (the model file records)
        self.params, self.training, self.path = params, forecast, None
        self.attrs = {**data.fit_attrs(report), "predictors": s.predictors, "distribution": s.distribution}
        kind = "per site" if "site" in forecast.dims and s.per_gridpoint else (
            "per grid point" if s.per_gridpoint else "global")
        rolling = f", {len(window[0])} forecast dates" if window is not None else ""
        empty = int(params.attrs.get("groups_without_data", 0))
        self.description = (f"{params.attrs['groups']} EMOS fit(s) ({kind}, {s.predictors}{rolling}) on "
                            f"{self.attrs['fit_cases']} cases, {params.attrs['groups_not_converged']} not converged"
                            + (f", {empty} without enough cases (NaN)" if empty else ""))
        return self

    def open_forecast(self, paths: Sequence[Path], *, apply_period: Sequence[str] | None = None,
                      members: int | None = None, table: dict[str, Any] | None = None) -> tuple[xr.Dataset, str]:
        """The forecast checked against the model file and in its units, lazy on dask (applied out of core)."""
        forecast, sources = open_to_apply(self.attrs, _where(self.path, "EMOSCalibrator"), paths,
                                          apply_period=apply_period, members=members, table=table)
        return chunked.as_dask(forecast), sources

    def apply(self, forecast: xr.Dataset, progress: bool = False) -> Predictive:
        """μ, σ of every init (lazy on a dask ``forecast``), in the forecast's own units."""
        from smoeweather.postprocess.emos import apply_emos

        if self.params is None:
            raise ValueError("EMOSCalibrator.apply: fit it or load a model file first")
        params = self.params
        if "site" in params.dims:  # per-site coefficients in the forecast's site order (matched by station id)
            pos = {str(s): i for i, s in enumerate(_station_ids(self.attrs, self.training))}
            idx = [pos[str(s)] for s in forecast["station_id"].values]
            params = params.isel(site=idx).assign_coords(site=forecast["site"].values)
        mu, sigma = from_model_units(*apply_emos(params, forecast), forecast)
        where = "site" if "site" in forecast.dims else "gridpoint"
        attrs = {"method": "emos" + (f"_{where}" if self.settings.per_gridpoint else "_global"),
                 "model": str(self.path or ""), "model_train_period": self.attrs.get("train_period"),
                 "members": int(forecast.sizes["member"]), "predictors": self.settings.predictors,
                 "window": self.attrs.get("window")}
        return Predictive(self.settings.distribution, mu, sigma, attrs)

    def save(self, path: str | Path, overwrite: bool = False) -> Path:
        from smoeweather.postprocess.model_file import write_model

        if self.training is None:
            return _copy(self.path, path, overwrite, "EMOSCalibrator")
        return write_model(self.params, self.training, path, self.attrs, overwrite=overwrite)  # type: ignore[arg-type]

    @classmethod
    def load(cls, path: str | Path, settings: EMOSSettings | None = None) -> EMOSCalibrator:
        """The calibrator of an EMOS model file (its settings as the file records them)."""
        from smoeweather.postprocess.model_file import read_model

        params, attrs = read_model(path)
        return cls(settings or EMOSSettings.recorded(attrs), params, attrs, path=Path(path))


@dataclass
class DRNCalibrator:
    """Distributional regression network weights (:func:`.drn.fit_drn`, the model-file layout), fitted and applied
    in memory."""

    settings: DRNSettings = field(default_factory=DRNSettings)
    model: xr.Dataset | None = None
    attrs: dict[str, Any] = field(default_factory=dict)
    training: xr.Dataset | None = None
    path: Path | None = None
    description: str = ""
    method: ClassVar[str] = "drn"
    scheduled: ClassVar[bool] = True

    def training_options(self) -> dict[str, Any]:
        s = self.settings
        return {"distribution": s.distribution, "extra_variables": s.extra_variables, "static_maps": True}

    def fit(self, data: Training, run: Run = LOCAL) -> DRNCalibrator:
        """Train the networks on ``data`` (in memory; ``run.progress``: a progress bar); refuses too little data
        before training (:mod:`.validate`)."""
        from smoeweather.postprocess.drn import fit_drn

        s = self.settings.check()
        targets, win = data.targets, data.window
        fc, truth_at = data.forecast.load(), data.truth_at.load()
        report = validate.check_fit_data(validate.data_counts(fc[targets], truth_at, data.sources), fc[targets],
                                         data.sources)
        t0 = time.perf_counter()
        self.model = fit_drn(fc, truth_at, s, window=win, progress=run.progress, targets=targets)
        self.attrs = {**data.fit_attrs(report), "fit_seconds": round(time.perf_counter() - t0, 1)}
        self.training, self.path = fc[targets], None
        kind = "sites" if "site" in fc.dims else "grid points"
        rolling = f", {len(win[0])} forecast dates" if win is not None else ""
        self.description = (f"DRN ({s.hidden} hidden, embedding {s.embedding}, {s.seeds} seed(s), {s.epochs} "
                            f"epochs, {fc.sizes.get('site', 0) or fc.sizes['latitude'] * fc.sizes['longitude']} "
                            f"{kind}{rolling}) on {self.attrs['fit_cases']} cases in {self.attrs['fit_seconds']} s")
        return self

    def open_forecast(self, paths: Sequence[Path], *, apply_period: Sequence[str] | None = None,
                      members: int | None = None, table: dict[str, Any] | None = None) -> tuple[xr.Dataset, str]:
        """The forecast checked against the model file, in its units, with the static maps and the extra
        variables the model reads, in memory."""
        forecast, sources = open_to_apply(self.attrs, _where(self.path, "DRNCalibrator"), paths,
                                          apply_period=apply_period, members=members, table=table, static_maps=True,
                                          extra_variables=str(self.attrs.get("extra_variables", "")).split())
        return forecast.load(), sources

    def apply(self, forecast: xr.Dataset, progress: bool = False) -> Predictive:
        """μ, σ of every init, in the forecast's own units. Sites the model never saw get the mean embedding
        (``progress``: one line says how many)."""
        from smoeweather.postprocess.drn import apply_drn, site_positions

        if self.model is None:
            raise ValueError("DRNCalibrator.apply: fit it or load a model file first")
        forecast = forecast.load()
        idx, new = site_positions({"station_id": _station_ids(self.attrs, self.training)}, forecast)
        if new and progress:
            print(f"DRN: {len(new)} site(s) the model never saw get the mean station embedding, first {new[:5]}",
                  file=sys.stderr, flush=True)
        mu, sigma = from_model_units(*apply_drn(self.model, forecast, idx), forecast)
        attrs = {"method": "drn", "model": str(self.path or ""), "model_train_period": self.attrs.get("train_period"),
                 "members": int(forecast.sizes["member"]), "window": self.attrs.get("window"),
                 "new_sites_mean_embedding": len(new)}
        return Predictive(self.settings.distribution, mu, sigma, attrs)

    def save(self, path: str | Path, overwrite: bool = False) -> Path:
        from smoeweather.postprocess.model_file import write_drn_model

        if self.training is None:
            return _copy(self.path, path, overwrite, "DRNCalibrator")
        return Path(write_drn_model(self.model, self.training, path, self.attrs, overwrite=overwrite))  # type: ignore[arg-type]

    @classmethod
    def load(cls, path: str | Path, settings: DRNSettings | None = None) -> DRNCalibrator:
        """The calibrator of a DRN model file (its settings as the file records them)."""
        from smoeweather.postprocess.drn import settings_of
        from smoeweather.postprocess.model_file import read_drn_model

        model, attrs = read_drn_model(path)
        return cls(settings or settings_of(model), model, attrs, path=Path(path))


@dataclass
class NetworkCalibrator:
    """A post-processing network checkpoint of ``smoe train`` (U-Net, SMoE-U-Net; trained there, so ``save`` is
    the checkpoint itself); loaded without Lightning or pickle (:func:`smoeweather.models.loader.load_network`)."""

    checkpoint: Path
    settings: NetworkSettings = field(default_factory=NetworkSettings)
    description: str = ""
    method: ClassVar[str] = "network"
    scheduled: ClassVar[bool] = False  # in memory: its stores are written without a dask cluster

    def training_options(self) -> dict[str, Any]:
        return self.fit(None)  # type: ignore[arg-type,return-value]

    def fit(self, data: Training, run: Run = LOCAL) -> NetworkCalibrator:
        raise ValueError(TRAINED_ELSEWHERE)

    def open_forecast(self, paths: Sequence[Path], *, apply_period: Sequence[str] | None = None,
                      members: int | None = None, table: dict[str, Any] | None = None) -> tuple[xr.Dataset, str]:
        """The gridded forecast of the period, in memory (the checkpoint checks it when applied)."""
        from smoeweather.data import forecast_stores

        forecast = forecast_stores.select_period(open_gridded(paths), apply_period)
        sources = " ".join(map(str, paths))
        check_member_count(members, forecast, sources)
        return forecast.load(), sources

    def apply(self, forecast: xr.Dataset, progress: bool = False) -> Predictive:
        from smoeweather.postprocess.neural import apply_checkpoint

        mu, sigma, attrs = apply_checkpoint(self.checkpoint, forecast, batch_size=self.settings.batch_size)
        return Predictive("normal", mu.load(), sigma.load(), attrs)

    def save(self, path: str | Path, overwrite: bool = False) -> Path:
        return _copy(self.checkpoint, path, overwrite, "NetworkCalibrator")

    @classmethod
    def load(cls, path: str | Path, settings: NetworkSettings | None = None) -> NetworkCalibrator:
        """The calibrator of a checkpoint (``*.ckpt``) or an export folder (``smoe export``)."""
        return cls(Path(path), settings or NetworkSettings())


CALIBRATORS: dict[str, Any] = {"emos": EMOSCalibrator, "drn": DRNCalibrator, "network": NetworkCalibrator}
"""The calibrator class of each method (its option block: :data:`.options.SETTINGS`)."""


def calibrator(method: str, settings: Settings | Mapping[str, Any] | None = None) -> Calibrator:
    """An unfitted calibrator of ``method`` (``emos``, ``drn``) with ``settings``: its option block, or a mapping
    of its fields (checked: ConfigError naming ``<method>.<key>``)."""
    if method == "network":
        raise ValueError(TRAINED_ELSEWHERE)
    if method not in FIT_METHODS:
        raise ValueError(f"fit: method {method!r} is not one of {list(FIT_METHODS)} (networks: `smoe train`)")
    block = settings if isinstance(settings, Settings) else SETTINGS[method].of(settings)
    return CALIBRATORS[method](block)


def fit(forecast: xr.Dataset, truth: xr.Dataset, options: Mapping[str, Any] | None = None) -> Calibrator:
    """Fit ``options["method"]`` (``emos``, default, or ``drn``) on the ensemble ``forecast`` against ``truth`` at
    its valid times (same dims without ``member``), in memory; the other options are the fields of its option
    block (:class:`.options.EMOSSettings`, :class:`.options.DRNSettings`). ValueError naming an unknown method
    or option. Rolling windows: ``calibrator(method, settings).fit(Training.of(forecast, truth, window=...))``."""
    opts = dict(options or {})
    return calibrator(opts.pop("method", "emos"), opts).fit(Training.of(forecast, truth))


def load(path: str | Path, method: str | None = None, settings: Settings | None = None) -> Calibrator:
    """The calibrator of a model file of ``smoe postprocess fit`` (EMOS or DRN, by its ``kind`` attribute) or of
    a network checkpoint (``*.ckpt``) of ``smoe train`` or its export folder (``smoe export``); ``method``: the
    kind it must be (a file of another kind is refused naming both)."""
    from smoeweather.models.export_folder import is_export
    from smoeweather.postprocess.model_file import open_model_file

    if not Path(path).exists():
        raise FileNotFoundError(f"model {path} does not exist")
    if method is None:
        if Path(path).suffix == ".ckpt" or is_export(path):
            method = "network"
        else:
            with open_model_file(Path(path), "model", "model") as ds:
                method = "drn" if "drn" in str(ds.attrs.get("kind", "")).lower() else "emos"
    return CALIBRATORS[method].load(path, settings)


def fit_files(cal: Calibrator, forecast_paths: Sequence[Path], out: Path, *, truth: Path | None = None,
              variables: Sequence[str] | None = None, train_period: Sequence[str] | None = None,
              window: str | None = None, lag: str | None = None, dates: Sequence[str] | None = None,
              table: dict[str, Any] | None = None, run: Run = LOCAL, overwrite: bool = False,
              plausibility_check: bool = True) -> str:
    """``smoe postprocess fit``: fit ``cal`` on the ensemble files (gridded stores/files, a CF site file or a site
    table, ``table``: its column options, :func:`smoeweather.data.sites.open_sites`) against ``truth`` (default:
    the forecast's own), every check first (:func:`.pipeline.open_training`), and write its model file ``out``;
    the summary line. ``window``/``lag``/``dates``: rolling training windows (``25D``, ``2D``)."""
    cal.settings.check()  # before anything is read
    data = open_training([Path(p) for p in forecast_paths], Path(out), truth_path=Path(truth) if truth else None,
                         variables=variables, train_period=train_period, window=window, lag=lag, dates=dates,
                         table=table, overwrite=overwrite, plausibility_check=plausibility_check,
                         **cal.training_options())
    cal.fit(data, replace(run, staging=Path(out)))
    return f"{cal.save(out, overwrite=overwrite)}: {cal.description}"


def apply_files(cal: Calibrator, forecast_paths: Sequence[Path], outputs: Outputs, *,
                apply_period: Sequence[str] | None = None, table: dict[str, Any] | None = None, run: Run = LOCAL,
                overwrite: bool = False) -> list[Path]:
    """``smoe postprocess apply``: calibrate the forecast files with ``cal`` (checked against its model) and
    write ``outputs`` (checked by the caller, :meth:`.forms.Outputs.check`); the paths written."""
    forecast, sources = cal.open_forecast([Path(p) for p in forecast_paths], apply_period=apply_period,
                                          members=outputs.members, table=table)
    pred = cal.apply(forecast, progress=run.progress)
    pred = replace(pred, attrs={**pred.attrs, "forecast": sources})
    return write_products(pred, forecast, outputs, run if cal.scheduled else LOCAL, overwrite)


__all__ = ["CALIBRATORS", "Calibrator", "DRNCalibrator", "EMOSCalibrator", "NetworkCalibrator", "Predictive",
           "Training", "apply_files", "calibrator", "fit", "fit_files", "load"]
