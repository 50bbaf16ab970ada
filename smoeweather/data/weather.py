"""Stream WeatherBench-style samples (Rasp & Thuerey 2021) from a prepared zarr store.

A sample at initialisation time t: inputs are the chosen (variable, level) fields at t + each input offset
(default t−12 h, t−6 h, t), stacked time-major ([all fields at t−12 h], [at t−6 h], [at t]), then the
constants (land-sea mask, orography, latitude) and, for the continuous-lead variant, a lead-time channel
τ/100 (τ in hours). The target is the chosen fields at t + lead. Everything is normalised with the store's
statistics (per variable and level mean/std over the training years).

The store is opened lazily inside each process (DataLoader worker) on first use, never in ``__init__``'s
caller process for data reads; each read is a contiguous time slice of whole zarr chunks.

Batched reads: a DataLoader worker asks for a whole batch at once (:meth:`WeatherBenchDataset.__getitems__`),
and the batch reads each store variable once per contiguous run of the times its samples need (runs closer
than one time chunk are merged), instead of once per sample and offset group: a batch of consecutive
initialisation times (``data.sampler: time_blocks``, :mod:`smoeweather.data.sampling`) is ONE read per
variable. The batch is bit-identical to ``[dataset[i] for i in indices]``.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import xarray as xr
import zarr
from torch.utils.data import Dataset

from smoeweather.data.forecast_stores import HOUR, refuse_forecast

Field = tuple[str, int | float | None]  # (canonical variable name, level in hPa or None)
DEFAULT_CONSTANTS = ("land_sea_mask", "geopotential_at_surface", "latitude")
DEFAULT_LEAD_CHOICES_H = tuple(range(6, 121, 6))
MAX_MERGE_GAP = 8  # time steps: batched reads merge needed times at most this far apart (one read)


def parse_fields(fields: Sequence[Any]) -> list[Field]:
    """Fields from ``("geopotential", 500)``, ``"geopotential_500"`` or ``"2m_temperature"`` (no level)."""
    out: list[Field] = []
    for f in fields:
        if isinstance(f, str):
            name, _, level = f.rpartition("_")
            out.append((name, _level(level)) if name and _is_number(level) else (f, None))
        else:
            name, level = f
            out.append((str(name), None if level is None else _level(level)))
    return out


def _is_number(text: str) -> bool:
    try:
        return float(text) >= 0 and text.replace(".", "", 1).isdigit()
    except ValueError:
        return False


def _level(value: Any) -> int | float:
    """A pressure level (hPa): int when integral (500), float otherwise (0.1)."""
    f = float(value)
    return int(f) if f.is_integer() else f


def field_name(field: Field) -> str:
    """``geopotential_500`` or ``2m_temperature``."""
    return field[0] if field[1] is None else f"{field[0]}_{field[1]}"


def years_mask(times: np.ndarray, years: tuple[int, int] | None) -> np.ndarray:
    """Boolean mask of ``times`` within the inclusive year range (all True when ``years`` is None)."""
    if years is None:
        return np.ones(len(times), bool)
    y = times.astype("datetime64[Y]").astype(int) + 1970
    return (y >= int(years[0])) & (y <= int(years[1]))


class StoreReader:
    """Per-process lazy access to a prepared store's zarr arrays (reopened after a fork)."""

    def __init__(self, store: str) -> None:
        self.store = store
        self._group: zarr.Group | None = None
        self._pid: int | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {"store": self.store, "_group": None, "_pid": None}

    def array(self, name: str) -> zarr.Array:
        if self._group is None or self._pid != os.getpid():
            self._group = zarr.open_group(self.store, mode="r")
            self._pid = os.getpid()
        return self._group[name]


def _stat(stats: xr.Dataset, field: Field, which: str, store: str) -> float:
    """One statistic of ``field`` from a statistics Dataset; ValueError when it is missing or unavailable."""
    if not int(stats.attrs.get("available", 1)):
        raise ValueError(
            f"statistics of {store} are unavailable ({stats.attrs.get('unavailable_reason', 'no reason given')});"
            " pass stats= (e.g. the training store's statistics group)"
        )
    name, level = field
    flat = flat_name(field)
    if name in stats.data_vars and (level is None or "level" in stats[name].dims):
        v = stats[name].sel(statistic=which)
        if level is not None:
            v = v.sel(level=level)
    elif level is not None and flat in stats.data_vars:  # stored per level (see split_partial_levels)
        v = stats[flat].sel(statistic=which)
    else:
        raise ValueError(
            f"statistics of {store} have no variable {name!r}; available: {sorted(stats.data_vars)}"
        )
    value = float(v)
    if not np.isfinite(value):
        raise ValueError(f"statistics of {store}: {which} of {field_name(field)} is {value}; expected a number")
    return value


def flat_name(field: Field) -> str:
    """Name of a field stored as its own 2-D variable (``geopotential_500``, ``temperature_0.1``)."""
    name, level = field
    if level is None:
        return name
    f = float(level)
    return f"{name}_{int(f) if f.is_integer() else f'{f:g}'}"


class WeatherBenchDataset(Dataset):
    """WeatherBench-style (x, y) samples from a prepared store.

    Args:
        store: prepared zarr store (``smoe data prepare`` / ``smoe data world``).
        variables: input fields, ``(name, level | None)`` or ``"name_level"`` strings.
        target_variables: target fields (default: ``variables``).
        input_offsets_h: input times relative to the initialisation time t, hours (≤ 0).
        lead_h: lead time in hours; None for the continuous-lead variant (leads ``lead_choices_h``, one
            sample per (init, lead) pair, lead channel τ/100 appended to the inputs).
        constants: time-invariant input channels: store variables and/or ``"latitude"``.
        years: inclusive (start, end) of the initialisation, input and target times (a split); None = all.
        stats: a statistics Dataset (dim ``statistic``); default: the store's ``statistics`` group.
        member: index along ``member`` for ensemble stores (e.g. ERA5 EDA); required when a field has a
            ``member`` dimension, ignored for fields without one. Statistics stay those over all members.

    ``x``: float32 (C_in, H, W) normalised; ``y``: float32 (C_out, H, W) normalised.
    """

    def __init__(
        self,
        store: str | Path,
        variables: Sequence[Any],
        target_variables: Sequence[Any] | None = None,
        input_offsets_h: Sequence[int] = (-12, -6, 0),
        lead_h: int | None = 72,
        lead_choices_h: Sequence[int] = DEFAULT_LEAD_CHOICES_H,
        constants: Sequence[str] = DEFAULT_CONSTANTS,
        years: tuple[int, int] | None = None,
        stats: xr.Dataset | None = None,
        member: int | None = None,
    ) -> None:
        self.store = str(store)
        self.member = None if member is None else int(member)
        if not Path(self.store).exists() and "://" not in self.store:
            raise FileNotFoundError(
                f"store {self.store} does not exist (run `smoe data prepare` or `smoe data world`)"
            )
        self.variables = parse_fields(variables)
        self.target_variables = parse_fields(target_variables) if target_variables else list(self.variables)
        self.constants = list(constants)
        self.input_offsets_h = [int(o) for o in input_offsets_h]
        self.leads_h = [int(lead_h)] if lead_h is not None else [int(v) for v in lead_choices_h]
        self.continuous = lead_h is None
        if max(self.input_offsets_h) > 0 or min(self.leads_h) <= 0:
            raise ValueError("input offsets must be ≤ 0 h and lead times > 0 h")

        # Metadata only (coordinates and attrs): no data arrays are read here.
        with xr.open_zarr(self.store) as ds:
            refuse_forecast(ds, self.store, "a training store", "train on the store of `smoe data prepare` or "
                            "`smoe data world`")
            self.times = ds["time"].values
            self.latitude = ds["latitude"].values.astype(np.float64)
            self.longitude = ds["longitude"].values.astype(np.float64)
            levels = [_level(p) for p in ds["level"].values] if "level" in ds.dims else []
            self._check_fields(ds, levels)
            self._level_index = {p: i for i, p in enumerate(levels)}
            self._has_level = {name: "level" in ds[name].dims for name in ds.data_vars}
            self._array_of = {f: self._array_name(ds, f) for f in self.variables + self.target_variables}
            self._has_member = {name: "member" in ds[name].dims for name in ds.data_vars}
            if self.member is not None and not 0 <= self.member < ds.sizes.get("member", 0):
                raise ValueError(
                    f"{self.store}: member={self.member} out of range; the store has "
                    f"{ds.sizes.get('member', 0)} members"
                )
            self.units = {name: ds[name].attrs.get("units", "") for name in ds.data_vars}
            self.time_chunk = self._time_chunk(ds)
        if stats is None:
            stats = xr.open_zarr(self.store, group="statistics").load()
        self.years = tuple(years) if years is not None else None
        self._init_samples()

        f32 = np.float32
        self.input_mean = np.array([_stat(stats, f, "mean", self.store) for f in self.variables], f32)
        self.input_std = np.array([_stat(stats, f, "std", self.store) for f in self.variables], f32)
        self.target_mean = np.array([_stat(stats, f, "mean", self.store) for f in self.target_variables], f32)
        self.target_std = np.array([_stat(stats, f, "std", self.store) for f in self.target_variables], f32)
        self._const_stats = {
            c: (_stat(stats, (c, None), "mean", self.store), _stat(stats, (c, None), "std", self.store))
            for c in self.constants
            if c != "latitude"
        }
        self._reader = StoreReader(self.store)
        self._constants_cache: np.ndarray | None = None

    # ---- setup -------------------------------------------------------------------------------------
    @staticmethod
    def _array_name(ds: xr.Dataset, field: Field) -> str:
        """The store variable holding ``field``: ``name`` (with a level dim) or ``name_level`` (2-D)."""
        name, level = field
        if level is not None and name not in ds.data_vars:
            return flat_name(field)
        return name

    def _time_chunk(self, ds: xr.Dataset) -> int:
        """Time steps per zarr chunk of the fields read (the largest; 1 when the store does not say)."""
        sizes = [1]
        for name in set(self._array_of.values()):
            chunks = ds[name].encoding.get("chunks")
            if chunks:
                sizes.append(int(chunks[ds[name].dims.index("time")]))
        return max(sizes)

    def _check_fields(self, ds: xr.Dataset, levels: list[int]) -> None:
        for name, level in self.variables + self.target_variables:
            if level is not None and name not in ds.data_vars and flat_name((name, level)) in ds.data_vars:
                if "time" not in ds[flat_name((name, level))].dims:
                    raise ValueError(f"{self.store}: {flat_name((name, level))!r} is time-invariant")
                continue  # a field stored per level (variables with data on only some levels)
            if name not in ds.data_vars:
                raise ValueError(
                    f"{self.store}: variable {name!r} not found; available: {sorted(ds.data_vars)}"
                )
            if "time" not in ds[name].dims:
                raise ValueError(f"{self.store}: {name!r} is time-invariant; list it under constants")
            if ("level" in ds[name].dims) != (level is not None):
                raise ValueError(
                    f"{self.store}: {name!r} needs {'a' if 'level' in ds[name].dims else 'no'} level"
                )
            if level is not None and level not in levels:
                raise ValueError(f"{self.store}: {name} has no level {level} hPa; available: {levels}")
            if "member" in ds[name].dims and self.member is None:
                raise ValueError(
                    f"{self.store}: {name!r} has {ds.sizes['member']} ensemble members; pass member=<index>"
                )
        for c in self.constants:
            if c != "latitude" and c not in ds.data_vars:
                raise ValueError(f"{self.store}: constant {c!r} not found; available: {sorted(ds.data_vars)}")

    def _init_samples(self) -> None:
        """Initialisation indices whose input and target times all exist and lie within ``years``."""
        times = self.times
        if len(times) == 0:
            raise ValueError(f"{self.store} holds no times")
        in_years = years_mask(times, self.years)
        have = np.unique(times.astype("datetime64[Y]").astype(int) + 1970)
        if self.years is not None:
            missing = sorted(set(range(int(self.years[0]), int(self.years[1]) + 1)) - set(have.tolist()))
            if missing or not in_years.any():
                raise ValueError(
                    f"years {self.years} are outside the data of {self.store} ({have.min()}–{have.max()}); "
                    f"missing {missing[:5]}{' ...' if len(missing) > 5 else ''}"
                )
        offsets = np.array(self.input_offsets_h + self.leads_h) * HOUR
        ok = in_years.copy()
        self._index_of: dict[int, np.ndarray] = {}
        for off in offsets:
            want = times + off
            pos = np.clip(np.searchsorted(times, want), 0, len(times) - 1)
            ok &= (times[pos] == want) & in_years[pos]
            self._index_of[int(off / HOUR)] = pos
        self.init_indices = np.flatnonzero(ok)
        if len(self.init_indices) == 0:
            raise ValueError(
                f"no samples in years {self.years} of {self.store}: offsets {self.input_offsets_h} h and "
                f"leads {self.leads_h} h do not fit (the data has {len(times)} times)"
            )
        self._step = [self._index_of[o] for o in self.input_offsets_h]

    # ---- names -------------------------------------------------------------------------------------
    @property
    def channel_names(self) -> list[str]:
        names = [f"{field_name(f)}@{o:+d}h" for o in self.input_offsets_h for f in self.variables]
        names += list(self.constants)
        return names + (["lead_time/100h"] if self.continuous else [])

    @property
    def target_names(self) -> list[str]:
        return [field_name(f) for f in self.target_variables]

    @property
    def grid(self) -> tuple[int, int]:
        return len(self.latitude), len(self.longitude)

    def __len__(self) -> int:
        return len(self.init_indices) * len(self.leads_h)

    def _locate(self, i: int) -> tuple[int, int]:
        """(store index of the initialisation time, lead in hours) of sample ``i``."""
        if not -len(self) <= i < len(self):
            raise IndexError(i)
        i = i % len(self)
        return int(self.init_indices[i // len(self.leads_h)]), self.leads_h[i % len(self.leads_h)]

    def init_time(self, i: int) -> np.datetime64:
        return self.times[self._locate(i)[0]]

    def lead_time(self, i: int) -> np.timedelta64:
        return np.timedelta64(self._locate(i)[1], "h")

    def valid_time(self, i: int) -> np.datetime64:
        t, lead = self._locate(i)
        return self.times[self._index_of[lead][t]]

    # ---- reads -------------------------------------------------------------------------------------
    def _read(self, fields: list[Field], idx: np.ndarray) -> np.ndarray:
        """Raw fields (len(idx), len(fields), H, W) at store time indices ``idx`` (one slice per variable)."""
        lo, hi = int(idx.min()), int(idx.max()) + 1
        out = np.empty((len(idx), len(fields), *self.grid), np.float32)
        by_name: dict[str, list[int]] = {}
        for c, field in enumerate(fields):
            by_name.setdefault(self._array_of[field], []).append(c)
        for name, channels in by_name.items():
            block = np.asarray(self._reader.array(name)[lo:hi])[idx - lo]
            if self._has_member[name]:
                block = block[:, self.member]
            for c in channels:
                level = fields[c][1]
                out[:, c] = block[:, self._level_index[level]] if self._has_level[name] else block
        return out

    def _constant_fields(self) -> np.ndarray:
        if self._constants_cache is None:
            planes = []
            for c in self.constants:
                if c == "latitude":
                    lat = np.broadcast_to(self.latitude[:, None], self.grid)
                    planes.append((lat - lat.mean()) / lat.std())
                else:
                    mean, std = self._const_stats[c]
                    planes.append((np.asarray(self._reader.array(c)[...], np.float64) - mean) / std)
            self._constants_cache = (
                np.stack(planes).astype(np.float32) if planes else np.empty((0, *self.grid))
            )
        return self._constants_cache

    def raw_inputs(self, i: int) -> np.ndarray:
        """Unnormalised input fields (n_offsets, n_variables, H, W), physical units."""
        t, _ = self._locate(i)
        return self._read(self.variables, np.array([s[t] for s in self._step]))

    def raw_target(self, i: int) -> np.ndarray:
        """Unnormalised target fields (C_out, H, W), physical units."""
        t, lead = self._locate(i)
        return self._read(self.target_variables, np.array([self._index_of[lead][t]]))[0]

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        _, lead = self._locate(i)
        x = (self.raw_inputs(i) - self.input_mean[:, None, None]) / self.input_std[:, None, None]
        parts = [x.reshape(-1, *self.grid), self._constant_fields()]
        if self.continuous:
            parts.append(np.full((1, *self.grid), lead / 100.0, np.float32))
        y = (self.raw_target(i) - self.target_mean[:, None, None]) / self.target_std[:, None, None]
        return torch.from_numpy(np.concatenate(parts).astype(np.float32)), torch.from_numpy(
            y.astype(np.float32)
        )

    def __getitems__(self, indices: Sequence[int]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Samples ``indices`` (what a DataLoader worker fetches for one batch), bit-identical to
        ``[self[i] for i in indices]``, with one read per store variable per contiguous run of needed times.

        A variable's needed times are the input times of the batch (input variables) and/or its target times
        (target variables); consecutive needed times less than one time chunk apart share one read (the gap
        costs at most one chunk's decode, a separate read costs a call plus the chunk decode anyway).
        """
        n = len(self)
        idx = np.asarray(indices, dtype=np.int64).reshape(-1)
        if len(idx) == 0:
            return []
        if idx.min() < -n or idx.max() >= n:
            raise IndexError(f"sample index out of range 0..{n - 1}: {idx[(idx < -n) | (idx >= n)][:5]}")
        idx = idx % n
        n_leads = len(self.leads_h)
        inits = self.init_indices[idx // n_leads]
        leads = np.asarray(self.leads_h)[idx % n_leads]
        t_in = np.stack([s[inits] for s in self._step], axis=1)  # (B, n_offsets) store time indices
        t_out = np.empty(len(idx), np.int64)
        for lead in np.unique(leads):
            t_out[leads == lead] = self._index_of[int(lead)][inits[leads == lead]]

        n_off, grid = len(self.input_offsets_h), self.grid
        consts = self._constant_fields()
        n_dyn = n_off * len(self.variables)
        xb = np.empty((len(idx), n_dyn + len(consts) + int(self.continuous), *grid), np.float32)
        yb = np.empty((len(idx), len(self.target_variables), *grid), np.float32)
        # sample by sample into xb / yb (a few MB at a time stay in cache; whole-batch temporaries do not)
        dyn = [xb[b, :n_dyn].reshape(n_off, len(self.variables), *grid) for b in range(len(idx))]  # views
        names_in = {self._array_of[f] for f in self.variables}
        names_out = {self._array_of[f] for f in self.target_variables}
        for name in sorted(names_in | names_out):
            need = np.concatenate([t_in.ravel()] * (name in names_in) + [t_out] * (name in names_out))
            block, pos = self._read_runs(name, need)
            pos_in = pos[: t_in.size].reshape(t_in.shape) if name in names_in else None  # a target-only array
            pos_out = pos[len(need) - len(t_out) :] if name in names_out else None  # has no input times
            for fields, fill in ((self.variables, dyn), (self.target_variables, yb)):
                chans = [c for c, f in enumerate(fields) if self._array_of[f] == name]
                if not chans:
                    continue
                where = pos_in if fill is dyn else pos_out
                if self._has_level[name]:
                    levels = np.array([self._level_index[fields[c][1]] for c in chans])
                    for b in range(len(idx)):
                        if fill is dyn:
                            dyn[b][:, chans] = block[where[b][:, None], levels[None, :]]
                        else:
                            yb[b, chans] = block[where[b], levels]
                else:
                    for b in range(len(idx)):
                        if fill is dyn:
                            dyn[b][:, chans] = block[where[b]][:, None]
                        else:
                            yb[b, chans] = block[where[b]]

        # the same float32 arithmetic as __getitem__, in place (elementwise: bit-identical per sample)
        mean_in, std_in = self.input_mean[:, None, None], self.input_std[:, None, None]
        mean_out, std_out = self.target_mean[:, None, None], self.target_std[:, None, None]
        for b in range(len(idx)):
            np.subtract(dyn[b], mean_in, out=dyn[b])
            np.divide(dyn[b], std_in, out=dyn[b])
            np.subtract(yb[b], mean_out, out=yb[b])
            np.divide(yb[b], std_out, out=yb[b])
        xb[:, n_dyn : n_dyn + len(consts)] = consts
        if self.continuous:
            for b, lead in enumerate(leads):
                xb[b, -1] = np.full(grid, int(lead) / 100.0, np.float32)
        return [(torch.from_numpy(xb[b]), torch.from_numpy(yb[b])) for b in range(len(idx))]

    def _read_runs(self, name: str, need: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Times ``need`` (store indices) of variable ``name``: (stacked reads, position of each need in it).

        One read per run of needed times; runs split where the gap to the next needed time is more than one
        time chunk, capped at ``MAX_MERGE_GAP`` steps so that a store with long time chunks does not turn a
        random batch into one huge read (in-memory arrays of ``data.cache``: one slice, a view). Member
        selection as in :meth:`_read`.
        """
        times = np.unique(need)
        array = self._reader.array(name)
        if getattr(array, "in_memory", False):  # data.cache: a slice is a view, one covers everything
            cuts = np.zeros(0, np.int64)
        else:
            cuts = np.flatnonzero(np.diff(times) > min(self.time_chunk, MAX_MERGE_GAP)) + 1
        starts, ends = times[np.r_[0, cuts]], times[np.r_[cuts - 1, len(times) - 1]] + 1
        parts = []
        for lo, hi in zip(starts.tolist(), ends.tolist()):
            part = np.asarray(array[lo:hi])
            parts.append(part[:, self.member] if self._has_member[name] else part)
        block = parts[0] if len(parts) == 1 else np.concatenate(parts)
        base = np.r_[0, np.cumsum(ends - starts)[:-1]]
        run = np.searchsorted(starts, need, side="right") - 1
        return block, base[run] + need - starts[run]

    def denormalize_target(self, y: torch.Tensor | np.ndarray) -> torch.Tensor | np.ndarray:
        """Normalised (..., C_out, H, W) → physical units (same type)."""
        mean, std = self.target_mean[:, None, None], self.target_std[:, None, None]
        if isinstance(y, torch.Tensor):
            mean, std = torch.as_tensor(mean, device=y.device), torch.as_tensor(std, device=y.device)
        return y * std + mean
