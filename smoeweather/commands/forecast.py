"""``smoe forecast CKPT | --method persistence|climatology|train_mean --data STORE --init START END
--lead 72h 120h --out FC.zarr``: forecasts in WeatherBench 2 conventions."""

from __future__ import annotations

import argparse
from pathlib import Path

NAME = "forecast"


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("forecast", help="forecast from a checkpoint or a reference method (WeatherBench 2 layout)")
    p.add_argument("checkpoint", nargs="?", type=Path,
                   help="a weatherbench checkpoint of `smoe train`, or its export folder (`smoe export`)")
    p.add_argument("--method", choices=("persistence", "climatology", "train_mean"), default=None,
                   help="reference forecast instead of a checkpoint")
    p.add_argument("--data", required=True, nargs="+",
                   help="prepared store or canonical netCDF file(s)/glob: the initial conditions (and truth)")
    p.add_argument("--init", required=True, nargs="+", metavar="TIME",
                   help="first and last init time, START END (one TIME: that init alone)")
    p.add_argument("--every", default="12h", help="time between initialisations (default 12h)")
    p.add_argument("--lead", nargs="+", default=["72h", "120h"], help="lead times, e.g. 72h 120h (default)")
    p.add_argument("--out", required=True, type=Path, help="output store (.zarr) or netCDF (.nc)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing --out")
    p.add_argument("--fields", nargs="+", default=None,
                   help="fields of a --method forecast (default geopotential_500 temperature_850)")
    p.add_argument("--climatology-from", type=Path, default=None,
                   help="training store for --method climatology/train_mean")
    p.add_argument("--climatology-years", nargs=2, type=int, default=None, metavar=("Y0", "Y1"),
                   help="training years of the climatology (default: the store's statistics years, else all)")
    p.add_argument("--name", default=None, help="method name in score tables (default: run or method name)")
    p.add_argument("--batch-size", type=int, default=16,
                   help="checkpoints: initial times forecast per network batch (default 16; lower it to save memory)")
    p.add_argument("--device", default="cpu", help="torch device, e.g. cpu or cuda")
    p.add_argument("--beyond-data", action="store_true",
                   help="allow valid times past the data (no truth check; inputs must still exist)")
    p.add_argument("--no-progress", action="store_true", help="do not print the progress of the forecast")
    p.add_argument("--no-plausibility-check", action="store_true",
                   help="do not refuse --data values outside the plausible range of a known variable (exotic data)")


def run(args: argparse.Namespace) -> int:
    from smoeweather.commands.options import check_count, check_device
    from smoeweather.data.forecast_stores import parse_lead
    from smoeweather.forecast import run_forecast

    if (args.checkpoint is None) == (args.method is None):
        raise ValueError("give either a checkpoint or --method persistence|climatology|train_mean (not both)")
    check_count(args.batch_size, "--batch-size", example=16)
    check_device(args.device)
    if len(args.init) > 2:
        raise ValueError(f"--init takes the first and last init time (START END) or one time, got {len(args.init)}: "
                         f"{' '.join(args.init)}; use --every for the spacing")
    for lead in args.lead:
        parse_lead(lead, "--lead")
    data = args.data[0] if len(args.data) == 1 else args.data
    out = run_forecast(
        data,
        checkpoint=args.checkpoint,
        method=args.method,
        init=(args.init[0], args.init[-1]),
        every=args.every,
        leads_h=args.lead,
        out=args.out,
        overwrite=args.overwrite,
        fields=args.fields,
        climatology_from=args.climatology_from,
        climatology_years=tuple(args.climatology_years) if args.climatology_years else None,
        batch_size=args.batch_size,
        device=args.device,
        beyond_data=args.beyond_data,
        name=args.name,
        progress=not args.no_progress,
        plausibility_check=not args.no_plausibility_check,
    )
    print(f"smoe forecast: wrote {out}")
    return 0
