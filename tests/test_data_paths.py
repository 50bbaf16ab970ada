"""Configs a clone can run: the GCM configs read the files `smoe data gcm-world` / `gcm-ens` write inside the
clone, and a missing data file is reported with the config key and the command that makes it."""

from __future__ import annotations

from pathlib import Path

import pytest

from smoeweather.cli import main
from smoeweather.data.paths import check_data_files, make_command

REPO = Path(__file__).resolve().parents[1]


def test_no_committed_config_reads_the_shared_folder() -> None:
    readers = [p.relative_to(REPO) for p in (REPO / "configs").rglob("*.yaml")
               if "../shared" in "".join(line.split("#")[0] for line in p.read_text().splitlines())]
    assert readers == []


def test_make_command_names_the_generator() -> None:
    assert make_command("data/gcm_world/gcm_5.625deg_year2.nc") == "smoe data gcm-world --out data/gcm_world"
    assert make_command("data/gcm_ens/gcm_ens_2006.nc") == "smoe data gcm-ens --out data/gcm_ens --year 2006 --seed 5"
    assert make_command("x/other.nc") is None


def test_missing_file_names_key_and_command(tmp_path: Path) -> None:
    present = tmp_path / "a.nc"
    present.write_bytes(b"")
    check_data_files("data.source", [present, "https://example.org/x.nc", str(tmp_path / "*.zarr")])  # no error
    with pytest.raises(FileNotFoundError, match=r"config key data.sources: .*gcm_5.625deg_year1.nc does not exist; "
                       r"make it with `smoe data gcm-world --out"):
        check_data_files("data.sources", [present, tmp_path / "gcm_5.625deg_year1.nc"])


def test_train_in_a_clone_without_data_says_how_to_make_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["train", "--config", str(REPO / "configs/postprocess/gcm_ens_unet.yaml"),
                 "trainer.accelerator=cpu"]) != 0
    err = capsys.readouterr().err
    assert "config key data.source: data file data/gcm_ens/gcm_ens_2005.nc does not exist" in err
    assert "smoe data gcm-ens --out data/gcm_ens --year 2005 --seed 2" in err
