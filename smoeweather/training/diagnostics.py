"""Per-layer routing diagnostics of Spatial MoE models, logged once per training epoch.

For every :class:`~smoeweather.nn.smoe.SpatialMoE2d` layer (name = its module path), logged as
``routing/<layer>/<metric>``:

* ``changed``: fraction of grid locations whose top-E expert SET differs from the previous epoch end
  (the first epoch compares with the routing at the start of training); ``order_changed``: the same for the
  RANKED selection (set or order);
* ``set_moved``, ``order_moved``, ``slots_moved``: area whose set / ranked selection differs from the routing
  at the START of training, and the share of (slot, location) pairs fed by another expert than at the start
  (an SMoE's output plane j is its rank-j expert, so the order is routing too);
* ``order_variety``: share of locations whose ranked selection differs from the most common one within
  their prior category (0 right after a coherent init);
* ``entropy``: mean over locations of the entropy of softmax(gate scores) over the |E| experts, divided
  by log |E| (1 = uniform scores, 0 = one expert dominates);
* ``margin``: mean over locations of the gap between the E-th and the (E+1)-th gate score, i.e. how far
  the selection is from changing (gate-score units);
* ``usage_min``, ``usage_max``: smallest / largest fraction of locations at which an expert is selected
  (E/|E| each when perfectly balanced); ``unused``: fraction of experts selected nowhere;
* ``selected_mean``, ``unselected_mean``, ``gap``: mean gate score of the selected / unselected (location,
  expert) pairs and their difference. RC labels that push every selected score down and every unselected
  one up (docs/smoe-weather-findings.md, Findings 3 and 6) show as a ``gap`` shrinking toward 0;
* ``swapped``: fraction of the (location, expert) pairs selected at the start of training that are no longer
  selected (0 = unchanged; (|E|−E)/|E| = a random reselection; 1 = the selected and unselected sets have
  swapped wholesale);
* ``order_kept``: fraction of the (slot, location) pairs whose expert is the same as at the previous epoch
  end. An SMoE's output plane j is its rank-j expert, so this is the share of the next layer's input
  channels that still come from the same filter (a set can stay fixed while its rank order churns);
* ``prior_agreement``: fraction of the selected (location, slot) pairs whose expert belongs to the group
  the land-sea prior assigns to that location (sea → first |E|/K experts, ...; 1.0 right after a
  strength ≥ 1 prior initialisation); only with a prior;
* ``rc_loss``, ``flagged``: mean over the epoch's training batches of the layer's RC loss
  (``last_rc_loss``) and of its misrouted (flagged) fraction of selections (``last_misrouted_fraction``);
  ``label_information``: mean share of locations whose batch-flagged fraction differs from 1 − q by more
  than 0.1 (≈ 0 = labels that say nothing about WHERE, Finding 3).

With ``error_scale=True`` (or ``training.diagnose_error_scale: true`` in the run's config) the error signal
dL/dy arriving at each layer is also measured every training batch (a gradient hook on the layer output):

* ``threshold_out``: the per-sample q-quantile of |dL/dy| (the RC label threshold) expressed in the units
  the layer's ``tolerance`` is given in (output units of a mean-reduced MSE: |dL/dy| · N / (2 · loss
  scale), N = elements of y), averaged over batches — compare it with ``tolerance`` (1e-5);
* ``flagged_no_tol``: the fraction of selections above the q-quantile alone (what ``flagged`` would be
  with tolerance 0).

Layout metrics need an input-independent :class:`~smoeweather.nn.gates.TensorRoutingGate`; layers with
other gates get only ``rc_loss`` and ``flagged``. The values of every epoch are also kept in
``callback.history`` (a list of {"epoch", "layer", metric: value}).
"""

from __future__ import annotations

import math
from typing import Any

import lightning as L
import numpy as np
import torch

from smoeweather.nn.gates import TensorRoutingGate
from smoeweather.nn.smoe import SpatialMoE2d, quantile_threshold


def top_sets(scores: torch.Tensor, k: int) -> torch.Tensor:
    """Top-k expert indices per location as sorted sets: scores (|E|, H, W) → (k, H, W), ascending."""
    return scores.detach().topk(k, dim=0).indices.sort(dim=0).values


def routing_layout(scores: torch.Tensor, k: int, prior: torch.Tensor | None = None) -> dict[str, Any]:
    """Layout metrics of one routing tensor (|E|, H, W) selecting ``k`` experts per location.

    ``prior``: integer category map (H, W) (0..K−1); expert e belongs to group e·K // |E| as in
    :meth:`TensorRoutingGate.init_from_prior`. Returns floats plus ``usage`` (|E|,) per-expert fractions.
    """
    scores = scores.detach().float()
    n_exp = scores.shape[0]
    logp = torch.log_softmax(scores, dim=0)
    entropy = -(logp.exp() * logp).sum(0).mean() / math.log(n_exp)
    # one sorted top-(k+1): the margin's two values and the ranked top-k (topk is the costly part at epoch end)
    ordered, ranked = scores.topk(min(k + 1, n_exp), dim=0, sorted=True)
    margin = (ordered[k - 1] - ordered[k]).mean() if k < n_exp else torch.tensor(float("inf"))
    idx = ranked[:k]  # (k, H, W), descending
    usage = torch.zeros(n_exp).index_add_(0, idx.flatten().cpu(), torch.ones(idx.numel())) / idx[0].numel()
    out: dict[str, Any] = {
        "entropy": float(entropy),
        "margin": float(margin),
        "usage_min": float(usage.min()),
        "usage_max": float(usage.max()),
        "unused": float((usage == 0).float().mean()),
        "usage": usage.tolist(),
    }
    chosen = torch.zeros_like(scores, dtype=torch.bool).scatter_(0, idx, True)
    out["selected_mean"] = float(scores[chosen].mean())
    out["unselected_mean"] = float(scores[~chosen].mean()) if k < n_exp else float("nan")
    out["gap"] = out["selected_mean"] - out["unselected_mean"]
    if prior is not None:
        prior = prior.to(idx.device).long()
        groups = int(prior.max()) + 1
        out["prior_agreement"] = float(((idx * groups // n_exp) == prior[None]).float().mean())
    out["order_variety"] = order_variety(idx, prior)
    return out


def ranked_selection(scores: torch.Tensor, k: int) -> torch.Tensor:
    """Top-k expert indices per location in descending score order (the layer's slot order): (k, H, W)."""
    return scores.detach().topk(k, dim=0, sorted=True).indices


def selection_change(now: torch.Tensor, previous: torch.Tensor | None = None,
                     initial: torch.Tensor | None = None) -> dict[str, float]:
    """Change metrics between ranked selections (k, H, W) of :func:`ranked_selection`.

    Against ``previous`` (the last interval): ``changed`` (locations whose SET differs), ``order_changed``
    (locations whose ranked tuple differs: set or order) and ``order_kept`` (slots holding the same expert).
    Against ``initial`` (the routing at the start of training): ``set_moved`` (area whose set differs),
    ``order_moved`` (area whose ranked tuple differs: the expert feeding at least one output plane changed),
    ``slots_moved`` (share of (slot, location) pairs with another expert) and ``swapped`` (share of the
    initially selected (location, expert) pairs no longer selected). An SMoE's output plane j is its rank-j
    expert, so the ORDER is routing too: a set can stay fixed while the order moves.
    """
    out: dict[str, float] = {}
    now_sets = now.sort(dim=0).values
    if previous is not None:
        out["changed"] = float((now_sets != previous.sort(dim=0).values).any(0).float().mean())
        out["order_changed"] = float((now != previous).any(0).float().mean())
        out["order_kept"] = float((now == previous).float().mean())
    if initial is not None:
        out["set_moved"] = float((now_sets != initial.sort(dim=0).values).any(0).float().mean())
        out["order_moved"] = float((now != initial).any(0).float().mean())
        out["slots_moved"] = float((now != initial).float().mean())
        # per location: |initial set ∩ current set| via membership of each initial expert in the current set
        kept = (initial.unsqueeze(1) == now.unsqueeze(0)).any(1)  # (k, H, W)
        out["swapped"] = 1.0 - float(kept.float().mean())
    return out


def order_variety(ranked: torch.Tensor, prior: torch.Tensor | None = None) -> float:
    """How spatially varied the routing is within one prior category: the share of locations whose ranked
    selection (k, H, W) differs from the most common one of their category (0 = one order per category, as
    a coherent init; → 1 = every location its own order). Without ``prior`` the whole grid is one category."""
    k = ranked.shape[0]
    columns = ranked.reshape(k, -1)
    category = torch.zeros(columns.shape[1], dtype=torch.long) if prior is None else prior.reshape(-1).long().cpu()
    differing = 0
    for c in category.unique():
        members = columns[:, category.to(columns.device) == c]
        _, inverse, counts = torch.unique(members, dim=1, return_inverse=True, return_counts=True)
        differing += members.shape[1] - int(counts.max())
    return differing / columns.shape[1]


def _prior_from_config(pl_module: L.LightningModule) -> torch.Tensor | None:
    """The land-sea category map of a weatherbench run whose config asks for the land-sea gate prior."""
    cfg = getattr(pl_module, "metadata", {}).get("config") or {}
    from smoeweather.models.ensemble import uses_land_sea_prior

    if cfg.get("task") != "weatherbench" or not uses_land_sea_prior(cfg.get("model") or {}):
        return None
    store = (cfg.get("data") or {}).get("store")
    if store is None:
        return None
    from smoeweather.training.stores import land_sea_mask

    return (land_sea_mask(store) > 0.5).long()


class RoutingDiagnostics(L.Callback):
    """Logs the routing diagnostics above each training epoch (no-op for models without SMoE layers).

    ``prior``: (H, W) category map for ``prior_agreement``; default: read from the run's config (land-sea
    mask of ``data.store`` when ``model.smoe.gate_prior == "land_sea"``).
    """

    def __init__(self, prior: torch.Tensor | None = None, error_scale: bool | None = None) -> None:
        self.prior = prior
        self.error_scale = error_scale
        self._hooks: list[Any] = []
        self.history: list[dict[str, Any]] = []
        self._layers: dict[str, SpatialMoE2d] = {}
        self._previous: dict[str, torch.Tensor] = {}
        self._initial: dict[str, torch.Tensor] = {}
        # {layer: {metric: [sum, batches]}} of the per-batch values this epoch (device tensors, no host sync)
        self._sums: dict[str, dict[str, list[Any]]] = {}

    def _find_layers(self, pl_module: L.LightningModule) -> None:
        self._layers = {}
        for name, m in pl_module.named_modules():
            if isinstance(m, SpatialMoE2d):
                short = name.removeprefix("model.").removeprefix("net.")
                self._layers[short] = m

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._find_layers(pl_module)
        if not self._layers:
            return
        if self.prior is None:
            self.prior = _prior_from_config(pl_module)
        if self.error_scale is None:
            cfg = getattr(pl_module, "metadata", {}).get("config") or {}
            self.error_scale = bool((cfg.get("training") or {}).get("diagnose_error_scale", False))
        if self.error_scale and not self._hooks:
            for name, layer in self._layers.items():
                self._hooks.append(layer.register_forward_hook(self._watch_error(name)))
        for name, layer in self._layers.items():
            if isinstance(layer.gate, TensorRoutingGate):
                self._previous[name] = ranked_selection(layer.gate.weight, layer.num_selected)
                self._initial.setdefault(name, self._previous[name])

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._sums = {}

    def _add(self, name: str, key: str, value: torch.Tensor) -> None:
        entry = self._sums.setdefault(name, {}).setdefault(key, [0.0, 0])
        entry[0], entry[1] = entry[0] + value.detach().float(), entry[1] + 1

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        if not self._layers:
            return
        logs_routing = getattr(pl_module, "logs_routing", None)
        if logs_routing is not None and not logs_routing(batch_idx):  # SMoETrainingModule.routing_log_every
            return
        for name, layer in self._layers.items():
            for key, value in (("rc_loss", layer.last_rc_loss), ("flagged", layer.last_misrouted_fraction),
                               ("label_information", layer.last_label_information)):
                if value is not None:
                    self._add(name, key, value)

    def _watch_error(self, name: str) -> Any:
        """Forward hook that puts a gradient hook on the layer output y (B, E·F, H, W)."""

        def on_grad(grad: torch.Tensor, layer: SpatialMoE2d) -> None:
            g = grad.detach().abs().float()
            b, _, h, w = g.shape
            error = g.view(b, layer.num_selected, layer.out_per_expert, h, w).sum(2)  # |dL/dy| per slot
            threshold = quantile_threshold(error, layer.quantile, nonnegative=True)  # (B, 1, 1, 1), error-signal units
            to_out = g.numel() / (2.0 * layer.loss_scale)  # error-signal units -> tolerance units
            self._add(name, "threshold_out", threshold.mean() * to_out)
            self._add(name, "flagged_no_tol", (error > threshold).float().mean())

        def hook(layer: SpatialMoE2d, inputs: Any, output: torch.Tensor) -> None:
            if layer.training and output.requires_grad:
                output.register_hook(lambda grad: on_grad(grad, layer))

        return hook

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        for handle in self._hooks:
            handle.remove()
        self._hooks = []

    def epoch_metrics(self) -> dict[str, dict[str, Any]]:
        """{layer: {metric: value}} for the current state (changes relative to the last call)."""
        out: dict[str, dict[str, Any]] = {}
        per_gate: dict[tuple[int, int], dict[str, Any]] = {}  # layers sharing a gate (and E) share its metrics
        for name, layer in self._layers.items():
            metrics: dict[str, Any] = {}
            if isinstance(layer.gate, TensorRoutingGate):
                gate = layer.gate
                key = (id(gate), layer.num_selected)
                if key not in per_gate:  # the same routing, and (tracked from the same start) the same history
                    now = ranked_selection(gate.weight, layer.num_selected)
                    shared = selection_change(now, self._previous.get(name), self._initial.get(name))
                    prior = self.prior if self.prior is not None and tuple(self.prior.shape) == (
                        gate.height, gate.width) else gate.prior_map  # a U-Net level's own pooled prior
                    shared.update(routing_layout(gate.weight, layer.num_selected, prior))
                    per_gate[key] = {"now": now, "metrics": shared}
                now = per_gate[key]["now"]
                metrics.update(per_gate[key]["metrics"])
                self._initial.setdefault(name, now)
                self._previous[name] = now
            for key, (total, batches) in self._sums.get(name, {}).items():
                metrics[key] = float(total) / batches
            out[name] = metrics
        return out

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not self._layers:
            return
        flat: dict[str, float] = {}
        for name, metrics in self.epoch_metrics().items():
            self.history.append({"epoch": trainer.current_epoch, "layer": name, **metrics})
            flat.update({f"routing/{name}/{key}": value for key, value in metrics.items()
                         if isinstance(value, float) and math.isfinite(value)})
        # straight to the loggers, once per epoch: these are host floats, identical on every rank (the gates are
        # replicated), so Lightning's per-key result collection (``self.log``: ~1.4 ms per key on CPU, 0.5 s
        # per epoch for a 12-layer SMoE-U-Net, ~10 % of a 25-step post-processing epoch) adds nothing here
        if flat and trainer.is_global_zero:
            for logger in trainer.loggers:
                logger.log_metrics({**flat, "epoch": trainer.current_epoch}, step=trainer.global_step)


def probe_routing(cfg: dict[str, Any], steps: int = 20, n_batches: int = 4, seed: int = 0) -> dict[str, Any]:
    """A short, Lightning-free training probe of a weatherbench config's SMoE layers (for the findings doc).

    Builds the config's model and data, takes ``n_batches`` shuffled training batches (cycled), and runs
    ``steps`` Adam steps of the training loss (latitude-weighted MSE, normalised units). Records per step and
    layer: ``flagged`` (the layer's RC flags, with its tolerance), ``flagged_no_tol`` and ``threshold_out``
    (see the module docstring); at the end the gate's ``changed`` fraction relative to initialisation and its
    layout metrics. Returns {"steps": [{layer: {...}}], "final": {layer: {...}}, "initial": {layer: {...}}}.
    """
    from torch.utils.data import DataLoader

    from smoeweather.training.losses import lat_weighted_mse
    from smoeweather.training.tasks import build

    L.seed_everything(seed, verbose=False)
    data, module = build(cfg)
    data.setup()
    generator = torch.Generator().manual_seed(seed)
    loader = DataLoader(data.dataset("train"), batch_size=data.batch_size, shuffle=True, generator=generator)
    batches = []
    for batch in loader:
        batches.append(batch)
        if len(batches) == n_batches:
            break
    cb = RoutingDiagnostics(error_scale=True, prior=_prior_from_config(module))
    cb._find_layers(module)
    if not cb._layers:
        raise ValueError("probe_routing: the config's model has no SMoE layer")
    hooks = [layer.register_forward_hook(cb._watch_error(name)) for name, layer in cb._layers.items()]
    initial = cb.epoch_metrics()  # also stores the initial top-E sets
    model = module.model.train()
    module.routing_log_every = 1  # every step's values
    opt = module.configure_optimizers()["optimizer"]
    per_step = []
    for step in range(steps):
        x, y = batches[step % len(batches)]
        cb._sums = {}
        opt.zero_grad(set_to_none=True)
        loss = lat_weighted_mse(model.net(x), y, module.lat_weights)  # as ForecastingModule.training_step
        loss.backward()
        opt.step()
        cb.on_train_batch_end(None, module, None, None, step)  # type: ignore[arg-type]
        record: dict[str, Any] = {name: {k: float(total) / batches for k, (total, batches) in sums.items()}
                                  for name, sums in cb._sums.items()}
        record["loss"] = float(loss.detach())
        gates = {id(m.gate): m for m in cb._layers.values() if isinstance(m.gate, TensorRoutingGate)}
        for i, layer in enumerate(gates.values()):  # mean logit of the selected / unselected experts
            w = layer.gate.weight.detach()
            chosen = torch.zeros_like(w, dtype=torch.bool).scatter_(0, w.topk(layer.num_selected, 0).indices, True)
            record[f"gate{i}"] = {"selected_mean": float(w[chosen].mean()), "unselected_mean": float(w[~chosen].mean()),
                                  "margin": routing_layout(w, layer.num_selected)["margin"]}
        per_step.append(record)
    for handle in hooks:
        handle.remove()
    cb._sums = {}
    final = cb.epoch_metrics()  # "changed" relative to the initial sets
    for metrics in (*initial.values(), *final.values()):
        metrics.pop("usage", None)
    return {"steps": per_step, "initial": initial, "final": final}


ROUTING_SUMMARY_KEYS = ("set_moved", "order_moved", "slots_moved", "order_variety", "label_information",
                        "flagged", "gap")


def routing_summary(history: list[dict[str, Any]], epoch: int | None = None) -> dict[str, dict[str, float]]:
    """Per layer: the routing state at ``epoch`` (default: the last one logged) — ``set_moved``,
    ``order_moved``, ``slots_moved``, ``order_variety``, ``label_information``, ``flagged``, ``gap`` — and
    the mean per-epoch ``changed`` / ``order_changed`` over the epochs up to it. ``history``:
    :attr:`RoutingDiagnostics.history`. Empty for a model without SMoE layers."""
    if not history:
        return {}
    last = max(row["epoch"] for row in history)
    epoch = last if epoch is None else min(int(epoch), last)
    out: dict[str, dict[str, float]] = {}
    for layer in dict.fromkeys(row["layer"] for row in history):
        rows = [row for row in history if row["layer"] == layer and row["epoch"] <= epoch]
        if not rows:
            continue
        at = rows[-1]
        summary = {k: float(at[k]) for k in ROUTING_SUMMARY_KEYS if isinstance(at.get(k), float)}
        for key in ("changed", "order_changed"):
            values = [float(r[key]) for r in rows if isinstance(r.get(key), float)]
            if values:
                summary[f"{key}_per_epoch"] = float(np.mean(values))
        out[layer] = summary
    return out
