"""The demo is a list of ordinary `smoe` commands: every one must parse with today's CLI (catches flag drift
between the demo and the verbs without running the 10-minute chain; each verb has its own end-to-end tests)."""

from __future__ import annotations

from pathlib import Path

from smoeweather.cli import build_parser
from smoeweather.demo import CONFIGS, plan_demo


def test_every_demo_command_parses_and_covers_the_chain(tmp_path: Path) -> None:
    plan = plan_demo(tmp_path / "demo", steps=7)
    parser = build_parser()
    verbs = [parser.parse_args(argv).command for argv in plan.commands]
    assert verbs == ["train", "train", "forecast", "forecast", "evaluate", "postprocess", "postprocess",
                     "postprocess", "evaluate", "plot", "plot", "plot", "plot", "plot", "plot"]
    plots = [argv[1] for argv in plan.commands if argv[0] == "plot"]
    assert plots == ["routing", "scores", "scorecard", "spectra", "forecast", "emos"]
    assert "--spectra" in plan.commands[4]  # the models' evaluation also writes the zonal spectra
    pp = [argv[1] for argv in plan.commands if argv[0] == "postprocess"]
    assert pp == ["synthetic", "fit", "apply"]  # fit once, apply to the held-out year
    trains = [argv for argv in plan.commands if argv[0] == "train"]
    for argv in trains:  # equal optimizer-step budgets, never wall-clock
        assert "trainer.max_steps=7" in argv and not any("max_time" in a for a in argv)
        assert Path(argv[argv.index("--config") + 1]).is_relative_to(CONFIGS)
        assert Path(argv[argv.index("--config") + 1]).is_file()
    assert [t.name for t in plan.tables] == ["scores.md", "scores.md"]


def test_python_m_smoeweather_is_the_smoe_command():
    """The demo runs every step as ``python -m smoeweather ...``; that entry point must exist and parse."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "smoeweather", "demo", "--help"], capture_output=True, text=True,
                          check=False)
    assert done.returncode == 0, done.stderr
    assert "--steps" in done.stdout
