"""The step budget of each arm is chosen on the validation loss only, never on the test score."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from benchmarks.studies import budget_selection


def _study(name: str, steps: int, runs: list[tuple[str, int, float, float]], ratios: dict[str, float]) -> dict:
    return {"name": name, "steps": steps,
            "cost": {"arms": {a: {"train_step_ratio": r} for a, r in ratios.items()}},
            "runs": [{"variant": a, "seed": s, "val_loss": v, "scores": {"48h": {"z": score}}}
                     for a, s, v, score in runs]}


def test_budget_chosen_on_validation_not_test() -> None:
    # seed 0: the short run has the better TEST score but the worse validation loss -> the long run is chosen
    short = _study("short", 400, [("a", 0, 0.5, 10.0), ("a", 1, 0.1, 12.0), ("b", 0, 0.3, 11.0),
                                  ("b", 1, 0.3, 13.0)], {"a": 1.0, "b": 2.0})
    long = _study("long", 1200, [("a", 0, 0.2, 15.0), ("a", 1, 0.2, 11.0), ("b", 0, 0.4, 9.0),
                                 ("b", 1, 0.2, 14.5)], {})
    c = budget_selection.select([short, long], "z@48h", baseline="b", pairs=[])
    a, b = c["arms"]["a"], c["arms"]["b"]
    assert a["chosen_budget"] == {"0": 1200, "1": 400}
    assert b["chosen_budget"] == {"0": 400, "1": 1200}
    assert a["chosen_score"]["mean"] == pytest.approx((15.0 + 12.0) / 2, rel=1e-15)
    # cost: step ratio (from the study that measured it) x mean chosen steps
    assert a["chosen_cost_step_units"] == pytest.approx(1.0 * 800, rel=1e-15)
    assert b["chosen_cost_step_units"] == pytest.approx(2.0 * 800, rel=1e-15)
    (pair,) = c["pairs"]
    d = np.array([15.0 - 11.0, 12.0 - 14.5])
    half = stats.t.ppf(0.975, 1) * d.std(ddof=1) / np.sqrt(2)
    assert (pair["first"], pair["second"]) == ("a", "b")
    assert pair["lo"] == pytest.approx(d.mean() - half, rel=1e-12)
    assert pair["hi"] == pytest.approx(d.mean() + half, rel=1e-12)
    assert "| a |" in budget_selection.markdown(c)


def test_scores_shown_to_four_significant_figures() -> None:
    # T850 CRPS in K is near 0.2: two decimals would print every arm as 0.21 and every difference as +0.00
    s = _study("x", 400, [("a", 0, 0.1, 0.21234), ("a", 1, 0.2, 0.20123), ("b", 0, 0.1, 0.22), ("b", 1, 0.1, 0.23)],
               {})
    md = budget_selection.markdown(budget_selection.select([s], "z@48h", baseline="b", pairs=[]))
    assert "| 0.2068 ± 0.0079 (2) |" in md
    assert "| a − b | -0.0182 [" in md


def test_two_studies_of_one_budget_refused() -> None:
    s = _study("x", 400, [("a", 0, 0.1, 1.0)], {})
    with pytest.raises(SystemExit, match="400 steps"):
        budget_selection.select([s, dict(s, name="y")], "z@48h", baseline="a", pairs=[])


def test_missing_metric_names_the_option(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    s = _study("x", 400, [("a", 0, 0.1, 1.0)], {})
    with pytest.raises(ValueError, match="TARGET@LEAD"):
        budget_selection.select([s], "t850@48h", baseline="a", pairs=[])
    path = tmp_path / "study.json"
    path.write_text(json.dumps(s))
    out = tmp_path / "selection.md"
    monkeypatch.setattr(sys, "argv", ["budget_selection.py", "--study", str(path), "--metric", "t850@48h",
                                      "--baseline", "a", "--out", str(out)])
    with pytest.raises(SystemExit, match="--metric t850@48h"):
        budget_selection.main()
    assert not out.exists()  # a failed selection writes nothing


def test_studies_of_different_data_refused() -> None:
    """Budgets are compared seed by seed, so their studies must score one dataset: reference scores 2 % apart
    (two GCM worlds) are refused, a difference at float64 rounding is not."""
    short = dict(_study("short", 400, [("a", 0, 0.1, 1.0)], {}),
                 references={"persistence": {"48h": {"z": 891.8901077790248}}})
    same = dict(_study("long", 1200, [("a", 0, 0.2, 1.0)], {}),
                references={"persistence": {"48h": {"z": 891.8901077790248 * (1 + 1e-15)}}})
    other = dict(same, references={"persistence": {"48h": {"z": 909.2739988857927}}})
    budget_selection.select([short, same], "z@48h", baseline="a", pairs=[])
    with pytest.raises(SystemExit, match=r"short and long were scored on different data \(reference "
                                         r"persistence/48h/z: 909.274 against 891.89\)"):
        budget_selection.select([short, other], "z@48h", baseline="a", pairs=[])
