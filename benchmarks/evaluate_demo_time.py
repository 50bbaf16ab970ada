"""Time of `smoe evaluate` on the demo's forecasts: the full WeatherBench 2 view against the evaluation before it.

New: ``smoe evaluate`` with the default regions (global, land, sea) and ``--spectra``, then ``smoe plot
scorecard`` and ``smoe plot spectra``. Baseline: ``smoe evaluate`` of the code before regions, spectra and
scorecards existed (``--baseline-commit``, checked out into a temporary git worktree and run from there with the
same interpreter), on the same forecasts with the same arguments otherwise. Each command runs in a child
process on one thread, the two interleaved for ``--rounds`` rounds; the ratio of the medians is reported
(target: at most 2).

    smoe demo --steps 2 --out runs/demo_bench        # the demo's forecasts (any --steps)
    python benchmarks/evaluate_demo_time.py --demo runs/demo_bench --out benchmarks/results/evaluate_demo_time.md
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BASELINE_COMMIT = "774ec52"  # the last evaluate before regions, spectra and scorecards
RUN = "import sys; from smoeweather.cli import main; sys.exit(main(sys.argv[1:]))"


def _timed(args: list[str], pythonpath: Path) -> float:
    env = {**os.environ, "PYTHONPATH": str(pythonpath), "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
           "OPENBLAS_NUM_THREADS": "1"}
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", RUN, *args], env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - t0
    if done.returncode != 0:
        raise RuntimeError(f"smoe {' '.join(args)} failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    return seconds


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--demo", type=Path, required=True, help="an `smoe demo` output folder")
    ap.add_argument("--baseline-commit", default=BASELINE_COMMIT)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", type=Path, required=True, help="markdown report (a .json beside it)")
    a = ap.parse_args()
    store = a.demo / "data" / "default_world.zarr"
    forecasts = [f"{n}={a.demo / 'forecasts' / f'{n}.zarr'}" for n in ("dense", "smoe_prior")]
    for path in [store, *(Path(f.split("=", 1)[1]) for f in forecasts)]:
        if not path.exists():
            raise SystemExit(f"{path} does not exist: run `smoe demo --steps 2 --out {a.demo}` first")
    common = [*forecasts, "--truth", str(store), "--climatology", str(store), "--climatology-years", "2000", "2001"]
    work = Path(tempfile.mkdtemp(prefix="evaluate_demo_time."))
    old = work / "baseline"
    subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(old), a.baseline_commit],
                   check=True, capture_output=True)
    try:
        times: dict[str, list[float]] = {"baseline": [], "new": []}
        for r in range(a.rounds):
            times["baseline"].append(_timed(["evaluate", *common, "--out", str(work / f"old{r}")], old))
            scores = work / f"new{r}"
            t = _timed(["evaluate", *common, "--spectra", "--out", str(scores)], REPO)
            t += _timed(["plot", "scorecard", str(scores / "scores.nc"), "--baseline", "dense", "--metrics", "rmse",
                         "acc", "--out", str(scores / "scorecard")], REPO)
            t += _timed(["plot", "spectra", str(scores / "scores.nc"), "--out", str(scores / "spectra")], REPO)
            times["new"].append(t)
            print(f"round {r + 1}/{a.rounds}: baseline {times['baseline'][-1]:.1f} s, new {t:.1f} s", flush=True)
    finally:
        subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(old)], capture_output=True)
        shutil.rmtree(work, ignore_errors=True)
    med = {k: statistics.median(v) for k, v in times.items()}
    result = {"baseline_commit": a.baseline_commit, "rounds": a.rounds, "seconds": times, "median_s": med,
              "ratio_new_to_baseline": med["new"] / med["baseline"], "target_ratio_at_most": 2.0,
              "load_average": os.getloadavg()}
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")
    a.out.write_text(
        "# `smoe evaluate` on the demo's forecasts: WeatherBench 2 view against the evaluation before it\n\n"
        f"Command: `python benchmarks/evaluate_demo_time.py --demo DEMO --out {a.out}` "
        "(DEMO: an `smoe demo` output, any --steps).\n"
        f"Each command in a child process on one thread, interleaved, {a.rounds} rounds, median; load average "
        f"{result['load_average'][0]:.1f} at the end.\n\n"
        "| run | what | median wall s |\n|---|---|---:|\n"
        f"| baseline | `smoe evaluate` at {a.baseline_commit} (global only) | {med['baseline']:.1f} |\n"
        "| new | `smoe evaluate` (global, land, sea) `--spectra` + `plot scorecard` + `plot spectra` | "
        f"{med['new']:.1f} |\n\n"
        f"Ratio new / baseline: **{result['ratio_new_to_baseline']:.2f}** (target ≤ 2).\n")
    print(a.out.read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
