"""Skill against cost: ``smoe plot frontier STUDY.json [STUDY.json ...] --cost {params,flops,time} --metric M``.

One point per arm of the studies (mean score over seeds, error bar = 95 % Student-t interval of that mean,
n − 1 dof), the dense arms joined by a line (the dense frontier), the cost axis logarithmic. The cost comes
from each study's measured ``cost`` block (``smoe study`` writes it): parameters, FLOPs of one training step
(forward + backward) or training-step time as a ratio to the study's reference arm.

Beside it a table pairs every other arm (SMoE, ensembles) with the dense frontier at the arm's cost, seed by
seed (paired differences, 95 % t-interval). ``--frontier ensemble`` makes the ensembles (deep ensembles) the
frontier instead, so that E³ (family ``smoe_ensemble``: one SMoE network whose experts are the members) is paired
with the deep ensembles of its cost:

* ``interpolate`` (default): inside the range of the dense costs, the dense score of each seed is interpolated
  linearly in log-cost between the two neighbouring dense arms; outside that range, the dense arm of nearest
  cost (the table says which);
* ``nearest``: the frontier arm of nearest cost in log-cost.

A difference < 0 means the arm beats the frontier at its cost (lower is better: CRPS, RMSE).
"""

from __future__ import annotations

import json
import math
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any

COSTS: dict[str, tuple[str, str]] = {
    "params": ("parameters", "parameters"),
    "flops": ("train_flops", "FLOPs of one training step (forward + backward)"),
    "time": ("train_step_ratio", "training-step time / reference arm (1 thread)"),
    "infer": ("infer_ratio", "inference time / reference arm (1 thread)"),
}
"""``--cost`` choice → (field of the study's ``cost.arms`` entries, axis label)."""

PAIRINGS = ("interpolate", "nearest")

FAMILIES: dict[str, tuple[str, str, str]] = {
    "dense": ("tab:blue", "o", "dense"),
    "smoe": ("tab:red", "s", "SMoE"),
    "ensemble": ("tab:green", "^", "ensemble"),
    "smoe_ensemble": ("tab:purple", "D", "SMoE ensemble (E³)"),
}
"""A study arm's ``family`` → (colour, marker, legend label); other families (e.g. ``schedule_check``) are left
out of a frontier."""


@dataclass
class Arm:
    """One arm of one study on the cost axis: its score per seed."""

    study: str
    name: str
    family: str
    cost: float
    scores: dict[int, float]

    @property
    def label(self) -> str:
        return self.name if not self.study else f"{self.study}:{self.name}"


def _metric_of(study: dict[str, Any], metric: str | None) -> str:
    if metric is None:
        return f"{study['targets'][0]}@{study['leads'][0]}"
    return metric


def load_arms(studies: list[dict[str, Any]], cost: str = "flops", metric: str | None = None,
              frontier: str = "dense", score: str | None = None) -> tuple[list[Arm], str]:
    """Arms of ``studies`` (parsed study.json files) with their ``cost`` and per-seed ``metric``
    (``target@lead``, or ``target/region@lead`` for the land and sea scores; default: the first study's first
    target at its first lead). ``score``: another score the runs recorded (e.g. ``crps_ecdf``, the CRPS of an
    ensemble's issued members) instead of the study's main one. Arms without a measured
    cost, or of a family not in :data:`FAMILIES` (e.g. ``schedule_check``), are left out. Arm labels carry the
    study name when more than one study is given."""
    if cost not in COSTS:
        raise ValueError(f"cost must be one of {', '.join(COSTS)}, got {cost!r}")
    if frontier not in FAMILIES:
        raise ValueError(f"frontier must be one of {', '.join(FAMILIES)}, got {frontier!r}")
    if not studies:
        raise ValueError("no study given")
    metric = _metric_of(studies[0], metric)
    target, _, lead = metric.partition("@")
    field = COSTS[cost][0]
    arms: list[Arm] = []
    for study in studies:
        block = study.get("cost") or {}
        if not block.get("arms"):
            raise ValueError(f"study {study.get('name')!r} has no measured cost (run `smoe study --cost-only`)")
        # a target, or TARGET/REGION (land, sea) where the study scored regions
        if (target.split("/")[0] not in study["targets"] or lead not in study["leads"]
                or not all(target in r["scores"].get(lead, {}) for r in study["runs"])):
            regions = sorted({k for r in study["runs"] for k in r["scores"].get(lead, {}) if "/" in k})
            raise ValueError(f"study {study.get('name')!r} has no {metric} (targets {study['targets']}, leads "
                             f"{study['leads']}" + (f", regional scores {regions})" if regions else ")"))
        if score is not None:
            extras = sorted({k for r in study["runs"] for k, v in r.get("extra", {}).items() if isinstance(v, dict)})
            if not all(target in r.get("extra", {}).get(score, {}).get(lead, {}) for r in study["runs"]):
                raise ValueError(f"study {study.get('name')!r} has no {score} score of {metric} in every run "
                                 f"(its runs' other scores: {', '.join(extras) or 'none'})")

        def value(run: dict[str, Any]) -> float:
            return float((run["scores"] if score is None else run["extra"][score])[lead][target])

        for name, spec in study["variants"].items():
            family = spec.get("family", "dense")
            if family not in FAMILIES or name not in block["arms"]:
                continue
            scores = {int(r["seed"]): value(r) for r in study["runs"] if r["variant"] == name}
            if scores:
                arms.append(Arm(study["name"] if len(studies) > 1 else "", name, family,
                                float(block["arms"][name][field]), scores))
    if not any(a.family == frontier for a in arms):
        raise ValueError(f"no {frontier} arm with a measured cost: the frontier needs at least one (families: "
                         f"{', '.join(sorted({a.family for a in arms})) or 'none'})")
    return arms, metric


def pair_to_frontier(arm: Arm, line: list[Arm], pairing: str = "interpolate") -> dict[str, Any]:
    """``arm`` − the frontier through the arms ``line`` (usually the dense ones) at ``arm.cost``, per seed (seeds
    that ``arm`` and the frontier arms used all have), with its 95 % t-interval
    (:func:`smoeweather.metrics.significance.t_interval`) and the method."""
    from smoeweather.metrics.significance import t_interval

    if pairing not in PAIRINGS:
        raise ValueError(f"pairing must be one of {', '.join(PAIRINGS)}, got {pairing!r}")
    line = sorted(line, key=lambda a: a.cost)
    x = math.log(arm.cost)
    lo = [d for d in line if d.cost <= arm.cost]
    hi = [d for d in line if d.cost >= arm.cost]
    if pairing == "interpolate" and lo and hi and lo[-1] is not hi[0]:
        a, b = lo[-1], hi[0]
        w = (x - math.log(a.cost)) / (math.log(b.cost) - math.log(a.cost))
        seeds = sorted(set(arm.scores) & set(a.scores) & set(b.scores))
        ref = {s: (1 - w) * a.scores[s] + w * b.scores[s] for s in seeds}
        method = f"interpolated in log-cost between {a.label} and {b.label} (weight {w:.2f} on {b.label})"
        against = [a.label, b.label]
    else:
        near = min(line, key=lambda d: (round(abs(math.log(d.cost) - x), 9), d.cost))  # a tie: the cheaper
        seeds = sorted(set(arm.scores) & set(near.scores))
        ref = {s: near.scores[s] for s in seeds}
        outside = pairing == "interpolate" and near.cost != arm.cost
        method = f"nearest {near.family} arm {near.label}" + (f" (cost outside the {near.family} range)"
                                                              if outside else "")
        w, against = float("nan"), [near.label]
    diffs = [arm.scores[s] - ref[s] for s in seeds]
    return {"arm": arm.label, "family": arm.family, "cost": arm.cost, "method": method, "against": against,
            "weight": w, "seeds": seeds, "dense_at_cost": [ref[s] for s in seeds],
            **t_interval(diffs)}


def frontier_table(arms: list[Arm], pairing: str = "interpolate", frontier: str = "dense") -> list[dict[str, Any]]:
    """:func:`pair_to_frontier` of every arm not of family ``frontier``, against the arms of that family."""
    line = [a for a in arms if a.family == frontier]
    return [pair_to_frontier(a, line, pairing) for a in arms if a.family != frontier]


def _cost_text(cost: str, value: float) -> str:
    if cost == "params":
        return f"{value / 1e6:.3g} M"
    if cost == "flops":
        return f"{value / 1e9:.3g} GFLOP"
    return f"{value:.2f}×"


def frontier_markdown(arms: list[Arm], rows: list[dict[str, Any]], cost: str, metric: str, pairing: str,
                      studies: list[dict[str, Any]], frontier: str = "dense", score: str | None = None) -> str:
    """The arm table (score ± t-interval half-width, cost) and the paired table against the frontier (the arms
    of family ``frontier``)."""
    from smoeweather.metrics.significance import t_interval

    names = ", ".join(f"`{s['name']}`" for s in studies)
    what = metric if score is None else f"{score} {metric}"
    lines = [f"# Skill against cost: {what}, cost = {COSTS[cost][1]}", "", f"Studies: {names}."]
    lines += [f"> {s['label']}" for s in studies if s.get("label")]
    lines += ["", "| arm | family | cost | score mean [95 % t-interval] (n) |", "|---|---|---:|---|"]
    for a in sorted(arms, key=lambda a: (a.family != frontier, a.cost)):
        t = t_interval(list(a.scores.values()))
        lines.append(f"| {a.label} | {a.family} | {_cost_text(cost, a.cost)} | {t['mean']:.4g} "
                     f"[{t['lo']:.4g}, {t['hi']:.4g}] ({t['n']}) |")
    f = frontier
    method = (f"linear interpolation in log-cost between the two neighbouring {f} arms, per seed (the {f} arm "
              "of nearest cost outside their range)" if pairing == "interpolate" else
              f"the {f} arm of nearest cost (in log-cost)")
    lines += ["", f"Each arm not of family {f} − the {f} frontier at its cost, paired by seed; {f} frontier = "
              f"{method}. Mean [95 % Student-t interval, n − 1 dof] (n); **bold** where the interval excludes "
              f"zero; < 0: the arm beats the {f} networks of its cost.", "",
              f"| arm | cost | paired difference | verdict | {f} reference |", "|---|---:|---|---|---|"]
    for r in rows:
        text = f"{r['mean']:+.4g} [{r['lo']:+.3g}, {r['hi']:+.3g}] ({r['n']})"
        verdict = ("beyond the frontier" if r["hi"] < 0 else "behind the frontier" if r["lo"] > 0 else
                   "on the frontier (tie)") if r["n"] > 1 else "n < 2: no verdict"
        lines.append(f"| {r['arm']} | {_cost_text(cost, r['cost'])} | "
                     f"{f'**{text}**' if r['excludes_zero'] else text} | {verdict} | {r['method']} |")
    return "\n".join(lines) + "\n"


# label offsets (points) tried in turn: right/left of the point, level, below, then higher and lower
_OFFSETS = [(7, 4), (7, -10), (-7, 4), (-7, -10), (7, 14), (-7, 14), (7, -20), (-7, -20), (7, 24), (-7, 24),
            (7, -30), (-7, -30)]


def _place_labels(fig: Any, ax: Any, items: list[tuple[str, float, float, float, float, str]]) -> None:
    """Label every arm (``items``: name, cost, mean, interval low, high, colour) where its text overlaps no other
    label, marker, error bar, line or the legend (greedy, first free offset in ``_OFFSETS``; the least overlap,
    inside the axes, if none is free). Hand-written: matplotlib has no label placement, and adjustText moves
    labels iteratively with arrows, which reads worse for a dozen short labels."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    inside = ax.get_window_extent(renderer)
    obstacles = []  # display boxes (x0, y0, x1, y1) of the legend, markers and error bars
    if ax.get_legend() is not None:
        e = ax.get_legend().get_window_extent(renderer)
        obstacles.append((e.x0, e.y0, e.x1, e.y1))
    for _, x, y, lo, hi, _ in items:
        (px, py), (_, plo), (_, phi) = (ax.transData.transform((x, v)) for v in (y, lo, hi))
        obstacles += [(px - 5, py - 5, px + 5, py + 5), (px - 4, min(plo, phi), px + 4, max(plo, phi))]
    for line in ax.get_lines():  # the frontier and reference lines, sampled along each segment (display space)
        if line.get_linestyle() not in ("None", "none", "") and len(line.get_xdata()) > 1:
            pts = line.get_transform().transform(line.get_xydata())
            for (x0, y0), (x1, y1) in zip(pts[:-1], pts[1:]):
                obstacles += [(x0 + t * (x1 - x0) - 1, y0 + t * (y1 - y0) - 1, x0 + t * (x1 - x0) + 1,
                               y0 + t * (y1 - y0) + 1) for t in (i / 48 for i in range(49))]

    def overlap(a: tuple[float, ...], b: tuple[float, ...]) -> float:
        return max(0.0, min(a[2], b[2]) - max(a[0], b[0])) * max(0.0, min(a[3], b[3]) - max(a[1], b[1]))

    for name, x, y, _, _, color in sorted(items, key=lambda t: t[1]):
        best = None
        for dx, dy in _OFFSETS:
            ann = ax.annotate(name, (x, y), textcoords="offset points", xytext=(dx, dy), fontsize=7, color=color,
                              ha="left" if dx > 0 else "right", va="bottom" if dy > 0 else "top")
            e = ann.get_window_extent(renderer)
            box = (e.x0 - 2, e.y0 - 1, e.x1 + 2, e.y1 + 1)  # a little air around the text
            out = sum(max(0.0, v) for v in (inside.x0 - e.x0, e.x1 - inside.x1, inside.y0 - e.y0, e.y1 - inside.y1))
            cost = sum(overlap(box, o) for o in obstacles) + 100 * out
            if best is None or cost < best[0]:
                if best is not None:
                    best[1].remove()
                best = (cost, ann, box)
            else:
                ann.remove()
            if cost == 0:
                break
        obstacles.append(best[2])


def _draw(arms: list[Arm], cost: str, metric: str, title: str, path: Path, score: str = "score",
          references: dict[str, float] | None = None, frontier: str = "dense") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    from smoeweather.metrics.significance import t_interval

    fig, ax = plt.subplots(figsize=(7.0, 4.6))
    to_label: list[tuple[str, float, float, float, float, str]] = []  # name, cost, mean, lo, hi, colour
    for family, (color, marker, label) in FAMILIES.items():
        group = sorted((a for a in arms if a.family == family), key=lambda a: a.cost)
        if not group:
            continue
        stats = [t_interval(list(a.scores.values())) for a in group]
        xs = [a.cost for a in group]
        ys = [s["mean"] for s in stats]
        err = [[s["mean"] - s["lo"] if s["n"] > 1 else 0.0 for s in stats],
               [s["hi"] - s["mean"] if s["n"] > 1 else 0.0 for s in stats]]
        ax.errorbar(xs, ys, yerr=err, fmt=marker, color=color, capsize=3, markersize=6,
                    linestyle="-" if family in ("dense", frontier) else "none",
                    label=f"{label} (mean, 95 % t-interval)")
        to_label += [(a.name, a.cost, y, y - e0, y + e1, color) for a, y, e0, e1 in zip(group, ys, *err)]
    for i, (ref, value) in enumerate((references or {}).items()):
        ax.axhline(value, color="grey", linestyle=("--", ":", "-.")[i % 3], linewidth=1, label=f"{ref} (no seeds)")
    ax.set_xscale("log")
    plain = FuncFormatter(lambda v, _: f"{v:g}")  # 0.6, 2, 4e+09 rather than 6×10⁻¹

    def minor(v: float, _: object) -> str:  # every minor tick of a short ratio axis; else only 2 and 5 × 10ᵏ
        lo, hi = ax.get_xlim()
        mantissa = round(v / 10 ** math.floor(math.log10(v)), 6)
        return f"{v:g}" if (hi / lo <= 10 and hi < 100) or mantissa in (2.0, 5.0) else ""

    ax.xaxis.set_major_formatter(plain)
    ax.xaxis.set_minor_formatter(FuncFormatter(minor))
    ax.tick_params(axis="x", which="minor", labelsize=7)
    ax.tick_params(axis="x", which="major", labelsize=8)
    ax.margins(x=0.12, y=0.08)
    ax.set_xlabel(COSTS[cost][1] + " (log scale)")
    ax.set_ylabel(f"{score} {metric} (lower is better)")
    ax.set_title("\n".join(textwrap.fill(line, 100) for line in title.splitlines()), fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    _place_labels(fig, ax, to_label)
    fig.savefig(path, dpi=130)
    plt.close(fig)


def plot_frontier(studies: list[Path], out: Path, cost: str = "flops", metric: str | None = None,
                  pairing: str = "interpolate", name: str | None = None, frontier: str = "dense",
                  score: str | None = None) -> list[Path]:
    """Write ``<name>_<cost>.png``, ``.md`` and ``.json`` (arms, pairings) under ``out`` for the study.json
    files ``studies``; ``name`` defaults to the first study's name + ``_frontier`` (+ ``_vs_<frontier>`` for a
    frontier other than dense, + ``_<score>`` for a ``score`` other than the study's main one). The other arms
    are paired with the arms of family ``frontier``. Returns the paths."""
    parsed = [json.loads(Path(p).read_text()) for p in studies]
    arms, metric = load_arms(parsed, cost, metric, frontier, score)
    rows = frontier_table(arms, pairing, frontier)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    default = (parsed[0]["name"] + "_frontier" + ("" if frontier == "dense" else f"_vs_{frontier}")
               + ("" if score is None else f"_{score}"))
    stem = f"{name or default}_{cost}"
    label = "; ".join(s["label"] for s in parsed if s.get("label"))
    title = f"{', '.join(s['name'] for s in parsed)}: {metric}" + (f"\n{label}" if label else "")
    png, md, js = out / f"{stem}.png", out / f"{stem}.md", out / f"{stem}.json"
    target, _, lead = metric.partition("@")
    refs = {}  # the seed-free reference method a study pairs with (e.g. per-grid-point EMOS), as a level
    for s in parsed:
        ref = s.get("reference_baseline")
        value = (s.get("references") or {}).get(ref, {}).get(lead, {}).get(target) if ref else None
        if value is not None:
            refs[ref] = float(value)
    label_score = str(parsed[0].get("score", "score")).split(" ")[0] if score is None else score
    _draw(arms, cost, metric, title, png, score=label_score, references=refs if score is None else {},
          frontier=frontier)
    md.write_text(frontier_markdown(arms, rows, cost, metric, pairing, parsed, frontier, score))
    js.write_text(json.dumps({"cost": cost, "metric": metric, "score": score or "main", "pairing": pairing,
                              "frontier": frontier,
                              "studies": [s["name"] for s in parsed],
                              "arms": [{"arm": a.label, "family": a.family, "cost": a.cost,
                                        "scores": {str(k): v for k, v in a.scores.items()}} for a in arms],
                              "pairs": rows}, indent=2) + "\n")
    return [png, md, js]
