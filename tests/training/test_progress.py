"""One progress style: bars on a terminal, one line per stage when piped (no carriage-return redraws)."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import dask.array as da
import numpy as np
import torch
from test_postprocess_cli import gcm_ens_like

from pipelines.compute import compute
from pipelines.progress import StageLines, progress_bar

ROOT = Path(__file__).resolve().parents[2]


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


def test_piped_long_stage_prints_a_line_every_few_percent() -> None:
    out = io.StringIO()
    bar = progress_bar(200, "smoe train", unit="step", stream=out, every_percent=10)
    bar.set_postfix(train_loss=0.5)
    for _ in range(200):
        bar.update()
    bar.close()
    lines = out.getvalue().splitlines()
    assert "\r" not in out.getvalue()
    assert lines[0] == "smoe train (200 step) ..." and lines[-1].startswith("smoe train: done, 200 step in ")
    middle = lines[1:-1]  # 10 %, 20 %, ..., 90 %: the done line stands for 100 %
    assert [line.split(" (")[0] for line in middle] == [f"smoe train: {n}/200 step" for n in range(20, 200, 20)]
    assert all(line.endswith(", train_loss 0.5") and f"({10 * (i + 1)}%)" in line for i, line in enumerate(middle))
    jumps = io.StringIO()
    bar = progress_bar(200, "x", stream=jumps, every_percent=5)
    bar.update(150)  # one jump over 15 thresholds: one line, not 15
    bar.close()
    assert len(jumps.getvalue().splitlines()) == 3 and "150/200 it (75%)" in jumps.getvalue()


def test_piped_training_prints_step_lines_epoch_lines_and_done(capsys) -> None:
    from types import SimpleNamespace

    from smoeweather.training.callbacks import PipedProgress

    trainer = SimpleNamespace(is_global_zero=True, num_training_batches=10, max_epochs=-1, max_steps=40,
                              global_step=0, current_epoch=0, callback_metrics={"train_loss": torch.tensor(0.25)})
    callback = PipedProgress(every_percent=5)
    callback.on_train_start(trainer, None)
    for step in range(1, 41):
        trainer.global_step = step
        callback.on_train_batch_end(trainer, None, None, None, step - 1)
        if step % 10 == 0:
            callback.on_train_epoch_end(trainer, None)
            trainer.current_epoch += 1
    callback.on_train_end(trainer, None)
    lines = capsys.readouterr().err.splitlines()
    assert lines[0] == "smoe train (40 step) ..." and lines[-1].startswith("smoe train: done, 40 step in ")
    steps = [line for line in lines if line.startswith("smoe train: ") and "%)" in line]
    assert len(steps) == 19 and steps[0].startswith("smoe train: 2/40 step (5%), ")  # every 5 %, not at 100 %
    assert steps[-1].endswith("train_loss 0.25")
    assert [line for line in lines if line.startswith("epoch ")][-1] == "epoch 3: step 40, train_loss 0.25"
    assert PipedProgress.total_steps(SimpleNamespace(num_training_batches=10, max_epochs=3, max_steps=-1)) == 30
    assert PipedProgress.total_steps(SimpleNamespace(num_training_batches=float("inf"), max_epochs=3,
                                                     max_steps=-1)) is None
