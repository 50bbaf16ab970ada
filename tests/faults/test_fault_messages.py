"""Fault injection, the messages: every error a user can cause is one line on stderr naming the file,
option or config key, with exit status 2 and no traceback (``--debug`` keeps it). Each case below was a traceback
or a library's text naming nothing (xarray's "no matching backend", blosc's "error during decompression", pandas'
"unit abbreviation w/o a number", range()'s "arg 3 must not be zero", numpy's seed bounds, a raw ENOSPC) or a
misleading message ("missing []", "does not exist" for a folder, "try --fold month" when that was given)."""

from __future__ import annotations

import errno
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from test_fault_data import FAST, _fails
from test_postprocess_cli import gcm_ens_like
from test_sites import srft_like

from smoeweather.cli import main

FORMATS = "expected netCDF-3/4 (.nc), a zarr store"
NO_SPACE = "no space left on device while writing it"


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Eight days of the default world as a prepared store (zarr, blosc chunks of 4 steps)."""
    from pipelines.prepare import write_store
    from pipelines.world import simulate_world

    path = tmp_path_factory.mktemp("world") / "world.zarr"
    ds = simulate_world((2000, 2000), seed=0, n_steps=32)
    write_store(lambda: ds, path, args={"test": "messages"}, train_years=None, source="test", time_chunk=4,
                scheduler="synchronous", progress=False)
    return path


@pytest.fixture(scope="module")
def forecast(store: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("fc") / "fc.zarr"
    assert main(["forecast", "--method", "persistence", "--data", str(store), "--init", "2000-01-02",
                 "2000-01-03", "--lead", "24h", "--out", str(out), "--no-progress"]) == 0
    return out


def test_forecast_init_takes_one_time_or_two(store: Path, forecast: Path, tmp_path: Path,
                                             capsys: pytest.CaptureFixture) -> None:
    """`--init T` forecasts that one init (the same values as T within START END); three times, or a time that is
    no date, are one line naming --init and the bad value."""
    import xarray as xr

    one = tmp_path / "one.zarr"
    assert main(["forecast", "--method", "persistence", "--data", str(store), "--init", "2000-01-03", "--lead",
                 "24h", "--out", str(one), "--no-progress"]) == 0
    got, both = xr.open_zarr(one), xr.open_zarr(forecast)
    assert list(got["time"].values) == [np.datetime64("2000-01-03T00", "ns")]
    xr.testing.assert_equal(got.compute(), both.sel(time=["2000-01-03"]).compute())
    capsys.readouterr()
    for init, words in ((["2000-01-02", "2000-01-03", "2000-01-04"], "got 3: 2000-01-02 2000-01-03 2000-01-04"),
                        (["2000-01-02", "soon"], "--init 'soon': not a date")):
        assert main(["forecast", "--method", "persistence", "--data", str(store), "--init", *init, "--lead", "24h",
                     "--out", str(tmp_path / "bad.zarr"), "--no-progress"]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and words in err, err
    assert not (tmp_path / "bad.zarr").exists()


@pytest.fixture(scope="module")
def csv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("t") / "t.csv"
    srft_like(path, n_days=20, n_sites=3)
    return path


@pytest.fixture(scope="module")
def bad_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("bad")
    (folder / "empty.nc").write_bytes(b"")
    (folder / "notes.nc").write_text("hello, these are notes\n")
    return {"empty": folder / "empty.nc", "text": folder / "notes.nc"}


def _truncated_copy(source: Path, folder: Path, variable: str = "temperature") -> tuple[Path, Path]:
    """A copy of the zarr store ``source`` whose first chunk of ``variable`` is cut to 100 bytes."""
    copy = folder / source.name
    shutil.copytree(source, copy)
    chunk = sorted(p for p in (copy / variable).rglob("*") if p.is_file() and not p.name.startswith((".", "zarr")))[0]
    chunk.write_bytes(chunk.read_bytes()[:100])
    return copy, chunk


# -- input files: empty, text, truncated chunks ----------------------------------------------------------------------
@pytest.mark.parametrize("kind,needle", [("empty", "is empty (0 bytes"),
                                         ("text", "is not a netCDF, zarr or GRIB file")])
def test_an_empty_or_text_input_is_named_with_the_formats_read(
        kind: str, needle: str, bad_files: dict[str, Path], store: Path, forecast: Path, csv: Path, tmp_path: Path,
        capsys: pytest.CaptureFixture) -> None:
    """xarray said "did not find a match in any of xarray's currently installed IO backends" and named no file."""
    bad = str(bad_files[kind])
    for argv in (["forecast", "--method", "persistence", "--data", bad, "--init", "2000-01-02", "2000-01-03",
                  "--out", str(tmp_path / "f.zarr"), "--no-progress"],
                 ["evaluate", bad, "--truth", str(store), "--out", str(tmp_path / "ev"), "--quiet"],
                 ["evaluate", str(forecast), "--truth", bad, "--out", str(tmp_path / "ev"), "--quiet"],
                 ["postprocess", "fit", "--forecast", bad, "--out", str(tmp_path / "m.nc"), *FAST],
                 ["data", "prepare", "world", "--source", bad, "--out", str(tmp_path / "p.zarr"), "--quiet",
                  "--scheduler", "threads"],
                 ["postprocess", "synthetic", bad, "--out", str(tmp_path / "s.zarr")]):
        line = _fails(argv, capsys, bad, needle, FORMATS)
        assert "IO backends" not in line
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_a_forecast_given_as_truth_training_data_or_forecast_input_is_named(forecast: Path, tmp_path: Path,
                                                                            capsys: pytest.CaptureFixture) -> None:
    """xarray said "('time', 'latitude', 'longitude') must be a permuted list of ('time', 'prediction_timedelta',
    ...)" and named no file; training said the forecast's geopotential "has no level 250 hPa"."""
    _fails(["evaluate", str(forecast), "--truth", str(forecast), "--out", str(tmp_path / "ev"), "--quiet"], capsys,
           f"truth {forecast}", "prediction_timedelta", "the truth must be data on valid times")
    _fails(["train", "--config", "weatherbench/world_dense.yaml", f"data.store={forecast}", "data.world=null",
            f"output_dir={tmp_path / 'run'}"], capsys, str(forecast), "a forecast", "a training store must be")
    _fails(["forecast", "--method", "persistence", "--data", str(forecast), "--init", "2000-01-02", "--lead", "24h",
            "--out", str(tmp_path / "fc.zarr"), "--no-progress"], capsys, str(forecast),
           "the input of a forecast must be data on valid times")
    _fails(["plot", "forecast", str(forecast), "--truth", str(forecast), "--field", "geopotential_500", "--lead",
            "24h", "--init", "2000-01-02", "--out", str(tmp_path / "maps")], capsys, f"truth {forecast}",
           "the truth must be data on valid times")
    assert not (tmp_path / "ev").exists() and not (tmp_path / "run").exists() and not (tmp_path / "fc.zarr").exists()
    assert not (tmp_path / "maps").exists()


def test_plot_scores_names_a_json_summary_or_a_text_file(bad_files: dict[str, Path], tmp_path: Path,
                                                         capsys: pytest.CaptureFixture) -> None:
    """xarray's "did not find a match in any of xarray's currently installed IO backends" named no file."""
    summary = tmp_path / "ev" / "scores.json"
    summary.parent.mkdir()
    summary.write_text('{"units": {}}\n')
    _fails(["plot", "scores", str(summary), "--out", str(tmp_path / "p")], capsys, str(summary), "JSON summary",
           str(summary.with_suffix(".nc")))
    _fails(["plot", "scores", str(bad_files["text"]), "--out", str(tmp_path / "p")], capsys,
           str(bad_files["text"]), "a text file?")
    assert not (tmp_path / "p").exists()


def test_a_truncated_zarr_chunk_is_named_in_prepare_and_evaluate(
        store: Path, forecast: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """blosc's "RuntimeError: error during blosc decompression: -1" was a traceback, naming no store."""
    cut_store, chunk = _truncated_copy(store, tmp_path / "a")
    _fails(["data", "prepare", "world", "--source", str(cut_store), "--out", str(tmp_path / "p.zarr"), "--quiet",
            "--scheduler", "threads"], capsys, str(chunk), "truncated zarr chunk", f"the store {cut_store}")
    cut_fc, chunk = _truncated_copy(forecast, tmp_path / "b")
    _fails(["evaluate", str(cut_fc), "--truth", str(store), "--out", str(tmp_path / "ev"), "--quiet",
            "--no-references"], capsys, str(chunk), "truncated zarr chunk")
    assert not (tmp_path / "p.zarr").exists() and not (tmp_path / "ev").exists()


# -- a full disk -----------------------------------------------------------------------------------------------------
def _fill_disk(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every zarr chunk or metadata write fails as on a full disk: OSError(ENOSPC) without a file name."""
    from zarr.storage import _local

    def no_space(*args: object, **kwargs: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(_local, "_put", no_space)


@pytest.fixture
def full_disk(monkeypatch: pytest.MonkeyPatch) -> None:
    _fill_disk(monkeypatch)


@pytest.mark.usefixtures("full_disk")
def test_a_full_disk_names_the_output(store: Path, csv: Path, tmp_path: Path, capsys: pytest.CaptureFixture,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """ENOSPC was a raw OSError traceback in postprocess fit and apply and in data prepare. (The fit stages on disk
    here, as an archive over the in-memory budget does; a full disk at the model file: the netCDF test below.)"""
    from smoeweather.postprocess import chunked

    monkeypatch.setattr(chunked, "MEMORY_BYTES", 0)
    model = tmp_path / "m.nc"
    _fails(["postprocess", "fit", "--forecast", str(csv), "--out", str(model), *FAST], capsys, str(model), NO_SPACE)
    out = tmp_path / "p.zarr"
    _fails(["data", "prepare", "world", "--source", str(store), "--out", str(out), "--quiet", "--scheduler",
            "threads"], capsys, str(out), NO_SPACE, "free some space")
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # no staging, no partial output


def test_a_full_disk_in_apply_names_the_output(csv: Path, tmp_path: Path, capsys: pytest.CaptureFixture,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    model, out = tmp_path / "m.nc", tmp_path / "pp.zarr"
    assert main(["postprocess", "fit", "--forecast", str(csv), "--out", str(model), *FAST]) == 0
    _fill_disk(monkeypatch)
    _fails(["postprocess", "apply", "--emos", str(model), "--forecast", str(csv), "--out", str(out), *FAST], capsys,
           str(out), NO_SPACE)
    assert not out.exists()


def test_a_netcdf_write_error_on_a_full_disk_names_the_output(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """netCDF-C reports a full disk as "RuntimeError: NetCDF: HDF error" (no errno): taken for one when the disk
    has (almost) no space left, and only then."""
    import xarray as xr

    from pipelines import atomic

    ds = xr.Dataset({"a": ("x", [1.0, 2.0])})

    def hdf_error(self: xr.Dataset, path: object, *args: object, **kwargs: object) -> None:
        raise RuntimeError("NetCDF: HDF error")

    monkeypatch.setattr(xr.Dataset, "to_netcdf", hdf_error)
    monkeypatch.setattr(atomic, "_free_bytes", lambda path: 4096)
    with pytest.raises(atomic.OutputError, match=rf"{tmp_path / 'scores'}: {NO_SPACE} \(NetCDF: HDF error; 4 KiB"):
        with atomic.atomic_output(tmp_path / "scores", kind="dir") as tmp:
            atomic.write_netcdf(ds, tmp / "scores.nc")  # the inner file is in the staging: the output is named
    monkeypatch.setattr(atomic, "_free_bytes", lambda path: 10 * 2**30)
    with pytest.raises(RuntimeError, match="HDF error"):  # space enough: not a full disk, the error unchanged
        atomic.write_netcdf(ds, tmp_path / "a.nc")
    assert sorted(p.name for p in tmp_path.iterdir()) == []


# -- options of smoe forecast ----------------------------------------------------------------------------------------
def _forecast(store: Path, tmp_path: Path, *extra: str) -> list[str]:
    return ["forecast", str(tmp_path / "model.ckpt"), "--data", str(store), "--init", "2000-01-02", "2000-01-03",
            "--out", str(tmp_path / "f.zarr"), "--no-progress", *extra]


@pytest.mark.parametrize("extra,needles", [
    (["--lead", "abc"], ["--lead 'abc'", "a positive whole number of hours, e.g. 72h"]),
    (["--lead=-6h"], ["--lead '-6h'"]),
    (["--batch-size", "0"], ["--batch-size must be a whole number >= 1, got 0; set e.g. --batch-size 16"]),
    (["--batch-size", "-2"], ["--batch-size must be a whole number >= 1, got -2"]),
    (["--device", "banana"], ["--device 'banana' is not a torch device"]),
    (["--every", "abc"], ["--every 'abc': not a duration"]),
])
def test_forecast_options_are_checked_by_name_before_anything_is_read(
        extra: list[str], needles: list[str], store: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """"unit abbreviation w/o a number", "range() arg 3 must not be zero", torch's device-string RuntimeError; a
    negative batch size wrote an empty forecast with exit 0. Refused before the (here missing) checkpoint is read."""
    line = _fails(_forecast(store, tmp_path, *extra), capsys, *needles)
    assert "model.ckpt" not in line and not (tmp_path / "f.zarr").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA device: --device cuda is valid")
def test_forecast_device_cuda_on_a_cpu_build(store: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """"AssertionError: Torch not compiled with CUDA enabled" was a traceback."""
    _fails(_forecast(store, tmp_path, "--device", "cuda"), capsys, "--device cuda: no such CUDA device",
           "use one of cpu")


# -- smoe train: config and overrides -----------------------------------------------------------------------------
def _train(tmp_path: Path, *overrides: str, config: str = "weatherbench/world_dense") -> list[str]:
    return ["train", "--config", config, f"output_dir={tmp_path / 'run'}", f"data.store={tmp_path / 'store.zarr'}",
            *overrides]


@pytest.mark.parametrize("override,needles", [
    ("model.width=[8", ["override 'model.width=[8': the value '[8' is not valid YAML", "close its brackets"]),
    ("seed=-1", ["config key 'seed' must be >= 0 and <= 4294967295, got -1; set e.g. seed=0"]),
    ("data.train_period=[2000-03-01, 2000-01-01]",
     ["config key 'data.train_period' ends before it starts (2000-03-01 > 2000-01-01)"]),
    ("data.valid_years=[2003, 2002]", ["config key 'data.valid_years' ends before it starts"]),
    ("trainer.accelerator=tpu", ["config key 'trainer.accelerator' is 'tpu', but this machine has no such device",
                                 "use one of auto, cpu"]),
    ("trainer.accelerator=gpu", ["config key 'trainer.accelerator' is 'gpu', but this machine has no such device"]),
    ("trainer.accelerator=banana", ["config key 'trainer.accelerator' must be one of auto, gpu, cpu, cuda, mps, tpu"]),
])
def test_train_config_errors_name_the_key(override: str, needles: list[str], tmp_path: Path,
                                          capsys: pytest.CaptureFixture) -> None:
    """An unclosed bracket was a yaml traceback; seed=-1 numpy's "-1 is not in bounds"; a reversed period "missing
    []" or "no samples"; tpu an import-error traceback (torch_xla)."""
    if override.startswith("trainer.accelerator=") and not override.endswith("banana"):
        from lightning.pytorch.accelerators import XLAAccelerator

        if XLAAccelerator.is_available() if override.endswith("tpu") else torch.cuda.is_available():
            pytest.skip(f"this machine has the device of {override}")
    _fails(_train(tmp_path, override), capsys, *needles)
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # refused before any store or run was made


def test_train_config_that_is_a_folder(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """"config file DIR does not exist": it does, as a folder."""
    folder = tmp_path / "configs"
    folder.mkdir()
    (folder / "mine.yaml").write_text("defaults: []\n")
    _fails(["train", "--config", str(folder)], capsys, f"--config {folder} is a folder",
           f"give a YAML config file in it, e.g. {folder / 'mine.yaml'}")


# -- smoe postprocess crossval ---------------------------------------------------------------------------------------
def test_crossval_on_one_month_does_not_suggest_the_fold_given(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """"only one month … (try --fold month)" was said to --fold month itself."""
    ens = gcm_ens_like(tmp_path / "ens.nc", 2005, 1, n_init=6)  # 12 days of January
    line = _fails(["postprocess", "crossval", "--forecast", str(ens), "--fold", "month", "--out",
                   str(tmp_path / "cv")], capsys, "--fold month", "2005-01-01 .. 2005-01-11", "lie in one month")
    assert "try --fold month" not in line
    _fails(["postprocess", "crossval", "--forecast", str(ens), "--out", str(tmp_path / "cv")], capsys,
           "--fold year", "give a forecast spanning more time")  # one month: --fold month would not help either


def test_an_ensemble_dim_that_is_an_axis_is_named(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """xarray's "the new name 'member' conflicts" named neither the option nor the file."""
    ens = gcm_ens_like(tmp_path / "ens.nc", 2005, 1, n_init=4)
    _fails(["evaluate", str(ens), "--truth", str(ens), "--out", str(tmp_path / "ev"), "--quiet", "--no-references",
            "--ensemble-dim", "level"], capsys, f"forecast {ens}: --ensemble-dim 'level' cannot be its ensemble dim",
           "the forecast has a member dim")


def test_debug_keeps_the_traceback(bad_files: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    argv = ["forecast", "--method", "persistence", "--data", str(bad_files["text"]), "--init", "2000-01-02",
            "2000-01-03", "--out", str(tmp_path / "f.zarr"), "--debug"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" in err and "DataError" in err and "is not a netCDF, zarr or GRIB file" in err


def test_a_short_blosc_chunk_is_refused_before_c_blosc_reads_past_it() -> None:
    """numcodecs handed c-blosc a truncated chunk as it was, and c-blosc read past its end: mostly an error -1, at
    a page boundary a dead process (a test worker died so). The header is read first now; whole chunks still
    decode."""
    import numcodecs
    import numpy as np

    import pipelines.readers._files  # noqa: F401  (installs the guard)

    codec = numcodecs.Blosc()
    data = np.arange(10_000, dtype="f8")
    chunk = codec.encode(data)
    np.testing.assert_array_equal(np.frombuffer(codec.decode(chunk)), data)  # lossless: the same bytes
    for short in (chunk[:100], chunk[:10]):
        with pytest.raises(RuntimeError, match="error during blosc decompression: truncated chunk"):
            codec.decode(short)
