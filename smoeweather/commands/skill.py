"""``smoe skill train|evaluate``: lat-weighted RMSE of checkpoints vs persistence/climatology."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

NAME = "skill"


def add_parser(sub: argparse._SubParsersAction) -> None:
    skill = sub.add_parser("skill", help="skill of weatherbench checkpoints vs persistence/climatology")
    verbs = skill.add_subparsers(dest="skill_verb", required=True)
    tr = verbs.add_parser("train", help="smoe train, then print the checkpoint paths as JSON")
    tr.add_argument("--config", required=True, type=Path)
    tr.add_argument("overrides", nargs="*")
    ev = verbs.add_parser("evaluate", help="score checkpoints; write skill.json and skill.md")
    ev.add_argument("--out", required=True, type=Path)
    ev.add_argument("checkpoints", nargs="+", type=Path)


def run(args: argparse.Namespace) -> int:
    from smoeweather.experiments import skill

    if args.skill_verb == "train":
        from smoeweather.config import load_config
        from smoeweather.training.run import train

        result = train(load_config(args.config, args.overrides))
        print(json.dumps({"best": result.best_checkpoint, "last": result.last_checkpoint}))
        return 0
    from smoeweather.io import write_json, write_text

    results = [skill.evaluate_checkpoint(c) for c in args.checkpoints]
    write_json(args.out / "skill.json", results)
    write_text(args.out / "skill.md", skill.markdown(results))
    print(skill.markdown(results))
    return 0
