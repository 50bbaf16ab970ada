"""Forecasts of ensemble networks (``model.name`` ∈ ``e3``, ``deep_ensemble``, ``gaussian``).

Each initialisation's inputs are assembled as :func:`smoeweather.forecast.model.model_forecast` assembles
them (physical units; the checkpoint's :class:`NormalizedModel` normalises), and the network gives every
member at every lead in one pass: the ResNet family forecasts each lead directly (continuous lead time
τ/100 h as an input channel), so "rolling a member forward" to 72 h and 120 h is one member-wise evaluation
per lead, with the member's own routing (E³) or own weights (deep ensemble) at every lead.

Output arrays: ``ensemble`` → {field: (T, L, M, H, W)} and member numbers 0 … M − 1; ``gaussian`` →
{field: (T, L, H, W)} for μ and σ.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
import xarray as xr

from pipelines.progress import progress_bar
from smoeweather.data.weather import Field
from smoeweather.models.ensemble import model_kind, physical_members
from smoeweather.models.loader import TrainedNetwork


def is_ensemble_model(trained: TrainedNetwork) -> bool:
    """Whether a weatherbench checkpoint holds an ensemble network (e3, deep_ensemble, gaussian)."""
    return trained.task == "weatherbench" and model_kind(trained.config.get("model", {})) != "deterministic"


def members_forecast(
    trained: TrainedNetwork,
    ds: xr.Dataset,
    inits: np.ndarray,
    leads_h: Sequence[int],
    where: str,
    batch_size: int = 16,
    device: str | torch.device = "cpu",
    need_truth: bool = True,
    progress: bool = True,
) -> tuple[str, dict[Field, np.ndarray], dict[Field, np.ndarray] | None, np.ndarray | None, np.ndarray, np.ndarray]:
    """Run an ensemble network: (kind, {field: members or μ}, {field: σ} or None, member numbers or None, lat, lon).

    ``ds``: canonical data with deterministic inputs (no ``member`` dim); ``inits`` datetime64; ``leads_h`` hours.
    """
    from smoeweather.forecast.model import constants_tensor, network_inputs, prepared_input

    kind = model_kind(trained.config["model"])
    spec, ds = prepared_input(trained, ds, inits, leads_h, where, need_truth)
    if any("member" in ds[v].dims for v, _ in spec.variables):
        name = trained.config["model"]["name"]
        raise ValueError(f"{where}: the inputs have a member dim; an ensemble network ({name})"
                         " makes its own members from deterministic initial conditions")
    H, W = len(spec.latitude), len(spec.longitude)
    const = constants_tensor(ds, spec, where)
    model = trained.model.to(device).eval()
    n_out = 2 if kind == "gaussian" else int(trained.config["model"].get("members", 4))
    out = np.empty((len(spec.targets), len(inits), len(leads_h), n_out, H, W), np.float32)
    bar = progress_bar(len(inits), "smoe forecast (members)", unit="init", enabled=progress)
    # mc_dropout members are dropout draws: seeded (0) in a forked RNG, so a forecast is reproducible
    with torch.no_grad(), torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        for rows, j, _, x in network_inputs(spec, ds, const, inits, leads_h, 1, batch_size, bar):
            y = physical_members(model, x.to(device), kind).float().cpu().numpy()  # (B, M|2, C, H, W)
            out[:, rows, j] = y.transpose(2, 0, 1, 3, 4)
    bar.close()
    if kind == "gaussian":
        mu = {f: out[c, :, :, 0] for c, f in enumerate(spec.targets)}
        sigma = {f: out[c, :, :, 1] for c, f in enumerate(spec.targets)}
        return kind, mu, sigma, None, spec.latitude, spec.longitude
    fields = {f: out[c] for c, f in enumerate(spec.targets)}
    return kind, fields, None, np.arange(n_out), spec.latitude, spec.longitude


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
    ``forecast_kind: gaussian``. ``kwargs``: :func:`members_forecast` options."""
    from smoeweather.forecast.output import forecast_dataset

    kind, fields, sigma, members, lat, lon = members_forecast(trained, ds, inits, leads_h, where, **kwargs)
    cfg = trained.config["model"]
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
    from smoeweather.data.ensembles import gaussian_dataset

    attrs["title"] = f"smoeweather gaussian forecast: {attrs.get('method', '')}"
    mu = forecast_dataset(fields, inits, leads_h, lat, lon, None, source=ds, attrs=attrs)
    sd = forecast_dataset(sigma or {}, inits, leads_h, lat, lon, None, source=ds, attrs=attrs)
    return gaussian_dataset(mu, sd).assign_coords(mu.coords).assign_attrs(mu.attrs)
