"""smoeweather.training: ``smoe train`` (Lightning) for every task.

Importing the package registers the built-in tasks (:mod:`~smoeweather.training.tasks`: weatherbench,
postprocess, heat; :mod:`~smoeweather.training.vision`: vision) with :mod:`~smoeweather.training.registry`,
which itself imports nothing above it: a task registers itself, the registry never imports it back.
"""

from smoeweather.training import tasks, vision  # noqa: F401 - registration on import
