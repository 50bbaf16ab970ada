"""``smoe export``: every network family ``smoe train`` makes round-trips through safetensors + model.json (the
checkpoint's metadata verbatim) without unpickling anything; ``smoe forecast DIR`` and ``smoe postprocess apply
--network DIR`` equal the checkpoint's, bit for bit; ``--format onnx`` runs in onnxruntime within a float32
tolerance of torch on real inputs, and the family that cannot export (MC dropout) is refused in one line."""

from __future__ import annotations

import json
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import xarray as xr
from conftest import float_tol

from smoeweather.cli import main
from smoeweather.config import apply_overrides, read_config
from smoeweather.models.checkpoint_io import read_checkpoint
from smoeweather.models.loader import load_network

REPO = Path(__file__).resolve().parents[2]
ONNX_REASON = "needs the onnx extra (onnx, onnxruntime): pip install 'smoeweather[onnx]'"
WORLD = ["data.world=null", "data.sources=null", "data.num_workers=0", "data.batch_size=4",
         "data.variables=[geopotential_500, temperature_850]", "data.lead_h=24", "data.train_years=null",
         "data.valid_years=null", "data.test_years=null", "data.train_period=[2000-01-01, 2000-02-29T18:00]",
         "data.valid_period=[2000-03-01, 2000-03-20]", "data.test_period=[2000-03-21, 2000-04-09]",
         "model.width=8", "model.blocks=1"]
FAMILIES: dict[str, tuple[str, list[str]]] = {  # name → (config, overrides): every network family of `smoe train`
    "resnet-dense": ("weatherbench/world_dense", []),
    "resnet-smoe-prior": ("weatherbench/world_smoe_all_prior", []),
    "resnet-lrlcn": ("weatherbench/world_dense", ["model.conv=lrlcn", "model.lrlcn_rank=2"]),
    "e3": ("weatherbench/world_smoe_all_prior", ["model.name=e3", "model.members=2"]),
    "deep_ensemble": ("weatherbench/world_dense", ["model.name=deep_ensemble", "model.members=2"]),
    "gaussian": ("weatherbench/world_dense", ["model.name=gaussian"]),
    "mc_dropout": ("weatherbench/world_dense", ["model.name=mc_dropout", "model.members=2", "model.dropout=0.1"]),
    "pp-unet": ("postprocess/gcm_ens_unet", []),
    "pp-smoe-unet-prior": ("postprocess/gcm_ens_smoe_unet", ["model.gate_prior=land_sea"]),
}
PP = ["data.train_period=[2005-01-01, 2005-01-28]", "data.valid_period=[2005-01-29, 2005-02-08]",
      "data.test_period=[2005-02-09, 2005-02-20]", "model.widths=[4, 8]", "model.levels=2"]


def _untrained(family: str, out: Path, world_store: str, pp_source: Path) -> Path:
    """The checkpoint `smoe train` would write for ``family`` before its first step (built by the task's own
    builder, metadata by the module's own hook): the network as the registry makes it, in ``out/untrained.ckpt``."""
    from smoeweather.training.registry import task

    config, extra = FAMILIES[family]
    data = [f"data.source={pp_source}", *PP] if config.startswith("postprocess") else \
        [f"data.store={world_store}", *WORLD]
    cfg = apply_overrides(read_config(REPO / "configs" / f"{config}.yaml"), [f"output_dir={out}", *data, *extra])
    _, module = task(cfg["task"]).build(cfg)
    ckpt: dict[str, Any] = {"state_dict": module.state_dict()}
    module.on_save_checkpoint(ckpt)
    torch.save(ckpt, out / "untrained.ckpt")
    return out / "untrained.ckpt"


@pytest.fixture(scope="module", params=list(FAMILIES))
def family(request: pytest.FixtureRequest, world_store: str, gcm_ens_streams: dict[str, Path],
           tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    name = request.param
    return name, _untrained(name, tmp_path_factory.mktemp(name), world_store, gcm_ens_streams["a"])


def _no_pickle(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make every way of unpickling fail loudly for the rest of the test."""
    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("something was unpickled")

    for name in ("load", "loads", "Unpickler"):
        monkeypatch.setattr(pickle, name, refuse)
    monkeypatch.setattr(torch, "load", refuse)


def test_export_round_trips_every_family_without_unpickling(family: tuple[str, Path], tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """model.safetensors + model.json: the checkpoint's metadata verbatim, the same tensors, and the network read
    back (smoeweather.load_model, pickle disabled) gives the checkpoint's outputs bit for bit."""
    import smoeweather
    from smoeweather.models.export import example_inputs

    name, ckpt = family
    assert main(["export", str(ckpt), "--out", str(tmp_path / "x")]) == 0
    assert sorted(p.name for p in (tmp_path / "x").iterdir()) == ["model.json", "model.safetensors"]
    card = json.loads((tmp_path / "x" / "model.json").read_text())
    meta = read_checkpoint(ckpt)["smoeweather"]
    assert card["smoeweather"] == json.loads(json.dumps(meta))  # exactly the checkpoint's block
    assert card["smoeweather"]["code"]["smoeweather"] == smoeweather.__version__
    from_ckpt = load_network(ckpt)
    _no_pickle(monkeypatch)
    exported = smoeweather.load_model(tmp_path / "x")
    assert type(exported.model) is type(from_ckpt.model) and exported.task == from_ckpt.task
    mine, theirs = exported.model.state_dict(), from_ckpt.model.state_dict()
    assert mine.keys() == theirs.keys() and all(torch.equal(mine[k], theirs[k]) for k in mine)
    inputs = example_inputs(from_ckpt.task, from_ckpt.metadata)
    with torch.no_grad(), torch.random.fork_rng():
        torch.manual_seed(1)
        a = exported.model(*inputs)
        torch.manual_seed(1)
        b = from_ckpt.model(*inputs)
    for x, y in zip(a if isinstance(a, tuple) else (a,), b if isinstance(b, tuple) else (b,)):
        assert torch.equal(x, y), name


def _real_inputs(trained: Any, world_store: str, pp_source: Path) -> tuple[torch.Tensor, ...]:
    """Inputs as `smoe forecast` / `postprocess apply` assemble them from data (2 inits)."""
    if trained.task == "postprocess":
        from smoeweather.data.ensemble_dataset import EnsembleDataset, EnsembleSpec
        from smoeweather.data.forecast_stores import open_ensemble

        meta = trained.metadata
        stats = {k: (float(v[0]), float(v[1])) for k, v in meta["stats"].items()}
        forecast = open_ensemble(pp_source).sortby("latitude")
        spec = EnsembleSpec.from_config(meta["spec"])
        data = EnsembleDataset(forecast, None, spec, stats=stats, source=str(pp_source))
        x, _, m, s = (torch.stack(parts) for parts in zip(data[0], data[5]))
        return x, m, s
    from smoeweather.forecast.model import constants_tensor, network_inputs, prepared_input

    inits = np.array(["2000-03-21T00", "2000-03-25T12"], "datetime64[ns]")
    spec, ds = prepared_input(trained, xr.open_zarr(world_store), inits, [24], "test")
    _, _, _, x = next(network_inputs(spec, ds, constants_tensor(ds, spec, "test"), inits, [24], 1, 2, None))
    return (x,)


def test_onnx_equals_torch_on_real_inputs(family: tuple[str, Path], tmp_path: Path, world_store: str,
                                          gcm_ens_streams: dict[str, Path], capsys: pytest.CaptureFixture) -> None:
    """The ONNX graph (opset 17, routing frozen) in onnxruntime equals torch within 2 n u on inputs read from data,
    at another batch size than exported; MC dropout is refused in one line naming why, with nothing written."""
    ort = pytest.importorskip("onnxruntime", reason=ONNX_REASON)
    pytest.importorskip("onnx", reason=ONNX_REASON)
    from smoeweather.models.ensemble import model_kind
    from smoeweather.models.export import ONNX_OPSET, _Physical, rounding_ops

    name, ckpt = family
    out = tmp_path / "x"
    rc = main(["export", str(ckpt), "--out", str(out), "--format", "onnx"])
    if name == "mc_dropout":
        err = capsys.readouterr().err.strip()
        assert rc == 2 and len(err.splitlines()) == 1 and "mc_dropout" in err and "random" in err, err
        assert not out.exists()
        return
    assert rc == 0
    card = json.loads((out / "model.json").read_text())
    assert card["onnx"]["opset"] == ONNX_OPSET and card["onnx"]["check"]["worst_ratio"] <= 1
    trained = load_network(ckpt)
    torch_model = trained.model if trained.task == "postprocess" else \
        _Physical(trained.model, model_kind(trained.config["model"]))
    inputs = _real_inputs(trained, world_store, gcm_ens_streams["b"])
    session = ort.InferenceSession(str(out / "model.onnx"), providers=["CPUExecutionProvider"])
    got = session.run(None, {i.name: t.numpy() for i, t in zip(session.get_inputs(), inputs)})
    with torch.no_grad():
        want = torch_model(*inputs)
    n_ops = rounding_ops(torch_model)
    for g, w in zip(got, want if isinstance(want, tuple) else (want,)):
        w = w.numpy()
        assert g.shape == w.shape
        for c in range(w.shape[-3]):  # per output channel: its own magnitude
            wc, gc = w[..., c, :, :], g[..., c, :, :]
            np.testing.assert_allclose(gc, wc, **float_tol(np.float32, n_ops, float(np.abs(wc).max())))


@pytest.fixture(scope="module")
def trained_smoe(world_store: str, tmp_path_factory: pytest.TempPathFactory) -> str:
    """A continuous-lead SMoE ResNet with the land-sea prior, 3 training steps (test_forecast's tiny training)."""
    from test_forecast import _train

    return _train("world_smoe_all_prior", world_store, tmp_path_factory.mktemp("smoe"))


def test_smoe_forecast_from_export_equals_checkpoint_bit_for_bit(trained_smoe: str, world_store: str,
                                                                  tmp_path: Path) -> None:
    """`smoe forecast DIR` = `smoe forecast CKPT` on every value; the card says units, levels, leads, the land-sea
    prior's digest, the code version and the training store with its attributes."""
    from smoeweather.models.card import prior_digest
    from smoeweather.training.stores import land_sea_mask

    assert main(["export", trained_smoe, "--out", str(tmp_path / "x")]) == 0
    argv = ["--data", world_store, "--init", "2000-03-21", "2000-03-24", "--every", "24h", "--lead", "24h", "48h",
            "--no-progress"]
    assert main(["forecast", str(tmp_path / "x"), *argv, "--out", str(tmp_path / "a.zarr")]) == 0
    assert main(["forecast", trained_smoe, *argv, "--out", str(tmp_path / "b.zarr")]) == 0
    a, b = xr.open_zarr(tmp_path / "a.zarr"), xr.open_zarr(tmp_path / "b.zarr")
    assert set(a.data_vars) == set(b.data_vars) == {"geopotential", "temperature"}
    for v in a.data_vars:
        np.testing.assert_array_equal(a[v].values, b[v].values)
    card = json.loads((tmp_path / "x" / "model.json").read_text())["smoeweather"]
    assert card["variables"]["geopotential_500"] == {"variable": "geopotential", "level": 500, "units": "m**2 s**-2"}
    assert card["variables"]["temperature_850"]["units"] == "K" and card["levels"] == [250, 500, 850]
    assert card["leads_h"] == [24, 48] and card["continuous_lead"] is True
    assert card["land_sea_prior"] == prior_digest(land_sea_mask(world_store))
    assert card["training_data"]["source"] == world_store and card["training_data"]["attrs"]["source"] == "test"
    assert card["config"]["model"]["smoe"]["gate_prior"] == "land_sea"
    assert card["latitude"] == b["latitude"].values.tolist() and card["longitude"] == b["longitude"].values.tolist()
    assert set(card["normalisation"]) == {"input_mean", "input_std", "target_mean", "target_std"}


def test_postprocess_apply_network_dir_equals_checkpoint(gcm_ens_streams: dict[str, Path], world_store: str,
                                                         tmp_path: Path) -> None:
    """`smoe postprocess apply --network DIR` = `--network CKPT`, every store, bit for bit; an old checkpoint
    (no card keys) exports too."""
    from smoeweather.models.card import CARD_KEYS

    ckpt = _untrained("pp-smoe-unet-prior", tmp_path, world_store, gcm_ens_streams["a"])
    old = read_checkpoint(ckpt)
    old["smoeweather"] = {k: v for k, v in old["smoeweather"].items() if k not in CARD_KEYS}
    torch.save(old, tmp_path / "old.ckpt")
    assert main(["export", str(tmp_path / "old.ckpt"), "--out", str(tmp_path / "x")]) == 0
    argv = ["postprocess", "apply", "--forecast", str(gcm_ens_streams["b"]), "--members", "4"]
    assert main([*argv, "--network", str(tmp_path / "x"), "--out", str(tmp_path / "a.zarr")]) == 0
    assert main([*argv, "--network", str(tmp_path / "old.ckpt"), "--out", str(tmp_path / "b.zarr")]) == 0
    for name in ("a.zarr", "a_members.zarr"):
        a, b = xr.open_zarr(tmp_path / name), xr.open_zarr(tmp_path / name.replace("a", "b", 1))
        assert set(a.data_vars) == set(b.data_vars)
        for v in a.data_vars:
            np.testing.assert_array_equal(a[v].values, b[v].values)


def test_export_refusals_are_one_line(gcm_ens_streams: dict[str, Path], world_store: str, tmp_path: Path,
                                      capsys: pytest.CaptureFixture) -> None:
    """An existing --out, an export folder as the checkpoint, a non-network checkpoint, an --opset torch cannot
    write, weights changed after the export: exit 2 with one line naming the file or option; the verb's choices are
    the module's."""
    from smoeweather.commands import export as verb
    from smoeweather.models import export

    assert (verb.FORMATS, verb.ONNX_OPSET) == (export.FORMATS, export.ONNX_OPSET)
    ckpt = _untrained("pp-unet", tmp_path, world_store, gcm_ens_streams["a"])
    out = tmp_path / "x"
    assert main(["export", str(ckpt), "--out", str(out)]) == 0
    capsys.readouterr()
    heat = tmp_path / "heat.ckpt"
    torch.save({"state_dict": {}, "smoeweather": {"format_version": 1, "task": "heat", "config": {}}}, heat)
    cases = [(["export", str(ckpt), "--out", str(out)], "exists"),
             (["export", str(out), "--out", str(tmp_path / "y")], "export folder"),
             (["export", str(heat), "--out", str(tmp_path / "z")], "heat")]
    low, high = export.onnx_opsets()
    cases += [(["export", str(ckpt), "--out", str(tmp_path / "o"), "--format", "onnx", "--opset", str(opset)],
               f"--opset {opset}: torch {torch.__version__} exports ONNX opsets {low} to {high}")
              for opset in (low - 2, high + 1)]  # (opset 5: onnxruntime rejected the graph with a traceback)
    for argv, words in cases:
        assert main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and words in err, err
    assert not (tmp_path / "o").exists()
    assert main(["checkpoint", "info", str(out)]) == 0  # an export folder is inspected as a checkpoint is
    said = capsys.readouterr().out
    assert "an export folder of `smoe export`" in said and "as its card records" in said and "'postprocess'" in said
    weights = out / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-4] + b"\0\0\0\0")
    with pytest.raises(ValueError, match="model.safetensors.*differs from the weights_sha256"):
        load_network(out)
    assert main(["checkpoint", "info", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "differs from the weights_sha256" in err, err


def test_a_graph_onnxruntime_rejects_is_one_line_and_leaves_nothing(gcm_ens_streams: dict[str, Path],
                                                                    world_store: str, tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch,
                                                                    capsys: pytest.CaptureFixture) -> None:
    """onnxruntime's own errors (plain Exception subclasses, multi-line) become one line; no folder is left."""
    ort = pytest.importorskip("onnxruntime", reason=ONNX_REASON)
    pytest.importorskip("onnx", reason=ONNX_REASON)

    class InvalidGraph(Exception):  # as onnxruntime.capi.onnxruntime_pybind11_state defines its errors
        pass

    def reject(*args: Any, **kwargs: Any) -> None:
        raise InvalidGraph("[ONNXRuntimeError] : 10 : INVALID_GRAPH : a node it cannot load\nmore detail")

    ckpt = _untrained("pp-unet", tmp_path, world_store, gcm_ens_streams["a"])
    monkeypatch.setattr(ort, "InferenceSession", reject)
    assert main(["export", str(ckpt), "--out", str(tmp_path / "x"), "--format", "onnx"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "cannot run the exported graph" in err and "INVALID_GRAPH" in err, err
    assert not (tmp_path / "x").exists() and not list(tmp_path.glob(".x*"))


def test_postprocess_network_applies_in_its_trained_units(gcm_ens_streams: dict[str, Path], world_store: str,
                                                           tmp_path: Path) -> None:
    """A network trained on K (its card records the units) calibrates a forecast in °C: the forecast is converted
    to K before the network reads it and μ comes back in °C, μ_°C = μ_K − 273.15 (float32 rounding of values near
    260), σ unchanged."""
    import warnings

    ckpt = _untrained("pp-smoe-unet-prior", tmp_path, world_store, gcm_ens_streams["a"])
    with xr.open_dataset(gcm_ens_streams["b"]) as ds:
        ds = ds.load()
    celsius = ds.assign(temperature=(ds["temperature"] - 273.15).assign_attrs({**ds["temperature"].attrs,
                                                                                "units": "degC"}))
    celsius.to_netcdf(tmp_path / "celsius.nc")
    argv = ["postprocess", "apply", "--network", str(ckpt)]
    assert main([*argv, "--forecast", str(gcm_ens_streams["b"]), "--out", str(tmp_path / "k.zarr")]) == 0
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        assert main([*argv, "--forecast", str(tmp_path / "celsius.nc"), "--out", str(tmp_path / "c.zarr")]) == 0
    assert any("degC" in str(w.message) for w in seen)
    k, c = xr.open_zarr(tmp_path / "k.zarr").load(), xr.open_zarr(tmp_path / "c.zarr").load()
    assert c["temperature"].attrs["units"] == "degC" and k["temperature"].attrs["units"] == "K"
    np.testing.assert_allclose(c["temperature"].values, k["temperature"].values - 273.15,
                               **float_tol(np.float32, 8, 300.0))
    np.testing.assert_allclose(c["temperature_std"].values, k["temperature_std"].values,
                               **float_tol(np.float32, 8, 10.0))
