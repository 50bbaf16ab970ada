"""The repository as a product: no tracker references or absolute paths of a development machine in any
committed file, and no file named after an issue."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ISSUE = re.compile(r"\bissue ?#?[0-9]+", re.IGNORECASE)
# a home, work or temporary folder of some machine; "/tmp/site" in the device script is where it installs wheels
MACHINE_PATH = re.compile(r"(?<![\w.])/(?:work|home|Users|root|tmp/(?!site\b))[A-Za-z0-9_.-]*/[A-Za-z0-9_.-]+")


def _tracked() -> list[str]:
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("needs a git checkout with git installed (the committed files are listed with git ls-files)")
    out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return [name for name in out.splitlines() if (ROOT / name).is_file()]


def _text(name: str) -> str | None:
    try:
        return (ROOT / name).read_text(encoding="utf-8")
    except (UnicodeDecodeError, OSError):
        return None  # binary files (PNG, netCDF)


def test_no_issue_numbers_in_files_or_file_names() -> None:
    hits = [f"{name}: file name" for name in _tracked() if ISSUE.search(name.replace("_", " "))]
    for name in _tracked():
        text = _text(name)
        if text is None:
            continue
        hits += [f"{name}:{i}: {line.strip()[:80]}" for i, line in enumerate(text.splitlines(), 1)
                 if ISSUE.search(line)]
    assert not hits, "tracker references in committed files:\n" + "\n".join(hits[:30])


def test_no_absolute_machine_paths() -> None:
    hits = []
    for name in _tracked():
        text = _text(name)
        if text is None or name == "tests/repository/test_repository.py":
            continue
        hits += [f"{name}:{i}: {m.group(0)}" for i, line in enumerate(text.splitlines(), 1)
                 for m in MACHINE_PATH.finditer(line)]
    assert not hits, "absolute paths of a development machine:\n" + "\n".join(hits[:30])
