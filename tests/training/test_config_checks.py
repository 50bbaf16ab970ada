"""configuration: a config is checked in full before anything runs; nested typos get did-you-mean;
out-of-range values, a mismatched ``--resume`` and bad ``smoe study`` overrides give one line naming the key,
what was expected and how to fix it."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import pytest
import yaml

from smoeweather.cli import main
from smoeweather.config import ConfigError, read_config
from smoeweather.training.settings import TrainConfig, TrainingSettings, load_config

REPO = Path(__file__).resolve().parents[2]
WORLD = "weatherbench/world_dense"


def _train(tmp_path: Path, capsys: pytest.CaptureFixture, *overrides: str, config: str = WORLD) -> str:
    store = tmp_path / "new_store.zarr"
    code = main(["train", "--config", config, f"output_dir={tmp_path / 'run'}", f"data.store={store}", *overrides])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert not store.exists() and not (tmp_path / "run").exists()  # refused before any store or run was made
    return err


@pytest.mark.parametrize(("override", "message"), [
    ("model.widht=8", "unknown config key 'model.widht' (did you mean 'width'?); valid keys under 'model':"),
    ("model.smoe={placment: all}", "unknown config key 'model.smoe.placment' (did you mean 'placement'?)"),
    ("model.smoe={placement: all, layer_kwargs: {wieghted: true}}",
     "unknown config key 'model.smoe.layer_kwargs.wieghted' (did you mean 'weighted'?)"),
    ("model.name=resnett", "config key 'model.name' must be one of resnet, e3, deep_ensemble, gaussian, "
                           "mc_dropout, unet, got 'resnett' (did you mean 'resnet'?)"),
    ("training.lrr=0.1", "unknown config key 'training.lrr' (did you mean 'lr'?)"),
    ("model.width=-3", "config key 'model.width' must be >= 1, got -3; set e.g. model.width=16"),
    ("training.lr=-1", "config key 'training.lr' must be > 0, got -1; set e.g. training.lr=0.001"),
    ("data.batch_size=0", "config key 'data.batch_size' must be >= 1, got 0; set e.g. data.batch_size=32"),
    ("data.num_workers=-1", "config key 'data.num_workers' must be >= 0, got -1; set e.g. data.num_workers=0"),
    ("training.optimizer=adamw", "config key 'training.optimizer' must be one of 'adam', 'sgd', got str 'adamw'"),
    ("training.crps_alpha=2", "config key 'training.crps_alpha' must be >= 0 and <= 1, got 2"),
    ("model.dropout=1.5", "config key 'model.dropout' must be >= 0 and < 1, got 1.5; set e.g. model.dropout=0.1"),
    ("training.loss=crps", "training.loss 'crps' needs an ensemble model (model.name e3, deep_ensemble or gaussian)"),
    ("model.smoe={placement: all, upcycle: true}", "smoe.upcycle needs gate_init='coherent' and gate_prior='land_sea'"),
])
def test_smoe_train_refuses_before_anything_runs(override: str, message: str, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture) -> None:
    """`model.widht=8` used to build and write a data store (246 MB, 117 s on the full world) first."""
    assert message in _train(tmp_path, capsys, override)


def test_e3_experts_that_do_not_split_are_refused_before_the_store(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture) -> None:
    """The network's own argument checks run on the meta device when the config is validated."""
    err = _train(tmp_path, capsys, "model.members=3", config="weatherbench/gcm_e3")
    assert "model e3: smoe.experts_factor × width = 128 experts must split into members=3 groups" in err


def test_unet_gate_prior_typo_is_named(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    err = _train(tmp_path, capsys, "model.gate_prio=land_sea", config="postprocess/gcm_ens_smoe_unet_prior")
    assert "unknown config key 'model.gate_prio' (did you mean 'gate_prior'?)" in err


@pytest.mark.parametrize(("overrides", "message"), [
    (["model.name=conv", "model.hiden=4"], "unknown config key 'model.hiden' (did you mean 'hidden'?)"),
    (["model.num_expert=3"], "unknown config key 'model.num_expert' (did you mean 'num_experts'?)"),
    (["model.name=convv"], "got 'convv' (did you mean 'conv'?)"),
])
def test_heat_model_keys_are_checked_before_the_store_is_generated(overrides: list[str], message: str,
                                                                   tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture) -> None:
    assert message in _train(tmp_path, capsys, *overrides, config="heat/smoe")


def test_vision_refuses_training_keys_it_would_ignore() -> None:
    """The vision task trains with Adam and ReduceLROnPlateau: training.optimizer used to be ignored silently."""
    from smoeweather.training.schema import validate_train_config

    validate_train_config(read_config("vision/vit", ["training.lr=0.01"]))
    with pytest.raises(ConfigError, match="unknown config key 'training.optimizer'; valid keys under 'training': "
                                          "aux_weight, early_stopping_patience, lr,"):
        validate_train_config(read_config("vision/vit", ["training.optimizer=sgd"]))


def test_the_typed_config_has_one_default_per_key() -> None:
    """load_config gives typed blocks; defaults come from TrainingSettings, not the call sites."""
    import inspect

    from smoeweather.training.base import SMoETrainingModule

    cfg = load_config(WORLD, ["training.lr=1", "data.batch_size=4"])
    assert isinstance(cfg, TrainConfig) and cfg.task == "weatherbench"
    assert cfg.training.lr == 1.0 and isinstance(cfg.training.lr, float)  # YAML 1 read as the float it means
    assert cfg.loader.batch_size == 4 and cfg.model.name == "resnet" and cfg.model.params["width"] == 16
    assert cfg.to_dict() == read_config(WORLD, ["training.lr=1", "data.batch_size=4"])  # what config.yaml records
    assert cfg.data["batch_size"] == 4  # data: the task's own keys, a plain dict
    assert not isinstance(cfg, Mapping) and not hasattr(cfg, "__getitem__")  # read by attribute only
    defaults = TrainingSettings()
    params = inspect.signature(SMoETrainingModule.__init__).parameters
    for key, value in defaults.module_kwargs().items():
        assert params[key].default == value, key
    assert load_config(WORLD, ["training={}"]).training == defaults


@pytest.mark.parametrize(("model", "prior"), [
    ({"name": "resnet", "smoe": {"placement": "all", "gate_prior": "land_sea"}}, True),
    ({"name": "resnet", "smoe": {"gate_prior": "land_sea"}}, True),  # placement defaults to all
    ({"name": "resnet", "smoe": {"placement": "none", "gate_prior": "land_sea"}}, False),
    ({"name": "resnet", "smoe": "all"}, False),
    ({"name": "e3", "smoe": {"placement": "last", "gate_prior": "land_sea", "experts_factor": 8}}, True),
    # the case where models/ensemble.py said False and models/loader.py True: the SMoE U-Net with its prior
    ({"name": "unet", "smoe": True, "gate_prior": "land_sea"}, True),
    ({"name": "unet", "smoe": False, "gate_prior": "land_sea"}, False),
])
def test_one_uses_land_sea_prior_agrees_with_the_builder(model: dict, prior: bool) -> None:
    """The one answer is the builder's: a network that needs the map refuses to be built without one, and one
    that does not refuses a map (ResNet family) or ignores it (U-Net)."""
    import torch

    from smoeweather.models import ensemble, loader
    from smoeweather.models.weather import build_weather_model

    assert loader.uses_land_sea_prior is ensemble.uses_land_sea_prior
    assert ensemble.uses_land_sea_prior(model) is prior
    small = {"in_channels": 3, "out_channels": 2, "grid": [8, 16]}
    small |= {"levels": 2, "widths": [4, 8]} if model["name"] == "unet" else {"width": 8, "blocks": 1}
    if model["name"] == "e3":
        small["members"] = 2
    cfg = {**model, **small}
    mask = torch.zeros(8, 16, dtype=torch.long)
    mask[:, 8:] = 1
    if prior:
        with pytest.raises(ValueError, match="land"):
            build_weather_model(cfg, land_sea_prior=None)
    build_weather_model(cfg, land_sea_prior=mask if prior else None)


def test_prior_config_where_the_two_functions_differed() -> None:
    model = read_config("postprocess/gcm_ens_smoe_unet_prior")["model"]
    from smoeweather.models.ensemble import uses_land_sea_prior

    assert model["name"] == "unet" and model["gate_prior"] == "land_sea" and uses_land_sea_prior(model)


# ---- --resume with another config ------------------------------------------------------------------
HEAT_TINY = ["trainer.accelerator=cpu", "trainer.devices=1", "trainer.max_epochs=1", "trainer.max_time=null",
             "trainer.limit_train_batches=1", "trainer.limit_val_batches=1", "trainer.enable_progress_bar=false",
             "trainer.log_every_n_steps=1", "data.batch_size=4", "model.name=conv", "model.layers=2"]


@pytest.fixture(scope="module")
def heat_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(heat store, last.ckpt) of a one-batch conv run with hidden width 4."""
    from pipelines.heat_diffusion import generate
    from smoeweather.training.run import train

    root = tmp_path_factory.mktemp("resume")
    store = root / "heat.zarr"
    generate(store, runs=4, val_runs=2, test_runs=2, steps=6, size=16, seed=0, progress=False)
    cfg = read_config("heat/smoe", [*HEAT_TINY, f"data.store={store}", f"output_dir={root / 'run'}", "model.hidden=4"])
    return store, Path(train(cfg).last_checkpoint)


@pytest.mark.parametrize(("override", "message"), [
    ("model.hidden=6", "was trained with model.hidden=4, the config says 6: resume with the checkpoint's config "
                       "(set model.hidden=4, or use its run's config.yaml), or train afresh without --resume"),
    ("model.kernel_size=5", "does not fit the config: weight 'model.0.weight' has shape (4, 1, 3, 3) in the "
                            "checkpoint, (4, 1, 5, 5) in the model built from the config"),
])
def test_resume_with_another_config_is_one_line(override: str, message: str, heat_run: tuple[Path, Path],
                                                tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """Used to end in Lightning's size-mismatch traceback."""
    store, ckpt = heat_run
    code = main(["train", "--config", "heat/smoe", "--resume", str(ckpt), *HEAT_TINY, f"data.store={store}",
                 f"output_dir={tmp_path / 'run'}", "model.hidden=4", override])
    err = capsys.readouterr().err
    assert code == 2 and message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1, err


# ---- smoe study overrides ----------------------------------------------------------------------------
def _study(tmp_path: Path) -> Path:
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump({
        "name": "s", "seeds": [0, 1], "steps": 4, "baseline": "dense", "leads_h": [48],
        "targets": ["geopotential_500"], "variants": {"dense": {"config": str(REPO / "configs" / f"{WORLD}.yaml")}},
    }))
    return path


@pytest.mark.parametrize(("override", "message"), [
    ("stesp=10", "unknown config key 'stesp' (did you mean 'steps'?); valid keys at the top level:"),
    ("steps=abc", "config key 'steps' must be int, got str 'abc'"),
    ("steps=0", "config key 'steps' must be >= 1, got 0; set e.g. steps=1000"),
    ("threads=0", "config key 'threads' must be >= 1, got 0"),
    ("variants.dense.overide=[]", "unknown config key 'variants.dense.overide' (did you mean 'overrides'?)"),
    ("overrides=[model.widht=8]", "variant 'dense': unknown config key 'model.widht' (did you mean 'width'?)"),
])
def test_study_overrides_are_checked(override: str, message: str, tmp_path: Path,
                                     capsys: pytest.CaptureFixture) -> None:
    """An unknown study key used to be ignored (a typo in steps= ran the full budget)."""
    out = tmp_path / "out"
    assert main(["study", "--config", str(_study(tmp_path)), "--out", str(out), override]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and not out.exists(), err


def test_settings_blocks_refuse_by_name() -> None:
    from smoeweather.config import parse_settings

    with pytest.raises(ConfigError, match=r"unknown config key 'training.lr_schedul' \(did you mean 'lr_schedule'\?\)"):
        parse_settings(TrainingSettings, {"lr_schedul": "cosine"}, "training")
    with pytest.raises(ConfigError, match="'training.warmup_steps' must be int, got float 1.5"):
        parse_settings(TrainingSettings, {"warmup_steps": 1.5}, "training")
    assert parse_settings(TrainingSettings, None, "training") == TrainingSettings()


def test_load_config_is_typed_and_read_config_is_the_mapping() -> None:
    """``smoeweather.training.load_config`` returns the validated TrainConfig; ``smoeweather.config.read_config`` the
    YAML mapping it was read from; ``smoeweather.config`` has no second ``load_config``."""
    import smoeweather.config as config_module
    from smoeweather.config import parse_settings
    from smoeweather.studies.config import StudyConfig
    from smoeweather.training import load_config as package_load_config

    assert package_load_config is load_config
    cfg = load_config(WORLD, ["seed=3"])
    assert isinstance(cfg, TrainConfig) and cfg.seed == 3 and cfg.to_dict() == read_config(WORLD, ["seed=3"])
    assert not hasattr(config_module, "load_config")
    with pytest.raises(ConfigError, match=r"config key 'model.widht' \(did you mean 'width'\?\)"):
        load_config(WORLD, ["model.widht=8"])
    # settings at the top level of a file (a study): keys named without a prefix
    with pytest.raises(ConfigError, match=r"^unknown config key 'stesp' \(did you mean 'steps'\?\); valid keys at the "
                                          r"top level"):
        parse_settings(StudyConfig, {"stesp": 1}, "")
    with pytest.raises(ConfigError, match="^the config lacks the key"):
        parse_settings(StudyConfig, {}, "")
