"""A checkpoint is data: a crafted pickle that runs code when unpickled is refused by every command
and public function that reads a checkpoint, with a message naming the file and the refused object, and
nothing is written; the project's own checkpoints load with ``weights_only=True`` and hold plain metadata;
``smoe checkpoint convert --trust`` turns an old-style checkpoint (numpy/path metadata) into a safe one."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch
from test_postprocess_networks import REPO

from smoeweather.cli import main
from smoeweather.models.checkpoint_io import UnsafeCheckpointError, plain, read_checkpoint
from smoeweather.postprocess.neural import apply_checkpoint
from smoeweather.training.checkpoint import load_trained
from smoeweather.training.init import init_weights

CONFIG = REPO / "configs" / "postprocess" / "gcm_ens_unet.yaml"


class _Payload:
    """Unpickling this calls os.system, which creates ``marker``: the code a crafted checkpoint would run."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple:
        return (os.system, (f"touch {self.marker}",))


def _train_args(out: Path, source: Path) -> list[str]:
    return ["train", "--config", str(CONFIG), f"output_dir={out}", f"data.source={source}",
            "data.train_period=[2005-01-01, 2005-01-28]", "data.valid_period=[2005-01-29, 2005-02-08]",
            "data.test_period=[2005-02-09, 2005-02-20]", "data.batch_size=4", "model.widths=[4, 8]",
            "model.levels=2", "trainer.max_steps=4", "trainer.val_check_interval=2",
            "trainer.enable_progress_bar=false", "trainer.accelerator=cpu"]


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory, gcm_ens_streams: dict[str, Path],
          world_store: str) -> dict[str, Path]:
    """A real post-processing checkpoint, its ensemble file, the tiny world store, and a crafted twin of the
    checkpoint whose metadata carries the payload (every weight and key otherwise genuine)."""
    tmp = tmp_path_factory.mktemp("ckpt_safety")
    source = gcm_ens_streams["a"]  # 24 inits of 2005, seed 1
    assert main(_train_args(tmp / "run", source)) == 0
    good = tmp / "run" / "checkpoints" / "last.ckpt"
    marker = tmp / "code_ran"
    ckpt = torch.load(good, map_location="cpu", weights_only=True)
    ckpt["smoeweather"]["note"] = _Payload(marker)
    evil = tmp / "evil.ckpt"
    torch.save(ckpt, evil)
    return {"good": good, "evil": evil, "marker": marker, "source": source, "world": Path(world_store), "tmp": tmp}


def _refused(setup: dict[str, Path], argv: list[str], capsys: pytest.CaptureFixture, written: Path) -> None:
    """The command exits 2 naming the file and os.system, the payload never ran and ``written`` is absent."""
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "evil.ckpt" in err and "os.system" in err and "does not load it" in err, err
    assert not setup["marker"].exists(), "the checkpoint's code ran"
    assert not written.exists(), f"{written} was written"


def test_forecast_refuses_crafted_checkpoint(setup: dict[str, Path], capsys: pytest.CaptureFixture) -> None:
    out = setup["tmp"] / "fc_evil.zarr"
    _refused(setup, ["forecast", str(setup["evil"]), "--data", str(setup["world"]), "--init", "2000-01-03",
                     "2000-01-04", "--lead", "24h", "--out", str(out), "--no-progress"], capsys, out)


def test_postprocess_apply_refuses_crafted_checkpoint(setup: dict[str, Path], capsys: pytest.CaptureFixture) -> None:
    out = setup["tmp"] / "pp_evil.zarr"
    _refused(setup, ["postprocess", "apply", "--network", str(setup["evil"]), "--forecast", str(setup["source"]),
                     "--out", str(out), "--members", "4"], capsys, out)
    assert not (setup["tmp"] / "pp_evil_members.zarr").exists()


def test_plot_routing_refuses_crafted_checkpoint(setup: dict[str, Path], capsys: pytest.CaptureFixture) -> None:
    out = setup["tmp"] / "routing_evil"
    _refused(setup, ["plot", "routing", str(setup["evil"]), "--out", str(out)], capsys, out)


@pytest.mark.parametrize("flag", ["--init-from", "--resume"])
def test_train_refuses_crafted_checkpoint(flag: str, setup: dict[str, Path], capsys: pytest.CaptureFixture) -> None:
    out = setup["tmp"] / f"train_evil{flag}"
    argv = _train_args(out, setup["source"])
    _refused(setup, [*argv[:3], flag, str(setup["evil"]), *argv[3:]], capsys, out)


def test_public_functions_refuse_crafted_checkpoint(setup: dict[str, Path]) -> None:
    for call in (lambda p: load_trained(p), lambda p: read_checkpoint(p),
                 lambda p: init_weights(load_trained(setup["good"]).model, p),
                 lambda p: apply_checkpoint(p, None)):
        with pytest.raises(UnsafeCheckpointError, match=r"evil\.ckpt holds objects .*os\.system"):
            call(setup["evil"])
    assert not setup["marker"].exists()
    with pytest.raises(UnsafeCheckpointError):  # UnsafeCheckpointError is a ValueError: the CLI's user error
        raise UnsafeCheckpointError("x")
    assert issubclass(UnsafeCheckpointError, ValueError)


def test_raw_pickle_with_code_is_refused(tmp_path: Path) -> None:
    """Not a zip checkpoint at all, just a pickle with the payload: refused, not run."""
    import pickle

    marker, path = tmp_path / "ran", tmp_path / "raw.ckpt"
    path.write_bytes(pickle.dumps({"state_dict": {}, "x": _Payload(marker)}, protocol=2))
    with pytest.raises(UnsafeCheckpointError, match="raw.ckpt"):
        read_checkpoint(path)
    assert not marker.exists()


def test_own_checkpoints_are_plain_data(setup: dict[str, Path]) -> None:
    """What `smoe train` writes loads with PyTorch's restricted unpickler and its metadata is JSON-like."""
    ckpt = read_checkpoint(setup["good"])
    meta = ckpt["smoeweather"]
    assert plain(meta) == meta

    def leaves(x: object) -> list[object]:
        if isinstance(x, dict):
            return [v for value in x.values() for v in leaves(value)]
        if isinstance(x, (list, tuple)):
            return [v for value in x for v in leaves(value)]
        return [x]

    assert all(isinstance(v, (str, int, float, bool, type(None), torch.Tensor)) for v in leaves(meta))


def test_convert_trusted_old_checkpoint(setup: dict[str, Path], capsys: pytest.CaptureFixture) -> None:
    """An old-style checkpoint (numpy arrays and a Path in its metadata: refused by the safe loader) converts
    with --trust into a file that loads safely and gives the same post-processed forecast, bit for bit."""
    tmp = setup["tmp"]
    ckpt = torch.load(setup["good"], map_location="cpu", weights_only=True)
    ckpt["smoeweather"]["latitude"] = np.asarray(ckpt["smoeweather"]["latitude"])
    ckpt["smoeweather"]["data_path"] = Path("/somewhere/ens.nc")
    old, new = tmp / "old.ckpt", tmp / "converted.ckpt"
    torch.save(ckpt, old)
    with pytest.raises(UnsafeCheckpointError, match="old.ckpt.*numpy"):
        read_checkpoint(old)
    assert main(["checkpoint", "convert", str(old), str(new)]) == 2  # no --trust: refused, nothing written
    assert "--trust" in capsys.readouterr().err and not new.exists()
    assert main(["checkpoint", "convert", str(old), str(new), "--trust"]) == 0
    assert main(["checkpoint", "convert", str(old), str(new), "--trust"]) == 2  # never overwrites
    assert main(["checkpoint", "info", str(new)]) == 0
    assert "loads as data" in capsys.readouterr().out
    import xarray as xr

    fc = xr.load_dataset(setup["source"])
    a = apply_checkpoint(setup["good"], fc)
    b = apply_checkpoint(new, fc)
    for x, y in zip(a[:2], b[:2], strict=True):
        xr.testing.assert_identical(x, y)  # the same weights through the same code: bit-equal on one machine


def test_zarr_store_with_pickle_codec_is_not_unpickled(tmp_path: Path) -> None:
    """The one code path a zarr store could carry (an object array with the numcodecs ``pickle`` filter) is
    refused by the zarr library smoeweather reads with, before any chunk is unpickled (docs/security.md)."""
    import json
    import pickle

    import xarray as xr

    store, marker = tmp_path / "pickled.zarr", tmp_path / "ran"
    (store / "x").mkdir(parents=True)
    (store / ".zgroup").write_text(json.dumps({"zarr_format": 2}))
    (store / "x" / ".zarray").write_text(json.dumps({
        "zarr_format": 2, "shape": [1], "chunks": [1], "dtype": "|O", "compressor": None, "fill_value": None,
        "filters": [{"id": "pickle", "protocol": 5}], "order": "C"}))
    (store / "x" / ".zattrs").write_text(json.dumps({"_ARRAY_DIMENSIONS": ["i"]}))
    chunk = np.empty(1, dtype=object)
    chunk[0] = _Payload(marker)
    (store / "x" / "0").write_bytes(pickle.dumps(chunk))
    with pytest.raises(ValueError, match="pickle"):
        xr.open_zarr(store, consolidated=False).load()
    assert not marker.exists()
