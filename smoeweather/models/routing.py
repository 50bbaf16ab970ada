"""Where the experts route: the tensor-routing gates of a trained SMoE, extracted from a checkpoint as arrays
and CF netCDF Datasets (drawn by :mod:`smoeweather.plotting.routing`).

For every :class:`~smoeweather.nn.gates.TensorRoutingGate` of a checkpoint's network (one per distinct
(|E|, H, W); all SMoE layers of that size share it) this module computes, from the gate's score tensor
D (|E|, H, W) as the layers see it (after ``gate_norm``), with E = the number of experts each of its
layers applies per location:

* ``top_experts`` (E, H, W): the top-E set, in descending score order (slot 0 = the dominant expert);
* ``dominant_expert`` (H, W): argmax over experts;
* ``routing_margin`` (H, W): score of the E-th minus score of the (E+1)-th expert (gate-score units; how
  far the selection is from changing; NaN when E = |E|);
* ``routing_region`` (H, W): which distinct top-E set a location uses (0 = the set covering the largest
  area, 1 = the next, ...; ``n_distinct_sets`` = how many distinct sets the gate uses on the globe);
* with a land-sea prior (``smoe.gate_prior: land_sea``): ``prior_category`` (H, W; 0 = sea, 1 = land, the
  land fraction thresholded at 0.5 exactly as the model builder does), the prior's expert group of every
  expert (``expert_prior_group``: the experts are split into K contiguous groups, category k → group k),
  and ``n_experts_outside_prior_group`` (H, W): how many of the E selected experts are NOT in the group
  the prior assigned to this location — the number of distinct experts training brought in beyond the
  initial routing (0 = routing as initialised; with prior_strength ≥ 1 the initial top-E set is exactly
  the group when the group has E experts);
* ``expert_usage_area`` / ``expert_dominant_area`` (|E|,): fraction of the globe's area (cell-area
  weights) where an expert is in the top-E set / is the dominant expert.

Every array has latitude ascending (rows flipped if the model's grid runs north to south) and longitude
ascending in [0, 360).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import xarray as xr
from torch import nn

from pipelines.readers._files import open_data
from smoeweather.metrics.weights import cell_area_weights
from smoeweather.models.loader import load_network
from smoeweather.nn.gates import TensorRoutingGate
from smoeweather.nn.smoe import SpatialMoE2d


@dataclass
class GateRouting:
    """One gate's routing on its grid; arrays with latitude ascending.

    ``scores`` (|E|, H, W) float32, the routing scores the layers rank; ``num_selected`` E;
    ``latitude`` (H,) degrees north ascending; ``longitude`` (W,) degrees east in [0, 360);
    ``prior`` (H, W) int categories or None; ``layers``: names of the SMoE layers that use the gate.
    """

    name: str
    scores: np.ndarray
    num_selected: int
    latitude: np.ndarray
    longitude: np.ndarray
    layers: list[str] = field(default_factory=list)
    prior: np.ndarray | None = None
    prior_source: str | None = None
    prior_strength: float | None = None

    @property
    def num_experts(self) -> int:
        return int(self.scores.shape[0])


# ---- extracting the gates ------------------------------------------------------------------------------
def _gate_layers(model: nn.Module) -> list[tuple[str, TensorRoutingGate, list[tuple[str, SpatialMoE2d]]]]:
    """Every tensor-routing gate of ``model`` with its name (last path component) and its SMoE layers."""
    gates: dict[int, tuple[str, TensorRoutingGate, list[tuple[str, SpatialMoE2d]]]] = {}
    for path, module in model.named_modules():
        if isinstance(module, TensorRoutingGate) and id(module) not in gates:
            gates[id(module)] = (path.split(".")[-1], module, [])
    for path, module in model.named_modules():
        if isinstance(module, SpatialMoE2d) and id(module.gate) in gates:
            gates[id(module.gate)][2].append((path, module))
    return [g for g in gates.values() if g[2]]


def _routing_scores(gate: TensorRoutingGate, layer: SpatialMoE2d) -> np.ndarray:
    """The scores the layer ranks, (|E|, H, W): the gate tensor after the layer's ``gate_norm``."""
    scores = gate.weight.detach().float().cpu()
    if layer.gate_norm in ("abs", "softmax_abs"):
        scores = scores.abs()
    if layer.gate_norm in ("softmax", "softmax_abs"):
        scores = scores.softmax(dim=0)
    return scores.numpy()


def regular_grid(height: int, width: int) -> tuple[np.ndarray, np.ndarray]:
    """Cell centres of a regular global (H, W) grid: latitude ascending from −90 + Δ/2, longitude from 0
    (the WeatherBench 5.625° grid is (32, 64) of this form)."""
    dlat, dlon = 180.0 / height, 360.0 / width
    return -90.0 + dlat * (np.arange(height) + 0.5), dlon * np.arange(width)


def _coarsen(values: np.ndarray, n: int) -> np.ndarray:
    """Block means of ``n`` consecutive cell centres (the U-Net's 2^l pooling levels)."""
    m = len(values) // n
    return np.asarray(values[: m * n], dtype=np.float64).reshape(m, n).mean(axis=1)


def _model_grid(metadata: dict[str, Any], config: dict[str, Any]) -> tuple[np.ndarray, np.ndarray] | None:
    """(latitude, longitude) of the model's input grid in the model's row order, or None if unknown."""
    if "latitude" in metadata and "longitude" in metadata:
        return np.asarray(metadata["latitude"], float), np.asarray(metadata["longitude"], float)
    store = (config.get("data") or {}).get("store")
    if store and Path(store).exists():
        with xr.open_zarr(store) as ds:
            if "latitude" in ds.coords and "longitude" in ds.coords:
                return ds["latitude"].values.astype(float), ds["longitude"].values.astype(float)
    return None


def _gate_grid(grid: tuple[np.ndarray, np.ndarray] | None, h: int, w: int) -> tuple[np.ndarray, np.ndarray]:
    """Coordinates of an (h, w) gate: the model grid, its 2^l block means, or a regular global grid."""
    if grid is not None:
        lat, lon = grid
        if len(lat) % h == 0 and len(lon) % w == 0 and len(lat) // h == len(lon) // w:
            return _coarsen(lat, len(lat) // h), _coarsen(lon, len(lon) // w) % 360.0
    return regular_grid(h, w)


def load_land_sea(path: str | Path, shape: tuple[int, int]) -> tuple[np.ndarray, str]:
    """Land fraction (H, W) in the file's own row order from a prepared store (``land_sea_mask``) or a
    netCDF file (``land_sea_mask`` or ``lsm``); ValueError naming the file if absent or of another grid."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"land-sea mask source {path} does not exist")
    with open_data(path, "land-sea mask source") as ds:
        name = next((v for v in ("land_sea_mask", "lsm") if v in ds.variables), None)
        if name is None:
            raise ValueError(f"{path} has no land_sea_mask or lsm variable")
        values = np.asarray(ds[name].squeeze().values, dtype=np.float32)
    if values.shape != tuple(shape):
        raise ValueError(f"{path}: {name} has shape {values.shape}, the gate's grid is {tuple(shape)}")
    return values, f"{path}:{name}"


def _land_sea_files(config: dict[str, Any]) -> list[str]:
    """Files that may hold the training land-sea mask: ``data.store``, ``data.constants``, ``data.source``."""
    data = config.get("data") or {}
    files = [data.get("store"), data.get("constants")]
    source = data.get("source")
    files += list(source) if isinstance(source, list | tuple) else [source]
    return [str(f) for f in files if f and Path(str(f)).exists()]


def _prior_categories(config: dict[str, Any], shape: tuple[int, int], land_sea: str | Path | None,
                      north_to_south: bool = False, pool: int = 1, unet: bool = False) -> tuple[np.ndarray, str]:
    """The categorical prior the gates were initialised from: land fraction > 0.5 → 1 (land), else 0, as
    :class:`~smoeweather.models.resnet.WeatherBenchResNet` does with the store's ``land_sea_mask``; with
    ``unet`` the mask's pool × pool block mean ≥ 0.5 (pool = 2^l at U-Net level l), as
    :meth:`~smoeweather.models.unet.PostprocessingUNet.level_prior` does."""
    full = (shape[0] * pool, shape[1] * pool)
    files = _land_sea_files(config)
    if land_sea is not None:
        lsm, source = load_land_sea(land_sea, full)
    else:
        if files:
            lsm, source = None, ""
            for f in files:
                try:
                    lsm, source = load_land_sea(f, full)
                    break
                except ValueError:
                    continue
            if lsm is None:
                raise ValueError(f"none of {files} holds a land-sea mask on the {full} grid; pass --land-sea")
        elif tuple(full) == (32, 64):
            # the training store is gone; the default world uses this packaged mask (latitude ascending)
            from pipelines.world import land_fraction

            lsm, source = land_fraction(), "pipelines/resources/lsm_5.625deg.nc (training store not found)"
            lsm = lsm[::-1] if north_to_south else lsm  # into the model's row order
        else:
            raise FileNotFoundError(
                f"the training data {files or config.get('data')} is not there to rebuild the land-sea prior; "
                "pass --land-sea"
            )
    if unet:
        frac = lsm.reshape(shape[0], pool, shape[1], pool).mean((1, 3))
        return (frac >= 0.5).astype(np.int64), f"{source} (block mean over {pool}×{pool} cells ≥ 0.5)"
    return (lsm > 0.5).astype(np.int64), source


def gate_routings(model: nn.Module, metadata: dict[str, Any] | None = None, config: dict[str, Any] | None = None,
                  land_sea: str | Path | None = None) -> list[GateRouting]:
    """The routing of every tensor-routing gate of ``model`` (a NormalizedModel or a bare network).

    ``metadata``/``config``: the checkpoint's (grid coordinates, the SMoE config, the training store).
    ValueError when the model has no tensor-routing SMoE gate (a dense model).
    """
    metadata, config = metadata or {}, config or {}
    found = _gate_layers(model)
    if not found:
        raise ValueError("the model has no SMoE tensor-routing gate (dense model?): nothing to map")
    mcfg = config.get("model") or {}
    smoe_cfg = mcfg.get("smoe")
    unet_prior = mcfg.get("gate_prior") == "land_sea"  # the post-processing U-Net: a prior at every level
    uses_prior = (isinstance(smoe_cfg, dict) and smoe_cfg.get("gate_prior") == "land_sea") or unet_prior
    smoe_cfg = smoe_cfg if isinstance(smoe_cfg, dict) else mcfg
    grid = _model_grid(metadata, config)
    out = []
    for name, gate, layers in found:
        selected = {layer.num_selected for _, layer in layers}
        norms = {layer.gate_norm for _, layer in layers}
        if len(selected) != 1 or len(norms) != 1:
            raise ValueError(f"gate {name}: its layers select different E {selected} or norms {norms}")
        h, w = gate.height, gate.width
        lat, lon = _gate_grid(grid, h, w)
        scores = _routing_scores(gate, layers[0][1])
        prior, source = (None, None)
        if unet_prior and grid is not None and len(grid[0]) % h == 0 and len(grid[0]) // h == len(grid[1]) // w:
            prior, source = _prior_categories(config, (h, w), land_sea, north_to_south=bool(lat[0] > lat[-1]),
                                              pool=len(grid[0]) // h, unet=True)
        elif uses_prior and not unet_prior and (grid is None or (h, w) == (len(grid[0]), len(grid[1]))):
            prior, source = _prior_categories(config, (h, w), land_sea, north_to_south=bool(lat[0] > lat[-1]))
        if lat[0] > lat[-1]:  # north-to-south grid: flip rows so every map and file has latitude ascending
            lat, scores = lat[::-1], scores[:, ::-1]
            prior = None if prior is None else prior[::-1]
        order = np.argsort(lon)
        lon, scores = lon[order], scores[:, :, order]
        prior = None if prior is None else prior[:, order]
        out.append(GateRouting(
            name=name, scores=np.ascontiguousarray(scores, dtype=np.float32), num_selected=selected.pop(),
            latitude=np.ascontiguousarray(lat), longitude=np.ascontiguousarray(lon),
            layers=[p for p, _ in layers], prior=None if prior is None else np.ascontiguousarray(prior),
            prior_source=source, prior_strength=float(smoe_cfg.get("prior_strength", 1.0)) if prior is not None
            else None,
        ))
    return out


# ---- routing statistics ----------------------------------------------------------------------------------
def area_weights(latitude: np.ndarray, width: int) -> np.ndarray:
    """(H, W) cell-area weights summing to 1: the scores' area weights
    (:func:`~smoeweather.metrics.weights.cell_area_weights`) on every longitude."""
    w = cell_area_weights(np.asarray(latitude, float)).values[:, None] * np.ones((1, width))
    return w / w.sum()


def planes_off_common_order(top: np.ndarray, prior: np.ndarray | None = None) -> np.ndarray:
    """Per location, the fraction of the E output planes fed by another expert than in the most common ranked
    selection of its category: ``top`` (E, H, W) ranked experts, ``prior`` (H, W) categories or None (one
    category) → (H, W) in [0, 1]. An SMoE's output plane j is its rank-j expert, so this maps where the learned
    rank ORDER departs from a coherent one, which the set-based maps do not show."""
    e, h, w = top.shape
    columns = top.reshape(e, -1).T  # (H·W, E)
    category = np.zeros(h * w, np.int64) if prior is None else np.asarray(prior).reshape(-1)
    out = np.zeros(h * w, np.float64)
    for c in np.unique(category):
        rows = columns[category == c]
        uniq, counts = np.unique(rows, axis=0, return_counts=True)
        out[category == c] = (rows != uniq[np.argmax(counts)]).mean(axis=1)
    return out.reshape(h, w)


def routing_dataset(r: GateRouting, provenance: dict[str, str] | None = None) -> xr.Dataset:
    """The routing of one gate as a CF-1.8 Dataset (see the module docstring for every variable)."""
    n, e = r.num_experts, r.num_selected
    scores = torch.from_numpy(r.scores)
    ranked = scores.sort(dim=0, descending=True)
    top = ranked.indices[:e].numpy()  # (E, H, W)
    margin = (ranked.values[e - 1] - ranked.values[e]).numpy() if e < n else np.full(r.scores.shape[1:], np.nan)
    h, w = r.scores.shape[1:]
    weights = area_weights(r.latitude, w)
    in_top = np.zeros((n, h, w), bool)
    np.put_along_axis(in_top, top, True, axis=0)
    dominant = top[0]
    usage = (in_top * weights).sum(axis=(1, 2))
    dominant_area = np.array([(weights * (dominant == k)).sum() for k in range(n)])
    # distinct top-E sets (as sets: order within the set does not matter), numbered by covered area
    keys = np.packbits(in_top, axis=0).reshape(-1, h * w).T  # (H·W, ceil(|E|/8)) bytes per location
    uniq, inverse = np.unique(keys, axis=0, return_inverse=True)
    inverse = inverse.reshape(-1)
    set_area = np.bincount(inverse, weights=weights.reshape(-1), minlength=len(uniq))
    rank_of_set = np.empty(len(uniq), np.int64)
    rank_of_set[np.argsort(-set_area, kind="stable")] = np.arange(len(uniq))
    region = rank_of_set[inverse].reshape(h, w)

    order_off = planes_off_common_order(top, r.prior)

    lat_attrs = {"standard_name": "latitude", "long_name": "latitude of the cell centre", "units": "degrees_north",
                 "axis": "Y"}
    lon_attrs = {"standard_name": "longitude", "long_name": "longitude of the cell centre", "units": "degrees_east",
                 "axis": "X"}
    coords = {
        "latitude": ("latitude", r.latitude, lat_attrs),
        "longitude": ("longitude", r.longitude, lon_attrs),
        "expert": ("expert", np.arange(n), {"long_name": "expert index of the SMoE layers sharing this gate"}),
        "rank": ("rank", np.arange(e), {"long_name": "position in the top-E set (0 = highest score)"}),
    }
    grid = ("latitude", "longitude")
    data = {
        "gate_scores": (("expert", *grid), r.scores, {"long_name": "routing score of each expert (gate tensor D "
                                                                    "after gate_norm)", "units": "1"}),
        "top_experts": (("rank", *grid), top.astype(np.int32),
                        {"long_name": "top-E experts in descending score order"}),
        "dominant_expert": (grid, dominant.astype(np.int32), {"long_name": "expert with the highest routing score"}),
        "routing_margin": (grid, margin.astype(np.float32), {
            "long_name": "score of the E-th minus score of the (E+1)-th expert", "units": "1"}),
        "order_off_common": (grid, order_off.astype(np.float32), {
            "long_name": "fraction of the E output planes whose expert differs from the most common ranked "
                         "selection of the location's prior category (0 = the category's order; a coherent "
                         "initialisation is 0 everywhere, so this maps the LEARNED rank order)", "units": "1"}),
        "routing_region": (grid, region.astype(np.int32), {
            "long_name": "index of the distinct top-E set used here, 0 = the set covering the largest area"}),
        "expert_usage_area": ("expert", usage, {"long_name": "fraction of the globe's area where the expert is in "
                                                             "the top-E set", "units": "1"}),
        "expert_dominant_area": ("expert", dominant_area, {
            "long_name": "fraction of the globe's area where the expert is the dominant expert", "units": "1"}),
    }
    attrs = {
        "Conventions": "CF-1.8",
        "title": f"SMoE routing of gate {r.name}",
        "gate": r.name,
        "num_experts": n,
        "num_selected": e,
        "n_distinct_sets": int(len(uniq)),
        "layers": ", ".join(r.layers),
        "area_weights": "cell areas between mid-latitudes (as the scores), normalised to sum 1",
        **(provenance or {}),
    }
    if r.prior is not None:
        k = int(r.prior.max()) + 1
        group = np.arange(n) * k // n  # as TensorRoutingGate.init_from_prior
        outside = (group[top] != r.prior[None]).sum(axis=0)
        data["prior_category"] = (grid, r.prior.astype(np.int32), {
            "long_name": "land-sea prior the gate was initialised from", "flag_values": np.arange(k, dtype=np.int32),
            "flag_meanings": "sea land" if k == 2 else " ".join(f"category_{i}" for i in range(k))})
        data["expert_prior_group"] = ("expert", group.astype(np.int32), {
            "long_name": "prior category whose locations the expert was assigned to at initialisation"})
        data["n_experts_outside_prior_group"] = (grid, outside.astype(np.int32), {
            "long_name": "number of the E selected experts not in the expert group of the prior's category"})
        attrs["prior_source"] = r.prior_source or ""
        attrs["prior_strength"] = r.prior_strength if r.prior_strength is not None else np.nan
    return xr.Dataset(data, coords=coords, attrs=attrs)


# ---- a checkpoint's routing ------------------------------------------------------------------------------
@dataclass
class CheckpointRouting:
    """The gates of one checkpoint: ``routings`` (see :func:`gate_routings`), ``provenance`` (netCDF attributes
    naming the checkpoint and its SHA-256) and ``run_name`` (the training run's folder name, for titles)."""

    routings: list[GateRouting]
    provenance: dict[str, str]
    run_name: str


def checkpoint_routing(checkpoint: str | Path, land_sea: str | Path | None = None,
                       member: int | None = None) -> CheckpointRouting:
    """The routing of every gate of a trained checkpoint (loaded with torch and the model code only, as
    ``smoe forecast`` loads it). ``member``: only the gates of that E³ member (0-based; ``model.name: e3``, gates
    ``M<m>_…``, each routing within its member's expert group); ValueError naming the checkpoint otherwise."""
    trained = load_network(checkpoint)
    routings = gate_routings(trained.model, trained.metadata, trained.config, land_sea)
    if member is not None:
        mcfg = trained.config.get("model") or {}
        members = int(mcfg.get("members", 0)) if mcfg.get("name") == "e3" else 0
        if not members:
            raise ValueError(f"{checkpoint}: --member applies to E³ checkpoints (model.name e3), this one is "
                             f"model {mcfg.get('name')!r}")
        if not 0 <= member < members:
            raise ValueError(f"{checkpoint}: --member must be in 0..{members - 1} (model.members = {members}), "
                             f"got {member}")
        routings = [r for r in routings if r.name.startswith(f"M{member}_")]
    provenance = {"source_checkpoint": str(trained.path), "checkpoint_sha256": trained.sha256,
                  "task": trained.task, "history": "smoe plot routing"}
    run_name = Path(str(trained.config.get("output_dir") or trained.path.stem)).name
    return CheckpointRouting(routings, provenance, run_name)


def routing_summary(r: GateRouting, ds: xr.Dataset) -> dict[str, Any]:
    """One gate's headline numbers from its :func:`routing_dataset` ``ds``: distinct sets, experts dominant
    somewhere / used, median margin, and the area fractions (cos-latitude weights) with an own rank order and,
    with a prior, routed as initialised."""
    summary = {"n_distinct_sets": int(ds.attrs["n_distinct_sets"]),
               "experts_dominant_somewhere": int((ds["expert_dominant_area"] > 0).sum()),
               "experts_used": int((ds["expert_usage_area"] > 0).sum()),
               "num_experts": r.num_experts, "num_selected": r.num_selected,
               "median_margin": float(np.nanmedian(ds["routing_margin"].values)),
               "area_with_own_order": float((area_weights(r.latitude, len(r.longitude))
                                             * (ds["order_off_common"].values > 0)).sum())}
    if "n_experts_outside_prior_group" in ds:
        w = area_weights(r.latitude, len(r.longitude))
        summary["area_routed_as_prior"] = float((w * (ds["n_experts_outside_prior_group"].values == 0)).sum())
        summary["mean_experts_outside_prior_group"] = float((w * ds["n_experts_outside_prior_group"].values).sum())
    return summary
