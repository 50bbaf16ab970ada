"""Per-grid-point EMOS fit at 1° against the I/O limit: how close the fit comes to the time of
reading its archive once, and its peak memory. A benchmark, not a test.

Full run (the lead, on a quiet machine; about 19 GB of archive under --root, which is deleted afterwards):

    .venv/bin/python -m benchmarks.postprocess_scale_1deg --starts 365 --members 51 --root /scratch/pp1deg
    .venv/bin/python -m benchmarks.postprocess_scale_1deg --starts 365 --members 51 --root /scratch/pp1deg \
        --cold --out-name postprocess_scale_1deg_cold    # as root: both steps read from disk, not the page cache

Dry run (small, on a busy machine; numbers mean nothing):

    .venv/bin/python -m benchmarks.postprocess_scale_1deg --starts 20 --members 5 --deg 10 \
        --out-name postprocess_scale_1deg_dry

1. Writes the synthetic archive of :mod:`benchmarks.postprocess_scale` (two fields, leads 24/48 h, ``--members``
   members, ``--starts`` daily inits, ``--deg`` grid, float32, one init per zarr chunk) and its truth store.
2. Reads the archive once (every chunk of the ensemble and the truth, dask threads, the same process layout as
   the fit) in a subprocess: the read-once time and its peak memory. The page cache is not dropped (that needs
   root): the read runs FIRST, so the fit never reads a warmer cache than the read did... unless the archive fits
   in RAM, in which case both may come from cache; both times are reported with the archive size and total RAM.
3. Runs ``smoe postprocess fit --method emos --per-gridpoint`` (``--scheduler``, default a local cluster) in a
   subprocess, sampling the resident memory of the whole process tree (psutil, 0.2 s).
4. Reports fit / read (target ≤ 2), peak memory (target ≤ 4 GB) and projects 0.25° (721 × 1440 points) from the
   measured time per grid point (fit) and bytes per second (read). Writes benchmarks/results/<out-name>.{json,md}.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.harness import REPO, RESULTS, Machine, command, write_results
from benchmarks.postprocess_scale import run_tree, write_archive

POINTS_025 = 721 * 1440
GB = 1e9
READ_ONCE = """
import sys, dask, xarray as xr
with dask.config.set(scheduler="threads", num_workers=int(sys.argv[3])):
    for store in sys.argv[1:3]:
        ds = xr.open_zarr(store)
        dask.compute(*[ds[v].data.sum() for v in ds.data_vars])  # every chunk read and decoded once
"""


DROP_CACHES = Path("/proc/sys/vm/drop_caches")


def drop_page_cache() -> None:
    """Write the dirty pages out and drop the page cache, so the next step reads the archive from disk (root only)."""
    os.sync()
    try:
        DROP_CACHES.write_text("1\n")
    except OSError as err:
        raise SystemExit(f"--cold needs root to write {DROP_CACHES} ({err}); run without --cold") from err


def measure(root: Path, threads: int, scheduler: str | None, cold: bool = False) -> dict[str, Any]:
    """Read-once, then the per-grid-point fit; wall times and peak memory of each. ``cold``: the page cache is
    dropped before each, so both read the archive from disk."""
    if cold:
        drop_page_cache()
    read = run_tree([sys.executable, "-c", READ_ONCE, str(root / "ensemble.zarr"), str(root / "truth.zarr"),
                     str(threads)])
    fit = [sys.executable, "-m", "smoeweather", "postprocess", "fit", "--method", "emos", "--per-gridpoint",
           "--forecast", str(root / "ensemble.zarr"), "--truth", str(root / "truth.zarr"),
           "--out", str(root / "emos.nc"), "--overwrite", "--quiet"]
    if scheduler:
        fit += ["--scheduler", scheduler]
    if cold:
        drop_page_cache()
    return {"read": read, "fit": run_tree(fit), "cold": cold}


def summary(archive: dict[str, Any], m: dict[str, Any], deg: float) -> dict[str, Any]:
    """Ratios against the targets and the 0.25° projection."""
    read_s, fit_s = m["read"]["wall_s"], m["fit"]["wall_s"]
    scale = POINTS_025 / archive["points"]
    return {"fit_over_read": fit_s / read_s, "fit_peak_gb": m["fit"]["peak_rss_bytes"] / GB,
            "read_peak_gb": m["read"]["peak_rss_bytes"] / GB,
            "read_gb_per_s": (archive["ensemble_bytes"] + archive["truth_bytes"]) / GB / read_s,
            "fit_points_per_s": archive["points"] / fit_s,
            "projection_025_fit_h": fit_s * scale / 3600, "projection_025_read_h": read_s * scale / 3600,
            "targets_met": {"fit_within_2x_read": fit_s <= 2 * read_s,
                            "peak_under_4gb": m["fit"]["peak_rss_bytes"] <= 4 * GB},
            "grid_deg": deg}


def markdown(r: dict[str, Any]) -> str:
    s, a = r["summary"], r["archive"]
    return "\n".join([
        f"# Per-grid-point EMOS fit vs reading the archive once ({a['grid']}, {a['members']} members, "
        f"{a['starts']} inits)", "",
        f"Machine: {r['machine']}; load average at start {r['load_at_start']}; RAM {r['ram_gb']:.0f} GB; archive "
        f"{(a['ensemble_bytes'] + a['truth_bytes']) / GB:.2f} GB; "
        + ("page cache dropped before the read and before the fit (both read from disk)."
           if r["measure"].get("cold") else "page cache kept (the archive may be read from memory)."), "",
        "| step | wall s | peak GB |", "|---|---:|---:|",
        f"| read once | {r['measure']['read']['wall_s']:.1f} | {s['read_peak_gb']:.2f} |",
        f"| fit (per grid point) | {r['measure']['fit']['wall_s']:.1f} | {s['fit_peak_gb']:.2f} |", "",
        f"fit / read = **{s['fit_over_read']:.2f}** (target ≤ 2); fit peak {s['fit_peak_gb']:.2f} GB (target ≤ 4); "
        f"read {s['read_gb_per_s']:.2f} GB/s; fit {s['fit_points_per_s']:.0f} grid points/s.", "",
        f"Projection to 0.25° (721 × 1440, same inits and members): fit {s['projection_025_fit_h']:.2f} h, "
        f"read once {s['projection_025_read_h']:.2f} h.", ""])


def main() -> None:
    """Write the archive, read it once, fit; write the results (machine paths replaced by $ROOT)."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--starts", type=int, default=365, help="daily inits (default 365)")
    ap.add_argument("--members", type=int, default=51, help="members (default 51)")
    ap.add_argument("--deg", type=float, default=1.0, help="grid spacing in degrees (default 1)")
    ap.add_argument("--threads", type=int, default=2, help="dask threads of the read (default 2)")
    ap.add_argument("--scheduler", default=None, help="fit's --scheduler (default: its local cluster)")
    ap.add_argument("--root", type=Path, default=None, help="where the archive goes (default: a temp folder)")
    ap.add_argument("--keep", action="store_true", help="keep the archive")
    ap.add_argument("--cold", action="store_true", help="drop the page cache before the read and before the fit "
                                                        "(root only): both read the archive from disk")
    ap.add_argument("--out-name", default="postprocess_scale_1deg", help="results name under benchmarks/results")
    args = ap.parse_args()
    import psutil

    root = args.root or Path(tempfile.mkdtemp(prefix="pp1deg"))
    root.mkdir(parents=True, exist_ok=True)
    machine = Machine()
    r: dict[str, Any] = {"machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores",
                         "load_at_start": machine.load_start,
                         "ram_gb": psutil.virtual_memory().total / GB, "command": command()}
    try:
        r["archive"] = write_archive(root, args.starts, args.members, args.deg)
        r["measure"] = measure(root, args.threads, args.scheduler, args.cold)
        r["summary"] = summary(r["archive"], r["measure"], args.deg)
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    # no machine paths in results
    write_results(RESULTS / args.out_name, r, markdown(r), machine=machine, replace={str(root): "$ROOT"})
    print(markdown(r))


if __name__ == "__main__":
    assert REPO.is_dir()
    main()
