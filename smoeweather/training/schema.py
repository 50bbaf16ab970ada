"""The one schema of ``smoe train`` configs, per task: unknown keys and wrong types are errors.

``TASK_SCHEMAS`` maps a task name to the :class:`~smoeweather.config.Block` of its whole config. Tasks
added later (e.g. ``vision``) call :func:`register_task_schema`; a task without a registered schema gets
:data:`COMMON` (top level, ``training`` and ``trainer`` checked, ``data``/``model`` left to its builder).
``model`` blocks of every task are checked against the network registered under their name
(:mod:`smoeweather.models.registry`;
its key lists depend on ``model.name``) and heat models by their constructors; ``trainer`` keys are the
parameters of :class:`lightning.Trainer` except those ``smoe train`` sets itself.

Value types of the blocks passed on as keyword arguments (``model`` of every task, ``trainer``,
``data.world``, ``data.generate``) are checked against the type hints of what receives them
(:data:`ARGUMENTS`, :data:`MODEL_ARGUMENTS`): a wrong type names the key and the expected type before
anything is built, and a new constructor argument is covered by its hint without a schema change.
"""

from __future__ import annotations

import inspect
from typing import Any

from smoeweather.config import Arguments, Block, Bounded, ConfigError, settings_specs, validate
from smoeweather.training.blocks import TrainingSettings, loader_specs, training_settings

NUM = (float,)  # an int is accepted where a float is (1e-3 and 1 alike)
INT, BOOL, STR, LIST = (int,), (bool,), (str,), (list,)
NULL = type(None)

SET_BY_SMOE_TRAIN = ("callbacks", "logger", "default_root_dir")
"""``lightning.Trainer`` arguments that ``smoe train`` builds itself (checkpoints, early stopping, the loggers:
``trainer.logger`` names trackers, :mod:`smoeweather.training.trackers`)."""


def trainer_block() -> Block:
    """``trainer``: any keyword of ``lightning.Trainer`` (values are checked by Lightning itself), and
    ``logger``: the experiment trackers (:func:`~smoeweather.training.trackers.parse_trackers`)."""
    import lightning as L

    from smoeweather.training.trackers import TrackerSpec

    names = [p for p in inspect.signature(L.Trainer.__init__).parameters if p != "self"]
    return Block({**{name: (object,) for name in names if name not in SET_BY_SMOE_TRAIN}, "logger": TrackerSpec()})


TRAINING = Block(settings_specs(TrainingSettings))
"""``training``: the fields of :class:`~smoeweather.training.blocks.TrainingSettings` (types, bounds)."""

SPLIT_KEYS: dict[str, Any] = {
    f"{split}_{kind}": (list, NULL) for split in ("train", "valid", "test") for kind in ("years", "period")
}
LOADER_KEYS: dict[str, Any] = loader_specs()
"""``data`` keys of every task's loader (:class:`~smoeweather.training.blocks.LoaderSettings`)."""
STORE_CREATION: dict[str, Any] = {
    "world": Block(None, nullable=True),  # pipelines.world.generate_world arguments
    "sources": (list, NULL),
    "store_variables": (list, NULL),
    "statistics_years": (list, NULL),
}

WEATHERBENCH_DATA = Block({
    "store": STR,
    **STORE_CREATION,
    "variables": LIST,
    "target_variables": (list, NULL),
    "input_offsets_h": LIST,
    "lead_h": (int, NULL),
    "lead_choices_h": (list, NULL),
    "constants": (list, NULL),
    "cache": (bool, str),  # smoeweather.data.cache: false, true or "auto"
    "cache_max_gb": (float, NULL),
    **SPLIT_KEYS,
    **LOADER_KEYS,
})
POSTPROCESS_DATA = Block({  # task postprocess: smoeweather.training.tasks.build_postprocess
    "store": STR,  # a `smoe data prepare ens10` store (alias of source; created from world/sources if missing)
    "source": (str, list),  # ensemble file(s)/store(s) of any supported layout
    "truth": (str, list, NULL),  # truth store(s); default: the truth inside the source
    "constants": (str, NULL),  # file with land_sea_mask / geopotential_at_surface (default: the source)
    **STORE_CREATION,
    "variables": LIST,
    "target_variables": (list, NULL),
    "leads_h": (list, NULL),  # default: every lead of the source
    "lead_h": (int, NULL),
    "lead_as_input": BOOL,
    "static": (list, NULL),  # land_sea_mask, orography, latitude
    "cache": BOOL,
    **SPLIT_KEYS,
    **LOADER_KEYS,
})
HEAT_DATA = Block({
    "store": STR,
    "generate": Block(None, nullable=True),  # pipelines.heat_diffusion.generate arguments
    "max_runs": Block({"train": (int, NULL), "valid": (int, NULL), "test": (int, NULL)}, nullable=True),
    **LOADER_KEYS,
})


def common() -> Block:
    """Top level shared by every task; ``data`` and ``model`` free (each task's schema narrows them)."""
    return Block({
        "task": STR,
        "seed": Bounded(INT, ge=0, le=2**32 - 1, example=0),  # numpy's and torch's seeds: 0 … 2³² − 1
        "output_dir": (str, NULL),
        "data": Block(None),
        "model": Block(None),
        "training": TRAINING,
        "trainer": trainer_block(),
    })


def _task(data: Block) -> Block:
    return common().extended(data=data)


TASK_SCHEMAS: dict[str, Any] = {
    "weatherbench": lambda: _task(WEATHERBENCH_DATA),
    "postprocess": lambda: _task(POSTPROCESS_DATA),
    "heat": lambda: _task(HEAT_DATA),
}
"""task → zero-argument function returning its schema (built lazily: the trainer block imports Lightning)."""


def register_task_schema(task: str, schema: Block | Any) -> None:
    """Add (or replace) the schema of ``task``: a :class:`Block` or a function returning one."""
    TASK_SCHEMAS[task] = schema if callable(schema) and not isinstance(schema, Block) else (lambda: schema)


def schema_for(task: str) -> Block:
    """The schema of ``task`` (:func:`common` when none is registered)."""
    return TASK_SCHEMAS.get(task, common)()


def _registered(task: str) -> Any:
    """The ``model`` block's (constructor, mapping, suffix) list from the network's registry entry (none for an
    unknown name, which the key check refuses); heat rows also pass through :func:`build_heat_model`."""

    def targets(value: dict[str, Any]) -> list[tuple[Any, Any, str]]:
        from smoeweather.heat.models import build_heat_model
        from smoeweather.models import registry

        name = value.get("name", "smoe") if task == "heat" else value.get("name")
        entry = registry.entries_by_name(task).get(name)
        head = [(build_heat_model, value, "")] if task == "heat" else []
        return head + (entry.arguments(value) if entry is not None else [])

    return targets


MODEL_ARGUMENTS: dict[str, Arguments] = {
    "weatherbench": Arguments(_registered("weather")),
    "postprocess": Arguments(_registered("weather")),
    "heat": Arguments(_registered("heat"), nullable=True),
    "vision": Arguments(_registered("vision")),
}
"""task → the ``model`` block's :class:`~smoeweather.config.Arguments` (constructors chosen by ``model.name``)."""


def _weather_model_keys(value: Any) -> None:
    from smoeweather.models.registry import parameters
    from smoeweather.models.weather import check_model_builds, check_model_config, known_model_keys

    extra: dict[str, set[str]] = {}
    for fn, values, suffix in MODEL_ARGUMENTS["weatherbench"].targets(value) if isinstance(value, dict) else []:
        if fn is not None and isinstance(values, dict):
            extra.setdefault(suffix, set()).update(parameters(fn) or ())
    check_model_config(value, extra_keys=extra)
    known = known_model_keys(value.get("name")) | {"name"}
    check_model_builds({k: v for k, v in value.items() if k in known})  # keys the builder takes (not a mock's)


def _heat_model_keys(value: Any) -> None:
    """Unknown ``model`` keys of a heat model (its builder's keywords, and the SMoE layer's for SMoE rows)."""
    import inspect

    from smoeweather.config import unknown_key_message
    from smoeweather.models import registry
    from smoeweather.models.registry import parameters
    from smoeweather.nn.smoe import SpatialMoE2d

    try:
        entry = registry.lookup("heat", (value or {}).get("name", "smoe"))
    except ValueError as err:
        raise ConfigError(str(err)) from None
    ((builder, _, _),) = entry.arguments({})
    params = inspect.signature(builder).parameters.values()
    keys = {p.name for p in params if p.kind is not p.VAR_KEYWORD} - {"size"} | {"name", "init"}
    if any(p.kind is p.VAR_KEYWORD for p in params):  # SMoE rows pass the rest to the layer
        keys |= parameters(SpatialMoE2d) or set()
    for key in value or {}:
        if key not in keys:
            raise ConfigError(unknown_key_message(f"model.{key}", keys, "model"))


MODEL_CHECKS: dict[str, Any] = {"weatherbench": _weather_model_keys, "postprocess": _weather_model_keys,
                                "heat": _heat_model_keys}
"""task → check of its ``model`` block's keys (did-you-mean at every level) and bounds, before anything runs."""

ARGUMENTS: dict[str, Arguments] = {
    "trainer": Arguments.of("lightning:Trainer", nullable=True),
    "data.world": Arguments.of("pipelines.world:generate_world", nullable=True),
    "data.generate": Arguments.of("pipelines.heat_diffusion:generate", nullable=True),
}
"""Dotted key → :class:`~smoeweather.config.Arguments` of the blocks every task passes on as keywords."""


def check_argument_types(cfg: dict[str, Any]) -> None:
    """ConfigError naming the key and expected type when a value passed on as a keyword argument (the
    ``model`` block of ``cfg['task']``, ``trainer``, ``data.world``, ``data.generate``) does not fit the
    receiving parameter's type hint."""
    specs = {**ARGUMENTS, **({"model": MODEL_ARGUMENTS[cfg["task"]]} if cfg.get("task") in MODEL_ARGUMENTS else {})}
    for path, spec in specs.items():
        node: Any = cfg
        for part in path.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        if node is not None:
            spec.check(node, path)
    if cfg.get("task") in MODEL_CHECKS and cfg.get("model") is not None:
        MODEL_CHECKS[cfg["task"]](cfg["model"])


def check_trainer_counts(trainer: dict[str, Any]) -> None:
    """ConfigError naming the key for ``trainer.max_epochs`` / ``max_steps`` of 0 (a fit that trains nothing and
    writes no checkpoint) or below -1 (-1: no limit)."""
    for key in ("max_epochs", "max_steps"):
        value = trainer.get(key)
        if value is None or isinstance(value, bool) or not isinstance(value, int):
            continue
        if value == 0 or value < -1:
            raise ConfigError(f"config key 'trainer.{key}' must be >= 1 (or -1: no limit), got {value}: a fit of "
                              f"{value} {key.split('_')[1]} trains nothing and writes no checkpoint; set e.g. "
                              f"trainer.{key}={10 if key.endswith('epochs') else 1000}")


ACCELERATOR_ALIASES = {"gpu": ("cuda", "mps")}
"""Lightning's accelerator names that stand for one of several (``gpu``: CUDA or Apple's MPS)."""


def check_accelerator(value: Any, key: str = "trainer.accelerator", here: bool = False) -> None:
    """ConfigError naming ``key`` when ``value`` is no accelerator Lightning knows, or (``here``: the config is
    about to train on this machine) one this machine lacks (``tpu`` without torch_xla, ``gpu``/``cuda`` on a CPU
    build of torch), for which Lightning would raise an import error or a traceback when the trainer is built.
    A shipped GPU config still validates on a CPU machine (``here`` False). ``auto``, null and non-strings are
    left to Lightning."""
    if not isinstance(value, str) or value == "auto":
        return
    from lightning.pytorch.accelerators import AcceleratorRegistry

    def available(name: str) -> bool:
        try:
            return bool(AcceleratorRegistry[name]["accelerator"].is_available())
        except Exception:  # noqa: BLE001 - a backend that cannot even be asked (its package is missing) is absent
            return False

    names = sorted(AcceleratorRegistry.available_accelerators())
    present = ", ".join(["auto", *(n for n in names if available(n))])
    wanted = ACCELERATOR_ALIASES.get(value.lower(), (value.lower(),))
    if not any(n in names for n in wanted):
        raise ConfigError(f"config key {key!r} must be one of auto, gpu, {', '.join(names)}, got {value!r}; "
                          f"this machine has {present}")
    if here and not any(available(n) for n in wanted if n in names):
        raise ConfigError(f"config key {key!r} is {value!r}, but this machine has no such device (or torch was "
                          f"built without it); use one of {present}")


def check_split_order(data: Any) -> None:
    """ConfigError naming the key of a ``data.<split>_years`` or ``data.<split>_period`` whose end lies before
    its start (it would select no time, and the message would blame the data)."""
    import pandas as pd

    for key in SPLIT_KEYS:
        value = data.get(key) if isinstance(data, dict) else None
        if not isinstance(value, list) or len(value) != 2:
            continue
        try:
            start, end = (pd.Timestamp(str(v)) for v in value)
        except ValueError:
            raise ConfigError(f"config key 'data.{key}' must be [start, end] dates or years, e.g. "
                              f"[2000-01-01, 2000-12-31], got {value!r}") from None
        if end < start:
            raise ConfigError(f"config key 'data.{key}' ends before it starts ({value[0]} > {value[1]}); give "
                              f"[start, end], e.g. data.{key}=[{value[1]}, {value[0]}]")


def validate_train_config(cfg: dict[str, Any]) -> None:
    """ConfigError unless ``cfg`` fits the schema of its task (unknown key, wrong type, missing task),
    including the types of the ``model`` and ``trainer`` values (:func:`check_argument_types`)."""
    if not isinstance(cfg, dict):
        raise ConfigError(f"a training config must be a mapping, got {type(cfg).__name__}")
    from smoeweather.models.loader import canonical_task

    task = cfg["task"] = canonical_task(cfg.get("task"))  # `ens10` → `postprocess` (DeprecationWarning)
    if not isinstance(task, str):
        raise ConfigError(f"config key 'task' must name the task (one of {', '.join(TASK_SCHEMAS)}), got {task!r}")
    validate(cfg, schema_for(task))
    check_argument_types(cfg)
    check_accelerator((cfg.get("trainer") or {}).get("accelerator"))
    check_split_order(cfg.get("data"))
    check_trainer_counts(cfg.get("trainer") or {})
    if task == "weatherbench" and isinstance(cfg.get("model"), dict):
        from smoeweather.training.ensemble_forecasting import check_loss

        try:
            check_loss(cfg["model"], training_settings(cfg))  # training.loss against model.name, before the store
        except ValueError as err:
            raise ConfigError(str(err)) from None
