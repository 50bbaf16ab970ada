"""Plausibility ranges of the known (ERA5 / WeatherBench 2) variables, checked on a cheap sample of the values.

One home for "are these numbers what the name and units say?": ``smoe data prepare`` (before writing),
``smoe forecast --data``, ``smoe postprocess fit`` and ``smoe evaluate`` (their inputs) call
:func:`check_plausible`. A sample is a few time steps (evenly spaced), the first members and leads, and a strided
sub-grid of each field (≤ ~4,000 points): a handful of chunk reads, whatever the size of the data.

Per field (a variable, per pressure level where it has one) the MEDIAN of the finite sampled values must lie in
the variable's typical range and every finite sampled value within its physical bounds; the pressure-level axis
must lie in (0, 1100] hPa. A failure names the variable (and level), the median or extreme found, the range
expected and, when a known unit mistake explains the numbers (geopotential height in m, °C labelled K, hPa
labelled Pa, g kg⁻¹, mm, percent), that mistake and its fix. Unknown variables are not checked; exotic data
pass ``--no-plausibility-check``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np
import xarray as xr

from pipelines.errors import DataError

G = 9.80665  # m s⁻²: geopotential = g · geopotential height
LEVEL_RANGE_HPA = (0.0, 1100.0)  # pressure levels: above 0, at most 1100 hPa (exclusive low, inclusive high)
SAMPLE_TIMES = 3  # time steps sampled per field (evenly spaced, first and last included)
SAMPLE_POINTS = 4096  # grid points sampled per 2-D field (strided sub-grid)
OPTION = "--no-plausibility-check"


@dataclass(frozen=True)
class Mistake:
    """A known unit mistake: ``fix`` maps the values found to what they would be were the mistake made;
    ``text`` says the mistake and how to correct it."""

    fix: Callable[[float], float]
    text: str


@dataclass(frozen=True)
class Plausible:
    """Where a field's sample median (``median``) and every finite value (``bounds``) must lie, in ``units``."""

    median: tuple[float, float]
    bounds: tuple[float, float]
    units: str
    mistakes: tuple[Mistake, ...] = ()


_HEIGHT = Mistake(lambda v: v * G, "this looks like geopotential height in m; multiply by 9.80665 or label units m")
_CELSIUS = Mistake(lambda v: v + 273.15, "values look like °C labelled K; label units degC (converted) or add 273.15")
_KELVIN_AS_C = Mistake(lambda v: v - 273.15, "values look like K labelled °C (273.15 added twice); label units K")
_HPA = Mistake(lambda v: v * 100.0, "values look like hPa labelled Pa; multiply by 100")
_GRAMS = Mistake(lambda v: v / 1000.0, "values look like g kg⁻¹; divide by 1000 (kg kg⁻¹)")
_MM = Mistake(lambda v: v / 1000.0, "values look like mm labelled m; divide by 1000")
_PERCENT = Mistake(lambda v: v / 100.0, "values look like percent; divide by 100 or label units %")
_TEMPERATURE_MISTAKES = (_CELSIUS, _KELVIN_AS_C)

_WIND = Plausible((-80.0, 80.0), (-250.0, 250.0), "m s⁻¹")
_PRECIPITATION = Plausible((0.0, 0.05), (-1e-3, 1.0), "m", (_MM,))
RANGES: dict[str, Plausible] = {
    # geopotential on pressure levels: per level (geopotential_range); without a level only these bounds
    "geopotential": Plausible((-1e4, 8e5), (-1e4, 8e5), "m² s⁻²", (_HEIGHT,)),
    "temperature": Plausible((150.0, 350.0), (100.0, 400.0), "K", _TEMPERATURE_MISTAKES),
    "2m_temperature": Plausible((180.0, 340.0), (150.0, 380.0), "K", _TEMPERATURE_MISTAKES),
    "sea_surface_temperature": Plausible((260.0, 320.0), (250.0, 330.0), "K", _TEMPERATURE_MISTAKES),
    "u_component_of_wind": _WIND,
    "v_component_of_wind": _WIND,
    "10m_u_component_of_wind": _WIND,
    "10m_v_component_of_wind": _WIND,
    "specific_humidity": Plausible((0.0, 0.03), (-1e-3, 0.05), "kg kg⁻¹", (_GRAMS,)),
    "total_precipitation": _PRECIPITATION,
    "total_precipitation_6hr": _PRECIPITATION,
    "convective_precipitation": _PRECIPITATION,
    "surface_pressure": Plausible((5e4, 1.1e5), (3e4, 1.15e5), "Pa", (_HPA,)),
    "mean_sea_level_pressure": Plausible((9.5e4, 1.05e5), (8.5e4, 1.1e5), "Pa", (_HPA,)),
    "land_sea_mask": Plausible((0.0, 1.0), (-1e-3, 1.0 + 1e-3), "1 (land fraction)", (_PERCENT,)),
    "geopotential_at_surface": Plausible((-2e3, 4e4), (-5e3, 9e4), "m² s⁻²"),
}


def standard_height(level_hpa: float) -> float:
    """Geopotential height (m) of ``level_hpa`` in the ICAO standard atmosphere (troposphere lapse 6.5 K/km,
    isothermal 216.65 K above 226.32 hPa; used upwards too: a range centre, not a climatology)."""
    if level_hpa >= 226.32:
        return 44330.8 * (1.0 - (level_hpa / 1013.25) ** 0.190263)
    return 11000.0 + 6341.6 * math.log(226.32 / level_hpa)


def _nice(x: float, up: bool) -> float:
    """``x`` rounded outwards to two significant digits (readable ranges)."""
    if x == 0:
        return 0.0
    step = 10 ** (math.floor(math.log10(abs(x))) - 1)
    return (math.ceil(x / step) if up else math.floor(x / step)) * step


def geopotential_range(level_hpa: float) -> Plausible:
    """Geopotential at ``level_hpa``: median within the standard height ± max(20 %, 400 m), times g."""
    h = standard_height(level_hpa)
    margin = max(0.2 * h, 400.0)
    low, high = _nice((h - margin) * G, up=False), _nice((h + margin) * G, up=True)
    return Plausible((low, high), RANGES["geopotential"].bounds, "m² s⁻²", (_HEIGHT,))


def range_of(name: str, level: float | None) -> Plausible | None:
    """The plausible range of canonical variable ``name`` (at ``level`` hPa), or None when it is not known."""
    if name == "geopotential" and level is not None and LEVEL_RANGE_HPA[0] < level <= LEVEL_RANGE_HPA[1]:
        return geopotential_range(level)
    return RANGES.get(name)


_NOT_SPATIAL = ("time", "level", "member", "number", "realization", "prediction_timedelta")
_SUFFIX = re.compile(r"^(?P<name>.+)_(?P<level>\d+(?:\.\d+)?)$")


def field_of(name: str, da: xr.DataArray) -> tuple[str, float | None] | None:
    """(canonical name, level hPa or None) of a data variable: ``temperature``, ``geopotential_500`` (a level
    suffix or ``attrs["canonical_name"]``/``level``), ``<name>_truth``; None for unknown names, σ (``_std``) and
    probability (``threshold`` dim) variables."""
    if name.endswith("_std") or "threshold" in da.dims or not np.issubdtype(da.dtype, np.floating):
        return None
    base = str(da.attrs.get("canonical_name", name)).removesuffix("_truth").removeprefix("truth_")
    level = da.attrs.get("level")
    if level is None and "level" in da.coords and da["level"].ndim == 0:
        level = da["level"].item()
    if base not in RANGES:
        m = _SUFFIX.match(base)
        if not (m and m.group("name") in RANGES):
            return None
        base, level = m.group("name"), m.group("level")
    if not _canonical_units(base, da.attrs.get("units")):
        return None  # other declared units: converted (or refused) by the units layer, not judged here
    return base, None if level is None else float(level)


def _canonical_units(name: str, units: object) -> bool:
    """True when ``units`` (an attribute; None: undeclared, taken as canonical) are ``name``'s canonical units."""
    from pipelines.canonical import VARIABLES, _normalise_unit

    if units is None or name not in VARIABLES:
        return True
    return _normalise_unit(str(units)) == VARIABLES[name][0]


def sample(da: xr.DataArray) -> xr.DataArray:
    """A cheap strided sample of ``da`` (all levels kept): ``SAMPLE_TIMES`` evenly spaced times, the first two
    members, the first and last lead, a sub-grid of ≤ ~``SAMPLE_POINTS`` points; loaded (float64)."""
    pick: dict[str, object] = {}
    for dim in da.dims:
        n = da.sizes[dim]
        if dim == "time" and n > SAMPLE_TIMES:
            pick[dim] = np.unique(np.linspace(0, n - 1, SAMPLE_TIMES).round().astype(int))
        elif dim in ("member", "number", "realization") and n > 2:
            pick[dim] = [0, 1]
        elif dim == "prediction_timedelta" and n > 2:
            pick[dim] = [0, n - 1]
    spatial = [d for d in da.dims if d not in _NOT_SPATIAL]
    points = math.prod(da.sizes[d] for d in spatial) if spatial else 1
    stride = max(1, math.ceil((points / SAMPLE_POINTS) ** (1 / max(len(spatial), 1))))
    sub = da.isel(pick) if pick else da
    if stride > 1:
        sub = sub.isel({d: slice(None, None, stride) for d in spatial})
    return sub.astype(np.float64).load()


def _fmt(x: float) -> str:
    return f"{x:,.0f}" if abs(x) >= 100 else f"{x:.3g}"


def _judge(values: np.ndarray, rng: Plausible, what: str) -> str | None:
    """Why the finite ``values`` of field ``what`` are implausible for ``rng``, or None."""
    finite = values[np.isfinite(values)]
    if finite.size == 0:
        return None  # no values: the NaN count refuses or records the field
    median, low, high = float(np.median(finite)), float(finite.min()), float(finite.max())
    (m0, m1), (b0, b1) = rng.median, rng.bounds
    if not m0 <= median <= m1:
        found, expected, fixed = f"median {_fmt(median)}", f"{_fmt(m0)}–{_fmt(m1)}", (median,)
        ok = (m0, m1)
    elif not (b0 <= low and high <= b1):
        found = f"values {_fmt(low)} to {_fmt(high)}"
        expected, fixed, ok = f"every value within {_fmt(b0)}–{_fmt(b1)}", (low, high), (b0, b1)
    else:
        return None
    hint = next((m.text for m in rng.mistakes if all(ok[0] <= m.fix(v) <= ok[1] for v in fixed)), None)
    return f"{what}: {found}, expected {expected} {rng.units}" + (f": {hint}" if hint else "")


def _level_problem(ds: xr.Dataset) -> str | None:
    """Why the ``level`` axis is not pressure levels in hPa, or None."""
    if "level" not in ds.coords:
        return None
    levels = np.atleast_1d(np.asarray(ds["level"].values, dtype=float))
    low, high = LEVEL_RANGE_HPA
    if levels.size == 0 or ((levels > low) & (levels <= high)).all():
        return None
    shown = ", ".join(f"{v:g}" for v in levels[:6]) + (", …" if levels.size > 6 else "")
    units = ds["level"].attrs.get("units", "hPa")
    hint = "looks like Pa; label the axis units Pa" if ((levels / 100 > low) & (levels / 100 <= high)).all() else (
        "expected pressure levels")
    return f"level axis {shown} labelled {units}: {hint} (expected levels above {low:g} and at most {high:g} hPa)"


def problems(ds: xr.Dataset) -> list[str]:
    """Every plausibility problem of ``ds`` (see the module docstring); empty when plausible. Reads a sample."""
    out = [p for p in (_level_problem(ds),) if p]
    if out:
        return out  # per-level ranges mean nothing on a wrong level axis
    for name, da in ds.data_vars.items():
        field = field_of(str(name), da)
        if field is None:
            continue
        base, level = field
        values = sample(da)
        if "level" in values.dims:
            for lv in values["level"].values:
                rng = range_of(base, float(lv))
                what = f"{name} at {_fmt(float(lv))} hPa"
                out += [p for p in [rng and _judge(values.sel(level=lv).values, rng, what)] if p]
        else:
            rng = range_of(base, level)
            what = f"{name}" if level is None or str(name) != base else f"{name} at {_fmt(level)} hPa"
            out += [p for p in [rng and _judge(values.values, rng, what)] if p]
    return out


def check_plausible(inputs: Mapping[str, xr.Dataset], enabled: bool = True) -> None:
    """DataError naming the input, the variable (and level), the range and the likely unit mistake when any
    dataset of ``inputs`` ({where: dataset}) holds implausible values (a cheap sample; see the module
    docstring); nothing when ``enabled`` is False (``--no-plausibility-check``)."""
    if not enabled:
        return
    for where, ds in inputs.items():
        found = problems(ds)
        if found:
            raise DataError(f"{where}: implausible values ({'; '.join(found)}); fix the data or its units, or pass "
                            f"{OPTION} for exotic data")
