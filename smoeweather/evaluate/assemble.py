"""The scores of ``smoe evaluate`` joined into one tidy Dataset: per-(method, field) scores
(:class:`FieldScores`, against a :class:`FieldContext`) with length-1 ``method``/``field`` dims (:func:`tidy`),
merged with xarray in the order given (:func:`assemble`, :func:`ordered`), and the Brier skill scores added
(:func:`brier_skill_scores`). Shared by the gridded (:mod:`smoeweather.evaluate`) and the site
(:mod:`smoeweather.evaluate.sites`) evaluations."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import xarray as xr

from smoeweather.data.weather import Field, field_name
from smoeweather.evaluate.files import HEADLINE_REGION
from smoeweather.metrics.scores import METRICS


@dataclass
class FieldScores:
    """The scores of one (method, field): {metric: DataArray} over the lead, region and time dims it has."""

    values: dict[str, xr.DataArray]
    n_missing: int = 0


@dataclass
class FieldContext:
    """What every forecast of one field is scored against: the truth at the valid times (time, lead, lat, lon),
    the weights (latitude; ``regions``: region, lat, lon), the climatological mean and quantile thresholds, the
    event thresholds (dim ``threshold``, units of the field) with the climatological probability of each
    event, and the spectra settings ((lat0, lat1), recipe)."""

    truth: xr.DataArray
    weights: xr.DataArray
    regions: xr.DataArray | None = None
    clim_mean: xr.DataArray | None = None
    thresholds: xr.DataArray | None = None
    event_thresholds: xr.DataArray | None = None
    clim_probability: xr.DataArray | None = None
    spectra_band: tuple[tuple[float, float], str] | None = None

    @property
    def area(self) -> xr.DataArray:
        """Area weights with a ``region`` dim (the global one alone without regions)."""
        if self.regions is not None:
            return self.regions
        template = self.truth.isel(time=0, prediction_timedelta=0, drop=True)
        return self.weights.broadcast_like(template).expand_dims(region=[HEADLINE_REGION])


def tidy(fs: FieldScores, method: str, fname: str) -> xr.Dataset:
    """One (method, field)'s scores as a Dataset with length-1 ``method`` and ``field`` dims."""
    values = dict(fs.values)
    if "rank_histogram" in values:
        rh = values["rank_histogram"]
        values["rank_histogram"] = rh.assign_coords(rank=np.arange(1, rh.sizes["rank"] + 1))
    ds = xr.Dataset({k: v.drop_vars([c for c in v.coords if c not in v.dims and c != "wavelength"],
                                    errors="ignore") for k, v in values.items()})
    return ds.expand_dims(method=[method], field=[fname])


def ordered(scores: xr.Dataset, rdims: tuple[str, ...]) -> xr.Dataset:
    """Variables in table order with dims (method, field, prediction_timedelta, [region], ...)."""
    head = ("method", "field", "prediction_timedelta", *rdims)
    names = [m for m in METRICS if m in scores]
    names += sorted(k for k in scores.data_vars if str(k).startswith("per_init_"))
    names += sorted(k for k in scores.data_vars if str(k).startswith("wb2_"))
    names += [k for k in ("spectrum", "rank_histogram") if k in scores]
    names += [k for k in scores.data_vars if k not in names]  # calibration: Brier, reliability, PIT
    return xr.Dataset({k: scores[k].transpose(*[d for d in head if d in scores[k].dims], ...) for k in names},
                      attrs=scores.attrs)


def assemble(parts: list[xr.Dataset], methods: list[str], fields: list[str], rdims: tuple[str, ...]) -> xr.Dataset:
    """Join the per-(method, field) Datasets with xarray (outer join: a field a method lacks is NaN), in the
    order the methods and fields were given."""
    scores = xr.merge(parts, join="outer", compat="no_conflicts", combine_attrs="drop")
    scores = scores.reindex({"method": methods, "field": fields})  # dict: `method=` is reindex's own keyword
    # numpy unicode coordinates (as before): pandas' string-dtype index from the merge selects oddly
    scores = scores.assign_coords(method=np.array(methods, dtype=str), field=np.array(fields, dtype=str))
    return ordered(scores, rdims)


def brier_skill_scores(scores: xr.Dataset, contexts: dict[Field, FieldContext], reference: str | None
                       ) -> xr.Dataset:
    """Add ``brier_score_climatology`` (the climatological probability's Brier score) and ``brier_skill_score``
    (dim ``reference``: climatology and/or the ``reference`` method, e.g. the raw ensemble) to ``scores``."""
    from smoeweather.metrics import calibration as cal

    if "brier_score" not in scores:
        return scores
    refs: dict[str, xr.DataArray] = {}
    clim = [cal.brier_terms(ctx.clim_probability, cal.event(ctx.truth, ctx.event_thresholds), ctx.area).mean(
        "time").expand_dims(field=[field_name(f)]) for f, ctx in contexts.items()
        if ctx.clim_probability is not None and ctx.event_thresholds is not None]
    rdims = "region" in scores.dims
    if clim:
        bs_clim = xr.concat(clim, "field").reindex({"field": scores["field"].values,
                                                    "threshold": scores["threshold"].values})
        scores["brier_score_climatology"] = bs_clim if rdims else bs_clim.squeeze("region", drop=True)
        refs["climatology"] = scores["brier_score_climatology"]
    if reference is not None:
        if reference not in scores["method"].values.tolist():
            raise ValueError(f"--bss-reference {reference!r} is not one of the methods "
                             f"{scores['method'].values.tolist()}")
        refs[reference] = scores["brier_score"].sel({"method": reference}, drop=True)
    if refs:
        scores["brier_skill_score"] = xr.concat([cal.brier_skill(scores["brier_score"], r).expand_dims(reference=[n])
                                                 for n, r in refs.items()], "reference")
    return scores


__all__ = ["FieldContext", "FieldScores", "assemble", "brier_skill_scores", "ordered", "tidy"]
