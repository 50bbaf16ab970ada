"""Fault injection, outputs: never clobbered without --overwrite, also by two concurrent writers;
a killed writer leaves the old output intact and its leftover is cleaned by the next run; a failed run leaves
nothing new; an output under a file or in a read-only folder is refused in one line before anything runs."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from pipelines import atomic
from smoeweather.io import OutputError, OutputExistsError, atomic_output, check_output

REPO = Path(__file__).resolve().parents[2]


def _leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith("."))


def test_existing_output_is_refused_in_one_line(tmp_path: Path) -> None:
    out = tmp_path / "out.nc"
    out.write_text("old")
    with pytest.raises(OutputExistsError) as err:
        with atomic_output(out, overwrite=False) as tmp:
            tmp.write_text("new")
    assert str(err.value) == f"{out} already exists (pass --overwrite to replace it)"
    assert out.read_text() == "old" and _leftovers(tmp_path) == []


def test_overwrite_replaces_and_dir_kind_stages_a_folder(tmp_path: Path) -> None:
    out = tmp_path / "scores"
    with atomic_output(out, kind="dir") as tmp:
        assert tmp.is_dir() and tmp.parent == tmp_path and tmp.name.startswith(".scores.")
        (tmp / "a.txt").write_text("1")
    with atomic_output(out, overwrite=True, kind="dir") as tmp:
        (tmp / "b.txt").write_text("2")
    assert sorted(p.name for p in out.iterdir()) == ["b.txt"]  # the whole folder replaced, no stale part left
    assert _leftovers(tmp_path) == []


def test_output_created_while_running_is_not_replaced(tmp_path: Path) -> None:
    """The existence check runs again at the commit: another writer that finished first keeps its output."""
    out = tmp_path / "pp.zarr"
    with pytest.raises(OutputExistsError, match="another run wrote it"):
        with atomic_output(out, kind="dir") as tmp:
            (tmp / "mine").write_text("mine")
            out.mkdir()  # the other writer commits an (empty!) folder first: os.rename would replace it
    assert out.is_dir() and list(out.iterdir()) == [] and _leftovers(tmp_path) == []


def test_failed_run_leaves_nothing_new(tmp_path: Path) -> None:
    out = tmp_path / "new" / "deeper" / "model.nc"
    with pytest.raises(RuntimeError):
        with atomic_output(out) as tmp:
            tmp.write_text("partial")
            raise RuntimeError("computation failed")
    assert list(tmp_path.iterdir()) == []  # not even the folders made for it


def test_output_under_a_file_and_read_only_folder_are_refused_before_writing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "file.txt").write_text("x")
    with pytest.raises(OutputError, match=r"file.txt, which is a file, not a folder"):
        check_output(tmp_path / "file.txt" / "sub" / "out.zarr")
    ro = tmp_path / "ro"
    ro.mkdir()
    real_access = os.access
    monkeypatch.setattr(atomic.os, "access", lambda p, m: False if Path(p) == ro else real_access(p, m))
    with pytest.raises(OutputError, match=r"no permission to write in the folder .*ro;") as err:
        with atomic_output(ro / "out.nc"):
            raise AssertionError("must not run")
    assert "\n" not in str(err.value)


@pytest.mark.skipif(os.geteuid() == 0,
                    reason="needs a non-root user (root ignores folder permissions): run the suite as a normal user")
def test_read_only_folder_really(tmp_path: Path) -> None:
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        with pytest.raises(OutputError, match="no permission"):
            check_output(ro / "out.nc")
    finally:
        ro.chmod(0o755)


_WRITER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from smoeweather.io import OutputExistsError, atomic_output
    out, me, go = Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3])
    try:
        with atomic_output(out, overwrite=False, kind="dir") as tmp:
            (tmp / "writer.txt").write_text(me)
            (go.parent / f"ready-{me}").write_text("")
            while not go.exists():  # both writers passed the entry check and staged their output
                time.sleep(0.01)
    except OutputExistsError as err:
        print(err, file=sys.stderr)
        sys.exit(2)
""")


def test_two_concurrent_writers_exactly_one_wins(tmp_path: Path) -> None:
    out, go = tmp_path / "pp.zarr", tmp_path / "go"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    procs = [subprocess.Popen([sys.executable, "-c", _WRITER, str(out), me, str(go)], env=env,
                              stderr=subprocess.PIPE, text=True) for me in ("a", "b")]
    deadline = time.monotonic() + 60
    while not all((tmp_path / f"ready-{me}").exists() for me in "ab"):
        assert time.monotonic() < deadline and all(p.poll() is None for p in procs)
        time.sleep(0.02)
    go.write_text("")
    errs = [p.communicate(timeout=60)[1] for p in procs]  # communicate closes the pipe (read() left it open)
    results = [(p.returncode, err) for p, err in zip(procs, errs, strict=True)]
    assert sorted(rc for rc, _ in results) == [0, 2]
    winner = "ab"[[rc for rc, _ in results].index(0)]
    assert (out / "writer.txt").read_text() == winner  # the loser did not replace it
    loser_err = next(err for rc, err in results if rc == 2)
    assert loser_err.strip().splitlines() == [f"{out} already exists (another run wrote it while this one ran; "
                                              "pass --overwrite to replace it)"]
    assert [n for n in _leftovers(tmp_path)] == []


_KILLED = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from smoeweather.io import atomic_output
    out, signal_file = Path(sys.argv[1]), Path(sys.argv[2])
    with atomic_output(out, overwrite=True, kind="dir") as tmp:
        (tmp / "value.txt").write_text("new, half written")
        signal_file.write_text(str(tmp))
        time.sleep(600)
""")


def test_killed_writer_keeps_the_old_output_and_the_next_run_cleans_up(tmp_path: Path,
                                                                        capsys: pytest.CaptureFixture) -> None:
    out, flag = tmp_path / "store.zarr", tmp_path / "staged"
    with atomic_output(out, kind="dir") as tmp:
        (tmp / "value.txt").write_text("old")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-c", _KILLED, str(out), str(flag)], env=env)
    deadline = time.monotonic() + 60
    while not flag.exists():
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.02)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(30)
    staging = Path(flag.read_text())
    assert staging.exists() and (out / "value.txt").read_text() == "old"  # kill -9 mid-write: old intact
    with pytest.raises(OutputExistsError):  # a later run without --overwrite: refused, leftover cleaned
        with atomic_output(out, kind="dir"):
            pass
    assert not staging.exists()
    assert f"removed 1 leftover(s) of interrupted earlier runs beside {out}: {staging.name}" in capsys.readouterr().err
    assert (out / "value.txt").read_text() == "old"


def test_leftovers_of_live_runs_and_other_outputs_are_kept(tmp_path: Path) -> None:
    out = tmp_path / "a.nc"
    live = tmp_path / f".a.nc.{os.getpid()}-0badcafe.staging"
    other = tmp_path / ".b.nc.999999999-00000000.staging"
    legacy = tmp_path / ".a.nc.abcd1234.tmp"
    old_pp = tmp_path / ".a.nc.staging-999999999"
    for p in (live, other, legacy, old_pp):
        p.mkdir()
    assert atomic.clean_leftovers(out) == [old_pp]
    assert live.exists() and other.exists() and legacy.exists() and not old_pp.exists()


def test_killed_fit_keeps_the_old_model_and_the_next_fit_cleans_its_work_folder(tmp_path: Path) -> None:
    """`smoe postprocess fit --overwrite` killed (SIGKILL) while it stages its training data: the old model
    file is untouched, and the next run removes the killed run's hidden work folder."""
    from test_sites import srft_like

    from smoeweather.cli import main

    table, model = tmp_path / "t.csv", tmp_path / "m.nc"
    srft_like(table, n_days=20, n_sites=3)
    argv = ["postprocess", "fit", "--forecast", str(table), "--out", str(model), "--quiet", "--scheduler", "threads"]
    assert main(argv) == 0
    old = model.read_bytes()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-m", "smoeweather", *argv, "--overwrite"], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    work = tmp_path / f".m.nc.{proc.pid}.work"
    deadline = time.monotonic() + 120
    while not work.exists():
        assert time.monotonic() < deadline and proc.poll() is None, "the fit ended before it was killed"
        time.sleep(0.005)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(30)
    assert work.exists() and model.read_bytes() == old
    assert main([*argv, "--overwrite"]) == 0
    assert not work.exists() and _leftovers(tmp_path) == []
