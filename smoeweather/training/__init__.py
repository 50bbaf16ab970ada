"""smoeweather.training: ``smoe train`` (Lightning) for every task.

Importing the package registers the built-in tasks (:mod:`~smoeweather.training.tasks`: weatherbench,
postprocess, heat; :mod:`~smoeweather.vision.task`: vision) with :mod:`~smoeweather.training.registry`,
which itself imports nothing above it: a task registers itself, the registry never imports it back.
:func:`load_config` reads a ``smoe train`` config and returns it validated and typed (:class:`TrainConfig`).
"""

from smoeweather.training import tasks  # noqa: F401 - registration on import
from smoeweather.training.settings import TrainConfig, load_config
from smoeweather.vision import task as vision  # noqa: F401

__all__ = ["TrainConfig", "load_config"]
