"""The small things a forecaster meets at the command line: `smoe plot --out` is a folder (a file name is
refused), every plot of scores reads the folder `smoe evaluate --out` wrote, `--thresholds` are scored and tabled
for their own field only, and a warning prints as one line of ours."""

from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import xarray as xr

from pipelines.prepare import write_store
from smoeweather.cli import main

LAT = np.linspace(-78.75, 78.75, 8)
LON = np.arange(16) * 22.5
TIMES = np.arange(np.datetime64("2001-01-01", "ns"), np.datetime64("2001-01-11", "ns"), np.timedelta64(12, "h"))
LEADS = np.array([24], "timedelta64[h]").astype("timedelta64[ns]")
INITS = TIMES[4:16:2]


def _show_like_python(monkeypatch: pytest.MonkeyPatch) -> None:
    """Warnings shown as Python shows them outside pytest (through :func:`warnings.formatwarning`, to stderr),
    every time."""

    def show(message, category, filename, lineno, file=None, line=None) -> None:  # noqa: ANN001
        sys.stderr.write(warnings.formatwarning(message, category, filename, lineno, line))

    monkeypatch.setattr(warnings, "showwarning", show)
    monkeypatch.setattr(warnings, "filters", [("always", None, Warning, None, 0)])


def _calibration_scores(folder: Path) -> Path:
    """A scores.nc of `smoe evaluate` in ``folder`` with a reliability table, PIT histogram and RMSE."""
    folder.mkdir()
    bins = (np.arange(10) + 0.5) / 10
    coords = {"method": ["raw"], "field": ["temperature_850"], "threshold": [279.0], "prediction_timedelta": LEADS,
              "probability_bin": bins}
    shape = (1, 1, 1, 1, 10)
    dims = tuple(coords)
    xr.Dataset({"reliability_forecast_probability": (dims, np.broadcast_to(bins, shape)),
                "reliability_observed_frequency": (dims, np.broadcast_to(bins, shape)),
                "reliability_count": (dims, np.ones(shape)),
                "pit_histogram": (("method", "field", "prediction_timedelta", "pit_bin"), np.full((1, 1, 1, 10), 0.1)),
                "rmse": (("method", "field", "prediction_timedelta"), np.ones((1, 1, 1)))},
               coords={**coords, "pit_bin": bins, "units": ("field", ["K"])}).to_netcdf(folder / "scores.nc")
    return folder


@pytest.mark.parametrize("out", ["rel.png", "figs/rel.PDF", "maps.svg", "a.jpg"])
def test_plot_out_naming_a_figure_is_refused(tmp_path: Path, out: str, capsys: pytest.CaptureFixture) -> None:
    scores = _calibration_scores(tmp_path / "eval") / "scores.nc"
    assert main(["plot", "reliability", str(scores), "--out", str(tmp_path / out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--out" in err and "expected the folder" in err and "e.g. --out" in err
    assert not (tmp_path / out).exists()  # no folder named rel.png


def test_plot_out_that_is_a_file_is_refused_for_every_verb(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    existing = tmp_path / "notes"
    existing.write_text("a file")
    for verb in (["routing", str(tmp_path / "x.ckpt")], ["emos", str(tmp_path / "m.nc")],
                 ["scores", str(tmp_path)], ["frontier", str(tmp_path / "study.json")]):
        assert main(["plot", *verb, "--out", str(existing)]) == 2
        err = capsys.readouterr().err
        assert f"--out {existing} is an existing file" in err and err.count("\n") == 1
    assert existing.read_text() == "a file"


def test_plots_read_the_evaluate_folder(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """`smoe plot reliability|pit|scores EVAL_DIR` read EVAL_DIR/scores.nc (one resolver, also for scorecard and
    spectra); a folder without one is a one-line error saying what was expected."""
    scores = _calibration_scores(tmp_path / "eval")
    figs = tmp_path / "figs"
    for verb in ("reliability", "pit", "scores"):
        assert main(["plot", verb, str(scores), "--out", str(figs)]) == 0, capsys.readouterr().err
    assert sorted(p.name for p in figs.iterdir()) == ["pit_temperature_850.png",
                                                      "reliability_temperature_850_gt_279.png", "scores_rmse.png"]
    (tmp_path / "empty").mkdir()
    for verb in (["reliability"], ["scorecard", "--baseline", "raw"], ["spectra"]):
        assert main(["plot", verb[0], str(tmp_path / "empty"), *verb[1:], "--out", str(figs)]) == 2
        err = capsys.readouterr().err
        assert "is a folder without a scores.nc" in err and "smoe evaluate" in err and err.count("\n") == 1


def test_warnings_print_as_one_line_of_ours(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    import smoeweather.commands.plot as plot

    def warn(args: object) -> int:
        warnings.warn("the truth has no land_sea_mask:\n  scoring the global region only", stacklevel=1)
        return 0

    _show_like_python(monkeypatch)
    monkeypatch.setattr(plot, "run", warn)
    before = warnings.formatwarning
    assert main(["plot", "scores", "x", "--out", "y"]) == 0
    err = capsys.readouterr().err
    assert err == ("smoe plot: warning: the truth has no land_sea_mask:; scoring the global region only "
                   "(UserWarning)\n")
    assert warnings.formatwarning is before  # restored for whatever runs after the command
    assert main(["--debug", "plot", "scores", "x", "--out", "y"]) == 0  # --debug: Python's own, with the source line
    assert "test_forecaster_cli.py" in capsys.readouterr().err


def _levels_stores(tmp: Path) -> dict[str, Path]:
    """Truth (temperature, geopotential at 500 and 850 hPa, no land-sea mask), a 4-member ensemble of all four
    fields and an IMPROVER-style probability store of temperature at 850 hPa only (P(T > 265), P(T > 275))."""
    rng = np.random.default_rng(2)
    dims = ("time", "level", "latitude", "longitude")
    t = 270.0 + 8.0 * rng.normal(size=(len(TIMES), 2, 8, 16))
    z = np.array([55000.0, 14000.0])[:, None, None] + 100.0 * rng.normal(size=(len(TIMES), 2, 8, 16))  # 500, 850
    truth = xr.Dataset({"temperature": (dims, t.astype(np.float32), {"units": "K"}),
                        "geopotential": (dims, z.astype(np.float32), {"units": "m**2 s**-2"})},
                       coords={"time": TIMES, "level": [500, 850], "latitude": LAT, "longitude": LON})
    write_store(lambda: truth, tmp / "truth.zarr", args={"test": "thresholds"}, train_years=None, source="test",
                time_chunk=8, scheduler="synchronous", progress=False)
    at = truth.sel(time=(INITS[:, None] + LEADS[None, :]).ravel()).load()
    fdims = ("time", "prediction_timedelta", "member", "level", "latitude", "longitude")
    ens = xr.Dataset({v: (fdims, at[v].values.astype(np.float64).reshape(len(INITS), 1, 1, 2, 8, 16)
                          + rng.normal(0.0, 2.0, size=(len(INITS), 1, 4, 2, 8, 16)), {"units": at[v].attrs["units"]})
                      for v in ("temperature", "geopotential")},
                     coords={"time": INITS, "prediction_timedelta": LEADS, "level": [500, 850], "latitude": LAT,
                             "longitude": LON})
    ens.to_zarr(tmp / "ens.zarr", zarr_format=2)
    thr = xr.DataArray([265.0, 275.0], dims="threshold", coords={"threshold": [265.0, 275.0]})
    p = (ens["temperature"].sel(level=[850]) > thr).mean("member").transpose("time", "prediction_timedelta",
                                                                             "threshold", ...)
    prob = xr.Dataset({"temperature": p.assign_attrs(units="1")})
    prob["threshold"].attrs.update(units="K", spp__relative_to_threshold="greater_than")
    prob.to_zarr(tmp / "prob.zarr", zarr_format=2)
    return {"truth": tmp / "truth.zarr", "ens": tmp / "ens.zarr", "prob": tmp / "prob.zarr"}


def test_thresholds_are_scored_and_tabled_for_their_own_field(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                               capsys: pytest.CaptureFixture) -> None:
    """`--thresholds temperature_850=265,275` beside a probability store of temperature_850: Brier scores of
    temperature_850 only (not of temperature_500, which shares the variable name, nor of geopotential), and
    the tables and JSON list no other field against those thresholds. The missing land-sea mask is one warning
    line of ours."""
    stores = _levels_stores(tmp_path)
    _show_like_python(monkeypatch)
    out = tmp_path / "eval"
    assert main(["evaluate", f"raw={stores['ens']}", f"p={stores['prob']}", "--truth", str(stores["truth"]),
                 "--thresholds", "temperature_850=265,275", "--no-references", "--quiet", "--out", str(out)]) == 0
    s = xr.load_dataset(out / "scores.nc")
    bs = s["brier_score"].sel(region="global")
    assert s["threshold"].values.tolist() == [265.0, 275.0]
    assert bool(bs.sel(field="temperature_850").notnull().all())
    assert bool(bs.drop_sel(field="temperature_850").isnull().all())  # temperature_500, geopotential: not asked
    md = (out / "scores.md").read_text()
    brier = [line for line in md.splitlines() if "> 265" in line]
    assert brier and all(line.count(" > ") == 2 and "temperature_500" not in line and "geopotential" not in line
                         for line in brier)
    assert "| method | temperature_850 > 265 24h | temperature_850 > 275 24h |" in brier
    table = json.loads((out / "scores.json").read_text())["brier_score"]
    assert {m: list(v) for m, v in table.items()} == {"raw": ["temperature_850"], "p": ["temperature_850"]}
    assert list(table["raw"]["temperature_850"]) == ["265", "275"]
    err = capsys.readouterr().err
    assert "smoe evaluate: warning: " in err and "land_sea_mask" in err and "evaluate(" not in err
