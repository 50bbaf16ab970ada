"""Peak memory and time of `smoe evaluate` on a large ensemble forecast store, out of core.

Writes (chunk by chunk, never whole in memory) a synthetic truth store (Z500 on a regular grid, 6-hourly, with
a land-sea mask) and an M-member ensemble forecast store with daily inits and 2 leads, then runs
`smoe evaluate` on them in a child process: default regions (global, land, sea), optionally --spectra,
and reports wall time, the child's peak resident memory and the sizes of the stores.

    python -m benchmarks.evaluate_memory --resolution 1.0 --members 51 --inits 91 365 \
        --out benchmarks/results/evaluate_memory_1deg.json            # the 1° year (≈ 10 GB) and a quarter of it
    python -m benchmarks.evaluate_memory --resolution 5.625 --members 51 --inits 365   # ≈ 0.3 GB

Memory is bounded when the peak stays far below the forecast store's size and does not grow in step with the
number of initialisations (only the truth of one field at the valid times, inits × leads × grid, is held):
with several ``--inits`` the report gives the peak of the largest against the smallest.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import dask.array as da
import numpy as np
import xarray as xr

from benchmarks.harness import Machine, Stopwatch, command, timed, write_results


def grid(resolution: float) -> tuple[np.ndarray, np.ndarray]:
    n_lat = int(round(180 / resolution))
    lat = -90 + resolution / 2 + resolution * np.arange(n_lat)
    lon = resolution * np.arange(int(round(360 / resolution)))
    return lat, lon


def write_stores(root: Path, resolution: float, members: int, inits: int, leads_h: tuple[int, ...]
                 ) -> tuple[Path, Path]:
    lat, lon = grid(resolution)
    days = inits + max(leads_h) // 24 + 2
    times = np.arange(np.datetime64("2003-01-01", "ns"), np.datetime64("2003-01-01", "ns") + np.timedelta64(days, "D"),
                      np.timedelta64(6, "h"))
    shape = (len(times), 1, len(lat), len(lon))
    z = 5.5e4 + 800.0 * da.random.RandomState(0).standard_normal(shape, chunks=(8, 1, len(lat), len(lon)))
    lsm = (np.cos(np.deg2rad(3 * lon))[None, :] * np.cos(np.deg2rad(2 * lat))[:, None] > 0.3).astype(np.float32)
    truth = xr.Dataset({"geopotential": (("time", "level", "latitude", "longitude"), z.astype(np.float32),
                                         {"units": "m**2 s**-2"}),
                        "land_sea_mask": (("latitude", "longitude"), lsm, {"units": "1"})},
                       coords={"time": times, "level": [500], "latitude": lat, "longitude": lon})
    truth_path = root / "truth.zarr"
    truth.to_zarr(truth_path, zarr_format=2, mode="w")
    init_t = times[::4][:inits]
    leads = np.array(leads_h, dtype="timedelta64[h]").astype("timedelta64[ns]")
    fshape = (inits, len(leads), members, 1, len(lat), len(lon))
    per_init = members * len(lat) * len(lon) * 4
    tchunk = max(1, int(64e6 // per_init))  # ~64 MB chunks
    fz = 5.5e4 + 900.0 * da.random.RandomState(1).standard_normal(
        fshape, chunks=(tchunk, 1, members, 1, len(lat), len(lon)))
    fc = xr.Dataset({"geopotential": (("time", "prediction_timedelta", "member", "level", "latitude", "longitude"),
                                      fz.astype(np.float32), {"units": "m**2 s**-2"})},
                    coords={"time": init_t, "prediction_timedelta": leads, "member": np.arange(members),
                            "level": [500], "latitude": lat, "longitude": lon},
                    attrs={"forecast_kind": "ensemble", "method": "ens"})
    fc_path = root / "ens.zarr"
    fc.to_zarr(fc_path, zarr_format=2, mode="w")
    return truth_path, fc_path


def du(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def main(argv: list[str] | None = None) -> int:
    """Measure every ``--inits``; print each record and write the report (``--out``)."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--resolution", type=float, default=5.625)
    p.add_argument("--members", type=int, default=51)
    p.add_argument("--inits", type=int, nargs="+", default=[365],
                   help="daily initialisations; several values measure each (stores written and removed in turn)")
    p.add_argument("--spectra", action="store_true")
    p.add_argument("--regions", nargs="+", default=["default"],
                   help="--regions of smoe evaluate; 'none': leave the option out (code without regions)")
    p.add_argument("--work", type=Path, default=None, help="folder for the stores (default: a temporary one)")
    p.add_argument("--out", type=Path, default=None, help="JSON report (printed as well)")
    args = p.parse_args(argv)
    machine = Machine()
    records = []
    for inits in args.inits:
        record = measure(args, inits)
        if record is None:
            return 1
        records.append(record)
        print(json.dumps(record), flush=True)
    given = list(argv if argv is not None else sys.argv[1:])
    if "--work" in given:  # a scratch folder of this machine: not part of the measurement
        del given[given.index("--work"):given.index("--work") + 2]
    report = {"command": command(given), "runs": records}
    if len(records) > 1:
        report["peak_ratio_largest_to_smallest"] = round(
            records[-1]["evaluate_peak_rss_mib"] / records[0]["evaluate_peak_rss_mib"], 3)
        report["forecast_size_ratio_largest_to_smallest"] = round(
            records[-1]["forecast_store_mib"] / records[0]["forecast_store_mib"], 3)
    if args.out:
        write_results(args.out, report, machine=machine)
    return 0


def measure(args: argparse.Namespace, inits: int) -> dict | None:
    """Write the stores for ``inits`` initialisations, run ``smoe evaluate`` on them in a child process and
    return wall time, the child's peak resident memory and the store sizes (None when evaluate failed)."""
    root = Path(args.work or tempfile.mkdtemp(prefix="evaluate_memory_"))
    root.mkdir(parents=True, exist_ok=True)
    try:
        (truth, fc), t_write = timed(write_stores, root, args.resolution, args.members, inits, (24, 48))
        cmd = [sys.executable, "-m", "smoeweather", "evaluate", f"ens={fc}", "--truth", str(truth), "--no-references",
               *([] if args.regions == ["none"] else ["--regions", *args.regions]), "--out", str(root / "scores"),
               *(["--spectra"] if args.spectra else [])]
        log = root / "evaluate.stderr"
        with Stopwatch() as watch, log.open("w") as err:
            child = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err)
            _, status, usage = os.wait4(child.pid, 0)  # this child's own rusage, not the maximum over all children
        wall = watch.seconds
        if os.waitstatus_to_exitcode(status):
            print(log.read_text()[-3000:], file=sys.stderr)
            return None
        return {"resolution_deg": args.resolution, "members": args.members, "inits": inits,
                "leads": 2, "regions": args.regions, "spectra": args.spectra,
                "forecast_store_mib": round(du(fc) / 2**20, 1),
                "truth_store_mib": round(du(truth) / 2**20, 1),
                "evaluate_wall_s": round(wall, 1),
                "evaluate_peak_rss_mib": round(usage.ru_maxrss / 1024, 1),  # KiB → MiB (Linux)
                "write_s": round(t_write, 1)}
    finally:
        shutil.rmtree(root if args.work is None else root / "scores", ignore_errors=True)
        if args.work is not None:
            for store in ("truth.zarr", "ens.zarr"):
                shutil.rmtree(root / store, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
