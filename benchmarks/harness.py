"""The benchmarks' one harness: timing rounds, pinned threads, ratios against a baseline measured in the same run,
the machine's state, and the results files.

Every benchmark runs from the repository root as a module of the ``benchmarks`` package::

    python -m benchmarks.smoe_layer --device cpu
    python -m benchmarks.studies.budget_selection --study A.json --study B.json --out OUT.md

Timing. :func:`timed` and :class:`Stopwatch` time one call or one block of code; :func:`block_seconds` times a block
of calls (seconds per call), :func:`call_seconds` each call on its own; :func:`interleave` runs variants in rounds
(every variant once a round, the order reversed every other round, so a drifting machine load hits every variant
alike) and returns :class:`Rounds`: medians, spreads, and ratios to a baseline of the same rounds (the median of the
per-round ratios, paired, or the ratio of the medians); :func:`step_clock` times the steps of a Lightning fit. The
clock is :func:`time.perf_counter`; ``sync`` (e.g. ``torch.cuda.synchronize``) runs before the clock starts and
before it stops.

Threads. :func:`pin_threads` sets torch's intra-op threads (and, where asked, ``OMP/MKL/OPENBLAS_NUM_THREADS`` for
processes started later); :func:`thread_defaults` sets those variables where unset, before torch and numpy load;
:func:`thread_env` is the environment of a child process with its threads pinned.

Machine and results. :class:`Machine` records the load average when created and again when recorded, with the CPU
model, core count, torch version and threads, the GPU, the git commit and the command; :func:`write_results` writes
a result's JSON (with that record under ``machine_state``) and its markdown beside it, atomically. Results go to
``benchmarks/results/`` (:data:`RESULTS`); ``SMOE_BENCHMARK_RESULTS=DIR`` sends them to DIR instead (a dry run).
"""

from __future__ import annotations

import json
import os
import platform
import shlex
import statistics
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from smoeweather.studies.run import cpu_model  # noqa: F401 - the one reading of the CPU model; benchmarks import it here

REPO = Path(__file__).resolve().parents[1]
# where results go: benchmarks/results, or SMOE_BENCHMARK_RESULTS (a dry run that leaves the committed files alone)
RESULTS = Path(os.environ.get("SMOE_BENCHMARK_RESULTS") or REPO / "benchmarks" / "results")
THREAD_ENV = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")

clock = time.perf_counter  # the one clock of every benchmark


# ---- timing ---------------------------------------------------------------------------------------------------------
class Stopwatch:
    """``with Stopwatch() as watch: ...`` then ``watch.seconds``; ``watch.elapsed()`` while it runs. ``sync`` runs
    before the start and before the stop (a device's queue drained)."""

    def __init__(self, sync: Callable[[], Any] | None = None) -> None:
        self.sync, self.start, self.seconds = sync, clock(), 0.0

    def __enter__(self) -> Stopwatch:
        if self.sync is not None:
            self.sync()
        self.start = clock()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.sync is not None and exc[0] is None:
            self.sync()
        self.seconds = clock() - self.start

    def elapsed(self) -> float:
        """Seconds since the start."""
        return clock() - self.start


def timed(fn: Callable[..., Any], *args: Any, sync: Callable[[], Any] | None = None, **kwargs: Any
          ) -> tuple[Any, float]:
    """``(fn(*args, **kwargs), its wall seconds)``."""
    with Stopwatch(sync) as watch:
        out = fn(*args, **kwargs)
    return out, watch.seconds


def warm_up(fn: Callable[[], Any], calls: int) -> None:
    """``calls`` untimed calls (allocator, kernels, caches)."""
    for _ in range(calls):
        fn()


def block_seconds(fn: Callable[[], Any], calls: int = 1, sync: Callable[[], Any] | None = None) -> float:
    """Seconds per call of ``calls`` calls timed as one block."""
    with Stopwatch(sync) as watch:
        for _ in range(calls):
            fn()
    return watch.seconds / calls


def call_seconds(fn: Callable[[], Any], calls: int, sync: Callable[[], Any] | None = None,
                 before: Callable[[], Any] | None = None) -> list[float]:
    """Each of ``calls`` calls timed on its own (``before()`` runs untimed ahead of each, e.g. ``gc.collect``)."""
    out = []
    for _ in range(calls):
        if before is not None:
            before()
        out.append(timed(fn, sync=sync)[1])
    return out


def median_seconds(fn: Callable[[], Any], calls: int, sync: Callable[[], Any] | None = None) -> float:
    """Median seconds of ``calls`` calls, each timed on its own."""
    return statistics.median(call_seconds(fn, calls, sync))


def spread(values: Sequence[float]) -> dict[str, float]:
    """Median, min and max of ``values`` (seconds of rounds, ratios), and how many."""
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


@dataclass
class Rounds:
    """What :func:`interleave` measured: per variant one value (seconds) per round, in round order."""

    seconds: dict[str, list[float]]

    def median(self, name: str) -> float:
        """Median over the rounds of ``name``."""
        return statistics.median(self.seconds[name])

    def medians(self) -> dict[str, float]:
        """Median over the rounds of every variant."""
        return {k: statistics.median(v) for k, v in self.seconds.items()}

    def spread(self, name: str) -> dict[str, float]:
        """Median, min and max over the rounds of ``name``."""
        return spread(self.seconds[name])

    def ratios(self, name: str, baseline: str) -> list[float]:
        """Per round: ``name`` over ``baseline`` of the same round."""
        return [a / b for a, b in zip(self.seconds[name], self.seconds[baseline], strict=True)]

    def ratio(self, name: str, baseline: str) -> float:
        """Median of the per-round ratios (paired: a slow drift of the load cancels)."""
        return statistics.median(self.ratios(name, baseline))

    def ratio_of_medians(self, name: str, baseline: str) -> float:
        """Median of ``name`` over median of ``baseline``."""
        return self.median(name) / self.median(baseline)


def interleave(variants: Mapping[str, Callable[[], float]], rounds: int, *, alternate: bool = True,
               blocks: int = 1, on_round: Callable[[int, Rounds], Any] | None = None) -> Rounds:
    """Run every variant once per round; each callable returns the seconds it measured (e.g. a
    :func:`block_seconds` of its step). ``alternate``: the order is reversed every other round. ``blocks`` > 1:
    a round is that many passes over the variants in the round's order, a variant's value the median of its
    passes. ``on_round(r, so_far)`` after each round (progress lines). Warm-ups are the caller's (:func:`warm_up`)."""
    out = Rounds({k: [] for k in variants})
    for r in range(rounds):
        order = list(variants) if r % 2 == 0 or not alternate else list(reversed(variants))
        passes: dict[str, list[float]] = {k: [] for k in variants}
        for _ in range(max(blocks, 1)):
            for key in order:
                passes[key].append(variants[key]())
        for key in variants:
            out.seconds[key].append(statistics.median(passes[key]))
        if on_round is not None:
            on_round(r, out)
    return out


def step_clock(warmup: int, sync_cuda: bool = False) -> Any:
    """A Lightning callback timing a fit's training steps from the start of step ``warmup`` (0-based) to the end of
    the last: ``.seconds`` and ``.timed`` (the steps in them). ``sync_cuda``: the GPU drained at both ends."""
    import lightning as L
    import torch

    class StepClock(L.Callback):
        def __init__(self) -> None:
            self.t0, self.t1, self.timed = 0.0, 0.0, 0

        def _sync(self) -> None:
            if sync_cuda and torch.cuda.is_available():
                torch.cuda.synchronize()

        def on_train_batch_start(self, trainer: L.Trainer, *args: Any) -> None:
            if trainer.global_step == warmup and self.timed == 0:
                self._sync()
                self.t0 = clock()

        def on_train_batch_end(self, trainer: L.Trainer, *args: Any) -> None:
            if trainer.global_step > warmup:
                self._sync()
                self.t1, self.timed = clock(), self.timed + 1

        @property
        def seconds(self) -> float:
            return self.t1 - self.t0

    return StepClock()


# ---- threads --------------------------------------------------------------------------------------------------------
def thread_env(threads: int, variables: Sequence[str] = THREAD_ENV, base: Mapping[str, str] | None = None
               ) -> dict[str, str]:
    """The environment of a child process (``base``, default this one's) with ``variables`` set to ``threads``."""
    return {**(os.environ if base is None else base), **{v: str(threads) for v in variables}}


def thread_defaults(threads: int, variables: Sequence[str] = THREAD_ENV) -> None:
    """Set those of ``variables`` not set yet to ``threads``: called before torch and numpy load, it sizes their
    thread pools (a value the caller set is kept)."""
    for name in variables:
        os.environ.setdefault(name, str(threads))


def pin_threads(threads: int | None, env: Sequence[str] = ()) -> int:
    """Set ``env`` (names of :data:`THREAD_ENV`) to ``threads`` for processes started later, then torch's intra-op
    threads of this process (``None``: torch's choice is kept); returns the count in force."""
    for name in env:
        os.environ[name] = str(threads)
    import torch

    if threads:
        torch.set_num_threads(threads)
    return torch.get_num_threads()


# ---- the machine ----------------------------------------------------------------------------------------------------
def command(argv: Sequence[str] | None = None) -> str:
    """The command that ran this benchmark, ``python -m benchmarks.NAME ARGS`` (``argv``: the arguments to show,
    default this process's)."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    args = list(sys.argv[1:] if argv is None else argv)
    return shlex.join(["python", "-m", spec.name, *args] if spec is not None else ["python", sys.argv[0], *args])


def load_average() -> list[float]:
    """The 1, 5 and 15-minute load averages, rounded to 0.01."""
    return [round(x, 2) for x in os.getloadavg()]


def device_record(device: str) -> dict[str, Any]:
    """The device a GPU benchmark ran on: torch, python, CPU architecture; the GPU's name and CUDA version."""
    import torch

    setup: dict[str, Any] = {"device": device, "torch": torch.__version__, "python": platform.python_version(),
                             "machine": platform.processor() or platform.machine()}
    if device == "cuda":
        setup["gpu"] = torch.cuda.get_device_name(0)
        setup["cuda"] = torch.version.cuda
    return setup


class Machine:
    """The machine's state over a run: created at the start (its load average then), recorded at the end."""

    def __init__(self) -> None:
        self.load_start = load_average()
        self.started = clock()

    def record(self) -> dict[str, Any]:
        """Load averages at the start and now, CPU model and cores, torch and its threads, GPU, git commit,
        command and the seconds since the start."""
        import torch

        from pipelines.provenance import git_commit

        return {"cpu": cpu_model(), "cpu_count": os.cpu_count(), "arch": platform.machine(),
                "torch": torch.__version__, "torch_threads": torch.get_num_threads(),
                "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
                "python": platform.python_version(), "git_commit": git_commit(), "command": command(),
                "load_average": {"start": self.load_start, "end": load_average()},
                "seconds": round(clock() - self.started, 1)}


# ---- results --------------------------------------------------------------------------------------------------------
def _json_default(obj: Any) -> Any:
    """Paths as text, numpy scalars and other numbers as floats, anything else as its text."""
    if isinstance(obj, Path):
        return str(obj)
    try:
        return float(obj)
    except (TypeError, ValueError):
        return str(obj)


def _stem(path: Path) -> Path:
    return path.with_suffix("") if path.suffix in (".json", ".md") else path


def write_report(path: str | Path, text: str) -> Path:
    """Write a text report (a profiler table) atomically; returns its path."""
    from smoeweather.io import write_text

    write_text(path, text)
    return Path(path)


def write_results(path: str | Path, data: Mapping[str, Any] | None, markdown: str | Sequence[str] | None = None,
                  *, machine: Machine | None = None, replace: Mapping[str, str] | None = None) -> Path:
    """Write ``data`` to ``PATH.json`` and ``markdown`` (text or lines) to ``PATH.md`` (``path`` with either suffix
    or none; ``data`` None: only the markdown), each atomically; ``machine``: its record under ``machine_state``;
    ``replace``: texts substituted in both (a scratch folder's path by a name). Returns the JSON path."""
    from smoeweather.io import write_text

    stem = _stem(Path(path))
    json_path, md_path = stem.with_name(stem.name + ".json"), stem.with_name(stem.name + ".md")

    def clean(text: str) -> str:
        for old, new in (replace or {}).items():
            text = text.replace(old, new)
        return text

    if data is not None:
        doc = {**data, "machine_state": machine.record()} if machine is not None else dict(data)
        write_text(json_path, clean(json.dumps(doc, indent=2, default=_json_default)) + "\n")
    if markdown is not None:
        text = markdown if isinstance(markdown, str) else "\n".join(markdown) + "\n"
        write_text(md_path, clean(text))
    return json_path
