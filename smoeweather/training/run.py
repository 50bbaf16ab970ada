"""``smoe train --config X [--init-from CKPT] [--resume CKPT] key=value ...``: one entry for every task.

A config names ``task`` (``weatherbench``, ``ens10`` or ``heat``) and has the blocks ``data``, ``model``,
``training`` (lr, plateau, early stopping, aux_weight, freeze_batchnorm), ``trainer`` (passed as-is to
``lightning.Trainer``: devices, num_nodes, strategy, accelerator, max_epochs, precision, ...), ``seed`` and
``output_dir``. Outputs (rank 0 only): ``<output_dir>/checkpoints/{best-*,last}.ckpt``, ``config.yaml``
(the resolved config) and CSV logs under ``<output_dir>/logs``.

Data stores are created when missing and the config says how: ``data.world`` (the embedded default
world, :func:`pipelines.world.generate_world` arguments), ``data.sources`` (canonical netCDF files, e.g.
the GCM world, merged along time) or ``data.generate`` (heat diffusion).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import torch
import xarray as xr
from lightning.pytorch.callbacks import EarlyStopping, ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger
from lightning.pytorch.utilities import rank_zero_only
from torch import nn
from torch.utils.data import Dataset, Subset

from smoeweather.config import load_config
from smoeweather.training.base import SMoETrainingModule, check_checkpoint
from smoeweather.training.callbacks import BatchSeed, LastCheckpoint, SamplesPerSecond, SaveResolvedConfig
from smoeweather.training.datamodule import SplitDataModule
from smoeweather.training.diagnostics import RoutingDiagnostics
from smoeweather.training.regression import FieldRegressionModule
from smoeweather.training.schema import validate_train_config
from smoeweather.training.vision import build_vision

TASKS = ("weatherbench", "ens10", "heat", "vision")
SPLITS = ("train", "valid", "test")
NORMALISATION_BUFFERS = ("input_mean", "input_std", "target_mean", "target_std")


@dataclass
class TrainResult:
    """What :func:`train` leaves behind."""

    trainer: L.Trainer
    module: L.LightningModule
    datamodule: SplitDataModule
    output_dir: Path
    best_checkpoint: str
    last_checkpoint: str


# ---- data ------------------------------------------------------------------------------------------
def ensure_store(dcfg: dict[str, Any]) -> str:
    """Path of ``dcfg['store']``, creating it first when missing and ``world``/``sources`` say how."""
    store = Path(dcfg["store"])
    if store.exists():
        return str(store)
    if dcfg.get("world"):
        from pipelines.world import generate_world

        world = dict(dcfg["world"] or {})
        if "years" in world:
            world["years"] = tuple(world["years"])
        if world.get("train_years") is not None:
            world["train_years"] = tuple(world["train_years"])
        generate_world(store, progress=False, **world)
    elif dcfg.get("sources"):
        from pipelines.prepare import write_store

        files = [str(Path(f).expanduser()) for f in dcfg["sources"]]
        train_years = dcfg.get("statistics_years")

        def make() -> xr.Dataset:
            ds = xr.open_mfdataset(
                files,
                combine="nested",
                concat_dim="time",
                data_vars="minimal",
                coords="minimal",
                compat="override",
                chunks={},
            )
            keep = [v for v in dcfg.get("store_variables", list(ds.data_vars)) if v in ds.data_vars]
            return ds[keep]

        write_store(
            make,
            store,
            args={"kind": "netcdf", "sources": files, "train_years": train_years},
            train_years=tuple(train_years) if train_years else None,
            source=", ".join(files),
            scheduler="threads",
            progress=False,
        )
    else:
        raise FileNotFoundError(
            f"data store {store} does not exist and the config has no data.world or "
            "data.sources to create it (see `smoe data world` / `smoe data prepare`)"
        )
    return str(store)


def time_subset(dataset: Any, period: list[str] | tuple[str, str]) -> Subset:
    """Samples of a WeatherBench/ENS-10 dataset whose init time ≥ start and valid time ≤ end (inclusive)."""
    start, end = np.datetime64(str(period[0])), np.datetime64(str(period[1]))
    valid = getattr(dataset, "valid_time", dataset.init_time)
    keep = [i for i in range(len(dataset)) if dataset.init_time(i) >= start and valid(i) <= end]
    if not keep:
        raise ValueError(f"no samples between {start} and {end} in {dataset.store}")
    return Subset(dataset, keep)


def _years(value: Any) -> tuple[int, int] | None:
    return None if value is None else (int(value[0]), int(value[-1]))


def _splits(dcfg: dict[str, Any], make: Callable[[tuple[int, int] | None], Dataset]) -> dict[str, Dataset]:
    """One dataset per split from ``<split>_years`` and an optional ``<split>_period`` [start, end]."""
    out = {}
    for split in SPLITS:
        period = dcfg.get(f"{split}_period")
        years = _years(dcfg.get(f"{split}_years"))
        if period is not None and years is None:
            years = (int(str(period[0])[:4]), int(str(period[1])[:4]))
        ds = make(years)
        out[split] = time_subset(ds, period) if period is not None else ds
    return out


def base_dataset(ds: Dataset) -> Any:
    """The underlying dataset of a (possibly nested) Subset."""
    while isinstance(ds, Subset):
        ds = ds.dataset
    return ds


def land_sea_mask(store: str) -> torch.Tensor:
    """(H, W) land fraction of a prepared store."""
    with xr.open_zarr(store) as ds:
        return torch.as_tensor(ds["land_sea_mask"].values.astype(np.float32))


def _uses_land_sea_prior(mcfg: dict[str, Any]) -> bool:
    smoe = mcfg.get("smoe")
    return isinstance(smoe, dict) and smoe.get("gate_prior") == "land_sea" and smoe.get("placement") != "none"


def _module_kwargs(cfg: dict[str, Any]) -> dict[str, Any]:
    t = cfg.get("training", {})
    return {
        "lr": float(t.get("lr", 1e-3)),
        "plateau_factor": float(t.get("plateau_factor", 0.2)),
        "plateau_patience": int(t.get("plateau_patience", 2)),
        "aux_weight": float(t.get("aux_weight", 0.01)),
        "freeze_batchnorm": bool(t.get("freeze_batchnorm", False)),
        "optimizer": str(t.get("optimizer", "adam")),
    }


def _stats_metadata(model: nn.Module) -> dict[str, list[float]]:
    return {name: getattr(model, name).flatten().tolist() for name in NORMALISATION_BUFFERS}


def _datamodule(cfg: dict[str, Any], splits: Callable[[], dict[str, Dataset]], default_batch: int,
                **kwargs: Any) -> SplitDataModule:
    """The seeded train/valid/test data module every task uses (batch size and workers from ``cfg["data"]``)."""
    dcfg = cfg["data"]
    return SplitDataModule(splits, batch_size=dcfg.get("batch_size", default_batch), seed=cfg.get("seed", 0),
                           num_workers=dcfg.get("num_workers", 0), **kwargs)


def build_weatherbench(cfg: dict[str, Any]) -> tuple[SplitDataModule, SMoETrainingModule]:
    """WeatherBench-style forecasting: data module and :class:`ForecastingModule` from a config."""
    from smoeweather.data.weather import WeatherBenchDataset
    from smoeweather.models.registry import build_weather_model
    from smoeweather.training.forecasting import ForecastingModule, normalized_model

    dcfg = dict(cfg["data"])
    store = ensure_store(dcfg)
    keys = ("target_variables", "input_offsets_h", "lead_h", "lead_choices_h", "constants")
    kwargs = {k: dcfg[k] for k in keys if k in dcfg}

    def make(years: tuple[int, int] | None) -> Dataset:
        from smoeweather.data.cache import cache_from_config  # data.cache: in-memory time block

        return cache_from_config(WeatherBenchDataset(store, dcfg["variables"], years=years, **kwargs), dcfg)

    data = _datamodule(cfg, lambda: _splits(dcfg, make), default_batch=32)
    train_ds = base_dataset(data.dataset("train"))
    mcfg = dict(cfg["model"])
    mcfg.setdefault("in_channels", len(train_ds.channel_names))
    mcfg.setdefault("out_channels", len(train_ds.target_names))
    mcfg.setdefault("grid", list(train_ds.grid))
    prior = land_sea_mask(store) if _uses_land_sea_prior(mcfg) else None
    model = normalized_model(build_weather_model(mcfg, land_sea_prior=prior), train_ds)
    metadata = {
        "task": "weatherbench",
        "config": cfg,
        "channel_names": train_ds.channel_names,
        "target_names": train_ds.target_names,
        "latitude": train_ds.latitude.tolist(),
        "longitude": train_ds.longitude.tolist(),
        "normalisation": _stats_metadata(model),
    }
    module = ForecastingModule(
        model, train_ds.latitude, train_ds.target_names, metadata=metadata, **_module_kwargs(cfg)
    )
    return data, module


def build_ens10(cfg: dict[str, Any]) -> tuple[SplitDataModule, SMoETrainingModule]:
    """ENS-10 post-processing: data module and :class:`PostprocessingModule` from a config."""
    from smoeweather.data.ens10 import Ens10Dataset
    from smoeweather.models.registry import build_weather_model
    from smoeweather.training.postprocessing import PostprocessingModule, postprocessor_for

    dcfg = dict(cfg["data"])
    store = ensure_store(dcfg)

    def make(years: tuple[int, int] | None) -> Dataset:
        return Ens10Dataset(store, dcfg["variables"], dcfg.get("target_variables"), years=years)

    data = _datamodule(cfg, lambda: _splits(dcfg, make), default_batch=8)
    train_ds = base_dataset(data.dataset("train"))
    mcfg = dict(cfg["model"])
    mcfg.setdefault("in_channels", len(train_ds.channel_names))
    mcfg.setdefault("grid", list(train_ds.grid))
    model = postprocessor_for(build_weather_model(mcfg), train_ds)
    metadata = {
        "task": "ens10",
        "config": cfg,
        "channel_names": train_ds.channel_names,
        "target_names": train_ds.target_names,
        "normalisation": _stats_metadata(model),
    }
    return data, PostprocessingModule(model, metadata=metadata, **_module_kwargs(cfg))


def build_heat(cfg: dict[str, Any]) -> tuple[SplitDataModule, L.LightningModule]:
    """Heat diffusion (paper §3.1): data module and :class:`FieldRegressionModule` from a config."""
    from pipelines.heat_diffusion import generate
    from smoeweather.data.heat import _batched, heat_splits
    from smoeweather.models.heat import build_heat_model

    dcfg = dict(cfg["data"])
    store = Path(dcfg["store"])
    if not store.exists():
        if "generate" not in dcfg:
            raise FileNotFoundError(
                f"heat store {store} does not exist (add data.generate or run `smoe heat generate`)"
            )
        generate(store, progress=False, **dcfg["generate"])
    data = _datamodule(cfg, lambda: heat_splits(store, dcfg.get("max_runs")), default_batch=32, collate_fn=_batched)
    size = int(data.dataset("train").frames.shape[-1])
    mcfg = dict(cfg.get("model", {}))
    net = build_heat_model(mcfg.pop("name", "smoe"), size=size, **mcfg)
    t = _module_kwargs(cfg)
    module = FieldRegressionModule(
        net,
        lr=t["lr"],
        plateau_factor=t["plateau_factor"],
        plateau_patience=t["plateau_patience"],
        aux_weight=t["aux_weight"],
        optimizer=t["optimizer"],
        metadata={"task": "heat", "config": cfg},
    )
    return data, module


BUILDERS: dict[str, Callable[[dict[str, Any]], tuple[SplitDataModule, L.LightningModule]]] = {
    "weatherbench": build_weatherbench,
    "ens10": build_ens10,
    "heat": build_heat,
    "vision": build_vision,
}


# ---- weights from another run ----------------------------------------------------------------------
@dataclass
class InitReport:
    """What :func:`init_weights` loaded and what it skipped (tensor names of the model)."""

    loaded: list[str] = field(default_factory=list)
    shape_mismatch: list[str] = field(default_factory=list)
    kept_normalisation: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        lines = [f"loaded {len(self.loaded)} tensors"]
        for label, names in (
            ("skipped (shape differs)", self.shape_mismatch),
            ("kept from the new data (normalisation)", self.kept_normalisation),
            ("not in the checkpoint (fresh init)", self.missing),
            ("in the checkpoint but not in the model", self.unexpected),
        ):
            if names:
                lines.append(f"{label}: {', '.join(names)}")
        return "; ".join(lines)


def init_weights(model: nn.Module, checkpoint_path: str | Path) -> InitReport:
    """Load the weights of a ``smoe train`` checkpoint into ``model`` where names and shapes match.

    The normalisation buffers are NOT taken over: the model keeps the statistics of the data it will be
    trained on (e.g. ERA5 after CMIP6 pretraining). Everything else that does not fit is reported.
    """
    ckpt = torch.load(checkpoint_path, map_location="cpu", weights_only=False)
    check_checkpoint(ckpt, str(checkpoint_path))
    source = {k[len("model.") :]: v for k, v in ckpt["state_dict"].items() if k.startswith("model.")}
    own = model.state_dict()
    report, load = InitReport(), {}
    for name, value in source.items():
        if name.split(".")[-1] in NORMALISATION_BUFFERS and name.count(".") == 0:
            report.kept_normalisation.append(name)
        elif name not in own:
            report.unexpected.append(name)
        elif own[name].shape != value.shape:
            report.shape_mismatch.append(f"{name} {tuple(value.shape)}→{tuple(own[name].shape)}")
        else:
            load[name] = value
            report.loaded.append(name)
    report.missing = sorted(set(own) - set(source))
    model.load_state_dict(load, strict=False)
    return report


# ---- training --------------------------------------------------------------------------------------
def build_trainer(
    cfg: dict[str, Any],
    output_dir: Path,
    batch_size_fn: Callable[[Any], int] | None = None,
    extra_callbacks: list[L.Callback] | None = None,
) -> L.Trainer:
    """A Lightning Trainer from ``cfg['trainer']`` with best/last checkpoints, early stopping, per-batch
    reseeding, throughput logging and the resolved config file."""
    t = cfg.get("training", {})
    checkpoint = ModelCheckpoint(
        dirpath=output_dir / "checkpoints",
        filename="best-{epoch:03d}",
        monitor="val_loss",
        mode="min",
        save_top_k=1,
        save_last=False,  # LastCheckpoint writes last.ckpt after EVERY epoch (save_last only with a new best)
    )
    callbacks: list[L.Callback] = [
        checkpoint,
        LastCheckpoint(output_dir / "checkpoints"),
        # checked after each validation only: a fit that ends inside an epoch (trainer.max_steps) has no new
        # val_loss at that epoch's end, which crashed the default train-epoch-end check
        EarlyStopping(monitor="val_loss", mode="min", patience=int(t.get("early_stopping_patience", 5)),
                      check_on_train_epoch_end=False),
        BatchSeed(int(cfg.get("seed", 0))),
        SamplesPerSecond(batch_size_fn),
        SaveResolvedConfig(cfg, output_dir),
        RoutingDiagnostics(),
        *(extra_callbacks or []),
    ]
    tcfg = {"enable_model_summary": False, **cfg.get("trainer", {})}
    return L.Trainer(
        default_root_dir=output_dir, callbacks=callbacks, logger=CSVLogger(output_dir, name="logs"), **tcfg
    )


def build(cfg: dict[str, Any]) -> tuple[SplitDataModule, L.LightningModule]:
    """(data module, Lightning module) for ``cfg['task']``."""
    task = cfg.get("task")
    if task not in BUILDERS:
        raise ValueError(f"config task must be one of {TASKS}, got {task!r}")
    return BUILDERS[task](cfg)


def train(
    cfg: dict[str, Any],
    init_from: str | Path | None = None,
    resume: str | Path | None = None,
    extra_callbacks: list[L.Callback] | None = None,
) -> TrainResult:
    """Seed, build, optionally initialise from ``init_from``, and fit (resuming from ``resume``)."""
    cfg = json.loads(json.dumps(cfg, default=str))  # plain types only (YAML dates → strings): safe to pickle
    validate_train_config(cfg)  # unknown keys / wrong types: an error, not silently ignored
    seed = int(cfg.get("seed", 0))
    L.seed_everything(seed, workers=True, verbose=False)
    output_dir = Path(cfg.get("output_dir") or f"runs/{cfg.get('task')}")
    data, module = build(cfg)
    if init_from is not None:
        report = init_weights(module.model, init_from)
        module.metadata["init_from"] = str(init_from)
        rank_zero_only(print)(f"smoe train: initialised from {init_from}: {report}")
    trainer = build_trainer(cfg, output_dir, extra_callbacks=extra_callbacks)
    trainer.fit(module, datamodule=data, ckpt_path=str(resume) if resume is not None else None)
    checkpoint = trainer.checkpoint_callback
    last = next(c for c in trainer.checkpoint_callbacks if isinstance(c, LastCheckpoint))
    return TrainResult(trainer, module, data, output_dir, checkpoint.best_model_path, last.last_model_path)


def run_cli(args: argparse.Namespace) -> int:
    """The ``smoe train`` verb."""
    cfg = load_config(args.config, list(args.overrides or []))
    result = train(cfg, init_from=args.init_from, resume=args.resume)
    if result.trainer.is_global_zero:
        print(f"smoe train: best checkpoint {result.best_checkpoint}; last {result.last_checkpoint}")
    return 0
