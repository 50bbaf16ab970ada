"""Forecasts in WeatherBench 2 conventions from trained checkpoints or reference methods.

    run_forecast("runs/data/world.zarr", checkpoint="runs/.../best.ckpt", init=("2003-01-01", "2003-12-20"),
                 leads_h=(72, 120), out="fc.zarr")
    run_forecast("runs/data/world.zarr", method="persistence", ..., out="persistence.zarr")
    run_forecast(..., method="climatology", climatology_from="runs/data/world.zarr", out="clim.zarr")

The caller says what makes the forecast: ``checkpoint=`` (a network of ``smoe train``) or ``method=`` (one of
:data:`~smoeweather.forecast.reference.METHODS`), exactly one of them.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from pipelines.plausibility import check_plausible
from smoeweather.data.forecast_stores import Sources, describe, open_canonical, parse_lead, write_store
from smoeweather.forecast.output import init_times
from smoeweather.forecast.reference import METHODS

__all__ = ["run_forecast", "make_forecast", "METHODS", "DEFAULT_FIELDS"]

DEFAULT_FIELDS = ("geopotential_500", "temperature_850")


def make_forecast(
    data: Sources,
    init: tuple[Any, Any] | np.ndarray,
    every: str = "12h",
    leads_h: Sequence[int | str] = (72, 120),
    *,
    checkpoint: str | Path | None = None,
    method: str | None = None,
    fields: Sequence[str] | None = None,
    climatology_from: str | Path | None = None,
    climatology_years: tuple[int, int] | None = None,
    batch_size: int = 16,
    device: str = "cpu",
    beyond_data: bool = False,
    name: str | None = None,
    progress: bool = True,
    plausibility_check: bool = True,
) -> Any:
    """The forecast as an in-memory xarray Dataset (see :func:`run_forecast`) of the network ``checkpoint`` or
    the reference ``method`` (exactly one). ``plausibility_check``: refuse ``data`` whose values are implausible
    for their variables (:func:`pipelines.plausibility.check_plausible`)."""
    from smoeweather.data.weather import parse_fields
    from smoeweather.forecast.output import forecast_dataset

    if (checkpoint is None) == (method is None):
        raise ValueError("say what makes the forecast: checkpoint=CKPT (a network of `smoe train`) or "
                         f"method= one of {METHODS} (exactly one of them)")
    if method is not None and method not in METHODS:
        raise ValueError(f"unknown reference method {method!r}; expected one of {METHODS}")

    leads = [parse_lead(v) for v in leads_h]
    if len(set(leads)) != len(leads):
        raise ValueError(f"--lead has duplicates: {leads}")
    inits = np.asarray(init, "datetime64[ns]") if isinstance(init, np.ndarray) else init_times(*init, every)
    where = f"data {describe(data)}"
    what = str(method if method is not None else checkpoint)
    trained = None
    if checkpoint is not None:  # the checkpoint first: a wrong file is named before the data is opened
        from smoeweather.models.loader import load_network

        if fields:
            raise ValueError("--fields applies to --method forecasts; a model forecasts its own targets")
        trained = load_network(what, map_location=device)
    ds = open_canonical(data, where=where, role="the input of a forecast",
                        fix="give --data the analysis or prepared store (e.g. the store of `smoe data prepare`)")
    check_plausible({where: ds}, plausibility_check)
    attrs: dict[str, Any] = {"data_source": describe(data), "init_every": str(every)}
    members = None
    if method is not None:
        from smoeweather.forecast import reference

        fld = parse_fields(fields or DEFAULT_FIELDS)
        if what == "persistence":
            arrays, members = reference.persistence(ds, fld, inits, leads, where, need_truth=not beyond_data)
        else:
            if climatology_from is None:
                raise ValueError(f"--method {what} needs --climatology-from TRAIN_STORE (the training data)")
            from smoeweather.forecast.output import check_times
            from smoeweather.forecast.sources import check_fields

            check_fields(ds, fld, where)
            check_times(ds["time"].values, inits, [], leads, where, need_truth=not beyond_data)
            arrays = reference.climatology_forecast(str(climatology_from), fld, inits, leads, what, climatology_years)
            attrs["climatology_source"] = describe(climatology_from)
            attrs["climatology"] = ("day-of-year x hour-of-day mean, 31-day circular window, 29 Feb as 28 Feb"
                                    if what == "climatology" else "per-grid-point mean over the training period")
        lat, lon = ds["latitude"].values, ds["longitude"].values
        attrs.update(method=name or what, reference_method=what)
    else:
        from smoeweather.forecast.model import model_forecast, model_metadata

        run = Path(trained.config.get("output_dir") or Path(what).parent.parent).name
        from smoeweather.forecast.members import is_ensemble_model, members_dataset

        if is_ensemble_model(trained):  # e3 / deep_ensemble members, gaussian μ and σ
            attrs.update(method=name or run, **model_metadata(trained))
            return members_dataset(trained, ds, inits, leads, where, attrs, batch_size=batch_size, device=device,
                                   need_truth=not beyond_data, progress=progress)
        arrays, members, lat, lon = model_forecast(trained, ds, inits, leads, where, batch_size, device,
                                                   need_truth=not beyond_data, progress=progress)
        attrs.update(method=name or run, **model_metadata(trained))
    kind = "ensemble" if members is not None else "deterministic"
    attrs["forecast_kind"] = kind
    attrs["title"] = f"smoeweather {kind} forecast: {attrs['method']}"
    return forecast_dataset(arrays, inits, leads, lat, lon, members, source=ds, attrs=attrs)


def run_forecast(
    data: Sources,
    init: tuple[Any, Any] | np.ndarray,
    every: str = "12h",
    leads_h: Sequence[int | str] = (72, 120),
    out: str | Path = "forecast.zarr",
    overwrite: bool = True,
    **kwargs: Any,
) -> Path:
    """Forecast of ``checkpoint=CKPT`` or ``method=`` ``persistence``/``climatology``/``train_mean`` (keyword
    arguments, exactly one; see :func:`make_forecast`) from ``data`` for the inits ``init`` = (start, end) every
    ``every`` and leads ``leads_h`` (hours), written atomically to ``out`` (zarr, or netCDF for ``*.nc``).
    Returns ``out``. An existing ``out`` is refused without ``overwrite`` before anything is computed, and again
    at the write (a concurrent run that wrote it first keeps its store); an ``out`` that is, contains or lies
    inside ``data``, the checkpoint or the climatology store is refused with or without ``overwrite``."""
    from smoeweather.io import check_output

    check_output(out, overwrite, inputs=[data, kwargs.get("checkpoint"), kwargs.get("climatology_from")])
    ds = make_forecast(data, init, every, leads_h, **kwargs)
    return write_store(ds, out, ds.attrs["forecast_kind"], overwrite=overwrite, time_chunk=None)
