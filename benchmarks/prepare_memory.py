"""Peak memory of ``prepare`` on a ≥ 4 GB input: it must stream chunk by chunk (target: < 1.5 GB RSS).

Writes a canonical netCDF (float32, 3 variables × 13 levels × 32×64, 6-hourly, netCDF chunks of 64 time
steps) of ``--gb`` GB into a temporary folder, runs ``prepare("world", ...)`` on it in a subprocess (default
local dask cluster, statistics included), measures that subprocess's peak RSS with
``resource.getrusage(RUSAGE_CHILDREN).ru_maxrss`` and deletes everything. Writes
``benchmarks/results/prepare_memory.json`` and prints one JSON line. A measurement, never an assert.

    OMP_NUM_THREADS=1 .venv/bin/python -m benchmarks.prepare_memory [--gb 4.2]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

import netCDF4
import numpy as np

from benchmarks.harness import REPO, RESULTS, Machine, timed, write_results

LEVELS = [50, 100, 150, 200, 250, 300, 400, 500, 600, 700, 850, 925, 1000]
VARIABLES = {
    "geopotential": (54_000.0, 3_000.0, "m**2 s**-2"),
    "temperature": (260.0, 20.0, "K"),
    "u_component_of_wind": (5.0, 10.0, "m s**-1"),
}
BLOCK = 64  # time steps per write (and per netCDF chunk)


def write_input(path: Path, gb: float) -> int:
    """Write the synthetic input block by block (never all in memory); returns its size in bytes."""
    step_bytes = len(VARIABLES) * len(LEVELS) * 32 * 64 * 4
    n_time = int(np.ceil(gb * 1e9 / step_bytes / BLOCK)) * BLOCK
    rng = np.random.default_rng(0)
    base = rng.standard_normal((BLOCK, len(LEVELS), 32, 64)).astype(np.float32)
    with netCDF4.Dataset(path, "w") as nc:
        nc.createDimension("time", n_time)
        nc.createDimension("level", len(LEVELS))
        nc.createDimension("latitude", 32)
        nc.createDimension("longitude", 64)
        t = nc.createVariable("time", "f8", ("time",))
        t.units, t.calendar = "hours since 1990-01-01", "proleptic_gregorian"
        t[:] = 6.0 * np.arange(n_time)
        nc.createVariable("level", "i8", ("level",))[:] = LEVELS
        nc["level"].units = "hPa"
        lat = nc.createVariable("latitude", "f8", ("latitude",))
        lat[:], lat.units = -87.1875 + 5.625 * np.arange(32), "degrees_north"
        lon = nc.createVariable("longitude", "f8", ("longitude",))
        lon[:], lon.units = 5.625 * np.arange(64), "degrees_east"
        for name, (mean, std, units) in VARIABLES.items():
            v = nc.createVariable(
                name,
                "f4",
                ("time", "level", "latitude", "longitude"),
                chunksizes=(BLOCK, len(LEVELS), 32, 64),
            )
            v.units = units
            for i in range(0, n_time, BLOCK):
                v[i : i + BLOCK] = mean + std * np.roll(base, i // BLOCK, axis=3)
    return path.stat().st_size


def main() -> None:
    """Write the input, run ``prepare`` on it in a child process, record the child's peak RSS."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gb", type=float, default=4.2, help="input size in GB (default 4.2)")
    args = parser.parse_args()
    machine = Machine()
    with tempfile.TemporaryDirectory(prefix="smoe-prepare-memory-") as tmp:
        src, out = Path(tmp) / "input.nc", Path(tmp) / "out.zarr"
        size, t_write = timed(write_input, src, args.gb)
        n_years = int(size / (len(VARIABLES) * len(LEVELS) * 32 * 64 * 4) // 1461)  # complete years
        train = (1990, 1990 + max(0, n_years - 3))
        code = (
            f"from pipelines.prepare import prepare; "
            f"prepare('world', {str(src)!r}, {str(out)!r}, train_years={train}, progress=False, "
            "plausibility_check=False)"  # one geopotential field at every level: its memory, not its values
        )
        _, t_prepare = timed(subprocess.run, [sys.executable, "-c", code], check=True, cwd=REPO)
        peak_bytes = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024  # Linux: KiB
        out_bytes = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
    result = {
        "input_gb": round(size / 1e9, 3),
        "output_gb": round(out_bytes / 1e9, 3),
        "prepare_peak_rss_gb": round(peak_bytes / 1e9, 3),
        "limit_gb": 1.5,
        "prepare_seconds": round(t_prepare, 1),
        "input_write_seconds": round(t_write, 1),
        "setup": "netCDF4 float32 input (3 vars × 13 levels × 32×64, 6-hourly), kind 'world', default local "
        f"dask cluster (in-process, 2 threads), statistics over {train[0]}–{train[1]}",
    }
    write_results(RESULTS / "prepare_memory", result, machine=machine)
    print(json.dumps({k: result[k] for k in ("input_gb", "prepare_peak_rss_gb", "prepare_seconds")}))


if __name__ == "__main__":
    main()
