"""One progress style: bars on a terminal, one line per stage when piped (no carriage-return redraws)."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import dask.array as da
import numpy as np
from test_postprocess_cli import gcm_ens_like

from pipelines.compute import compute
from pipelines.progress import StageLines, progress_bar

ROOT = Path(__file__).resolve().parents[1]


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_piped_bar_prints_one_line_at_start_and_one_at_end() -> None:
    out = io.StringIO()
    bar = progress_bar(3, "smoe forecast", unit="init", stream=out)
    assert isinstance(bar, StageLines)
    for _ in range(3):
        bar.update()
    bar.close()
    bar.close()  # closing twice writes nothing more
    lines = out.getvalue().splitlines()
    assert "\r" not in out.getvalue()
    assert lines[0] == "smoe forecast (3 init) ..." and lines[1].startswith("smoe forecast: done, 3 init in ")
    assert len(lines) == 2


def test_terminal_gets_a_bar_and_quiet_gets_nothing() -> None:
    from tqdm.auto import tqdm

    bar = progress_bar(2, "x", stream=_Tty())
    assert isinstance(bar, tqdm)
    bar.close()
    silent = io.StringIO()
    quiet = progress_bar(2, "x", enabled=False, stream=silent)
    quiet.update()
    quiet.close()
    assert silent.getvalue() == ""


def test_piped_dask_compute_prints_stage_lines(capsys) -> None:
    x = da.ones((100, 10), chunks=(10, 10))
    assert float(compute(x.sum(), None, True, "summing")) == 1000.0  # captured stderr is not a terminal
    err = capsys.readouterr()
    assert err.out == "" and "\r" not in err.err
    assert err.err.splitlines()[0] == "summing ..." and err.err.splitlines()[1].startswith("summing: done")
    np.testing.assert_array_equal(compute([x, 3], None, False, "quiet")[0], np.ones((100, 10)))


def test_piped_postprocess_fit_log_has_no_redraws(tmp_path: Path) -> None:
    train = gcm_ens_like(tmp_path / "a.nc", 2005, 0)
    done = subprocess.run(
        [sys.executable, "-m", "smoeweather", "postprocess", "fit", "--method", "emos", "--per-gridpoint",
         "--forecast", str(train), "--out", str(tmp_path / "emos.nc")],
        capture_output=True, text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=600,
    )
    assert done.returncode == 0, done.stderr
    log = done.stdout + done.stderr
    assert "\r" not in log, log
    assert (tmp_path / "emos.nc").is_file()
    assert len(log.splitlines()) < 40, log
