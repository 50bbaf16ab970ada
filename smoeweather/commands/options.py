"""Checks of command-line option values that argparse's types cannot express, each a one-line ValueError naming
the option, what was expected and how to fix it (``smoeweather.cli`` prints it and exits 2): counts that must be
at least 1 and torch devices. Lead times and durations are parsed by :func:`smoeweather.data.forecast_stores.parse_lead`
and :func:`smoeweather.forecast.output.init_times`, which name their options too.

Also the options more than one verb declares: the ``benchmark`` verb of the task commands (``smoe heat``, ``smoe
vision``) and its ``--only`` list of rows; and options generated from typed settings (:func:`add_settings`,
:func:`settings_of_args`): each field of a settings dataclass with an ``option`` (:func:`smoeweather.config.setting`)
is one option, its default, type and help taken from the field, its value checked by the field's bounds naming the
option, so a default is written once, in its field."""

from __future__ import annotations

import argparse
import dataclasses
import types
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import Any


def comma_list(text: str) -> list[str]:
    """The non-empty items of a comma-separated option value (``--only smoe,conv`` → ["smoe", "conv"])."""
    return [item for item in text.split(",") if item]


def benchmark_verb(verbs: argparse._SubParsersAction, summary: str, quick: str) -> argparse.ArgumentParser:
    """The ``benchmark`` verb of a task command (help ``summary``) with its --out folder and --quick (help
    ``quick``); the command adds the rest (:func:`benchmark_rows` for --config and --only)."""
    bench = verbs.add_parser("benchmark", help=summary)
    bench.add_argument("--out", required=True, type=Path, help="output directory")
    bench.add_argument("--quick", action="store_true", help=quick)
    return bench


def benchmark_rows(bench: argparse.ArgumentParser, task: str, only: str) -> None:
    """--config (default ``configs/TASK/benchmark.yaml``) and --only (help ``only``: which rows, an example) of a
    ``benchmark`` verb."""
    bench.add_argument("--config", type=Path, default=None,
                       help=f"benchmark YAML (default configs/{task}/benchmark.yaml)")
    bench.add_argument("--only", default=None, type=comma_list, help=only)


def check_count(value: int, option: str, minimum: int = 1, example: int | None = None) -> int:
    """``value`` when it is an integer ≥ ``minimum``; ValueError naming ``option`` otherwise
    (``--batch-size must be >= 1, got 0; set e.g. --batch-size 16``)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        fix = f"; set e.g. {option} {example}" if example is not None else ""
        raise ValueError(f"{option} must be a whole number >= {minimum}, got {value!r}{fix}")
    return value


def check_device(value: str, option: str = "--device") -> str:
    """``value`` when it names a torch device this machine has (``cpu``, ``cuda``, ``cuda:1``, ``mps``);
    ValueError naming ``option`` for a name torch does not know or a device this build or machine lacks
    (``--device cuda`` on a CPU build of torch)."""
    import torch

    try:
        device = torch.device(value)
    except (RuntimeError, TypeError, ValueError):
        raise ValueError(f"{option} {value!r} is not a torch device; give e.g. cpu, cuda or cuda:0") from None
    available = ["cpu"]
    if torch.cuda.is_available():
        available += [f"cuda (cuda:0 … cuda:{torch.cuda.device_count() - 1})"]
    if torch.backends.mps.is_available():
        available.append("mps")
    if device.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0 or (device.index is not None and device.index >= count):
            reason = ("torch was built without CUDA" if torch.version.cuda is None
                      else f"this machine has {count} CUDA device(s)")
            raise ValueError(f"{option} {value}: no such CUDA device ({reason}); use one of {', '.join(available)}")
    elif device.type == "mps" and not torch.backends.mps.is_available():
        raise ValueError(f"{option} {value}: Apple's MPS is not available here; use one of {', '.join(available)}")
    elif device.type not in ("cpu", "cuda", "mps"):
        raise ValueError(f"{option} {value}: smoe forecasts on cpu, cuda or mps; use one of {', '.join(available)}")
    return value


# ---- options generated from typed settings: one default, one bound, one help text per field ----------------------
def _option_kwargs(f: dataclasses.Field, hint: Any) -> dict[str, Any]:
    """argparse keywords of the settings field ``f`` with the resolved type hint ``hint``: ``store_true`` for a
    bool, ``choices`` for a Literal, ``nargs`` for a tuple, else ``type``; the field's default and metavar."""
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    if typing.get_origin(hint) in (typing.Union, types.UnionType) and len(args) == 1:
        hint, args = args[0], list(typing.get_args(args[0]))  # Optional[X]: X with a None default
    default = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]
    out: dict[str, Any] = {"default": default}
    if hint is bool:
        return {**out, "action": "store_true"}
    origin = typing.get_origin(hint)
    if origin is typing.Literal:
        out.update(choices=list(args), type=type(args[0]))
    elif origin is tuple:
        out.update(nargs="+" if args[-1] is Ellipsis else len(args), type=args[0])
    else:
        out["type"] = hint
    if f.metadata.get("metavar") is not None:
        out["metavar"] = f.metadata["metavar"]
    return out


def _help(f: dataclasses.Field, default: Any) -> str:
    """The field's doc, with its default where it is a value (None, False and empty defaults the doc words)."""
    text = str(f.metadata.get("doc", "")).replace("%", "%%")
    if default is None or default is False or default == ():
        return text
    return f"{text} (default {default})"


def dest_of(f: dataclasses.Field) -> str:
    """The argparse ``dest`` of a settings field: its first option without dashes (``--drn-hidden``: drn_hidden)."""
    return str(f.metadata["option"][0]).lstrip("-").replace("-", "_")


def add_settings(parser: argparse.ArgumentParser | argparse._ArgumentGroup, cls: type[Any],
                 only: Sequence[str] | None = None) -> None:
    """One option per field of the settings dataclass ``cls`` that has an ``option``
    (:func:`smoeweather.config.setting`; ``only``: these fields), its name, type, default and help from the field.
    A field whose option the parser has already (a field two blocks share, ``--distribution``) is added once, and
    must have the same default there."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        options = f.metadata.get("option") or ()
        if not options or (only is not None and f.name not in only):
            continue
        kwargs = _option_kwargs(f, hints[f.name])
        have = parser._option_string_actions.get(options[0])
        if have is not None:
            if have.default != kwargs["default"]:
                raise TypeError(f"{cls.__name__}.{f.name}: {options[0]} is another block's option with the default "
                                f"{have.default!r}, not {kwargs['default']!r}")
            continue
        parser.add_argument(*options, dest=dest_of(f), help=_help(f, kwargs["default"]), **kwargs)


def settings_of_args(cls: type[Any], args: argparse.Namespace) -> Any:
    """The settings ``cls`` of the options :func:`add_settings` gave ``args`` (fields without an option, or
    whose option the command lacks, keep their defaults), validated naming the option
    (``--drn-hidden must be >= 1, got 0; set e.g. --drn-hidden 32``)."""
    values = {f.name: getattr(args, dest_of(f)) for f in dataclasses.fields(cls)
              if f.metadata.get("option") and hasattr(args, dest_of(f))}
    return cls.of(values, by_option=True)
