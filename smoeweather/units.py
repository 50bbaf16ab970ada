"""Units of every field, one mechanism for every command: read, parsed, compared and converted.

A field's units come from its file's ``units`` attribute, from ``--units`` (site tables, which carry none) or from
a model file (the units it was fitted in). They are parsed with pint and cf-xarray's CF unit registry
(:data:`REGISTRY`), so CF spellings (``K``, ``degC``, ``degree_Celsius``, ``m**2 s**-2``, ``m2 s-2``, ``hPa``,
``1``, ``(0 - 1)``) are understood, and two fields are compared (:func:`conversion`):

- the same unit (however spelled): nothing to do;
- convertible units (K and degC, Pa and hPa, m s-1 and km h-1, ...): converted exactly (pint's factor and
  offset), with a one-line note (:class:`UnitsConverted`, a warning the CLI prints as one line);
- a height in m and a geopotential in m² s⁻², only for a geopotential variable: × g = 9.80665 m s⁻²;
- anything else (incompatible, unknown spelling, one side without units): ValueError naming both units and both
  sources, and how to fix it.

Values are converted as values (affine: x·scale + offset), spreads as spreads (σ·|scale|: an offset does not
move a standard deviation). Numbers given on the command line (``--thresholds``) may carry their own units
(``-5degC``, :func:`parse_quantity`); a plain number is in the field's units.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pint
import xarray as xr
from cf_xarray.units import units as REGISTRY

G = 9.80665
"""Standard gravity (m s⁻²): a geopotential (m² s⁻²) is g times the geopotential height (m)."""

_ALIASES = {"(0 - 1)": "1", "0-1": "1", "fraction": "1", "none": "1", "dimensionless": "1"}
_NUMBER = re.compile(r"^\s*([+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)\s*(.*?)\s*$")


class UnitsConverted(UserWarning):
    """A field was converted from one unit to another (the one-line note of every conversion)."""


def units_of(da: xr.DataArray | Mapping[str, Any]) -> str:
    """The ``units`` attribute of a DataArray (or of an attrs mapping) as a stripped string; "" when absent."""
    attrs = da.attrs if isinstance(da, xr.DataArray) else da
    return str(attrs.get("units", "") or "").strip()


def parse(text: str, where: str) -> pint.Unit:
    """The pint unit of the CF spelling ``text`` (``(0 - 1)`` and ``fraction`` are ``1``); ValueError naming
    ``where`` (the file and variable, or the option) for a spelling pint and CF do not know."""
    spelled = _ALIASES.get(text.strip().lower(), text.strip())
    try:
        return REGISTRY.Unit(spelled)
    except (pint.errors.PintError, ValueError, TypeError, AttributeError, AssertionError) as err:
        raise ValueError(f"{where}: unknown units {text!r} ({type(err).__name__}); use a CF/UDUNITS spelling "
                         "such as K, degC, m**2 s**-2, hPa or 1") from None


def is_geopotential(variable: str) -> bool:
    """Whether ``variable`` names a geopotential (``geopotential``, ``z``, ``geopotential_500``, ``z500``)."""
    v = variable.lower()
    return v.startswith("geopotential") or re.fullmatch(r"z\d*", v) is not None


@dataclass(frozen=True)
class Conversion:
    """x in ``source`` → x·scale + offset in ``target``; a spread (σ) → σ·|scale|."""

    source: str
    target: str
    scale: float
    offset: float

    def value(self, x: Any) -> Any:
        """Values (numpy, dask or xarray) in the target units; exact identity where scale 1 and offset 0."""
        y = x * self.scale if self.scale != 1.0 else x
        return y + self.offset if self.offset != 0.0 else y

    def spread(self, x: Any) -> Any:
        """A standard deviation or other difference of values in the target units (no offset)."""
        return x * abs(self.scale) if abs(self.scale) != 1.0 else x


def conversion(variable: str, have: str, have_where: str, want: str, want_where: str) -> Conversion | None:
    """How to convert ``variable`` from ``have`` (units of ``have_where``: a file, an option, a model) to ``want``
    (of ``want_where``): None when nothing is to be done (the same units, or neither side has any); ValueError
    naming both units and both sources for one side without units, unknown or incompatible units."""
    if have == want:
        return None
    if not have or not want:
        lacking, other = (have_where, f"{want!r} in {want_where}") if not have else (
            want_where, f"{have!r} in {have_where}")
        raise ValueError(f"{variable!r}: {lacking} has no units, {other} has; add the `units` attribute to the "
                         f"file's {variable!r} (or pass --units for a site table) so the two can be compared")
    src, dst = parse(have, f"{have_where} ({variable!r})"), parse(want, f"{want_where} ({variable!r})")
    if src == dst:
        return None
    try:
        offset = float(REGISTRY.Quantity(0.0, src).to(dst).magnitude)
        scale = float(REGISTRY.Quantity(1.0, src).to(dst).magnitude) - offset
        if offset != 0.0:  # an offset unit (degC): its scale from the delta units, exact (1 for K/degC)
            scale = float(REGISTRY.get_root_units(src)[0] / REGISTRY.get_root_units(dst)[0])
        return Conversion(have, want, scale, offset)
    except pint.errors.DimensionalityError:
        pass
    height, geo = REGISTRY.Unit("m"), REGISTRY.Unit("m**2 s**-2")
    if is_geopotential(variable) and {src.dimensionality, dst.dimensionality} == {height.dimensionality,
                                                                                   geo.dimensionality}:
        if src.dimensionality == height.dimensionality:  # a height → a geopotential: × g
            scale = _factor(src, height) * G * _factor(geo, dst)
        else:
            scale = _factor(src, geo) / G * _factor(height, dst)
        return Conversion(have, want, scale, 0.0)
    raise ValueError(f"{variable!r}: units {have!r} of {have_where} and {want!r} of {want_where} are not "
                     "convertible; give both in the same quantity (or fix the `units` attribute of the wrong one)")


def _factor(src: pint.Unit, dst: pint.Unit) -> float:
    return float(REGISTRY.Quantity(1.0, src).to(dst).magnitude)


def note(conv: Conversion, variable: str, have_where: str, want_where: str) -> None:
    """The one-line note of a conversion (a :class:`UnitsConverted` warning)."""
    how = f"x{conv.scale:+g}" if conv.offset == 0.0 else (
        f"{'' if conv.scale == 1.0 else f'{conv.scale:g}*'}x{conv.offset:+g}")
    warnings.warn(f"{variable!r} of {have_where} converted from {conv.source} to {conv.target} ({how}), the units "
                  f"of {want_where}", UnitsConverted, stacklevel=3)


def convert(da: xr.DataArray, want: str, variable: str, have_where: str, want_where: str, *,
            spread: bool = False, have: str | None = None, quiet: bool = False) -> xr.DataArray:
    """``da`` in the units ``want`` (its ``units`` attribute, or ``have``, the units it is in), converted with a
    note (:func:`conversion`; ``quiet``: without); lazy on dask; ``spread``: a standard deviation (no offset)."""
    have = units_of(da) if have is None else have
    conv = conversion(variable, have, have_where, want, want_where)
    if conv is None:
        return da
    if not quiet:
        note(conv, variable, have_where, want_where)
    out = conv.spread(da) if spread else conv.value(da)
    return out.assign_attrs({**da.attrs, "units": want})


def convert_threshold_coord(ds: xr.Dataset, want: str, variable: str, have_where: str, want_where: str
                            ) -> xr.Dataset:
    """A probability forecast ``ds`` with its ``threshold`` coordinate (in the field's units, its own ``units``
    attribute or else the variable's) in the units ``want``."""
    thr = ds["threshold"]
    what = f"{variable} threshold coordinate"
    conv = conversion(what, units_of(thr), have_where, want, want_where)
    if conv is None:
        return ds
    note(conv, what, have_where, want_where)
    values = np.asarray(conv.value(thr.values.astype(np.float64)))
    return ds.assign_coords(threshold=("threshold", values, {**thr.attrs, "units": want}))


def align_truth(truth: xr.Dataset, forecast: xr.Dataset, truth_where: str, forecast_where: str) -> xr.Dataset:
    """``truth`` with every variable the forecast has in the forecast's units (the units a model is fitted in);
    each conversion noted, a mismatch refused (:func:`conversion`)."""
    out = truth.copy()
    for v in truth.data_vars:
        if v in forecast.data_vars:
            out[v] = convert(truth[v], units_of(forecast[v]), str(v), truth_where, forecast_where)
    return out


@dataclass(frozen=True)
class Quantity:
    """A number given on the command line with its units (None: in the field's units)."""

    value: float
    units: str | None = None

    def to(self, want: str, variable: str, option: str, field_where: str) -> float:
        """The value in the field's units ``want`` (a plain number is taken as given)."""
        if self.units is None:
            return self.value
        conv = conversion(variable, self.units, option, want, field_where)
        return self.value if conv is None else float(conv.value(self.value))


def parse_quantity(token: str, option: str) -> Quantity:
    """``"265"`` → Quantity(265.0); ``"-5degC"`` → Quantity(-5.0, "degC") (units checked); ValueError naming
    ``option`` for anything that is not a finite number with optional units."""
    m = _NUMBER.match(token)
    if not m or not np.isfinite(float(m.group(1))):
        raise ValueError(f"{option} {token!r}: expected a number, optionally with units (e.g. 265 or -5degC)")
    units = m.group(2) or None
    if units is not None:
        parse(units, f"{option} {token!r}")
    return Quantity(float(m.group(1)), units)


def values_in(quantities: Sequence[Quantity | float], want: str, variable: str, option: str, field_where: str
              ) -> np.ndarray:
    """Sorted unique float64 values of ``quantities`` in the field's units ``want`` (plain floats as given)."""
    vals = [q.to(want, variable, option, field_where) if isinstance(q, Quantity) else float(q) for q in quantities]
    return np.unique(np.asarray(vals, np.float64))
