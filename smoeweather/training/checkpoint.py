"""Load a trained model WITH its Lightning training module from a ``smoe train`` checkpoint (any task).

Inference does not need this: ``smoe forecast`` and ``smoe postprocess apply`` rebuild the bare network with
:func:`smoeweather.models.loader.load_network` (torch and the model code only). Here the network of a
``weatherbench`` or ``postprocess`` checkpoint comes from that same loader (one rebuild), wrapped in the task's
Lightning module; heat and vision checkpoints go through their task builders in
:mod:`smoeweather.training.tasks` (which open the training data named in the config). The file is read once, as
data (:func:`smoeweather.models.checkpoint_io.read_checkpoint`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lightning as L
import torch
from torch import nn

from smoeweather.models.checkpoint_io import read_checkpoint
from smoeweather.models.loader import (
    METADATA_KEY,
    CheckpointFormatError,
    canonical_task,
    check_checkpoint,
    file_sha256,
    network_task,
    rebuild_network,
)
from smoeweather.training.registry import task as registered_task

__all__ = ["TrainedModel", "load_trained"]


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


def load_trained(path: str | Path, map_location: str | torch.device = "cpu") -> TrainedModel:
    """Rebuild and load a ``smoe train`` checkpoint (any task) with its training module.

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
    cfg = meta.get("config")
    if not isinstance(cfg, dict):
        raise CheckpointFormatError(f"{path}: the smoeweather metadata holds no config")
    task = network_task(meta, str(path))
    if task is not None:
        task, meta, net = rebuild_network(ckpt, str(path), task)
        module = registered_task(task).module_around(meta, net)
    else:
        task = canonical_task(meta.get("task"), str(path))
        try:
            builder = registered_task(task).build
        except ValueError as err:
            raise CheckpointFormatError(f"{path}: unknown task {task!r}; {err}") from err
        _, module = builder(dict(cfg, task=task))
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
