"""Restart files of the GCM generators: a run of hours that is interrupted continues where it stopped, exactly.

``smoe data gcm-world`` and ``gcm-ens`` save the model state (the spectral fields, float32, and the model time),
where the run stands and the output it has gathered so far every :data:`EVERY_DAYS` simulated days, to a hidden
``OUT/.NAME.restart.npz``. Run the same command again and it resumes from there; the files it writes are then
bit-identical to an uninterrupted run's (the core is deterministic on one thread). The restart is used only when
its configuration (the run's ``config_json``, the physics and the core's version) equals the new run's, and is
removed when the last file is written.

The file is a plain ``.npz`` read with ``allow_pickle=False``: nothing in it can run code.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

EVERY_DAYS = 10  # simulated days between restart saves (a save costs well under a second)
STATE_FIELDS = ("vorticity", "divergence", "temperature_variation", "log_surface_pressure")


@dataclass
class Restart:
    """The restart file ``path`` of one generator run whose configuration is ``config`` (JSON-serialisable)."""

    path: Path
    config: dict[str, Any]

    def _key(self) -> str:
        return json.dumps(self.config, sort_keys=True, default=str)

    def load(self) -> dict[str, Any] | None:
        """The saved run (``position``: {name: int}, ``state``: {field: array, sim_time: float}, ``arrays``:
        {name: array}), or None when there is none or it belongs to another configuration."""
        if not self.path.is_file():
            return None
        with np.load(self.path, allow_pickle=False) as f:
            if str(f["config"]) != self._key():
                return None
            position = json.loads(str(f["position"]))
            state = {k: f[f"state_{k}"] for k in STATE_FIELDS}
            state["sim_time"] = float(f["state_sim_time"])
            arrays = {k[len("array_"):]: f[k] for k in f.files if k.startswith("array_")}
        return {"position": position, "state": state, "arrays": arrays}

    def save(self, position: dict[str, Any], state: Any, arrays: dict[str, list[np.ndarray]]) -> None:
        """Write the run's ``position``, its core ``state`` (a dinosaur ``State``) and the gathered output
        ``arrays`` (lists of equal-shaped arrays, stacked) atomically."""
        data = {"config": np.array(self._key()), "position": np.array(json.dumps(position)),
                "state_sim_time": np.array(float(state.sim_time), np.float64)}
        for k in STATE_FIELDS:
            data[f"state_{k}"] = getattr(state, k).detach().cpu().numpy()
        for k, items in arrays.items():
            data[f"array_{k}"] = np.stack(items) if items else np.zeros((0,), np.float32)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(self.path.name + ".tmp.npz")
        np.savez(tmp, **data)
        os.replace(tmp, self.path)

    def remove(self) -> None:
        self.path.unlink(missing_ok=True)


def restore_state(saved: dict[str, Any], state_type: Any) -> Any:
    """The dinosaur ``State`` of a :meth:`Restart.load` result (``state_type``: the core's ``State`` class)."""
    import torch

    fields = {k: torch.from_numpy(np.ascontiguousarray(saved["state"][k])) for k in STATE_FIELDS}
    return state_type(**fields, tracers={}, sim_time=saved["state"]["sim_time"])


def unstack(saved: dict[str, Any], name: str) -> list[np.ndarray]:
    """A gathered output list of a :meth:`Restart.load` result (empty when nothing was gathered)."""
    arr = saved["arrays"].get(name)
    return [] if arr is None or arr.ndim <= 1 and arr.size == 0 else list(arr)
