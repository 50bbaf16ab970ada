"""Add the ECDF CRPS (``crps_ecdf``) to the finished runs of an ensemble study (``scoring: ensemble``) that were
scored before ``smoe evaluate`` reported it, from the forecast store each run kept (no retraining, no new
forecast). Each run's ``result.json`` gains ``extra.crps_ecdf`` {lead: {target: value}}; its other scores are
checked to be reproduced (the fair CRPS to float64 round-off). Then ``smoe study`` with the same command
re-summarises the study (every run is finished, so it only rewrites study.json/.md).

    python -m benchmarks.studies.ensemble_rescore runs/studies/gcm_ensembles_cpu
    smoe study --config configs/studies/gcm_ensembles_cpu.yaml --out runs/studies/gcm_ensembles_cpu
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import numpy as np
import yaml

from smoeweather.evaluate.run import evaluate
from smoeweather.io import write_json


def rescore(run: Path) -> bool:
    """Add crps_ecdf to ``run``/result.json; False if it already had it."""
    result = json.loads((run / "result.json").read_text())
    if "crps_ecdf" in result.get("extra", {}):
        return False
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    scores = evaluate({"model": run / "forecast.zarr"}, cfg["data"]["store"], references=False)
    table: dict[str, dict[str, float]] = {}
    for lead, by_target in result["scores"].items():
        table[lead] = {}
        at = np.timedelta64(int(lead.rstrip("h")), "h")
        for target, fair in by_target.items():
            cell = {"method": "model", "field": target, "prediction_timedelta": at}
            again = scores["crps"].sel(cell).item()
            if not math.isclose(again, fair, rel_tol=1e-9):
                raise ValueError(f"{run}: the stored fair CRPS {fair} of {target}@{lead} is not reproduced ({again})")
            table[lead][target] = scores["crps_ecdf"].sel(cell).item()
    result.setdefault("extra", {})["crps_ecdf"] = table
    write_json(run / "result.json", result)
    return True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("study_dir", type=Path)
    runs = sorted(p.parent for p in parser.parse_args().study_dir.glob("runs/*/seed*/result.json"))
    for run in runs:
        print(f"{run}: {'crps_ecdf added' if rescore(run) else 'already has crps_ecdf'}", flush=True)


if __name__ == "__main__":
    main()
