"""Every registered network builds from its tiny config, runs forward and backward, and gives every trainable
parameter a finite gradient; the registry's names, lookup and key checks are the ones the configs use."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

from smoeweather.models import registry
from smoeweather.models.ensemble import uses_land_sea_prior
from smoeweather.models.weather import synthetic_land_sea_mask
from smoeweather.nn.smoe import routing_loss
from smoeweather.vision.task import weighted_aux_loss

CASES = [(e.task, e.name) for e in registry.entries()]
VISION = {"in_channels": 3, "num_classes": 4, "image_size": (16, 16)}
HEAT_SIZE = 8


def _build_and_input(task: str, name: str) -> tuple[nn.Module, torch.Tensor]:
    entry = registry.lookup(task, name)
    cfg: dict[str, Any] = {"name": name, **entry.tiny}
    if task == "weather":
        grid = tuple(cfg.get("grid", (16, 32)))
        prior = synthetic_land_sea_mask(*grid) if uses_land_sea_prior(cfg) else None
        return registry.build(task, cfg, land_sea_prior=prior), torch.randn(2, cfg["in_channels"], *grid)
    if task == "heat":
        return registry.build(task, cfg, size=HEAT_SIZE), torch.randn(2, 1, HEAT_SIZE, HEAT_SIZE)
    return registry.build(task, cfg, **VISION), torch.randn(8, VISION["in_channels"], *VISION["image_size"])


def test_every_task_has_networks_and_names_are_unique_per_task() -> None:
    for task in registry.TASKS:
        assert registry.names(task), f"no network registered for task {task}"
    assert len(CASES) == len(set(CASES))
    assert all(e.doc for e in registry.entries()), "every builder says what it builds in its docstring"


@pytest.mark.parametrize(("task", "name"), CASES, ids=[f"{t}-{n}" for t, n in CASES])
def test_registered_network_builds_runs_and_trains_every_parameter(task: str, name: str) -> None:
    torch.manual_seed(0)
    model, x = _build_and_input(task, name)
    model.train()
    out = model(x)
    out = out[0] if isinstance(out, tuple) else out
    assert torch.isfinite(out).all()
    probe = torch.randn_like(out)  # a generic direction: a plain sum would vanish through BatchNorm
    loss = (out * probe).sum() + routing_loss(model)
    aux = weighted_aux_loss(model, 0.01)
    (loss + (aux if aux is not None else 0.0)).backward()
    trainable = {n: p for n, p in model.named_parameters() if p.requires_grad}
    assert trainable, "a network with nothing to train"
    missing = [n for n, p in trainable.items() if p.grad is None]
    assert not missing, f"{task}/{name}: parameters without a gradient: {missing}"
    bad = [n for n, p in trainable.items() if not torch.isfinite(p.grad).all()]
    assert not bad, f"{task}/{name}: non-finite gradients in {bad}"


def test_lookup_says_what_is_registered_and_the_closest_name() -> None:
    with pytest.raises(ValueError, match=r"'model.name' must be one of resnet, .* \(did you mean 'unet'\?\)"):
        registry.lookup("weather", "unte")
    with pytest.raises(ValueError, match=r"unknown keys \['widht'\] for model 'resnet'"):
        registry.build("weather", {"name": "resnet", "in_channels": 2, "out_channels": 1, "widht": 4})


def test_a_new_model_is_one_decorated_builder(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(registry._ENTRIES, "vision", dict(registry.entries_by_name("vision")))

    @registry.register_model("vision", "linear_probe", keys={"bias"}, tiny={"bias": False})
    def _linear(cfg: dict[str, Any], in_channels: int, num_classes: int, image_size: tuple[int, int]) -> nn.Module:
        """A linear classifier on flattened pixels."""
        return nn.Sequential(nn.Flatten(), nn.Linear(in_channels * image_size[0] * image_size[1], num_classes,
                                                     bias=cfg.get("bias", True)))

    assert "linear_probe" in registry.names("vision")
    net = registry.build("vision", {"name": "linear_probe", "bias": False}, **VISION)
    assert net(torch.zeros(2, 3, 16, 16)).shape == (2, 4)
    with pytest.raises(ValueError, match="registered twice"):
        registry.register_model("vision", "linear_probe")(_linear)


def test_the_docs_model_list_is_the_registry() -> None:
    import importlib.util
    from pathlib import Path

    hook = Path(__file__).resolve().parents[2] / "docs" / "hooks" / "model_list.py"
    spec = importlib.util.spec_from_file_location("model_list", hook)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.PAGE_PATH.read_text(encoding="utf-8") == module.page_text(), \
        "docs/reference/models.md is stale: regenerate it with .venv/bin/python docs/hooks/model_list.py"
