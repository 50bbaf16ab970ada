"""A trained or exported smoeweather forecast network as an earth2studio prognostic model.

    smoe export runs/weatherbench/world_smoe_all_prior/checkpoints/last.ckpt --out exports/world_smoe  # in a shell

    from earth2studio import run
    from earth2studio.data import DataArrayFile
    from earth2studio.io import ZarrBackend
    model = SmoePrognostic.load("exports/world_smoe", constants="runs/data/default_world.zarr")
    to_earth2studio("runs/data/default_world.zarr", model.input_variables).to_zarr("runs/ic.zarr")
    data = DataArrayFile("runs/ic.zarr", engine="zarr")
    run.deterministic(["2003-01-01", "2003-01-02"], 2, model, data, ZarrBackend("runs/e2s.zarr"))

:class:`SmoePrognostic` follows earth2studio's ``PrognosticModel`` protocol (``input_coords``, ``output_coords``,
``__call__``, ``create_iterator``, ``to``) without importing earth2studio: this module needs only torch, numpy and
xarray, and earth2studio (the ``earth2studio`` extra) runs the workflows.

Coordinates, in earth2studio's conventions:

* ``variable``: earth2studio's lexicon (``z500``, ``t850``, ``t2m``, ``msl``, ...), mapped from the network's
  WeatherBench 2 / ERA5 fields (``geopotential`` at 500 hPa, ...) by :func:`lexicon_name`; units are the canonical
  ones of :mod:`pipelines.canonical`, which are earth2studio's (m² s⁻², K, Pa, ...); a model card recording
  other units is refused;
* ``lat`` descending (north to south) and ``lon`` ascending in [0, 360), whatever the network's own order (the
  fields are put in its order for it and back after it);
* ``lead_time`` (np.timedelta64): the inputs at the network's input offsets (``[-12 h, -6 h, 0 h]`` by default),
  the outputs at one step of :attr:`SmoePrognostic.step` after the last input;
* ``ensemble``: an ensemble network (E³, deep ensemble, MC dropout) gives its members along it.

The network's constants (land-sea mask, orography; latitude is computed) are not fields of the data source: they
are read once, from ``constants=`` (a prepared store), as a forecast centre holds a model's invariants.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import xarray as xr

from smoeweather.data.forecast_stores import GRID_ATOL, Sources, check_grid, open_canonical
from smoeweather.data.weather import Field, field_name
from smoeweather.forecast.model import ModelSpec, constants_tensor
from smoeweather.models.ensemble import members_of, model_kind, physical_members
from smoeweather.models.loader import TrainedNetwork, load_network

__all__ = ["SmoePrognostic", "lexicon_name", "lexicon_field", "to_earth2studio", "schedule", "LEVEL_PREFIXES",
           "SURFACE_NAMES"]

LEVEL_PREFIXES = {"geopotential": "z", "temperature": "t", "u_component_of_wind": "u",
                  "v_component_of_wind": "v", "vertical_velocity": "w", "specific_humidity": "q",
                  "relative_humidity": "r", "potential_vorticity": "pv"}
"""Pressure-level variables → earth2studio's prefix (``geopotential`` at 500 hPa is ``z500``)."""
SURFACE_NAMES = {"2m_temperature": "t2m", "10m_u_component_of_wind": "u10m", "10m_v_component_of_wind": "v10m",
                 "mean_sea_level_pressure": "msl", "surface_pressure": "sp", "toa_incident_solar_radiation": "tisr",
                 "total_precipitation": "tp", "total_precipitation_6hr": "tp06", "convective_precipitation": "cp",
                 "total_cloud_cover": "tcc", "total_column_water": "tcw", "total_column_water_vapour": "tcwv",
                 "sea_surface_temperature": "sst", "skin_temperature": "skt", "land_sea_mask": "lsm",
                 "geopotential_at_surface": "z"}
"""Single-level variables → earth2studio's name (as its WeatherBench 2 lexicon maps them)."""
_PREFIX_OF = {v: k for k, v in LEVEL_PREFIXES.items()}
_SURFACE_OF = {v: k for k, v in SURFACE_NAMES.items()}
_HOUR = np.timedelta64(1, "h")


def lexicon_name(field: Field) -> str:
    """earth2studio's name of a (variable, level hPa or None) field: ``("geopotential", 500)`` → ``z500``,
    ``("2m_temperature", None)`` → ``t2m``; ValueError for a field its lexicon has no name for."""
    name, level = field
    if level is None and name in SURFACE_NAMES:
        return SURFACE_NAMES[name]
    if level is not None and name in LEVEL_PREFIXES and float(level).is_integer():
        return f"{LEVEL_PREFIXES[name]}{int(level)}"
    raise ValueError(f"{field_name(field)}: no name in earth2studio's lexicon (mapped: pressure-level "
                     f"{sorted(LEVEL_PREFIXES)} at whole hPa, single-level {sorted(SURFACE_NAMES)})")


def lexicon_field(name: str) -> Field:
    """The (variable, level hPa or None) field of an earth2studio name (``z500`` → ``("geopotential", 500)``);
    the inverse of :func:`lexicon_name`."""
    if name in _SURFACE_OF:
        return _SURFACE_OF[name], None
    prefix = name.rstrip("0123456789")
    if prefix in _PREFIX_OF and prefix != name:
        return _PREFIX_OF[prefix], int(name[len(prefix):])
    raise ValueError(f"{name!r} is not an earth2studio name smoeweather maps (e.g. z500, t850, t2m, msl)")


def lexicon_grid(latitude: Any, longitude: Any) -> tuple[np.ndarray, np.ndarray]:
    """(lat descending, lon ascending in [0, 360)) of a grid given in any order (degrees)."""
    return np.sort(np.asarray(latitude, np.float64))[::-1].copy(), np.sort(np.mod(np.asarray(longitude,
                                                                                              np.float64), 360.0))


def to_earth2studio(data: Sources | xr.Dataset, variables: Sequence[str]) -> xr.DataArray:
    """Canonical data (a prepared store, canonical files or their Dataset) as earth2studio reads a data source:
    one lazy DataArray (time, variable, lat, lon), ``variable`` the earth2studio names ``variables`` (e.g.
    :attr:`SmoePrognostic.input_variables`), ``lat`` descending, ``lon`` ascending in [0, 360); values as stored.
    Write it with ``.to_zarr(PATH)`` and read it with ``earth2studio.data.DataArrayFile(PATH, engine="zarr")``."""
    ds = data if isinstance(data, xr.Dataset) else open_canonical(data)
    planes = []
    for name in variables:
        var, level = lexicon_field(name)
        if var not in ds.data_vars:
            raise ValueError(f"{name} ({field_name((var, level))}): the data hold no {var!r}; "
                             f"available: {sorted(map(str, ds.data_vars))}")
        da = ds[var] if level is None else ds[var].sel(level=level, drop=True)
        if set(da.dims) != {"time", "latitude", "longitude"}:
            raise ValueError(f"{name}: dims {da.dims}; earth2studio's data source needs (time, latitude, longitude)")
        planes.append(da.reset_coords(drop=True).drop_attrs())
    out = xr.concat(planes, dim="variable", coords="minimal", compat="override", join="exact")
    out = out.assign_coords(variable=np.asarray(variables, dtype=str))
    out = out.transpose("time", "variable", "latitude", "longitude").rename(latitude="lat", longitude="lon")
    out = out.assign_coords(lon=np.mod(out["lon"].values, 360.0)).sortby("lon").sortby("lat", ascending=False)
    return out.drop_encoding().rename("fields")


def schedule(spec: ModelSpec) -> tuple[int, int | None]:
    """(step in hours, most steps or None for any number) of a network's rollout.

    Continuous lead: a direct forecast at every multiple of the step (the greatest common divisor of the training
    leads) up to the longest training lead. Fixed lead: step = the lead, rolled out while every input of the next
    step (its offsets after the last step) is an input or an earlier output, and the outputs include the inputs."""
    if spec.continuous:
        leads = sorted({int(h) for h in spec.trained_leads_h})
        step = math.gcd(*leads)
        return step, leads[-1] // step
    step = int(spec.trained_leads_h[0])
    if not set(spec.variables) <= set(spec.targets):
        return step, 1
    known = set(spec.offsets_h)
    for k in range(1, 3 + max(-o for o in spec.offsets_h) // step):  # past the history window it repeats
        known.add(k * step)
        if any(k * step + o not in known for o in spec.offsets_h):
            return step, k
    return step, None


def _positions(have: np.ndarray, want: np.ndarray) -> torch.Tensor:
    """Index of each value of ``want`` in ``have`` (the same values in another order), as a long tensor."""
    order = np.argsort(have)
    found = order[np.searchsorted(have[order], want)]
    if not np.allclose(have[found], want, atol=GRID_ATOL, rtol=0):
        raise ValueError("grid coordinates differ")
    return torch.as_tensor(found, dtype=torch.long)


class SmoePrognostic(torch.nn.Module):
    """A ``weatherbench`` network of smoeweather (:class:`~smoeweather.models.loader.TrainedNetwork`) as an
    earth2studio ``PrognosticModel``; ``constants``: a prepared store (or canonical Dataset) holding the network's
    constant inputs on its grid (needed unless latitude is its only one). Tensors (..., lead_time, variable, lat,
    lon) float32, physical units; every dim before ``lead_time`` is a batch dim (``time``, ``ensemble``, ...).

    A Gaussian network (μ and σ) has no place in earth2studio's coordinates and is refused; so are
    post-processing networks.
    """

    def __init__(self, trained: TrainedNetwork, constants: Sources | xr.Dataset | None = None) -> None:
        super().__init__()
        self.spec = spec = ModelSpec(trained)  # ValueError for another task
        kind = model_kind(trained.config.get("model", {}))
        if kind == "gaussian":
            raise ValueError(f"{trained.path}: a gaussian network forecasts μ and σ, which earth2studio's prognostic "
                             "coordinates cannot hold; use smoe forecast")
        self.ensemble_size = members_of(trained.config["model"]) if kind == "ensemble" else None
        """Members of an ensemble network (None: deterministic)."""
        self.network = trained.model.eval()
        self.path = trained.path
        self.input_variables = [lexicon_name(f) for f in spec.variables]
        self.output_variables = [lexicon_name(f) for f in spec.targets]
        _check_units(trained, [*spec.variables, *spec.targets])
        self.lat, self.lon = lexicon_grid(spec.latitude, spec.longitude)
        self._to_model = (_positions(self.lat, spec.latitude), _positions(self.lon, np.mod(spec.longitude, 360.0)))
        self._from_model = tuple(torch.argsort(p) for p in self._to_model)
        self.register_buffer("constants", self._constants(constants), persistent=False)
        step_h, self.max_steps = schedule(spec)
        self.step = np.timedelta64(step_h, "h")
        """The time step of the iterator and of one call (np.timedelta64)."""
        self._offsets = np.array([np.timedelta64(int(o), "h") for o in spec.offsets_h])
        self._from_inputs = [spec.variables.index(f) if f in spec.variables else -1 for f in spec.targets]
        self._to_inputs = [spec.targets.index(f) if f in spec.targets else -1 for f in spec.variables]

    @classmethod
    def load(cls, path: str | Path, constants: Sources | xr.Dataset | None = None,
             map_location: str | torch.device = "cpu") -> SmoePrognostic:
        """The wrapper of the network of a ``smoe train`` checkpoint or a ``smoe export`` folder, loaded by
        :func:`smoeweather.load_model` (nothing is unpickled)."""
        return cls(load_network(path, map_location=map_location), constants)

    def __str__(self) -> str:
        return f"smoeweather({self.path})"

    def _constants(self, constants: Sources | xr.Dataset | None) -> torch.Tensor:
        """The constant input planes (C, H, W) float32 on the network's grid, as ``smoe forecast`` reads them."""
        spec, where = self.spec, f"constants {constants}"
        if all(c == "latitude" for c in spec.constants):
            return constants_tensor(xr.Dataset(), spec, where)
        if constants is None:
            raise ValueError(f"{self.path}: the network reads the constants {spec.constants}; pass constants=STORE "
                             "(a prepared store holding them on the network's grid)")
        ds = constants if isinstance(constants, xr.Dataset) else open_canonical(constants)
        missing = [c for c in spec.constants if c != "latitude" and c not in ds.data_vars]
        if missing:
            raise ValueError(f"{where}: lacks the network's constants {missing}")
        lat, lon = np.sort(spec.latitude), np.sort(np.mod(spec.longitude, 360.0))
        check_grid(ds, lat, lon, where, "the network's grid (regrid with smoe data prepare --grid)")
        ds = ds.isel(latitude=np.searchsorted(lat, spec.latitude),
                     longitude=np.searchsorted(lon, np.mod(spec.longitude, 360.0)))
        return constants_tensor(ds, spec, where)

    # -- coordinates ---------------------------------------------------------------------------------------------
    def input_coords(self) -> OrderedDict[str, np.ndarray]:
        """(batch, lead_time, variable, lat, lon): the inputs at the network's offsets (lead_time ≤ 0)."""
        return OrderedDict(batch=np.empty(0), lead_time=self._offsets.copy(),
                           variable=np.array(self.input_variables), lat=self.lat.copy(), lon=self.lon.copy())

    def output_coords(self, input_coords: OrderedDict[str, np.ndarray]) -> OrderedDict[str, np.ndarray]:
        """The coordinates one :attr:`step` after ``input_coords``: lead_time its last + step, the output
        variables, and an ``ensemble`` of every member after ``lead_time`` for an ensemble network given no
        ``ensemble`` dim. ValueError when ``input_coords`` are not the :meth:`input_coords` (batch dims aside)."""
        leading, last = self._check(input_coords)
        return self._coords(leading, last + self.step, fan_out=self._fans_out(leading))

    def _check(self, coords: OrderedDict[str, np.ndarray]) -> tuple[OrderedDict[str, np.ndarray], np.timedelta64]:
        """(the batch dims' coords, the last input lead time) of coordinates checked against :meth:`input_coords`."""
        dims = list(coords)
        if "lead_time" not in dims or dims[dims.index("lead_time"):] != ["lead_time", "variable", "lat", "lon"]:
            raise ValueError(f"{self}: input dims {dims}; expected [..., lead_time, variable, lat, lon]")
        if list(coords["variable"]) != self.input_variables:
            raise ValueError(f"{self}: input variables {list(coords['variable'])}; expected {self.input_variables}")
        for dim, want in (("lat", self.lat), ("lon", self.lon)):
            have = np.asarray(coords[dim], np.float64)
            if have.shape != want.shape or not np.allclose(have, want, atol=GRID_ATOL, rtol=0):
                raise ValueError(f"{self}: input {dim} differs from the network's grid ({want.size} points, "
                                 f"{want[0]}..{want[-1]}); map or regrid the data first")
        leads = np.asarray(coords["lead_time"]).astype("timedelta64[ns]")
        if leads.shape != self._offsets.shape or not np.array_equal(leads - leads[-1], self._offsets):
            raise ValueError(f"{self}: input lead_time {leads.astype('timedelta64[h]')}; expected the offsets "
                             f"{self._offsets} after some lead time")
        leading = OrderedDict((k, coords[k]) for k in dims[: dims.index("lead_time")])
        return leading, leads[-1]

    def _fans_out(self, leading: OrderedDict[str, np.ndarray]) -> bool:
        """Whether each input gives every member (an ensemble network given no ``ensemble`` dim)."""
        return self.ensemble_size is not None and "ensemble" not in leading

    def _coords(self, leading: OrderedDict[str, np.ndarray], lead: np.timedelta64, fan_out: bool
                ) -> OrderedDict[str, np.ndarray]:
        out = OrderedDict(leading)
        out["lead_time"] = np.array([lead]).astype("timedelta64[ns]")
        if fan_out:
            out["ensemble"] = np.arange(self.ensemble_size)
        out.update(variable=np.array(self.output_variables), lat=self.lat.copy(), lon=self.lon.copy())
        return out

    # -- computation ---------------------------------------------------------------------------------------------
    def _rows(self, x: torch.Tensor, n_leading: int) -> torch.Tensor:
        """(..., L, V, lat, lon) earth2studio order → (rows, L, V, H, W) float32 on the network's grid."""
        rows = x.reshape(-1, *x.shape[n_leading:]).float()
        lat, lon = (p.to(x.device) for p in self._to_model)
        return rows.index_select(-2, lat).index_select(-1, lon)

    def _members(self, leading: OrderedDict[str, np.ndarray], shape: Sequence[int]) -> np.ndarray | None:
        """The network member of every row (from the ``ensemble`` coordinate), or None."""
        if self.ensemble_size is None or "ensemble" not in leading:
            return None
        ids = np.asarray(leading["ensemble"])
        bad = [int(i) for i in ids if not (float(i).is_integer() and 0 <= i < self.ensemble_size)]
        if bad:
            raise ValueError(f"{self}: ensemble members {bad} do not exist; the network has {self.ensemble_size} "
                             f"(0 .. {self.ensemble_size - 1}): run.ensemble with nensemble={self.ensemble_size}")
        axis = list(leading).index("ensemble")
        view = ids.astype(np.int64).reshape([-1 if i == axis else 1 for i in range(len(shape))])
        return np.broadcast_to(view, tuple(shape)).reshape(-1).copy()

    def _forward(self, inputs: torch.Tensor, lead_h: int | None, members: np.ndarray | None) -> torch.Tensor:
        """One network evaluation: inputs (R, L, V, H, W) on its grid, ``lead_h`` (continuous lead, else None)
        → (R, C_out, H, W), or (R·M, C_out, H, W) rows member-minor for an ensemble network without ``members``.
        The input planes are laid out as ``smoe forecast`` lays them (offset-major, constants, τ/100 h)."""
        r, h, w = inputs.shape[0], inputs.shape[-2], inputs.shape[-1]
        parts = [inputs.reshape(r, -1, h, w), self.constants.to(inputs.device).expand(r, -1, -1, -1)]
        if lead_h is not None:
            parts.append(torch.full((r, 1, h, w), lead_h / 100.0, device=inputs.device))
        x = torch.cat(parts, dim=1)
        with torch.no_grad():
            if self.ensemble_size is None:
                return self.network(x).float()
            with torch.random.fork_rng(devices=[]):  # MC-dropout members are seeded draws, as in smoe forecast
                torch.manual_seed(0)
                y = physical_members(self.network, x, "ensemble").float()  # (R, M, C, H, W)
        if members is None:
            return y.flatten(0, 1)
        return y[torch.arange(r, device=y.device), torch.as_tensor(members, device=y.device)]

    def _emit(self, rows: torch.Tensor, leading: OrderedDict[str, np.ndarray], shape: Sequence[int],
              lead: np.timedelta64, fan_out: bool) -> tuple[torch.Tensor, OrderedDict[str, np.ndarray]]:
        """(R[·M], C, H, W) rows on the network's grid → (..., 1, [M,] C, lat, lon) earth2studio order + coords."""
        lat, lon = (p.to(rows.device) for p in self._from_model)
        y = rows.index_select(-2, lat).index_select(-1, lon)
        members = [self.ensemble_size] if fan_out else []
        y = y.reshape(*shape, 1, *members, *y.shape[1:])
        return y, self._coords(leading, lead, fan_out)

    def __call__(self, x: torch.Tensor, coords: OrderedDict[str, np.ndarray]
                 ) -> tuple[torch.Tensor, OrderedDict[str, np.ndarray]]:
        """One :attr:`step` from the inputs ``x`` (..., lead_time, variable, lat, lon) with ``coords``: the
        output (..., 1, [ensemble,] variable, lat, lon) and its coordinates (:meth:`output_coords`)."""
        leading, last = self._check(coords)
        n = len(leading)
        rows = self._rows(x, n)
        lead_h = int(self.step / _HOUR) if self.spec.continuous else None
        fan_out = self._fans_out(leading)
        y = self._forward(rows, lead_h, self._members(leading, x.shape[:n]))
        return self._emit(y, leading, x.shape[:n], last + self.step, fan_out)

    def create_iterator(self, x: torch.Tensor, coords: OrderedDict[str, np.ndarray]
                        ) -> Iterator[tuple[torch.Tensor, OrderedDict[str, np.ndarray]]]:
        """The initial condition (the output variables at the last input lead time; NaN for one that is not an
        input), then one output per :attr:`step`: a continuous-lead network forecasts each lead directly from
        the initial condition, a fixed-lead one rolls out on its own outputs (member by member for an ensemble).
        ValueError when asked for more than :attr:`max_steps` steps."""
        leading, last = self._check(coords)
        n, shape = len(leading), tuple(x.shape[: len(leading)])
        rows = self._rows(x, n)
        fan_out, members = self._fans_out(leading), self._members(leading, shape)
        first = torch.stack([rows[:, -1, i] if i >= 0 else torch.full_like(rows[:, -1, 0], torch.nan)
                             for i in self._from_inputs], dim=1)
        if fan_out:
            first = first.repeat_interleave(self.ensemble_size, dim=0)
        yield self._emit(first, leading, shape, last, fan_out)
        yield from self._steps(rows, leading, shape, last, members)

    def _steps(self, rows: torch.Tensor, leading: OrderedDict[str, np.ndarray], shape: Sequence[int],
               last: np.timedelta64, members: np.ndarray | None
               ) -> Iterator[tuple[torch.Tensor, OrderedDict[str, np.ndarray]]]:
        """The forecast steps of :meth:`create_iterator` from the inputs ``rows`` (R, L, V, H, W)."""
        fan_out, step_h = self._fans_out(leading), int(self.step / _HOUR)
        offsets = [int(o) for o in self.spec.offsets_h]
        history = {o: rows[:, i] for i, o in enumerate(offsets)}  # hours after the last input → (R, V, H, W)
        k = 0
        while True:
            k += 1
            if self.max_steps is not None and k > self.max_steps:
                raise ValueError(f"{self}: {self.max_steps} step(s) of {step_h} h at most (" + (
                    f"continuous lead, trained to {self.max_steps * step_h} h" if self.spec.continuous else
                    f"fixed lead: the inputs at offsets {offsets} h of step {k} are not all forecast") +
                    f"); run with nsteps <= {self.max_steps}")
            if self.spec.continuous:
                y = self._forward(rows, k * step_h, members)
            else:
                base = (k - 1) * step_h
                y = self._forward(torch.stack([history[base + o] for o in offsets], dim=1), None, members)
                if fan_out and members is None:  # from now on every row is one member's own trajectory
                    history = {t: v.repeat_interleave(self.ensemble_size, dim=0) for t, v in history.items()}
                    members = np.tile(np.arange(self.ensemble_size), int(np.prod(shape)))
                if self.max_steps is None or k < self.max_steps:
                    history[k * step_h] = y[:, self._to_inputs]
                    history = {t: v for t, v in history.items() if t >= k * step_h + min(offsets)}
            yield self._emit(y, leading, shape, last + k * self.step, fan_out)


def _check_units(trained: TrainedNetwork, fields: Sequence[Field]) -> None:
    """ValueError for a field whose units in the model card are not the canonical ones (earth2studio's)."""
    from pipelines.canonical import VARIABLES
    from smoeweather.units import conversion

    card = trained.metadata.get("variables") or {}
    for f in dict.fromkeys(fields):
        have = (card.get(field_name(f)) or {}).get("units")
        if have and f[0] in VARIABLES and conversion(f[0], have, "the model card", VARIABLES[f[0]][0],
                                                     "earth2studio's lexicon") is not None:
            raise ValueError(f"{trained.path}: {field_name(f)} is in {have!r}, earth2studio's lexicon in "
                             f"{VARIABLES[f[0]][0]!r}; retrain on canonical units")
