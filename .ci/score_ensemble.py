"""Wheel smoke: score a 3-member ensemble (WB2's ``realization`` dim) with the installed `smoe evaluate`.

Run from the folder holding ``demo/`` (``smoe demo --steps 2 --out demo``), with the wheel's environment's
python: it builds the ensemble from the demo world and calls ``smoe evaluate`` beside that python, so an
ensemble is scored by an install that has only the wheel's declared dependencies."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import xarray as xr

world = xr.open_zarr("demo/data/default_world.zarr")
name = "temperature" if "temperature" in world else next(iter(world.data_vars))
truth = world[name].isel(time=slice(0, 40))
inits = truth["time"].values[:20]
lead = np.timedelta64(24, "h")
at_valid = world[name].sel(time=inits + lead).values
rng = np.random.default_rng(0)
members = at_valid[:, None, None] + rng.normal(0.0, 1.0, size=(len(inits), 1, 3, *at_valid.shape[1:]))
dims = ("time", "prediction_timedelta", "realization", *truth.dims[1:])
coords = {"time": inits, "prediction_timedelta": [lead], **{d: world[d].values for d in truth.dims[1:]}}
fc = xr.Dataset({name: (dims, members.astype(np.float32), dict(truth.attrs))}, coords=coords)
fc.to_zarr("ensemble.zarr", zarr_format=2, mode="w")
smoe = Path(sys.executable).with_name("smoe")
subprocess.run([str(smoe), "evaluate", "ens=ensemble.zarr", "--truth", "demo/data/default_world.zarr",
                "--no-references", "--quiet", "--overwrite", "--out", "ensemble_scores"], check=True)
prob = xr.load_dataset("ensemble_scores/wb2/ens/probabilistic.nc")
assert prob.attrs["ensemble_size"] == 3 and bool(np.isfinite(prob[name]).all()), prob
print("wheel-smoke: an ensemble with a 'realization' dim scored by the installed wheel")
