"""Experiment configuration: YAML files under ``configs/`` with ``key.sub=value`` overrides."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml


class ConfigError(ValueError):
    """A configuration file or override is malformed."""


def load_config(path: str | Path, overrides: list[str] | tuple[str, ...] = ()) -> dict[str, Any]:
    """Load a YAML config and apply ``a.b=value`` overrides (values parsed as YAML).

    A config may name ``defaults: [other.yaml, ...]`` (paths relative to itself); those are loaded
    first and deep-merged underneath it.
    """
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file {path} does not exist")
    try:
        cfg = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as err:
        raise ConfigError(f"config file {path} is not valid YAML: {err}") from err
    if not isinstance(cfg, dict):
        raise ConfigError(f"config file {path} must hold a mapping at the top level")
    merged: dict[str, Any] = {}
    for parent in cfg.pop("defaults", []) or []:
        merged = deep_merge(merged, load_config(path.parent / parent))
    merged = deep_merge(merged, cfg)
    return apply_overrides(merged, overrides)


def deep_merge(base: dict[str, Any], update: dict[str, Any]) -> dict[str, Any]:
    """Recursively merge ``update`` into a copy of ``base``."""
    out = copy.deepcopy(base)
    for key, value in update.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def apply_overrides(cfg: dict[str, Any], overrides: list[str] | tuple[str, ...]) -> dict[str, Any]:
    """Apply ``a.b.c=value`` strings; the value is parsed as YAML (``1e-3``, ``[1, 2]``, ``null``)."""
    out = copy.deepcopy(cfg)
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r} must look like key.sub=value")
        key, raw = item.split("=", 1)
        node = out
        parts = key.strip().split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"override {item!r}: {part!r} is not a mapping in the config")
        node[parts[-1]] = yaml.safe_load(raw)
    return out


# ---- schemas ---------------------------------------------------------------------------------------
_TYPE_NAMES = {bool: "bool", int: "int", float: "float", str: "str", list: "list", dict: "mapping",
               type(None): "null"}


class Block:
    """Schema of a mapping: ``keys`` maps each allowed key to a spec (a tuple of accepted Python types, or
    a nested :class:`Block`); ``keys=None`` accepts any keys (checked by whoever consumes the block).
    ``nullable``: the block may be ``null``. An ``int`` is accepted where ``float`` is; ``bool`` only
    where ``bool`` is listed (YAML ``true`` is not a number)."""

    def __init__(self, keys: dict[str, Any] | None = None, nullable: bool = False) -> None:
        self.keys, self.nullable = keys, nullable

    def extended(self, **keys: Any) -> Block:
        """A copy with more (or replaced) keys."""
        return Block({**(self.keys or {}), **keys}, self.nullable)


def _type_ok(value: Any, types: tuple[type, ...]) -> bool:
    if object in types:
        return True
    if isinstance(value, bool):
        return bool in types
    if isinstance(value, int) and float in types:
        return True
    return isinstance(value, types)


def validate(cfg: Any, schema: Block, where: str = "") -> None:
    """Check ``cfg`` against ``schema``; ConfigError naming the dotted key and what was expected.

    Unknown key → the valid keys at that level; wrong type → the key and its expected type(s).
    """
    label = where or "the config"
    if cfg is None and schema.nullable:
        return
    if not isinstance(cfg, dict):
        raise ConfigError(f"{label} must be a mapping, got {type(cfg).__name__} {cfg!r}")
    if schema.keys is None:
        return
    for key, value in cfg.items():
        path = f"{where}.{key}" if where else str(key)
        if key not in schema.keys:
            level = f"under {where!r}" if where else "at the top level"
            raise ConfigError(f"unknown config key {path!r}; valid keys {level}: {', '.join(sorted(schema.keys))}")
        spec = schema.keys[key]
        if isinstance(spec, Block):
            validate(value, spec, path)
        elif not _type_ok(value, spec):
            expected = " or ".join(_TYPE_NAMES.get(t, t.__name__) for t in spec)
            raise ConfigError(f"config key {path!r} must be {expected}, got {type(value).__name__} {value!r}")
