"""Fault injection, inputs: an output never is, contains or enters an input, with or without
--overwrite (one check, :func:`smoeweather.io.check_apart`, called by every command); a method name is given
once; a name read from a file's attributes is made safe before it becomes a path or reaches the terminal; a
checkpoint is written whole or not at all; counts and model sizes are bounded before any work; an init time
repeated inside one file is refused naming the file and the time."""

from __future__ import annotations

import errno
import io
import os
import shutil
from pathlib import Path

import pandas as pd
import pytest
import torch
import xarray as xr
from test_fault_data import FAST, _fails
from test_postprocess_cli import gcm_ens_like

from smoeweather.cli import main
from smoeweather.io import OutputError, check_apart, printable, safe_component

TRAIN_FAST = ["data.world=null", "data.sources=null", "data.num_workers=0", "trainer.accelerator=cpu",
              "trainer.enable_progress_bar=false"]


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A 40-step world store and a persistence forecast of it (both read-only for the tests)."""
    from test_forecast import _store

    tmp = tmp_path_factory.mktemp("inputs")
    store = Path(_store(tmp / "world.zarr", (2000, 2000), 0, 40))
    fc = tmp / "fc.zarr"
    assert main(["forecast", "--method", "persistence", "--data", str(store), "--init", "2000-01-02", "2000-01-04",
                 "--lead", "24h", "--out", str(fc), "--no-progress"]) == 0
    return {"store": store, "fc": fc}


@pytest.fixture(scope="module")
def ens(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small gridded ensemble file (gcm_ens layout, 12 inits) with its truth inside."""
    return gcm_ens_like(tmp_path_factory.mktemp("ens") / "ens.nc", 2005, 1, n_init=12, members=4)


def _tree(path: Path) -> list[tuple[str, int]]:
    """(relative name, size) of every file under ``path``: what a command must leave as it was."""
    return sorted((str(p.relative_to(path)), p.stat().st_size) for p in path.rglob("*") if p.is_file())


def _evaluate(world: dict[str, Path], out: Path, *forecasts: str) -> list[str]:
    return ["evaluate", *forecasts, "--truth", str(world["store"]), "--no-references", "--regions", "global",
            "--quiet", "--out", str(out)]


# ---- inputs are sacred --------------------------------------------------------------------------------------

def test_check_apart_is_contains_inside_and_symlinks(tmp_path: Path) -> None:
    store = tmp_path / "data.zarr"
    (store / "z").mkdir(parents=True)
    link = tmp_path / "link.zarr"
    link.symlink_to(store)
    for out, how in ((store, "is the input"), (link, "is the input"), (store / "fc.zarr", "lies inside the input"),
                     (link / "fc.zarr", "lies inside the input"), (tmp_path, "contains the input")):
        with pytest.raises(OutputError, match=how) as err:
            check_apart(out, [store])
        assert str(out) in str(err.value) and str(store) in str(err.value) and "\n" not in str(err.value)
    check_apart(tmp_path / "other.zarr", [store, None, "gs://bucket/x.zarr"])  # a sibling, nothing, a URL: fine
    check_apart(tmp_path, [store], adds_files=True)  # a shared folder may hold inputs beside its files
    with pytest.raises(OutputError, match="lies inside"):
        check_apart(store / "figs", [store], adds_files=True)


def test_fit_out_is_the_training_ensemble(ens: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    x = tmp_path / "X.nc"
    shutil.copy(ens, x)
    before = x.read_bytes()
    _fails(["postprocess", "fit", "--forecast", str(x), "--out", str(x), "--overwrite", *FAST], capsys,
           f"output {x} is the input {x}", "--overwrite does not allow it")
    assert x.read_bytes() == before


def test_apply_out_is_the_model_and_crossval_out_contains_the_forecast(
        ens: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    model = tmp_path / "m.nc"
    assert main(["postprocess", "fit", "--forecast", str(ens), "--out", str(model), "--variables", "temperature",
                 *FAST]) == 0
    before = model.read_bytes()
    _fails(["postprocess", "apply", "--emos", str(model), "--forecast", str(ens), "--out", str(model),
            "--overwrite", *FAST], capsys, f"output {model} is the input {model}")
    assert model.read_bytes() == before
    folder = tmp_path / "cv"
    folder.mkdir()
    shutil.copy(ens, folder / "ens.nc")
    _fails(["postprocess", "crossval", "--forecast", str(folder / "ens.nc"), "--out", str(folder), "--overwrite",
            "--variables", "temperature"], capsys, f"output {folder} contains the input {folder / 'ens.nc'}")
    assert (folder / "ens.nc").read_bytes() == ens.read_bytes()


def test_synthetic_and_forecast_never_write_into_their_store(world: dict[str, Path], tmp_path: Path,
                                                             capsys: pytest.CaptureFixture) -> None:
    store = tmp_path / "gcm.zarr"
    shutil.copytree(world["store"], store)
    before = _tree(store)
    _fails(["forecast", "--method", "persistence", "--data", str(store), "--init", "2000-01-02", "2000-01-03",
            "--lead", "24h", "--out", str(store / "fc.zarr"), "--no-progress"], capsys,
           f"output {store / 'fc.zarr'} lies inside the input {store}")
    _fails(["postprocess", "synthetic", str(store), "--out", str(store), "--overwrite", "--members", "2"], capsys,
           f"output {store} is the input {store}")
    assert _tree(store) == before


def test_evaluate_out_is_the_forecast(world: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    fc = tmp_path / "F.zarr"
    shutil.copytree(world["fc"], fc)
    before = _tree(fc)
    _fails([*_evaluate(world, fc, f"d={fc}"), "--overwrite"], capsys, f"output {fc} is the input {fc}")
    assert _tree(fc) == before


def test_prepare_plot_and_train_never_write_into_an_input(world: dict[str, Path], tmp_path: Path,
                                                          capsys: pytest.CaptureFixture) -> None:
    src = tmp_path / "src.zarr"
    shutil.copytree(world["store"], src)
    before = _tree(src)
    _fails(["data", "prepare", "era5", "--source", str(src), "--out", str(src / "prepared.zarr"), "--quiet"], capsys,
           f"output {src / 'prepared.zarr'} lies inside the input {src}")
    _fails(["plot", "forecast", str(src), "--truth", str(world["store"]), "--field", "temperature_850", "--lead",
            "24h", "--init", "2000-01-02", "--out", str(src)], capsys, f"output {src} is the input {src}")
    _fails(["train", "--config", "weatherbench/world_dense", f"output_dir={src / 'run'}", f"data.store={src}",
            *TRAIN_FAST, "trainer.max_steps=1"], capsys, f"output {src / 'run'} lies inside the input {src}")
    assert _tree(src) == before


def test_evaluate_refuses_a_method_name_given_twice(world: dict[str, Path], tmp_path: Path,
                                                    capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "scores"
    _fails(_evaluate(world, out, f"a={world['fc']}", f"a={world['store']}", f"b={world['fc']}"), capsys,
           "method name 'a' is given twice", str(world["store"]))
    assert not out.exists()


def test_method_attribute_dotdot_is_refused_and_escapes_never_reach_the_terminal(
        world: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    ds = _loaded(world["fc"])
    dots = tmp_path / "dots.zarr"
    ds.assign_attrs(method="..").to_zarr(dots, zarr_format=2)
    out = tmp_path / "root" / "scores"
    _fails(_evaluate(world, out, str(dots)), capsys, f"{dots}: its method attribute '..' cannot name a method",
           f"NAME={dots}")
    assert not (tmp_path / "root").exists()  # no wb2/../deterministic.nc beside the scores
    red = tmp_path / "red.zarr"
    ds.assign_attrs(method="\x1b[31mred\x1b]0;pwned\x07").to_zarr(red, zarr_format=2)
    capsys.readouterr()
    assert main(_evaluate(world, out, str(red))) == 0
    printed = capsys.readouterr()
    assert "\x1b" not in printed.out + printed.err and "\x07" not in printed.out + printed.err
    assert "[31mred" in printed.out
    assert [p.name for p in (out / "wb2").iterdir()] == [safe_component(printable("\x1b[31mred\x1b]0;pwned\x07"),
                                                                        "method")]


def test_safe_names() -> None:
    assert printable("a\x1b[2Jb\r\nc\u202ed") == "a[2Jb cd"
    assert safe_component("SMoE (ours)/v2", "method name") == "SMoE__ours__v2"
    for bad in ("", ".", ".."):
        with pytest.raises(ValueError, match="cannot name a file or folder"):
            safe_component(bad, "method name")


# ---- a checkpoint is written whole or not at all -------------------------------------------------------------

def _failing_cross_device_copy(monkeypatch: pytest.MonkeyPatch) -> None:
    """A checkpoint staged on another file system whose disk fills during the copy: ``os.rename`` says EXDEV
    (shutil.move then copies) and the copy stops half-way with ENOSPC."""
    real_rename = os.rename

    def rename(src: str, dst: str, *args: object, **kwargs: object) -> None:
        if str(dst).endswith(".ckpt") or ".ckpt" in str(dst):
            raise OSError(errno.EXDEV, "Invalid cross-device link", str(src), None, str(dst))
        real_rename(src, dst, *args, **kwargs)

    def copyfile(src: str, dst: str, *args: object, **kwargs: object) -> str:
        data = Path(src).read_bytes()
        Path(dst).write_bytes(data[: len(data) // 2])
        raise OSError(errno.ENOSPC, "No space left on device", str(dst))

    monkeypatch.setattr(os, "rename", rename)
    monkeypatch.setattr(shutil, "copyfile", copyfile)


def _failing_second_save(monkeypatch: pytest.MonkeyPatch) -> None:
    """The disk fills while the second checkpoint is written: half its bytes reach the file, then ENOSPC."""
    real_save, calls = torch.save, []

    def save(obj: object, f: object, *args: object, **kwargs: object) -> None:
        calls.append(f)
        if len(calls) < 2:
            return real_save(obj, f, *args, **kwargs)
        buf = io.BytesIO()
        real_save(obj, buf, *args, **kwargs)
        f.write(buf.getvalue()[: len(buf.getvalue()) // 2])
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(torch, "save", save)


@pytest.mark.parametrize("failure", [_failing_cross_device_copy, _failing_second_save])
def test_a_full_disk_leaves_no_unreadable_checkpoint(tmp_path: Path, gcm_ens_streams: dict[str, Path],
                                                     monkeypatch: pytest.MonkeyPatch, failure: object) -> None:
    from test_checkpoint_safety import _train_args

    failure(monkeypatch)
    try:
        main(_train_args(tmp_path / "run", gcm_ens_streams["a"]))
    except OSError:
        pass  # the full disk: an error, as it should be
    monkeypatch.undo()
    folder = tmp_path / "run" / "checkpoints"
    files = sorted(folder.iterdir()) if folder.exists() else []
    assert [p.name for p in files if p.name.startswith(".")] == []  # no staging or temporary file left
    for path in files:  # every checkpoint that is there reads whole
        assert "state_dict" in torch.load(path, map_location="cpu", weights_only=True), path
    if failure is _failing_second_save:
        assert files, "the checkpoint written before the failure is kept"


# ---- bounds before work --------------------------------------------------------------------------------------

@pytest.mark.parametrize("n", ["0", "-5"])
def test_iterations_below_one_are_refused(ens: Path, tmp_path: Path, capsys: pytest.CaptureFixture, n: str) -> None:
    for verb in ("fit", "crossval"):
        out = tmp_path / f"{verb}.out"
        _fails(["postprocess", verb, "--forecast", str(ens), "--iterations", n, "--out", str(out),
                *(FAST if verb == "fit" else [])], capsys, f"--iterations must be >= 1, got {n}",
               "set e.g. --iterations 50")
        assert not out.exists()


@pytest.mark.parametrize("override,needle", [
    ("model.blocks=100000000", "model.blocks=100000000"),
    ("model.width=100000000", "model.width=100000000"),
])
def test_a_model_too_large_is_refused_with_its_estimate_before_it_is_built(
        tmp_path: Path, capsys: pytest.CaptureFixture, override: str, needle: str) -> None:
    line = _fails(["train", "--config", "weatherbench/world_dense", f"output_dir={tmp_path / 'run'}", override,
                   f"data.store={tmp_path / 'none.zarr'}", *TRAIN_FAST], capsys,
                  "the network would have about", "parameters", "GiB to train", needle)
    assert "2^31" in line or "RAM" in line
    assert not (tmp_path / "run").exists() and not (tmp_path / "none.zarr").exists()


@pytest.mark.parametrize("override", ["trainer.max_epochs=0", "trainer.max_steps=0", "trainer.max_epochs=-3"])
def test_a_fit_of_zero_epochs_or_steps_is_refused(world_store: str, tmp_path: Path, capsys: pytest.CaptureFixture,
                                                  override: str) -> None:
    _fails(["train", "--config", "weatherbench/world_dense", f"output_dir={tmp_path / 'run'}",
            f"data.store={world_store}", *TRAIN_FAST, override], capsys,
           f"config key '{override.split('=')[0]}' must be >= 1", "no checkpoint")
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("steps", ["0", "-3"])
def test_demo_steps_below_one_name_the_option(tmp_path: Path, capsys: pytest.CaptureFixture, steps: str) -> None:
    _fails(["demo", "--steps", steps, "--out", str(tmp_path / "demo")], capsys, f"--steps {steps}")
    assert not (tmp_path / "demo").exists()


def _repeat_init(ds: xr.Dataset, i: int) -> xr.Dataset:
    return xr.concat([ds, ds.isel(time=[i])], "time", data_vars="minimal", coords="minimal", compat="override")


def _loaded(path: Path) -> xr.Dataset:
    """The store at ``path`` in memory, without its on-disk encodings (to be written anew)."""
    ds = xr.open_zarr(path).load()
    for var in ds.variables.values():
        var.encoding = {}
    return ds


def test_an_init_repeated_inside_one_file_is_refused_by_fit(ens: Path, tmp_path: Path,
                                                            capsys: pytest.CaptureFixture) -> None:
    ds = xr.open_dataset(ens).load()
    twice = tmp_path / "twice.nc"
    _repeat_init(ds, 3).to_netcdf(twice)
    when = str(pd.Timestamp(ds["time"].values[3]))
    _fails(["postprocess", "fit", "--forecast", str(twice), "--out", str(tmp_path / "m.nc"), *FAST], capsys,
           str(twice), when, "more than once in this file")
    assert not (tmp_path / "m.nc").exists()


def test_an_init_repeated_inside_a_forecast_is_refused_by_evaluate(world: dict[str, Path], tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture) -> None:
    ds = _loaded(world["fc"])
    twice = tmp_path / "twice.zarr"
    _repeat_init(ds, 1).to_zarr(twice, zarr_format=2)
    _fails(_evaluate(world, tmp_path / "scores", str(twice)), capsys, f"forecast {twice}",
           str(pd.Timestamp(ds["time"].values[1])), "more than once")
