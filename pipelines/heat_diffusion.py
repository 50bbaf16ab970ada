"""Location-dependent heat diffusion (SMoE paper §3.1): region map, stencils, vectorised simulation, zarr.

The generator follows the paper and the reference code:

* region map S×S with 3 region types, filled in raster order by preferential attachment: start with
  p = 1/3 per type; every already-assigned neighbour of type t in the 3×3 window adds 0.1333 to p_t and
  removes 0.0667 from each other type;
* stencil of region r: [[0, d, 0], [d, 1 − 4d, d], [0, d, 0]] with d ∈ {0.25, 0.025, 0.0025};
* zero (Dirichlet) boundary: the field is zero outside the domain;
* initial field U(0, 0.1) plus n ∈ {1, 2, 3} heat drops of value 1.0 per region type;
* each step convolves the field with every stencil and takes each pixel from its own region's result.

Two generator variants (``generator=``):

* ``reference`` — the reference code's choices exactly: ONE drop count n per run shared by all region
  types, drop cells drawn WITH replacement (so two drops may coincide), the field simulated in float64
  and stored as float32; used with the reference's region map (``heat/mask.npy``, loaded with
  :func:`load_region_mask`) and its diffusivity order (type 0 → 0.0025, 1 → 0.025, 2 → 0.25).
* ``project`` (the original variant of this package) — a separate n per region type, drops without
  replacement, float32 simulation.

All runs of a batch are simulated at once (torch conv2d over a batch of fields), not one by one.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch
import xarray as xr
from torch.nn import functional as F

from pipelines.atomic import atomic_path
from pipelines.progress import progress_bar

DIFFUSIVITIES = (0.25, 0.025, 0.0025)
REFERENCE_DIFFUSIVITIES = (0.0025, 0.025, 0.25)  # the order the reference README passes them
SPLITS = ("train", "val", "test")
GENERATORS = ("project", "reference")


def load_region_mask(path: str | Path, num_regions: int | None = None) -> np.ndarray:
    """Region map from a user-supplied ``.npy`` file (e.g. the reference's ``heat/mask.npy``): (S, S) int8.

    The file must hold a square 2-D integer array (or floats with integral values) whose values are the
    region types 0..R−1, each present at least once; ``num_regions`` (if given) must equal R.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"region mask {path} does not exist (expected a .npy file of region types)")
    try:
        mask = np.load(path, allow_pickle=False)
    except (ValueError, OSError) as err:
        raise ValueError(f"region mask {path} is not a readable .npy array: {err}") from err
    if mask.ndim != 2 or mask.shape[0] != mask.shape[1] or mask.size == 0:
        raise ValueError(f"region mask {path} must be a square 2-D array (S, S), got shape {mask.shape}")
    if not (np.issubdtype(mask.dtype, np.integer) or np.issubdtype(mask.dtype, np.floating)):
        raise ValueError(f"region mask {path} must hold integer region types, got dtype {mask.dtype}")
    if np.issubdtype(mask.dtype, np.floating) and not (np.isfinite(mask).all() and (mask == np.round(mask)).all()):
        raise ValueError(f"region mask {path} holds non-integral values; expected region types 0..R-1")
    types = np.unique(mask).astype(np.int64)
    if types[0] != 0 or not np.array_equal(types, np.arange(types.size)):
        raise ValueError(f"region mask {path} must use the region types 0..R-1 each at least once, "
                         f"got {types.tolist()}")
    if num_regions is not None and types.size != num_regions:
        raise ValueError(f"region mask {path} has {types.size} region types, expected {num_regions} "
                         f"(one per diffusivity)")
    if types.size > 127:
        raise ValueError(f"region mask {path} has {types.size} region types; at most 127 are supported")
    return mask.astype(np.int8)


def region_map(
    size: int, num_regions: int = 3, seed: int = 0, step: float = 0.1333, penalty: float = 0.0667
) -> np.ndarray:
    """Region map (size, size) of int8 types 0..num_regions−1 by raster-order preferential attachment."""
    rng = np.random.default_rng(seed)
    regions = np.full((size, size), -1, dtype=np.int8)
    for i in range(size):
        for j in range(size):
            p = np.full(num_regions, 1.0 / num_regions)
            window = regions[max(i - 1, 0) : i + 2, max(j - 1, 0) : j + 2]
            for t in window[window >= 0]:
                p -= penalty
                p[t] += step + penalty
            p = np.clip(p, 0.0, None)
            regions[i, j] = rng.choice(num_regions, p=p / p.sum())
    return regions


def stencils(diffusivities: tuple[float, ...] = DIFFUSIVITIES, dtype: type = np.float32) -> np.ndarray:
    """Five-point diffusion stencils, one per region: (R, 3, 3) of ``dtype`` (float32 by default)."""
    out = np.zeros((len(diffusivities), 3, 3), dtype=dtype)
    for r, d in enumerate(diffusivities):
        out[r] = [[0, d, 0], [d, 1 - 4 * d, d], [0, d, 0]]
    return out


def diffusion_step(field: torch.Tensor, regions: torch.Tensor, kernels: torch.Tensor) -> torch.Tensor:
    """One step: (N, 1, S, S) → (N, 1, S, S); ``regions`` (S, S) long, ``kernels`` (R, 3, 3)."""
    all_regions = F.conv2d(field, kernels.unsqueeze(1), padding=1)  # zero boundary, (N, R, S, S)
    index = regions.expand(field.shape[0], 1, *regions.shape)
    return all_regions.gather(1, index)


def initial_states(num_runs: int, regions: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """(num_runs, S, S) float32: U(0, 0.1) plus 1–3 heat drops of 1.0 in every region type."""
    size = regions.shape[0]
    fields = rng.uniform(0.0, 0.1, size=(num_runs, size, size)).astype(np.float32)
    flat_regions = regions.ravel()
    for r in range(int(regions.max()) + 1):
        cells = np.flatnonzero(flat_regions == r)
        for n in range(num_runs):
            drops = rng.choice(cells, size=min(int(rng.integers(1, 4)), cells.size), replace=False)
            fields[n].ravel()[drops] = 1.0
    return fields


def initial_states_reference(num_runs: int, regions: np.ndarray, rng: np.random.Generator,
                             max_drops: int = 3) -> np.ndarray:
    """(num_runs, S, S) float64 as the reference generator draws them: U(0, 0.1), then ONE drop count
    n ∈ {1..max_drops} per run shared by every region type, n cells per type drawn with replacement."""
    fields = np.empty((num_runs, *regions.shape), dtype=np.float64)
    cells = [np.argwhere(regions == r) for r in range(int(regions.max()) + 1)]
    for n in range(num_runs):
        fields[n] = rng.uniform(0.0, 0.1, regions.shape)
        count = int(rng.integers(1, max_drops, endpoint=True))
        for where in cells:
            drops = rng.choice(where, size=count)  # with replacement, as the reference
            fields[n][drops[:, 0], drops[:, 1]] = 1.0
    return fields


def simulate(
    initial: np.ndarray, regions: np.ndarray, steps: int, diffusivities: tuple[float, ...] = DIFFUSIVITIES
) -> np.ndarray:
    """Run ``steps`` steps from (N, S, S) initial fields; returns (N, steps + 1, S, S) float32.

    The simulation runs in the dtype of ``initial`` (float32 or float64); frames are stored as float32.
    """
    kernels = torch.from_numpy(stencils(diffusivities, dtype=initial.dtype))
    region_t = torch.from_numpy(regions.astype(np.int64))
    field = torch.from_numpy(initial).unsqueeze(1)
    frames = [field.float()]
    with torch.no_grad():
        for _ in range(steps):
            field = diffusion_step(field, region_t, kernels)
            frames.append(field.float())
    return torch.cat(frames, dim=1).numpy()


def _split_batches(
    runs: dict[str, int], seed: int, batch: int
) -> Iterator[tuple[str, int, np.random.Generator]]:
    for k, split in enumerate(SPLITS):
        rng = np.random.default_rng([seed, k + 1])  # separate seed per split
        left = runs[split]
        while left > 0:
            n = min(batch, left)
            yield split, n, rng
            left -= n


def generate(
    out: str | Path,
    runs: int = 1000,
    val_runs: int = 20,
    test_runs: int = 20,
    steps: int = 100,
    size: int = 64,
    seed: int = 0,
    overwrite: bool = False,
    batch_runs: int = 50,
    progress: bool = True,
    generator: str = "project",
    mask: str | Path | np.ndarray | None = None,
    diffusivities: tuple[float, ...] | list[float] | None = None,
) -> Path:
    """Generate the heat-diffusion dataset into a zarr store (atomically).

    ``generator``: ``project`` or ``reference`` (see the module docstring). ``mask``: a region map — a
    path to a ``.npy`` file or an (S, S) array — instead of drawing one with :func:`region_map` (``size``
    is then the mask's). ``diffusivities``: one per region type; default :data:`DIFFUSIVITIES`, or
    :data:`REFERENCE_DIFFUSIVITIES` for the reference generator.

    Store layout (zarr v2, consolidated): ``heat`` (run, step, y, x) float32, one run per chunk, with
    coordinate ``split`` (run) = 0 train / 1 val / 2 test (CF flag_values); ``region`` (y, x) int8;
    ``stencil`` (region_type, ky, kx); ``diffusivity`` (region_type). Frames are dimensionless.
    """
    for name, value in (("runs", runs), ("steps", steps), ("size", size)):
        if value < 1:
            raise ValueError(f"--{name} must be ≥ 1, got {value}")
    if val_runs < 1 or test_runs < 1:
        raise ValueError(f"--val-runs and --test-runs must be ≥ 1, got {val_runs}, {test_runs}")
    if generator not in GENERATORS:
        raise ValueError(f"--generator must be one of {', '.join(GENERATORS)}, got {generator!r}")
    if diffusivities is None:
        diffusivities = REFERENCE_DIFFUSIVITIES if generator == "reference" else DIFFUSIVITIES
    diffusivities = tuple(float(d) for d in diffusivities)
    out = Path(out)
    mask_source = "preferential attachment (region_map)"
    if mask is None:
        regions = region_map(size, num_regions=len(diffusivities), seed=seed)
    elif isinstance(mask, np.ndarray):
        regions, mask_source = mask.astype(np.int8), "array"
    else:
        regions, mask_source = load_region_mask(mask, num_regions=len(diffusivities)), str(mask)
    if int(regions.max()) + 1 != len(diffusivities):
        raise ValueError(f"the region map has {int(regions.max()) + 1} types but {len(diffusivities)} "
                         f"diffusivities were given")
    size = int(regions.shape[0])
    draw = initial_states_reference if generator == "reference" else initial_states
    attrs = {
        "title": "Location-dependent heat diffusion (Dryden & Hoefler 2022, §3.1)",
        "seed": seed,
        "steps": steps,
        "size": size,
        "runs_train": runs,
        "runs_val": val_runs,
        "runs_test": test_runs,
        "boundary": "zero (Dirichlet)",
        "generator": generator,
        "region_map": mask_source,
        "Conventions": "CF-1.8",
    }
    counts = {"train": runs, "val": val_runs, "test": test_runs}
    total = sum(counts.values())
    with atomic_path(out, overwrite=overwrite) as tmp:
        first = True
        bar = progress_bar(total, f"heat diffusion → {out.name}", unit="run", enabled=progress)
        for split, n, rng in _split_batches(counts, seed, batch_runs):
            frames = simulate(draw(n, regions, rng), regions, steps, diffusivities)
            ds = xr.Dataset(
                {"heat": (("run", "step", "y", "x"), frames)},
                coords={"split": ("run", np.full(n, SPLITS.index(split), dtype=np.int8))},
            )
            ds["split"].attrs = {"flag_values": [0, 1, 2], "flag_meanings": " ".join(SPLITS)}
            ds["heat"].attrs = {"long_name": "temperature", "units": "1"}
            ds.attrs = attrs  # every write: an append would otherwise replace the store's attributes
            if first:
                ds = ds.assign(
                    region=(("y", "x"), regions),
                    stencil=(("region_type", "ky", "kx"), stencils(diffusivities)),
                    diffusivity=(("region_type",), np.asarray(diffusivities, dtype=np.float32)),
                )
                encoding = {"heat": {"chunks": (1, steps + 1, size, size)}}
                ds.to_zarr(tmp, mode="w", encoding=encoding, consolidated=True, zarr_format=2)
                first = False
            else:
                ds.to_zarr(tmp, append_dim="run", consolidated=True, zarr_format=2)
            bar.update(n)
        bar.close()
    return out


def split_runs(ds: xr.Dataset, split: str) -> np.ndarray:
    """Indices of the runs of ``split`` (train, val or test) in a heat store."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    return np.flatnonzero(ds["split"].values == SPLITS.index(split))


def open_heat(store: str | Path) -> xr.Dataset:
    """Open a heat-diffusion store (lazily), with a clear error when it is not one."""
    store = Path(store)
    if not store.exists():
        raise FileNotFoundError(f"heat store {store} does not exist (create it with `smoe heat generate`)")
    ds = xr.open_zarr(store, consolidated=True)
    missing = {"heat", "region", "stencil", "split"} - set(ds.variables)
    if missing:
        raise ValueError(f"{store} is not a heat-diffusion store: missing {sorted(missing)}")
    return ds
