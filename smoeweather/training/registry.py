"""The tasks ``smoe train`` knows, each registered by the module that implements it.

A task is a name and a builder (config → data module and Lightning module); a task whose network the
Lightning-free loader rebuilds (:mod:`smoeweather.models.loader`) also gives the training module around such a
network, so a checkpoint can be reloaded for training. ``smoeweather.training.tasks`` registers the weather,
post-processing and heat tasks, ``smoeweather.vision.task`` the vision task, both imported by the package's
``__init__``; a new task registers itself the same way, with its config schema
(:func:`smoeweather.training.schema.register_task_schema`). This module imports nothing above it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import lightning as L
from torch import nn

Builder = Callable[[dict[str, Any]], tuple[Any, L.LightningModule]]
ModuleAround = Callable[[dict[str, Any], nn.Module], L.LightningModule]


@dataclass(frozen=True)
class Task:
    """A ``smoe train`` task: ``build(cfg) -> (data module, module)``; ``module_around(metadata, network)``
    wraps a network rebuilt from a checkpoint's metadata in the task's training module (None: no such network)."""

    name: str
    build: Builder
    module_around: ModuleAround | None = None


_TASKS: dict[str, Task] = {}


def register_task(name: str, build: Builder, module_around: ModuleAround | None = None) -> None:
    """Make ``name`` a task of ``smoe train`` (registering a name twice replaces the first)."""
    _TASKS[name] = Task(name, build, module_around)


def registered_tasks() -> dict[str, Task]:
    """Every registered task by name (the built-in ones register when :mod:`smoeweather.training` is imported,
    which importing this module does first)."""
    return dict(_TASKS)


def task(name: Any) -> Task:
    """The registered task ``name``; ValueError listing the tasks for any other name."""
    tasks = registered_tasks()
    if name not in tasks:
        raise ValueError(f"config task must be one of {tuple(tasks)}, got {name!r}")
    return tasks[name]
