"""ENS-10 post-processing samples: ensemble mean/std per variable in, ERA5 truth out.

The store is a prepared ENS-10 store (``smoe data prepare ens10``): dims ``time`` (initialisation),
``member``, [``level``], ``latitude``, ``longitude``, one lead time, with the verifying ERA5 analysis as
``<name>_truth`` variables on the same ``time`` axis (see ``pipelines/readers/ens10.py``).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import xarray as xr
from torch.utils.data import Dataset

from smoeweather.data.weather import Field, StoreReader, _stat, field_name, parse_fields, years_mask

TRUTH_SUFFIX = "_truth"


class Ens10Dataset(Dataset):
    """(x, y, ens_mean, ens_std) samples for ENS-10 post-processing (Ashkboos et al. 2022).

    Args:
        store: prepared ENS-10 store with ``<name>_truth`` variables.
        variables: input fields ``(name, level | None)``; each gives two channels, the ensemble mean and
            the ensemble standard deviation (over ``member``, ddof=1) at that level.
        target_variables: fields whose truth is the target (default: ``variables``).
        years: inclusive (start, end) of the initialisation times; None = all.
        stats: statistics Dataset (default: the store's ``statistics`` group).

    Returns per sample: ``x`` float32 (2·len(variables), H, W) = [mean, std] per field, normalised by the
    field's climatological mean/std (std channels divided by the std only); ``y`` float32 (C_out, H, W),
    the truth normalised by the truth statistics; ``ens_mean``, ``ens_std`` float32 (C_out, H, W), the
    ensemble mean and std of the target fields in the same normalised units as ``y`` (for Gaussian heads).
    """

    def __init__(
        self,
        store: str | Path,
        variables: Sequence[Any],
        target_variables: Sequence[Any] | None = None,
        years: tuple[int, int] | None = None,
        stats: xr.Dataset | None = None,
    ) -> None:
        self.store = str(store)
        self.variables = parse_fields(variables)
        self.target_variables = parse_fields(target_variables) if target_variables else list(self.variables)
        with xr.open_zarr(self.store) as ds:
            for name, level in self.variables + self.target_variables:
                if name not in ds.data_vars or "member" not in ds[name].dims:
                    raise ValueError(f"{self.store}: no ensemble variable {name!r} (needs a member dim)")
                if level is not None and level not in ds["level"].values:
                    raise ValueError(f"{self.store}: {name} has no level {level} hPa")
            for name, _ in self.target_variables:
                if name + TRUTH_SUFFIX not in ds.data_vars:
                    raise ValueError(f"{self.store}: no truth {name + TRUTH_SUFFIX!r} for target {name!r}")
            self.times = ds["time"].values
            self.grid = (ds.sizes["latitude"], ds.sizes["longitude"])
            self._levels = {int(p): i for i, p in enumerate(ds["level"].values)} if "level" in ds.dims else {}
            self._has_level = {n: "level" in ds[n].dims for n in ds.data_vars}
        if stats is None:
            stats = xr.open_zarr(self.store, group="statistics").load()
        self.indices = np.flatnonzero(years_mask(self.times, years))
        if len(self.indices) == 0:
            raise ValueError(f"years {years} are outside the data of {self.store}")
        f32 = np.float32
        self.input_mean = np.array([_stat(stats, f, "mean", self.store) for f in self.variables], f32)
        self.input_std = np.array([_stat(stats, f, "std", self.store) for f in self.variables], f32)
        truth = [(n + TRUTH_SUFFIX, p) for n, p in self.target_variables]
        self.target_mean = np.array([_stat(stats, f, "mean", self.store) for f in truth], f32)
        self.target_std = np.array([_stat(stats, f, "std", self.store) for f in truth], f32)
        self._reader = StoreReader(self.store)

    @property
    def channel_names(self) -> list[str]:
        return [f"{field_name(f)}_{s}" for f in self.variables for s in ("ens_mean", "ens_std")]

    @property
    def target_names(self) -> list[str]:
        return [field_name(f) for f in self.target_variables]

    def __len__(self) -> int:
        return len(self.indices)

    def init_time(self, i: int) -> np.datetime64:
        return self.times[self.indices[i]]

    def _field(self, field: Field, t: int, truth: bool = False) -> np.ndarray:
        name, level = field
        key = name + TRUTH_SUFFIX if truth else name
        a = np.asarray(self._reader.array(key)[t], np.float64)  # ([member], [level], H, W)
        if self._has_level[key]:
            a = a[..., self._levels[level], :, :]
        return a

    def _moments(self, field: Field, t: int) -> tuple[np.ndarray, np.ndarray]:
        ens = self._field(field, t)
        return ens.mean(axis=0), ens.std(axis=0, ddof=1)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, ...]:
        t = int(self.indices[i])
        x = np.empty((2 * len(self.variables), *self.grid), np.float32)
        for c, f in enumerate(self.variables):
            mean, std = self._moments(f, t)
            x[2 * c] = (mean - self.input_mean[c]) / self.input_std[c]
            x[2 * c + 1] = std / self.input_std[c]
        m, s = self.target_mean[:, None, None], self.target_std[:, None, None]
        y = np.stack([self._field(f, t, truth=True) for f in self.target_variables])
        moments = [self._moments(f, t) for f in self.target_variables]
        mu = np.stack([mm for mm, _ in moments])
        sigma = np.stack([ss for _, ss in moments])
        return tuple(
            torch.from_numpy(a.astype(np.float32)) for a in (x, (y - m) / s, (mu - m) / s, sigma / s)
        )

    def denormalize_target(self, y: torch.Tensor | np.ndarray) -> torch.Tensor | np.ndarray:
        """Normalised (..., C_out, H, W) → physical units (same type); for std-like outputs use ``* std``."""
        mean, std = self.target_mean[:, None, None], self.target_std[:, None, None]
        if isinstance(y, torch.Tensor):
            mean, std = torch.as_tensor(mean, device=y.device), torch.as_tensor(std, device=y.device)
        return y * std + mean
