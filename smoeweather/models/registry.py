"""The one registry of networks: every model of every task under its name, with its builder, the ``model``
keys it takes, the constructors those keys go to (for the config type check) and a tiny example config,
as timm's ``register_model``. Build, validation, did-you-mean and the docs' model list read it.

Adding a model is one decorated builder in its model module (``docs/development.md``)::

    @register_model("weather", "my_net", keys=parameters(MyNet), arguments=lambda cfg: [(MyNet, cfg, "")],
                    tiny={"in_channels": 4, "out_channels": 2})
    def _my_net(cfg: dict[str, Any], land_sea_prior: torch.Tensor | None = None) -> nn.Module:
        return MyNet(**cfg)

Builders take the ``model`` block without ``name`` and the task's context: ``weather``: ``land_sea_prior``
(H, W) or None; ``heat``: ``size`` (S of the S×S grid); ``vision``: ``in_channels``, ``num_classes``,
``image_size``. Model modules register on import; :mod:`smoeweather.models` imports them all.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from torch import nn

TASKS: tuple[str, ...] = ("weather", "heat", "vision")
"""The tasks whose networks the registry holds (the ``model`` block of a task's config names one)."""

Arguments = Callable[[dict[str, Any]], list[tuple[Any, Any, str]]]


@dataclass(frozen=True)
class ModelEntry:
    """A registered network: ``builder(cfg_without_name, **context)`` → module; ``keys``: the ``model`` keys
    besides ``name`` it takes (None: its constructor reports unknown ones); ``arguments``: (constructor,
    mapping, key suffix) the keys go to, for type checks; ``tiny``: a small config for tests and docs;
    ``kind``: ``deterministic``, ``ensemble`` (members) or ``gaussian`` (μ, σ)."""

    task: str
    name: str
    builder: Callable[..., nn.Module]
    keys: frozenset[str] | None
    arguments: Arguments
    tiny: Mapping[str, Any] = field(default_factory=dict)
    kind: str = "deterministic"

    @property
    def doc(self) -> str:
        """The builder's first docstring line (the docs' model list)."""
        return (inspect.getdoc(self.builder) or "").split("\n")[0]


_ENTRIES: dict[str, dict[str, ModelEntry]] = {task: {} for task in TASKS}
"""task → name → entry. Complete whenever this module is reachable: importing it runs ``smoeweather/models/
__init__.py`` first, which imports every model module (each registers its networks)."""


def parameters(fn: Any) -> set[str] | None:
    """Keyword names ``fn`` accepts (a dataclass: its fields); None when it takes ``**kwargs``. The data-given
    ``land_sea_prior`` is never a key."""
    if dataclasses.is_dataclass(fn):
        return {f.name for f in dataclasses.fields(fn) if f.init}
    params = inspect.signature(fn).parameters.values()
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return None
    return {p.name for p in params if p.name not in ("self", "land_sea_prior")}


def register_model(task: str, name: str, *, keys: set[str] | None = None, arguments: Arguments | None = None,
                   tiny: Mapping[str, Any] | None = None, kind: str = "deterministic"
                   ) -> Callable[[Callable[..., nn.Module]], Callable[..., nn.Module]]:
    """Decorator registering ``builder`` as the network ``name`` of ``task`` (see the module docstring)."""
    if task not in TASKS:
        raise ValueError(f"unknown task {task!r}; expected one of {TASKS}")

    def decorate(builder: Callable[..., nn.Module]) -> Callable[..., nn.Module]:
        if name in _ENTRIES[task]:
            raise ValueError(f"model {name!r} of task {task!r} is registered twice")
        _ENTRIES[task][name] = ModelEntry(task, name, builder, None if keys is None else frozenset(keys),
                                          arguments or (lambda cfg: []), dict(tiny or {}), kind)
        return builder

    return decorate


def names(task: str) -> tuple[str, ...]:
    """The registered model names of ``task``, in registration order."""
    return tuple(_ENTRIES[task])


def entries_by_name(task: str) -> Mapping[str, ModelEntry]:
    """name → entry of ``task``'s registered networks."""
    return _ENTRIES[task]


def entries(task: str | None = None) -> list[ModelEntry]:
    """Every registered network (of ``task``, or of every task)."""
    return [e for t in ((task,) if task else TASKS) for e in _ENTRIES[t].values()]


def lookup(task: str, name: Any, where: str = "model.name") -> ModelEntry:
    """The entry of ``name``; ValueError naming ``where``, the registered names and the closest one."""
    known = _ENTRIES[task]
    if name in known:
        return known[name]
    close = difflib.get_close_matches(str(name), list(known), n=1, cutoff=0.6)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    raise ValueError(f"config key '{where}' must be one of {', '.join(known)}, got {name!r}{hint}")


def check_keys(entry: ModelEntry, cfg: Mapping[str, Any]) -> None:
    """ValueError for ``model`` keys the network does not take (its constructor reports them when unchecked)."""
    if entry.keys is None:
        return
    unknown = set(cfg) - entry.keys - {"name"}
    if unknown:
        raise ValueError(f"unknown keys {sorted(unknown)} for model {entry.name!r}; allowed: {sorted(entry.keys)}")


def build(task: str, cfg: Mapping[str, Any], **context: Any) -> nn.Module:
    """The network of ``task`` named by ``cfg['name']``, built from the rest of ``cfg`` and the task's context."""
    entry = lookup(task, cfg.get("name"))
    check_keys(entry, cfg)
    return entry.builder(copy.deepcopy({k: v for k, v in cfg.items() if k != "name"}), **context)
