"""The cost of a study's arms, measured three ways in one process: parameters, FLOPs of one training step
(forward + backward, :class:`torch.utils.flop_counter.FlopCounterMode`; the optimizer update is not counted)
and the time of one training step (forward, loss, backward, Adam) and of one inference (eval mode, no
gradient, forward + loss) as a ratio to one reference arm measured in the same process, on one thread,
interleaved.

Every arm is built from its resolved training config by the task's own builder (the network and Lightning
module ``smoe train`` would train) and fed one real training batch of its data. Timing: ``warmup`` untimed
steps per arm, then ``rounds`` rounds; in each round every arm (the reference included) times ``steps``
steps in turn, so a drifting machine load hits every arm alike. Per round the ratio arm / reference; the
median over rounds is reported (seconds too, but ratios are what compare across machines).
"""

from __future__ import annotations

import statistics
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch


@dataclass
class CostOptions:
    """How :func:`measure_costs` times (study key ``cost``: ``{reference, steps, rounds, warmup}``)."""

    reference: str | None = None  # the arm every time is divided by (default: the study's baseline)
    steps: int = 3  # timed steps per arm and round
    rounds: int = 5
    warmup: int = 2
    threads: int = 1


class _Arm:
    """One arm's Lightning module, Adam and a fixed training batch; ``train_step`` / ``infer`` run one step."""

    def __init__(self, cfg: dict[str, Any], prepare: Callable[[torch.nn.Module], None] | None = None) -> None:
        import lightning as L

        from smoeweather.training.tasks import build

        L.seed_everything(int(cfg.get("seed", 0)), verbose=False)
        data, self.module = build(cfg)
        if prepare is not None:
            prepare(self.module)
        data.setup("fit")
        self.batch = next(iter(data.train_dataloader()))
        self.opt = torch.optim.Adam([p for p in self.module.parameters() if p.requires_grad], lr=1e-4)

    def loss(self) -> torch.Tensor:
        with warnings.catch_warnings():  # self.log without a trainer: a no-op and a warning
            warnings.filterwarnings("ignore", message=".*self.log.*")
            out = self.module.training_step(self.batch, 0)
        return out["loss"] if isinstance(out, dict) else out

    def train_step(self) -> None:
        self.module.train()
        self.opt.zero_grad(set_to_none=True)
        self.loss().backward()
        self.opt.step()

    def infer(self) -> None:
        self.module.eval()
        with torch.no_grad():
            self.loss()

    def flops(self) -> int:
        from torch.utils.flop_counter import FlopCounterMode

        self.module.train()
        self.opt.zero_grad(set_to_none=True)
        with FlopCounterMode(display=False) as counter:
            self.loss().backward()
        self.opt.zero_grad(set_to_none=True)
        return int(counter.get_total_flops())

    def parameters(self) -> int:
        return sum(p.numel() for p in self.module.parameters())


def _timed(fn: Callable[[], None], steps: int) -> float:
    t = time.perf_counter()
    for _ in range(steps):
        fn()
    return (time.perf_counter() - t) / steps


def measure_costs(configs: dict[str, dict[str, Any]], options: CostOptions,
                  log: Callable[[str], None] = print,
                  prepare: dict[str, Callable[[torch.nn.Module], None]] | None = None) -> dict[str, Any]:
    """Cost of every arm (``configs``: arm name → resolved training config) with ``options``; returns
    ``{"reference", "threads", "steps", "rounds", "warmup", "arms": {arm: {parameters, train_flops,
    train_step_s, infer_s, train_step_ratio, infer_ratio}}}``. Runs on ``options.threads`` intra-op threads
    (restored afterwards). ``prepare``: arm name → a function applied to that arm's built Lightning module
    (e.g. to switch its SMoE layers to another expert computation)."""
    reference = options.reference or next(iter(configs))
    if reference not in configs:
        raise ValueError(f"cost reference {reference!r} is not an arm ({sorted(configs)})")
    previous = torch.get_num_threads()
    torch.set_num_threads(options.threads)
    try:
        arms = {name: _Arm(cfg, (prepare or {}).get(name)) for name, cfg in configs.items()}
        out: dict[str, dict[str, Any]] = {}
        for name, arm in arms.items():
            out[name] = {"parameters": arm.parameters(), "train_flops": arm.flops()}
            for _ in range(options.warmup):
                arm.train_step()
                arm.infer()
        train: dict[str, list[float]] = {name: [] for name in arms}
        infer: dict[str, list[float]] = {name: [] for name in arms}
        for r in range(options.rounds):
            log(f"cost: timing round {r + 1}/{options.rounds}")
            for name, arm in arms.items():
                train[name].append(_timed(arm.train_step, options.steps))
                infer[name].append(_timed(arm.infer, options.steps))
        for name in arms:
            out[name].update(
                train_step_s=statistics.median(train[name]), infer_s=statistics.median(infer[name]),
                train_step_ratio=statistics.median(a / b for a, b in zip(train[name], train[reference])),
                infer_ratio=statistics.median(a / b for a, b in zip(infer[name], infer[reference])))
    finally:
        torch.set_num_threads(previous)
    return {"reference": reference, "threads": options.threads, "steps": options.steps, "rounds": options.rounds,
            "warmup": options.warmup, "flops": "forward + backward of one training batch (FlopCounterMode)",
            "arms": out}
