"""Post-processing samples from any ensemble source: ensemble mean/std of predictor fields in, truth out.

Every source is first opened in one convention (:func:`smoeweather.data.forecast_stores.open_ensemble`:
WeatherBench 2 ``time`` = init, ``prediction_timedelta``, ``member``, [``level``], ``latitude``,
``longitude``; truth on valid times), so ENS-10 stores, gcm_ens files, WeatherBench 2 ensemble zarr and
SEAS5-style files all train the same networks.

Leads: ``leads_h`` picks one, several or all (None) leads. By default one sample is one initialisation and
the leads are stacked as channels (predictors and targets per lead); with ``lead_as_input`` one sample is one
(init, lead) pair and the lead (in units of the longest lead) is an extra input channel.

Normalisation (one (mean, std) per field, from the training split; the same statistics travel in the
checkpoint): mean channels and the truth → (value − mean) / std; std channels → std / std_field.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import xarray as xr
from torch.utils.data import Dataset

from smoeweather.data.forecast_stores import lead_hours, lead_timedeltas, open_ensemble, open_truth, select_split
from smoeweather.data.weather import Field, field_name, parse_fields


@dataclass(frozen=True)
class EnsembleSpec:
    """What a post-processing network sees and predicts (from the ``data`` block of a config)."""

    predictors: tuple[Field, ...]
    targets: tuple[Field, ...]
    leads_h: tuple[int, ...]
    lead_as_input: bool = False

    @classmethod
    def from_config(cls, dcfg: dict[str, Any], forecast: xr.Dataset | None = None) -> EnsembleSpec:
        """Spec of ``data.variables``, ``data.target_variables`` (default: the predictors), ``data.leads_h``
        (default: every lead of ``forecast``) and ``data.lead_as_input``."""
        predictors = tuple(parse_fields(dcfg["variables"]))
        targets = tuple(parse_fields(dcfg.get("target_variables") or dcfg["variables"]))
        leads = dcfg.get("leads_h")
        if leads is None and dcfg.get("lead_h") is not None:
            leads = [dcfg["lead_h"]]
        if leads is None:
            if forecast is None:
                raise ValueError("data.leads_h is needed when no forecast is given to read the leads from")
            leads = lead_hours(forecast)
        return cls(predictors, targets, tuple(int(h) for h in leads), bool(dcfg.get("lead_as_input", False)))

    @property
    def target_variables(self) -> list[str]:
        """Variable names of the targets (each once), e.g. ``["geopotential", "temperature"]``."""
        return list(dict.fromkeys(name for name, _ in self.targets))

    @property
    def sample_leads(self) -> tuple[int, ...]:
        """Leads held by one sample (all of them, or one with ``lead_as_input``)."""
        return self.leads_h[:1] if self.lead_as_input else self.leads_h

    @property
    def channel_names(self) -> list[str]:
        """Input channel names (before static channels), e.g. ``geopotential_500_ens_mean@48h``."""
        if self.lead_as_input:
            return [f"{field_name(f)}_{s}" for f in self.predictors for s in ("ens_mean", "ens_std")] + ["lead_time"]
        return [f"{field_name(f)}_{s}@{h}h" for h in self.leads_h for f in self.predictors
                for s in ("ens_mean", "ens_std")]

    @property
    def target_names(self) -> list[str]:
        """Output names, e.g. ``geopotential_500@48h`` (one per target per sample lead)."""
        if self.lead_as_input:
            return [field_name(f) for f in self.targets]
        return [f"{field_name(f)}@{h}h" for h in self.leads_h for f in self.targets]

    def to_config(self) -> dict[str, Any]:
        return {"variables": [field_name(f) for f in self.predictors],
                "target_variables": [field_name(f) for f in self.targets],
                "leads_h": list(self.leads_h), "lead_as_input": self.lead_as_input}


def check_forecast(forecast: xr.Dataset, spec: EnsembleSpec, where: str) -> None:
    """ValueError naming the field, level or lead that ``forecast`` lacks for ``spec``."""
    have = lead_hours(forecast)
    for h in spec.leads_h:
        if h not in have:
            raise ValueError(f"{where}: no lead {h} h; it has {have} h")
    for name, level in (*spec.predictors, *spec.targets):
        if name not in forecast.data_vars:
            raise ValueError(f"{where}: no ensemble variable {name!r}; it has {list(forecast.data_vars)}")
        has_level = "level" in forecast[name].dims
        if level is not None and (not has_level or level not in forecast["level"].values):
            raise ValueError(f"{where}: {name} has no level {level} hPa")
        if level is None and has_level:
            raise ValueError(f"{where}: {name} has levels; name one, e.g. {name}_{int(forecast['level'][0])}")


def _select(da: xr.DataArray, level: int | None) -> xr.DataArray:
    return da.sel(level=level, drop=True) if level is not None else da


class EnsembleDataset(Dataset):
    """(x, y, ens_mean, ens_std) samples of ensemble post-processing (Ashkboos et al. 2022; SMoE paper §3.3).

    Args:
        forecast: ensemble Dataset in the project convention (see module docstring), already cut to the
            split's initialisation times.
        truth: truth at the forecast's valid times (dims time = init, prediction_timedelta, [level], lat, lon;
            :func:`~smoeweather.data.forecast_stores.truth_at_valid_times`), or None (inference: y is NaN).
        spec: predictors, targets and leads.
        stats: {field name: (mean, std)} in physical units; None = computed from this dataset (training split).
        cache: compute every sample's moments at construction (fast epochs; memory ≈ 4 B × samples × channels
            × grid); otherwise each sample reads its members on demand.

    Returns per sample, all float32 on (·, H, W): ``x`` (C, H, W) = [ens mean, ens std] per predictor per
    sample lead (+ the lead channel); ``y`` (T, H, W) the truth of each target per sample lead; ``ens_mean``,
    ``ens_std`` (T, H, W) of the targets; all normalised with ``stats``.
    """

    def __init__(self, forecast: xr.Dataset, truth: xr.Dataset | None, spec: EnsembleSpec,
                 stats: dict[str, tuple[float, float]] | None = None, cache: bool = True, source: str = "") -> None:
        self.source = source or str(forecast.attrs.get("source_files", "ensemble"))
        check_forecast(forecast, spec, self.source)
        self.spec = spec
        leads = lead_timedeltas(spec.leads_h)
        self.forecast = forecast.sel(prediction_timedelta=leads)
        self.truth = None if truth is None else truth.sel(prediction_timedelta=leads)
        self.times = forecast["time"].values.astype("datetime64[ns]")
        if len(self.times) == 0:
            raise ValueError(f"{self.source}: no initialisation time in this split")
        self.grid = (forecast.sizes["latitude"], forecast.sizes["longitude"])
        self.latitude = forecast["latitude"].values
        self.longitude = forecast["longitude"].values
        self.members = int(forecast.sizes["member"])
        n_leads = len(spec.leads_h)
        self.index = [(t, k) for t in range(len(self.times)) for k in range(n_leads)] if spec.lead_as_input \
            else [(t, None) for t in range(len(self.times))]
        self._cache: dict[str, np.ndarray] | None = None
        if cache:
            self._cache = self._moments(slice(None))
        self.stats = stats if stats is not None else self._statistics()
        missing = [field_name(f) for f in (*spec.predictors, *spec.targets) if field_name(f) not in self.stats]
        if missing:
            raise ValueError(f"normalisation statistics lack {missing}")

    # -- reading ---------------------------------------------------------------------------------------
    def _fields(self) -> list[Field]:
        return list(dict.fromkeys((*self.spec.predictors, *self.spec.targets)))

    def _moments(self, times: slice | list[int]) -> dict[str, np.ndarray]:
        """{'<field>:mean'|':std'|':truth': (t, L, H, W) float32} in physical units for init indices ``times``."""
        out = {}
        for f in self._fields():
            name = field_name(f)
            ens = _select(self.forecast[f[0]], f[1]).isel(time=times)
            ens = np.asarray(ens.transpose("time", "prediction_timedelta", "member", "latitude", "longitude")
                             .values, np.float64)
            out[name + ":mean"] = ens.mean(2).astype(np.float32)
            out[name + ":std"] = ens.std(2, ddof=1).astype(np.float32)
            if self.truth is not None and f in self.spec.targets:
                y = _select(self.truth[f[0]], f[1]).isel(time=times)
                out[name + ":truth"] = np.asarray(
                    y.transpose("time", "prediction_timedelta", "latitude", "longitude").values, np.float32)
        return out

    def _statistics(self) -> dict[str, tuple[float, float]]:
        """(mean, std) of each field's ensemble mean over this dataset (float64 sums)."""
        data = self._cache if self._cache is not None else self._moments(
            list(range(0, len(self.times), max(1, len(self.times) // 64))))
        stats = {}
        for f in self._fields():
            m = data[field_name(f) + ":mean"].astype(np.float64)
            std = float(m.std())
            if not np.isfinite(std) or std <= 0:
                raise ValueError(f"{self.source}: {field_name(f)} is constant or not finite; cannot normalise")
            stats[field_name(f)] = (float(m.mean()), std)
        return stats

    # -- samples ---------------------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.index)

    def init_time(self, i: int) -> np.datetime64:
        return self.times[self.index[i][0]]

    def __getitem__(self, i: int) -> tuple[torch.Tensor, ...]:
        t, k = self.index[i]
        data = {key: a[t] for key, a in self._cache.items()} if self._cache is not None else \
            {key: a[0] for key, a in self._moments([t]).items()}
        leads = range(len(self.spec.leads_h)) if k is None else [k]
        x, y, mu, sd = [], [], [], []
        for li in leads:
            for f in self.spec.predictors:
                m, s = self.stats[field_name(f)]
                x += [(data[field_name(f) + ":mean"][li] - m) / s, data[field_name(f) + ":std"][li] / s]
            for f in self.spec.targets:
                m, s = self.stats[field_name(f)]
                mu.append((data[field_name(f) + ":mean"][li] - m) / s)
                sd.append(data[field_name(f) + ":std"][li] / s)
                truth = data.get(field_name(f) + ":truth")
                y.append((truth[li] - m) / s if truth is not None else np.full(self.grid, np.nan, np.float32))
        if k is not None:
            x.append(np.full(self.grid, self.spec.leads_h[k] / max(self.spec.leads_h), np.float32))
        return tuple(torch.from_numpy(np.stack(a).astype(np.float32)) for a in (x, y, mu, sd))

    @property
    def channel_names(self) -> list[str]:
        return self.spec.channel_names

    @property
    def target_names(self) -> list[str]:
        return self.spec.target_names


def static_channels(names: Sequence[str], static: xr.Dataset | None, latitude: np.ndarray,
                    longitude: np.ndarray) -> tuple[np.ndarray, list[str]]:
    """Static input channels (S, H, W) float32 and their names: ``land_sea_mask`` (fraction, as is),
    ``orography`` (standardised over the grid), ``latitude`` (sin φ)."""
    chans, out_names = [], []
    for n in names:
        if n == "latitude":
            a = np.broadcast_to(np.sin(np.deg2rad(latitude))[:, None], (len(latitude), len(longitude)))
        else:
            if static is None or n not in static:
                raise ValueError(f"static input {n!r} is not available (data.constants or the source file)")
            a = np.asarray(static[n].values, np.float64)
            if a.shape != (len(latitude), len(longitude)):
                raise ValueError(f"static {n} has shape {a.shape}; the forecast grid is "
                                 f"{(len(latitude), len(longitude))}")
            if n == "orography":
                a = (a - a.mean()) / (a.std() or 1.0)
        chans.append(np.asarray(a, np.float32))
        out_names.append(n)
    grid = (len(latitude), len(longitude))
    return (np.stack(chans) if chans else np.zeros((0, *grid), np.float32)), out_names


def open_ensemble_dataset(source: Any, spec_config: dict[str, Any], truth: Any = None,
                          years: Sequence[Any] | None = None, period: Sequence[Any] | None = None,
                          stats: dict[str, tuple[float, float]] | None = None, cache: bool = True) -> EnsembleDataset:
    """:class:`EnsembleDataset` of any ensemble source (path or paths) and its truth (default: inside the
    source), cut to ``years``/``period``; ``spec_config`` holds ``variables``, [``target_variables``,
    ``leads_h``, ``lead_as_input``]."""
    forecast = open_ensemble(source)
    spec = EnsembleSpec.from_config(spec_config, forecast)
    fc, truth_ds = select_split(forecast, open_truth(truth, source), spec.leads_h, spec.target_variables,
                                "requested", years, period, str(source))
    return EnsembleDataset(fc, truth_ds, spec, stats=stats, cache=cache, source=str(source))
