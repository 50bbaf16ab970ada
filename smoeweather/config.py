"""Experiment configuration: YAML files under ``configs/`` with ``key.sub=value`` overrides."""

from __future__ import annotations

import copy
import dataclasses
import difflib
import inspect
from collections.abc import Callable, Iterable, Mapping
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
    if path.is_dir():
        found = sorted(p.name for p in path.glob("*.y*ml"))
        hint = f", e.g. {path / found[0]}" if found else " (it holds none)"
        raise ConfigError(f"--config {path} is a folder; give a YAML config file in it{hint}")
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


def read_config(path: str | Path, overrides: list[str] | tuple[str, ...] = ()) -> dict[str, Any]:
    """Read a YAML config (a path or a built-in name, see :func:`resolve_config`) and apply ``a.b=value``
    overrides (values parsed as YAML): the merged mapping, not yet validated.

    A config may name ``defaults: [other.yaml, ...]`` (paths relative to itself); those are read
    first and deep-merged underneath it. A ``smoe train`` config is validated and typed by
    :func:`smoeweather.training.load_config`; the study, heat and vision files have schemas of their own.
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
        merged = deep_merge(merged, read_config(path.parent / parent))
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


def flatten(block: Any, sep: str = ".", prefix: str = "") -> dict[str, Any]:
    """``{"model.smoe.placement": "all", ...}``: the leaves of a nested mapping under their dotted keys (joined
    with ``sep``; what is not a mapping is a leaf, lists included)."""
    if not isinstance(block, Mapping):
        return {prefix: block}
    out: dict[str, Any] = {}
    for key, value in block.items():
        out.update(flatten(value, sep, f"{prefix}{sep}{key}" if prefix else str(key)))
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
        try:
            node[parts[-1]] = yaml.safe_load(raw)
        except yaml.YAMLError as err:
            reason = " ".join(str(getattr(err, "problem", None) or err).split())
            raise ConfigError(f"override {item!r}: the value {raw!r} is not valid YAML ({reason}); close its "
                              f"brackets or quotes, e.g. {key}=[8, 16], or quote it as text: {key}='{raw}'") from None
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


def unknown_key_message(path: str, valid: Iterable[str], where: str = "") -> str:
    """``unknown config key 'model.widht' (did you mean 'width'?); valid keys under 'model': ...``."""
    valid = sorted(str(k) for k in valid)
    level = f"under {where!r}" if where else "at the top level"
    close = difflib.get_close_matches(path.rsplit(".", 1)[-1], valid, n=1, cutoff=0.6)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return f"unknown config key {path!r}{hint}; valid keys {level}: {', '.join(valid)}"


_BOUND_WORDS = {"gt": ">", "ge": ">=", "lt": "<", "le": "<="}
_BOUND_TESTS: dict[str, Callable[[Any, Any], bool]] = {
    "gt": lambda v, b: v > b, "ge": lambda v, b: v >= b, "lt": lambda v, b: v < b, "le": lambda v, b: v <= b}


def _subject(path: str) -> str:
    """How a message names a setting: a command-line option (``path`` starting with ``-``) by itself, a config
    key as ``config key 'a.b'``."""
    return path if path.startswith("-") else f"config key {path!r}"


def _fix(path: str, example: Any) -> str:
    """``; set e.g. a.b=1`` (a config key) or ``; set e.g. --a-b 1`` (an option); empty without an example."""
    if example is None:
        return ""
    return f"; set e.g. {path} {example}" if path.startswith("-") else f"; set e.g. {path}={example}"


def check_bounds(path: str, value: Any, bounds: Mapping[str, Any], example: Any = None) -> None:
    """ConfigError naming ``path`` when the number ``value`` breaks one of ``bounds`` (``gt``, ``ge``, ``lt``,
    ``le``: bound), e.g. ``config key 'training.lr' must be > 0, got -1; set e.g. training.lr=0.001``; a
    ``path`` that is a command-line option is named as one (``--drn-hidden must be >= 1, got 0; set e.g.
    --drn-hidden 32``). Values that are not numbers (null, a list) are left to the type checks."""
    if not _is_number(value):
        return
    broken = [k for k, b in bounds.items() if b is not None and not _BOUND_TESTS[k](value, b)]
    if broken:
        rule = " and ".join(f"{_BOUND_WORDS[k]} {b}" for k, b in bounds.items() if b is not None)
        raise ConfigError(f"{_subject(path)} must be {rule}, got {value!r}{_fix(path, example)}")


class Bounded:
    """Schema spec of a number with bounds: ``Bounded((int,), ge=1, example=32)`` (types as in :class:`Block`,
    bounds as in :func:`check_bounds`; ``example`` is the value the error message suggests)."""

    def __init__(self, types: tuple[type, ...], example: Any = None, **bounds: Any) -> None:
        unknown = set(bounds) - set(_BOUND_WORDS)
        if unknown:
            raise TypeError(f"unknown bounds {sorted(unknown)}; expected {sorted(_BOUND_WORDS)}")
        self.types, self.example, self.bounds = types, example, bounds

    def check(self, value: Any, path: str) -> None:
        if not _type_ok(value, self.types):
            expected = " or ".join(_TYPE_NAMES.get(t, t.__name__) for t in self.types)
            raise ConfigError(f"config key {path!r} must be {expected}, got {type(value).__name__} {value!r}")
        check_bounds(path, value, self.bounds, self.example)


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
            raise ConfigError(unknown_key_message(path, schema.keys, where))
        spec = schema.keys[key]
        if isinstance(spec, Block):
            validate(value, spec, path)
        elif hasattr(spec, "check"):  # Arguments, Bounded, SettingSpec
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


# ---- typed settings: a dataclass per block, each default and bound in its field -----------------------
def setting(default: Any = dataclasses.MISSING, *, example: Any = None, doc: str = "",
            option: str | tuple[str, ...] | None = None, metavar: str | tuple[str, ...] | None = None,
            **bounds: Any) -> Any:
    """A dataclass field of a typed config block: its default (the ONE place it is set), bounds (``gt``,
    ``ge``, ``lt``, ``le``, checked by :func:`parse_settings`) and a one-line ``doc``; ``option``: the
    command-line option(s) that set it where a command takes it (``--drn-hidden``; the first names it in
    messages, :func:`parse_settings` ``by_option``), ``metavar`` its argparse metavar. Mutable defaults
    (lists, mappings) are copied per instance."""
    unknown = set(bounds) - set(_BOUND_WORDS)
    if unknown:
        raise TypeError(f"unknown bounds {sorted(unknown)}; expected {sorted(_BOUND_WORDS)}")
    options = (option,) if isinstance(option, str) else tuple(option or ())
    metadata = {"bounds": bounds, "example": example, "doc": doc, "option": options, "metavar": metavar}
    if isinstance(default, list | dict):
        return dataclasses.field(default_factory=lambda: copy.deepcopy(default), metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


class SettingSpec:
    """Schema spec (for a :class:`Block`) of one field of a typed settings dataclass: its type hint and
    bounds, so a block mixing typed and task-specific keys checks both the same way."""

    def __init__(self, cls: type[Any], name: str) -> None:
        import typing

        self.field = next(f for f in dataclasses.fields(cls) if f.name == name)
        self.hint = typing.get_type_hints(cls)[name]

    def check(self, value: Any, path: str) -> None:
        example = self.field.metadata.get("example")
        if example is None and self.field.default is not dataclasses.MISSING:
            example = self.field.default
        if _check_hint(value, self.hint) is False:
            raise ConfigError(f"{_subject(path)} must be {describe_hint(self.hint)}, got "
                              f"{type(value).__name__} {value!r}{_fix(path, example)}")
        check_bounds(path, value, self.field.metadata.get("bounds", {}), example)


def settings_specs(cls: type[Any], names: Iterable[str] | None = None) -> dict[str, SettingSpec]:
    """``{key: SettingSpec}`` of the fields of the settings dataclass ``cls`` (all, or ``names``)."""
    keys = [f.name for f in dataclasses.fields(cls) if f.init] if names is None else list(names)
    return {k: SettingSpec(cls, k) for k in keys}


def _coerce(value: Any, hint: Any) -> Any:
    """YAML spellings to the hint's type: an int where a float is wanted becomes that float (``lr: 1``)."""
    import types
    import typing

    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        args = typing.get_args(hint)
        if float in args and int not in args and _is_number(value):
            return float(value)
        return value
    return float(value) if hint is float and _is_number(value) else value


def option_of(f: dataclasses.Field) -> str | None:
    """The command-line option that names the field ``f`` of a settings dataclass (:func:`setting`'s first
    ``option``), or None."""
    options = f.metadata.get("option") or ()
    return options[0] if options else None


def parse_settings(cls: type[Any], values: Mapping[str, Any] | None, where: str, by_option: bool = False) -> Any:
    """An instance of the dataclass ``cls`` from the config block ``values`` at dotted path ``where``,
    validated: an unknown key (with did-you-mean), a value of the wrong type or out of its field's bounds is
    a ConfigError naming the key, what was expected and a value that fits. Missing keys take the field
    defaults; null ``values`` is an empty block. ``where=""``: the keys are at the top level of a file.
    ``by_option``: the values came from a command line; a field with an ``option`` is named by it
    (``--drn-hidden must be >= 1, got 0; set e.g. --drn-hidden 32``)."""
    import typing

    if values is None:
        values = {}
    label = where or "the config"
    if not isinstance(values, Mapping):
        raise ConfigError(f"{label} must be a mapping, got {type(values).__name__} {values!r}")
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    hints = typing.get_type_hints(cls)
    kwargs: dict[str, Any] = {}
    for key, value in values.items():
        path = f"{where}.{key}" if where else str(key)
        if key not in fields:
            raise ConfigError(unknown_key_message(path, fields, where))
        if by_option:
            path = option_of(fields[key]) or path
        SettingSpec(cls, key).check(value, path)
        kwargs[key] = _coerce(value, hints[key])
    missing = [n for n, f in fields.items() if n not in kwargs and f.default is dataclasses.MISSING
               and f.default_factory is dataclasses.MISSING]
    if missing:
        raise ConfigError(f"{label} lacks the key(s) {', '.join(missing)}")
    return cls(**kwargs)
