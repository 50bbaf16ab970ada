"""Rolling training windows: which inits train each forecast date (closed form), refusals naming
the date without a full window, and a rolling fit recovering coefficients that drift in time."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from smoeweather.postprocess.emos import fit_blocks
from smoeweather.postprocess.rolling import parse_duration, spacing, window_dates, window_index

DAY = pd.Timedelta("1D")


def test_window_holds_the_inits_that_end_lag_before_the_date() -> None:
    inits = pd.date_range("2004-01-01", periods=40, freq="D").delete([10, 11])  # a gap in the archive
    dates = window_dates(inits, pd.Timedelta("5D"), pd.Timedelta("2D"))
    # first full date: t - 2D - 5D + 1D = first init → t = Jan 7; last: last init + lag
    assert dates[0] == pd.Timestamp("2004-01-07") and dates[-1] == inits[-1] + 2 * DAY
    idx, valid = window_index(inits, dates, pd.Timedelta("5D"), pd.Timedelta("2D"))
    for k, t in enumerate(dates):
        expected = [s for s in inits if t - 7 * DAY < s <= t - 2 * DAY]
        assert list(inits[idx[k][valid[k]]]) == expected
    assert valid.sum(1).max() == 5 and valid.sum(1).min() == 3  # the gap only shortens windows


def test_dates_without_a_full_window_are_refused_by_name() -> None:
    inits = pd.date_range("2004-01-01", periods=30, freq="D")
    with pytest.raises(ValueError, match=r"2004-01-03.*no full training window"):
        window_dates(inits, pd.Timedelta("25D"), pd.Timedelta("2D"), ["2004-01-03", "2004-01-31"])
    with pytest.raises(ValueError, match=r"2004-02-02"):  # after the archive: its window is not all there
        window_dates(inits, pd.Timedelta("5D"), pd.Timedelta("2D"), ["2004-02-01", "2004-02-05"])
    with pytest.raises(ValueError, match="no forecast date has a full"):
        window_dates(inits[:3], pd.Timedelta("25D"), pd.Timedelta("2D"))
    with pytest.raises(ValueError, match="--window 'x'"):
        parse_duration("x", "--window")
    assert spacing(pd.date_range("2004-01-01", periods=5, freq="2D")) == 2 * DAY


def test_rolling_fit_follows_a_drifting_bias() -> None:
    """The bias a(t) of the truth on the ensemble mean drifts linearly; each date's window fit recovers the mean
    of a over its window (closed form: a at the window's centre), where a fit over the whole archive cannot."""
    rng = np.random.default_rng(0)
    inits = pd.date_range("2004-01-01", periods=60, freq="D")
    n_site = 400
    a_t = np.linspace(-3.0, 3.0, len(inits))
    m = rng.normal(280.0, 5.0, (len(inits), n_site))
    v = rng.gamma(4.0, 0.25, (len(inits), n_site))
    y = a_t[:, None] + m + np.sqrt(0.5 + v) * rng.standard_normal(m.shape)
    window, lag = pd.Timedelta("10D"), pd.Timedelta("2D")
    dates = window_dates(inits, window, lag)
    idx, valid = window_index(inits, dates, window, lag)
    d, w = idx.shape
    block = {"X": np.stack([np.ones((d, w * n_site)), m[idx].reshape(d, -1)], -1), "v": v[idx].reshape(d, -1),
             "y": y[idx].reshape(d, -1), "w": np.repeat(valid, n_site, 1).astype(float)}
    coef, ok = fit_blocks(lambda fn: fn(block))
    assert ok.all()
    centre = np.array([a_t[idx[k][valid[k]]].mean() for k in range(d)])
    # the slope b absorbs little; a follows the window mean of a(t) to a few standard errors (sd ≈ 1 / √4000)
    np.testing.assert_allclose(coef[:, 1], 1.0, atol=0.01)
    np.testing.assert_allclose(coef[:, 0] + (coef[:, 1] - 1.0) * m.mean(), centre, atol=0.15)
    assert np.ptp(coef[:, 0] + (coef[:, 1] - 1.0) * m.mean()) > 4.0
