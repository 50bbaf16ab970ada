"""An interrupted GCM generator run resumes from its restart file and writes the files an uninterrupted run
writes, bit for bit (a run of the published configuration takes hours)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import xarray as xr

pytest.importorskip("dinosaur_torch", reason="needs the [gcm] extra (dinosaur-torch): pip install -e '.[gcm]'")
gcm = pytest.importorskip("pipelines.gcm", reason="needs the [gcm] extra: pip install -e '.[gcm]'")
pytestmark = pytest.mark.slow

FAST = dict(truncation=21, dt_minutes=60.0, progress=False)


class Interrupted(Exception):
    pass


def _interrupt_after(monkeypatch: pytest.MonkeyPatch, calls: int) -> None:
    """GCM.advance raises on its ``calls``+1-th call (spin-up: one call a day; the run: one per 6 h)."""
    real, count = gcm.GCM.advance, [0]

    def advance(self, state, steps):  # noqa: ANN001, ANN202
        if count[0] == calls:
            raise Interrupted
        count[0] += 1
        return real(self, state, steps)

    monkeypatch.setattr(gcm.GCM, "advance", advance)


def _world(out: Path) -> list[Path]:
    return gcm.generate_world(out, years=2, days_per_year=2, spin_up_days=2, **FAST)


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> list[xr.Dataset]:
    paths = _world(tmp_path_factory.mktemp("uninterrupted"))
    return [xr.load_dataset(p) for p in paths]


@pytest.mark.parametrize("calls", [1, 14], ids=["in-spin-up", "in-year-2"])
def test_an_interrupted_world_resumes_to_the_same_files(reference: list[xr.Dataset], tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch, calls: int) -> None:
    monkeypatch.setattr(gcm, "EVERY_DAYS", 1)  # a restart every simulated day
    with monkeypatch.context() as m:
        _interrupt_after(m, calls)
        with pytest.raises(Interrupted):
            _world(tmp_path)
    restart = tmp_path / ".gcm_world.restart.npz"
    assert restart.is_file()
    written = sorted(p.name for p in tmp_path.glob("*.nc"))
    assert written == (["gcm_5.625deg_year1.nc"] if calls == 14 else [])
    paths = _world(tmp_path)  # the same command again: resumes
    for path, want in zip(paths, reference, strict=True):
        with xr.open_dataset(path) as got:
            # the restart holds the float64 state bit for bit: the same steps follow, on the same machine
            xr.testing.assert_identical(got.load(), want)  # as above: resumed from the exact state
    assert not restart.exists()


def test_a_restart_of_other_settings_is_not_used(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gcm, "EVERY_DAYS", 1)
    with monkeypatch.context() as m:
        _interrupt_after(m, 7)  # 2 spin-up days, then year 1: a restart after its first day (4 × 6 h)
        with pytest.raises(Interrupted):
            gcm.generate_world(tmp_path, years=1, days_per_year=2, spin_up_days=2, seed=1, **FAST)
    restart = gcm.Restart(tmp_path / ".gcm_world.restart.npz", {})
    assert restart.load() is None  # another configuration's key
    with np.load(tmp_path / ".gcm_world.restart.npz", allow_pickle=False) as f:  # plain arrays, no pickle
        assert "state_vorticity" in f.files and f["array_z"].shape[0] == 4  # one day of 6-hourly fields


def test_an_interrupted_ensemble_resumes_to_the_same_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    kw = dict(year=2005, days=2, members=2, every_days=2, spin_up_days=1, **FAST)
    want = xr.load_dataset(gcm.generate_ensemble(tmp_path / "a", **kw))
    monkeypatch.setattr(gcm, "EVERY_DAYS", 1)
    with monkeypatch.context() as m:
        _interrupt_after(m, 4)  # spin-up 1 call; day 0: 2 lead steps of the init, 1 truth step; then day 1
        with pytest.raises(Interrupted):
            gcm.generate_ensemble(tmp_path / "b", **kw)
    assert (tmp_path / "b" / ".gcm_ens_2005.nc.restart.npz").is_file()
    with xr.open_dataset(gcm.generate_ensemble(tmp_path / "b", **kw)) as got:
        xr.testing.assert_identical(got.load(), want)
