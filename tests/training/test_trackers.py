"""Experiment trackers (``trainer.logger``): one tiny SMoE run logs to every installed tracker at once, and what
each logged is read back (TensorBoard's EventAccumulator, MLflow's client on a file store, W&B's offline run
files): the hyper-parameters, the loss, the learning rate, a routing diagnostic, the checkpoint. Offline; the
tracker packages are never imported by a CSV run; a config naming an unknown, misspelt or absent tracker is
refused in one line before anything runs."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import yaml

from smoeweather.config import ConfigError, read_config
from smoeweather.training.run import train
from smoeweather.training.settings import TrainConfig
from smoeweather.training.trackers import TRACKERS, installed

REPO = Path(__file__).resolve().parents[2]
LAYER = "blocks.0.block1.layer"  # an SMoE layer of the tiny world_smoe_all_prior network
PACKAGES = {name: tracker.modules for name, tracker in TRACKERS.items() if tracker.modules}
HAVE = {name: any(installed(m) for m in modules) for name, modules in PACKAGES.items()}


def needs(name: str) -> pytest.MarkDecorator:
    """Skip (with the extra to install) unless the tracker ``name``'s package is installed."""
    return pytest.mark.skipif(not HAVE[name], reason=f'needs {PACKAGES[name][0]}: pip install "smoeweather[{name}]"')


def tiny(world_store: str, out: Path, logger: Any, steps: int = 2) -> dict[str, Any]:
    """The SMoE (land-sea prior) world config shrunk to ``steps`` training batches of one epoch and one
    validation batch, logging to ``logger`` (a ``trainer.logger`` value)."""
    cfg = read_config(REPO / "configs/weatherbench/world_smoe_all_prior.yaml", [
        f"data.store={world_store}", "data.world=null", "data.num_workers=0", "data.batch_size=4",
        "data.train_years=null", "data.valid_years=null", "data.test_years=null",
        "data.train_period=[2000-01-01, 2000-02-29T18:00]", "data.valid_period=[2000-03-01, 2000-03-20]",
        "data.test_period=[2000-03-21, 2000-04-09]", "data.variables=[geopotential_500, temperature_850]",
        "data.lead_choices_h=[24]", "model.width=8", "model.blocks=1", "trainer.max_epochs=1",
        f"trainer.limit_train_batches={steps}", "trainer.limit_val_batches=1", "trainer.max_time=null",
        "trainer.log_every_n_steps=1", "trainer.enable_progress_bar=false", f"output_dir={out}"])
    cfg["trainer"]["logger"] = logger
    return cfg


@pytest.fixture(scope="module")
def tracked(world_store: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One 2-step run logging to csv and every installed tracker: MLflow to a file store, W&B offline."""
    out = tmp_path_factory.mktemp("tracked")
    logger: list[Any] = ["csv"]
    if HAVE["tensorboard"]:
        logger.append("tensorboard")
    if HAVE["mlflow"]:
        logger.append({"name": "mlflow", "tracking_uri": (out / "mlruns").as_uri(), "experiment_name": "tiny",
                       "log_checkpoints": True, "tags": {"purpose": "test"}})
    if HAVE["wandb"]:
        logger.append({"name": "wandb", "offline": True, "project": "tiny", "save_dir": str(out / "wb")})
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(out)  # nothing a tracker writes by default lands in the checkout
        mp.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow >= 3.7 refuses a file store without it
        mp.setenv("WANDB_MODE", "offline")
        mp.setenv("WANDB_SILENT", "true")
        result = train(tiny(world_store, out / "run", logger))
    return {"out": out, "run": out / "run", "result": result, "last": str(Path(result.last_checkpoint).resolve())}


@needs("tensorboard")
def test_tensorboard_gets_config_loss_lr_routing_and_checkpoint(tracked: dict[str, Any]) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import plugin_data_pb2

    folder = next((tracked["run"] / "tensorboard").glob("version_*"))
    events = EventAccumulator(str(folder), size_guidance={"tensors": 0, "scalars": 0}).Reload()
    scalars = events.Tags()["scalars"]
    assert {"train_loss_step", "train_loss_epoch", "val_loss", "lr", f"routing/{LAYER}/flagged",
            f"routing/{LAYER}/changed"} <= set(scalars)
    assert [e.value for e in events.Scalars("lr")] == pytest.approx([1e-3, 1e-3])  # the config's lr, steps 0, 1
    assert [e.step for e in events.Scalars("lr")] == [0, 1]
    flagged = events.Scalars(f"routing/{LAYER}/flagged")
    assert len(flagged) == 1 and 0.0 <= flagged[0].value <= 1.0  # one epoch
    # the hyper-parameters: the resolved config, flattened by Lightning with "/"
    content = events.PluginTagToContent("hparams")["_hparams_/session_start_info"]
    hparams = plugin_data_pb2.HParamsPluginData.FromString(content).session_start_info.hparams
    assert hparams["training/lr"].number_value == pytest.approx(1e-3)
    assert hparams["model/name"].string_value == tracked["result"].module.metadata["config"]["model"]["name"]
    text = {tag: events.Tensors(tag)[0].tensor_proto.string_val[0].decode() for tag in events.Tags()["tensors"]
            if tag.endswith("text_summary")}
    assert tracked["last"] in text["checkpoint/text_summary"]
    assert yaml.safe_load(text["config/text_summary"].replace("\n    ", "\n").strip())["training"]["lr"] == 1e-3


@needs("mlflow")
def test_mlflow_file_store_gets_config_loss_lr_routing_and_checkpoint(tracked: dict[str, Any]) -> None:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=(tracked["out"] / "mlruns").as_uri())
    run = client.search_runs([client.get_experiment_by_name("tiny").experiment_id])[0]
    assert run.info.status == "FINISHED" and run.data.tags["purpose"] == "test"
    assert run.data.params["training/lr"] == "0.001" and run.data.params["data/batch_size"] == "4"
    logged = {"train_loss_step", "train_loss_epoch", "val_loss", "lr", f"routing/{LAYER}/flagged"}
    assert logged <= set(run.data.metrics)
    lr = client.get_metric_history(run.info.run_id, "lr")
    assert [(m.step, m.value) for m in lr] == [(0, 1e-3), (1, 1e-3)]
    assert 0.0 <= run.data.metrics[f"routing/{LAYER}/flagged"] <= 1.0
    assert run.data.tags["checkpoint.last"] == tracked["last"]
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert "config.yaml" in artifacts
    stored = {Path(a.path).name for a in client.list_artifacts(run.info.run_id, "checkpoints")}
    assert "last.ckpt" in stored and any(name.startswith("best-") for name in stored)


def wandb_records(path: Path) -> list[Any]:
    """The records of an offline W&B run file (``run-*.wandb``: LevelDB's log format, 32 KiB blocks of chunks
    with a 7-byte header, crc32 / length / type, after a 7-byte file header), as wandb's Record protos."""
    from wandb.proto import wandb_internal_pb2

    data, pos, block, pending, out = path.read_bytes(), 7, 32768, b"", []
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a header is padding
            pos += block - pos % block
            continue
        length, kind = int.from_bytes(data[pos + 4:pos + 6], "little"), data[pos + 6]
        pending += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # a FULL record, or the LAST chunk of one
            out.append(wandb_internal_pb2.Record.FromString(pending))
            pending = b""
    return out


@needs("wandb")
def test_wandb_offline_run_gets_config_loss_lr_routing_and_checkpoint(tracked: dict[str, Any]) -> None:
    """W&B offline: the run file read back record by record (history rows, config, summary)."""
    records = wandb_records(next((tracked["out"] / "wb" / "wandb").glob("offline-run-*/run-*.wandb")))
    kinds = [r.WhichOneof("record_type") for r in records]
    assert "exit" in kinds  # the run was finished at the fit's end
    history = [{"/".join(i.nested_key) or i.key: json.loads(i.value_json) for i in r.history.item}
               for r in records if r.HasField("history")]
    assert [(row["trainer/global_step"], row["lr"]) for row in history if "lr" in row] == [(0, 1e-3), (1, 1e-3)]
    logged = set().union(*history)
    assert {"train_loss_step", "train_loss_epoch", "val_loss", f"routing/{LAYER}/flagged"} <= logged
    config = {i.key: json.loads(i.value_json) for r in records if r.HasField("config") for i in r.config.update}
    assert config["training"]["lr"] == 1e-3
    summary = {i.key: json.loads(i.value_json) for r in records if r.HasField("summary") for i in r.summary.update}
    assert summary["checkpoint/last"] == tracked["last"]


def test_csv_stays_the_default_and_gets_the_learning_rate(tracked: dict[str, Any]) -> None:
    metrics = pd.read_csv(next((tracked["run"] / "logs").rglob("metrics.csv")))
    assert metrics["lr"].dropna().tolist() == [1e-3, 1e-3]
    assert f"routing/{LAYER}/flagged" in metrics and "train_loss_step" in metrics
    hparams = yaml.safe_load(next((tracked["run"] / "logs").rglob("hparams.yaml")).read_text())
    assert hparams["training"]["lr"] == 1e-3
    assert TrainConfig.from_dict({"task": "heat"}).trackers == TrainConfig.from_dict(
        {"task": "heat", "trainer": {"logger": "csv"}}).trackers


def test_a_csv_run_never_imports_a_tracker_package(world_store: str, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    for modules in PACKAGES.values():
        for module in modules:  # None in sys.modules: any import of it raises ImportError
            monkeypatch.setitem(sys.modules, module, None)
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)
    result = train(tiny(world_store, tmp_path / "run", None, steps=1))
    assert Path(result.last_checkpoint).is_file()
    assert [type(logger).__name__ for logger in result.trainer.loggers] == ["CSVLogger"]


@pytest.mark.parametrize(("logger", "message"), [
    ("mlflo", "config key 'trainer.logger.name' must be one of csv, tensorboard, mlflow, wandb, got 'mlflo' "
              "(did you mean 'mlflow'?)"),
    (["csv", {"name": "mlflow", "tracking_url": "x"}],
     "unknown config key 'trainer.logger[1].tracking_url' (did you mean 'tracking_uri'?)"),
    ({"name": "tensorboard", "save_dir": 3}, "config key 'trainer.logger.save_dir' must be str or null, got int 3"),
    ({"name": "csv", "flush_logs_every_n_steps": 0}, "config key 'trainer.logger.flush_logs_every_n_steps' must be"),
    (["csv", "csv"], "config key 'trainer.logger' names csv more than once"),
    ([{"experiment_name": "x"}], "config key 'trainer.logger[0]' lacks 'name'"),
    (7, "config key 'trainer.logger' must be a tracker name (csv, tensorboard, mlflow, wandb) or a mapping"),
])
def test_a_wrong_tracker_is_refused_in_one_line(logger: Any, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        TrainConfig.from_dict({"task": "heat", "trainer": {"logger": logger}})
    assert str(err.value).startswith(message) and "\n" not in str(err.value)


@pytest.mark.parametrize("name", list(PACKAGES))
def test_a_tracker_whose_package_is_absent_names_the_extra(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    for module in PACKAGES[name]:
        monkeypatch.setitem(sys.modules, module, None)
    with pytest.raises(ConfigError, match=rf'names {name}, whose package .* is not installed: '
                                          rf'pip install "smoeweather\[{name}\]"'):
        TrainConfig.from_dict({"task": "heat", "trainer": {"logger": ["csv", name]}})
    assert TrainConfig.from_dict({"task": "heat", "trainer": {"logger": False}}).trackers == ()
