"""Experiment configuration: YAML files under ``configs/`` with ``key.sub=value`` overrides."""

from __future__ import annotations

import copy
import difflib
import inspect
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml


class ConfigError(ValueError):
    """A configuration file or override is malformed."""


BUILTIN_CONFIGS = Path(__file__).resolve().parent / "configs"
"""The configs that ship with the package (the repository's ``configs/`` folder, packed into the wheel)."""


def builtin_config_names() -> list[str]:
    """Names of the built-in configs, as ``smoe train --config`` accepts them (``weatherbench/world_dense``)."""
    return sorted(str(p.relative_to(BUILTIN_CONFIGS).with_suffix("")) for p in BUILTIN_CONFIGS.rglob("*.yaml"))


def resolve_config(name: str | Path) -> Path:
    """A config file: ``name`` itself when it is a file, else the built-in config of that name.

    ``weatherbench/world_dense``, ``weatherbench/world_dense.yaml`` and ``configs/weatherbench/world_dense.yaml``
    all name the same built-in config. ConfigError with the closest built-in names when neither exists.
    """
    path = Path(name)
    if path.is_file():
        return path
    relative = path.with_suffix(".yaml") if path.suffix != ".yaml" else path
    if relative.parts and relative.parts[0] == "configs":
        relative = Path(*relative.parts[1:])
    builtin = BUILTIN_CONFIGS / relative
    if not path.is_absolute() and builtin.is_file():
        return builtin
    key = str(relative.with_suffix(""))
    close = difflib.get_close_matches(key, builtin_config_names(), n=3, cutoff=0.5)
    example = "; give a YAML path or a built-in name such as weatherbench/world_dense"
    hint = f"; did you mean {', '.join(close)}?" if close else example
    raise ConfigError(f"config file {path} does not exist and is not a built-in config{hint}")


def load_config(path: str | Path, overrides: list[str] | tuple[str, ...] = ()) -> dict[str, Any]:
    """Load a YAML config (a path or a built-in name, see :func:`resolve_config`) and apply ``a.b=value``
    overrides (values parsed as YAML).

    A config may name ``defaults: [other.yaml, ...]`` (paths relative to itself); those are loaded
    first and deep-merged underneath it.
    """
    path = resolve_config(path)
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
            close = difflib.get_close_matches(str(key), list(schema.keys), n=1, cutoff=0.6)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ConfigError(
                f"unknown config key {path!r}{hint}; valid keys {level}: {', '.join(sorted(schema.keys))}"
            )
        spec = schema.keys[key]
        if isinstance(spec, Block):
            validate(value, spec, path)
        elif isinstance(spec, Arguments):
            spec.check(value, path)
        elif not _type_ok(value, spec):
            expected = " or ".join(_TYPE_NAMES.get(t, t.__name__) for t in spec)
            raise ConfigError(f"config key {path!r} must be {expected}, got {type(value).__name__} {value!r}")


# ---- keyword arguments of a callable: types from its hints (or defaults) ------------------------------
def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _check_hint(value: Any, hint: Any) -> bool | None:
    """True/False when ``value`` (a YAML value) fits type hint ``hint``; None when the hint is not
    understood (a class of its own, a callable …): unknown is never an error.

    YAML has no tuples: a list fits ``tuple[...]``/``Sequence[...]``; an int fits ``float``; a bool fits only
    ``bool``."""
    import collections.abc as cabc
    import types
    import typing

    if hint in (Any, object, inspect.Parameter.empty):
        return True
    if hint is None or hint is type(None):
        return value is None
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        results = [_check_hint(value, a) for a in args]
        return True if any(r is True for r in results) else (None if None in results else False)
    if origin is typing.Literal:
        return any(value == a and type(value) is type(a) for a in args)
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return _is_number(value)
    if hint is str:
        return isinstance(value, str)
    sequences = (list, tuple, cabc.Sequence, cabc.Iterable, cabc.Collection, cabc.MutableSequence)
    if hint in sequences or origin in sequences:
        if not isinstance(value, list | tuple):
            return False
        if origin is tuple and args and args[-1] is not Ellipsis:
            if len(value) != len(args):
                return False
            results = [_check_hint(v, a) for v, a in zip(value, args)]
        else:
            results = [_check_hint(v, args[0]) for v in value] if args else []
        return False if False in results else True
    if hint in (dict, cabc.Mapping, cabc.MutableMapping) or origin in (dict, cabc.Mapping, cabc.MutableMapping):
        if not isinstance(value, dict):
            return False
        if len(args) == 2:
            results = [_check_hint(v, args[1]) for v in value.values()]
            return False if False in results else True
        return True
    return None


def describe_hint(hint: Any) -> str:
    """A type hint in config words: ``int``, ``float``, ``list of int``, ``one of 'a', 'b'``, ``… or null``."""
    import collections.abc as cabc
    import types
    import typing

    if hint is None or hint is type(None):
        return "null"
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        parts = [describe_hint(a) for a in args if a is not type(None)]
        return " or ".join(dict.fromkeys(parts + (["null"] if type(None) in args else [])))
    if origin is typing.Literal:
        return "one of " + ", ".join(repr(a) for a in args)
    if hint in _TYPE_NAMES:
        return _TYPE_NAMES[hint]
    sequences = (list, tuple, cabc.Sequence, cabc.Iterable, cabc.Collection, cabc.MutableSequence)
    if hint in sequences or origin in sequences:
        if origin is tuple and args and args[-1] is not Ellipsis:
            return f"a list of {len(args)} {' / '.join(dict.fromkeys(describe_hint(a) for a in args))}"
        return f"a list of {describe_hint(args[0])}" if args and args[0] is not Any else "a list"
    if hint in (dict, cabc.Mapping, cabc.MutableMapping) or origin in (dict, cabc.Mapping, cabc.MutableMapping):
        return "a mapping"
    return getattr(hint, "__name__", str(hint))


def _hints(fn: Callable[..., Any]) -> dict[str, Any]:
    """Resolved type hints of ``fn`` (a function or a class: its ``__init__``; dataclasses: their fields);
    names whose hints cannot be resolved are left out."""
    import dataclasses
    import typing

    targets: list[Any] = [fn] if inspect.isfunction(fn) or inspect.ismethod(fn) else []
    if inspect.isclass(fn):
        targets = [fn] if dataclasses.is_dataclass(fn) else [fn.__init__]
    out: dict[str, Any] = {}
    for target in targets:
        try:
            out.update(typing.get_type_hints(target))
        except Exception:  # noqa: BLE001 - an unresolvable forward reference: resolve one name at a time
            module = inspect.getmodule(target)
            for name, raw in getattr(target, "__annotations__", {}).items():
                try:
                    out[name] = eval(raw, vars(module)) if isinstance(raw, str) else raw  # noqa: S307
                except Exception:  # noqa: BLE001
                    continue
    return out


def _hint_from_default(default: Any) -> Any:
    """A hint for an unannotated parameter from its default (None / other objects: no hint)."""
    if isinstance(default, bool):
        return bool
    if _is_number(default):
        return float  # 0 or 0.5: a number either way
    if isinstance(default, str):
        return str
    if isinstance(default, list | tuple):
        return list
    return inspect.Parameter.empty


def check_arguments(fn: Callable[..., Any], values: dict[str, Any], where: str, skip: tuple[str, ...] = ()) -> None:
    """ConfigError when a value of ``values`` (keyword arguments of ``fn``, from a config block at dotted
    path ``where``) does not fit the parameter's type hint, or its default's type when unannotated.

    Names the key and the expected type (``config key 'model.width' must be int, got str 'abc'``). Keys
    that are not parameters of ``fn`` and hints that are not understood are left to the caller and ``fn``.
    """
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return
    hints = _hints(fn)
    for key, value in values.items():
        param = params.get(key)
        if key in skip or param is None or param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        hint = hints.get(key, inspect.Parameter.empty)
        if hint is inspect.Parameter.empty:
            hint = _hint_from_default(param.default)
        if _check_hint(value, hint) is False:
            path = f"{where}.{key}" if where else str(key)
            expected = "a number" if key not in hints and hint is float else describe_hint(hint)
            raise ConfigError(f"config key {path!r} must be {expected}, got {type(value).__name__} {value!r}")


class Arguments:
    """Schema spec of a mapping whose keys are keyword arguments of callables: ``targets(value)`` returns
    ``[(callable, mapping, key suffix), ...]`` (e.g. the model class named by ``model.name`` and its
    nested blocks), each checked with :func:`check_arguments`, so a new constructor argument is checked
    from its type hint without a schema change. ``nullable``: the block may be ``null``."""

    def __init__(self, targets: Callable[[dict[str, Any]], list[tuple[Callable[..., Any], Any, str]]],
                 nullable: bool = False) -> None:
        self.targets, self.nullable = targets, nullable

    @classmethod
    def of(cls, target: str, nullable: bool = False) -> Arguments:
        """The keyword arguments of one callable named ``"package.module:name"`` (imported when checked)."""

        def targets(value: dict[str, Any]) -> list[tuple[Callable[..., Any], Any, str]]:
            import importlib

            module, name = target.split(":")
            return [(getattr(importlib.import_module(module), name), value, "")]

        return cls(targets, nullable)

    def check(self, value: Any, where: str) -> None:
        if value is None and self.nullable:
            return
        if not isinstance(value, dict):
            raise ConfigError(f"{where} must be a mapping, got {type(value).__name__} {value!r}")
        for fn, values, suffix in self.targets(value):
            if isinstance(values, dict):
                check_arguments(fn, values, f"{where}{suffix}")
