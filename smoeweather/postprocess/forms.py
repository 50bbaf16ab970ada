"""Operational output forms of a post-processed forecast, the forms IMPROVER and the Iris/CF tools read, each
computed from the predictive distribution's own CDF and quantile function (:class:`.distributions.Distribution`),
in IMPROVER's names in every file ``smoe postprocess apply`` writes (:func:`cf_decorate`, zarr and netCDF alike):

- probabilities of exceeding (``--thresholds``; ``--below``: of not exceeding) thresholds:
  ``probability_of_<X>_above_threshold`` (``_below_threshold``; X the field's standard name, or its name where
  it has none; units 1) on a ``threshold`` coordinate in the variable's units whose standard_name is X (a
  threshold given with units, ``-5degC``, converted) and whose ``spp__relative_to_threshold`` is
  ``greater_than`` or ``less_than`` (IMPROVER's values); one field per file, its store name in the attribute
  :data:`~smoeweather.data.forecast_stores.FIELD_ATTR` (:func:`smoeweather.data.forecast_stores.store_names` reads it
  back);
- percentiles (``--percentiles``): ``<name>`` with the field's standard_name on a ``percentile`` coordinate on
  0–100 (units ``%``);
- realizations (``--members``, ECC-Q, :mod:`.ecc`): a ``realization`` dim (int32, standard_name realization).

Every store gets CF metadata (:func:`cf_decorate`): the field's standard_name on every variable that is the
field (the file's, else :data:`pipelines.canonical.VARIABLES`'); the validity time ``valid_time`` (standard_name
``time``, init + lead) beside ``time`` (standard_name ``forecast_reference_time``, the store convention's init
dim) and ``prediction_timedelta`` (``forecast_period``); the mean ``<name>`` and standard deviation
``<name>_std`` of a normal have ``cell_methods`` ``realization: mean`` / ``realization: standard_deviation`` and
σ no standard_name (CF has none for a standard deviation; ``air_temperature`` it is not). Site stores keep
their station ids and coordinates in every form. A netCDF output is in IMPROVER's layout
(:func:`cf_netcdf_dataset`: ``time`` = validity, ``forecast_reference_time``, ``forecast_period``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import xarray as xr

from pipelines.atomic import string_char_encoding
from pipelines.canonical import VARIABLES
from smoeweather.data.forecast_stores import FIELD_ATTR, STD_SUFFIX, probability_name
from smoeweather.io import atomic_path
from smoeweather.postprocess.distributions import Distribution, family
from smoeweather.units import Quantity, parse, parse_quantity, units_of, values_in

ABOVE, BELOW = "greater_than", "less_than"


@dataclass(frozen=True)
class OutputForms:
    """The forms asked for besides μ/σ: ``thresholds`` (:func:`parse_thresholds`; None: no probabilities),
    ``below`` (non-exceedance), ``percentiles`` (0–100; None: none) and where each goes."""

    thresholds: dict[str | None, np.ndarray] | None = None
    below: bool = False
    thresholds_out: Path | None = None
    percentiles: np.ndarray | None = None
    percentiles_out: Path | None = None


def _numbers(text: str, token: str) -> list[Quantity]:
    """The comma-separated numbers of ``text``, each optionally with its units (``-5degC``)."""
    hint = ("expected numbers in the variable's units or with their own (-5degC), e.g. --thresholds 265 275, or "
            "per variable --thresholds temperature=265,275 geopotential=54000")
    parts = [x for x in text.split(",") if x.strip()]
    if not parts:
        raise ValueError(f"--thresholds {token!r}: {hint}")
    try:
        return [parse_quantity(x, "--thresholds") for x in parts]
    except ValueError as err:
        raise ValueError(f"--thresholds {token!r}: {hint} ({err})") from None


def _values(quantities: list[Quantity]) -> np.ndarray | tuple[Quantity, ...]:
    """Plain numbers as a sorted unique array (in the variable's units); any with units kept as given, converted
    to the variable's units once those are known (:func:`thresholds_for`)."""
    if all(q.units is None for q in quantities):
        return np.unique(np.asarray([q.value for q in quantities], np.float64))
    return tuple(quantities)


def parse_thresholds(tokens: Sequence[str]) -> dict[str | None, np.ndarray | tuple[Quantity, ...]]:
    """``--thresholds`` tokens → {variable: sorted thresholds}; the key None when they are given for every
    variable (``265 275`` or ``265,275``). A value with units (``-5degC``) is kept as a
    :class:`~smoeweather.units.Quantity` until the variable's units are known. ValueError naming the option for
    bad numbers or mixed forms."""
    bare: list[Quantity] = []
    named: dict[str | None, np.ndarray | tuple[Quantity, ...]] = {}
    for t in tokens:
        if "=" in t:
            name, vals = t.split("=", 1)
            if not name or name in named:
                raise ValueError(f"--thresholds {t!r}: expected VARIABLE=T1,T2 with each variable once")
            named[name] = _values(_numbers(vals, t))
        else:
            bare.extend(_numbers(t, t))
    if bare and named:
        raise ValueError(f"--thresholds {' '.join(tokens)}: give thresholds either for every variable (265 275) "
                         "or per variable (temperature=265,275 geopotential=54000), not both")
    return named if named else {None: _values(bare)}


def thresholds_for(spec: dict[str | None, np.ndarray | tuple[Quantity, ...]], variables: Sequence[str],
                   units: dict[str, str] | None = None) -> dict[str, np.ndarray]:
    """{variable: thresholds in its units} of ``spec`` for the forecast's ``variables`` (``units``: {variable:
    units}, to convert thresholds given with units; refused naming both where they do not convert); ValueError
    when bare thresholds meet several variables or a named variable is not in the forecast."""
    if None in spec:
        if len(variables) > 1:
            raise ValueError(f"--thresholds: the forecast has several variables {list(variables)}; give the "
                             "thresholds per variable, e.g. --thresholds " + " ".join(f"{v}=T1,T2" for v in variables))
        spec = {variables[0]: spec[None]}
    unknown = [k for k in spec if k not in variables]
    if unknown:
        raise ValueError(f"--thresholds: no variable(s) {unknown} in the forecast; it has {list(variables)}")
    units = units or {}
    return {str(k): v if isinstance(v, np.ndarray) else
            values_in(v, units.get(str(k), ""), str(k), "--thresholds", "the calibrated forecast")
            for k, v in spec.items()}


def check_percentiles(values: Sequence[float]) -> np.ndarray:
    """Sorted unique percentiles strictly between 0 and 100; ValueError naming the option otherwise."""
    p = np.unique(np.asarray(values, np.float64))
    if len(p) == 0 or not np.isfinite(p).all() or (p <= 0).any() or (p >= 100).any():
        raise ValueError("--percentiles must be numbers strictly between 0 and 100 (e.g. 10 50 90), "
                         f"got {list(values)}")
    return p


def _evaluate(distribution: str, method: str, mu: xr.DataArray, sigma: xr.DataArray, points: xr.DataArray
              ) -> xr.DataArray:
    """``family(distribution, μ, σ).<method>(points)`` element-wise, ``points``' dim appended (lazy on dask)."""
    def block(m: np.ndarray, s: np.ndarray, p: np.ndarray) -> np.ndarray:
        return getattr(family(distribution, m, s), method)(p)

    return xr.apply_ufunc(block, mu, sigma.transpose(*mu.dims), points, dask="parallelized",
                          output_dtypes=[np.float64])


def _ordered(da: xr.DataArray, dim: str) -> xr.DataArray:
    order = [d for d in ("time", "prediction_timedelta", dim) if d in da.dims]
    return da.transpose(*order, ...)


def probability_dataset(mu: xr.Dataset, sigma: xr.Dataset, distribution: str, thresholds: np.ndarray,
                        below: bool = False) -> xr.Dataset:
    """P(Y > t) (``below``: P(Y ≤ t)) of every variable of ``mu`` at ``thresholds`` (its units): ``<name>``
    (time, prediction_timedelta, threshold, ...), units 1, long_name IMPROVER's name of it
    (:func:`~smoeweather.data.forecast_stores.probability_name`); a file names it so (:func:`cf_decorate`)."""
    relative = BELOW if below else ABOVE
    out = xr.Dataset()
    for n in mu.data_vars:
        attrs = mu[n].attrs
        thr = xr.DataArray(np.asarray(thresholds, np.float64), dims="threshold")
        p = _evaluate(distribution, "cdf", mu[n], sigma[n], thr)
        p = p if below else 1.0 - p
        out[n] = _ordered(p, "threshold").assign_attrs(
            units="1", long_name=probability_name(str(n), attrs.get("standard_name"), below),
            spp__relative_to_threshold=relative)
        out = out.assign_coords(threshold=("threshold", np.asarray(thresholds, np.float64), {
            "units": attrs.get("units", ""), "spp__relative_to_threshold": relative,
            **({"standard_name": attrs["standard_name"]} if "standard_name" in attrs else {"long_name": str(n)})}))
    return out


def percentile_dataset(mu: xr.Dataset, sigma: xr.Dataset, distribution: str, percentiles: np.ndarray) -> xr.Dataset:
    """Percentiles (the distribution's ppf at p/100) of every variable of ``mu``: ``<name>`` (time,
    prediction_timedelta, percentile, ...) in the field's units; ``percentile`` on 0–100."""
    pct = np.asarray(percentiles, np.float64)
    out = xr.Dataset()
    for n in mu.data_vars:
        q = xr.DataArray(pct / 100.0, dims="percentile")
        out[n] = _ordered(_evaluate(distribution, "ppf", mu[n], sigma[n], q), "percentile").assign_attrs(
            mu[n].attrs)
    return out.assign_coords(percentile=("percentile", pct, {"units": "%", "long_name": "percentile"}))


def _sibling(path: Path, name: str) -> Path:
    return path.with_name(f"{path.stem}_{name}{path.suffix or '.zarr'}")


def form_products(mu: xr.Dataset, sigma: xr.Dataset, distribution: str, attrs: dict[str, Any], forms: OutputForms
                  ) -> list[tuple[xr.Dataset, Path, str, dict[str, Any]]]:
    """The probability and percentile stores of ``forms``: (Dataset, path, forecast_kind, attrs). The
    probabilities of several variables go to one store each (``<thresholds_out>_<variable>``): a threshold
    coordinate names one field."""
    products: list[tuple[xr.Dataset, Path, str, dict[str, Any]]] = []
    if forms.thresholds is not None and forms.thresholds_out is not None:
        per_var = thresholds_for(forms.thresholds, [str(n) for n in mu.data_vars],
                                 {str(n): units_of(mu[n]) for n in mu.data_vars})
        groups: dict[tuple[float, ...], list[str]] = {}
        for v, t in per_var.items():  # one field per file: its threshold coordinate names it (IMPROVER)
            groups.setdefault((v, *t), []).append(v)
        for (_, *t), names in groups.items():
            path = forms.thresholds_out if len(groups) == 1 else _sibling(forms.thresholds_out, names[0])
            ds = probability_dataset(mu[names], sigma[names], distribution, np.asarray(t), forms.below)
            products.append((ds, path, "probability", {**attrs, "method": f"{attrs['method']}_probabilities"}))
    if forms.percentiles is not None and forms.percentiles_out is not None:
        ds = percentile_dataset(mu, sigma, distribution, forms.percentiles)
        products.append((ds, forms.percentiles_out, "quantiles", {**attrs, "method": f"{attrs['method']}_percentiles"}))
    return products


OUTPUT_SUFFIXES = (".nc", ".zarr")
"""What an output of ``smoe postprocess apply`` is: a CF netCDF file (``.nc``, IMPROVER's layout,
:func:`cf_netcdf_dataset`) or a zarr store (``.zarr``)."""


@dataclass(frozen=True)
class Outputs:
    """The stores an apply writes: the (μ, σ) store ``out``; ``members`` ECC-Q members to ``members_out``, the
    quantiles ``levels`` to ``quantiles_out``, the probabilities and percentiles of ``forms``
    (:class:`OutputForms`), where given."""

    out: Path
    members_out: Path | None = None
    members: int | None = None
    quantiles_out: Path | None = None
    levels: np.ndarray | None = None
    forms: OutputForms | None = None

    def check(self, overwrite: bool, inputs: Sequence[Any] = ()) -> Outputs:
        """``self``; ValueError naming the option when an output ends in neither ``.nc`` nor ``.zarr``
        (:data:`OUTPUT_SUFFIXES`) or two outputs are one path, and :func:`smoeweather.io.check_output` of each
        (exists without ``overwrite``, under a file, read-only folder, is/contains/lies inside one of ``inputs``),
        before anything is computed."""
        from smoeweather.io import check_output

        forms = self.forms
        named = {"--out": self.out, "--members-out": self.members_out, "--quantiles-out": self.quantiles_out,
                 "--thresholds-out": getattr(forms, "thresholds_out", None),
                 "--percentiles-out": getattr(forms, "percentiles_out", None)}
        for option, p in named.items():
            if p is not None and Path(p).suffix not in OUTPUT_SUFFIXES:
                raise ValueError(f"{option} {p}: expected a path ending in .nc (a CF netCDF file) or .zarr (a zarr "
                                 f"store), e.g. {option} {Path(p).with_suffix('.zarr')}")
        outs = [p for p in named.values() if p is not None]
        if len({Path(p).resolve() for p in outs}) < len(outs):
            raise ValueError(f"outputs must be distinct paths, got {[str(p) for p in outs]}")
        for p in outs:  # checked again when each is written
            check_output(Path(p), overwrite, inputs=inputs)
        return self


@dataclass(frozen=True)
class Predictive:
    """A predictive distribution forecast: ``family`` (:data:`.distributions.DISTRIBUTIONS`) with location
    ``mu`` and scale ``sigma`` (Datasets, one variable per field, in the field's units), and ``attrs``: how it
    was made (``method``, the model, ...; the attributes of every store written from it). Every output form of
    a post-processed forecast is computed from it, here: :meth:`probabilities`, :meth:`percentiles`,
    :meth:`quantiles`, :meth:`members` and all at once :meth:`stores`."""

    family: str
    mu: xr.Dataset
    sigma: xr.Dataset
    attrs: dict[str, Any] = dataclasses.field(default_factory=dict)

    def distribution(self, name: str) -> Distribution:
        """The :class:`~.distributions.Distribution` of field ``name`` (numpy arrays of its dims)."""
        return family(self.family, self.mu[name].values, self.sigma[name].transpose(*self.mu[name].dims).values)

    def probabilities(self, thresholds: Mapping[str, Sequence[float]], below: bool = False) -> dict[str, xr.Dataset]:
        """{field: P(Y > t) (``below``: P(Y ≤ t)) on a ``threshold`` dim} for the fields of ``thresholds``."""
        return {n: probability_dataset(self.mu[[n]], self.sigma[[n]], self.family, np.asarray(t, np.float64), below)
                for n, t in thresholds.items()}

    def percentiles(self, percentiles: Sequence[float]) -> xr.Dataset:
        """Percentiles (0–100) of every field on a ``percentile`` dim."""
        return percentile_dataset(self.mu, self.sigma, self.family, np.asarray(percentiles, np.float64))

    def quantiles(self, levels: Sequence[float]) -> xr.Dataset:
        """Predictive quantiles at the probability ``levels`` of every field on a ``quantile`` dim
        (:func:`.ecc.gaussian_quantiles`)."""
        from smoeweather.postprocess.ecc import gaussian_quantiles

        return gaussian_quantiles(self.mu, self.sigma, levels, distribution=self.family)

    def members(self, raw: xr.Dataset, n: int | None = None) -> xr.Dataset:
        """ECC-Q members (:func:`.ecc.ecc_members`): ``n`` (default: the raw member count) calibrated members
        in the rank order of the raw ensemble ``raw``, at exactly this forecast's points."""
        from smoeweather.postprocess.ecc import ecc_members

        raw = raw[list(self.mu.data_vars)]
        # a network may calibrate fewer levels or leads (or inits) than the raw ensemble holds: ECC-Q reorders
        # the raw members at exactly the forecast's points
        mu = self.mu
        fewer = {d: mu[d].values for d in mu.dims if d in raw.dims and d in mu.coords and raw.sizes[d] != mu.sizes[d]}
        raw = raw.sel(fewer) if fewer else raw
        return ecc_members(mu, self.sigma, raw, int(raw.sizes["member"]) if n is None else n,
                           distribution=self.family)

    def stores(self, raw: xr.Dataset, outputs: Outputs) -> list[tuple[xr.Dataset, Path, str, dict[str, Any]]]:
        """The (Dataset, path, forecast_kind, attrs) of every store of ``outputs`` (``raw``: the raw ensemble),
        each with CF metadata in IMPROVER's names (:func:`cf_decorate`, the raw fields' standard names).

        For the truncated normal the (μ, σ) store holds the location and scale of the normal before truncation
        (attribute ``predictive_distribution`` says so; a Gaussian scorer would misread it); its members and
        quantiles are the truncated distribution's, and ``smoe evaluate`` scores those correctly."""
        from smoeweather.data.forecast_stores import gaussian_dataset
        from smoeweather.postprocess.distributions import LONG_NAMES

        o, dist = outputs, self.family
        attrs = {**self.attrs, "distribution": dist, "predictive_distribution": LONG_NAMES[dist]}
        products = [(gaussian_dataset(self.mu, self.sigma), Path(o.out), "gaussian", attrs)]
        if o.members_out is not None:
            ecc = {**attrs, "method": f"{attrs['method']}_ecc", "ecc": "ECC-Q, levels (i-0.5)/N, stable ranks"}
            products.append((self.members(raw, o.members), Path(o.members_out), "ensemble", ecc))
        if o.quantiles_out is not None:
            products.append((self.quantiles(o.levels), Path(o.quantiles_out), "quantiles",  # type: ignore[arg-type]
                             {**attrs, "method": f"{attrs['method']}_quantiles"}))
        if o.forms is not None:
            products.extend(form_products(self.mu, self.sigma, dist, attrs, o.forms))
        fields = field_metadata(raw, [str(n) for n in self.mu.data_vars])
        return [(cf_decorate(ds, dist, fields), path, kind, a) for ds, path, kind, a in products]


def _same_quantity(units: str, canonical: str | None) -> bool:
    """Whether ``units`` (non-empty) measure the quantity of ``canonical`` (its dimensionality)."""
    if not units or not canonical:
        return False
    try:
        return bool(parse(units, "units").dimensionality == parse(canonical, "units").dimensionality)
    except ValueError:
        return False


def field_metadata(forecast: xr.Dataset, names: Sequence[str]) -> dict[str, dict[str, str]]:
    """{field: its ``units``, ``long_name`` and ``standard_name``} of the variables ``names`` of ``forecast``:
    the file's attributes, else :data:`pipelines.canonical.VARIABLES`' long name, and its standard name where
    CF has one and the field's units measure that quantity (a field without units gets none)."""
    out: dict[str, dict[str, str]] = {}
    for n in names:
        attrs = forecast[n].attrs if n in forecast.data_vars else {}
        units, long_name, standard = VARIABLES.get(str(n), (None, None, None))
        meta = {"units": units_of(attrs), "long_name": str(attrs.get("long_name") or long_name or n)}
        if attrs.get("standard_name"):
            meta["standard_name"] = str(attrs["standard_name"])
        elif standard and _same_quantity(meta["units"], units):
            meta["standard_name"] = standard
        out[str(n)] = meta
    return out


def _roles(ds: xr.Dataset) -> dict[str, tuple[str, str]]:
    """{variable: (its field, role)}: ``sigma`` for the ``<field>_std`` of a (μ, σ) pair, ``mu`` for its
    ``<field>``, ``probability`` on a threshold dim, else ``field`` (members, percentiles, quantiles)."""
    names = {str(n) for n in ds.data_vars}
    out: dict[str, tuple[str, str]] = {}
    for n in names:
        if "threshold" in ds[n].dims:
            out[n] = (str(ds[n].attrs.get(FIELD_ATTR, n)), "probability")
        elif n.endswith(STD_SUFFIX) and n[: -len(STD_SUFFIX)] in names:
            out[n] = (n[: -len(STD_SUFFIX)], "sigma")
        else:
            out[n] = (n, "mu" if f"{n}{STD_SUFFIX}" in names else "field")
    return out


def _variable_attrs(attrs: dict[str, Any], field: str, role: str, meta: dict[str, str], distribution: str
                    ) -> dict[str, Any]:
    """CF attributes of a (non-probability) variable of ``field`` in ``role`` (:func:`_roles`): the field's
    standard_name where the values are the field's (not on σ, nor on the truncated normal's parameters)."""
    keep = {k: v for k, v in attrs.items() if k not in ("standard_name", "long_name", "cell_methods")}
    keep["units"] = attrs.get("units") or meta.get("units", "")
    long_name, standard = meta.get("long_name", field), meta.get("standard_name")
    if role in ("mu", "sigma") and distribution == "truncnormal":
        what = "scale" if role == "sigma" else "location"
        return {**keep, "long_name": f"{field} {what} parameter of the normal truncated at 0 (before truncation)"}
    if role == "sigma":
        return {**keep, "long_name": f"{long_name} predictive standard deviation",
                "cell_methods": "realization: standard_deviation"}
    named = {**keep, **({"standard_name": standard} if standard else {})}
    if role == "mu":
        return {**named, "long_name": f"{long_name} predictive mean", "cell_methods": "realization: mean"}
    return {**named, "long_name": long_name}


def _probability_names(ds: xr.Dataset, n: str, field: str, meta: dict[str, str]) -> xr.Dataset:
    """``ds`` with the probabilities ``n`` of ``field`` in IMPROVER's names (module doc)."""
    coord = ds["threshold"].attrs
    relative = str(ds[n].attrs.get("spp__relative_to_threshold") or coord.get("spp__relative_to_threshold") or ABOVE)
    standard = meta.get("standard_name") or coord.get("standard_name")
    name = probability_name(field, standard, relative.startswith("less"))
    attrs = {k: v for k, v in ds[n].attrs.items() if k not in ("standard_name", "spp__relative_to_threshold")}
    ds[n].attrs = {**attrs, "long_name": name, "units": "1", FIELD_ATTR: field}
    ds["threshold"].attrs = {"units": coord.get("units") or meta.get("units", ""),
                             **({"standard_name": standard} if standard else {"long_name": field}),
                             "spp__relative_to_threshold": relative}
    return ds.rename({n: name}) if name != n else ds


def cf_decorate(ds: xr.Dataset, distribution: str = "normal", fields: dict[str, dict[str, str]] | None = None
                ) -> xr.Dataset:
    """CF metadata and IMPROVER's names of a post-processed store (module doc): validity time, the
    ``realization`` dim, probabilities named ``probability_of_<X>_above_threshold``, standard names and cell
    methods. ``fields``: {field: units, long_name, standard_name} of the raw forecast (:func:`field_metadata`;
    default: the store's own attributes)."""
    ds = ds.copy()
    if "time" in ds.dims and "prediction_timedelta" in ds.dims:
        valid = ds["time"].values[:, None] + ds["prediction_timedelta"].values[None, :]
        ds = ds.assign_coords(valid_time=(("time", "prediction_timedelta"), valid.astype("datetime64[ns]"),
                                          {"standard_name": "time", "long_name": "validity time"}))
    if "member" in ds.dims:  # IMPROVER's realization dim, int32 from 0
        ds = ds.drop_vars(["member", "realization"], errors="ignore").rename(member="realization")
        ds = ds.assign_coords(realization=("realization", np.arange(ds.sizes["realization"], dtype=np.int32),
                                           {"units": "1", "standard_name": "realization"}))
    for c, long_name in (("site", "station index"), ("station_id", "station identifier")):
        if c in ds.coords and "long_name" not in ds[c].attrs:
            ds[c].attrs = {**ds[c].attrs, "long_name": long_name}
    roles = _roles(ds)
    fields = {**field_metadata(ds, sorted({f for f, r in roles.values() if r != "probability"})), **(fields or {})}
    for n, (field, role) in sorted(roles.items()):
        meta = fields.get(field, {})
        if role == "probability":
            ds = _probability_names(ds, n, field, meta)
        else:
            ds[n].attrs = _variable_attrs(ds[n].attrs, field, role, meta, distribution)
    return ds


CF_NAMES = {"time": "forecast_reference_time", "prediction_timedelta": "forecast_period", "valid_time": "time"}
"""Store names → the CF/IMPROVER names of the netCDF export: the init dim is ``forecast_reference_time``, the
lead ``forecast_period`` and the validity time ``time``."""


def cf_netcdf_dataset(ds: xr.Dataset) -> tuple[xr.Dataset, dict[str, dict[str, Any]]]:
    """(Dataset, encoding) of a post-processed store in IMPROVER's CF layout (:data:`CF_NAMES`, members on a
    ``realization`` dim): times as int32
    minutes since 1970 and the lead in minutes (CF-1.8 has no int64), integer coordinates int32, no fill value
    on coordinates; a title and a history."""
    ds = cf_decorate(ds) if "valid_time" not in ds.coords and "time" in ds.dims else ds
    ds = ds.copy()
    for v in ds.variables.values():  # the store's codecs and stale ``coordinates`` lists
        v.encoding = {}
        v.attrs.pop("coordinates", None)
    ds = ds.rename({k: v for k, v in CF_NAMES.items() if k in ds.variables})
    if "member" in ds.dims:  # IMPROVER's realization dim
        ds = ds.drop_vars("realization", errors="ignore").rename(member="realization")
        ds["realization"].attrs = {"standard_name": "realization", "units": "1"}
    enc: dict[str, dict[str, Any]] = {}
    for name, var in ds.variables.items():
        if np.issubdtype(var.dtype, np.datetime64):
            enc[str(name)] = {"dtype": "int32", "units": "minutes since 1970-01-01 00:00:00", "_FillValue": None}
        elif np.issubdtype(var.dtype, np.timedelta64):
            enc[str(name)] = {"dtype": "int32", "units": "minutes", "_FillValue": None}
        elif np.issubdtype(var.dtype, np.integer):
            enc[str(name)] = {"dtype": "int32", "_FillValue": None}
        elif name in ds.coords and np.issubdtype(var.dtype, np.floating):
            enc[str(name)] = {"_FillValue": None}
    kind, method = ds.attrs.get("forecast_kind", "forecast"), ds.attrs.get("method", "")
    history = f"{ds.attrs.get('created_utc', '')} smoe postprocess apply ({method})".strip()
    ds.attrs = {"title": f"smoeweather post-processed {kind} forecast ({method})", "history": history, **ds.attrs}
    return ds, enc


def to_cf_netcdf(store: Path, path: Path) -> Path:
    """Write the post-processed zarr ``store`` to ``path`` as CF netCDF in IMPROVER's layout
    (:func:`cf_netcdf_dataset`), streamed chunk by chunk on local threads; strings as char arrays. Not atomic:
    ``path`` is a staging path (:func:`write_cf_netcdf`)."""
    import dask

    with xr.open_zarr(store) as src:
        ds, enc = cf_netcdf_dataset(src)
        for name, e in string_char_encoding(ds).items():
            enc[name] = {**e, **enc.get(name, {})}
        with dask.config.set(scheduler="threads"):  # the file is written here, never by remote workers
            ds.to_netcdf(path, encoding=enc)
    return path


def write_cf_netcdf(store: Path, out: Path, overwrite: bool = False) -> Path:
    """The post-processed zarr ``store`` as a CF netCDF file ``out`` (:func:`to_cf_netcdf`), atomically."""
    with atomic_path(out, overwrite=overwrite) as tmp:
        to_cf_netcdf(store, tmp)
    return Path(out)


__all__ = ["ABOVE", "BELOW", "CF_NAMES", "OutputForms", "cf_decorate", "cf_netcdf_dataset", "check_percentiles",
           "field_metadata", "form_products", "parse_thresholds", "percentile_dataset", "probability_dataset",
           "thresholds_for", "to_cf_netcdf", "write_cf_netcdf"]
