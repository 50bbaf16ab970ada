"""Task builders of ``smoe train``: config → (:class:`SplitDataModule`, LightningModule) per ``task``.

Each task registers itself (:mod:`smoeweather.training.registry`): ``weatherbench``, ``postprocess`` and ``heat``
here, ``vision`` in :mod:`smoeweather.vision.task` (the old name ``ens10`` of ``postprocess`` is read with a
DeprecationWarning, :data:`smoeweather.models.loader.TASK_ALIASES`);
the config schema of each task lives in :mod:`smoeweather.training.schema`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import lightning as L
import torch
from torch import nn
from torch.utils.data import Dataset

from smoeweather.models.card import card_metadata
from smoeweather.models.loader import canonical_task, complete_model_config
from smoeweather.training.base import SMoETrainingModule
from smoeweather.training.blocks import training_settings
from smoeweather.training.datamodule import SplitDataModule
from smoeweather.training.init import NORMALISATION_BUFFERS
from smoeweather.training.registry import register_task, task
from smoeweather.training.regression import FieldRegressionModule
from smoeweather.training.settings import TrainConfig
from smoeweather.training.stores import base_dataset, ensure_store, land_sea_mask, year_splits


def _stats_metadata(model: nn.Module) -> dict[str, list[float]]:
    return {name: getattr(model, name).flatten().tolist() for name in NORMALISATION_BUFFERS}


def _units(*datasets: Any) -> dict[str, str]:
    """``{variable: units}`` of the data variables of ``datasets`` (None entries skipped; the first wins)."""
    out: dict[str, str] = {}
    for ds in reversed([d for d in datasets if d is not None]):
        out.update({str(n): str(ds[n].attrs.get("units", "")) for n in ds.data_vars})
    return out


def _weatherbench_card(train_ds: Any, store: str, prior: torch.Tensor | None) -> dict[str, Any]:
    """The model card of a forecasting network (:func:`~smoeweather.models.card.card_metadata`) trained on
    ``store`` through ``train_ds`` (a :class:`~smoeweather.data.weather.WeatherBenchDataset`)."""
    import xarray as xr

    fields = [*train_ds.variables, *train_ds.target_variables, *((c, None) for c in train_ds.constants)]
    with xr.open_zarr(store) as ds:
        attrs = dict(ds.attrs)
    return card_metadata(fields, train_ds.units, train_ds.leads_h, train_ds.continuous, prior, store, attrs)


def _datamodule(cfg: TrainConfig, splits: Callable[[], dict[str, Dataset]], default_batch: int,
                **kwargs: Any) -> SplitDataModule:
    """The seeded train/valid/test data module every task uses (``cfg.loader``: batch size and workers)."""
    loader = cfg.loader
    batch = default_batch if loader.batch_size is None else loader.batch_size
    return SplitDataModule(splits, batch_size=batch, seed=cfg.seed, num_workers=loader.num_workers,
                           sampler=loader.sampler, block_size=loader.block_size, **kwargs)


def build_weatherbench(config: TrainConfig | Mapping[str, Any]) -> tuple[SplitDataModule, SMoETrainingModule]:
    """WeatherBench-style forecasting: data module and :class:`ForecastingModule` from a config."""
    from smoeweather.data.weather import WeatherBenchDataset
    from smoeweather.models.weather import build_weather_model
    from smoeweather.training.ensemble_forecasting import build_forecasting_module
    from smoeweather.training.forecasting import normalized_model

    cfg = TrainConfig.from_dict(config)
    dcfg = dict(cfg.data)
    store = ensure_store(dcfg)
    keys = ("target_variables", "input_offsets_h", "lead_h", "lead_choices_h", "constants")
    kwargs = {k: dcfg[k] for k in keys if k in dcfg}

    def make(years: tuple[int, int] | None) -> Dataset:
        from smoeweather.data.cache import cache_from_config  # data.cache: in-memory time block

        return cache_from_config(WeatherBenchDataset(store, dcfg["variables"], years=years, **kwargs), dcfg)

    data = _datamodule(cfg, lambda: year_splits(dcfg, make), default_batch=32)
    train_ds = base_dataset(data.dataset("train"))
    mcfg = complete_model_config(cfg.model.to_dict(), len(train_ds.channel_names), len(train_ds.target_names),
                                 train_ds.grid)
    prior = land_sea_mask(store) if cfg.model.uses_land_sea_prior else None
    model = normalized_model(build_weather_model(mcfg, land_sea_prior=prior), train_ds)
    metadata = {
        "task": "weatherbench",
        "config": cfg.to_dict(),
        "channel_names": train_ds.channel_names,
        "target_names": train_ds.target_names,
        "latitude": train_ds.latitude.tolist(),
        "longitude": train_ds.longitude.tolist(),
        "normalisation": _stats_metadata(model),
        **_weatherbench_card(train_ds, store, prior),
    }
    module = build_forecasting_module(  # ForecastingModule, or the ensemble one for e3/deep_ensemble/gaussian
        cfg.model.to_dict(), cfg.training, model, train_ds.latitude, train_ds.target_names, metadata
    )
    return data, module


def build_postprocess(config: TrainConfig | Mapping[str, Any]) -> tuple[SplitDataModule, SMoETrainingModule]:
    """Ensemble post-processing (task ``postprocess``): data module and
    :class:`PostprocessingModule` from a config.

    ``data.source`` (or ``data.store``): any ensemble source(s) of
    :func:`~smoeweather.data.forecast_stores.open_ensemble`; ``data.truth``: truth store (default: the truth inside
    the source); ``data.static``: static
    inputs (``land_sea_mask``, ``orography``, ``latitude``) from ``data.constants`` or the source; splits by
    ``<split>_years`` / ``<split>_period`` on initialisation times (a period also bounds the valid times).
    """
    from smoeweather.data.ensemble_dataset import EnsembleDataset, EnsembleSpec, static_channels
    from smoeweather.data.forecast_stores import open_ensemble, open_static, open_truth, select_split
    from smoeweather.models.postprocess_network import EnsemblePostprocessor
    from smoeweather.models.weather import build_weather_model
    from smoeweather.training.postprocess_network import PostprocessingModule

    cfg = TrainConfig.from_dict(config)
    dcfg = dict(cfg.data)
    source = dcfg.get("source") or dcfg.get("store")
    if not source:
        raise ValueError("a postprocess config needs data.source (ensemble file(s) or store)")
    if dcfg.get("store") and not dcfg.get("source"):
        ensure_store(dcfg)
    if dcfg.get("source"):
        from smoeweather.data.paths import check_data_files

        check_data_files("data.source", dcfg["source"])
    forecast = open_ensemble(source)
    spec = EnsembleSpec.from_config(dcfg, forecast)
    truth_all = open_truth(dcfg.get("truth"), source)
    cache = dcfg.get("cache", True)

    def make(split: str, stats: dict[str, tuple[float, float]] | None) -> EnsembleDataset:
        fc, truth = select_split(forecast, truth_all, spec.leads_h, spec.target_variables, split,
                                 dcfg.get(f"{split}_years"), dcfg.get(f"{split}_period"), str(source))
        return EnsembleDataset(fc, truth, spec, stats=stats, cache=bool(cache), source=str(source))

    built: dict[str, EnsembleDataset] = {"train": make("train", None)}
    train_ds = built["train"]

    def splits() -> dict[str, Dataset]:
        for split in ("valid", "test"):
            if split not in built:
                built[split] = make(split, train_ds.stats)
        return dict(built)

    data = _datamodule(cfg, splits, default_batch=8)
    static_names = list(dcfg.get("static") or [])
    wants_prior = cfg.model.uses_land_sea_prior
    file_static = [n for n in static_names if n != "latitude"] + (["land_sea_mask"] if wants_prior else [])
    file_static = list(dict.fromkeys(file_static))
    static = open_static(dcfg.get("constants") or source, file_static) if file_static else None
    channels, names = static_channels(static_names, static, train_ds.latitude, train_ds.longitude)
    prior = torch.as_tensor(static["land_sea_mask"].values, dtype=torch.float32) if wants_prior else None
    mcfg = complete_model_config(cfg.model.to_dict(), len(train_ds.channel_names) + len(names),
                                 2 * len(train_ds.target_names), train_ds.grid)
    net = build_weather_model(mcfg, land_sea_prior=prior)
    model = EnsemblePostprocessor(net, torch.from_numpy(channels), len(train_ds.target_names))
    metadata = {
        "task": cfg.task,
        "config": cfg.to_dict(),
        "spec": spec.to_config(),
        "stats": {k: list(v) for k, v in train_ds.stats.items()},
        "channel_names": train_ds.channel_names + names,
        "static_names": names,
        "target_names": train_ds.target_names,
        "latitude": train_ds.latitude.tolist(),
        "longitude": train_ds.longitude.tolist(),
        "members": train_ds.members,
        "train_inits": [str(train_ds.times[0])[:19], str(train_ds.times[-1])[:19]],
        **card_metadata([*spec.predictors, *spec.targets, *((n, None) for n in names)],
                        _units(forecast, static), spec.leads_h, spec.lead_as_input, prior, source, forecast.attrs),
    }
    target_std = [train_ds.stats[n.split("@")[0]][1] for n in train_ds.target_names]
    module = PostprocessingModule(model, train_ds.target_names, target_std, metadata=metadata,
                                  **cfg.training.module_kwargs())
    return data, module


def build_heat(config: TrainConfig | Mapping[str, Any]) -> tuple[SplitDataModule, L.LightningModule]:
    """Heat diffusion (paper §3.1): data module and :class:`FieldRegressionModule` from a config."""
    from pipelines.heat_diffusion import generate
    from smoeweather.heat.data import batched_pairs, heat_splits
    from smoeweather.heat.models import build_heat_model

    cfg = TrainConfig.from_dict(config)
    dcfg = dict(cfg.data)
    store = Path(dcfg["store"])
    if not store.exists():
        if "generate" not in dcfg:
            raise FileNotFoundError(
                f"heat store {store} does not exist (add data.generate or run `smoe heat generate`)"
            )
        generate(store, progress=False, **dcfg["generate"])
    data = _datamodule(cfg, lambda: heat_splits(store, dcfg.get("max_runs")), default_batch=32,
                       collate_fn=batched_pairs)
    size = int(data.dataset("train").frames.shape[-1])
    net = build_heat_model(cfg.model.name or "smoe", size=size, **cfg.model.params)
    module = FieldRegressionModule(net, metadata={"task": "heat", "config": cfg.to_dict()},
                                   **cfg.training.module_kwargs())
    return data, module


def _forecasting_module(meta: dict[str, Any], net: nn.Module) -> L.LightningModule:
    """The weather task's training module around a network rebuilt from a checkpoint's metadata."""
    from smoeweather.training.ensemble_forecasting import build_forecasting_module

    cfg = meta["config"]  # the checkpoint's config as written: a plain mapping
    metadata = {k: v for k, v in meta.items() if k != "format_version"}
    return build_forecasting_module(cfg["model"], training_settings(cfg), net, list(meta["latitude"]),
                                    list(meta["target_names"]), metadata)


def _postprocessing_module(meta: dict[str, Any], net: nn.Module) -> L.LightningModule:
    """The post-processing task's training module around a network rebuilt from a checkpoint's metadata."""
    from smoeweather.training.postprocess_network import PostprocessingModule

    metadata = {k: v for k, v in meta.items() if k != "format_version"}
    targets = list(meta["target_names"])
    target_std = [float(meta["stats"][n.split("@")[0]][1]) for n in targets]
    return PostprocessingModule(net, targets, target_std, metadata=metadata,
                                **training_settings(meta["config"]).module_kwargs())


register_task("weatherbench", build_weatherbench, _forecasting_module)
register_task("postprocess", build_postprocess, _postprocessing_module)
register_task("heat", build_heat)


def build(cfg: TrainConfig | Mapping[str, Any]) -> tuple[SplitDataModule, L.LightningModule]:
    """(data module, Lightning module) for ``cfg.task``, or the ``task`` of a config mapping as written (a
    deprecated alias is replaced, with a warning)."""
    if isinstance(cfg, TrainConfig):
        return task(cfg.task).build(cfg)
    name = canonical_task(cfg.get("task"))
    cfg = dict(cfg, task=name) if name is not None else cfg
    return task(name).build(cfg)
