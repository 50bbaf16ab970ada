"""The demo's index of its outputs (INDEX.md), its fixed per-step environment, and its EMOS map step."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from smoeweather.cli import main
from smoeweather.demo import DESCRIPTIONS, INDEX, plan_demo, step_environment, write_index


def test_every_planned_output_has_a_description(tmp_path: Path) -> None:
    """Each file or folder a demo command writes (its --out) is described in INDEX.md."""
    out = tmp_path / "demo"
    plan = plan_demo(out, steps=3)
    outs = {str(Path(a[a.index("--out") + 1]).relative_to(out)) for a in plan.commands if "--out" in a}
    outs |= {str(Path(a[a.index("--members-out") + 1]).relative_to(out)) for a in plan.commands if "--members-out" in a}
    outs |= {str(Path(a[a.index("output_dir=") + 11:])).removeprefix(str(out) + "/") for c in plan.commands
             for a in c if a.startswith("output_dir=")}
    described = {k.rstrip("/") for k in DESCRIPTIONS}
    for rel in outs:  # `smoe evaluate --out DIR` writes DIR/scores.{md,nc,json}
        assert rel in described or f"{rel}/scores.md" in described, f"demo output {rel} has no description"
    assert ["plot", "emos"] == plan.commands[-1][:2]  # the EMOS coefficient maps are part of the demo
    assert plan.commands[-1][2].endswith("emos_gridpoint.nc")


def test_index_lists_what_exists_and_flags_the_rest(tmp_path: Path) -> None:
    out = tmp_path / "demo"
    (out / "scores").mkdir(parents=True)
    (out / "scores" / "scores.md").write_text("| method |\n")
    (out / "maps" / "emos").mkdir(parents=True)
    (out / "maps" / "emos" / "emos_geopotential_500_24h.png").write_bytes(b"png")
    (out / "stray.txt").write_text("?")
    index = write_index(out)
    assert index == out / INDEX
    text = index.read_text()
    assert "- `scores/scores.md`: THE TABLE" in text and "lower is better" in text
    assert "    - `maps/emos/emos_geopotential_500_24h.png`" in text
    assert "- `stray.txt`: (no description)" in text
    assert "runs/dense" not in text  # only what exists
    assert not list(out.glob("*.tmp"))
    assert write_index(out).read_text() == text  # the index never lists itself


def test_every_step_runs_with_the_same_thread_count(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", "7")
    env = step_environment(2)
    assert env["OMP_NUM_THREADS"] == env["MKL_NUM_THREADS"] == "2" and env["PYTHONHASHSEED"] == "0"
    assert env["PATH"] == os.environ["PATH"]


def test_demo_refuses_a_bad_thread_count(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--threads", "0", "--out", "unused"]) == 2
    assert "--threads 0" in capsys.readouterr().err


def test_routing_legend_pools_the_smaller_experts_as_a_class_of_its_own() -> None:
    from smoeweather.plotting.routing import _categorical

    values = np.arange(30).repeat(2).reshape(6, 10)  # 30 experts, equal areas
    mapped, cmap, _, handles = _categorical(values, np.ones((6, 10)) / 60, max_classes=20,
                                            pooled=("expert", "experts"))
    assert handles[-1].get_label() == "10 smaller experts, pooled (33.3%)"
    assert handles[-1].get_hatch() == "///"
    assert mapped.max() == 20 and cmap.colors[20] == (0.55, 0.55, 0.55)


def test_closing_summary_is_short_and_holds_the_headline_scores(tmp_path: Path) -> None:
    """The demo's last printout: RMSE and ACC of both networks and both references at 72 h and 120 h, read
    from scores.json, and the paths of INDEX.md, the full tables and the figures; the rest stays in files."""
    import json

    from smoeweather.demo import summary

    out = tmp_path / "demo"
    plan = plan_demo(out, steps=3)
    methods = ["dense", "smoe_prior", "persistence", "climatology"]
    fields = ["geopotential_500", "temperature_850"]
    value = {(m, f, lead): 100.0 * i + 10.0 * j + k for i, m in enumerate(methods) for j, f in enumerate(fields)
             for k, lead in enumerate(["72h", "120h"])}
    scores = {m: {metric: {f: {lead: (value[m, f, lead] if metric == "rmse" else 0.5 + value[m, f, lead] / 1e3)
                               for lead in ("72h", "120h")} for f in fields} for metric in ("rmse", "acc", "bias")}
              for m in methods}
    (out / "scores").mkdir(parents=True)
    (out / "scores" / "scores.json").write_text(json.dumps(
        {"scores": scores, "units": {"geopotential_500": "m² s⁻²", "temperature_850": "K"}}))
    (out / "maps" / "scores").mkdir(parents=True)
    (out / "maps" / "scores" / "rmse.png").write_bytes(b"png")
    text = summary(plan, out / INDEX, 812.4)
    lines = text.splitlines()
    assert len(lines) <= 40 and lines[0].startswith("smoe demo: done in 812 s.")
    assert ("| RMSE | geopotential_500 72h [m² s⁻²] | geopotential_500 120h [m² s⁻²] | temperature_850 72h [K] | "
            "temperature_850 120h [K] |") in lines
    assert "| smoe_prior | 100 | 101 | 110 | 111 |" in lines  # RMSE row: value[m, f, lead] in field-lead order
    assert "| climatology | 0.8 | 0.801 | 0.81 | 0.811 |" in lines  # ACC row
    assert "BIAS" not in text and "bias" in text  # other metrics are named, not tabled
    assert f"What every file is and how to read it: {out / INDEX}" in lines
    assert f"  {out / 'scores' / 'scores.md'}" in lines and f"  {out / 'ensemble' / 'scores' / 'scores.md'}" in lines
    assert f"  {out / 'maps' / 'scores'}/ (1 PNG)" in lines and f"  {out / 'maps' / 'routing'}/ (0 PNG)" in lines


def test_bottom_line_states_the_result_from_the_scores(tmp_path: Path) -> None:
    """The result in sentences, from the score tables: SMoE vs dense, the better network vs the better reference,
    EMOS vs the raw ensemble; and INDEX.md opens with it."""
    import json

    from smoeweather.demo import bottom_line

    rmse = {"dense": (100.0, 200.0), "smoe_prior": (110.0, 190.0), "persistence": (120.0, 180.0),
            "climatology": (150.0, 170.0)}
    scores = {m: {"rmse": {"z": {"72h": a, "120h": b}}} for m, (a, b) in rmse.items()}
    pp = {"raw_ensemble": {"crps": {"z": {"72h": 10.0}}}, "emos": {"crps": {"z": {"72h": 8.0}}}}
    lines = bottom_line(scores, pp)
    assert lines[0] == ("- At equal optimizer steps the SMoE ResNet's RMSE is lower than the dense ResNet's in 1 of 2 "
                        "field-leads: -5.0 % (z 120h) to +10.0 % (z 72h).")
    # best network 100 / 190 against the best reference 120 / 170: -16.7 % and +11.8 %
    assert lines[1] == ("- The better network beats the better of persistence and climatology in 1 of 2 field-leads: "
                        "its RMSE against theirs -16.7 % (z 72h) to +11.8 % (z 120h).")
    assert lines[2] == "- EMOS lowers the raw ensemble's CRPS on the held-out year: -20.0 % (z 72h)."
    scores["persistence"]["rmse"]["z"]["120h"] = 195.0
    scores["climatology"]["rmse"]["z"]["120h"] = 196.0
    assert "in every field-lead" in bottom_line(scores)[1] and len(bottom_line(scores)) == 2
    scores["smoe_prior"]["rmse"]["z"]["120h"] = 201.0
    assert "higher than the dense ResNet's in every field-lead" in bottom_line(scores)[0]

    out = tmp_path / "demo"
    (out / "scores").mkdir(parents=True)
    (out / "scores" / "scores.json").write_text(json.dumps({"scores": scores}))
    text = write_index(out).read_text()
    assert text.index("## The result") < text.index("in every field-lead") < text.index("## The files")
