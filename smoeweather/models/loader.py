"""Rebuild a trained network from a ``smoe train`` checkpoint with torch and the model code only (no Lightning).

A forecasting centre that applies a network needs the checkpoint, torch and :mod:`smoeweather.models`; the
training stack (Lightning, the data modules) is never imported. The file is read as data by
:func:`smoeweather.models.checkpoint_io.read_checkpoint` (the only reader; it refuses pickles that would run
code), the network is rebuilt from the checkpoint's own metadata (config, channel and target names, grid,
normalisation statistics) and the weights of the training module's ``model`` are loaded into it, strictly.

Networks rebuilt here (:data:`NETWORK_TASKS`): the forecast ResNet family of task ``weatherbench``
(:class:`~smoeweather.models.resnet.NormalizedModel` around the network of ``model.name``) and the
post-processing U-Net of task ``postprocess`` (:class:`~smoeweather.models.postprocess_network.EnsemblePostprocessor`).
Checkpoints of the other tasks (heat, vision) are loaded by :func:`smoeweather.training.checkpoint.load_trained`.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from smoeweather.models.checkpoint_io import METADATA_KEY, file_sha256, read_checkpoint
from smoeweather.models.ensemble import uses_land_sea_prior  # the one answer, for training and loading alike
from smoeweather.models.export_folder import is_export, read_export

__all__ = ["CheckpointFormatError", "TrainedNetwork", "check_checkpoint", "load_network", "file_sha256",
           "canonical_task", "FORMAT_VERSION", "METADATA_KEY", "NETWORK_TASKS", "TASK_ALIASES"]

FORMAT_VERSION = 1
"""Version of the ``checkpoint["smoeweather"]`` payload; bump it when the layout changes."""
NETWORK_TASKS = ("weatherbench", "postprocess")
"""Tasks whose networks :func:`load_network` rebuilds from the checkpoint alone."""
TASK_ALIASES = {"ens10": "postprocess"}
"""Deprecated task names still read from old configs and checkpoints (with a DeprecationWarning)."""


class CheckpointFormatError(ValueError):
    """A checkpoint was written by an incompatible version of smoeweather (or by something else)."""


def canonical_task(task: Any, where: str = "config") -> Any:
    """The task name, with a deprecated alias (:data:`TASK_ALIASES`) replaced and a DeprecationWarning."""
    if task in TASK_ALIASES:
        new = TASK_ALIASES[task]
        warnings.warn(f"{where}: task {task!r} is deprecated, it is the task {new!r} (write task: {new})",
                      DeprecationWarning, stacklevel=3)
        return new
    return task


def check_checkpoint(checkpoint: Mapping[str, Any], source: str = "checkpoint") -> dict[str, Any]:
    """The ``smoeweather`` metadata of a loaded checkpoint; CheckpointFormatError if absent or mismatched."""
    meta = checkpoint.get(METADATA_KEY)
    if not isinstance(meta, dict) or "format_version" not in meta:
        raise CheckpointFormatError(
            f"{source} has no smoeweather metadata (format_version); it was not written by `smoe train`"
        )
    if meta["format_version"] != FORMAT_VERSION:
        raise CheckpointFormatError(
            f"{source} has checkpoint format version {meta['format_version']}, this smoeweather reads "
            f"version {FORMAT_VERSION}; retrain or convert it with the smoeweather version that wrote it"
        )
    return meta


@dataclass
class TrainedNetwork:
    """A network rebuilt by :func:`load_network` (eval mode, on ``map_location``) and what came with it."""

    path: Path
    sha256: str
    task: str
    config: dict[str, Any]
    model: nn.Module
    metadata: dict[str, Any] = field(default_factory=dict)

    @property
    def target_names(self) -> list[str]:
        """Names of the predicted fields (e.g. ``geopotential_500``), from the checkpoint metadata."""
        return list(self.metadata.get("target_names", []))

    @property
    def channel_names(self) -> list[str]:
        """Names of the input channels in order (e.g. ``geopotential_500@-12h``, ``land_sea_mask``)."""
        return list(self.metadata.get("channel_names", []))


def complete_model_config(mcfg: Mapping[str, Any], in_channels: int, out_channels: int,
                          grid: tuple[int, int] | list[int]) -> dict[str, Any]:
    """``model`` block with ``in_channels``, ``out_channels`` and ``grid`` filled in where the config leaves
    them out (training, from the data; loading, from the checkpoint's metadata: the same numbers)."""
    out = dict(mcfg)
    out.setdefault("in_channels", int(in_channels))
    out.setdefault("out_channels", int(out_channels))
    out.setdefault("grid", [int(g) for g in grid])
    return out


def forecast_network(meta: Mapping[str, Any]) -> nn.Module:
    """The :class:`NormalizedModel` of a ``weatherbench`` checkpoint's metadata, before its weights are loaded.

    The gate scores of a land-sea-prior network are trained parameters restored with the weights; the builder
    only needs some (H, W) map of the right shape.
    """
    from smoeweather.models.resnet import NormalizedModel
    from smoeweather.models.weather import build_weather_model

    grid = (len(meta["latitude"]), len(meta["longitude"]))
    mcfg = complete_model_config(meta["config"]["model"], len(meta["channel_names"]), len(meta["target_names"]),
                                 grid)
    prior = torch.zeros(grid, dtype=torch.long) if uses_land_sea_prior(mcfg) else None
    net = build_weather_model(mcfg, land_sea_prior=prior)
    stats = meta.get("normalisation") or {}
    n_in, n_out = int(mcfg["in_channels"]), int(mcfg["out_channels"])
    return NormalizedModel(
        net,
        torch.as_tensor(stats.get("input_mean", [0.0] * n_in), dtype=torch.float32),
        torch.as_tensor(stats.get("input_std", [1.0] * n_in), dtype=torch.float32),
        torch.as_tensor(stats.get("target_mean", [0.0] * n_out), dtype=torch.float32),
        torch.as_tensor(stats.get("target_std", [1.0] * n_out), dtype=torch.float32),
    )


def postprocess_network(meta: Mapping[str, Any]) -> nn.Module:
    """The :class:`EnsemblePostprocessor` of a ``postprocess`` checkpoint's metadata, before its weights are
    loaded (the static maps and gate scores come with the weights; no ensemble file is opened)."""
    from smoeweather.models.postprocess_network import EnsemblePostprocessor
    from smoeweather.models.weather import build_weather_model

    grid = (len(meta["latitude"]), len(meta["longitude"]))
    targets, static = list(meta["target_names"]), list(meta.get("static_names", []))
    mcfg = complete_model_config(meta["config"]["model"], len(meta["channel_names"]), 2 * len(targets), grid)
    prior = torch.zeros(grid) if uses_land_sea_prior(mcfg) else None
    net = build_weather_model(mcfg, land_sea_prior=prior)
    return EnsemblePostprocessor(net, torch.zeros(len(static), *grid), len(targets))


_REQUIRED = {"weatherbench": ("channel_names", "target_names", "latitude", "longitude"),
             "postprocess": ("spec", "channel_names", "target_names", "latitude", "longitude", "stats")}


def network_task(meta: Mapping[str, Any], where: str) -> str | None:
    """The checkpoint's task if :func:`load_network` can rebuild its network from the metadata, else None."""
    task = canonical_task(meta.get("task"), where)
    if task in _REQUIRED and all(k in meta for k in _REQUIRED[task]):
        return str(task)
    return None


def rebuild_network(checkpoint: Mapping[str, Any], where: str, task: str | None = None
                    ) -> tuple[str, dict[str, Any], nn.Module]:
    """(task, metadata, network with its trained weights) of a checkpoint read by
    :func:`~smoeweather.models.checkpoint_io.read_checkpoint`; ``task``: its :func:`network_task` if already
    known. ValueError naming ``where`` for a checkpoint of another task, without a config, or whose weights do
    not fit the rebuilt network."""
    if "state_dict" not in checkpoint:
        raise ValueError(f"{where} is not a Lightning checkpoint (no state_dict)")
    meta = check_checkpoint(checkpoint, where)
    if not isinstance(meta.get("config"), dict):
        raise CheckpointFormatError(f"{where}: the smoeweather metadata holds no config")
    task = task or network_task(meta, where)
    if task is None:
        raise ValueError(f"{where}: a {meta.get('task')!r} checkpoint; only {NETWORK_TASKS} networks are rebuilt "
                         "without the training stack (use smoeweather.training.checkpoint.load_trained)")
    net = forecast_network(meta) if task == "weatherbench" else postprocess_network(meta)
    prefix = "model."
    state = {k[len(prefix):]: v for k, v in checkpoint["state_dict"].items() if k.startswith(prefix)}
    try:
        net.load_state_dict(state, strict=True)
    except RuntimeError as err:
        raise ValueError(f"{where}: weights do not fit the model rebuilt from its config: {err}") from err
    return task, dict(meta), net


def load_network(path: str | Path, map_location: str | torch.device = "cpu") -> TrainedNetwork:
    """Rebuild and load the network of a ``weatherbench`` or ``postprocess`` checkpoint, or of an export folder of
    ``smoe export`` (:mod:`smoeweather.models.export`), for inference.

    A checkpoint is read as data (:func:`~smoeweather.models.checkpoint_io.read_checkpoint`), an export from JSON
    and safetensors (:func:`~smoeweather.models.export.read_export`): nothing in either runs. ``sha256``: of the
    checkpoint file, or of the export's weights file. Raises FileNotFoundError for a missing file,
    UnsafeCheckpointError (a ValueError) for a file holding anything but tensors and plain metadata,
    CheckpointFormatError for a file not written by ``smoe train`` (this format version), and ValueError (naming
    the file) for another task or weights that do not fit.
    """
    path = Path(path)
    if is_export(path):
        checkpoint, sha256 = read_export(path)
    else:
        checkpoint = read_checkpoint(path)  # data only: refuses a pickle that would run code
        sha256 = file_sha256(path)
    task, meta, net = rebuild_network(checkpoint, str(path))
    return TrainedNetwork(path=path, sha256=sha256, task=task, config=dict(meta["config"]),
                          model=net.to(map_location).eval(), metadata=meta)
