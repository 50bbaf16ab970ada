"""``smoe evaluate``: score forecast stores against a truth store, references beside the models.

Orchestration above :mod:`smoeweather.metrics` (pure xarray), in small steps: open and align the inputs
(:func:`open_inputs`), add the reference forecasts (:func:`add_references`), the climatology at the valid times
(:func:`climatology_inputs`), score every (method, field) (:func:`score_field`), and join the results with
xarray (:func:`assemble`) into ONE tidy ``xarray.Dataset`` over (method, field, prediction_timedelta [, region])
with one variable per metric. scores.json, scores.md and WeatherBench 2's evaluation files are rendered from it
(:mod:`smoeweather.evaluate.files`).

Every forecast is matched with the truth at its VALID time ``time + prediction_timedelta``; all methods are scored
on the same initialisations (those common to every forecast). Weights are WeatherBench 2's cell areas
(:func:`~smoeweather.metrics.weights.cell_area_weights`). Scores per (method, field, lead): ``rmse`` — the square root
AFTER the mean over initialisations, √(mean_t MSE_t), i.e. √ of WB2's ``mse``; WB2's
``rmse_sqrt_before_time_avg`` (mean_t √MSE_t, never larger) is in WB2's ``deterministic_temporal`` file per
initialisation — and bias, ACC, fair and ECDF CRPS, spread–skill, debiased ensemble-mean MSE, energy score,
pinball loss by forecast kind, plus the per-initialisation WB2 terms (``wb2_<metric>``, :mod:`smoeweather.metrics.
wb2`) from which the WB2 files are written: one engine (:func:`smoeweather.metrics.scores.field_terms`) computes
every per-initialisation term once, in blocks of initialisations, and both come from those same arrays.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import xarray as xr

from pipelines.progress import progress_bar
from smoeweather.data.forecast_stores import (
    describe,
    is_url,
    split_gaussian,
    truth_at_valid_times,
)
from smoeweather.data.weather import Field, field_name
from smoeweather.evaluate.assemble import (
    FieldContext,
    FieldScores,
    assemble,
    brier_skill_scores,
    ordered,
    tidy,
)
from smoeweather.evaluate.cluster import map_on_cluster, on_scheduler
from smoeweather.evaluate.files import (
    ESTIMATORS,
    HEADLINE_REGION,
    headline,
    scores_json,
    scores_markdown,
    wb2_results,
    write_scores,
)
from smoeweather.evaluate.inputs import (
    Inputs,
    Source,
    _regions_for,
    _select,
    add_climatology_reference,
    add_persistence,
    at_thresholds,
    climatological_probabilities,
    climatology_inputs,
    event_thresholds,
    land_sea_mask_of,
    open_inputs,
    open_truth_source,
    relative_to_threshold,
)
from smoeweather.metrics import wb2
from smoeweather.metrics.regions import Region, describe_regions
from smoeweather.metrics.scores import BLOCK_BYTES, PER_INIT, field_terms, median_of_quantiles, table_scores
from smoeweather.metrics.spectra import DEFAULT_BAND, zonal_energy_spectrum
from smoeweather.metrics.weights import cell_area_weights
from smoeweather.units import units_of


def _read_once(x: xr.DataArray | None) -> xr.DataArray | None:
    """``x`` read into memory when it is dask-backed and its float64 size is at most
    :data:`~smoeweather.metrics.scores.BLOCK_BYTES` (what the scores of one block of initialisations hold anyway):
    the completeness check, the calibration, the score terms and the spectrum then read the store once
    instead of once each. Larger fields stay lazy and are scored block by block (bounded memory)."""
    if x is None or x.chunks is None or 8.0 * x.size > BLOCK_BYTES:
        return x
    return x.compute()


def _point_and_sigma(ds: xr.Dataset, kind: str, f: Field) -> tuple[xr.DataArray, xr.DataArray | None]:
    if kind == "gaussian":  # μ as <name>, σ as <name>_std
        mu_ds, sigma_ds = split_gaussian(ds)
        return _select(mu_ds, f), _select(sigma_ds, f)
    return _select(ds, f), None


def _complete(point: xr.DataArray, truth: xr.DataArray, own_leads: np.ndarray, leads: np.ndarray, f: Field,
              allow_missing: bool, where: str) -> tuple[xr.DataArray, int]:
    """(truth blanked where the forecast is incomplete, number of such (init, lead) pairs); ValueError naming
    ``where`` and the field unless ``allow_missing``."""
    space = [d for d in point.dims if d not in ("time", "prediction_timedelta")]
    has_lead = xr.DataArray(np.isin(leads, own_leads), dims="prediction_timedelta",
                            coords={"prediction_timedelta": leads})
    incomplete = point.isnull().any(space).compute() & truth.notnull().any(["latitude", "longitude"]) & has_lead
    n_missing = int(incomplete.sum())
    if n_missing and not allow_missing:
        bad = incomplete.any("prediction_timedelta")
        first = str(bad["time"].values[bad.values][0])[:16]
        raise ValueError(f"{where}: {field_name(f)} misses values at {n_missing} (initialisation, lead) pairs of "
                         f"{int(bad.sum())} initialisations (first {first}) where the truth has values; pass "
                         "--allow-missing to score only the complete initialisations")
    return (truth.where(~incomplete) if n_missing else truth), n_missing


def calibration_scores(point: xr.DataArray, kind: str, ctx: FieldContext, truth: xr.DataArray,
                       sigma: xr.DataArray | None, relative_to: str) -> dict[str, xr.DataArray]:
    """Brier score per threshold (and per initialisation), the reliability table (global, unweighted cases) and,
    for Gaussian forecasts, the PIT histogram; computed."""
    import dask

    from smoeweather.metrics import calibration as cal

    out: dict[str, xr.DataArray] = {}
    if ctx.event_thresholds is not None and kind != "quantiles":
        p = cal.exceedance_probability(point.astype(np.float64), kind, ctx.event_thresholds, sigma, relative_to)
        if kind == "probability":
            p = at_thresholds(p, ctx.event_thresholds)
        o = cal.event(truth, ctx.event_thresholds)
        per_init = cal.brier_terms(p, o, ctx.area)
        table = cal.reliability_table(p, o, ("time", "latitude", "longitude"))
        per_init, table = dask.compute(per_init, table)
        out["per_init_brier_score"] = per_init
        out["brier_score"] = per_init.mean("time")
        out.update({f"reliability_{k}": v for k, v in table.data_vars.items()})
    if kind == "gaussian" and sigma is not None:
        pit = cal.pit_values(point.astype(np.float64), kind, truth, sigma.astype(np.float64))
        out["pit_histogram"] = cal.pit_histogram(pit, ("time", "latitude", "longitude")).compute()
    return out


def score_field(ds: xr.Dataset, kind: str, f: Field, ctx: FieldContext, inits: np.ndarray, leads: np.ndarray,
                allow_missing: bool = False, where: str = "forecast") -> FieldScores:
    """Every score of one forecast field against ``ctx`` (:class:`FieldContext`): our table's metrics, the
    per-initialisation terms, the WB2 terms, the Brier scores, reliability and PIT, and the zonal spectrum.
    A forecast missing values where the truth has them is refused (ValueError naming ``where``, the field and
    the count) unless ``allow_missing``: then those initialisations are left out of every score (NaN per init)
    and counted in ``n_missing``."""
    own_leads = ds["prediction_timedelta"].values.astype("timedelta64[ns]")
    relative_to = relative_to_threshold(ds, f[0])
    # non-index coordinates (valid_time, realization labels, ...) play no part and may be chunked differently
    ds = ds.drop_vars([c for c in ds.coords if c not in ds.dims])
    ds = ds.sel(time=inits).reindex(prediction_timedelta=leads)  # a lead it lacks: NaN scores
    point, sigma = _point_and_sigma(ds, kind, f)
    point, sigma = _read_once(point), _read_once(sigma)
    truth, n_missing = _complete(point, ctx.truth, own_leads, leads, f, allow_missing, where)
    out = calibration_scores(point, kind, ctx, truth, sigma, relative_to)
    if kind == "probability":  # probabilities of events: the Brier score and reliability are its scores
        return FieldScores(out, n_missing)
    # one engine: each per-initialisation term computed once, our table's and WB2's files' (the same arrays)
    terms = field_terms(point, kind, truth, ctx.weights, sigma, ctx.clim_mean, regions=ctx.regions,
                        thresholds=ctx.thresholds)
    out.update(table_scores(terms, per_init=True, regions=ctx.regions is not None))
    out.update({f"wb2_{k}": v for k, v in wb2.metric_terms(terms.per_init, kind).items()})
    if ctx.spectra_band is not None:
        sp_in = point if kind != "quantiles" else median_of_quantiles(point)
        out["spectrum"] = zonal_energy_spectrum(sp_in.astype(np.float64), band=ctx.spectra_band[0],
                                                mean_dims=("time", "member"), recipe=ctx.spectra_band[1])
    return FieldScores(out, n_missing)


def _truth_spectra(truths: dict[str, xr.DataArray], band: tuple[tuple[float, float], str]) -> xr.DataArray:
    spectra = [zonal_energy_spectrum(t, band=band[0], mean_dims=("time", "member"), recipe=band[1])
               for t in truths.values()]
    return xr.concat([sp.drop_vars("wavelength").expand_dims(field=[n]) for n, sp in zip(truths, spectra)], "field")


def _contexts(inp: Inputs, base: FieldContext, clim: tuple[dict, dict], events: dict[Field, np.ndarray],
              clim_prob: dict[Field, xr.DataArray]) -> dict[Field, FieldContext]:
    """One :class:`FieldContext` per field (the truth at the valid times loaded here)."""
    valid_at = xr.Dataset(coords={"time": inp.inits, "prediction_timedelta": inp.leads})
    out = {}
    for f in inp.fields:
        t = truth_at_valid_times(valid_at, _select(inp.truth, f), gaps="nan").astype(np.float64).load()
        thr = xr.DataArray(events[f], dims="threshold", coords={"threshold": events[f]}) if f in events else None
        out[f] = FieldContext(t, base.weights, base.regions, clim[0].get(f), clim[1].get(f), thr, clim_prob.get(f),
                              base.spectra_band)
    return out


def _score_all(inp: Inputs, contexts: dict[Field, FieldContext], allow_missing: bool, progress: bool,
               client: Any = None) -> tuple[list[xr.Dataset], dict]:
    """Score every (method, field): (per-pair Datasets, {(method, field name): n missing}); each pair one task
    on the cluster of ``client`` when given (:func:`smoeweather.evaluate.cluster.map_on_cluster`)."""
    from smoeweather.forecast.output import forecast_fields

    parts, missing = [], {}
    has = {m: forecast_fields(ds) for m, ds in inp.forecasts.items()}
    if client is not None:
        pairs = [(m, f) for f in contexts for m in inp.forecasts if f in has[m]]
        jobs = [(inp.forecasts[m], inp.kinds[m], f, contexts[f], inp.inits, inp.leads, allow_missing,
                 inp.paths.get(m, m)) for m, f in pairs]
        bar = progress_bar(len(jobs), "evaluate: scoring on the cluster", unit="fields", enabled=progress)
        with bar:
            scored = map_on_cluster(client, score_field, jobs, lambda: bar.update(1))
        for (m, f), fs in zip(pairs, scored):
            missing[m, field_name(f)] = fs.n_missing
            parts.append(tidy(fs, m, field_name(f)))
        return parts, missing
    bar = progress_bar(len(inp.forecasts) * len(inp.fields), "evaluate: scoring", unit="fields",
                       enabled=progress)
    with bar:
        for f, ctx in contexts.items():
            for m, ds in inp.forecasts.items():
                bar.update(1)
                if f not in has[m]:
                    continue
                fs = score_field(ds, inp.kinds[m], f, ctx, inp.inits, inp.leads, allow_missing, inp.paths.get(m, m))
                missing[m, field_name(f)] = fs.n_missing
                parts.append(tidy(fs, m, field_name(f)))
    return parts, missing


def _provenance(inp: Inputs, truth: Any, climatology: Any, clim_kind: str | None, region_list: Any,
                land_threshold: float | None, lsm_from: str | None, spectra_band: tuple | None,
                quantiles: Sequence[float], missing: dict) -> dict[str, Any]:
    from smoeweather.data.forecast_stores import code_version

    prov: dict[str, Any] = {
        "truth": describe(truth),
        "climatology": describe(climatology) if climatology is not None else None,
        "forecasts": {n: (p if is_url(p) else str(Path(p).resolve())) for n, p in inp.paths.items()},
        "checkpoint_sha256": {n: inp.forecasts[n].attrs["checkpoint_sha256"] for n in inp.paths
                              if "checkpoint_sha256" in inp.forecasts[n].attrs},
        "inits": [str(inp.inits.min()), str(inp.inits.max()), int(len(inp.inits))],
        "code_version": code_version(),
        "latitude_weights": "WeatherBench 2 cell areas between mid-latitudes, mean 1 (cos(lat)/mean cos(lat) on "
                            "grids without pole rows)",
        "rmse": "sqrt of the mean over initialisations of the area-mean squared error (sqrt after the time mean)",
    }
    if clim_kind is not None:
        prov["climatology_kind"] = ("WeatherBench 2 climatology (dayofyear, hour)" if clim_kind == "wb2" else
                                    "day-of-year climatology of the training store, 31-day window per hour")
        prov["binary_thresholds"] = f"climatological quantiles {list(map(float, quantiles))} at the valid time"
    if any(missing.values()):
        prov["incomplete_not_scored"] = {f"{m}/{f}": n for (m, f), n in missing.items() if n}
    if region_list is not None:
        prov["regions"] = describe_regions(region_list, land_threshold)
        prov["land_sea_mask"] = lsm_from
    if spectra_band is not None:
        prov["spectra_band"] = list(spectra_band[0])
        prov["spectra_recipe"] = spectra_band[1]
    return prov


def evaluate(
    forecasts: Mapping[str, Source] | Source | Sequence[Source],
    truth: Source | Sequence[Source],
    climatology: Source | None = None,
    out_dir: Source | None = None,
    references: bool = True,
    climatology_years: tuple[int, int] | None = None,
    regions: Sequence[str | Region] | str | None = None,
    land_sea_mask: Source | None = None,
    land_threshold: float | None = None,
    spectra: bool = False,
    spectra_band: tuple[float, float] = DEFAULT_BAND,
    spectra_recipe: str = "wavenumber",
    storage_options: dict[str, Any] | None = None,
    ensemble_dim: str | None = None,
    binary_quantiles: Sequence[float] = wb2.DEFAULT_QUANTILES,
    allow_missing: bool = False,
    thresholds: Mapping[str, Sequence[float]] | None = None,
    bss_reference: str | None = None,
    overwrite: bool = True,
    progress: bool = False,
    table: Mapping[str, Any] | None = None,
    plausibility_check: bool = True,
    scheduler: str | None = None,
) -> xr.Dataset:
    """Scores Dataset (vars ``rmse``, ``bias``, [``acc``, ``crps``, ...], ``per_init_<q>``, ``wb2_<metric>``,
    ``n_time``, ``n_scored``) over dims ``method``, ``field``, ``prediction_timedelta`` [, ``region``]; written
    to ``out_dir`` (scores.{nc,json,md} and WB2's evaluation files, :func:`write_scores`) if given.

    ``forecasts``: {name: path}, one path or a list (local or fsspec URLs, ``storage_options`` for fsspec; the
    ensemble dim is found by name or given as ``ensemble_dim``). ``truth``: prepared store or canonical file(s).
    ``climatology``: a training store (31-day day-of-year climatology) or a WB2 climatology zarr, for ACC, the
    climatology reference and the binary scores at its ``binary_quantiles``. ``regions``: region specs
    (:mod:`smoeweather.metrics.regions`); None: global only, without a region dim. ``allow_missing``: score the
    complete initialisations of a forecast with missing values instead of refusing it. ``thresholds``
    ({field name: values in its units}) and the ``threshold`` coordinates of probability forecasts: the events
    whose Brier score, reliability table and Brier skill score (against the climatological probability and
    ``bss_reference``, by default the first ensemble) are computed. ``progress``: a bar on a terminal, stage
    lines when piped. Site (station) forecasts and observations (site tables, read with the column options
    ``table``; CF timeSeries files; ``smoe postprocess apply`` stores on sites) are scored by
    :func:`smoeweather.evaluate.sites.evaluate_sites` (grid-only options refused). ``plausibility_check``: refuse
    gridded forecasts or truth with implausible values (:func:`pipelines.plausibility.check_plausible`).
    ``scheduler``: where the gridded scores are computed (:func:`smoeweather.evaluate.cluster.on_scheduler`:
    None for threads in this process, ``"local"`` or a dask.distributed scheduler address); the same bits on each.
    """
    from smoeweather.evaluate.sites import evaluate_sites, is_site_run

    if is_site_run(forecasts, truth):
        grid = {"--climatology": climatology, "--climatology-years": climatology_years, "--regions": regions,
                "--land-sea-mask": land_sea_mask, "--land-threshold": land_threshold, "--spectra": spectra,
                "--scheduler": scheduler}
        return evaluate_sites(forecasts, truth, out_dir, thresholds=thresholds, bss_reference=bss_reference,
                              allow_missing=allow_missing, ensemble_dim=ensemble_dim, table=table,
                              overwrite=overwrite, grid_options=grid)
    if out_dir is not None:
        from pipelines.atomic import check_output

        # before anything is computed; never into or over what it scores
        masks = [r.split("=", 1)[1] for r in ([regions] if isinstance(regions, str) else regions or [])
                 if isinstance(r, str) and "=" in r and r.endswith(".nc")]  # region mask files NAME=PATH.nc
        check_output(out_dir, overwrite, inputs=[forecasts, truth, climatology, land_sea_mask, masks])
    with on_scheduler(scheduler) as client:
        scores = _grid_scores(forecasts, truth, climatology, references=references,
                              climatology_years=climatology_years, regions=regions, land_sea_mask=land_sea_mask,
                              land_threshold=land_threshold, band=(spectra_band, spectra_recipe) if spectra else None,
                              storage_options=storage_options, ensemble_dim=ensemble_dim,
                              binary_quantiles=binary_quantiles, allow_missing=allow_missing, thresholds=thresholds,
                              bss_reference=bss_reference, progress=progress, plausibility_check=plausibility_check,
                              client=client)
    if out_dir is not None:
        write_scores(scores, out_dir, overwrite=overwrite)
    return scores


def _grid_scores(forecasts: Mapping[str, Source] | Source | Sequence[Source], truth: Source | Sequence[Source],
                 climatology: Source | None, *, references: bool, climatology_years: tuple[int, int] | None,
                 regions: Sequence[str | Region] | str | None, land_sea_mask: Source | None,
                 land_threshold: float | None, band: tuple[tuple[float, float], str] | None,
                 storage_options: dict[str, Any] | None, ensemble_dim: str | None, binary_quantiles: Sequence[float],
                 allow_missing: bool, thresholds: Mapping[str, Sequence[float]] | None, bss_reference: str | None,
                 progress: bool, plausibility_check: bool, client: Any = None) -> xr.Dataset:
    """The scores Dataset of gridded forecasts (:func:`evaluate`'s arguments; ``band``: the spectra's
    ((lat0, lat1), recipe), None without spectra); each (method, field) scored on the cluster of ``client``
    (:func:`smoeweather.evaluate.cluster.map_on_cluster`), else here."""
    inp = open_inputs(forecasts, truth, storage_options, ensemble_dim, plausibility_check)
    if inp.truth_in_file and references:
        warnings.warn(f"{inp.where_truth}: truth held inside a forecast file; no persistence/climatology "
                      "references", stacklevel=3)
        references = False
    if references:
        add_persistence(inp, truth)
    clim_means, clim_thresholds, clim_kind = climatology_inputs(climatology, inp.fields, climatology_years, inp.inits,
                                                          inp.leads, binary_quantiles, storage_options, truth=inp)
    if references and climatology is not None:
        add_climatology_reference(inp, truth, climatology, climatology_years, clim_means, clim_kind)
    weights = cell_area_weights(inp.truth["latitude"])
    rw, region_list, lsm_from = None, None, None
    if regions is not None:
        region_list, rw, lsm_from = _regions_for(regions, inp.truth, land_sea_mask, land_threshold,
                                                 inp.where_truth)
    events = event_thresholds(inp, thresholds)
    clim_prob = climatological_probabilities(climatology, events, climatology_years, inp.inits, inp.leads,
                                             clim_kind, {f[0]: units_of(inp.truth[f[0]]) for f in inp.fields})
    contexts = _contexts(inp, FieldContext(xr.DataArray(), weights, rw, spectra_band=band),
                         (clim_means, clim_thresholds), events, clim_prob)
    parts, missing = _score_all(inp, contexts, allow_missing, progress, client)
    rdims = ("region",) if rw is not None else ()
    methods, fields = list(inp.forecasts), [field_name(f) for f in inp.fields]
    scores = assemble(parts, methods, fields, rdims)
    if rw is None:
        squeezed = {k: v.squeeze("region", drop=True) for k, v in scores.data_vars.items() if "region" in v.dims}
        scores = ordered(scores.drop_vars(list(squeezed)).merge(xr.Dataset(squeezed)), rdims)
    scores = brier_skill_scores(scores, contexts, bss_reference or _default_reference(inp, events))
    scores = _finish(scores, inp, {field_name(f): c.truth for f, c in contexts.items()}, band)
    prov = _provenance(inp, truth, climatology, clim_kind, region_list, land_threshold, lsm_from, band,
                       binary_quantiles, missing)
    scores.attrs = {"provenance": json.dumps(prov)}
    from smoeweather.evaluate.files import describe_scores

    describe_scores(scores, band[0] if band is not None else DEFAULT_BAND)
    return scores


def _default_reference(inp: Inputs, events: dict) -> str | None:
    """The raw ensemble the Brier skill score is measured against by default: the first ensemble method."""
    if not events:
        return None
    return next((m for m, k in inp.kinds.items() if k == "ensemble"), None)


def _finish(scores: xr.Dataset, inp: Inputs, truths: dict[str, xr.DataArray], band: tuple | None) -> xr.Dataset:
    """Add the counts, units, ensemble sizes, kinds and the truth's spectra."""
    n_time = xr.concat([t.notnull().any(["latitude", "longitude"]).sum("time").expand_dims(field=[n])
                        for n, t in truths.items()], "field")
    scores["n_time"] = n_time.reindex(field=scores["field"].values).astype(np.int64)
    if "per_init_mse" in scores:
        pm = scores["per_init_mse"]
        scores["n_scored"] = pm.isel(region=0, drop=True).notnull().sum("time") if "region" in pm.dims else \
            pm.notnull().sum("time")
    unit_of = {field_name(f): str(inp.truth[f[0]].attrs.get("units", "")) for f in inp.fields}
    units = [unit_of[n] for n in scores["field"].values.tolist()]
    sizes = [inp.forecasts[m].sizes.get("member", 1) if inp.kinds[m] in ("ensemble", "deterministic") else 0
             for m in scores["method"].values.tolist()]
    scores = scores.assign_coords(units=("field", units), ensemble_size=("method", np.asarray(sizes, np.int64)),
                                  kind=("method", [inp.kinds[m] for m in scores["method"].values.tolist()]))
    if band is not None:
        scores["truth_spectrum"] = _truth_spectra(truths, band).reindex(field=scores["field"].values)
    return scores


__all__ = ["add_climatology_reference", "add_persistence", "assemble", "climatology_inputs", "evaluate", "headline",
           "land_sea_mask_of", "open_inputs", "open_truth_source", "score_field", "scores_json", "scores_markdown",
           "wb2_results", "write_scores", "ESTIMATORS", "PER_INIT", "HEADLINE_REGION"]
