"""The ``smoe`` command: one verb per stage of the pipeline (``smoe --help`` lists them).

Each verb lives in ``smoeweather/commands/<verb>.py``; this module only assembles the parser and turns
the errors a user can cause (bad path, bad option, bad data) into one clear line and exit status 2.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from types import ModuleType

from smoeweather.commands import VERBS

DESCRIPTION = (
    "Spatial Mixture-of-Experts forecasting of weather on fixed grids. One verb per stage: data (prepare a "
    "store) -> train -> forecast -> evaluate -> postprocess -> plot; demo runs the whole chain on the embedded "
    "default world, study runs seeded comparisons. 'smoe VERB --help' lists a verb's options."
)
USER_ERRORS = (ValueError, FileExistsError, FileNotFoundError, KeyError, NotADirectoryError, IsADirectoryError)


def _verb_modules() -> dict[str, ModuleType]:
    return {name: importlib.import_module(f"smoeweather.commands.{name}") for name in VERBS}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="smoe", description=DESCRIPTION)
    sub = parser.add_subparsers(dest="command", required=True)
    for module in _verb_modules().values():
        module.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser().parse_args(argv)
    module = _verb_modules()[args.command]
    try:
        return int(module.run(args) or 0)
    except USER_ERRORS as err:
        message = err.args[0] if isinstance(err, KeyError) and err.args else err
        print(f"smoe {args.command}: error: {message}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
