"""Statistics of a generated GCM world beside the shared one: is `smoe data gcm-world` a world of
the same kind? Z500/T850 latitude-weighted mean and std, persistence RMSE at 72/120 h and the RMSE of the
period's mean state, over the same number of days from 1 January of each.

    python benchmarks/gcm_world_stats.py GENERATED.nc [...] --shared ../shared/data/gcm_world/gcm_5.625deg_year1.nc \
        --days 60 --out benchmarks/results/gcm_world_stats.md
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from pipelines.gcm import world_statistics


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("generated", nargs="+", type=Path, help="gcm_5.625deg_yearN.nc files of smoe data gcm-world")
    ap.add_argument("--shared", nargs="+", type=Path, required=True, help="the shared world's files")
    ap.add_argument("--days", type=int, default=None, help="compare the first DAYS days of each")
    ap.add_argument("--label", default="generated", help="column name of the generated world")
    ap.add_argument("--out", type=Path, required=True, help="markdown table (a .json beside it)")
    args = ap.parse_args()
    gen = world_statistics(args.generated, days=args.days)
    ref = world_statistics(args.shared, days=args.days)
    rows = [k for k in gen if k != "days"]
    lines = [f"| statistic ({gen['days']:.0f} days from 1 January) | {args.label} | shared gcm_world |",
             "|---|---:|---:|"]
    lines += [f"| {k} | {gen[k]:.4g} | {ref[k]:.4g} |" for k in rows]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines) + "\n")
    args.out.with_suffix(".json").write_text(json.dumps({"generated": gen, "shared": ref,
                                                          "generated_files": [str(p) for p in args.generated],
                                                          "shared_files": [str(p) for p in args.shared]}, indent=1))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
