"""Training: losses vs xarray/properscoring, every config trains (tiny) with a gradient for every parameter,
2-process DDP == 1 process with the combined batch, resume == uninterrupted, CMIP6→ERA5 --init-from,
versioned checkpoints."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import properscoring
import pytest
import torch
import xarray as xr
from conftest import float_tol

from pipelines.prepare import write_store
from pipelines.world import simulate_world
from smoeweather.config import apply_overrides, read_config
from smoeweather.models.loader import CheckpointFormatError, check_checkpoint
from smoeweather.nn.crps import gaussian_crps
from smoeweather.training.init import init_weights
from smoeweather.training.losses import lat_weighted_mse, latitude_weights
from smoeweather.training.run import train
from smoeweather.training.tasks import build

REPO = Path(__file__).resolve().parents[2]
# the weather and heat configs (tiny_overrides shrinks them); the vision task's configs are tested in
# tests/test_vision*.py with its own image data
CONFIGS = sorted(
    p for p in (REPO / "configs").glob("*/*.yaml")
    if not p.name.startswith("_") and read_config(p).get("task") in ("weatherbench", "ens10", "postprocess", "heat")
)
SMOE = (
    [str(REPO / ".venv" / "bin" / "smoe")]
    if (REPO / ".venv" / "bin" / "smoe").exists()
    else [sys.executable, "-m", "smoeweather.cli"]
)
PERIODS = {
    "train_period": ["2000-01-01", "2000-02-29T18:00"],
    "valid_period": ["2000-03-01", "2000-03-20"],
    "test_period": ["2000-03-21", "2000-04-09"],
}


# ---- losses ----------------------------------------------------------------------------------------
def test_latitude_weighted_mse_matches_xarray() -> None:
    rng = np.random.default_rng(0)
    lat = np.linspace(-87.1875, 87.1875, 32)
    pred, truth = rng.normal(size=(2, 3, 2, 32, 64))
    dims = ("time", "channel", "latitude", "longitude")
    err = xr.DataArray((pred - truth) ** 2, dims=dims, coords={"latitude": lat})
    w = np.cos(np.deg2rad(err.latitude))
    expected = err.weighted(w / w.mean()).mean(("time", "latitude", "longitude"))
    w_t = latitude_weights(lat)  # float32: each weight rounded once (relative u = 2^-24)
    assert float(w_t.mean()) == pytest.approx(1.0, abs=float_tol(torch.float32, 32)["rtol"])  # 32-term mean
    # float64 errors, float32 weights: the weighted mean is off by at most ~2 roundings of the weights
    tol = float_tol(torch.float32, 2)
    got = lat_weighted_mse(torch.tensor(pred), torch.tensor(truth), w_t, per_channel=True)
    np.testing.assert_allclose(got.numpy(), expected.values, rtol=tol["rtol"])
    total = lat_weighted_mse(torch.tensor(pred), torch.tensor(truth), w_t)
    assert float(total) == pytest.approx(float(expected.mean()), rel=tol["rtol"])


def test_gaussian_crps_matches_properscoring() -> None:
    rng = np.random.default_rng(1)
    mu, y = rng.normal(size=(2, 1000))
    sigma = rng.uniform(0.1, 3.0, size=1000)
    got = gaussian_crps(torch.tensor(mu), torch.tensor(sigma), torch.tensor(y)).numpy()
    # float64 both: a closed form of ~20 operations (erf, exp, products); scale 1 (σ ≤ 3, |y - μ| ~ 1)
    np.testing.assert_allclose(got, properscoring.crps_gaussian(y, mu, sigma), **float_tol(np.float64, 20))


# ---- tiny data -------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def era5_like_store(tmp_path_factory: pytest.TempPathFactory) -> str:
    """Another world (seed 1) standing in for ERA5 after CMIP6-style pretraining on ``world_store``."""
    path = tmp_path_factory.mktemp("era5") / "era5.zarr"
    ds = simulate_world((2000, 2000), seed=1, n_steps=400)
    write_store(
        lambda: ds,
        path,
        args={"test": "era5"},
        train_years=None,
        source="test",
        time_chunk=8,
        scheduler="synchronous",
        progress=False,
    )
    return str(path)


@pytest.fixture(scope="module")
def ens_store(tmp_path_factory: pytest.TempPathFactory, world_store: str) -> str:
    """ENS-10-like store from the world: 5 perturbed 'members' of the truth 48 h ahead, daily inits."""
    world = xr.open_zarr(world_store).sel(level=[500]).isel(time=slice(0, None, 4)).load()
    rng = np.random.default_rng(0)
    data = {}
    for name in ("geopotential", "temperature"):
        truth = world[name].values  # (T, 1, H, W)
        later = np.concatenate([truth[2:], truth[-2:]])  # "forecast" = truth 48 h later + noise
        scale = truth.std()
        members = (
            truth[:, None]
            + 0.5 * (later - truth)[:, None]
            + 0.1 * scale * rng.normal(size=(truth.shape[0], 5, *truth.shape[1:]))
        )
        data[name] = (("time", "member", "level", "latitude", "longitude"), members.astype(np.float32))
        data[name + "_truth"] = (("time", "level", "latitude", "longitude"), truth)
    ds = xr.Dataset(
        data,
        coords={
            "time": world.time.values,
            "member": np.arange(5),
            "level": [500],
            "latitude": world.latitude.values,
            "longitude": world.longitude.values,
            "prediction_timedelta": np.timedelta64(48, "h"),  # one lead, as `smoe data prepare ens10` writes it
        },
    )
    path = tmp_path_factory.mktemp("ens") / "ens.zarr"
    write_store(
        lambda: ds,
        path,
        args={"test": "ens"},
        train_years=None,
        source="test",
        time_chunk=8,
        scheduler="synchronous",
        progress=False,
    )
    return str(path)


@pytest.fixture(scope="module")
def heat_store(tmp_path_factory: pytest.TempPathFactory) -> str:
    from pipelines.heat_diffusion import generate

    path = tmp_path_factory.mktemp("heat") / "heat.zarr"
    generate(path, runs=4, val_runs=2, test_runs=2, steps=6, size=16, seed=0, progress=False)
    return str(path)


TRAINER = [
    "trainer.accelerator=cpu",
    "trainer.devices=1",
    "trainer.strategy=auto",
    "trainer.max_epochs=1",
    "trainer.limit_train_batches=2",
    "trainer.limit_val_batches=1",
    "trainer.max_time=null",
    "trainer.enable_progress_bar=false",
    "trainer.log_every_n_steps=1",
    "trainer.precision=32-true",
    "trainer.num_nodes=1",
    "trainer.deterministic=true",
]


def tiny_overrides(task: str, stores: dict[str, str], out: Path) -> list[str]:
    """Overrides that make any config tiny and point it at the test stores."""
    common = [f"output_dir={out}", "data.num_workers=0", *TRAINER]
    if task == "heat":
        return [*common, f"data.store={stores['heat']}", "data.batch_size=4"]
    data = [f"data.{k}=[{v[0]}, {v[1]}]" for k, v in PERIODS.items()]
    data += ["data.train_years=null", "data.valid_years=null", "data.test_years=null", "data.batch_size=4"]
    if task == "ens10":
        return [
            *common,
            *data,
            f"data.store={stores['ens']}",
            "data.variables=[geopotential_500, temperature_500]",
            "data.target_variables=[geopotential_500]",
            "model.widths=[4, 8, 16]",
        ]
    if task == "postprocess":  # the ENS-10-like store through the same path; static maps from the world store
        return [
            *common,
            *data,
            f"data.source={stores['ens']}",
            f"data.constants={stores['world']}",
            "data.variables=[geopotential_500, temperature_500]",
            "data.target_variables=[geopotential_500, temperature_500]",
            "data.leads_h=null",
            "model.widths=[4, 8, 16]",
            "trainer.max_steps=-1",
            "trainer.val_check_interval=1.0",
            "trainer.check_val_every_n_epoch=1",
        ]
    return [
        *common,
        *data,
        f"data.store={stores['world']}",
        "data.world=null",
        "data.sources=null",
        "data.variables=[geopotential_500, temperature_850, geopotential_250]",
        "data.lead_h=null",
        "data.lead_choices_h=[24, 48]",
        "model.width=8",
        "model.blocks=1",
    ]


@pytest.fixture(scope="module")
def stores(world_store: str, ens_store: str, heat_store: str) -> dict[str, str]:
    return {"world": world_store, "ens": ens_store, "heat": heat_store}


def tiny_config(path: Path, stores: dict[str, str], out: Path, extra: tuple[str, ...] = ()) -> dict:
    cfg = read_config(path)
    return apply_overrides(cfg, [*tiny_overrides(cfg["task"], stores, out), *extra])


# ---- every config ----------------------------------------------------------------------------------
@pytest.mark.parametrize("config", CONFIGS, ids=lambda p: f"{p.parent.name}/{p.stem}")
# one training_step called outside a Trainer, on purpose (its gradients only): self.log has nowhere to log
@pytest.mark.filterwarnings("ignore:You are trying to `self.log\\(\\)`:UserWarning")
def test_every_config_tiny_gets_gradient_everywhere(config: Path, stores: dict[str, str], tmp_path: Path) -> None:
    cfg = tiny_config(config, stores, tmp_path)
    data, module = build(cfg)
    batch = next(iter(data.train_dataloader()))
    module.train()
    loss = module.training_step(batch, 0)
    assert torch.isfinite(loss)
    loss.backward()
    trainable = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
    assert trainable
    no_grad = [n for n, p in trainable if p.grad is None or not bool(p.grad.abs().sum() > 0)]
    assert not no_grad, f"{config.name}: parameters without gradient: {no_grad}"
    assert all(torch.isfinite(p.grad).all() for _, p in trainable)


@pytest.mark.parametrize("name", ["weatherbench/world_smoe_all_prior", "ens10/smoe_unet_z500", "heat/smoe"])
def test_tiny_configs_train_with_lightning(name: str, stores: dict[str, str], tmp_path: Path) -> None:
    cfg = tiny_config(REPO / "configs" / f"{name}.yaml", stores, tmp_path)
    result = train(cfg)
    last = torch.load(result.last_checkpoint, weights_only=False)
    meta = check_checkpoint(last)
    assert meta["config"]["output_dir"] == str(tmp_path)
    assert (tmp_path / "config.yaml").is_file() and Path(result.best_checkpoint).is_file()
    assert "samples_per_s" in result.trainer.logged_metrics
    if cfg["task"] == "weatherbench":  # physical units in and out, statistics inside the checkpoint
        model = result.module.model
        ds = result.datamodule.dataset("valid").dataset
        x, y = ds[0]
        x_phys = x * model.input_std + model.input_mean
        with torch.no_grad():
            model.eval()
            pred = model(x_phys[None])[0]
            ref = ds.denormalize_target(model.net(x[None])[0])
        # float32: x·σ+μ then (·−μ)/σ loses up to |μ|/σ ≈ 20 units of roundoff per input, amplified through
        # the net's ~(9·C_in + blocks) accumulation chain; outputs rescaled by σ_t (~1e3 for geopotential)
        n_ops = 20 * (9 * x.shape[0] + 10)
        torch.testing.assert_close(pred, ref, **float_tol(torch.float32, n_ops, scale=float(ds.target_std.max())))
        assert meta["normalisation"]["target_mean"] == pytest.approx(ds.target_mean.tolist())
        assert meta["channel_names"] == ds.channel_names


def test_checkpoint_version_mismatch_is_a_clear_error(stores: dict[str, str], tmp_path: Path) -> None:
    cfg = tiny_config(REPO / "configs/heat/smoe.yaml", stores, tmp_path / "a")
    last = Path(train(cfg).last_checkpoint)
    ckpt = torch.load(last, weights_only=False)
    ckpt["smoeweather"]["format_version"] = 0
    bad = tmp_path / "old.ckpt"
    torch.save(ckpt, bad)
    with pytest.raises(CheckpointFormatError, match="format version 0"):
        train(
            tiny_config(REPO / "configs/heat/smoe.yaml", stores, tmp_path / "b", ("trainer.max_epochs=2",)),
            resume=bad,
        )
    del ckpt["smoeweather"]
    torch.save(ckpt, bad)
    with pytest.raises(CheckpointFormatError, match="no smoeweather metadata"):
        init_weights(build(cfg)[1].model, bad)


def _params(ckpt: str | Path) -> dict[str, torch.Tensor]:
    state = torch.load(ckpt, map_location="cpu", weights_only=False)["state_dict"]
    return {k: v for k, v in state.items() if v.is_floating_point()}


def _assert_same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], atol: float = 0.0) -> None:
    assert a.keys() == b.keys()
    for k in a:
        diff = (a[k] - b[k]).abs()
        assert torch.allclose(a[k], b[k], atol=atol, rtol=0 if atol == 0 else 1e-4), (
            f"{k}: {int((diff > atol).sum())} of {diff.numel()} differ, max {float(diff.max()):.3g}")


def test_resume_equals_uninterrupted(stores: dict[str, str], tmp_path: Path) -> None:
    name = REPO / "configs/weatherbench/world_smoe_all_prior.yaml"
    extra = ("trainer.limit_train_batches=3", "model.dropout=0.1")
    full = train(tiny_config(name, stores, tmp_path / "full", (*extra, "trainer.max_epochs=2")))
    first = train(tiny_config(name, stores, tmp_path / "part", (*extra, "trainer.max_epochs=1")))
    resumed = train(
        tiny_config(name, stores, tmp_path / "part", (*extra, "trainer.max_epochs=2")),
        resume=first.last_checkpoint,
    )
    assert resumed.trainer.current_epoch == 2
    _assert_same(_params(full.last_checkpoint), _params(resumed.last_checkpoint))


def test_init_from_pretraining_fine_tunes_on_other_data(
    stores: dict[str, str], era5_like_store: str, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    name = REPO / "configs/weatherbench/world_smoe_all_prior.yaml"
    pre = train(tiny_config(name, stores, tmp_path / "cmip6"))
    pretrained = torch.load(pre.last_checkpoint, weights_only=False)["state_dict"]
    # fine-tune on other data with one more input field: the stem's shape differs and is reported
    extra = (
        f"data.store={era5_like_store}",
        "data.variables=[geopotential_500, temperature_850, geopotential_250, temperature_500]",
    )
    cfg = tiny_config(name, stores, tmp_path / "era5", extra)
    _, module = build(cfg)
    report = init_weights(module.model, pre.last_checkpoint)
    assert any(s.startswith("net.stem.layer.weight") for s in report.shape_mismatch)
    assert set(report.kept_normalisation) == {"input_mean", "input_std", "target_mean", "target_std"}
    state = module.model.state_dict()
    for k in report.loaded:
        torch.testing.assert_close(state[k], pretrained["model." + k], msg=k)
    assert not torch.equal(state["target_mean"], pretrained["model.target_mean"])  # new data's statistics
    tuned = train(cfg, init_from=pre.last_checkpoint)
    assert "initialised from" in capsys.readouterr().out
    assert check_checkpoint(torch.load(tuned.last_checkpoint, weights_only=False))["init_from"]


# ---- DDP -------------------------------------------------------------------------------------------
def _smoe_train(config: Path, overrides: list[str], resume: Path | None = None) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    proc = subprocess.run(
        [*SMOE, "train", "--config", str(config), *(["--resume", str(resume)] if resume else []), *overrides],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]


def _initial_state(cfg: dict) -> dict[str, torch.Tensor]:
    """The module's floating-point state before training (train() seeds, then builds: same init)."""
    import lightning as L

    L.seed_everything(int(cfg.get("seed", 0)), verbose=False)
    return {k: v.detach().clone() for k, v in build(cfg)[1].state_dict().items() if v.is_floating_point()}


def _ddp_base(config: Path, stores: dict[str, str], tmp_path: Path) -> list[str]:
    task = read_config(config)["task"]
    base = [
        *tiny_overrides(task, stores, tmp_path),
        "trainer.limit_train_batches=3",
        "trainer.max_epochs=2",
        "training.freeze_batchnorm=true",
        # SGD: the update is lr × the reduced gradient, so a wrong DDP gradient scale shows (Adam hides it)
        "training.optimizer=sgd",
        # lr 0.1 suits the tiny heat model; the weatherbench SMoE ResNet diverges to NaN with plain SGD at 0.1
        "training.lr=0.1" if task == "heat" else "training.lr=0.001",
        "model.dropout=0.0" if task != "heat" else "seed=0",
    ]
    return [
        o for o in base if not o.startswith(("output_dir", "data.batch_size", "trainer.devices", "trainer.strategy"))
    ]


DDP2 = ["data.batch_size=2", "trainer.devices=2", "trainer.strategy=ddp"]


@pytest.mark.parametrize(
    "name", ["heat/smoe", pytest.param("weatherbench/world_smoe_all_prior", marks=pytest.mark.slow)]
)
def test_ddp_two_processes_equal_one_process_with_combined_batch(
    name: str, stores: dict[str, str], tmp_path: Path
) -> None:
    config = REPO / "configs" / f"{name}.yaml"
    base = _ddp_base(config, stores, tmp_path)
    _smoe_train(config, [*base, f"output_dir={tmp_path / 'one'}", "data.batch_size=4", "trainer.devices=1"])
    _smoe_train(config, [*base, f"output_dir={tmp_path / 'ddp'}", *DDP2])
    init = _initial_state(apply_overrides(read_config(config), [*base, "data.batch_size=4", "trainer.devices=1"]))
    one, ddp = (_params(tmp_path / d / "checkpoints" / "last.ckpt") for d in ("one", "ddp"))
    assert one.keys() == ddp.keys() and set(init) <= set(one)
    for k in init:
        # compare the UPDATES (6 SGD steps), not the parameters: a factor-2 gradient error is then a 100 %
        # difference. Tolerance: float32 reductions over 4 samples × H·W points summed in a different order
        # (two halves, then all-reduce): ~1e3 terms × 1.2e-7 ≈ 1e-4 relative, ×10 for 6 steps of feedback.
        delta_one, delta_ddp = one[k] - init[k], ddp[k] - init[k]
        scale = float(delta_one.abs().max())
        torch.testing.assert_close(delta_ddp, delta_one, rtol=1e-3, atol=1e-3 * scale + 1e-7, msg=k)
    assert any(float((one[k] - init[k]).abs().max()) > 1e-3 for k in init), "training moved nothing"
    assert not (tmp_path / "ddp" / "logs" / "version_1").exists()  # one logger directory: rank 0 only


def test_ddp_resume_inside_an_epoch_equals_uninterrupted(stores: dict[str, str], tmp_path: Path) -> None:
    base = _ddp_base(HEAT, stores, tmp_path)
    _smoe_train(HEAT, [*base, f"output_dir={tmp_path / 'full'}", *DDP2])
    _smoe_train(HEAT, [*base, f"output_dir={tmp_path / 'part'}", *DDP2, "trainer.max_steps=2"])
    part = tmp_path / "part" / "checkpoints" / "last.ckpt"
    assert _epoch_step(part) == (0, 2)
    _smoe_train(HEAT, [*base, f"output_dir={tmp_path / 'part'}", *DDP2], resume=part)
    full, resumed = (_params(tmp_path / d / "checkpoints" / "last.ckpt") for d in ("full", "part"))
    assert _epoch_step(tmp_path / "part" / "checkpoints" / "last.ckpt") == (1, 6)
    _assert_same(full, resumed)


def test_unknown_task_is_an_error() -> None:
    with pytest.raises(ValueError, match="task must be one of"):
        build({"task": "nowcasting"})


# ---- resume: last.ckpt after every epoch, mid-epoch, DDP -------------------------------------------------------
HEAT = REPO / "configs/heat/smoe.yaml"
# lr 0.3 on the tiny heat SMoE makes epoch 2 worse than epoch 1 (asserted below): a non-improving epoch
NON_IMPROVING = ("training.lr=0.3", "trainer.limit_train_batches=3")


def _epoch_step(ckpt: str | Path) -> tuple[int, int]:
    state = torch.load(ckpt, map_location="cpu", weights_only=False)
    return int(state["epoch"]), int(state["global_step"])


def test_last_checkpoint_is_written_after_a_non_improving_epoch(stores: dict[str, str], tmp_path: Path) -> None:
    """The heat SMoE uses expert_init="reference". With Lightning's save_last, the uninterrupted run's
    last.ckpt stayed at the best epoch while the resumed run's was written at fit end: the two files held
    states one epoch apart (the earlier flaky resume test: every weight off by ≤ 3 Adam steps × lr 1e-3 =
    3e-3). Reproduced with the old callback: full last = epoch 1, resumed last = epoch 3, max |Δ| 0.88."""
    full = train(tiny_config(HEAT, stores, tmp_path / "full", (*NON_IMPROVING, "trainer.max_epochs=4")))
    part = train(tiny_config(HEAT, stores, tmp_path / "part", (*NON_IMPROVING, "trainer.max_epochs=3")))
    assert Path(part.best_checkpoint).name == "best-epoch=001.ckpt", "epoch 2 must not improve on epoch 1"
    assert _epoch_step(part.last_checkpoint) == (2, 9)  # the state after epoch 2, not the best (epoch 1)
    resumed = train(tiny_config(HEAT, stores, tmp_path / "part", (*NON_IMPROVING, "trainer.max_epochs=4")),
                    resume=part.last_checkpoint)
    assert resumed.trainer.global_step == full.trainer.global_step == 12
    _assert_same(_params(full.last_checkpoint), _params(resumed.last_checkpoint))


# expected: the part run stops at step 2, before any validation, so its checkpoints see no val_loss
@pytest.mark.filterwarnings("ignore:.*could not find the monitored key:UserWarning")
def test_resume_inside_an_epoch_equals_uninterrupted(stores: dict[str, str], tmp_path: Path) -> None:
    extra = ("trainer.limit_train_batches=4", "trainer.max_epochs=2")
    full = train(tiny_config(HEAT, stores, tmp_path / "full", extra))
    part = train(tiny_config(HEAT, stores, tmp_path / "part", (*extra, "trainer.max_steps=2")))  # no crash
    assert _epoch_step(part.last_checkpoint) == (0, 2)
    resumed = train(tiny_config(HEAT, stores, tmp_path / "part", extra), resume=part.last_checkpoint)
    assert resumed.trainer.global_step == full.trainer.global_step == 8
    _assert_same(_params(full.last_checkpoint), _params(resumed.last_checkpoint))


# ---- config schema, batch size, max_steps -------------------------------------------------------------------
@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("training.lrr=1", "unknown config key 'training.lrr' (did you mean 'lr'?); valid keys under 'training': aux_"),
        ("trainr.max_epochs=5", "unknown config key 'trainr' (did you mean 'trainer'?); valid keys at the top level:"),
        ("data.batchsize=999", "unknown config key 'data.batchsize' (did you mean 'batch_size'?); valid keys under"),
        ("sed=7", "unknown config key 'sed'"),
        ("trainer.max_epochz=5", "unknown config key 'trainer.max_epochz' (did you mean 'max_epochs'?); valid keys"),
        ("training.lr=fast", "config key 'training.lr' must be float, got str 'fast'"),
        ("data.batch_size=true", "config key 'data.batch_size' must be int, got bool True"),
    ],
)
def test_config_typos_and_wrong_types_exit_2_naming_the_key(
    override: str, message: str, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    from smoeweather.cli import main

    code = main(["train", "--config", str(HEAT), f"output_dir={tmp_path}", "data.store=nowhere.zarr", override])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("smoe train: error: ") and message in err, err
    assert "Traceback" not in err and not (tmp_path / "checkpoints").exists()


def test_every_config_fits_its_schema_and_the_schema_is_extensible() -> None:
    from smoeweather.config import Block, ConfigError
    from smoeweather.training.schema import TASK_SCHEMAS, register_task_schema, validate_train_config

    for path in CONFIGS:
        validate_train_config(read_config(path))
    cfg = {"task": "toy", "data": {"anything": 1}, "training": {"lr": 1}}
    validate_train_config(cfg)  # no schema registered: top level, training and trainer checked only
    try:
        register_task_schema("toy", lambda: Block({"task": (str,), "data": Block({"size": (int,)})}))
        with pytest.raises(ConfigError, match="valid keys under 'data': size"):
            validate_train_config(cfg)
    finally:
        TASK_SCHEMAS.pop("toy")


def test_batch_larger_than_the_training_set_is_a_clear_error(stores: dict[str, str], tmp_path: Path) -> None:
    # the tiny heat store holds 4 runs × 6 steps = 24 training pairs
    cfg = tiny_config(HEAT, stores, tmp_path, ("data.batch_size=25",))
    with pytest.raises(ValueError, match=r"data.batch_size=25 is larger than the 24 training samples"):
        train(cfg)
    assert train(tiny_config(HEAT, stores, tmp_path, ("data.batch_size=24",))).trainer.global_step == 1


def test_tasks_register_themselves() -> None:
    from smoeweather.training.registry import register_task, registered_tasks
    from smoeweather.training.tasks import build

    assert {"weatherbench", "postprocess", "heat", "vision"} <= set(registered_tasks())
    assert registered_tasks()["weatherbench"].module_around is not None
    assert registered_tasks()["heat"].module_around is None  # heat networks are rebuilt through their builder
    from smoeweather.training import registry

    register_task("toy_task", lambda cfg: ("data", cfg["marker"]))
    try:
        assert build({"task": "toy_task", "marker": 7}) == ("data", 7)
    finally:
        registry._TASKS.pop("toy_task")
    with pytest.raises(ValueError, match=r"config task must be one of \(.*'vision'.*\), got 'nothing'"):
        build({"task": "nothing"})


def test_failed_train_leaves_no_run_folder(stores: dict[str, str], tmp_path: Path) -> None:
    """A run that fails before its first checkpoint removes the folder it created (config.yaml, logs/); an
    existing folder is left as it was."""
    import lightning as L

    class Boom(L.Callback):
        def on_train_batch_start(self, *args: object, **kwargs: object) -> None:
            raise RuntimeError("failed mid-run")

    name = REPO / "configs/weatherbench/world_dense.yaml"
    out = tmp_path / "run"
    with pytest.raises(RuntimeError, match="failed mid-run"):
        train(tiny_config(name, stores, out), extra_callbacks=[Boom()])
    assert not out.exists()
    out.mkdir()
    (out / "mine.txt").write_text("the user's file")
    with pytest.raises(RuntimeError, match="failed mid-run"):
        train(tiny_config(name, stores, out), extra_callbacks=[Boom()])
    assert (out / "mine.txt").exists()


def test_cli_train_refuses_a_trained_run_without_overwrite(stores: dict[str, str], tmp_path: Path,
                                                           capsys: pytest.CaptureFixture) -> None:
    """`smoe train` into a folder holding a trained run: refused in one line (resume or --overwrite named);
    --overwrite trains anew and no checkpoint of the old run survives."""
    from smoeweather.cli import main

    name = REPO / "configs/weatherbench/world_dense.yaml"
    cfg = read_config(name)
    argv = ["train", "--config", str(name), *tiny_overrides(cfg["task"], stores, tmp_path / "run")]
    assert main(argv) == 0
    run_dir = next(p.parent.parent for p in (tmp_path / "run").rglob("last.ckpt"))
    stale = run_dir / "checkpoints" / "stale.ckpt"
    stale.write_bytes(b"an earlier run's checkpoint")
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "holds a trained run already" in err and "--overwrite" in err and "--resume" in err
    assert main([*argv, "--overwrite"]) == 0
    assert not stale.exists() and (run_dir / "checkpoints" / "last.ckpt").exists()
