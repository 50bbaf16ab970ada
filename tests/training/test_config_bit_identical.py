"""Refactors of the configuration keep outputs identical: a tiny seeded train → forecast gives the same weights and
forecast values as the recording (``config_digests.json``). On the machine that recorded it (the full
:func:`reference_values.fingerprint`: CPU model and flags, torch's CPU capability, oneDNN, MKL, the BLAS kernel, 2
intra-op threads) the bytes must be equal; on every other machine the values must agree within float32 rounding
(:data:`REL`), since other kernels round the last bits differently. Record with this file's ``__main__``.

History: the first digests were recorded on commit f1bf021, before the typed configuration; the recording was
renewed with fingerprints and reference values on an AVX-512 machine whose digests the old key could not tell
apart from the AVX2 recording machine's. ``postprocess_unet_prior`` was re-recorded when the package's torch Gaussian
CRPS became one function (Φ as ½ erfc(−z/√2), as the DRN had it, for 1 + erf(z/√2)): its weights moved in the last
bits, within :data:`REL` of the old reference."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import float_tol
from reference_values import assert_close_to_reference, digest, fingerprint, is_recording_machine, summarize

from pipelines.prepare import write_store
from pipelines.world import simulate_world
from smoeweather.config import apply_overrides, read_config

REPO = Path(__file__).resolve().parents[2]
DIGESTS = Path(__file__).parents[1] / "config_digests.json"
TRAINER = ["trainer.accelerator=cpu", "trainer.devices=1", "trainer.strategy=auto", "trainer.max_epochs=1",
           "trainer.limit_train_batches=2", "trainer.limit_val_batches=1", "trainer.max_time=null",
           "trainer.enable_progress_bar=false", "trainer.log_every_n_steps=1", "trainer.precision=32-true",
           "trainer.num_nodes=1", "trainer.deterministic=true"]
WORLD = ["data.world=null", "data.sources=null", "data.train_years=null", "data.valid_years=null",
         "data.test_years=null", "data.train_period=[2000-01-01, 2000-01-31T18:00]",
         "data.valid_period=[2000-02-01, 2000-02-10]", "data.test_period=[2000-02-11, 2000-02-20]",
         "data.variables=[geopotential_500, temperature_850]", "data.lead_h=null", "data.lead_choices_h=[24, 48]",
         "data.batch_size=4", "data.num_workers=0", "model.width=8", "model.blocks=1"]
CASES = {
    "world_smoe_all_prior": ("weatherbench/world_smoe_all_prior.yaml", []),
    "gcm_e3": ("weatherbench/gcm_e3.yaml", ["model.smoe.experts_factor=8", "model.members=2"]),
    "heat_smoe": ("heat/smoe.yaml", ["data.batch_size=4"]),
    "postprocess_unet_prior": ("postprocess/gcm_ens_smoe_unet_prior.yaml", []),
}
POSTPROCESS = ["data.variables=[geopotential_500, temperature_500]", "data.target_variables=[geopotential_500]",
               "data.leads_h=null", "data.train_period=[2000-01-01, 2000-01-31T18:00]",
               "data.valid_period=[2000-02-01, 2000-02-10]", "data.test_period=[2000-02-11, 2000-02-20]",
               "data.batch_size=4", "model.widths=[4, 8, 16]", "trainer.max_steps=-1",
               "trainer.val_check_interval=1.0", "trainer.check_val_every_n_epoch=1"]


# Allowances from float32 rounding (float_tol: 2 n u for n dependent roundings, u = 2^-24):
# - weights: the seeded init plus two Adam updates, each added with one rounding relative to the weight: n = 8;
# - forecast: a chain through every layer of the network: n = 64.
# Measured on one AVX-512 CPU at the torch capabilities default / AVX2 / AVX-512 (oneDNN and MKL limited to match):
# ||dx|| / ||x|| at most 3.3e-9 for weights (allowance 9.5e-7) and 9.9e-8 for forecasts (allowance 7.6e-6).
# A learning rate 1 % off fails (heat: the weights; world SMoE: its forecast), as does one more optimizer step.
REL = {"weights": float_tol(torch.float32, n_ops=8)["rtol"], "forecast": float_tol(torch.float32, n_ops=64)["rtol"]}


def make_stores(root: Path) -> dict[str, str]:
    """A 60-day world store and a tiny heat store under ``root``."""
    from pipelines.heat_diffusion import generate

    world = root / "world.zarr"
    write_store(lambda: simulate_world((2000, 2000), seed=0, n_steps=240), world, args={"test": "world"},
                train_years=None, source="test", time_chunk=8, scheduler="synchronous", progress=False)
    heat = root / "heat.zarr"
    generate(heat, runs=4, val_runs=2, test_runs=2, steps=6, size=16, seed=0, progress=False)
    return {"world": str(world), "heat": str(heat), "ens": make_ens_store(str(world), root / "ens.zarr")}


def make_ens_store(world_store: str, path: Path) -> str:
    """ENS-like store from the world: 3 perturbed members of the truth 48 h ahead, daily inits, one lead."""
    import xarray as xr

    world = xr.open_zarr(world_store).sel(level=[500]).isel(time=slice(0, None, 4)).load()
    rng = np.random.default_rng(0)
    data = {}
    for name in ("geopotential", "temperature"):
        truth = world[name].values  # (T, 1, H, W)
        later = np.concatenate([truth[2:], truth[-2:]])
        noise = 0.1 * truth.std() * rng.normal(size=(truth.shape[0], 3, *truth.shape[1:]))
        data[name] = (("time", "member", "level", "latitude", "longitude"),
                      (truth[:, None] + 0.5 * (later - truth)[:, None] + noise).astype(np.float32))
        data[name + "_truth"] = (("time", "level", "latitude", "longitude"), truth)
    ds = xr.Dataset(data, coords={"time": world.time.values, "member": np.arange(3), "level": [500],
                                  "latitude": world.latitude.values, "longitude": world.longitude.values,
                                  "prediction_timedelta": np.timedelta64(48, "h")})
    write_store(lambda: ds, path, args={"test": "ens"}, train_years=None, source="test", time_chunk=8,
                scheduler="synchronous", progress=False)
    return str(path)


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    return make_stores(tmp_path_factory.mktemp("bit"))


def run_case(name: str, stores: dict[str, str], out: Path) -> dict[str, list[np.ndarray]]:
    """Train the tiny ``name`` and forecast with it: {"weights": the state dict's arrays by name, "forecast": the
    forecast's variables by name} (the forecast for weather models only)."""
    from smoeweather.training.run import train

    config, extra = CASES[name]
    cfg = read_config(REPO / "configs" / config)
    common = [f"output_dir={out}", *TRAINER]
    if cfg["task"] == "heat":
        overrides = [*common, f"data.store={stores['heat']}", *extra]
    elif cfg["task"] == "postprocess":
        overrides = [*common, f"data.source={stores['ens']}", f"data.constants={stores['world']}", *POSTPROCESS]
    else:
        overrides = [*common, f"data.store={stores['world']}", *WORLD, *extra]
    result = train(apply_overrides(cfg, overrides))
    state = result.module.model.state_dict()
    arrays = {"weights": [state[k].detach().cpu().numpy() for k in sorted(state)]}
    if cfg["task"] == "weatherbench":
        from smoeweather.forecast import make_forecast

        ds = make_forecast(stores["world"], (np.datetime64("2000-02-12"), np.datetime64("2000-02-13")),
                           every="24h", leads_h=(24,), checkpoint=result.last_checkpoint, progress=False)
        arrays["forecast"] = [ds[v].values for v in sorted(ds.data_vars)]
    return arrays


@pytest.mark.usefixtures("recorded_threads")
@pytest.mark.parametrize("name", sorted(CASES))
def test_tiny_train_and_forecast_are_bit_identical(name: str, stores: dict[str, str], tmp_path: Path) -> None:
    recorded = json.loads(DIGESTS.read_text())
    got = run_case(name, stores, tmp_path / name)
    for part, arrays in got.items():
        assert_close_to_reference(summarize(arrays), recorded["reference"][name][part], REL[part], f"{name} {part}")
    if is_recording_machine(recorded["machine"]):  # the bytes, only where they were recorded
        assert {part: digest(arrays) for part, arrays in got.items()} == recorded["digests"][name]


def record(path: Path = DIGESTS) -> None:
    """Record digests, reference statistics and this machine's fingerprint (2 threads, seeds 0)."""
    import tempfile

    torch.set_num_threads(2)
    s = make_stores(Path(tempfile.mkdtemp(prefix="bit")))
    digests, reference = {}, {}
    for case in sorted(CASES):
        torch.manual_seed(0)
        np.random.seed(0)
        got = run_case(case, s, Path(tempfile.mkdtemp(prefix=case)))
        digests[case] = {part: digest(arrays) for part, arrays in got.items()}
        reference[case] = {part: summarize(arrays) for part, arrays in got.items()}
    path.write_text(json.dumps({"machine": fingerprint(), "digests": digests, "reference": reference}, indent=1)
                    + "\n")


if __name__ == "__main__":  # record: PYTHONPATH=tests python tests/training/test_config_bit_identical.py [OUT.json]
    import sys

    record(Path(sys.argv[1]) if len(sys.argv) > 1 else DIGESTS)
