"""Data files a config names: a missing one is reported with the config key and the command that makes it."""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

GUIDE = "docs/guide/gcm-worlds.md"
# the published gcm_ens streams: year → seed of the truth run
ENS_SEEDS = {2005: 2, 2006: 5}


def make_command(path: str | Path) -> str | None:
    """The ``smoe data`` command that writes ``path``, for the GCM worlds' file names; None otherwise."""
    p = Path(path)
    if re.fullmatch(r"gcm_5\.625deg_year\d+\.nc", p.name):
        return f"smoe data gcm-world --out {p.parent}"
    m = re.fullmatch(r"gcm_ens_(\d{4})\.nc", p.name)
    if m:
        year = int(m.group(1))
        seed = f" --seed {ENS_SEEDS[year]}" if year in ENS_SEEDS else ""
        return f"smoe data gcm-ens --out {p.parent} --year {year}{seed}"
    return None


def check_data_files(key: str, paths: str | Path | Iterable[str | Path]) -> None:
    """Raise FileNotFoundError for the first of ``paths`` (a config's ``key``) that does not exist, naming the
    key and the command that makes the file (remote URLs and globs are left to the reader)."""
    items = [paths] if isinstance(paths, str | Path) else list(paths)
    for item in items:
        s = str(item)
        if "://" in s or any(c in s for c in "*?[") or Path(s).expanduser().exists():
            continue
        how = make_command(s)
        hint = (f"make it with `{how}`, or point {key} at the published files (see {GUIDE})" if how
                else "check the path, or override the key on the command line")
        raise FileNotFoundError(f"config key {key}: data file {s} does not exist; {hint}")
