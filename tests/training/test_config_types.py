"""Config value types are checked for every section of every task: a wrong type names the
key and the expected type before anything is built (``model.width=abc`` used to end in a torch traceback).

``model`` values are checked against the type hints of the constructors they go to (chosen by
``model.name``), so constructor arguments added later are covered without a schema change."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import pytest

import smoeweather.training.tasks  # noqa: F401 - registers every task's schema (vision)
from smoeweather.cli import main
from smoeweather.config import Arguments, ConfigError, check_arguments, read_config
from smoeweather.training.schema import validate_train_config

REPO = Path(__file__).resolve().parents[2]
TRAIN_CONFIGS = sorted(
    p for p in (REPO / "configs").rglob("*.yaml")
    if not p.name.startswith("_") and "task" in read_config(p)
)


@pytest.mark.parametrize(
    ("config", "override", "message"),
    [
        ("weatherbench/gcm_dense.yaml", "model.width=abc", "'model.width' must be int, got str 'abc'"),
        ("weatherbench/world_smoe_all_prior.yaml", "model.smoe.prior_strength=strong",
         "'model.smoe.prior_strength' must be float, got str"),
        ("weatherbench/world_smoe_all_prior.yaml", "model.smoe.gate_init=random",
         "'model.smoe.gate_init' must be one of 'uniform', 'coherent'"),
        ("weatherbench/world_dense.yaml", "model.grid=[32, x]", "'model.grid' must be a list of 2 int"),
        ("weatherbench/world_dense.yaml", "model.dropout=[0.1]", "'model.dropout' must be float, got list"),
        ("weatherbench/world_dense.yaml", "trainer.max_epochs=ten", "'trainer.max_epochs' must be int or null"),
        ("weatherbench/world_dense.yaml", "data.world.seed=abc", "'data.world.seed' must be int"),
        ("weatherbench/world_dense.yaml", "data.batch_size=big", "'data.batch_size' must be int"),
        ("weatherbench/world_dense.yaml", "training.lr=fast", "'training.lr' must be float"),
        ("ens10/unet_z500.yaml", "model.levels=three", "'model.levels' must be int, got str 'three'"),
        ("ens10/smoe_unet_z500.yaml", "model.damping=strong", "'model.damping' must be float or null"),
        ("ens10/smoe_unet_z500.yaml", "model.smoe_kwargs={weighted: maybe}",
         "'model.smoe_kwargs.weighted' must be bool"),
        ("heat/smoe.yaml", "model.quantile=high", "'model.quantile' must be float, got str 'high'"),
        ("heat/conv.yaml", "model.hidden=1.5", "'model.hidden' must be int, got float 1.5"),
        ("heat/smoe.yaml", "data.generate.runs=many", "'data.generate.runs' must be int"),
        ("vision/vmoe_k1.yaml", "model.k=one", "'model.k' must be int, got str 'one'"),
        ("vision/vit.yaml", "model.placement=every_3", "'model.placement' must be one of 'all', 'every_2'"),
        ("vision/resblock_moe_soft.yaml", "model.moe.weight=heavy", "'model.moe.weight' must be float"),
        ("vision/smoe_cnn.yaml", "model.channels=[1]", "'model.channels' must be int, got list"),
    ],
)
def test_wrong_type_names_key_and_type(config: str, override: str, message: str) -> None:
    cfg = read_config(REPO / "configs" / config, [override])
    with pytest.raises(ConfigError, match="config key " + message.replace("[", r"\[").replace("(", r"\(")):
        validate_train_config(cfg)


def test_smoe_train_cli_names_the_key_not_a_traceback(tmp_path: Path, capsys) -> None:
    """The issue's command: no torch traceback, exit 2 with the key and its type on stderr."""
    config = REPO / "configs" / "weatherbench" / "gcm_dense.yaml"
    assert main(["train", "--config", str(config), f"output_dir={tmp_path}", "model.width=abc"]) == 2
    err = capsys.readouterr().err
    assert "config key 'model.width' must be int, got str 'abc'" in err and "Traceback" not in err
    assert not any(tmp_path.iterdir())  # refused before anything was built or written


@pytest.mark.parametrize("config", TRAIN_CONFIGS, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_every_shipped_config_passes_the_type_checks(config: Path) -> None:
    validate_train_config(read_config(config))


def test_yaml_spellings_fit_python_hints() -> None:
    """YAML has no tuples and writes 1 for 1.0: a list fits tuple/Sequence hints, an int fits float,
    null fits Optional, and a bool is not a number."""

    def model(width: int = 8, lr: float = 1e-3, grid: tuple[int, int] = (32, 64), widths: tuple[int, ...] = (4,),
              damping: float | None = 0.1, kind: Literal["a", "b"] = "a", extra: dict | None = None,
              untyped=0.5, **kwargs) -> None:
        return None

    check_arguments(model, {"width": 3, "lr": 1, "grid": [16, 32], "widths": [4, 8, 16], "damping": None,
                            "kind": "b", "extra": {"x": 1}, "untyped": 2, "unknown": "left to the caller"},
                    "model")
    for key, value, expected in [("lr", True, "float"), ("width", 2.5, "int"), ("grid", [1, 2, 3], "a list of 2"),
                                 ("widths", "4", "a list of int"), ("kind", "c", "one of 'a', 'b'"),
                                 ("untyped", "x", "a number"), ("extra", [1], "mapping or null")]:
        with pytest.raises(ConfigError, match=f"config key 'model.{key}' must be {expected}"):
            check_arguments(model, {key: value}, "model")


def test_new_constructor_arguments_are_checked_without_a_schema_change(monkeypatch) -> None:
    """A model argument added later (e.g. for the post-processing U-Net) is type-checked from its hint."""
    from smoeweather.models import weather
    from smoeweather.training import schema

    class NewUNet:
        def __init__(self, in_channels: int, new_option: float = 0.5, new_mode: Literal["x", "y"] = "x") -> None:
            pass

    monkeypatch.setitem(schema.MODEL_ARGUMENTS, "weatherbench",
                        Arguments(lambda v: [(NewUNet, v, "")] + weather.model_arguments(v)))
    cfg = read_config(REPO / "configs" / "weatherbench" / "world_dense.yaml", ["model.new_option=0.25"])
    validate_train_config(cfg)
    for override, message in [("model.new_option=lots", "'model.new_option' must be float"),
                              ("model.new_mode=z", "'model.new_mode' must be one of 'x', 'y'")]:
        cfg = read_config(REPO / "configs" / "weatherbench" / "world_dense.yaml", [override])
        with pytest.raises(ConfigError, match=message):
            validate_train_config(cfg)
