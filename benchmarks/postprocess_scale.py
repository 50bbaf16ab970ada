"""Post-processing at scale: per-grid-point EMOS fit → apply → ECC-Q members on a synthetic 1° global
ensemble archive, out of core, through the CLI with the default scheduler.

1. Writes (lazily, chunk by chunk with dask: never whole in memory) a synthetic archive in the WeatherBench 2
   layout: ``geopotential_500`` and ``temperature_850`` (time, prediction_timedelta, member, latitude,
   longitude), ``--members`` members, leads 24 h and 48 h, ``--starts`` daily inits, 1° (181 × 360), float32,
   zarr chunks of one init; and a truth store on the valid times. Each member is truth + a location-dependent
   bias + a shared error + an under-dispersive member error (seeded per chunk).
2. Runs ``smoe postprocess fit --method emos --per-gridpoint`` and ``smoe postprocess apply --members N``
   (default scheduler: a local dask.distributed cluster, 1 worker × 2 threads) as subprocesses, sampling the
   resident memory of the whole process tree (psutil, every 0.2 s) and the wall time of each step.
3. ``--workers 1 2``: the same chain on the first ``--worker-starts`` inits with a LocalCluster of 1 and of 2
   worker processes (1 thread each) at a tcp address (``--scheduler tcp://…``): throughput in grid points/s.
4. Projects 0.25° (721 × 1440 points) from the measured throughput, and deletes the archive (``--keep`` keeps it).

Writes benchmarks/results/postprocess_scale.{json,md}. Run it under ``nice``; the load average at start is
recorded (the machine is shared).

    nice -n 10 .venv/bin/python -m benchmarks.postprocess_scale --starts 365 --members 51
    .venv/bin/python -m benchmarks.postprocess_scale --starts 8 --members 11 --out-name postprocess_scale_small
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from benchmarks.harness import REPO, RESULTS, Machine, Stopwatch, timed, write_results

FIELDS = {"geopotential_500": (54_000.0, 1_500.0, 120.0, "m**2 s**-2"), "temperature_850": (275.0, 12.0, 1.2, "K")}
LEADS_H = (24, 48)


def _grid(deg: float) -> tuple[np.ndarray, np.ndarray]:
    return np.linspace(-90, 90, int(round(180 / deg)) + 1), np.arange(int(round(360 / deg))) * deg


def write_archive(root: Path, starts: int, members: int, deg: float) -> dict[str, Any]:
    """Write the ensemble and truth zarr stores chunk by chunk (dask, threads); returns their sizes."""
    import dask
    import dask.array as da
    import xarray as xr

    lat, lon = _grid(deg)
    ny, nx = len(lat), len(lon)
    init = pd.date_range("2021-01-01", periods=starts, freq="D")
    valid = pd.date_range(init[0], init[-1] + pd.Timedelta(hours=max(LEADS_H)), freq="D")
    lat2, lon2 = np.meshgrid(np.deg2rad(lat), np.deg2rad(lon), indexing="ij")
    pattern = (np.cos(lat2) * np.sin(2 * lon2)).astype(np.float32)

    def truth_block(block_id: tuple[int, ...], mean: float, amp: float, seed: int) -> np.ndarray:
        t = block_id[0]
        rng = np.random.default_rng([seed, t])
        phase = 2 * np.pi * t / 30.0
        field = mean + amp * (np.cos(lat2) * np.sin(lon2 + phase)).astype(np.float32)
        return (field + 0.3 * amp * rng.standard_normal((ny, nx), dtype=np.float32))[None]

    def ens_block(block_id: tuple[int, ...], mean: float, amp: float, err: float, seed: int) -> np.ndarray:
        t = block_id[0]
        out = np.empty((1, len(LEADS_H), members, ny, nx), np.float32)
        rng = np.random.default_rng([seed, 1000 + t])
        for j, h in enumerate(LEADS_H):
            y = truth_block((t + h // 24,), mean, amp, seed)[0]
            scale = err * np.sqrt(h / 24.0)
            shared = y + 0.5 * scale * pattern + scale * rng.standard_normal((ny, nx), dtype=np.float32)
            out[0, j] = shared[None] + 0.6 * scale * rng.standard_normal((members, ny, nx), dtype=np.float32)
        return out

    fc, tr = {}, {}
    for k, (name, (mean, amp, err, units)) in enumerate(FIELDS.items()):
        fc[name] = (("time", "prediction_timedelta", "member", "latitude", "longitude"),
                    da.map_blocks(ens_block, mean=mean, amp=amp, err=err, seed=k, dtype=np.float32,
                                  chunks=((1,) * starts, (len(LEADS_H),), (members,), (ny,), (nx,))),
                    {"units": units})
        tr[name] = (("time", "latitude", "longitude"),
                    da.map_blocks(truth_block, mean=mean, amp=amp, seed=k, dtype=np.float32,
                                  chunks=((1,) * len(valid), (ny,), (nx,))), {"units": units})
    coords = {"latitude": lat, "longitude": lon}
    ens = xr.Dataset(fc, coords={"time": init, "prediction_timedelta": pd.to_timedelta(list(LEADS_H), "h"),
                                 "member": np.arange(members), **coords}, attrs={"forecast_kind": "ensemble"})
    truth = xr.Dataset(tr, coords={"time": valid, **coords})
    enc = {n: {"compressors": None} for n in FIELDS}  # random data does not compress
    with dask.config.set(scheduler="threads", num_workers=2):
        ens.to_zarr(root / "ensemble.zarr", mode="w", zarr_format=2, consolidated=True, encoding=enc)
        truth.to_zarr(root / "truth.zarr", mode="w", zarr_format=2, consolidated=True, encoding=enc)
    return {"ensemble_bytes": _du(root / "ensemble.zarr"), "truth_bytes": _du(root / "truth.zarr"),
            "grid": f"{ny}x{nx}", "points": ny * nx, "starts": starts, "members": members}


def _du(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def run_tree(cmd: list[str]) -> dict[str, Any]:
    """Run ``cmd``; wall time and peak resident memory of its whole process tree (psutil, 0.2 s samples)."""
    import psutil

    watch = Stopwatch()
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    peak = [0]
    done = threading.Event()

    def sample() -> None:
        root = psutil.Process(proc.pid)
        while not done.is_set():
            try:
                rss = root.memory_info().rss + sum(c.memory_info().rss for c in root.children(recursive=True))
                peak[0] = max(peak[0], rss)
            except psutil.Error:
                pass
            time.sleep(0.2)

    th = threading.Thread(target=sample, daemon=True)
    th.start()
    out, _ = proc.communicate()
    done.set()
    th.join()
    wall = watch.elapsed()
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{out[-4000:]}")
    return {"wall_s": wall, "peak_rss_bytes": peak[0], "command": " ".join(cmd[2:]), "log_tail": out[-600:]}


def chain(root: Path, members: int, scheduler: str | None, period: tuple[str, str] | None, tag: str,
          apply_period: tuple[str, str] | None = None) -> dict[str, Any]:
    """fit (per grid point, inits in ``period``) → apply (Gaussian + ECC-Q members, inits in ``apply_period``,
    default ``period``) through the CLI."""
    smoe = [sys.executable, "-m", "smoeweather", "postprocess"]
    extra = ["--scheduler", scheduler] if scheduler else []
    model, pp = root / f"emos_{tag}.nc", root / f"pp_{tag}.zarr"
    fit = [*smoe, "fit", "--method", "emos", "--per-gridpoint", "--forecast", str(root / "ensemble.zarr"),
           "--truth", str(root / "truth.zarr"), "--out", str(model), "--overwrite", *extra]
    app = [*smoe, "apply", "--emos", str(model), "--forecast", str(root / "ensemble.zarr"), "--out", str(pp),
           "--members", str(members), "--overwrite", *extra]
    if period:
        fit += ["--train-period", *period]
    if apply_period or period:
        app += ["--apply-period", *(apply_period or period)]
    r = {"fit": run_tree(fit), "apply": run_tree(app)}
    r["members_store_bytes"] = _du(pp.with_name(f"{pp.stem}_members.zarr"))
    for p in (model, pp, pp.with_name(f"{pp.stem}_members.zarr")):
        shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)
    return r


def with_workers(root: Path, members: int, n: int, period: tuple[str, str]) -> dict[str, Any]:
    """The chain on a LocalCluster of ``n`` worker processes × 1 thread, at a tcp address."""
    from distributed import LocalCluster

    with LocalCluster(n_workers=n, threads_per_worker=1, processes=True, dashboard_address=None,
                      scheduler_kwargs={"dashboard": False, "dashboard_address": "127.0.0.1:0"}) as cluster:
        r = chain(root, members, cluster.scheduler_address, period, f"w{n}")
        import psutil

        workers = [psutil.Process(p.pid) for p in (w.process.process for w in cluster.workers.values())
                   if p is not None]
        r["worker_rss_bytes_at_end"] = sum(w.memory_info().rss for w in workers)
    return r


def markdown(r: dict[str, Any]) -> str:
    a = r["archive"]
    m = r["main"]
    gb = 1e9
    lines = [f"# Post-processing at scale ({r['machine']})", "",
             f"Archive: synthetic {a['grid']} ({a['points']} points) × {a['members']} members × 2 leads × 2 "
             f"fields × {a['starts']} daily starts, float32: {a['ensemble_bytes'] / gb:.1f} GB on disk "
             f"(written in {r['write_s']:.0f} s).", "",
             "| step (CLI, default scheduler) | starts | wall [s] | peak RSS, process tree [GB] | "
             "grid points/s (all starts) |", "|---|---:|---:|---:|---:|"]
    t = totals(r)
    lines.append(f"| fit, per grid point (stage + fit) | {a['starts']} | {m['fit']['wall_s']:.0f} | "
                 f"{m['fit']['peak_rss_bytes'] / gb:.2f} | {a['points'] / m['fit']['wall_s']:.0f} |")
    lines.append(f"| apply: Gaussian + ECC-Q members | {r['apply_starts']} | {m['apply']['wall_s']:.0f} | "
                 f"{m['apply']['peak_rss_bytes'] / gb:.2f} | {a['points'] / t['apply_all_starts_s']:.0f} |")
    peak = max(m["fit"]["peak_rss_bytes"], m["apply"]["peak_rss_bytes"])
    lines += [f"| fit → apply → ECC-Q, all {a['starts']} starts | {a['starts']} | {t['chain_all_starts_s']:.0f}"
              + ("" if r["apply_starts"] == a["starts"] else " (apply extrapolated)")
              + f" | {peak / gb:.2f} | {t['throughput_points_per_s']:.0f} |", "",
              f"Peak memory {peak / gb:.2f} GB = {peak / a['ensemble_bytes']:.1%} of the archive (target ≤ 4 GB).",
              "", f"Projected 0.25° (721 × 1440 points, same members/leads/starts) at this throughput: "
              f"{t['projection_025']['hours']:.1f} h on this machine.", ""]
    if r.get("workers"):
        lines += [f"Workers (LocalCluster at a tcp address, 1 thread each; first {r['worker_starts']} starts):", "",
                  "| workers | fit [s] | apply [s] | grid points/s (chain) | peak RSS [GB] |",
                  "|---:|---:|---:|---:|---:|"]
        for n, w in r["workers"].items():
            t = w["fit"]["wall_s"] + w["apply"]["wall_s"]
            pk = max(w["fit"]["peak_rss_bytes"], w["apply"]["peak_rss_bytes"])
            lines.append(f"| {n} | {w['fit']['wall_s']:.0f} | {w['apply']['wall_s']:.0f} | {a['points'] / t:.0f} | "
                         f"{pk / gb:.2f} |")
        lines.append("")
    return "\n".join(lines)


def main() -> None:
    """Write (or reuse) the archive, run the chain with the default scheduler and with the worker counts."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--starts", type=int, default=365, help="daily inits (default 365)")
    p.add_argument("--members", type=int, default=51, help="members (default 51)")
    p.add_argument("--grid", type=float, default=1.0, help="degrees (default 1)")
    p.add_argument("--workers", type=int, nargs="*", default=[1, 2], help="worker counts to compare (default 1 2)")
    p.add_argument("--worker-starts", type=int, default=30, help="inits of the worker comparison (default 30)")
    p.add_argument("--workdir", type=Path, default=None, help="where the archive goes (default: a temporary dir)")
    p.add_argument("--keep", action="store_true", help="keep the archive")
    p.add_argument("--archive", type=Path, default=None,
                   help="reuse an archive written by an earlier --keep run (its folder); deleted at the end "
                        "unless --keep")
    p.add_argument("--write-only", action="store_true", help="write the archive and stop (implies --keep)")
    p.add_argument("--apply-starts", type=int, default=None,
                   help="apply to the first N starts only (default: all); the full apply is extrapolated "
                        "linearly (apply streams one init at a time)")
    p.add_argument("--out-name", default="postprocess_scale", help="results file stem")
    args = p.parse_args()
    machine = Machine()
    load = machine.load_start
    r: dict[str, Any] = {"machine": f"{platform.machine()} {os.cpu_count()} CPUs, load average "
                                    f"{load[0]:.2f} / {load[1]:.2f} / {load[2]:.2f} at start",
                         "load_average_at_start": load}
    root = args.archive or Path(tempfile.mkdtemp(prefix="pp_scale_", dir=args.workdir))
    try:
        if args.archive is not None:
            r["archive"], r["write_s"] = json.loads((root / "archive.json").read_text())
        else:
            r["archive"], r["write_s"] = timed(write_archive, root, args.starts, args.members, args.grid)
            (root / "archive.json").write_text(json.dumps([r["archive"], r["write_s"]]))
        print(root, json.dumps(r["archive"]), f"written in {r['write_s']:.0f} s", flush=True)
        if args.write_only:
            args.keep = True
            return
        k = min(args.apply_starts or args.starts, args.starts)
        t = pd.date_range("2021-01-01", periods=k, freq="D")
        r["apply_starts"] = k
        r["main"] = chain(root, args.members, None, None, "default", (str(t[0].date()), str(t[-1].date())))
        save(r, args.out_name, machine)
        print(json.dumps({k: {kk: vv for kk, vv in v.items() if kk != "log_tail"} if isinstance(v, dict) else v
                          for k, v in r["main"].items()}), flush=True)
        r.update(totals(r))
        save(r, args.out_name, machine)
        if args.workers:
            k = min(args.worker_starts, args.starts)
            t = pd.date_range("2021-01-01", periods=k, freq="D")
            period = (str(t[0].date()), str(t[-1].date()))
            r["worker_starts"] = k
            r["workers"] = {}
            for n in args.workers:
                r["workers"][str(n)] = with_workers(root, args.members, n, period)
                save(r, args.out_name, machine)
        save(r, args.out_name, machine)
        print(markdown(r))
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)


def totals(r: dict[str, Any]) -> dict[str, Any]:
    """Throughput (grid points/s of the whole chain over all starts) and the 0.25° projection; the apply time
    of all starts is extrapolated linearly from the measured ``apply_starts``."""
    a, m = r["archive"], r["main"]
    apply_full = m["apply"]["wall_s"] * a["starts"] / r["apply_starts"]
    tot = m["fit"]["wall_s"] + apply_full
    rate = a["points"] / tot
    return {"apply_all_starts_s": apply_full, "chain_all_starts_s": tot, "throughput_points_per_s": rate,
            "projection_025": {"points": 721 * 1440, "hours": 721 * 1440 / rate / 3600,
                               "note": "same members, leads, fields and starts; linear in the number of points"}}


def save(r: dict[str, Any], name: str, machine: Machine | None = None) -> None:
    """Write what has been measured so far (a long run keeps its results if stopped later)."""
    write_results(RESULTS / name, r, markdown(r), machine=machine)


if __name__ == "__main__":
    main()
