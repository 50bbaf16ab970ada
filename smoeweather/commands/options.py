"""Checks of command-line option values that argparse's types cannot express, each a one-line ValueError naming
the option, what was expected and how to fix it (``smoeweather.cli`` prints it and exits 2): counts that must be
at least 1 and torch devices. Lead times and durations are parsed by :func:`smoeweather.data.ensembles.parse_lead`
and :func:`smoeweather.forecast.output.init_times`, which name their options too.

Also the options more than one verb declares: the ``benchmark`` verb of the task commands (``smoe heat``, ``smoe
vision``) and its ``--only`` list of rows."""

from __future__ import annotations

import argparse
from pathlib import Path


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
