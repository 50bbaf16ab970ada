"""Forecasts of ensemble networks (``model.name`` ∈ ``e3``, ``deep_ensemble``, ``gaussian``).

The network runs in :func:`smoeweather.forecast.model.model_forecast`, the one inference loop of the package:
inputs are assembled as for a deterministic model (physical units; the checkpoint's :class:`NormalizedModel`
normalises), and the network gives every member at every lead in one pass: the ResNet family forecasts each
lead directly (continuous lead time τ/100 h as an input channel), so "rolling a member forward" to 72 h and
120 h is one member-wise evaluation per lead, with the member's own routing (E³) or own weights (deep
ensemble) at every lead.

Here its arrays become the forecast Dataset: ``ensemble`` → dim ``member`` 0 … M − 1; ``gaussian`` → μ and σ
variables.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import xarray as xr

from smoeweather.models.ensemble import model_kind
from smoeweather.models.loader import TrainedNetwork


def is_ensemble_model(trained: TrainedNetwork) -> bool:
    """Whether a weatherbench checkpoint holds an ensemble network (e3, deep_ensemble, gaussian)."""
    return trained.task == "weatherbench" and model_kind(trained.config.get("model", {})) != "deterministic"


def members_dataset(
    trained: TrainedNetwork,
    ds: xr.Dataset,
    inits: np.ndarray,
    leads_h: Sequence[int],
    where: str,
    attrs: dict[str, Any],
    **kwargs: Any,
) -> xr.Dataset:
    """The WeatherBench-2-style forecast Dataset of an ensemble network: dim ``member`` (CF attrs, values
    0 … M − 1) and ``forecast_kind: ensemble``, or μ variables plus ``<name>_std`` σ variables and
    ``forecast_kind: gaussian``. ``kwargs``: :func:`~smoeweather.forecast.model.model_forecast` options."""
    from smoeweather.forecast.model import model_forecast
    from smoeweather.forecast.output import forecast_dataset

    fields, members, lat, lon = model_forecast(trained, ds, inits, leads_h, where, **kwargs)
    cfg = trained.config["model"]
    kind = model_kind(cfg)
    attrs = {**attrs, "forecast_kind": kind, "ensemble_model": str(cfg.get("name"))}
    if kind == "ensemble":
        attrs["ensemble_members"] = len(members)  # type: ignore[arg-type]
        attrs["title"] = f"smoeweather ensemble forecast: {attrs.get('method', '')}"
        out = forecast_dataset(fields, inits, leads_h, lat, lon, members, source=ds, attrs=attrs)
        out["member"].attrs.update({"long_name": "ensemble member", "standard_name": "realization",
                                    "units": "1", "axis": "E"})
        # one initialisation and every member per chunk (as WeatherBench 2 stores): member-wise tools (ECC-Q,
        # rank statistics) read whole ensembles; zarr's own chunk guess would split the member dim
        return out.chunk({"time": 1, "member": -1})
    from smoeweather.data.forecast_stores import gaussian_dataset

    attrs["title"] = f"smoeweather gaussian forecast: {attrs.get('method', '')}"
    mu = forecast_dataset({f: a[:, :, 0] for f, a in fields.items()}, inits, leads_h, lat, lon, None, source=ds,
                          attrs=attrs)
    sd = forecast_dataset({f: a[:, :, 1] for f, a in fields.items()}, inits, leads_h, lat, lon, None, source=ds,
                          attrs=attrs)
    return gaussian_dataset(mu, sd).assign_coords(mu.coords).assign_attrs(mu.attrs)
