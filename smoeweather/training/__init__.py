"""smoeweather.training: ``smoe train`` (Lightning) for every task.

Importing the package registers the built-in tasks (:mod:`~smoeweather.training.tasks`: weatherbench,
postprocess, heat; :mod:`~smoeweather.training.vision`: vision) with :mod:`~smoeweather.training.registry`,
which itself imports nothing above it: a task registers itself, the registry never imports it back.
:func:`load_config` reads a ``smoe train`` config and returns it validated and typed (:class:`TrainConfig`).
"""

from smoeweather.training import tasks, vision  # noqa: F401 - registration on import
from smoeweather.training.settings import TrainConfig, load_config

__all__ = ["TrainConfig", "load_config"]
