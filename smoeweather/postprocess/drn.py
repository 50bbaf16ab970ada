"""Distributional regression network (DRN; Rasp & Lerch 2018, MWR 146, 3885) for site tables and grids.

Per variable, lead and level one small network maps the predictors of a forecast at a location to the
parameters (μ, σ) of its predictive distribution (a Gaussian, or a normal truncated at 0: :mod:`.distributions`):

- predictors: the ensemble mean and standard deviation (ddof = 1) of the target, the ensemble means of optional
  extra forecast variables of the file (same lead and level), location covariates (sites: latitude, longitude,
  altitude; grids: latitude, sin and cos of longitude, land-sea mask and orography when the source files hold
  them), all standardised with the training data's mean and
  standard deviation, and a learned embedding of the location (station or grid point, ``embedding`` numbers);
- network: one hidden layer of ``hidden`` ReLU units, two outputs; μ = ensemble mean + output₁ (in standardised
  units: the network learns the correction), σ = softplus(output₂) + 10⁻³;
- loss: the mean closed-form CRPS over the training cases (Adam, mini-batches, learning rate decaying linearly
  to 0 over the epochs of a fit);
- ``seeds`` networks from different initialisations are trained and their (μ, σ) averaged (parameter
  averaging, as Rasp & Lerch).

Rolling windows (``window``, as rolling EMOS): one set of networks per forecast date on that date's window. All
dates × seeds are trained at once as one stacked network (batched matrix products), each on its own data:
refitting per date costs (dates × seeds) small networks, but in one pass over the epochs. With
``warm_start_epochs`` the dates are instead trained one after another, each starting from the previous date's
weights for that many epochs (cheaper per date; the networks then remember older windows).

Locations: a location with fewer than ``min_location_cases`` valid cases in a training window, and a site of a
new forecast that the model never saw, get the mean of the trained embeddings (the fallback; never refused).

Deterministic for a seed (``seed``) at a given torch thread count: training runs single-threaded. Progress: a bar
over the epochs of every variable, lead and level on a terminal, one line at its start and end when piped.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
import xarray as xr

from pipelines.readers._files import open_data
from pipelines.readers.forecast_nc import normalise_grid
from smoeweather.nn.drn import StackedDRN, stacked_forward
from smoeweather.postprocess.distributions import crps_torch
from smoeweather.postprocess.model_file import DRN_KIND as KIND
from smoeweather.postprocess.model_file import read_drn_model, write_drn_model
from smoeweather.postprocess.options import DRNSettings

STATIC = ("land_sea_mask", "orography", "geopotential_at_surface")
"""Static maps of a gridded source read as location covariates when the files hold them."""
SIGMA_FLOOR = 1e-3  # σ floor in standardised units


# --- predictors --------------------------------------------------------------------------------------------------


def _space(ds: xr.Dataset | xr.DataArray) -> tuple[str, ...]:
    if "site" in ds.dims:
        return ("site",)
    if "latitude" in ds.dims and "longitude" in ds.dims:
        return ("latitude", "longitude")
    raise ValueError(f"DRN: no location dimension ('site' or 'latitude'/'longitude') in {tuple(ds.dims)}")


def with_static(forecast: xr.Dataset, paths: list[Any]) -> xr.Dataset:
    """``forecast`` (gridded) with the :data:`STATIC` maps of its source files as coordinates, where present."""
    if "site" in forecast.dims:
        return forecast
    for p in paths:
        p = Path(p)
        if not (p.is_file() and p.suffix.lower() in (".nc", ".nc4")):
            continue
        with open_data(p, "--forecast") as raw:
            for c in STATIC:
                if c in raw.variables and set(raw[c].dims) == {"latitude", "longitude"} and c not in forecast.coords:
                    da = normalise_grid(raw[c].load())  # the forecast's convention, whatever the file's
                    if np.allclose(da["latitude"].values, forecast["latitude"].values) and np.allclose(
                            da["longitude"].values, forecast["longitude"].values):
                        forecast = forecast.assign_coords({c: (("latitude", "longitude"), da.transpose(
                            "latitude", "longitude").values)})
    return forecast


def covariates(forecast: xr.Dataset) -> tuple[list[str], np.ndarray]:
    """(names, values (P, C)) of the location covariates (module doc); columns without any finite value are
    left out, missing values set to the column mean. Grids: also the :data:`STATIC` coordinates present
    (:func:`with_static`)."""
    if "site" in forecast.dims:
        cols = {c: np.asarray(forecast[c].values, np.float64) for c in ("latitude", "longitude", "altitude")
                if c in forecast.coords}
    else:
        lat, lon = np.meshgrid(forecast["latitude"].values, forecast["longitude"].values, indexing="ij")
        cols = {"latitude": lat.ravel(), "sin_longitude": np.sin(np.deg2rad(lon)).ravel(),
                "cos_longitude": np.cos(np.deg2rad(lon)).ravel()}
        for c in STATIC:
            if c in forecast.coords and set(forecast[c].dims) == {"latitude", "longitude"}:
                cols[c] = np.asarray(forecast[c].transpose("latitude", "longitude").values, np.float64).ravel()
    names, out = [], []
    for n, v in cols.items():
        if np.isfinite(v).any():
            names.append(n)
            out.append(np.where(np.isfinite(v), v, np.nanmean(v)))
    p = int(np.prod([forecast.sizes[d] for d in _space(forecast)]))
    return names, (np.stack(out, 1) if out else np.zeros((p, 0)))


def predictors(forecast: xr.Dataset, name: str, lead: Any, level: Any | None, extra: tuple[str, ...]
               ) -> tuple[list[str], np.ndarray]:
    """(feature names, values (T, P, F) float64) of variable ``name`` at one lead [and level] (module doc)."""
    sp = _space(forecast)

    def at(var: str) -> xr.DataArray:
        da = forecast[var].sel(prediction_timedelta=lead)
        if "level" in da.dims:
            if level is None:
                raise ValueError(f"{DRNSettings.option('extra_variables')} {var}: it has levels and {name!r} has none")
            da = da.sel(level=level)
        return da.transpose("time", "member", *sp)

    x = at(name)
    t, p = x.sizes["time"], int(np.prod([x.sizes[d] for d in sp]))
    vals = np.asarray(x.values, np.float64).reshape(t, x.sizes["member"], p)
    feats = [vals.mean(1), vals.std(1, ddof=1)]
    names = ["ensemble_mean", "ensemble_std"]
    for v in extra:
        if v == name:
            continue
        if v not in forecast.data_vars:
            raise ValueError(f"{DRNSettings.option('extra_variables')} {v}: no such forecast variable (variables: "
                             f"{list(forecast.data_vars)})")
        e = at(v)
        feats.append(np.asarray(e.values, np.float64).reshape(t, e.sizes["member"], p).mean(1))
        names.append(f"{v}_mean")
    cnames, cov = covariates(forecast)
    feats += [np.broadcast_to(cov[None, :, j], (t, p)) for j in range(cov.shape[1])]
    return names + cnames, np.stack(feats, -1)


# --- the stacked network -----------------------------------------------------------------------------------------


def _init_params(b: int, n_in: int, n_loc: int, s: DRNSettings, gen: torch.Generator) -> dict[str, torch.Tensor]:
    """Parameters of ``b`` independent networks (torch.nn.Linear's uniform init; embeddings U(−0.05, 0.05);
    the output layer starts at μ = ensemble mean, σ = 0.5 standard deviations of the ensemble mean)."""
    k1, k2 = 1.0 / math.sqrt(n_in + s.embedding), 1.0 / math.sqrt(s.hidden)

    def u(shape: tuple[int, ...], k: float) -> torch.Tensor:
        return (torch.rand(shape, generator=gen) * 2.0 - 1.0) * k

    b2 = torch.zeros(b, 2)
    b2[:, 1] = math.log(math.expm1(0.5))
    return {"w1": u((b, n_in + s.embedding, s.hidden), k1), "b1": u((b, s.hidden), k1),
            "w2": u((b, s.hidden, 2), k2) * 0.1, "b2": b2, "emb": u((b, n_loc, s.embedding), 0.05)}


def _forward(p: dict[str, torch.Tensor], x: torch.Tensor, loc: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(μ, σ) (B, N) standardised (:func:`smoeweather.nn.drn.stacked_forward`)."""
    return stacked_forward(p, x, loc, SIGMA_FLOOR)


@dataclass
class _Pool:
    """Training data of one group: features (T, P, F) and truth (T, P) (0 where invalid), validity (T, P),
    and per model d its cases (ti, li, mask) (D, N) and standardisation (mean, scale) (D, F)."""

    feats: torch.Tensor
    y: torch.Tensor
    ti: torch.Tensor
    li: torch.Tensor
    mask: torch.Tensor
    mean: torch.Tensor
    scale: torch.Tensor
    counts: np.ndarray = field(default_factory=lambda: np.zeros(0))  # (D, P) valid cases per location


def _pool(feats: np.ndarray, y: np.ndarray, windows: list[np.ndarray]) -> _Pool:
    valid = np.isfinite(feats).all(-1) & np.isfinite(y)
    t_n, p_n, f_n = feats.shape
    cases = []
    for idx in windows:
        sub = np.zeros(t_n, bool)
        sub[idx] = True
        ti, li = np.nonzero(valid & sub[:, None])
        cases.append((ti, li))
    n = max(1, max(len(c[0]) for c in cases))
    d = len(windows)
    ti, li, mask = np.zeros((d, n), np.int64), np.zeros((d, n), np.int64), np.zeros((d, n), np.float32)
    mean, scale = np.zeros((d, f_n)), np.ones((d, f_n))
    counts = np.zeros((d, p_n), np.int64)
    f0, y0 = np.where(valid[..., None], feats, 0.0), np.where(valid, y, 0.0)
    for k, (a, b) in enumerate(cases):
        ti[k, : len(a)], li[k, : len(a)], mask[k, : len(a)] = a, b, 1.0
        if len(a):
            x = f0[a, b]
            mean[k] = x.mean(0)
            sd = x.std(0)
            scale[k] = np.where(sd > 1e-12 * np.maximum(np.abs(mean[k]), 1.0), sd, 1.0)
            counts[k] = np.bincount(b, minlength=p_n)
    return _Pool(torch.from_numpy(f0.astype(np.float32)), torch.from_numpy(y0.astype(np.float32)),
                 torch.from_numpy(ti), torch.from_numpy(li), torch.from_numpy(mask),
                 torch.from_numpy(mean.astype(np.float32)), torch.from_numpy(scale.astype(np.float32)), counts)


def _train(pool: _Pool, models: np.ndarray, s: DRNSettings, gen: torch.Generator, epochs: int,
           params: dict[str, torch.Tensor] | None = None, tick: Any = None) -> dict[str, torch.Tensor]:
    """Train networks b = 0..B−1, network b on the cases of window ``models[b]``, all at once (module doc)."""
    b_n, f_n, p_n = len(models), pool.feats.shape[-1], pool.feats.shape[1]
    d = torch.from_numpy(models)
    if params is None:
        params = _init_params(b_n, f_n, p_n, s, gen)
    net = StackedDRN(params, SIGMA_FLOOR)
    opt = torch.optim.Adam(net.parameters(), lr=s.learning_rate)
    ti, li, mask = pool.ti[d], pool.li[d], pool.mask[d]  # (B, N)
    mean, scale = pool.mean[d][:, None], pool.scale[d][:, None]  # (B, 1, F)
    lo = (-mean[..., 0] / scale[..., 0])  # (B, 1): 0 in standardised units (truncated normal)
    n = ti.shape[1]
    bs = min(s.batch_size, n)
    rows = torch.arange(b_n)[:, None]
    total = epochs * math.ceil(n / bs)
    step = 0
    for _ in range(epochs):
        perm = torch.argsort(torch.rand((b_n, n), generator=gen), 1)
        for start in range(0, n, bs):
            pos = perm[:, start : start + bs]
            t, loc, m = ti[rows, pos], li[rows, pos], mask[rows, pos]
            x = (pool.feats[t, loc] - mean) / scale
            y = (pool.y[t, loc] - mean[..., 0]) / scale[..., 0]
            mu, sigma = net(x, loc)
            if s.distribution == "truncnormal":
                crps = crps_torch("truncnormal", mu - lo, sigma, y - lo)
            else:
                crps = crps_torch("normal", mu, sigma, y)
            loss = ((crps * m).sum(1) / m.sum(1).clamp_min(1.0)).sum()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            for g in opt.param_groups:  # learning rate decaying linearly to 0 over the training
                g["lr"] = s.learning_rate * (1.0 - step / total)
            opt.step()
            step += 1
        if tick is not None:
            tick()
    return net.weights()


def _fallback_embeddings(emb: torch.Tensor, counts: np.ndarray, minimum: int) -> torch.Tensor:
    """Embeddings (B, P, E) with every location of fewer than ``minimum`` cases set to the trained mean."""
    out = emb.clone()
    for b in range(emb.shape[0]):
        ok = torch.from_numpy(counts[b] >= minimum)
        if ok.any() and (~ok).any():
            out[b, ~ok] = emb[b, ok].mean(0)
    return out


# --- fit / apply -------------------------------------------------------------------------------------------------


def fit_drn(forecast: xr.Dataset, truth_at: xr.Dataset, settings: DRNSettings,
            window: tuple[pd.DatetimeIndex, np.ndarray, np.ndarray] | None = None,
            progress: bool = False, targets: list[str] | None = None) -> xr.Dataset:
    """DRN weights of every variable, lead [and level] of ``forecast`` (in memory) against ``truth_at`` (the
    truth at init + lead, same dims without ``member``), as a Dataset in the model-file layout
    (:func:`.model_file.write_drn_model`). ``window``: (dates, idx, valid) of :func:`.rolling.window_index` (one set of
    networks per date), else one set on every init. ``targets``: the variables to fit (default: all; the
    others can still be extra predictors)."""
    from pipelines.progress import progress_bar

    s = settings.check()
    sp = _space(forecast)
    out = xr.Dataset()
    gen = torch.Generator().manual_seed(s.seed)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for name in targets or list(forecast.data_vars):
            levels = list(forecast["level"].values) if "level" in forecast[name].dims else [None]
            per_lead = []
            for lead in forecast["prediction_timedelta"].values:
                per_level = []
                for level in levels:
                    fnames, feats = predictors(forecast, name, lead, level, s.extra_variables)
                    y = truth_at[name].sel(prediction_timedelta=lead)
                    if level is not None:
                        y = y.sel(level=level)
                    yv = np.asarray(y.transpose("time", *sp).values, np.float64).reshape(feats.shape[:2])
                    if window is None:
                        windows = [np.arange(feats.shape[0])]
                    else:
                        windows = [i[v] for i, v in zip(window[1], window[2])]
                    pool = _pool(feats, yv, windows)
                    where = f"{pd.Timedelta(lead) // pd.Timedelta('1h')}h" + (f", level {level}" if level
                                                                               is not None else "")
                    warm = s.warm_start_epochs is not None and len(windows) > 1
                    total = s.epochs + (len(windows) - 1) * s.warm_start_epochs if warm else s.epochs
                    with progress_bar(total, f"DRN fit of {name} ({where}, {len(windows)} date(s) x {s.seeds} "
                                      f"seed(s), {int(pool.mask.sum())} cases)", unit="epoch",
                                      enabled=progress) as bar:
                        per_level.append(_fit_group(pool, windows, s, gen, fnames, tick=lambda b=bar: b.update(1)))
                per_lead.append(per_level if levels[0] is not None else per_level[0])
            out.update(_group_dataset(name, per_lead, forecast, levels, window, sp))
    finally:
        torch.set_num_threads(threads)
    out.attrs = {"method": "drn", **s.as_attrs()}
    return out


def _fit_group(pool: _Pool, windows: list[np.ndarray], s: DRNSettings, gen: torch.Generator,
               fnames: list[str], tick: Any = None) -> dict[str, Any]:
    """Trained weights (D, S, ...) numpy of one group, with the standardisation (D, F) and feature names."""
    d_n = len(windows)
    if s.warm_start_epochs is None or d_n == 1:
        models = np.repeat(np.arange(d_n), s.seeds)
        p = _train(pool, models, s, gen, s.epochs, tick=tick)
    else:  # date after date, each from the previous date's weights
        parts, prev = [], None
        for k in range(d_n):
            prev = _train(pool, np.full(s.seeds, k), s, gen, s.epochs if prev is None else s.warm_start_epochs,
                          prev, tick=tick)
            parts.append(prev)
        p = {k: torch.cat([q[k] for q in parts]) for k in parts[0]}
        models = np.repeat(np.arange(d_n), s.seeds)
    p["emb"] = _fallback_embeddings(p["emb"], pool.counts[models], s.min_location_cases)
    shape = (d_n, s.seeds)
    return {"w": {k: v.numpy().reshape(*shape, *v.shape[1:]) for k, v in p.items()},
            "mean": pool.mean.numpy(), "scale": pool.scale.numpy(), "features": fnames}


def _group_dataset(name: str, per_lead: list, forecast: xr.Dataset, levels: list, window: Any,
                   sp: tuple[str, ...]) -> xr.Dataset:
    """The model-file variables of one field: ``<name>_w1`` … on (prediction_timedelta, [level], [time], seed,
    …) with per-field dims ``<name>_input``, ``<name>_feature``, ``hidden``, ``output``, ``embedding``."""
    has_level = levels[0] is not None
    groups = [[g] for g in per_lead] if not has_level else per_lead  # [lead][level]
    first = groups[0][0]
    lead_dims = ["prediction_timedelta", *(["level"] if has_level else [])]
    time_dims = ["time"] if window is not None else []
    coords: dict[str, Any] = {"prediction_timedelta": forecast["prediction_timedelta"].values}
    if has_level:
        coords["level"] = np.asarray(levels)
    if window is not None:
        coords["time"] = window[0].values
    fdim, idim = f"{name}_feature", f"{name}_input"
    coords[fdim] = first["features"]

    def stack(fn: Any) -> np.ndarray:
        arr = np.stack([np.stack([fn(g) for g in lv]) for lv in groups])  # (lead, level, D, ...)
        if not has_level:
            arr = arr[:, 0]
        if window is None:
            arr = arr[:, :, 0] if has_level else arr[:, 0]
        return arr

    pre = [*lead_dims, *time_dims]
    n_space = [forecast.sizes[d] for d in sp]
    emb = stack(lambda g: g["w"]["emb"])
    emb = emb.reshape(*emb.shape[:-2], *n_space, emb.shape[-1])
    ds = xr.Dataset({
        f"{name}_w1": ((*pre, "seed", idim, "hidden"), stack(lambda g: g["w"]["w1"])),
        f"{name}_b1": ((*pre, "seed", "hidden"), stack(lambda g: g["w"]["b1"])),
        f"{name}_w2": ((*pre, "seed", "hidden", "output"), stack(lambda g: g["w"]["w2"])),
        f"{name}_b2": ((*pre, "seed", "output"), stack(lambda g: g["w"]["b2"])),
        f"{name}_embedding": ((*pre, "seed", *sp, "embedding"), emb),
        f"{name}_feature_mean": ((*pre, fdim), stack(lambda g: g["mean"])),
        f"{name}_feature_scale": ((*pre, fdim), stack(lambda g: g["scale"])),
    }, coords=coords)
    ds["output"] = ["mu", "sigma"]
    ds[f"{name}_feature_mean"].attrs = {"long_name": f"mean of the DRN features of {name} in training"}
    ds[f"{name}_feature_scale"].attrs = {"long_name": f"standard deviation of the DRN features of {name}"}
    ds[f"{name}_w1"].attrs = {"units": forecast[name].attrs.get("units", "")}
    return ds


def _params_at(model: xr.Dataset, name: str, sel: dict[str, Any]) -> dict[str, torch.Tensor]:
    return {k: torch.from_numpy(np.asarray(model[f"{name}_{k}"].sel(sel).values, np.float32))
            for k in ("w1", "b1", "w2", "b2")}


def apply_drn(model: xr.Dataset, forecast: xr.Dataset, site_index: np.ndarray | None = None
              ) -> tuple[xr.Dataset, xr.Dataset]:
    """(μ, σ) Datasets (time, prediction_timedelta, [level], space) of the DRN ``model`` (the Dataset of
    :func:`.model_file.read_drn_model`) for every init of ``forecast`` (in memory), seeds averaged.

    ``site_index``: per forecast site its position in the model's sites, −1 for a site the model never saw
    (it gets the mean embedding). A rolling model (``time`` dim) uses each init's date; ValueError naming the
    dates it has no networks for."""
    from smoeweather.postprocess.emos import coefficients_at

    sp = _space(forecast)
    extra = tuple(str(model.attrs.get("extra_variables", "")).split())
    rolling = "time" in model.dims
    if rolling:
        coefficients_at(model[f"{next(iter(_fields(model)))}_b2"], forecast["time"])  # refuses missing dates
    mu_out, sd_out = xr.Dataset(), xr.Dataset()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for name in _fields(model):
            x = forecast[name]
            levels = list(model["level"].values) if "level" in model[f"{name}_w1"].dims else [None]
            dims = ["time", "prediction_timedelta", *(["level"] if levels[0] is not None else []), *sp]
            shape = [forecast.sizes["time"], forecast.sizes["prediction_timedelta"],
                     *([len(levels)] if levels[0] is not None else []), *[forecast.sizes[d] for d in sp]]
            mu_a, sd_a = np.full(shape, np.nan), np.full(shape, np.nan)
            for li, lead in enumerate(forecast["prediction_timedelta"].values):
                for vi, level in enumerate(levels):
                    fnames, feats = predictors(forecast, name, lead, level, extra)
                    want = [str(f) for f in model[f"{name}_feature"].values]
                    if fnames != want:
                        raise ValueError(f"DRN model features {want} differ from the forecast's {fnames}")
                    base = {"prediction_timedelta": lead, **({"level": level} if level is not None else {})}
                    dates = forecast["time"].values if rolling else [None]
                    for ti, date in enumerate(dates):
                        sel = {**base, **({"time": date} if rolling else {})}
                        rows = [ti] if rolling else slice(None)
                        m, s = _apply_one(model, name, sel, feats[rows], site_index)
                        idx = (rows, li, *([vi] if level is not None else []))
                        mu_a[idx] = m.reshape(mu_a[idx].shape)
                        sd_a[idx] = s.reshape(sd_a[idx].shape)
            coords = {d: forecast[d] for d in dims if d in forecast.coords}
            coords.update({c: forecast[c] for c in forecast.coords if set(forecast[c].dims) <= set(sp)})
            if levels[0] is not None:
                coords["level"] = np.asarray(levels)
            mu_out[name] = xr.DataArray(mu_a, dims=dims, coords=coords, attrs=x.attrs)
            sd_out[name] = xr.DataArray(sd_a, dims=dims, coords=coords, attrs=x.attrs)
    finally:
        torch.set_num_threads(threads)
    return mu_out, sd_out


def _apply_one(model: xr.Dataset, name: str, sel: dict[str, Any], feats: np.ndarray,
               site_index: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """(μ, σ) (T, P) physical of features (T, P, F) with the networks at ``sel``, seeds averaged."""
    p = _params_at(model, name, sel)
    emb = np.asarray(model[f"{name}_embedding"].sel(sel).values, np.float32)  # (S, *space, E)
    s_n, e_n = emb.shape[0], emb.shape[-1]
    emb = emb.reshape(s_n, -1, e_n)
    if site_index is not None:
        mean_e = emb.mean(1, keepdims=True)
        emb = np.where((site_index >= 0)[None, :, None], emb[:, np.maximum(site_index, 0)], mean_e)
    p["emb"] = torch.from_numpy(np.ascontiguousarray(emb))
    mean = np.asarray(model[f"{name}_feature_mean"].sel(sel).values, np.float64)
    scale = np.asarray(model[f"{name}_feature_scale"].sel(sel).values, np.float64)
    t_n, p_n, _ = feats.shape
    x = ((feats - mean) / scale).reshape(t_n * p_n, -1)
    ok = np.isfinite(x).all(-1)
    xt = torch.from_numpy(np.where(ok[:, None], x, 0.0).astype(np.float32))
    loc = torch.arange(p_n).repeat(t_n)
    with torch.no_grad():
        mu, sigma = _forward(p, xt[None].expand(s_n, -1, -1), loc[None].expand(s_n, -1))
    mu = mu.double().mean(0).numpy() * scale[0] + mean[0]
    sigma = sigma.double().mean(0).numpy() * scale[0]
    return (np.where(ok, mu, np.nan).reshape(t_n, p_n), np.where(ok, sigma, np.nan).reshape(t_n, p_n))


def _fields(model: xr.Dataset) -> list[str]:
    return str(model.attrs["fields"]).split()


def settings_of(model: xr.Dataset) -> DRNSettings:
    """The :class:`DRNSettings` recorded in a model's attributes (:meth:`~.options.Settings.recorded`)."""
    return DRNSettings.recorded(model.attrs)


__all__ = ["KIND", "DRNSettings", "apply_drn", "covariates", "fit_drn", "predictors", "read_drn_model", "settings_of",
           "site_positions", "with_static", "write_drn_model"]


def site_positions(attrs: dict[str, Any], forecast: xr.Dataset) -> tuple[np.ndarray | None, list[str]]:
    """(per forecast site its index in the model's sites or −1, the new station ids) for site forecasts."""
    if "site" not in forecast.dims:
        return None, []
    pos = {str(s): i for i, s in enumerate(attrs["station_id"])}
    ids = [str(s) for s in forecast["station_id"].values]
    idx = np.array([pos.get(s, -1) for s in ids], np.int64)
    return idx, [s for s, i in zip(ids, idx) if i < 0]
