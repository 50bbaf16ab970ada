"""Load a trained model from a ``smoe train`` checkpoint: the one public way ``forecast``, ``evaluate``,
``postprocess`` and ``plot`` get at a trained network.

The module is rebuilt from the checkpoint's saved config and metadata, then the saved weights (and the
normalisation buffers, i.e. the training data's statistics) are loaded into it. WeatherBench checkpoints
are rebuilt without touching any data store: channel names, grid and statistics all travel in the
checkpoint, so a model can run on a store it never saw (another year, another machine). Post-processing
(``postprocess``/``ens10``) checkpoints likewise carry their statistics, static maps and grid. Heat and vision
checkpoints go through their task builders in :mod:`smoeweather.training.tasks` (which open the training
data named in the config).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lightning as L
import torch
from torch import nn

from smoeweather.models.checkpoint_io import read_checkpoint
from smoeweather.training.base import METADATA_KEY, CheckpointFormatError, check_checkpoint

__all__ = ["TrainedModel", "load_trained", "file_sha256"]


@dataclass
class TrainedModel:
    """A trained model loaded by :func:`load_trained` (both modules in eval mode, on ``map_location``)."""

    path: Path
    sha256: str
    task: str
    config: dict[str, Any]
    module: L.LightningModule
    model: nn.Module
    metadata: dict[str, Any] | None = None

    @property
    def target_names(self) -> list[str]:
        """Names of the predicted fields (e.g. ``geopotential_500``), from the checkpoint metadata."""
        return list((self.metadata or {}).get("target_names", []))

    @property
    def channel_names(self) -> list[str]:
        """Names of the input channels in order (e.g. ``geopotential_500@-12h``, ``land_sea_mask``)."""
        return list((self.metadata or {}).get("channel_names", []))


def file_sha256(path: str | Path, chunk: int = 1 << 20) -> str:
    """Hex SHA-256 of a file's bytes (provenance of forecasts and scores)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def _postprocess_module(meta: dict[str, Any]) -> L.LightningModule:
    """PostprocessingModule from checkpoint metadata alone (the static maps and gate scores are restored from
    the state_dict; no ensemble file is opened)."""
    from smoeweather.models.registry import build_weather_model
    from smoeweather.training.postprocessing import EnsemblePostprocessor, PostprocessingModule
    from smoeweather.training.tasks import _module_kwargs

    cfg = meta["config"]
    grid = (len(meta["latitude"]), len(meta["longitude"]))
    targets, static = list(meta["target_names"]), list(meta.get("static_names", []))
    mcfg = dict(cfg["model"])
    mcfg.setdefault("in_channels", len(meta["channel_names"]))
    mcfg.setdefault("out_channels", 2 * len(targets))
    mcfg.setdefault("grid", list(grid))
    prior = torch.zeros(grid) if mcfg.get("gate_prior") == "land_sea" and mcfg.get("smoe") else None
    net = build_weather_model(mcfg, land_sea_prior=prior)
    model = EnsemblePostprocessor(net, torch.zeros(len(static), *grid), len(targets))
    stats = meta["stats"]
    target_std = [float(stats[n.split("@")[0]][1]) for n in targets]
    metadata = {k: v for k, v in meta.items() if k != "format_version"}
    return PostprocessingModule(model, targets, target_std, metadata=metadata, **_module_kwargs(cfg))


def _weatherbench_module(meta: dict[str, Any]) -> L.LightningModule:
    """ForecastingModule from checkpoint metadata alone (no data store is opened)."""
    from smoeweather.models.registry import build_weather_model
    from smoeweather.models.resnet import NormalizedModel
    from smoeweather.training.forecasting import ForecastingModule
    from smoeweather.training.tasks import _module_kwargs, _uses_land_sea_prior

    cfg = meta["config"]
    channels, targets = list(meta["channel_names"]), list(meta["target_names"])
    latitude, longitude = list(meta["latitude"]), list(meta["longitude"])
    mcfg = dict(cfg["model"])
    mcfg.setdefault("in_channels", len(channels))
    mcfg.setdefault("out_channels", len(targets))
    mcfg.setdefault("grid", [len(latitude), len(longitude)])
    # The gate scores are trained parameters restored from the state_dict below; the builder only needs
    # some (H, W) map of the right shape to construct a land-sea-prior model.
    prior = torch.zeros(len(latitude), len(longitude), dtype=torch.long) if _uses_land_sea_prior(mcfg) else None
    net = build_weather_model(mcfg, land_sea_prior=prior)
    stats = meta.get("normalisation") or {}
    n_in, n_out = int(mcfg["in_channels"]), int(mcfg["out_channels"])
    model = NormalizedModel(
        net,
        torch.as_tensor(stats.get("input_mean", [0.0] * n_in), dtype=torch.float32),
        torch.as_tensor(stats.get("input_std", [1.0] * n_in), dtype=torch.float32),
        torch.as_tensor(stats.get("target_mean", [0.0] * n_out), dtype=torch.float32),
        torch.as_tensor(stats.get("target_std", [1.0] * n_out), dtype=torch.float32),
    )
    metadata = {k: v for k, v in meta.items() if k != "format_version"}
    return ForecastingModule(model, latitude, targets, metadata=metadata, **_module_kwargs(cfg))


def load_trained(path: str | Path, map_location: str | torch.device = "cpu") -> TrainedModel:
    """Rebuild and load a ``smoe train`` checkpoint (any task) for inference.

    The file is read as data (:func:`smoeweather.models.checkpoint_io.read_checkpoint`): nothing in it runs.
    Raises FileNotFoundError for a missing file, UnsafeCheckpointError (a ValueError) for a file holding
    anything but tensors and plain metadata, and ValueError (naming the file) for a file that is not a
    smoeweather checkpoint of this format version or whose weights do not fit the rebuilt model.
    """
    path = Path(path)
    ckpt = read_checkpoint(path)  # data only: refuses a pickle that would run code (UnsafeCheckpointError)
    if "state_dict" not in ckpt:
        raise ValueError(f"{path} is not a Lightning checkpoint (no state_dict)")
    meta = check_checkpoint(ckpt, str(path))
    task, cfg = meta.get("task"), meta.get("config")
    if not isinstance(cfg, dict):
        raise CheckpointFormatError(f"{path}: the smoeweather metadata holds no config")
    if task == "weatherbench" and all(k in meta for k in ("channel_names", "target_names", "latitude", "longitude")):
        module = _weatherbench_module(meta)
    elif task in ("postprocess", "ens10") and "spec" in meta:
        module = _postprocess_module(meta)
    else:
        from smoeweather.training.tasks import TASKS, build

        if task not in TASKS:
            raise CheckpointFormatError(f"{path}: unknown task {task!r}; expected one of {TASKS}")
        _, module = build(dict(cfg, task=task))
    try:
        module.load_state_dict(ckpt["state_dict"])
    except RuntimeError as err:
        raise ValueError(f"{path}: weights do not fit the model rebuilt from its config: {err}") from err
    module = module.to(map_location).eval()
    return TrainedModel(
        path=path,
        sha256=file_sha256(path),
        task=str(task),
        config=cfg,
        module=module,
        model=module.model.eval(),
        metadata=dict(ckpt[METADATA_KEY]),
    )
