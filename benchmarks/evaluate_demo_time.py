"""Time of `smoe evaluate` on the demo's forecasts: the full WeatherBench 2 view against the evaluation before it.

New: ``smoe evaluate`` with the default regions (global, land, sea) and ``--spectra``, then ``smoe plot
scorecard`` and ``smoe plot spectra``. Baseline: ``smoe evaluate`` of the code before regions, spectra and
scorecards existed (``--baseline-commit``, checked out into a temporary git worktree and run from there with the
same interpreter), on the same forecasts with the same arguments otherwise. Each command runs in a child
process on one thread, the two interleaved for ``--rounds`` rounds; the ratio of the medians is reported
(target: at most 2).

    smoe demo --steps 2 --out runs/demo_bench        # the demo's forecasts (any --steps)
    python -m benchmarks.evaluate_demo_time --demo runs/demo_bench --out benchmarks/results/evaluate_demo_time.md
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks.harness import REPO, Machine, Rounds, interleave, load_average, thread_env, timed, write_results

BASELINE_COMMIT = "774ec52"  # the last evaluate before regions, spectra and scorecards
RUN = "import sys; from smoeweather.cli import main; sys.exit(main(sys.argv[1:]))"


def _timed(args: list[str], pythonpath: Path) -> float:
    """Wall seconds of ``smoe ARGS`` in a child process on one thread, importing the code at ``pythonpath``."""
    env = thread_env(1, base={**os.environ, "PYTHONPATH": str(pythonpath)})
    done, seconds = timed(subprocess.run, [sys.executable, "-c", RUN, *args], env=env, capture_output=True,
                          text=True)
    if done.returncode != 0:
        raise RuntimeError(f"smoe {' '.join(args)} failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    return seconds


def main() -> int:
    """The baseline's and the new evaluation's times in interleaved rounds; write the report."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--demo", type=Path, required=True, help="an `smoe demo` output folder")
    ap.add_argument("--baseline-commit", default=BASELINE_COMMIT)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", type=Path, required=True, help="markdown report (a .json beside it)")
    a = ap.parse_args()
    machine = Machine()
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
    done = {"baseline": 0, "new": 0}

    def baseline() -> float:
        done["baseline"] += 1
        return _timed(["evaluate", *common, "--out", str(work / f"old{done['baseline'] - 1}")], old)

    def new() -> float:
        scores, done["new"] = work / f"new{done['new']}", done["new"] + 1
        t = _timed(["evaluate", *common, "--spectra", "--out", str(scores)], REPO)
        t += _timed(["plot", "scorecard", str(scores / "scores.nc"), "--baseline", "dense", "--metrics", "rmse",
                     "acc", "--out", str(scores / "scorecard")], REPO)
        return t + _timed(["plot", "spectra", str(scores / "scores.nc"), "--out", str(scores / "spectra")], REPO)

    def progress(r: int, so_far: Rounds) -> None:
        s = so_far.seconds
        print(f"round {r + 1}/{a.rounds}: baseline {s['baseline'][-1]:.1f} s, new {s['new'][-1]:.1f} s", flush=True)

    try:
        rounds = interleave({"baseline": baseline, "new": new}, a.rounds, alternate=False, on_round=progress)
    finally:
        subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(old)], capture_output=True)
        shutil.rmtree(work, ignore_errors=True)
    med = rounds.medians()
    result = {"baseline_commit": a.baseline_commit, "rounds": a.rounds, "seconds": rounds.seconds, "median_s": med,
              "ratio_new_to_baseline": rounds.ratio_of_medians("new", "baseline"), "target_ratio_at_most": 2.0,
              "load_average": load_average()}
    text = (
        "# `smoe evaluate` on the demo's forecasts: WeatherBench 2 view against the evaluation before it\n\n"
        f"Command: `python -m benchmarks.evaluate_demo_time --demo DEMO --out {a.out}` "
        "(DEMO: an `smoe demo` output, any --steps).\n"
        f"Each command in a child process on one thread, interleaved, {a.rounds} rounds, median; load average "
        f"{result['load_average'][0]:.1f} at the end.\n\n"
        "| run | what | median wall s |\n|---|---|---:|\n"
        f"| baseline | `smoe evaluate` at {a.baseline_commit} (global only) | {med['baseline']:.1f} |\n"
        "| new | `smoe evaluate` (global, land, sea) `--spectra` + `plot scorecard` + `plot spectra` | "
        f"{med['new']:.1f} |\n\n"
        f"Ratio new / baseline: **{result['ratio_new_to_baseline']:.2f}** (target ≤ 2).\n")
    write_results(a.out, result, text, machine=machine)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
