"""The whole chain in ONE Python process: train → forecast → evaluate → routing map, then a
clean interpreter exit.

Without the import order in ``smoeweather/__init__.py`` the chain finished its work and the interpreter then
aborted at exit (``double free or corruption``, SIGABRT/SIGSEGV): eccodes (imported by xarray's engine
guessing) loads eckitlib's bundled PROJ/curl with RTLD_GLOBAL, and pyproj (imported by cartopy for the map)
then binds to eckitlib's PROJ instead of its own. Each case runs in a fresh interpreter, because only the exit
status shows the failure.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PYPROJ = "needs pyproj (installed with cartopy, the [maps] extra): pip install -e '.[maps]'"
ECCODES = "needs eccodes (a dependency of smoeweather): pip install -e ."

# What a user scripting the chain in a notebook does: the library calls and the CLI's main(), one process.
CHAIN = r'''
import sys
from pathlib import Path

from pipelines.prepare import write_store
from pipelines.world import simulate_world
from smoeweather.cli import main
from smoeweather.config import apply_overrides, read_config
from smoeweather.training.run import train

out, repo = Path(sys.argv[1]), Path(sys.argv[2])
store = out / "world.zarr"
write_store(lambda: simulate_world((2000, 2000), seed=0, n_steps=160), store, args={"test": "one_process"},
            train_years=None, source="test", time_chunk=8, scheduler="synchronous", progress=False)
cfg = read_config(repo / "configs" / "weatherbench" / "world_smoe_all_prior.yaml")
ckpt = train(apply_overrides(cfg, [
    f"output_dir={out / 'run'}", f"data.store={store}", "data.world=null", "data.sources=null",
    "data.num_workers=0", "data.batch_size=4", "data.variables=[geopotential_500, temperature_850]",
    "data.train_years=null", "data.valid_years=null", "data.test_years=null",
    "data.train_period=[2000-01-01, 2000-01-25T18:00]", "data.valid_period=[2000-01-26, 2000-01-31]",
    "data.test_period=[2000-02-01, 2000-02-09]", "data.lead_h=24",
    "model.width=4", "model.blocks=1", "trainer.accelerator=cpu", "trainer.devices=1",
    "trainer.max_epochs=1", "trainer.limit_train_batches=2", "trainer.limit_val_batches=1",
    "trainer.enable_progress_bar=false", "trainer.deterministic=true",
])).last_checkpoint
for argv in (
    ["forecast", ckpt, "--data", str(store), "--init", "2000-02-01", "2000-02-07", "--every", "24h",
     "--lead", "24h", "--out", str(out / "fc.zarr"), "--no-progress"],
    ["evaluate", str(out / "fc.zarr"), "--truth", str(store), "--out", str(out / "scores")],
    ["plot", "routing", ckpt, "--out", str(out / "routing")],
):
    rc = main(argv)
    if rc:
        sys.exit(f"smoe {argv[0]} returned {rc}")
# the chain needs both libraries of the pair; if either were missing the test would prove nothing
assert "gribapi" in sys.modules and "pyproj" in sys.modules, sorted(sys.modules)
print("CHAIN DONE", flush=True)
'''


def _python(args: list[str], tmp_path: Path) -> subprocess.CompletedProcess:
    """A fresh interpreter on THIS checkout (PYTHONPATH first, so a copy of the repo tests itself)."""
    paths = [str(REPO), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}
    return subprocess.run([sys.executable, *args], cwd=tmp_path, env=env, capture_output=True, text=True,
                          check=False)


def _exit_message(done: subprocess.CompletedProcess) -> str:
    how = f"killed by signal {-done.returncode}" if done.returncode < 0 else f"exit {done.returncode}"
    return f"{how}\n--- stdout tail ---\n{done.stdout[-2000:]}\n--- stderr tail ---\n{done.stderr[-3000:]}"


@pytest.mark.slow
def test_train_forecast_evaluate_and_routing_plot_in_one_process_exit_cleanly(tmp_path: Path) -> None:
    pytest.importorskip("cartopy", reason="needs cartopy (the [maps] extra): pip install -e '.[maps]'")
    script = tmp_path / "chain.py"
    script.write_text(CHAIN)
    done = _python([str(script), str(tmp_path), str(REPO)], tmp_path)
    assert done.returncode == 0, _exit_message(done)
    assert "CHAIN DONE" in done.stdout
    assert (tmp_path / "fc.zarr").is_dir() and (tmp_path / "scores" / "scores.json").is_file()
    assert len(list((tmp_path / "routing").glob("*.png"))) >= 2
    # pyproj bound to eckitlib's PROJ cannot find its own database: the symptom before the crash
    assert "unable to set PROJ database path" not in done.stderr


def test_importing_smoeweather_first_makes_the_eccodes_pyproj_pair_safe(tmp_path: Path) -> None:
    """The minimal pair: `import eccodes; import pyproj` aborts at exit; after `import smoeweather` it does
    not, and pyproj runs its own PROJ (not the one bundled in eckitlib)."""
    pytest.importorskip("pyproj", reason=PYPROJ)
    pytest.importorskip("eccodes", reason=ECCODES)
    code = ("import smoeweather, eccodes, pyproj, pyproj.datadir, sys; "
            "sys.exit(0 if pyproj.datadir.get_data_dir() else 3)")
    done = _python(["-c", code], tmp_path)
    assert done.returncode == 0, _exit_message(done)
    assert "unable to set PROJ database path" not in done.stderr


def test_eccodes_imported_before_smoeweather_is_named(tmp_path: Path) -> None:
    """Too late to fix the order: say so (and do not load pyproj ourselves, which would crash at exit)."""
    pytest.importorskip("pyproj", reason=PYPROJ)
    pytest.importorskip("eccodes", reason=ECCODES)
    code = "import sys, eccodes, smoeweather; sys.exit(4 if 'pyproj' in sys.modules else 0)"
    done = _python(["-W", "always::RuntimeWarning", "-c", code], tmp_path)
    assert done.returncode == 0, _exit_message(done)
    assert "Import smoeweather" in done.stderr and "before cfgrib/eccodes" in done.stderr
