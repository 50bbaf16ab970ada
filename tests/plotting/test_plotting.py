"""Maps and plots (`smoe plot`): routing values against the checkpoint's gate tensor, the land-sea prior
against the model's own initialisation, forecast/error alignment, valid PNG/netCDF files, and no network
access by cartopy (its downloader is replaced by one that fails)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
import xarray as xr

pytest.importorskip("cartopy", reason="needs cartopy (the [maps] extra): pip install -e '.[maps]'")

from conftest import SHARED_DATA, needs_shared  # noqa: E402

from smoeweather.cli import main  # noqa: E402
from smoeweather.io import write_netcdf  # noqa: E402
from smoeweather.models import routing  # noqa: E402
from smoeweather.models.loader import FORMAT_VERSION, METADATA_KEY  # noqa: E402
from smoeweather.models.weather import build_weather_model, synthetic_land_sea_mask  # noqa: E402
from smoeweather.plotting import cartography  # noqa: E402
from smoeweather.plotting.fields import forecast_and_truth  # noqa: E402

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
H, W = 16, 32


@pytest.fixture(autouse=True)
def no_download(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any attempt by cartopy to fetch a file fails the test."""
    import cartopy.io

    def refuse(self, target_path, format_dict):  # noqa: ANN001
        raise AssertionError(f"cartopy tried to download {target_path}")

    monkeypatch.setattr(cartopy.io.Downloader, "acquire_resource", refuse)


def is_png(path: Path) -> bool:
    return path.is_file() and path.read_bytes()[:8] == PNG_MAGIC and path.stat().st_size > 5_000


def write_lsm(path: Path) -> np.ndarray:
    lsm = synthetic_land_sea_mask(H, W).numpy().astype(np.float32) * 0.9 + 0.05  # fractions around 0.5
    lat, lon = routing.regular_grid(H, W)
    xr.Dataset({"land_sea_mask": (("latitude", "longitude"), lsm)},
               coords={"latitude": lat, "longitude": lon}).to_netcdf(path)
    return lsm


def smoe_config(store: Path, width: int = 4) -> dict:
    return {
        "task": "weatherbench", "seed": 0, "data": {"store": str(store)},
        "model": {"name": "resnet", "width": width, "blocks": 1, "dropout": 0.0, "grid": [H, W],
                  "smoe": {"placement": "all", "experts_factor": 2, "gate_prior": "land_sea",
                           "prior_strength": 1.0}},
    }


def write_checkpoint(tmp_path: Path, lat: np.ndarray, width: int = 4) -> tuple[Path, np.ndarray, np.ndarray]:
    """A `smoe train`-format checkpoint of a tiny SMoE ResNet (|E| = 2 x ``width`` experts) with a perturbed
    ("trained") gate.

    Returns (checkpoint, gate tensor (|E|, H, W) in the model's row order, land fraction (H, W))."""
    from smoeweather.models.loader import forecast_network

    lsm = write_lsm(tmp_path / "lsm.nc")
    _, lon = routing.regular_grid(H, W)
    meta = {"task": "weatherbench", "config": smoe_config(tmp_path / "lsm.nc", width),
            "channel_names": ["a", "b", "c"], "target_names": ["geopotential_500"],
            "latitude": lat.tolist(), "longitude": lon.tolist(),
            "normalisation": {"input_mean": [0.0] * 3, "input_std": [1.0] * 3,
                              "target_mean": [0.0], "target_std": [1.0]}}
    model = forecast_network(meta)  # the NormalizedModel a weatherbench checkpoint holds as `model.`
    (name, gate), = [(k, g) for k, g in model.net.gates.items()]
    with torch.no_grad():
        gate.weight.copy_(torch.randn(gate.weight.shape, generator=torch.Generator().manual_seed(1)))
    path = tmp_path / "smoe.ckpt"
    state = {f"model.{k}": v for k, v in model.state_dict().items()}
    torch.save({"state_dict": state, METADATA_KEY: {"format_version": FORMAT_VERSION, **meta}}, path)
    return path, gate.weight.detach().numpy().copy(), lsm


def test_cell_edges_cover_globe_without_seam() -> None:
    lat, lon = routing.regular_grid(32, 64)
    np.testing.assert_allclose(lat[[0, -1]], [-87.1875, 87.1875])
    lat_e, lon_e = cartography.cell_edges(lat, -90, 90), cartography.cell_edges(lon)
    np.testing.assert_allclose(lat_e[[0, -1]], [-90.0, 90.0])
    assert lon_e[-1] - lon_e[0] == pytest.approx(360.0, abs=1e-12)  # last column meets the first
    with pytest.raises(ValueError, match="ascending"):
        cartography.check_global_grid(lat[::-1], lon)


def test_map_edge_falls_on_a_cell_edge() -> None:
    """No cell is cut by the map's edge (central longitude + 180°), for the 5.625° grid and a U-Net level."""
    for lon in (routing.regular_grid(32, 64)[1], routing._coarsen(routing.regular_grid(32, 64)[1], 4)):
        central = cartography.central_longitude_for(lon)
        edges = cartography.cell_edges(lon)
        assert abs(central) <= np.diff(lon)[0] / 2 + 1e-12
        gap = np.abs((edges - (central + 180.0) + 180.0) % 360.0 - 180.0)
        assert gap.min() < 1e-9
    # midpoints of small integers: exact in binary
    np.testing.assert_array_equal(cartography.refine_edges(np.array([0.0, 1.0, 3.0]), 2), [0, 0.5, 1, 2, 3])


CANESM2 = "tas_Amon_CanESM2_rcp85_r1i1p1_200701-200712.nc"  # a real CMIP5 file: T63 Gaussian latitudes, 2.8125°


def _field_on(grid: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(field, latitude, longitude): a smooth field on the 5.625° grid, or the first month of CanESM2's tas (K)."""
    if grid == "regular":
        lat, lon = routing.regular_grid(32, 64)
        return np.cos(np.deg2rad(lat))[:, None] * np.sin(np.deg2rad(2 * lon))[None] + np.arange(64)[None] / 64, lat, lon
    if not (SHARED_DATA / CANESM2).exists():
        pytest.skip(needs_shared(CANESM2))
    with xr.open_dataset(SHARED_DATA / CANESM2) as ds:
        tas = ds["tas"].isel(time=0).sortby("lat").load()
    return tas.values, tas["lat"].values, tas["lon"].values


@pytest.mark.parametrize("grid", ["regular", "canesm2"])
@pytest.mark.parametrize("proj", cartography.PROJECTIONS)
def test_cells_drawn_as_projected_quads_look_as_cartopy_draws_them(proj: str, grid: str) -> None:
    """The cells' corners are projected once (no cell split by cartopy at the map edge): the picture equals
    cartopy's own ``pcolormesh`` of the same edges (every channel of every pixel within 2/255, but for the
    anti-aliased cell borders: < 1 % of the pixels), and the edge column's corners sit on the map's two sides."""
    import cartopy.crs as ccrs
    import matplotlib.pyplot as plt

    field, lat, lon = _field_on(grid)
    lo, hi = float(np.nanmin(field)), float(np.nanmax(field))

    def picture(own: bool) -> np.ndarray:
        fig = plt.figure(figsize=(4, 2.2), dpi=80)
        ax = cartography.global_axes(fig, proj=proj, longitude=lon)
        if own:
            cartography.draw_field(ax, field, lat, lon, vmin=lo, vmax=hi)
        else:
            lat_e, lon_e = cartography.cell_edges(lat, -90, 90), cartography.cell_edges(lon)
            k = 1 if proj == "platecarree" else int(np.ceil(max(np.diff(lat_e).max(), np.diff(lon_e).max()) / 2.0))
            lat_e, lon_e = cartography.refine_edges(lat_e, k), cartography.refine_edges(lon_e, k)
            ax.pcolormesh(lon_e, lat_e, np.repeat(np.repeat(field, k, 0), k, 1), transform=ccrs.PlateCarree(),
                          shading="flat", vmin=lo, vmax=hi)
            ax.coastlines(resolution="110m", color="black", linewidth=0.7, path_effects=[
                cartography.patheffects.withStroke(linewidth=1.8, foreground="white")])
            cartography.graticule(ax)
        fig.canvas.draw()
        image = np.asarray(fig.canvas.buffer_rgba(), dtype=np.int16)
        plt.close(fig)
        return image

    differs = np.abs(picture(True) - picture(False)).max(axis=-1) > 2
    assert differs.mean() < 0.01, differs.mean()
    fig = plt.figure()
    ax = cartography.global_axes(fig, proj=proj, longitude=lon)
    x, y, _ = cartography.projected_corners(ax, cartography.cell_edges(lat, -90, 90), cartography.cell_edges(lon))
    plt.close(fig)
    np.testing.assert_allclose(x[:, 0], -x[:, -1], atol=1e-6)
    assert np.all(x[:, 0] < 0) and np.all(x[:, -1] > 0)


def test_coastline_is_the_packaged_file() -> None:
    cartography.offline_cartopy()
    from cartopy.io import shapereader

    path = Path(shapereader.natural_earth("110m", "physical", "coastline"))
    assert path.resolve() == cartography.COASTLINE_SHP.resolve()
    assert len(list(shapereader.Reader(path).geometries())) > 100


def test_routing_netcdf_equals_gate_argmax_and_topk(tmp_path: Path) -> None:
    lat, _ = routing.regular_grid(H, W)
    ckpt, scores, lsm = write_checkpoint(tmp_path, lat)
    from smoeweather.training.checkpoint import load_trained

    trained = load_trained(ckpt)
    (r,) = routing.gate_routings(trained.model, trained.metadata, trained.config)
    path = write_netcdf(routing.routing_dataset(r, {"source_checkpoint": str(ckpt)}), tmp_path / "r.nc")
    ds = xr.load_dataset(path)
    n, e = scores.shape[0], 4  # |E| = 2 × width, E = width
    assert ds.attrs["Conventions"] == "CF-1.8" and ds["latitude"].attrs["units"] == "degrees_north"
    assert (ds.attrs["num_experts"], ds.attrs["num_selected"]) == (n, e)
    # independent numpy computation from the checkpoint tensor
    raw = torch.load(ckpt, weights_only=True)["state_dict"]
    (d,) = [v.numpy() for k, v in raw.items() if k.endswith("weight") and "gates" in k]
    np.testing.assert_array_equal(d, scores)  # the gate's stored scores, copied
    np.testing.assert_array_equal(ds["gate_scores"].values, d)
    np.testing.assert_array_equal(ds["dominant_expert"].values, d.argmax(axis=0))
    top_np = np.sort(np.argpartition(-d, e - 1, axis=0)[:e], axis=0)
    np.testing.assert_array_equal(np.sort(ds["top_experts"].values, axis=0), top_np)
    s = -np.sort(-d, axis=0)
    # one float32 subtraction, correctly rounded everywhere: exact
    np.testing.assert_array_equal(ds["routing_margin"].values, (s[e - 1] - s[e]).astype(np.float32))
    # usage: every location selects E experts and the area weights sum to 1 → Σ usage = E
    assert ds["expert_usage_area"].sum().item() == pytest.approx(e, rel=1e-12)
    assert ds["expert_dominant_area"].sum().item() == pytest.approx(1.0, rel=1e-12)
    # prior: the land fraction thresholded at 0.5, and the experts outside the prior's group
    np.testing.assert_array_equal(ds["prior_category"].values, (lsm > 0.5).astype(int))
    group = np.arange(n) * 2 // n
    outside = (group[top_np] != (lsm > 0.5)[None]).sum(axis=0)
    np.testing.assert_array_equal(ds["n_experts_outside_prior_group"].values, outside)
    n_sets = len({tuple(top_np[:, i, j]) for i in range(H) for j in range(W)})
    assert ds.attrs["n_distinct_sets"] == n_sets


def test_prior_map_is_the_models_initial_routing(tmp_path: Path) -> None:
    """An untrained model built with the mask routes exactly the prior's expert group everywhere."""
    lsm = write_lsm(tmp_path / "lsm.nc")
    cfg = smoe_config(tmp_path / "lsm.nc")
    model = build_weather_model({**cfg["model"], "in_channels": 3, "out_channels": 1},
                                land_sea_prior=torch.as_tensor(lsm))
    lat, lon = routing.regular_grid(H, W)
    (r,) = routing.gate_routings(model, {"latitude": lat, "longitude": lon}, cfg)
    ds = routing.routing_dataset(r)
    assert int(ds["n_experts_outside_prior_group"].max()) == 0
    assert ds.attrs["n_distinct_sets"] == 2
    np.testing.assert_array_equal(ds["routing_region"].values == 1, lsm > 0.5)  # sea covers more area: set 0


def test_north_to_south_grid_is_flipped(tmp_path: Path) -> None:
    lat, lon = routing.regular_grid(H, W)
    model = build_weather_model({"name": "resnet", "in_channels": 3, "out_channels": 1, "width": 4, "blocks": 1,
                                 "grid": [H, W], "smoe": {"placement": "first"}})
    (gate,) = model.gates.values()
    (r,) = routing.gate_routings(model, {"latitude": lat[::-1], "longitude": lon}, {})
    assert np.all(np.diff(r.latitude) > 0)
    np.testing.assert_array_equal(r.scores, gate.weight.detach().numpy()[:, ::-1])  # copied, flipped


def test_unet_gates_get_the_pooled_grid() -> None:
    """U-Net level l gates (grid / 2^l) sit at the block means of the input grid's cell centres."""
    model = build_weather_model({"name": "unet", "in_channels": 4, "levels": 3, "widths": [4, 8, 16], "smoe": True,
                                 "experts_factor": 4, "grid": [H, W]})
    lat, lon = routing.regular_grid(H, W)
    found = {r.name: r for r in routing.gate_routings(model, {"latitude": lat, "longitude": lon}, {})}
    r = found[f"enc_E64_H{H // 4}_W{W // 4}"]
    tol = 16 * 360 * np.finfo(np.float64).eps  # float64 means of 4 coordinates ≤ 360°, in another order
    np.testing.assert_allclose(r.latitude, lat.reshape(-1, 4).mean(1), rtol=0, atol=tol)
    np.testing.assert_allclose(r.longitude, lon.reshape(-1, 4).mean(1), rtol=0, atol=tol)
    assert r.num_selected == 16 and r.prior is None
    edges = cartography.cell_edges(r.longitude)
    assert edges[-1] - edges[0] == pytest.approx(360.0, abs=1e-9)


def test_dense_checkpoint_is_a_clear_error() -> None:
    model = build_weather_model({"name": "resnet", "in_channels": 3, "out_channels": 1, "width": 4, "blocks": 1,
                                 "grid": [H, W]})
    with pytest.raises(ValueError, match="no SMoE tensor-routing gate"):
        routing.gate_routings(model)


@pytest.mark.slow
def test_smoe_plot_routing_cli(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    lat, _ = routing.regular_grid(H, W)
    ckpt, _, _ = write_checkpoint(tmp_path, lat)
    assert main(["plot", "routing", str(ckpt), "--out", str(tmp_path / "maps")]) == 0
    gate = f"E8_H{H}_W{W}"
    kinds = ("dominant", "regions", "margin", "prior", "outside_prior", "order", "usage")
    assert sorted(p.name for p in (tmp_path / "maps").iterdir()) == sorted(
        [f"routing_{gate}.nc"] + [f"routing_{gate}_{k}.png" for k in kinds])
    assert all(is_png(tmp_path / "maps" / f"routing_{gate}_{k}.png") for k in kinds)
    assert xr.load_dataset(tmp_path / "maps" / f"routing_{gate}.nc")["dominant_expert"].shape == (H, W)
    assert main(["plot", "routing", str(tmp_path / "missing.ckpt"), "--out", str(tmp_path)]) == 2
    assert "missing.ckpt" in capsys.readouterr().err


def test_dominant_expert_map_shows_every_expert_that_dominates(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                                                ) -> None:
    """32 experts (16 sea, 16 land): every expert dominating at least 0.5 % of the area has its own colour and
    a legend entry naming its index and prior group; none of them is pooled into grey "smaller experts"."""
    from smoeweather.plotting import routing as maps

    legends: list[list[str]] = []  # the legend of every categorical map, in the order drawn (dominant first)
    categorical = maps._categorical

    def recorded(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        out = categorical(*args, **kwargs)
        legends.append([h.get_label() for h in out[3]])
        return out

    monkeypatch.setattr(maps, "_categorical", recorded)
    lat, lon = routing.regular_grid(H, W)
    ckpt, _, _ = write_checkpoint(tmp_path, lat, width=16)
    assert main(["plot", "routing", str(ckpt), "--out", str(tmp_path / "maps")]) == 0
    ds = xr.load_dataset(tmp_path / "maps" / f"routing_E32_H{H}_W{W}.nc")
    share = np.bincount(ds["dominant_expert"].values.ravel(), weights=np.broadcast_to(
        routing.area_weights(lat, W), (H, W)).ravel(), minlength=32)
    share = share / share.sum()
    legend = legends[0]
    group = ds["expert_prior_group"].values
    expected = {f"{e} {('sea', 'land')[group[e]]}" for e in np.flatnonzero(share >= 0.005)}
    assert len(expected) > maps.MAX_LEGEND  # more than the old 20 classes: they were pooled into grey before
    assert {label.rsplit(" (", 1)[0] for label in legend if "pooled" not in label} == expected
    pooled = [label for label in legend if "pooled" in label]
    assert not pooled or "under 0.5% each" in pooled[0]


def test_emos_colour_bars_carry_the_model_files_units() -> None:
    """a and √c in the field's units as the model file records them (c in units²), b and d said dimensionless;
    a coefficient without units is labelled so, not given assumed ones."""
    from smoeweather.plotting.emos import coefficient_labels

    units = {"z_a": "m**2 s**-2", "z_b": "1", "z_c": "(m**2 s**-2)**2", "z_d": "1", "t_a": "K", "t_b": "1",
             "t_c": "K**2", "t_d": "1", "q_a": "", "q_b": "1", "q_c": "", "q_d": "1"}
    model = xr.Dataset({k: ((), 0.0, {"units": u}) for k, u in units.items()})
    assert coefficient_labels(model, "z") == {"a": "a [m² s⁻²]", "b": "b [1: dimensionless slope]",
                                              "sqrt_c": "√c [m² s⁻²]", "d": "d [1: dimensionless weight]"}
    assert coefficient_labels(model, "t")["sqrt_c"] == "√c [K]"
    q = coefficient_labels(model, "q", "emos.nc")
    assert q["a"] == "a [no units in emos.nc]" and q["sqrt_c"] == "√c [no units in emos.nc]"


def make_stores(tmp_path: Path, offset: float = 3.0) -> tuple[Path, Path]:
    """Truth store (6-hourly, 3 days) and a forecast = truth at the valid time + ``offset`` K."""
    lat, lon = routing.regular_grid(H, W)
    times = pd.date_range("2003-01-01", periods=16, freq="6h")
    rng = np.random.default_rng(0)
    t = 250 + rng.normal(size=(len(times), 1, H, W)).astype(np.float32)
    truth = xr.Dataset({"temperature": (("time", "level", "latitude", "longitude"), t, {"units": "K"})},
                       coords={"time": times, "level": [850], "latitude": lat, "longitude": lon})
    truth.to_zarr(tmp_path / "truth.zarr", zarr_format=2)  # the project's store format (v3 warns on consolidation)
    inits = times[:4:2]
    leads = np.array([24, 48], "timedelta64[h]").astype("timedelta64[ns]")
    fc = np.stack([[truth["temperature"].sel(time=i + lt).values + offset for lt in leads] for i in inits])
    ds = xr.Dataset({"temperature": (("time", "prediction_timedelta", "level", "latitude", "longitude"), fc,
                                     {"units": "K"})},
                    coords={"time": inits, "prediction_timedelta": leads, "level": [850], "latitude": lat,
                            "longitude": lon}, attrs={"forecast_kind": "deterministic"})
    ds.to_zarr(tmp_path / "fc.zarr", zarr_format=2)
    return tmp_path / "fc.zarr", tmp_path / "truth.zarr"


def test_forecast_and_truth_align_at_valid_time(tmp_path: Path) -> None:
    fc_path, truth_path = make_stores(tmp_path, offset=3.0)
    fc, tr, kind = forecast_and_truth(fc_path, truth_path, "temperature_850", "48h")
    assert kind == "deterministic" and fc.sizes["time"] == 2
    np.testing.assert_allclose((fc - tr).values, 3.0, rtol=0, atol=4 * np.finfo(np.float32).eps * 256)
    with pytest.raises(ValueError, match="no lead 72 h"):
        forecast_and_truth(fc_path, truth_path, "temperature_850", "72h")
    with pytest.raises(ValueError, match="no level 500"):
        forecast_and_truth(fc_path, truth_path, "temperature_500", "24h")


def test_ensemble_store_maps_the_member_mean(tmp_path: Path) -> None:
    fc_path, truth_path = make_stores(tmp_path, offset=0.0)
    ds = xr.open_zarr(fc_path).load()
    spread = xr.DataArray([-2.0, 1.0, 4.0], dims="member")  # member mean +1 K
    ens = (ds + spread).transpose("time", "prediction_timedelta", "member", ...)
    ens.attrs["forecast_kind"] = "ensemble"
    ens.to_zarr(tmp_path / "ens.zarr", zarr_format=2)
    fc, tr, kind = forecast_and_truth(tmp_path / "ens.zarr", truth_path, "temperature_850", "24h", "2003-01-01T12")
    assert kind == "ensemble mean" and fc.sizes["time"] == 1
    np.testing.assert_allclose((fc - tr).values, 1.0, rtol=0, atol=8 * np.finfo(np.float32).eps * 256)


def test_missing_cartopy_is_a_one_line_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                             capsys: pytest.CaptureFixture) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "cartopy", None)  # import cartopy → ImportError
    assert main(["plot", "routing", str(tmp_path / "x.ckpt"), "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "smoeweather[maps]" in err and err.count("\n") == 1


@pytest.mark.slow
def test_smoe_plot_forecast_error_scores_cli(tmp_path: Path) -> None:
    fc_path, truth_path = make_stores(tmp_path)
    out = tmp_path / "maps"
    common = ["--truth", str(truth_path), "--field", "temperature_850", "--lead", "24h", "--out", str(out),
              "--projection", "platecarree"]
    assert main(["plot", "forecast", str(fc_path), *common, "--init", "2003-01-01T12"]) == 0
    assert main(["plot", "error", str(fc_path), *common]) == 0
    assert is_png(out / "forecast_temperature_850_24h_20030101T12.png")
    assert is_png(out / "error_temperature_850_24h_mean.png")
    leads = np.array([24, 72], "timedelta64[h]").astype("timedelta64[ns]")
    scores = xr.Dataset({"rmse": (("method", "field", "prediction_timedelta"), np.arange(8.0).reshape(2, 2, 2))},
                        coords={"method": ["smoe", "persistence"], "field": ["geopotential_500", "temperature_850"],
                                "prediction_timedelta": leads})
    scores.to_netcdf(tmp_path / "scores.nc")
    (tmp_path / "scores.json").write_text(json.dumps({"units": {"geopotential_500": "m**2 s**-2",
                                                                 "temperature_850": "K"}}))
    assert main(["plot", "scores", str(tmp_path / "scores.nc"), "--out", str(out)]) == 0
    assert is_png(out / "scores_rmse.png")
