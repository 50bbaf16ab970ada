"""`smoe evaluate --scheduler` on dask.distributed beside the threaded run: wall time, the 2-against-1-worker
speed-up, peak worker memory, and whether the output files are the same. A benchmark, not a test.

    nice -n 10 .venv/bin/python -m benchmarks.evaluate_scheduler --inits 12     # 1°, 51 members: minutes
    .venv/bin/python -m benchmarks.evaluate_scheduler --inits 365               # the 1° year: about an hour

1. Writes the synthetic 1° archive of ``benchmarks/postprocess_scale_1deg.py`` (its builder,
   :func:`benchmarks.postprocess_scale.write_archive`: two fields, leads 24/48 h, ``--members`` members,
   ``--inits`` daily inits, float32, one init per zarr chunk) and its truth store.
2. Runs ``smoe evaluate`` of the ensemble (no references: the truth store names its fields geopotential_500,
   temperature_850, which persistence cannot rebuild; global region) in a subprocess: threaded (no
   ``--scheduler``), then with ``--scheduler tcp://…`` of a LocalCluster of each ``--workers`` count (worker
   processes of one thread each, started here). Samples every 0.2 s the resident memory of the evaluate process
   tree and of each worker process (psutil).
3. Compares every output file of each cluster run with the threaded run's (netCDF variables bit for bit, the
   other files byte for byte). The workers run BLAS on as many threads as the threaded run (``OPENBLAS_NUM_THREADS``
   and its kin set here for both: dask's nanny would give the workers one, and large matrix products round
   differently with another count).

Writes benchmarks/results/<out-name>.{json,md} (:func:`benchmarks.harness.write_results`, with the machine record:
the load average at start and end, the command; the machine is shared).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.harness import RESULTS, THREAD_ENV, Machine, command, cpu_model, load_average, write_results
from benchmarks.postprocess_scale import run_tree, write_archive

GB = 1e9


@contextmanager
def peak_rss(pids: Callable[[], list[int]], every_s: float = 0.2) -> Iterator[dict[str, int]]:
    """Sample the resident memory of the processes ``pids()`` every ``every_s``: yields a dict that holds, once
    the block ends, ``peak_each`` (the largest of one process) and ``peak_sum`` (of all together)."""
    import psutil

    out = {"peak_each": 0, "peak_sum": 0}
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            rss = []
            for pid in pids():
                try:
                    rss.append(psutil.Process(pid).memory_info().rss)
                except psutil.Error:
                    pass
            if rss:
                out["peak_each"], out["peak_sum"] = max(out["peak_each"], max(rss)), max(out["peak_sum"], sum(rss))
            time.sleep(every_s)

    th = threading.Thread(target=sample, daemon=True)
    th.start()
    try:
        yield out
    finally:
        done.set()
        th.join()


def evaluate_command(root: Path, out: Path) -> list[str]:
    """The ``smoe evaluate`` command line of the archive under ``root``, writing to ``out``."""
    return [sys.executable, "-m", "smoeweather", "evaluate", f"ens={root / 'ensemble.zarr'}", "--truth",
            str(root / "truth.zarr"), "--no-references", "--regions", "global", "--quiet", "--overwrite", "--out",
            str(out)]


def on_workers(root: Path, n: int) -> dict[str, Any]:
    """``smoe evaluate --scheduler`` on a LocalCluster of ``n`` worker processes × 1 thread at a tcp address."""
    from distributed import LocalCluster

    with LocalCluster(n_workers=n, threads_per_worker=1, processes=True, dashboard_address=None,
                      scheduler_kwargs={"dashboard": False, "dashboard_address": "127.0.0.1:0"}) as cluster:

        def pids() -> list[int]:
            return [w.process.process.pid for w in cluster.workers.values()
                    if w.process is not None and w.process.process is not None]

        import psutil

        idle = max(psutil.Process(pid).memory_info().rss for pid in pids())
        with peak_rss(pids) as workers:
            r = run_tree([*evaluate_command(root, root / f"w{n}"), "--scheduler", cluster.scheduler_address])
    r["worker_idle_rss_bytes"] = idle  # a started worker before any task: python, numpy, dask, ...
    r["worker_peak_rss_bytes"] = workers["peak_each"]
    r["workers_peak_rss_sum_bytes"] = workers["peak_sum"]
    return r


def differences(a: Path, b: Path) -> list[str]:
    """What differs between the output folders ``a`` and ``b``: files one lacks, netCDF variables not equal bit
    for bit (with the largest relative difference), JSON not equal but for the code version, other files not
    equal byte for byte; [] when they are the same."""
    import xarray as xr

    files = sorted(p.relative_to(a) for p in a.rglob("*") if p.is_file())
    other = sorted(p.relative_to(b) for p in b.rglob("*") if p.is_file())
    out = [f"only in one: {sorted(set(map(str, files)) ^ set(map(str, other)))}"] if files != other else []
    for f in (f for f in files if (b / f).is_file()):
        if f.suffix == ".json":  # the code version in the provenance moves when someone commits between the runs
            x, y = (json.loads((d / f).read_text()) for d in (a, b))
            for doc in (x, y):
                doc.get("provenance", {}).pop("code_version", None)
            out += [] if x == y else [str(f)]
            continue
        if f.suffix != ".nc":
            out += [] if (a / f).read_bytes() == (b / f).read_bytes() else [str(f)]
            continue
        x, y = xr.load_dataset(a / f), xr.load_dataset(b / f)
        for k in x.variables:
            u = x[k].values
            v = y[k].values if k in y.variables else None
            if v is None or u.shape != v.shape:
                out.append(f"{f}:{k} (missing or shape)")
            elif not np.array_equal(u, v, equal_nan=u.dtype.kind in "fc"):
                rel = np.nanmax(np.abs(u - v) / np.maximum(np.abs(u), 1e-300)) if u.dtype.kind in "fc" else 1.0
                out.append(f"{f}:{k} (max relative difference {rel:.2e})")
    return out


def same_blas_threads() -> int:
    """Pin the BLAS thread count of every process started from here (the threaded run, the workers: the OS
    environment overrides the nanny's one thread) to this process's; returns it."""
    from smoeweather.evaluate.cluster import blas_threads

    n = blas_threads() or 1
    os.environ.update({k: str(n) for k in THREAD_ENV})
    return n


def markdown(r: dict[str, Any]) -> str:
    a, t, m = r["archive"], r["threaded"], r["machine"]
    lines = [f"# smoe evaluate on dask.distributed against threads ({a['grid']}, {a['members']} members, "
             f"{a['starts']} inits)", "",
             f"Machine: {m['cpu']}, {m['cpu_count']} cores, RAM {r['ram_gb']:.0f} GB; load average at start "
             f"{m['load_start']}, at end {m['load_end']}, highest 1-minute value seen {m['load_max']}. Archive "
             f"{a['ensemble_bytes'] / GB:.2f} GB (float32, one init per chunk: {r['init_bytes'] / 1e6:.0f} MB per "
             f"init and field as float64). BLAS on {r['blas_threads']} thread(s) in the threaded run and in every "
             "worker.", "", f"Command: `{m['command']}`", "",
             "| run | wall s | evaluate process peak GB | peak per worker GB (idle) | all workers GB | "
             "files as threaded |", "|---|---:|---:|---:|---:|---|",
             f"| threaded (no --scheduler) | {t['wall_s']:.1f} | {t['peak_rss_bytes'] / GB:.2f} | – | – | – |"]
    for n, w in r["workers"].items():
        same = "identical" if not w["differences"] else f"{len(w['differences'])} differ"
        lines.append(f"| --scheduler, {n} worker{'s' if n != '1' else ''} × 1 thread | {w['wall_s']:.1f} | "
                     f"{w['peak_rss_bytes'] / GB:.2f} | {w['worker_peak_rss_bytes'] / GB:.2f} "
                     f"({w['worker_idle_rss_bytes'] / GB:.2f}) | {w['workers_peak_rss_sum_bytes'] / GB:.2f} | "
                     f"{same} |")
    s = r["summary"]
    lines += ["", f"2 workers against 1: speed-up **{s.get('speedup_2_vs_1', float('nan')):.2f}×**; 1 worker "
              f"against the threaded run (2 threads): {s.get('one_worker_vs_threaded', float('nan')):.2f}× its time. "
              f"Peak worker memory above its idle size: {s['worker_peak_over_init']:.1f} × one init of one field as "
              f"float64, with the archive at {a['starts']} inits.", ""]
    for n, w in r["workers"].items():
        lines += [f"Differences, {n} workers: {w['differences']}", ""] if w["differences"] else []
    return "\n".join([*lines, r["note"], ""])


@contextmanager
def load_peak(every_s: float = 5.0) -> Iterator[list[float]]:
    """The highest 1-minute load average seen every ``every_s`` while the block runs (a one-item list)."""
    peak, done = [load_average()[0]], threading.Event()

    def sample() -> None:
        while not done.wait(every_s):
            peak[0] = max(peak[0], load_average()[0])

    th = threading.Thread(target=sample, daemon=True)
    th.start()
    try:
        yield peak
    finally:
        done.set()
        th.join()


def summary(r: dict[str, Any]) -> dict[str, float]:
    """The 2-against-1-worker speed-up, 1 worker against threads, and the peak worker memory above its idle size in
    inits of one field."""
    w = r["workers"]
    grown = max(v["worker_peak_rss_bytes"] - v["worker_idle_rss_bytes"] for v in w.values())
    return {"worker_peak_over_init": grown / r["init_bytes"],
            **({"speedup_2_vs_1": w["1"]["wall_s"] / w["2"]["wall_s"]} if {"1", "2"} <= set(w) else {}),
            **({"one_worker_vs_threaded": w["1"]["wall_s"] / r["threaded"]["wall_s"]} if "1" in w else {})}


def measure(root: Path, args: argparse.Namespace) -> dict[str, Any]:
    """Write the archive under ``root``, run the threaded evaluation and one per worker count, compare the files."""
    r: dict[str, Any] = {"archive": write_archive(root, args.inits, args.members, args.deg)}
    r["init_bytes"] = 8 * 2 * args.members * r["archive"]["points"]
    r["threaded"] = run_tree(evaluate_command(root, root / "threads"))
    r["workers"] = {}
    for n in args.workers:
        r["workers"][str(n)] = w = on_workers(root, n)
        w["differences"] = differences(root / "threads", root / f"w{n}")
    for v in [r["threaded"], *r["workers"].values()]:
        v.pop("log_tail", None)
    return r


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--inits", type=int, default=365, help="daily inits of the archive (default 365)")
    ap.add_argument("--members", type=int, default=51, help="members (default 51)")
    ap.add_argument("--deg", type=float, default=1.0, help="grid spacing in degrees (default 1)")
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2], help="worker counts (default 1 2)")
    ap.add_argument("--root", type=Path, default=None, help="where the archive goes (default: a temp folder)")
    ap.add_argument("--keep", action="store_true", help="keep the archive and the outputs")
    ap.add_argument("--out-name", default="evaluate_scheduler", help="results name under benchmarks/results")
    args = ap.parse_args()
    import psutil

    machine = Machine()
    root = args.root or Path(tempfile.mkdtemp(prefix="eval_sched"))
    root.mkdir(parents=True, exist_ok=True)
    try:
        with load_peak() as peak:
            r = {"blas_threads": same_blas_threads(), "ram_gb": psutil.virtual_memory().total / GB,
                 **measure(root, args)}
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    r["summary"] = summary(r)
    r["machine"] = {"cpu": cpu_model(), "cpu_count": os.cpu_count(), "load_start": machine.load_start,
                    "load_end": load_average(), "load_max": peak[0], "command": command()}
    cores = os.cpu_count() or 1
    r["note"] = (f"The machine was shared: the load average reached {peak[0]} on {cores} cores, other processes took "
                 "CPU time from these runs, so the wall times and the speed-up are rough." if peak[0] > 0.5 * cores
                 else "The machine was quiet (load average below half the cores throughout).")
    write_results(RESULTS / args.out_name, r, markdown(r), machine=machine,
                  replace={str(root): "$ROOT", sys.executable: "python"})
    print(markdown(r))


if __name__ == "__main__":
    main()
