"""Build weather networks from config dicts; tiny registered variants for tests.

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

from smoeweather.models.ensemble import ENSEMBLE_KEYS, ENSEMBLE_MODELS, build_ensemble_model, uses_land_sea_prior
from smoeweather.models.resnet import SMoEPlacement, WeatherBenchResNet
from smoeweather.models.unet import PostprocessingUNet

_RESNET_KEYS = {"in_channels", "out_channels", "width", "blocks", "dropout", "smoe", "grid", "conv",
                "lrlcn_rank", "location_embedding"}
_UNET_KEYS = {"in_channels", "levels", "widths", "smoe", "experts_factor", "grid", "rc", "damping",
              "quantile", "out_channels", "head_kernel", "smoe_kwargs", "gate_init", "gate_prior", "prior_strength",
              "share_gate", "head_affine", "freeze_gate"}


def _check_keys(cfg: dict[str, Any], allowed: set[str], name: str) -> None:
    unknown = set(cfg) - allowed - {"name"}
    if unknown:
        raise ValueError(f"unknown keys {sorted(unknown)} for model {name!r}; allowed: {sorted(allowed)}")


def model_arguments(cfg: dict[str, Any]) -> list[tuple[Any, Any, str]]:
    """What the keys of a weather ``model`` block are passed to, for the config type check
    (:class:`smoeweather.config.Arguments`): (constructor, mapping, key suffix) for the network named by
    ``name`` and its nested blocks (``smoe`` of a ResNet, ``layer_kwargs``/``smoe_kwargs`` of the SMoE
    layer). Types come from the constructors' hints, so new constructor arguments are checked as added."""
    from smoeweather.nn.smoe import SpatialMoE2d

    name = cfg.get("name")
    if name in ENSEMBLE_MODELS:  # e3 / deep_ensemble / gaussian: the ResNet's argument types
        return [(WeatherBenchResNet, {k: v for k, v in cfg.items() if k != "members"}, "")]
    if name == "resnet":
        out: list[tuple[Any, Any, str]] = [(WeatherBenchResNet, cfg, "")]
        smoe = cfg.get("smoe")
        if isinstance(smoe, dict):
            out += [(SMoEPlacement, smoe, ".smoe"), (SpatialMoE2d, smoe.get("layer_kwargs"), ".smoe.layer_kwargs")]
        return out
    if name == "unet":
        return [(PostprocessingUNet, cfg, ""), (SpatialMoE2d, cfg.get("smoe_kwargs"), ".smoe_kwargs")]
    return []  # an unknown name is refused by build_weather_model


MODEL_BOUNDS: dict[str, dict[str, Any]] = {
    "width": {"ge": 1}, "blocks": {"ge": 0}, "members": {"ge": 1}, "experts_factor": {"ge": 1},
    "dropout": {"ge": 0, "lt": 1}, "levels": {"ge": 1}, "lrlcn_rank": {"ge": 1}, "in_channels": {"ge": 1},
    "out_channels": {"ge": 1}, "quantile": {"gt": 0, "lt": 1},
}
"""Bounds of the numeric ``model`` keys (and of the same keys in ``model.smoe``), checked before anything runs."""

MODEL_EXAMPLES = {"width": 16, "blocks": 3, "members": 4, "experts_factor": 2, "dropout": 0.1, "levels": 3,
                  "lrlcn_rank": 3, "in_channels": 4, "out_channels": 2, "quantile": 0.3}


def parameters(fn: Any) -> set[str] | None:
    """Keyword names ``fn`` accepts (a dataclass: its fields); None when it takes ``**kwargs``."""
    import dataclasses
    import inspect

    if dataclasses.is_dataclass(fn):
        return {f.name for f in dataclasses.fields(fn) if f.init}
    params = inspect.signature(fn).parameters.values()
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return None
    return {p.name for p in params if p.name not in ("self", "land_sea_prior")}  # the map comes from the data


def known_model_keys(name: Any) -> set[str]:
    """The ``model`` keys :func:`build_weather_model` takes for the network ``name`` (besides ``name``)."""
    if name in ENSEMBLE_MODELS:
        return set(ENSEMBLE_KEYS[name])
    return set(_RESNET_KEYS if name == "resnet" else _UNET_KEYS if name == "unet" else ())


def check_model_config(cfg: Any, where: str = "model", extra_keys: Mapping[str, set[str]] | None = None) -> None:
    """ConfigError before anything is built for a weather ``model`` block with an unknown ``name``, an unknown
    key at any level (with did-you-mean, like the top level) or a number out of bounds (:data:`MODEL_BOUNDS`).
    ``extra_keys``: key suffix (``""``, ``".smoe"``) → further accepted keys (e.g. those of the constructors
    the config type check passes the block to)."""
    import difflib

    from smoeweather.config import ConfigError, check_bounds, unknown_key_message
    from smoeweather.nn.smoe import SpatialMoE2d

    if not isinstance(cfg, dict):
        raise ConfigError(f"{where} must be a mapping, got {type(cfg).__name__} {cfg!r}")
    name = cfg.get("name")
    names = ("resnet", "unet", *ENSEMBLE_MODELS)
    if name not in names:
        close = difflib.get_close_matches(str(name), names, n=1, cutoff=0.6)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ConfigError(f"config key '{where}.name' must be one of {', '.join(names)}, got {name!r}{hint}")
    allowed = known_model_keys(name)
    blocks: list[tuple[dict[str, Any], set[str] | None, str]] = [(cfg, allowed | {"name"}, where)]
    nested = cfg.get("smoe") if name != "unet" else None
    if isinstance(nested, dict):
        blocks.append((nested, parameters(SMoEPlacement), f"{where}.smoe"))
        if isinstance(nested.get("layer_kwargs"), dict):
            blocks.append((nested["layer_kwargs"], parameters(SpatialMoE2d), f"{where}.smoe.layer_kwargs"))
    if name == "unet" and isinstance(cfg.get("smoe_kwargs"), dict):
        blocks.append((cfg["smoe_kwargs"], parameters(SpatialMoE2d), f"{where}.smoe_kwargs"))
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


def build_weather_model(cfg: dict[str, Any], land_sea_prior: torch.Tensor | None = None) -> nn.Module:
    """Network from a config dict with ``name`` in {``resnet``, ``unet``}.

    ``land_sea_prior`` (H, W) is used (and then required) only by a ResNet whose ``smoe.gate_prior ==
    "land_sea"`` or an SMoE U-Net whose ``gate_prior == "land_sea"``; it is ignored otherwise. Unknown keys
    are an error.
    """
    cfg = copy.deepcopy(dict(cfg))
    name = cfg.get("name")
    if name in ENSEMBLE_MODELS:
        return build_ensemble_model(cfg, land_sea_prior=land_sea_prior)
    if name == "resnet":
        _check_keys(cfg, _RESNET_KEYS, name)
        kwargs = {k: v for k, v in cfg.items() if k != "name"}
        smoe = SMoEPlacement.from_config(kwargs.pop("smoe", None))
        if "grid" in kwargs:
            kwargs["grid"] = tuple(kwargs["grid"])
        use_prior = smoe.gate_prior == "land_sea" and smoe.placement != "none"
        return WeatherBenchResNet(smoe=smoe, land_sea_prior=land_sea_prior if use_prior else None, **kwargs)
    if name == "unet":
        _check_keys(cfg, _UNET_KEYS, name)
        kwargs = {k: v for k, v in cfg.items() if k != "name"}
        if "grid" in kwargs and kwargs["grid"] is not None:
            kwargs["grid"] = tuple(kwargs["grid"])
        if "widths" in kwargs:
            kwargs["widths"] = tuple(kwargs["widths"])
        prior = kwargs.pop("gate_prior", None)
        if prior not in (None, "none", "land_sea"):
            raise ValueError(f"model.gate_prior must be 'land_sea' or null, got {prior!r}")
        if prior == "land_sea" and kwargs.get("smoe"):
            if land_sea_prior is None:
                raise ValueError("model.gate_prior: land_sea needs a land-sea mask (data.static or data.constants)")
            kwargs["land_sea_prior"] = land_sea_prior
        return PostprocessingUNet(**kwargs)
    raise ValueError(f"unknown weather model {name!r}; expected 'resnet', 'unet' or one of {ENSEMBLE_MODELS}")


TINY_GRID = (16, 32)
_TINY_RESNET = {"name": "resnet", "in_channels": 5, "out_channels": 2, "width": 8, "blocks": 2,
                "grid": list(TINY_GRID)}

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
