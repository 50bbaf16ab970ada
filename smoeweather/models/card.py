"""What a ``smoe train`` checkpoint says about its model besides the config, the weights and the grid: the model card.

:func:`card_metadata` is called once at training (:mod:`smoeweather.training.tasks`) and its keys go into the
checkpoint's ``smoeweather`` metadata block, next to the config, channel and target names, latitude/longitude and
normalisation statistics. ``smoe export`` writes that block verbatim as ``model.json``
(:mod:`smoeweather.models.export`): the card is the metadata, in one format. Keys (:data:`CARD_KEYS`):

* ``variables``: every input, output and constant field by its store name (``geopotential_500``) → ``variable``
  (``geopotential``), ``level`` (hPa, or null for a surface field or a constant) and ``units`` (the store's);
* ``levels``: the pressure levels of those fields (hPa, ascending);
* ``leads_h``: the lead times the network was trained on (hours) and ``continuous_lead`` (lead τ is an input);
* ``land_sea_prior``: the SHA-256 of the land-sea map that initialised the SMoE gates (its float32 C-order bytes),
  with its shape, or null when the network uses none;
* ``code``: ``smoeweather`` (``smoeweather.__version__``), ``git_commit`` (null outside a git checkout) and
  ``version`` (:func:`pipelines.provenance.code_version`);
* ``training_data``: ``source`` (the store path(s) as given) and ``attrs`` (the store's global attributes).

Checkpoints written before these keys existed lack them; everything that reads a checkpoint works without them.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import torch

from smoeweather.data.weather import Field, field_name, flat_name

CARD_KEYS = ("variables", "levels", "leads_h", "continuous_lead", "land_sea_prior", "code", "training_data")
"""Keys :func:`card_metadata` adds to a checkpoint's metadata."""


def field_records(fields: Iterable[Field], units: Mapping[str, str]) -> dict[str, dict[str, Any]]:
    """``{store name: {"variable", "level", "units"}}`` of ``fields``; ``units`` by store variable (a flat
    ``geopotential_500`` or a level-dimensioned ``geopotential``), else the canonical units of the variable."""
    from pipelines.canonical import VARIABLES

    out: dict[str, dict[str, Any]] = {}
    for name, level in fields:
        found = units.get(flat_name((name, level))) or units.get(name)
        if not found:
            found = VARIABLES[name][0] if name in VARIABLES else ("degrees_north" if name == "latitude" else "")
        out[field_name((name, level))] = {"variable": name, "level": level, "units": str(found)}
    return out


def prior_digest(prior: torch.Tensor | np.ndarray | None) -> dict[str, Any] | None:
    """``{"sha256", "shape", "dtype"}`` of a land-sea map (hashed as float32 C-order bytes), or None."""
    if prior is None:
        return None
    values = np.ascontiguousarray(torch.as_tensor(prior).detach().cpu().numpy(), dtype=np.float32)
    return {"sha256": hashlib.sha256(values.tobytes()).hexdigest(), "shape": list(values.shape), "dtype": "float32"}


def code_record() -> dict[str, Any]:
    """``{"smoeweather": __version__, "git_commit": sha or None, "version": code_version()}`` of this process."""
    from pipelines.provenance import code_version, git_commit
    from smoeweather import __version__

    return {"smoeweather": __version__, "git_commit": git_commit(), "version": code_version()}


def card_metadata(fields: Iterable[Field], units: Mapping[str, str], leads_h: Sequence[int], continuous: bool,
                  prior: torch.Tensor | np.ndarray | None, source: Any, source_attrs: Mapping[str, Any]
                  ) -> dict[str, Any]:
    """The :data:`CARD_KEYS` of a checkpoint: ``fields`` (inputs, targets and constants, each once, in order),
    their ``units`` by store variable, the trained ``leads_h`` (hours; ``continuous`` when τ is an input), the
    land-sea ``prior`` (H, W) that initialised the gates (None: no prior), the training ``source`` and its
    global ``source_attrs``."""
    records = field_records(dict.fromkeys(fields), units)
    levels = sorted({r["level"] for r in records.values() if r["level"] is not None})
    return {"variables": records, "levels": levels, "leads_h": [int(h) for h in leads_h],
            "continuous_lead": bool(continuous), "land_sea_prior": prior_digest(prior), "code": code_record(),
            "training_data": {"source": source, "attrs": {str(k): v for k, v in source_attrs.items()}}}
