"""Weather networks from ``model`` blocks through the registry (:mod:`smoeweather.models.registry`): the checks
before anything is built (names, keys, bounds, size, a meta build) and tiny variants for tests.

Example configs::

    {"name": "resnet", "in_channels": 117, "out_channels": 2, "width": 128, "blocks": 19,
     "smoe": {"placement": "all", "gate_prior": "land_sea", "prior_strength": 1.0}}
    {"name": "unet", "in_channels": 14, "smoe": True, "experts_factor": 4, "grid": [361, 720]}
"""

from __future__ import annotations

import copy
import math
import os
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from smoeweather.models import registry
from smoeweather.models.ensemble import uses_land_sea_prior
from smoeweather.models.registry import parameters
from smoeweather.models.resnet import TINY_RESNET


def model_arguments(cfg: dict[str, Any]) -> list[tuple[Any, Any, str]]:
    """What the keys of a weather ``model`` block are passed to, for the config type check
    (:class:`smoeweather.config.Arguments`): the registered network's (constructor, mapping, key suffix) list;
    empty for an unknown name (refused by :func:`check_model_config`)."""
    entry = registry.entries_by_name("weather").get(cfg.get("name"))  # type: ignore[arg-type]
    return entry.arguments(cfg) if entry is not None else []


MODEL_BOUNDS: dict[str, dict[str, Any]] = {
    "width": {"ge": 1}, "blocks": {"ge": 0}, "members": {"ge": 1}, "experts_factor": {"ge": 1},
    "dropout": {"ge": 0, "lt": 1}, "levels": {"ge": 1}, "lrlcn_rank": {"ge": 1}, "in_channels": {"ge": 1},
    "out_channels": {"ge": 1}, "quantile": {"gt": 0, "lt": 1},
}
"""Bounds of the numeric ``model`` keys (and of the same keys in ``model.smoe``), checked before anything runs."""

MODEL_EXAMPLES = {"width": 16, "blocks": 3, "members": 4, "experts_factor": 2, "dropout": 0.1, "levels": 3,
                  "lrlcn_rank": 3, "in_channels": 4, "out_channels": 2, "quantile": 0.3}


def known_model_keys(name: Any) -> set[str]:
    """The ``model`` keys the weather network ``name`` takes (besides ``name``; empty for an unknown name)."""
    entry = registry.entries_by_name("weather").get(name)
    return set(entry.keys or ()) if entry is not None else set()


def check_model_config(cfg: Any, where: str = "model", extra_keys: Mapping[str, set[str]] | None = None) -> None:
    """ConfigError before anything is built for a weather ``model`` block with an unknown ``name``, an unknown
    key at any level (with did-you-mean, like the top level) or a number out of bounds (:data:`MODEL_BOUNDS`).
    ``extra_keys``: key suffix (``""``, ``".smoe"``) → further accepted keys (e.g. those of the constructors
    the config type check passes the block to)."""
    from smoeweather.config import ConfigError, check_bounds, unknown_key_message

    if not isinstance(cfg, dict):
        raise ConfigError(f"{where} must be a mapping, got {type(cfg).__name__} {cfg!r}")
    try:
        entry = registry.lookup("weather", cfg.get("name"), f"{where}.name")
    except ValueError as err:
        raise ConfigError(str(err)) from None
    blocks: list[tuple[dict[str, Any], set[str] | None, str]] = [(cfg, set(entry.keys or ()) | {"name"}, where)]
    for ctor, block, suffix in entry.arguments(cfg):  # the nested blocks take their constructor's keys
        if suffix and isinstance(block, dict):
            blocks.append((block, parameters(ctor), f"{where}{suffix}"))
    for block, keys, path in blocks:
        if keys is not None:
            keys = keys | (extra_keys or {}).get(path[len(where):], set())
        for key, value in block.items():
            if keys is not None and key not in keys:
                raise ConfigError(unknown_key_message(f"{path}.{key}", keys, path))
            if key in MODEL_BOUNDS and path in (where, f"{where}.smoe"):
                check_bounds(f"{path}.{key}", value, MODEL_BOUNDS[key], MODEL_EXAMPLES.get(key))


MAX_PARAMETERS = 2**31
"""The most parameters a network of ``smoe train`` may have (more is refused before anything is built)."""
REPEATED = ("blocks", "members")
"""``model`` keys that repeat modules: a network's parameters grow linearly in each. Above :data:`_SMALL` they are
extrapolated from two small builds, so ``blocks=100000000`` is estimated at once instead of built for minutes."""
_SMALL = 16
TRAIN_BYTES_PER_PARAMETER = 16
"""float32 weights, gradients and Adam's two moments: the memory a parameter needs in training (activations aside)."""


def _meta_parameters(cfg: dict[str, Any]) -> int:
    """Parameter count of the network of ``cfg`` built on the ``meta`` device (no memory is allocated); a
    land-sea gate prior (which reads its map's values, impossible on ``meta``) is left out of the count."""
    cfg = copy.deepcopy(cfg)
    if isinstance(cfg.get("smoe"), dict) and cfg["smoe"].get("gate_prior") == "land_sea":
        cfg["smoe"]["gate_prior"] = "none"
    if cfg.get("gate_prior") == "land_sea":
        cfg["gate_prior"] = None
    with torch.device("meta"):
        net = build_weather_model(cfg)
    return sum(p.numel() for p in net.parameters())


def estimate_parameters(cfg: dict[str, Any]) -> float:
    """About how many parameters the network of ``cfg`` has: a meta build, with every key of :data:`REPEATED`
    above 16 built at 8 and 16 and extrapolated linearly (exact for networks whose repeated modules are alike).
    Raises what the build raises."""
    big = {k: int(cfg[k]) for k in REPEATED if isinstance(cfg.get(k), int) and cfg[k] > _SMALL}
    base_cfg = {**cfg, **{k: _SMALL for k in big}}
    base = float(_meta_parameters(base_cfg))
    total = base
    for key, value in big.items():
        try:
            half = float(_meta_parameters({**base_cfg, key: _SMALL // 2}))
            per = (base - half) / (_SMALL - _SMALL // 2)
        except Exception:  # noqa: BLE001 - a half-size build the network refuses (e.g. E³ groups): proportional
            per = base / _SMALL
        total *= (base + (value - _SMALL) * per) / base if base else 1.0
    return total


def physical_memory() -> int | None:
    """Bytes of RAM of this machine (None where the OS does not say)."""
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return None


def check_model_size(cfg: dict[str, Any], where: str = "model") -> None:
    """ConfigError, before anything is built, for a network of more than :data:`MAX_PARAMETERS` parameters or
    whose training memory (:data:`TRAIN_BYTES_PER_PARAMETER` a parameter) exceeds this machine's RAM; the
    message gives the estimate (:func:`estimate_parameters`) and the size keys set. Build errors are left to
    :func:`check_model_builds`."""
    from smoeweather.config import ConfigError

    try:
        n = estimate_parameters(cfg)
    except Exception:  # noqa: BLE001 - the full build reports it (or the real build does)
        return
    need, ram = n * TRAIN_BYTES_PER_PARAMETER, physical_memory()
    if n <= MAX_PARAMETERS and (ram is None or need <= ram):
        return
    limit = (f"more than the limit of 2^31 = {MAX_PARAMETERS} parameters" if n > MAX_PARAMETERS else
             f"more than this machine's {ram / 2**30:.3g} GiB of RAM")
    sizes = ", ".join(f"{where}.{k}={cfg[k]}" for k in ("width", "widths", "blocks", "members", "experts_factor",
                                                       "levels") if k in cfg)
    raise ConfigError(f"{where}: the network would have about {n:.3g} parameters ({need / 2**30:.3g} GiB to train: "
                      f"weights, gradients and Adam's moments in float32), {limit}; choose a smaller model"
                      + (f" ({sizes})" if sizes else ""))


def check_model_builds(cfg: dict[str, Any], where: str = "model") -> None:
    """ConfigError with the constructor's own message when the network of ``cfg`` refuses its arguments (e.g.
    an E³ whose experts do not split into its members), found by building it on the ``meta`` device (no memory,
    no data: placeholder channel counts and grid where the data would fill them in); before that, a network
    too large to train is refused with its size estimate (:func:`check_model_size`). Failures of the meta
    build itself (data-dependent steps such as the gate prior) are left to the real build."""
    from smoeweather.config import ConfigError

    mcfg = {"in_channels": 4, "out_channels": 2, "grid": [64, 128], **cfg}
    check_model_size(mcfg, where)
    prior = torch.zeros(tuple(mcfg["grid"]), dtype=torch.long) if uses_land_sea_prior(mcfg) else None
    try:
        with torch.device("meta"):
            build_weather_model(mcfg, land_sea_prior=prior)
    except ValueError as err:
        raise ConfigError(str(err) if str(err).startswith(where) else f"{where}: {err}") from None
    except Exception:  # noqa: BLE001 - a step the meta device cannot run: the real build checks it
        return


def build_weather_model(cfg: Mapping[str, Any], land_sea_prior: torch.Tensor | None = None) -> nn.Module:
    """The registered weather network named by ``cfg['name']`` (:func:`smoeweather.models.registry.build`).

    ``land_sea_prior`` (H, W) is used (and then required) only by a network whose SMoE gates start from it
    (:func:`~smoeweather.models.ensemble.uses_land_sea_prior`); it is ignored otherwise. Unknown keys are an
    error."""
    return registry.build("weather", cfg, land_sea_prior=land_sea_prior)


TINY_GRID = (16, 32)
_TINY_RESNET = {"name": "resnet", **TINY_RESNET}

TINY_VARIANTS: dict[str, dict[str, Any]] = {
    "resnet-dense": dict(_TINY_RESNET),
    "resnet-smoe-first": {**_TINY_RESNET, "smoe": {"placement": "first"}},
    "resnet-smoe-last": {**_TINY_RESNET, "smoe": {"placement": "last"}},
    "resnet-smoe-all": {**_TINY_RESNET, "smoe": {"placement": "all"}},
    "resnet-smoe-all-prior": {**_TINY_RESNET,
                              "smoe": {"placement": "all", "gate_prior": "land_sea", "prior_strength": 1.0}},
    "resnet-smoe-all-random-fixed": {**_TINY_RESNET, "smoe": {"placement": "all", "random_fixed_gate": True}},
    "resnet-lrlcn": {**_TINY_RESNET, "conv": "lrlcn", "lrlcn_rank": 3},
    "unet": {"name": "unet", "in_channels": 4, "levels": 3, "widths": [4, 8, 16], "grid": list(TINY_GRID)},
    "unet-smoe": {"name": "unet", "in_channels": 4, "levels": 3, "widths": [4, 8, 16], "smoe": True,
                  "experts_factor": 4, "grid": list(TINY_GRID)},
}
"""Tiny test variants (16×32 grid), name → config for :func:`build_weather_model`."""


def synthetic_land_sea_mask(height: int, width: int) -> torch.Tensor:
    """Deterministic toy land-sea map (H, W), 1 = land: two smooth 'continents', ~1/3 land."""
    lat = torch.linspace(-math.pi / 2, math.pi / 2, height).view(-1, 1)
    lon = torch.linspace(0, 2 * math.pi, width + 1)[:-1].view(1, -1)
    field = torch.sin(2 * lon) * torch.cos(lat) + 0.5 * torch.sin(3 * lat)
    return (field > 0.3).long()


def build_tiny(name: str, land_sea_prior: torch.Tensor | None = None) -> nn.Module:
    """A tiny registered variant; a prior-using variant gets :func:`synthetic_land_sea_mask` by default."""
    if name not in TINY_VARIANTS:
        raise ValueError(f"unknown tiny variant {name!r}; known: {sorted(TINY_VARIANTS)}")
    cfg = TINY_VARIANTS[name]
    smoe = cfg.get("smoe")
    if land_sea_prior is None and isinstance(smoe, dict) and smoe.get("gate_prior") == "land_sea":
        land_sea_prior = synthetic_land_sea_mask(*cfg["grid"])
    return build_weather_model(cfg, land_sea_prior=land_sea_prior)
