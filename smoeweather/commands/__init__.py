"""One module per ``smoe`` verb.

Each module defines ``NAME`` (the verb), ``add_parser(sub)`` (argparse only: no heavy imports at module
level, so ``smoe --help`` stays fast) and ``run(args) -> int`` (imports what it needs lazily).
To add a verb, write ``smoeweather/commands/<verb>.py`` and list it in ``VERBS`` below.
"""

VERBS: tuple[str, ...] = (
    "heat",
    "data",
    "train",
    "forecast",
    "evaluate",
    "postprocess",
    "plot",
    "demo",
    "study",
    "vision",
    "checkpoint",
    "export",
)
