"""The folder ``smoe export`` writes, read side: its layout (``model.json`` card, ``model.safetensors`` weights,
``model.onnx``) and :func:`read_export`, which reads it from JSON and safetensors only (nothing is unpickled). The
writer is :mod:`smoeweather.models.export`; the loader (:func:`smoeweather.models.loader.load_network`) reads a
folder through this module, below both."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from smoeweather.models.checkpoint_io import METADATA_KEY, file_sha256

EXPORT_FORMAT = "smoeweather-export"
EXPORT_VERSION = 1
"""Version of the folder layout and of ``model.json``'s top level; the ``smoeweather`` block has its own."""
CARD_FILE, WEIGHTS_FILE, ONNX_FILE = "model.json", "model.safetensors", "model.onnx"


def is_export(path: str | Path) -> bool:
    """Whether ``path`` is an export folder of ``smoe export`` (a folder holding ``model.json``)."""
    return Path(path).is_dir() and (Path(path) / CARD_FILE).is_file()


def safetensors_module() -> Any:
    """``safetensors.torch`` (a dependency; imported when an export is read or written)."""
    try:
        import safetensors.torch
    except ImportError:  # a dependency of smoeweather: only a broken install lacks it
        raise ImportError("smoe export needs the safetensors package: pip install safetensors") from None
    return safetensors.torch


def read_export(path: str | Path) -> tuple[dict[str, Any], str]:
    """(checkpoint-like dict ``{"state_dict": {"model.<key>": tensor}, "smoeweather": metadata}``, SHA-256 of the
    weights file) of an export folder, read from JSON and safetensors only. ValueError naming the file for another
    format or version, or weights that are not the ones ``model.json`` records."""
    path = Path(path)
    card_path = path / CARD_FILE
    try:
        card = json.loads(card_path.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"{card_path} is not JSON ({err}); export the checkpoint again with `smoe export`") from None
    if not isinstance(card, dict) or card.get("format") != EXPORT_FORMAT:
        raise ValueError(f"{card_path} is not a model card of `smoe export` (no \"format\": \"{EXPORT_FORMAT}\")")
    if card.get("export_version") != EXPORT_VERSION:
        raise ValueError(f"{card_path}: export version {card.get('export_version')!r}, this smoeweather reads "
                         f"{EXPORT_VERSION}; export the checkpoint again with this version")
    weights = path / str(card.get("weights", WEIGHTS_FILE))
    if not weights.is_file():
        raise FileNotFoundError(f"{weights} does not exist; {card_path} names it as the weights file")
    sha = file_sha256(weights)
    if card.get("weights_sha256") != sha:
        raise ValueError(f"{weights}: SHA-256 {sha} differs from the weights_sha256 in {card_path}; the folder was "
                         "changed after `smoe export`: export the checkpoint again")
    state = safetensors_module().load_file(str(weights))
    return {"state_dict": {f"model.{k}": v for k, v in state.items()}, METADATA_KEY: card.get(METADATA_KEY)}, sha
