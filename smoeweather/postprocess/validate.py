"""Training data checked where it enters a fit, by name (EMOS and DRN; gridded ensembles and sites).

Before anything is fitted, per variable: how many cases there are (every init, lead, level and grid point or
site), how many observations are missing, how many values each member misses, and how many cases are complete
(an observation and every member). A fit is refused, naming the file, variable and member, when

- a variable is not numeric, or holds infinite values (garbage, not a missing value);
- every observation is missing;
- a member has no value at all (it would make every case incomplete: remove it, never drop it silently);
- no complete case is left.

A partial gap is allowed: one line on stderr says how many cases the fit uses out of how many, and
:func:`fit_attrs` records the counts in the model file (``fit_cases`` always).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

import numpy as np
import xarray as xr

from pipelines.errors import DataError

SPACE_DIMS = ("latitude", "longitude", "site")
MEMBER = "member"


def data_counts(forecast: xr.Dataset, truth_at: xr.Dataset, where: str,
                names: Sequence[str] | None = None) -> xr.Dataset:
    """Missing/infinite/complete counts of ``forecast`` (…, member, space…) against ``truth_at`` (the same dims
    without member), lazy when the inputs are dask-backed; per variable ``n``: ``n__member_missing`` and
    ``n__member_inf`` (member,), ``n__obs_missing``, ``n__obs_inf`` () and ``n__complete`` (space…): cases with
    an observation and every member. DataError naming ``where`` (the input) and a variable that is not numeric."""
    out: dict[str, xr.DataArray] = {}
    for n in names or list(forecast.data_vars):
        x, y = forecast[n].reset_coords(drop=True), truth_at[n].reset_coords(drop=True)
        for what, da in (("forecast", x), ("observations", y)):
            if da.dtype.kind not in "fiu":
                raise DataError(f"{where}: {what} of {n!r} hold "
                                f"{da.dtype} values, not numbers; expected a numeric variable")
        dims = [d for d in x.dims if d != MEMBER]
        other = [d for d in dims if d not in SPACE_DIMS]
        out[f"{n}__member_missing"] = x.isnull().sum(dims)
        out[f"{n}__member_inf"] = np.isinf(x).sum(dims)
        out[f"{n}__obs_missing"] = y.isnull().sum()
        out[f"{n}__obs_inf"] = np.isinf(y).sum()
        out[f"{n}__complete"] = (np.isfinite(x).all(MEMBER) & np.isfinite(y)).sum(other)
    return xr.Dataset(out)


def _n_cases(forecast: xr.Dataset, n: str) -> int:
    return int(np.prod([forecast.sizes[d] for d in forecast[n].dims if d != MEMBER], dtype=np.int64))


def check_fit_data(counts: xr.Dataset, forecast: xr.Dataset, where: str, names: Sequence[str] | None = None,
                   quiet: bool = False) -> dict[str, dict[str, int]]:
    """Per variable the counts of a fit (cases, cases_total, observations_missing, forecast_values_missing,
    locations_without_cases) of computed :func:`data_counts`; DataError naming ``where`` (the input), the
    variable and the member when nothing valid is left (module doc); one note line per partial gap."""
    report = {}
    for n in names or list(forecast.data_vars):
        total = _n_cases(forecast, n)
        members = [str(m) for m in forecast[MEMBER].values]
        miss = np.asarray(counts[f"{n}__member_missing"].values, np.int64)
        inf = np.asarray(counts[f"{n}__member_inf"].values, np.int64)
        obs_missing, obs_inf = int(counts[f"{n}__obs_missing"]), int(counts[f"{n}__obs_inf"])
        if inf.any():
            bad = [m for m, k in zip(members, inf) if k]
            raise DataError(f"{where}: member(s) {bad} of {n!r} hold {int(inf.sum())} infinite value(s); expected "
                            "finite numbers, or NaN / an empty cell for a missing value")
        if obs_inf:
            raise DataError(f"{where}: the observations of {n!r} hold {obs_inf} infinite value(s); expected finite "
                            "numbers, or NaN / an empty cell for a missing value")
        if obs_missing >= total:
            raise DataError(f"{where}: every observation of {n!r} is missing ({obs_missing} of {total}); nothing "
                            "to fit on (check the observation column or --truth)")
        empty = [m for m, k in zip(members, miss) if k >= total]
        if empty:
            raise DataError(f"{where}: member(s) {empty} of {n!r} hold no value ({total} of {total} missing); a "
                            "member without data leaves no complete case: remove it from the input (for a table: "
                            "--table-members without it)")
        complete = np.asarray(counts[f"{n}__complete"].values, np.int64)
        cases = int(complete.sum())
        partial = total - obs_missing - cases  # cases with an observation but a missing member value
        if cases == 0:
            raise DataError(f"{where}: no case of {n!r} has both an observation and every member ({obs_missing} "
                            f"of {total} observations missing, {partial} more cases miss a member value); "
                            "nothing to fit on")
        empty_locations = int((complete == 0).sum())
        report[n] = {"cases": cases, "cases_total": total, "observations_missing": obs_missing,
                     "forecast_values_missing": int(miss.sum()), "locations_without_cases": empty_locations}
        if cases < total and not quiet:
            where_empty = (f", {empty_locations} of {complete.size} locations without any complete case"
                           if empty_locations else "")
            print(f"note: {where}: {n}: fitting on {cases} of {total} cases ({obs_missing} observations missing, "
                  f"{partial} more with a missing member value{where_empty}); the model file records the counts",
                  file=sys.stderr, flush=True)
    return report


def fit_attrs(report: dict[str, dict[str, int]]) -> dict[str, Any]:
    """Model-file attributes of a :func:`check_fit_data` report: ``fit_cases`` (all variables), and per variable
    ``<n>_fit_cases``, ``<n>_cases_total``, ``<n>_observations_missing``, ``<n>_forecast_values_missing``."""
    attrs: dict[str, Any] = {"fit_cases": int(sum(r["cases"] for r in report.values()))}
    for n, r in report.items():
        attrs.update({f"{n}_fit_cases": r["cases"], f"{n}_cases_total": r["cases_total"],
                      f"{n}_observations_missing": r["observations_missing"],
                      f"{n}_forecast_values_missing": r["forecast_values_missing"]})
    return attrs


def check_fitted_groups(params_attrs: dict[str, Any], where: str) -> None:
    """DataError when every EMOS fit was left without enough complete cases (all coefficients NaN); a note when
    some were (per site, grid point or window date: their coefficients are NaN and apply gives NaN there)."""
    groups, empty = int(params_attrs.get("groups", 0)), int(params_attrs.get("groups_without_data", 0))
    if groups and empty >= groups:
        raise DataError(f"{where}: none of the {groups} EMOS fit(s) has enough complete cases (too many missing "
                        "observations or member values per site / grid point / window); nothing was written")
    if empty:
        print(f"note: {where}: {empty} of {groups} EMOS fit(s) lack enough complete cases and have no "
              "coefficients (NaN); apply gives NaN there", file=sys.stderr, flush=True)
