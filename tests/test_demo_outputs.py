"""The demo's index of its outputs (INDEX.md), its fixed per-step environment, and its EMOS map step."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from smoeweather.cli import main
from smoeweather.experiments.demo import DESCRIPTIONS, INDEX, plan_demo, step_environment, write_index


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
    mapped, cmap, _, handles = _categorical(values, np.ones((6, 10)) / 60, max_classes=20)
    assert handles[-1].get_label() == "10 smaller experts, pooled (33.3%)"
    assert handles[-1].get_hatch() == "///"
    assert mapped.max() == 20 and cmap.colors[20] == (0.55, 0.55, 0.55)
