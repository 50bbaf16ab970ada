"""Rolling training windows (Gneiting et al. 2005; R ensembleMOS ``trainingDays``): one EMOS fit per forecast
date t on the initialisations s of the training archive with

    t − lag − window < s ≤ t − lag

so a 48 h forecast with ``lag = 2D`` trains on forecasts whose observations (at s + 48 h ≤ t) exist when it
is issued. A date has a FULL window when the archive covers the whole span: its first init is at most one
init spacing after t − lag − window, and its last init is at or after t − lag. Missing inits inside a covered
span (gaps in the archive) only reduce the sample count.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd


def parse_duration(text: str, option: str) -> pd.Timedelta:
    """``25D``, ``48h``, ``2 days`` → Timedelta > 0; ValueError naming ``option`` otherwise."""
    try:
        td = pd.Timedelta(str(text).strip())
    except ValueError as err:
        raise ValueError(f"{option} {text!r}: not a duration (expected e.g. 25D or 48h)") from err
    if td < pd.Timedelta(0):
        raise ValueError(f"{option} {text!r}: must not be negative")
    return td


def spacing(inits: pd.DatetimeIndex) -> pd.Timedelta:
    """The most common spacing of the (sorted, unique) initialisation times (1 day for a single init)."""
    if len(inits) < 2:
        return pd.Timedelta("1D")
    diffs = pd.Series(np.diff(inits.values)).value_counts()
    return pd.Timedelta(diffs.index[0])


def window_dates(inits: Sequence[np.datetime64] | pd.DatetimeIndex, window: pd.Timedelta, lag: pd.Timedelta,
                 dates: Sequence[str] | None = None) -> pd.DatetimeIndex:
    """Forecast dates to fit for: ``dates`` (START END, inclusive) at the archive's init spacing, default every
    date with a full window. ValueError naming the first dates without a full window."""
    t = pd.DatetimeIndex(inits).sort_values().unique()
    if window <= pd.Timedelta(0):
        raise ValueError(f"--window {window}: must be positive")
    step = spacing(t)
    first = t[0] + lag + window - step  # earliest date whose window starts inside the archive
    last = t[-1] + lag
    if dates is None:
        if first > last:
            raise ValueError(f"no forecast date has a full {window.days}-day window with lag {lag} in the archive "
                             f"({t[0]} .. {t[-1]}); a longer archive or a shorter --window is needed")
        return pd.date_range(first, last, freq=step)
    lo, hi = pd.Timestamp(dates[0]), pd.Timestamp(dates[1])
    out = pd.date_range(lo, hi, freq=step)
    if len(out) == 0:
        raise ValueError(f"--dates {dates[0]} {dates[1]}: an empty range")
    bad = out[(out < first) | (out > last)]
    if len(bad):
        raise ValueError(f"forecast date(s) {[str(d) for d in bad[:3]]}{' …' if len(bad) > 3 else ''} have no full "
                         f"training window ({window} ending {lag} before the date; the archive's inits span "
                         f"{t[0]} .. {t[-1]}, so dates {first} .. {last} can be fitted)")
    return out


def window_index(inits: Sequence[np.datetime64] | pd.DatetimeIndex, dates: pd.DatetimeIndex,
                 window: pd.Timedelta, lag: pd.Timedelta) -> tuple[np.ndarray, np.ndarray]:
    """(idx, valid) (D, W): positions in ``inits`` of each date's training inits, padded with 0 where
    ``valid`` is False; W = the largest window's init count."""
    t = pd.DatetimeIndex(inits)
    lists = [np.flatnonzero((t > d - lag - window) & (t <= d - lag)) for d in dates]
    width = max(1, max(len(i) for i in lists))
    idx = np.zeros((len(dates), width), np.int64)
    valid = np.zeros((len(dates), width), bool)
    for k, i in enumerate(lists):
        idx[k, : len(i)], valid[k, : len(i)] = i, True
    return idx, valid


def check_window_options(window: str | None, lag: str | None, dates: Sequence[str] | None) -> None:
    """ValueError when ``--lag``/``--dates`` come without ``--window``."""
    if window is None and (lag is not None or dates is not None):
        raise ValueError("--lag and --dates need --window (a rolling training window, e.g. --window 25D)")


def rolling_windows(inits: Sequence[np.datetime64], leads: Sequence[np.timedelta64], window: str | None,
                    lag: str | None, dates: Sequence[str] | None
                    ) -> tuple[tuple[pd.DatetimeIndex, np.ndarray, np.ndarray], dict[str, str]] | None:
    """The rolling windows of ``--window``/``--lag`` (default: the longest lead)/``--dates`` on the archive's
    ``inits``: ((dates, idx, valid) of :func:`window_index`, the model-file attributes); None without a window.
    The one setup of every rolling fit (EMOS and DRN)."""
    check_window_options(window, lag, dates)
    if window is None:
        return None
    w = parse_duration(window, "--window")
    lag_td = pd.Timedelta(parse_duration(lag, "--lag") if lag is not None else np.max(np.asarray(leads)))
    fit_dates = window_dates(inits, w, lag_td, dates)
    idx, valid = window_index(inits, fit_dates, w, lag_td)
    attrs = {"window": str(window), "lag": str(lag_td), "window_rule": "inits s with t - lag - window < s <= t - lag",
             "dates": f"{fit_dates[0]} .. {fit_dates[-1]}"}
    return (fit_dates, idx, valid), attrs
