"""Forecasts of a trained WeatherBench-style model (dense or SMoE, continuous- or fixed-lead).

Inputs are assembled exactly as :class:`smoeweather.data.weather.WeatherBenchDataset` does in training
(fields at init + each input offset, time-major, then the constants, then τ/100 h for a continuous-lead
model), but in PHYSICAL units: the checkpoint's :class:`NormalizedModel` normalises them with the
training data's statistics, never with those of the data it is applied to.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch
import xarray as xr

from pipelines.progress import progress_bar
from smoeweather.data.forecast_stores import HOUR, check_grid
from smoeweather.data.weather import DEFAULT_CONSTANTS, DEFAULT_LEAD_CHOICES_H, Field, field_name, parse_fields
from smoeweather.forecast.output import check_times
from smoeweather.forecast.sources import check_fields, read_field
from smoeweather.models.ensemble import model_kind, physical_members
from smoeweather.models.loader import TrainedNetwork


class ModelSpec:
    """What a weatherbench checkpoint needs as input and predicts, from its saved data config."""

    def __init__(self, trained: TrainedNetwork) -> None:
        if trained.task != "weatherbench":
            raise ValueError(f"{trained.path}: task {trained.task!r}; smoe forecast runs weatherbench checkpoints")
        d = trained.config["data"]
        self.variables: list[Field] = parse_fields(d["variables"])
        self.targets: list[Field] = parse_fields(d.get("target_variables") or d["variables"])
        self.offsets_h = [int(o) for o in d.get("input_offsets_h", (-12, -6, 0))]
        self.constants = list(d.get("constants", DEFAULT_CONSTANTS))
        self.continuous = d.get("lead_h", 72) is None
        self.trained_leads_h = ([int(v) for v in d.get("lead_choices_h", DEFAULT_LEAD_CHOICES_H)]
                                if self.continuous else [int(d.get("lead_h", 72))])
        names = [f"{field_name(f)}@{o:+d}h" for o in self.offsets_h for f in self.variables]
        names += self.constants + (["lead_time/100h"] if self.continuous else [])
        saved = trained.channel_names
        if saved and saved != names:
            raise ValueError(f"{trained.path}: saved channel names {saved} differ from those its config implies "
                             f"{names}; the checkpoint was written by another smoeweather version")
        self.latitude = np.asarray(trained.metadata.get("latitude", []), np.float64)
        self.longitude = np.asarray(trained.metadata.get("longitude", []), np.float64)

    def check_leads(self, leads_h: Sequence[int], where: str) -> None:
        if not self.continuous:
            bad = [h for h in leads_h if h != self.trained_leads_h[0]]
            if bad:
                raise ValueError(f"{where} is a fixed-lead model ({self.trained_leads_h[0]} h); cannot forecast "
                                 f"{bad} h (rollouts are not supported): use --lead {self.trained_leads_h[0]}h")
        else:
            unseen = [h for h in leads_h if h not in self.trained_leads_h]
            if unseen:
                warnings.warn(f"{where}: leads {unseen} h were not among the training leads "
                              f"{self.trained_leads_h} h (continuous-lead model: extrapolating)", stacklevel=3)


def _on_model_grid(ds: xr.Dataset, spec: ModelSpec, where: str) -> xr.Dataset:
    """``ds`` reordered to the checkpoint's (latitude, longitude) order; ValueError when the grids differ."""
    want_lat, want_lon = np.sort(spec.latitude), np.sort(np.mod(spec.longitude, 360.0))
    check_grid(ds, want_lat, want_lon, where, "the checkpoint's grid (regrid with smoe data prepare --grid)")
    # the checkpoint's own order (its latitude may have been descending): positions of its coordinates
    order_lat = np.searchsorted(want_lat, spec.latitude)
    order_lon = np.searchsorted(want_lon, np.mod(spec.longitude, 360.0))
    return ds.isel(latitude=order_lat, longitude=order_lon)


def constants_tensor(ds: xr.Dataset, spec: ModelSpec, where: str) -> torch.Tensor:
    """The checkpoint's constant input planes (C, H, W) float32 from ``ds`` (``latitude`` is computed)."""
    H, W = len(spec.latitude), len(spec.longitude)
    consts = []
    for c in spec.constants:
        if c == "latitude":
            consts.append(np.broadcast_to(spec.latitude[:, None], (H, W)))
        elif set(ds[c].dims) != {"latitude", "longitude"}:
            raise ValueError(f"{where}: constant {c!r} must have dims (latitude, longitude), has {ds[c].dims}")
        else:
            consts.append(np.asarray(ds[c].transpose("latitude", "longitude").values, np.float32))
    return torch.as_tensor(np.stack(consts).astype(np.float32)) if consts else torch.empty(0, H, W)


def prepared_input(trained: TrainedNetwork, ds: xr.Dataset, inits: np.ndarray, leads_h: Sequence[int], where: str,
                   need_truth: bool = True) -> tuple[ModelSpec, xr.Dataset]:
    """The checkpoint's :class:`ModelSpec` and ``ds`` checked against it (fields, times, leads) and put on its
    grid; ValueError naming ``where`` for data the network cannot read."""
    spec = ModelSpec(trained)
    spec.check_leads(leads_h, str(trained.path))
    check_fields(ds, spec.variables, where, spec.constants)
    check_times(ds["time"].values, inits, spec.offsets_h, leads_h, where, need_truth)
    return spec, _on_model_grid(ds, spec, where)


def network_inputs(spec: ModelSpec, ds: xr.Dataset, const: torch.Tensor, inits: np.ndarray,
                   leads_h: Sequence[int], n_mem: int, batch_size: int, bar: Any
                   ) -> Iterator[tuple[slice, int, int, torch.Tensor]]:
    """The one inference loop: (init slice, lead index, input member index, input (B, C, H, W) float32).

    Inputs are read once per batch of ``batch_size`` inits; a ``member`` dim of the inputs is walked member by
    member (``n_mem`` of them; 1 without one). ``bar`` advances by the batch's inits once per member."""
    H, W = len(spec.latitude), len(spec.longitude)
    for s in range(0, len(inits), batch_size):
        batch = inits[s : s + batch_size]
        # (B, O, V[, M], H, W): every input field at every offset, read once per batch
        times = np.concatenate([batch + o * HOUR for o in spec.offsets_h])
        per_field = []
        for f in spec.variables:
            da = read_field(ds, f, times)
            arr = da.transpose("time", *(["member"] if "member" in da.dims else []), "latitude", "longitude").values
            if "member" not in da.dims:
                arr = np.repeat(arr[:, None], n_mem, axis=1)
            per_field.append(arr.reshape(len(spec.offsets_h), len(batch), n_mem, H, W))
        fields = np.stack(per_field, axis=2).astype(np.float32, copy=False)  # (O, B, V, M, H, W)
        for m in range(n_mem):
            x = torch.as_tensor(fields[:, :, :, m]).permute(1, 0, 2, 3, 4).reshape(len(batch), -1, H, W)
            x = torch.cat([x, const.expand(len(batch), -1, -1, -1)], dim=1)
            for j, lead in enumerate(leads_h):
                xi = x
                if spec.continuous:
                    xi = torch.cat([x, torch.full((len(batch), 1, H, W), lead / 100.0)], dim=1)
                yield slice(s, s + len(batch)), j, m, xi
            bar.update(len(batch))


def _members(trained: TrainedNetwork, ds: xr.Dataset, spec: ModelSpec, kind: str, where: str
             ) -> tuple[np.ndarray | None, int, int]:
    """(member coords or None, input members walked, outputs per input member) of a network of ``kind``
    (:func:`~smoeweather.models.ensemble.model_kind`) on the prepared ``ds``."""
    has_member = any("member" in ds[v].dims for v, _ in spec.variables)
    if kind == "deterministic":
        members = ds["member"].values if has_member else None
        return members, len(members) if members is not None else 1, 1
    if has_member:
        name = trained.config["model"]["name"]
        raise ValueError(f"{where}: the inputs have a member dim; an ensemble network ({name})"
                         " makes its own members from deterministic initial conditions")
    n_out = 2 if kind == "gaussian" else int(trained.config["model"].get("members", 4))
    return np.arange(n_out), 1, n_out


def model_forecast(
    trained: TrainedNetwork,
    ds: xr.Dataset,
    inits: np.ndarray,
    leads_h: Sequence[int],
    where: str,
    batch_size: int = 16,
    device: str | torch.device = "cpu",
    need_truth: bool = True,
    progress: bool = True,
) -> tuple[dict[Field, np.ndarray], np.ndarray | None, np.ndarray, np.ndarray]:
    """Run the model: ({target field: (T, L[, M], H, W) physical units}, member coords or None, lat, lon).

    ``ds``: canonical data (any prepared store / file); ``inits`` datetime64; ``leads_h`` hours. A deterministic
    network forecasts each member of inputs that have a ``member`` dim (their coords; none without); an ensemble
    network (:func:`~smoeweather.models.ensemble.model_kind` ``ensemble``) makes its own members 0 … M − 1 from
    deterministic inputs, a ``gaussian`` one μ and σ as members 0 and 1.
    """
    kind = model_kind(trained.config.get("model", {}))
    spec, ds = prepared_input(trained, ds, inits, leads_h, where, need_truth)
    members, n_in, n_out = _members(trained, ds, spec, kind, where)
    H, W = len(spec.latitude), len(spec.longitude)
    const = constants_tensor(ds, spec, where)
    model = trained.model.to(device).eval()
    out = np.empty((len(spec.targets), len(inits), len(leads_h), n_in * n_out, H, W), np.float32)
    label = "smoe forecast" if kind == "deterministic" else "smoe forecast (members)"
    bar = progress_bar(len(inits) * n_in, label, unit="init", enabled=progress)
    # mc_dropout members are dropout draws: seeded (0) in a forked RNG, so a forecast is reproducible
    with torch.no_grad(), torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        for rows, j, m, x in network_inputs(spec, ds, const, inits, leads_h, n_in, batch_size, bar):
            x = x.to(device)
            y = model(x)[:, None] if kind == "deterministic" else physical_members(model, x, kind)
            # (B, n_out, C_out, H, W) physical units → the n_out members of input member m
            out[:, rows, j, m * n_out : (m + 1) * n_out] = y.float().cpu().numpy().transpose(2, 0, 1, 3, 4)
    bar.close()
    arrays = {f: (out[c] if members is not None else out[c, :, :, 0]) for c, f in enumerate(spec.targets)}
    return arrays, members, spec.latitude, spec.longitude


def model_metadata(trained: TrainedNetwork) -> dict[str, Any]:
    """Provenance attrs of a model forecast."""
    cfg = trained.config
    return {
        "checkpoint": str(trained.path.resolve()),
        "checkpoint_sha256": trained.sha256,
        "model": str(cfg.get("model", {}).get("name", "")),
        "model_config": str(cfg.get("model", {})),
        "training_store": str(cfg.get("data", {}).get("store", "")),
        "normalisation": "statistics of the training data saved in the checkpoint",
    }
