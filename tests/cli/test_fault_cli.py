"""Fault injection, the command line: user errors are one line naming the option or file (exit 2,
no traceback unless --debug); misspelt verbs get a did-you-mean; outputs are checked before anything is
computed and again at the write, so a concurrent writer is never replaced; forecast and plot take --overwrite."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import xarray as xr
from test_fault_data import FAST, _fails, _write
from test_sites import srft_like

from pipelines import atomic
from smoeweather.cli import main


@pytest.fixture(scope="module")
def csv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("t") / "t.csv"
    srft_like(path, n_days=20, n_sites=3)
    return path


def _err(capsys: pytest.CaptureFixture, argv: list[str]) -> str:
    capsys.readouterr()
    with pytest.raises(SystemExit) as stop:
        main(argv)
    assert stop.value.code == 2
    return capsys.readouterr().err


def test_misspelt_verbs_get_a_did_you_mean_and_options_are_not_blamed(capsys: pytest.CaptureFixture) -> None:
    err = _err(capsys, ["trian", "--config", "x.yaml"])
    assert "unknown command 'trian'; did you mean train?" in err and "--config" not in err
    err = _err(capsys, ["data", "gcm-enz", "--out", "x"])
    assert "unknown command 'gcm-enz'; did you mean gcm-ens?" in err
    assert "data_verb" not in err and "invalid choice" not in err
    assert "say what to do: one of prepare" in _err(capsys, ["data"])


def test_gcm_dt_minutes_zero_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    for dt in ("0", "-5", "7"):
        _fails(["data", "gcm-ens", "--out", str(tmp_path / "g"), "--dt-minutes", dt], capsys,
               f"--dt-minutes {dt}", "divides 6 hours")
    assert not (tmp_path / "g").exists()


def test_debug_shows_the_traceback_of_a_user_error(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    (tmp_path / "empty.csv").write_text("")
    argv = ["postprocess", "fit", "--forecast", str(tmp_path / "empty.csv"), "--out", str(tmp_path / "m.nc"), *FAST]
    assert main(argv) == 2 and "Traceback" not in capsys.readouterr().err
    assert main([*argv, "--debug"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" in err and "empty file" in err


def test_os_errors_naming_a_file_are_one_line() -> None:
    from smoeweather.cli import user_message

    msg = user_message(PermissionError(13, "Permission denied", "/data/out.nc"))
    assert msg == "/data/out.nc: Permission denied"
    msg = user_message(OSError(-101, "NetCDF: HDF error", "/data/cut.nc"))
    assert msg.startswith("/data/cut.nc: cannot read this netCDF file (NetCDF: HDF error)") and "\n" not in msg
    assert user_message(ValueError("line one\nline two")) == "line one; line two"
    assert user_message(TypeError("a bug")) is None  # bugs keep their traceback


@pytest.mark.parametrize("name,content,needle", [
    ("model.txt", b"hello\n", "is not a PyTorch/Lightning checkpoint (it starts with b'hello\\n')"),
    ("config.yaml", b"model:\n  width: 8\n", "is not a PyTorch/Lightning checkpoint"),
    ("store.zarr", None, "is a folder (a zarr store?), not a checkpoint"),
])
def test_forecast_from_a_file_that_is_no_checkpoint(tmp_path: Path, capsys: pytest.CaptureFixture, name: str,
                                                    content: bytes | None, needle: str) -> None:
    path = tmp_path / name
    if content is None:
        path.mkdir()
    else:
        path.write_bytes(content)
    line = _fails(["forecast", str(path), "--data", str(tmp_path / "nowhere.zarr"), "--init", "2003-01-01",
                   "2003-01-02", "--out", str(tmp_path / "fc.zarr")], capsys, str(path), needle)
    assert "--trust" not in line and "does not exist" not in line


def test_read_only_folder_and_out_under_a_file_are_refused_before_computing(
        csv: Path, tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    from smoeweather.postprocess import pipeline

    def never(*args: object, **kwargs: object) -> None:
        raise AssertionError("the inputs were read before the output was checked")

    monkeypatch.setattr(pipeline, "open_forecast_and_truth", never)
    ro = tmp_path / "ro"
    ro.mkdir()
    real = os.access
    monkeypatch.setattr(atomic.os, "access", lambda p, m: False if Path(p) == ro else real(p, m))
    _fails(["postprocess", "fit", "--forecast", str(csv), "--out", str(ro / "m.nc"), *FAST], capsys,
           f"no permission to write in the folder {ro}")
    (tmp_path / "afile").write_text("x")
    _fails(["postprocess", "apply", "--emos", str(tmp_path / "m.nc"), "--forecast", str(csv), "--out",
            str(tmp_path / "afile" / "pp.zarr"), *FAST], capsys, "afile, which is a file, not a folder")
    _fails(["postprocess", "fit", "--method", "drn", "--forecast", str(csv), "--out", str(ro / "m.nc")], capsys,
           "no permission")


def test_apply_never_replaces_an_output_another_run_wrote_meanwhile(
        csv: Path, tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two `smoe postprocess apply` runs on one --out: the existence check is repeated at the write (the
    other run, simulated here, commits its store while this one computes)."""
    from smoeweather.postprocess import chunked

    model, out = tmp_path / "m.nc", tmp_path / "pp.zarr"
    assert main(["postprocess", "fit", "--forecast", str(csv), "--out", str(model), *FAST]) == 0
    real = chunked.compute

    def other_run_wins(obj: object, client: object, progress: bool, label: str) -> object:
        if label.startswith("writing") and not out.exists():
            out.mkdir()
            (out / "theirs").write_text("the other run's store")
        return real(obj, client, progress, label)

    monkeypatch.setattr(chunked, "compute", other_run_wins)
    _fails(["postprocess", "apply", "--emos", str(model), "--forecast", str(csv), "--out", str(out), *FAST],
           capsys, f"{out} already exists (another run wrote it while this one ran")
    assert (out / "theirs").read_text() == "the other run's store"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.nc", "pp.zarr"]  # no staging left


def test_fit_twice_needs_overwrite(csv: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    model = tmp_path / "m.nc"
    argv = ["postprocess", "fit", "--forecast", str(csv), "--out", str(model), *FAST]
    assert main(argv) == 0
    stamp = model.stat().st_mtime_ns
    _fails(argv, capsys, f"{model} already exists (pass --overwrite to replace it)")
    assert model.stat().st_mtime_ns == stamp
    assert main([*argv, "--overwrite"]) == 0


def test_forecast_has_overwrite(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from test_forecast import _store

    store = _store(tmp_path / "world.zarr", (2000, 2000), 0, 40)
    out = tmp_path / "persistence.zarr"
    argv = ["forecast", "--method", "persistence", "--data", store, "--init", "2000-01-02", "2000-01-03",
            "--lead", "24h", "--out", str(out), "--no-progress"]
    assert main(argv) == 0
    first = xr.open_zarr(out).load()
    _fails(argv, capsys, f"{out} already exists (pass --overwrite to replace it)")
    assert main([*argv, "--overwrite"]) == 0
    xr.testing.assert_equal(xr.open_zarr(out).load(), first)  # the same values (the creation time differs)


def test_plot_adds_files_only_with_overwrite_and_a_failed_plot_adds_none(
        tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    leads = np.array([24, 72], "timedelta64[h]").astype("timedelta64[ns]")
    scores = xr.Dataset({"rmse": (("method", "field", "prediction_timedelta"), np.arange(8.0).reshape(2, 2, 2))},
                        coords={"method": ["smoe", "persistence"], "field": ["geopotential_500", "temperature_850"],
                                "prediction_timedelta": leads})
    scores.to_netcdf(tmp_path / "scores.nc")
    out = tmp_path / "figs"
    out.mkdir()
    (out / "mine.txt").write_text("the user's file")  # a shared folder: other files stay
    argv = ["plot", "scores", str(tmp_path / "scores.nc"), "--out", str(out)]
    assert main(argv) == 0
    png = out / "scores_rmse.png"
    stamp = png.stat().st_mtime_ns
    _fails(argv, capsys, f"{png} already exists", "--overwrite")
    assert png.stat().st_mtime_ns == stamp
    assert main([*argv, "--overwrite"]) == 0
    assert (out / "mine.txt").read_text() == "the user's file"
    before = sorted(p.name for p in tmp_path.rglob("*"))
    assert main(["plot", "scorecard", str(tmp_path / "scores.nc"), "--baseline", "nobody", "--out",
                 str(tmp_path / "card")]) == 2
    assert sorted(p.name for p in tmp_path.rglob("*")) == before  # nothing new, not even the folder


def test_table_units_reach_the_applied_store(csv: Path, tmp_path: Path) -> None:
    df = pd.read_csv(csv)
    wind = _write(df.assign(observation=df["observation"].abs()), tmp_path / "w.csv")
    assert main(["postprocess", "fit", "--forecast", str(wind), "--units", "degC", "--out", str(tmp_path / "m.nc"),
                 *FAST]) == 0
    assert main(["postprocess", "apply", "--emos", str(tmp_path / "m.nc"), "--forecast", str(wind), "--units",
                 "degC", "--out", str(tmp_path / "pp.zarr"), *FAST]) == 0
    assert xr.open_zarr(tmp_path / "pp.zarr")["2m_temperature"].attrs.get("units") == "degC"
