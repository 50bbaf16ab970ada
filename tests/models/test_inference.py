"""Inference without the training stack: ``smoe forecast`` and ``smoe postprocess apply --network`` run
with Lightning hidden from ``sys.modules`` and give the numbers of the in-process run; the Lightning-free loader
rebuilds exactly the trained network; old names (task ``ens10``, ``Ens10UNet``) still load with a
DeprecationWarning; the old ``apply MODEL`` spelling fails with a message naming the new one."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import xarray as xr
from test_forecast import _train

from smoeweather.cli import main
from smoeweather.models.checkpoint_io import read_checkpoint
from smoeweather.models.loader import CheckpointFormatError, load_network
from smoeweather.training.checkpoint import load_trained

REPO = Path(__file__).resolve().parents[2]

HIDE_LIGHTNING = """
import sys
for name in ("lightning", "lightning.pytorch", "lightning.fabric", "pytorch_lightning"):
    sys.modules[name] = None  # `import lightning` now raises ImportError
from smoeweather.cli import main
rc = main(sys.argv[1:])
loaded = sorted(m for m, mod in sys.modules.items() if mod is not None and m.split(".")[0] in
                ("lightning", "pytorch_lightning", "smoeweather") and m.startswith(("lightning", "pytorch_lightning",
                                                                                   "smoeweather.training")))
if loaded:
    print("imported:", loaded)
    sys.exit(3)
sys.exit(rc)
"""


def _without_lightning(*argv: str) -> subprocess.CompletedProcess:
    """``smoe *argv`` in a fresh interpreter where ``import lightning`` fails, with this process's torch thread
    count and kernel switches (ATEN_CPU_CAPABILITY, ...: the reduction order and the kernels of a convolution,
    hence its last bit, depend on them)."""
    from reference_values import KERNEL_SWITCHES

    env = {"OMP_NUM_THREADS": str(torch.get_num_threads()), "PATH": "/usr/bin:/bin",
           **{k: os.environ[k] for k in KERNEL_SWITCHES if k in os.environ}}
    return subprocess.run([sys.executable, "-c", HIDE_LIGHTNING, *argv], capture_output=True, text=True, cwd=REPO,
                          env=env)


@pytest.fixture(scope="module")
def forecast_ckpt(world_store: str, tmp_path_factory: pytest.TempPathFactory) -> str:
    """Continuous-lead SMoE ResNet with the land-sea prior, 3 training steps."""
    return _train("world_smoe_all_prior", world_store, tmp_path_factory.mktemp("smoe"))


def _postprocess_config(out: Path, source: Path, task: str = "postprocess") -> list[str]:
    return ["train", "--config", str(REPO / "configs" / "postprocess" / "gcm_ens_smoe_unet.yaml"), f"task={task}",
            f"output_dir={out}", f"data.source={source}", "data.train_period=[2005-01-01, 2005-01-28]",
            "data.valid_period=[2005-01-29, 2005-02-08]", "data.test_period=[2005-02-09, 2005-02-20]",
            "data.batch_size=4", "model.widths=[4, 8]", "model.levels=2", "model.gate_prior=land_sea",
            "trainer.max_steps=4", "trainer.val_check_interval=2", "trainer.enable_progress_bar=false",
            "trainer.accelerator=cpu", "trainer.log_every_n_steps=1"]


@pytest.fixture(scope="module")
def postprocess_ckpt(gcm_ens_streams: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """SMoE-U-Net with the land-sea prior (static inputs from the file), 4 training steps, task ``postprocess``."""
    out = tmp_path_factory.mktemp("pp")
    assert main(_postprocess_config(out, gcm_ens_streams["a"])) == 0
    return out / "checkpoints" / "last.ckpt"


@pytest.mark.parametrize("which", ["forecast_ckpt", "postprocess_ckpt"])
def test_loader_rebuilds_exactly_the_trained_network(which: str, request: pytest.FixtureRequest) -> None:
    """load_network (torch + model code) holds the same tensors as the training module's network, and every one of
    them: nothing of the checkpoint's model is left out or added."""
    ckpt = request.getfixturevalue(which)
    net, trained = load_network(ckpt), load_trained(ckpt)
    assert type(net.model) is type(trained.model) and net.sha256 == trained.sha256 and net.task == trained.task
    mine, theirs = net.model.state_dict(), trained.model.state_dict()
    assert mine.keys() == theirs.keys()
    for k in mine:
        assert torch.equal(mine[k], theirs[k]), k  # loaded from the same file: exact
    saved = {k[len("model."):] for k in read_checkpoint(ckpt)["state_dict"] if k.startswith("model.")}
    assert saved == set(mine)


def test_smoe_forecast_runs_without_lightning(forecast_ckpt: str, world_store: str, tmp_path: Path) -> None:
    """`smoe forecast CKPT` with `lightning` unimportable: same forecast as in this process, bit for bit."""
    argv = ["forecast", forecast_ckpt, "--data", world_store, "--init", "2000-03-21", "2000-03-26", "--every", "24h",
            "--lead", "24h", "48h", "--no-progress"]
    r = _without_lightning(*argv, "--out", str(tmp_path / "hidden.zarr"))
    assert r.returncode == 0, r.stdout + r.stderr
    assert main([*argv, "--out", str(tmp_path / "here.zarr")]) == 0
    a, b = xr.open_zarr(tmp_path / "hidden.zarr"), xr.open_zarr(tmp_path / "here.zarr")
    assert a.attrs["forecast_kind"] == "deterministic" and set(a.data_vars) == {"geopotential", "temperature"}
    for v in a.data_vars:
        # the same network code with or without lightning imported: the same bits
        np.testing.assert_array_equal(a[v].values, b[v].values)


def test_smoe_postprocess_apply_runs_without_lightning(postprocess_ckpt: Path, gcm_ens_streams: dict[str, Path],
                                                        tmp_path: Path) -> None:
    """`smoe postprocess apply --network CKPT` with `lightning` unimportable, the default products and ECC-Q
    members: same stores as in this process, bit for bit."""
    argv = ["postprocess", "apply", "--network", str(postprocess_ckpt), "--forecast", str(gcm_ens_streams["b"]),
            "--members", "4"]
    r = _without_lightning(*argv, "--out", str(tmp_path / "hidden.zarr"))
    assert r.returncode == 0, r.stdout + r.stderr
    assert main([*argv, "--out", str(tmp_path / "here.zarr")]) == 0
    for name in ("hidden.zarr", "hidden_members.zarr"):
        a = xr.open_zarr(tmp_path / name)
        b = xr.open_zarr(tmp_path / name.replace("hidden", "here"))
        assert a.attrs["forecast_kind"] == ("ensemble" if "members" in name else "gaussian")
        for v in a.data_vars:
            np.testing.assert_array_equal(a[v].values, b[v].values)  # as above
    sigma = xr.open_zarr(tmp_path / "hidden.zarr")["temperature_std"].sel(level=850)
    assert float(sigma.min()) > 0


def test_old_task_name_ens10_loads_with_a_deprecation_warning(postprocess_ckpt: Path, gcm_ens_streams: dict[str, Path],
                                                              tmp_path: Path) -> None:
    """A checkpoint whose metadata says task `ens10` (written by older versions) loads as `postprocess`, warning;
    a config with `task: ens10` validates as `postprocess`, warning."""
    ckpt = read_checkpoint(postprocess_ckpt)
    ckpt["smoeweather"] = {**ckpt["smoeweather"], "task": "ens10"}
    old = tmp_path / "old.ckpt"
    torch.save(ckpt, old)
    with pytest.warns(DeprecationWarning, match="task 'ens10' is deprecated"):
        net = load_network(old)
    assert net.task == "postprocess"
    new = load_network(postprocess_ckpt)
    for k, v in new.model.state_dict().items():
        assert torch.equal(v, net.model.state_dict()[k])

    from smoeweather.config import apply_overrides, read_config
    from smoeweather.training.schema import validate_train_config

    cfg = apply_overrides(read_config(REPO / "configs" / "postprocess" / "gcm_ens_unet.yaml"),
                          ["task=ens10", f"data.source={gcm_ens_streams['a']}"])
    with pytest.warns(DeprecationWarning, match="write task: postprocess"):
        validate_train_config(cfg)
    assert cfg["task"] == "postprocess"


def test_old_class_name_ens10unet_imports_with_a_deprecation_warning() -> None:
    from smoeweather.models import unet

    with pytest.warns(DeprecationWarning, match="Ens10UNet is deprecated; it is PostprocessingUNet"):
        old = unet.Ens10UNet
    assert old is unet.PostprocessingUNet
    with pytest.raises(AttributeError):
        _ = unet.NoSuchNet


def test_loader_refuses_other_tasks_and_foreign_files(tmp_path: Path) -> None:
    other = tmp_path / "heat.ckpt"
    torch.save({"state_dict": {}, "smoeweather": {"format_version": 1, "task": "heat", "config": {}}}, other)
    with pytest.raises(ValueError, match="heat.ckpt: a 'heat' checkpoint"):
        load_network(other)
    foreign = tmp_path / "foreign.ckpt"
    torch.save({"state_dict": {}}, foreign)
    with pytest.raises(CheckpointFormatError, match="foreign.ckpt has no smoeweather metadata"):
        load_network(foreign)


@pytest.mark.parametrize("model, flag", [("emos.nc", "--emos"), ("net.ckpt", "--network")])
def test_old_apply_spelling_fails_naming_the_new_one(model: str, flag: str, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """`smoe postprocess apply MODEL ...` (EMOS or network told by the suffix) is refused before anything is
    read or written, naming `--emos`/`--network`."""
    (tmp_path / model).write_bytes(b"x")
    out = tmp_path / "pp.zarr"
    assert main(["postprocess", "apply", str(tmp_path / model), "--forecast", str(tmp_path / "ens.nc"),
                 "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"smoe postprocess apply {flag} {tmp_path / model}" in err and not out.exists()
    assert main(["postprocess", "apply", "--forecast", "ens.nc", "--out", str(out)]) == 2
    assert "needs --emos MODEL.nc" in capsys.readouterr().err


def test_make_forecast_says_what_makes_the_forecast(world_store: str) -> None:
    """`make_forecast` takes the network or the reference method by name (`checkpoint=` / `method=`), exactly one;
    each is checked before any data is read."""
    from smoeweather.forecast import make_forecast

    with pytest.raises(ValueError, match="checkpoint=CKPT .* or method="):
        make_forecast(world_store, ("2000-03-21", "2000-03-22"))
    with pytest.raises(ValueError, match="exactly one"):
        make_forecast(world_store, ("2000-03-21", "2000-03-22"), checkpoint="x.ckpt", method="persistence")
    with pytest.raises(ValueError, match="unknown reference method 'persistance'"):
        make_forecast(world_store, ("2000-03-21", "2000-03-22"), method="persistance")
    fc = make_forecast(world_store, ("2000-03-21", "2000-03-22"), leads_h=(24,), method="persistence", progress=False)
    assert fc.attrs["method"] == "persistence" and fc.attrs["forecast_kind"] == "deterministic"
