"""earth2studio runs an exported smoeweather network (:mod:`smoeweather.interop.earth2studio`): its own
``run.deterministic`` and ``run.ensemble``, a ``DataArrayFile`` source built from the prepared store and its
``ZarrBackend``, give what ``smoe forecast`` gives on the same inits, bit for bit (the same inputs, the same
network, the same batch of inits: the same computation). Fixed-lead rollouts are checked against ``smoe forecast``
from a store whose fields at the first lead are the first step's output; continuous-lead networks forecast every
lead directly; an ensemble network gives its members along ``ensemble``. Names, grid order and step schedule are
checked without earth2studio; the runs skip without it (the ``earth2studio`` extra)."""

from __future__ import annotations

import importlib.util
import inspect
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import xarray as xr
from conftest import float_tol

from smoeweather.cli import main
from smoeweather.config import apply_overrides, read_config
from smoeweather.interop.earth2studio import (
    LEVEL_PREFIXES,
    SURFACE_NAMES,
    SmoePrognostic,
    lexicon_field,
    lexicon_name,
    schedule,
    to_earth2studio,
)
from smoeweather.models.export import rounding_ops

REPO = Path(__file__).resolve().parents[2]
E2S_REASON = "needs the earth2studio extra: pip install 'smoeweather[earth2studio]'"
WORLD = ["data.world=null", "data.sources=null", "data.num_workers=0", "data.batch_size=4",
         "data.variables=[geopotential_500, temperature_850]", "data.train_years=null", "data.valid_years=null",
         "data.test_years=null", "data.train_period=[2000-01-01, 2000-02-29T18:00]",
         "data.valid_period=[2000-03-01, 2000-03-20]", "data.test_period=[2000-03-21, 2000-04-09]",
         "model.width=8", "model.blocks=1"]
NETWORKS: dict[str, tuple[str, list[str]]] = {  # name → (config, overrides)
    # fixed lead 24 h on the states 24 h apart: rolls out on its own outputs
    "fixed": ("world_dense", ["data.lead_h=24", "data.input_offsets_h=[-24, 0]"]),
    # continuous lead (24 and 48 h) from -12, -6, 0 h, SMoE gates initialised from the land-sea map
    "continuous": ("world_smoe_all_prior", ["data.lead_h=null", "data.lead_choices_h=[24, 48]"]),
    # E³, 2 members, fixed lead 24 h: per-member rollouts
    "e3": ("world_smoe_all_prior", ["model.name=e3", "model.members=2", "data.lead_h=24",
                                    "data.input_offsets_h=[-24, 0]"]),
    "gaussian": ("world_dense", ["model.name=gaussian", "data.lead_h=24"]),
}
INITS = np.array(["2000-03-21T00", "2000-03-25T12"], "datetime64[ns]")  # 108 h apart: `--every 108h`


def _frames(context: int = 1) -> list[inspect.FrameInfo]:
    """``inspect.stack()`` without the source lines: the frames of the caller outward, each with its code's file."""
    frame, frames = sys._getframe(1), []
    while frame is not None:
        frames.append(inspect.FrameInfo(frame, frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name, None,
                                        None))
        frame = frame.f_back
    return frames


@pytest.fixture(scope="module", autouse=True)
def _earth2studio_imported() -> Iterator[None]:
    """earth2studio's modules, imported once for the file with a light ``inspect.stack``.

    At import, earth2studio (0.19) names each optional-dependency group by ``inspect.stack()[1].filename``, 192
    calls; under pytest's deep stack and thousands of loaded modules each call reads the source of every frame and
    scans ``sys.modules`` (``inspect.getmodule``), about 1 s a call: ~100 s of this file's time, against 17 s for the
    same import in a plain interpreter. The light stack gives the same file names without the source."""
    if importlib.util.find_spec("earth2studio") is None:
        yield
        return
    real = inspect.stack
    inspect.stack = _frames
    try:
        import earth2studio.data  # noqa: F401
        import earth2studio.io  # noqa: F401
        import earth2studio.perturbation  # noqa: F401
        import earth2studio.run  # noqa: F401
    finally:
        inspect.stack = real
    yield


def _checkpoint(name: str, world_store: str, out: Path) -> Path:
    """The checkpoint `smoe train` writes for ``name`` before its first step (the task's own builder and
    metadata hook; untrained weights give outputs that vary over the grid, which is all the checks need)."""
    from smoeweather.training.registry import task

    config, extra = NETWORKS[name]
    cfg = apply_overrides(read_config(REPO / "configs" / "weatherbench" / f"{config}.yaml"),
                          [f"output_dir={out}", f"data.store={world_store}", *WORLD, *extra])
    _, module = task(cfg["task"]).build(cfg)
    ckpt: dict[str, Any] = {"state_dict": module.state_dict()}
    module.on_save_checkpoint(ckpt)
    torch.save(ckpt, out / "model.ckpt")
    return out / "model.ckpt"


@pytest.fixture(scope="module")
def exported(world_store: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """``smoe export`` folders of the deterministic and ensemble networks of :data:`NETWORKS`."""
    out = {}
    for name in ("fixed", "continuous", "e3"):
        folder = tmp_path_factory.mktemp(name)
        assert main(["export", str(_checkpoint(name, world_store, folder)), "--out", str(folder / "x")]) == 0
        out[name] = folder / "x"
    return out


def _smoe_forecast(model: Path, store: str | Path, out: Path, inits: np.ndarray, *leads: str) -> xr.Dataset:
    """``smoe forecast`` of ``model`` from ``store`` at the two ``inits``."""
    every = f"{int((inits[1] - inits[0]) / np.timedelta64(1, 'h'))}h"
    argv = ["forecast", str(model), "--data", str(store), "--init", str(inits[0]), str(inits[1]), "--every", every,
            "--lead", *leads, "--out", str(out), "--no-progress", "--beyond-data"]
    assert main(argv) == 0
    return xr.open_zarr(out).load()


def _fields(fc: xr.Dataset, lead_h: int, member: int | None = None) -> dict[str, np.ndarray]:
    """{earth2studio name: (time, lat descending, lon)} of a `smoe forecast` Dataset at one lead."""
    sel: dict[str, Any] = {"prediction_timedelta": np.timedelta64(lead_h, "h")}
    if member is not None:
        sel["member"] = member
    out = {}
    for name in ("z500", "t850"):
        var, level = lexicon_field(name)
        da = fc[var].sel(level=level, **sel).transpose("time", "latitude", "longitude")
        out[name] = da.values[:, ::-1]
    return out


def _source(store: str, model: SmoePrognostic, path: Path) -> Any:
    """earth2studio's ``DataArrayFile`` over the store's fields around the inits."""
    from earth2studio.data import DataArrayFile

    to_earth2studio(store, model.input_variables).sel(time=slice("2000-03-19", "2000-04-02")).to_zarr(path)
    return DataArrayFile(str(path), engine="zarr")


# -- without earth2studio -----------------------------------------------------------------------------------------
def test_every_canonical_variable_has_its_lexicon_name_and_back() -> None:
    """z500, t850, u10m, msl, ...: the names earth2studio's WeatherBench 2 lexicon gives our variables, and
    back; every one is in earth2studio's vocabulary when it is installed."""
    assert lexicon_name(("geopotential", 500)) == "z500" and lexicon_name(("temperature", 850)) == "t850"
    assert lexicon_name(("2m_temperature", None)) == "t2m" and lexicon_name(("geopotential_at_surface", None)) == "z"
    names = [lexicon_name((v, level)) for v in LEVEL_PREFIXES for level in (50, 500, 1000)]
    names += [lexicon_name((v, None)) for v in SURFACE_NAMES]
    assert len(set(names)) == len(names)
    assert [lexicon_field(n) for n in names] == [(v, level) for v in LEVEL_PREFIXES for level in (50, 500, 1000)] + [
        (v, None) for v in SURFACE_NAMES]
    for bad in (("vorticity", 500), ("geopotential", None), ("temperature", 0.1)):
        with pytest.raises(ValueError, match="no name in earth2studio's lexicon"):
            lexicon_name(bad)
    with pytest.raises(ValueError, match="not an earth2studio name"):
        lexicon_field("foo")
    try:
        from earth2studio.lexicon.base import E2STUDIO_VOCAB
    except ImportError:
        return
    assert set(names) <= set(E2STUDIO_VOCAB), sorted(set(names) - set(E2STUDIO_VOCAB))


@pytest.mark.parametrize("offsets, lead, continuous, leads, expected", [
    ([-24, 0], 24, False, None, (24, None)),
    ([0], 6, False, None, (6, None)),
    ([-12, -6, 0], 72, False, None, (72, 1)),  # the defaults: the inputs 12 h and 6 h before 72 h are no output
    ([-48, 0], 24, False, None, (24, 1)),  # 24 h after the first step needs -24 h: never given
    ([-12, -6, 0], None, True, [24, 48], (24, 2)),
    ([-12, -6, 0], None, True, list(range(6, 121, 6)), (6, 20)),
])
def test_schedule(offsets: list[int], lead: int | None, continuous: bool, leads: list[int] | None,
                  expected: tuple[int, int | None]) -> None:
    spec = type("Spec", (), {"offsets_h": offsets, "continuous": continuous, "trained_leads_h": leads or [lead],
                             "variables": [("geopotential", 500)], "targets": [("geopotential", 500)]})()
    assert schedule(spec) == expected  # type: ignore[arg-type]
    spec.targets = [("temperature", 850)]
    assert schedule(spec) == (expected if continuous else (expected[0], 1))  # type: ignore[arg-type]


def test_coordinates_and_grid_order(exported: dict[str, Path], world_store: str) -> None:
    """earth2studio's coordinates (lexicon names, lat descending, lon in [0, 360), lead times as timedelta64);
    a field given in earth2studio's order is forecast as the network forecasts it in its own order."""
    model = SmoePrognostic.load(exported["continuous"], constants=world_store)
    coords = model.input_coords()
    assert list(coords) == ["batch", "lead_time", "variable", "lat", "lon"]
    assert list(coords["variable"]) == ["z500", "t850"] and coords["lead_time"].dtype.kind == "m"
    assert list(coords["lead_time"] / np.timedelta64(1, "h")) == [-12, -6, 0]
    assert np.all(np.diff(coords["lat"]) < 0) and np.all(np.diff(coords["lon"]) > 0) and coords["lon"][0] >= 0
    out = model.output_coords(coords)
    assert out["lead_time"] == [np.timedelta64(24, "h")] and list(out["variable"]) == ["z500", "t850"]
    torch.manual_seed(1)
    x = torch.randn(3, 3, 2, 32, 64)
    coords.pop("batch")
    coords = type(coords)(time=np.arange(3), **coords)
    y, out = model(x, coords)
    assert y.shape == (3, 1, 2, 32, 64) and list(out) == ["time", "lead_time", "variable", "lat", "lon"]
    assert np.all(np.diff(model.spec.latitude) > 0)  # the network's own order: latitude ascending
    own = [x.flip(-2).reshape(3, 6, 32, 64), model.constants.expand(3, -1, -1, -1), torch.full((3, 1, 32, 64), 0.24)]
    with torch.no_grad():
        ref = model.network(torch.cat(own, dim=1))
    assert torch.equal(y[:, 0], ref.flip(-2))
    with pytest.raises(ValueError, match="input variables"):
        model(x, type(coords)({**coords, "variable": np.array(["t850", "z500"])}))
    with pytest.raises(ValueError, match="input lat differs"):
        model(x, type(coords)({**coords, "lat": coords["lat"][::-1]}))


def test_refusals(exported: dict[str, Path], world_store: str, tmp_path: Path) -> None:
    """One line each: a network with constants needs them; a gaussian network has no earth2studio coordinates;
    an iterator asked past what the leads allow says how far they go."""
    with pytest.raises(ValueError, match=r"reads the constants .*land_sea_mask.*pass constants=STORE"):
        SmoePrognostic.load(exported["fixed"])
    with pytest.raises(ValueError, match="gaussian network forecasts μ and σ"):
        SmoePrognostic.load(_checkpoint("gaussian", world_store, tmp_path), constants=world_store)
    model = SmoePrognostic.load(exported["continuous"], constants=world_store)
    coords = model.input_coords()
    coords.pop("batch")
    steps = model.create_iterator(torch.zeros(3, 2, 32, 64), coords)
    assert [c["lead_time"][0] / np.timedelta64(1, "h") for _, c in (next(steps) for _ in range(3))] == [0, 24, 48]
    with pytest.raises(ValueError, match=r"2 step\(s\) of 24 h at most \(continuous lead, trained to 48 h\); run "
                                         r"with nsteps <= 2"):
        next(steps)


# -- earth2studio's workflows ---------------------------------------------------------------------------------------
@pytest.mark.slow  # earth2studio's import alone takes seconds
def test_deterministic_run_equals_smoe_forecast(exported: dict[str, Path], world_store: str, tmp_path: Path) -> None:
    """run.deterministic of a continuous-lead network (2 steps) equals `smoe forecast --lead 24h 48h`, bit for
    bit; lead 0 is the initial condition; the Zarr output is earth2studio's layout (time, lead_time, lat, lon)."""
    pytest.importorskip("earth2studio", reason=E2S_REASON)
    from earth2studio import run
    from earth2studio.io import ZarrBackend

    model = SmoePrognostic.load(exported["continuous"], constants=world_store)
    data = _source(world_store, model, tmp_path / "ic.zarr")
    run.deterministic(list(INITS), 2, model, data, ZarrBackend(str(tmp_path / "e2s.zarr")),
                      device=torch.device("cpu"), verbose=False)
    got = xr.open_zarr(tmp_path / "e2s.zarr", consolidated=False).load()
    assert got["z500"].dims == ("time", "lead_time", "lat", "lon")
    assert list(got["lead_time"].values / np.timedelta64(1, "h")) == [0, 24, 48]
    ref = _smoe_forecast(exported["continuous"], world_store, tmp_path / "fc.zarr", INITS, "24h", "48h")
    truth = xr.open_zarr(world_store)
    for name in ("z500", "t850"):
        var, level = lexicon_field(name)
        ic = truth[var].sel(level=level, time=INITS).values[:, ::-1]
        np.testing.assert_array_equal(got[name].isel(lead_time=0).values, ic)
        for j, lead in ((1, 24), (2, 48)):
            np.testing.assert_array_equal(got[name].isel(lead_time=j).values, _fields(ref, lead)[name])


@pytest.mark.slow  # earth2studio's import alone takes seconds
def test_fixed_lead_rollout_equals_smoe_forecast_on_its_own_output(exported: dict[str, Path], world_store: str,
                                                                   tmp_path: Path) -> None:
    """A fixed-lead network rolls out: step 1 is `smoe forecast --lead 24h`, step 2 is `smoe forecast` from a
    store whose fields at +24 h are step 1's output (its inputs at 0 and +24 h), bit for bit."""
    pytest.importorskip("earth2studio", reason=E2S_REASON)
    from earth2studio import run
    from earth2studio.io import ZarrBackend

    model = SmoePrognostic.load(exported["fixed"], constants=world_store)
    assert model.step == np.timedelta64(24, "h") and model.max_steps is None
    data = _source(world_store, model, tmp_path / "ic.zarr")
    run.deterministic(list(INITS), 3, model, data, ZarrBackend(str(tmp_path / "e2s.zarr")),
                      device=torch.device("cpu"), verbose=False)
    got = xr.open_zarr(tmp_path / "e2s.zarr", consolidated=False).load()
    ref = _smoe_forecast(exported["fixed"], world_store, tmp_path / "fc1.zarr", INITS, "24h")
    for name, values in _fields(ref, 24).items():
        np.testing.assert_array_equal(got[name].isel(lead_time=1).values, values)
    rolled = tmp_path / "rolled.zarr"
    _replaced(world_store, got, 1, INITS).to_zarr(rolled)
    ref2 = _smoe_forecast(exported["fixed"], rolled, tmp_path / "fc2.zarr", INITS + np.timedelta64(24, "h"), "24h")
    for name, values in _fields(ref2, 24).items():
        np.testing.assert_array_equal(got[name].isel(lead_time=2).values, values)
    assert np.isfinite(got["z500"].values).all()


def _replaced(store: str, out: xr.Dataset, step: int, inits: np.ndarray, member: int | None = None) -> xr.Dataset:
    """The store's fields with z500 and t850 at init + step·24 h replaced by earth2studio's output there."""
    ds = xr.open_zarr(store).load()
    for name in ("z500", "t850"):
        var, level = lexicon_field(name)
        field = out[name] if member is None else out[name].sel(ensemble=member)
        for i, init in enumerate(inits):
            when = init + np.timedelta64(24 * step, "h")
            ds[var].loc[{"time": when, "level": level}] = field.isel(time=i, lead_time=step).values[::-1]
    return ds.drop_encoding()


@pytest.mark.slow  # earth2studio's import alone takes seconds
def test_ensemble_members(exported: dict[str, Path], world_store: str, tmp_path: Path) -> None:
    """An E³ network: run.ensemble (nensemble = its members, no perturbation) gives member m of `smoe forecast` as
    ensemble member m, bit for bit, and rolls each member out on its own output; run.deterministic gives all
    members along ``ensemble``, the same numbers."""
    pytest.importorskip("earth2studio", reason=E2S_REASON)
    from earth2studio import run
    from earth2studio.io import ZarrBackend
    from earth2studio.perturbation import Zero

    model = SmoePrognostic.load(exported["e3"], constants=world_store)
    assert model.ensemble_size == 2
    data = _source(world_store, model, tmp_path / "ic.zarr")
    # one member a batch: the network sees the 2 inits `smoe forecast` batches together, the same rows
    run.ensemble(list(INITS), 2, 2, model, data, ZarrBackend(str(tmp_path / "ens.zarr")), Zero(), batch_size=1,
                 device=torch.device("cpu"), verbose=False)
    run.deterministic(list(INITS), 2, model, data, ZarrBackend(str(tmp_path / "det.zarr")),
                      device=torch.device("cpu"), verbose=False)
    ens, det = (xr.open_zarr(tmp_path / f"{n}.zarr", consolidated=False).load() for n in ("ens", "det"))
    assert ens["z500"].dims == ("ensemble", "time", "lead_time", "lat", "lon")
    assert det["z500"].dims == ("time", "lead_time", "ensemble", "lat", "lon")
    ref = _smoe_forecast(exported["e3"], world_store, tmp_path / "fc.zarr", INITS, "24h")
    for m in (0, 1):
        for name, values in _fields(ref, 24, m).items():
            np.testing.assert_array_equal(ens[name].sel(ensemble=m).isel(lead_time=1).values, values)
        rolled = tmp_path / f"rolled{m}.zarr"
        _replaced(world_store, ens, 1, INITS, member=m).to_zarr(rolled)
        ref2 = _smoe_forecast(exported["e3"], rolled, tmp_path / f"fc{m}.zarr", INITS + np.timedelta64(24, "h"),
                              "24h")
        for name, values in _fields(ref2, 24, m).items():
            np.testing.assert_array_equal(ens[name].sel(ensemble=m).isel(lead_time=2).values, values)
    # run.deterministic evaluates both members' second steps in one batch of 4 rows, run.ensemble 2 a batch: the
    # same arithmetic per row, within the float32 rounding of the network's longest chain (here: bit for bit)
    n_ops = rounding_ops(model.network)
    for name in ("z500", "t850"):
        np.testing.assert_array_equal(det[name].isel(lead_time=[0, 1]).transpose("ensemble", ...).values,
                                      ens[name].isel(lead_time=[0, 1]).values)
        want = ens[name].isel(lead_time=2).values
        np.testing.assert_allclose(det[name].isel(lead_time=2).transpose("ensemble", ...).values, want,
                                   **float_tol(np.float32, n_ops, want))
    assert not np.array_equal(ens["z500"].sel(ensemble=0).values, ens["z500"].sel(ensemble=1).values)


@pytest.mark.slow  # earth2studio's import alone takes seconds
def test_the_guide_runs_as_written(exported: dict[str, Path], world_store: str, tmp_path: Path,
                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """The Python block of docs/guide/earth2studio.md, run as written on an exported network and a prepared store
    in its places (the test world's dates for the guide's), writes the forecast it describes."""
    pytest.importorskip("earth2studio", reason=E2S_REASON)
    import re

    text = (REPO / "docs" / "guide" / "earth2studio.md").read_text()
    code = re.search(r"```python\n(.*?)```", text, re.S).group(1)  # the first block: the guide's lines
    assert "SmoePrognostic.load(" in code and "run.deterministic(" in code
    code = code.replace('"2003-01-01", "2003-01-02"', ", ".join(f'"{t}"' for t in INITS.astype("datetime64[h]")))
    (tmp_path / "exports").mkdir()
    (tmp_path / "runs" / "data").mkdir(parents=True)
    (tmp_path / "exports" / "world_smoe").symlink_to(exported["continuous"])
    (tmp_path / "runs" / "data" / "default_world.zarr").symlink_to(world_store)
    monkeypatch.chdir(tmp_path)
    exec(compile(code, "docs/guide/earth2studio.md", "exec"), {})
    out = xr.open_zarr(tmp_path / "runs" / "e2s.zarr", consolidated=False)
    assert set(out.data_vars) == {"z500", "t850"} and out["z500"].dims == ("time", "lead_time", "lat", "lon")
    assert list(out["lead_time"].values / np.timedelta64(1, "h")) == [0, 24, 48]
    assert np.isfinite(out["t850"].values).all()
