"""Initialise a model from another run's checkpoint (``smoe train --init-from``): every tensor whose name
and shape match, except the normalisation statistics, which stay those of the new data."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from torch import nn

from smoeweather.models.checkpoint_io import read_checkpoint
from smoeweather.models.loader import check_checkpoint

NORMALISATION_BUFFERS = ("input_mean", "input_std", "target_mean", "target_std")


@dataclass
class InitReport:
    """What :func:`init_weights` loaded and what it skipped (tensor names of the model)."""

    loaded: list[str] = field(default_factory=list)
    shape_mismatch: list[str] = field(default_factory=list)
    kept_normalisation: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        lines = [f"loaded {len(self.loaded)} tensors"]
        for label, names in (
            ("skipped (shape differs)", self.shape_mismatch),
            ("kept from the new data (normalisation)", self.kept_normalisation),
            ("not in the checkpoint (fresh init)", self.missing),
            ("in the checkpoint but not in the model", self.unexpected),
        ):
            if names:
                lines.append(f"{label}: {', '.join(names)}")
        return "; ".join(lines)


def init_weights(model: nn.Module, checkpoint_path: str | Path) -> InitReport:
    """Load the weights of a ``smoe train`` checkpoint into ``model`` where names and shapes match.

    The normalisation buffers are NOT taken over: the model keeps the statistics of the data it will be
    trained on (e.g. ERA5 after CMIP6 pretraining). Everything else that does not fit is reported.
    """
    ckpt = read_checkpoint(checkpoint_path)  # data only: refuses a pickle that would run code
    check_checkpoint(ckpt, str(checkpoint_path))
    source = {k[len("model.") :]: v for k, v in ckpt["state_dict"].items() if k.startswith("model.")}
    own = model.state_dict()
    report, load = InitReport(), {}
    for name, value in source.items():
        if name.split(".")[-1] in NORMALISATION_BUFFERS and name.count(".") == 0:
            report.kept_normalisation.append(name)
        elif name not in own:
            report.unexpected.append(name)
        elif own[name].shape != value.shape:
            report.shape_mismatch.append(f"{name} {tuple(value.shape)}→{tuple(own[name].shape)}")
        else:
            load[name] = value
            report.loaded.append(name)
    report.missing = sorted(set(own) - set(source))
    model.load_state_dict(load, strict=False)
    return report
