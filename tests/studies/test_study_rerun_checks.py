"""The re-run checks: bit-identical re-runs are told apart from changed ones, the thread-count spread is the
per-seed difference, and the schedule is chosen on the validation loss only."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from benchmarks.studies import study_rerun_checks as rerun_checks


def _study(runs: list[tuple[str, int, float, float]], threads: int = 1) -> dict:
    return {"name": "s", "runs": [{"variant": a, "seed": s, "val_loss": v, "scores": {"48h": {"z": score}},
                                   "environment": {"threads": threads}} for a, s, v, score in runs]}


def test_rerun_spread_and_schedule_on_validation() -> None:
    base = _study([("a", 0, 0.10, 20.0), ("a", 1, 0.20, 21.0), ("a", 2, 0.15, 22.0)])
    again = _study([("a", 0, 0.10, 20.0), ("a", 1, 0.20, 21.5)])
    other = _study([("a", 0, 0.1, 20.3), ("a", 1, 0.2, 20.6), ("a", 2, 0.1, 22.0)], threads=2)
    # constant rate: better TEST scores, worse validation losses -> cosine is chosen
    schedule = _study([("a", 0, 0.10, 20.0), ("a", 1, 0.20, 21.0), ("c", 0, 0.12, 10.0), ("c", 1, 0.25, 11.0)])
    c = rerun_checks.checks(base, again, other, schedule, "a", "c", "z@48h")
    assert [r["identical"] for r in c["rerun_same_threads"]] == [True, False]
    assert c["seed_spread"]["std"] == pytest.approx(1.0, rel=1e-12)
    o = c["other_threads"]
    assert o["threads"] == 2
    assert o["max_abs_diff"] == pytest.approx(0.4, rel=1e-12)
    assert o["rms_diff"] == pytest.approx(np.sqrt((0.3**2 + 0.4**2) / 3), rel=1e-12)
    s = c["schedule"]
    d = np.array([0.10 - 0.12, 0.20 - 0.25])
    half = stats.t.ppf(0.975, 1) * d.std(ddof=1) / np.sqrt(2)
    assert s["chosen"] == "cosine"
    assert s["cosine_minus_constant"]["lo"] == pytest.approx(d.mean() - half, rel=1e-9)
    assert "| 1 | 21.0 | 21.5 | NO |" in rerun_checks.markdown(c)


def test_missing_metric_is_named() -> None:
    with pytest.raises(ValueError, match="TARGET@LEAD"):
        rerun_checks.checks(_study([("a", 0, 0.1, 1.0)]), None, None, None, "a", "c", "t850@48h")
