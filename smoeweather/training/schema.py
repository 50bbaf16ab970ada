"""The one schema of ``smoe train`` configs, per task: unknown keys and wrong types are errors.

``TASK_SCHEMAS`` maps a task name to the :class:`~smoeweather.config.Block` of its whole config. Tasks
added later (e.g. ``vision``) call :func:`register_task_schema`; a task without a registered schema gets
:data:`COMMON` (top level, ``training`` and ``trainer`` checked, ``data``/``model`` left to its builder).
``model`` blocks of the weather tasks are checked by :func:`smoeweather.models.registry.build_weather_model`
(its key lists depend on ``model.name``) and heat models by their constructors; ``trainer`` keys are the
parameters of :class:`lightning.Trainer` except those ``smoe train`` sets itself.
"""

from __future__ import annotations

import inspect
from typing import Any

from smoeweather.config import Block, ConfigError, validate

NUM = (float,)  # an int is accepted where a float is (1e-3 and 1 alike)
INT, BOOL, STR, LIST = (int,), (bool,), (str,), (list,)
NULL = type(None)

SET_BY_SMOE_TRAIN = ("callbacks", "logger", "default_root_dir")
"""``lightning.Trainer`` arguments that ``smoe train`` builds itself (checkpoints, logs, early stopping)."""


def trainer_block() -> Block:
    """``trainer``: any keyword of ``lightning.Trainer`` (values are checked by Lightning itself)."""
    import lightning as L

    names = [p for p in inspect.signature(L.Trainer.__init__).parameters if p != "self"]
    return Block({name: (object,) for name in names if name not in SET_BY_SMOE_TRAIN})


TRAINING = Block({
    "lr": NUM,
    "plateau_factor": NUM,
    "plateau_patience": INT,
    "early_stopping_patience": INT,
    "aux_weight": NUM,
    "freeze_batchnorm": BOOL,
    "optimizer": STR,
    "diagnose_error_scale": BOOL,  # smoeweather.training.diagnostics: measure dL/dy at SMoE layers
})

SPLIT_KEYS: dict[str, Any] = {
    f"{split}_{kind}": (list, NULL) for split in ("train", "valid", "test") for kind in ("years", "period")
}
LOADER_KEYS: dict[str, Any] = {"batch_size": INT, "num_workers": INT}
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
    "sampler": STR,  # smoeweather.data.sampling: "random" (default) or "time_blocks"
    "block_size": (int, NULL),  # time_blocks: samples per block, dividing batch_size (default: batch_size)
    **SPLIT_KEYS,
    **LOADER_KEYS,
})
ENS10_DATA = Block({
    "store": STR,
    **STORE_CREATION,
    "variables": LIST,
    "target_variables": (list, NULL),
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
        "seed": INT,
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
    "ens10": lambda: _task(ENS10_DATA),
    "heat": lambda: _task(HEAT_DATA),
}
"""task → zero-argument function returning its schema (built lazily: the trainer block imports Lightning)."""


def register_task_schema(task: str, schema: Block | Any) -> None:
    """Add (or replace) the schema of ``task``: a :class:`Block` or a function returning one."""
    TASK_SCHEMAS[task] = schema if callable(schema) and not isinstance(schema, Block) else (lambda: schema)


def schema_for(task: str) -> Block:
    """The schema of ``task`` (:func:`common` when none is registered)."""
    return TASK_SCHEMAS.get(task, common)()


def validate_train_config(cfg: dict[str, Any]) -> None:
    """ConfigError unless ``cfg`` fits the schema of its task (unknown key, wrong type, missing task)."""
    if not isinstance(cfg, dict):
        raise ConfigError(f"a training config must be a mapping, got {type(cfg).__name__}")
    task = cfg.get("task")
    if not isinstance(task, str):
        raise ConfigError(f"config key 'task' must name the task (one of {', '.join(TASK_SCHEMAS)}), got {task!r}")
    validate(cfg, schema_for(task))
