"""Read a checkpoint file as data: the one place smoeweather opens a ``.ckpt``.

A PyTorch checkpoint is a pickle, and a pickle can name any Python callable to run while it is read. So a
checkpoint someone else made (a downloaded post-processing network, a published pretrained model) is read with
``torch.load(..., weights_only=True)``, PyTorch's restricted unpickler: it rebuilds tensors, dicts, lists,
tuples, strings and numbers only, and refuses everything else without calling it. Checkpoints written by
``smoe train`` hold nothing else (their smoeweather metadata is plain JSON-able data, see
``training/base.py``), so no allow-list of extra types is needed and none is added.

There is no fallback to the unsafe path: a file that needs one is refused, naming the file and the objects it
wanted to create. ``smoe checkpoint convert OLD NEW --trust`` rewrites a checkpoint the user explicitly trusts
into the plain form (see :func:`convert_trusted`).
"""

from __future__ import annotations

import hashlib
import pickle
import re
from pathlib import Path
from typing import Any

import torch

METADATA_KEY = "smoeweather"
"""The key of a checkpoint's smoeweather metadata block (``checkpoint["smoeweather"]``)."""


def file_sha256(path: str | Path, chunk: int = 1 << 20) -> str:
    """Hex SHA-256 of a file's bytes (provenance of forecasts and scores)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()

__all__ = ["UnsafeCheckpointError", "read_checkpoint", "convert_trusted", "plain"]


class UnsafeCheckpointError(ValueError):
    """A checkpoint file holds objects other than tensors and plain metadata; it was not loaded."""


_GLOBAL = re.compile(r"GLOBAL ([\w.]+)")
CHECKPOINT_MAGIC = (b"PK\x03\x04", b"\x80")  # torch.save: a zip archive, or (legacy format) a raw pickle


def _unsafe_names(path: Path, err: Exception) -> list[str]:
    """The callables/classes a refused pickle asked for (best effort; for the error message only)."""
    names: list[str] = []
    try:  # lists the GLOBAL opcodes of a zip checkpoint without running any of them
        names = list(torch.serialization.get_unsafe_globals_in_checkpoint(path))
    except Exception:  # not a zip checkpoint (a raw pickle): fall back to the unpickler's message
        pass
    names = names or _GLOBAL.findall(str(err))
    # posix.system is os.system on Linux (nt.system on Windows): say the name a reader recognises
    return [re.sub(r"^(posix|nt)\.", "os.", n) for n in dict.fromkeys(names)]


def file_head(path: Path, folder_error: Exception, missing: str, size: int = 8) -> bytes:
    """The first ``size`` bytes of the file ``path`` (its magic number), for a reader of one file of a known
    format (a checkpoint, a post-processing model file): raises ``folder_error`` when ``path`` is a folder (a
    zarr store?) and FileNotFoundError with ``missing`` when there is nothing at ``path``."""
    if path.is_dir():
        raise folder_error
    if not path.is_file():
        raise FileNotFoundError(missing)
    with open(path, "rb") as f:
        return f.read(size)


def read_checkpoint(path: str | Path) -> dict[str, Any]:
    """Load a checkpoint file as data (tensors on CPU, plain containers); never runs code from it.

    Raises FileNotFoundError for a missing file, :class:`UnsafeCheckpointError` (naming the file and the
    refused objects) for a pickle that asks for anything but tensors and plain data, and ValueError (naming
    the file) for a file that is not a torch checkpoint or not a dict.
    """
    path = Path(path)
    expected = "expected a .ckpt file written by `smoe train`"
    head = file_head(path, ValueError(f"{path} is a folder (a zarr store?), not a checkpoint; {expected}"),
                     f"checkpoint {path} does not exist")
    if not head.startswith(CHECKPOINT_MAGIC):  # a text, YAML or netCDF file: never hint at --trust for those
        raise ValueError(f"{path} is not a PyTorch/Lightning checkpoint (it starts with {head!r}); {expected}")
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        names = _unsafe_names(path, err)
        what = ", ".join(names) if names else "pickle instructions the safe loader does not accept"
        raise UnsafeCheckpointError(
            f"{path} holds objects that are not weights or plain metadata ({what}); smoeweather does not load it. "
            "If you made this file yourself with an older smoeweather and trust it, convert it once with "
            f"`smoe checkpoint convert {path} NEW.ckpt --trust`"
        ) from None
    except Exception as err:  # torch raises many types for a file that is not a torch checkpoint
        raise ValueError(f"{path} is not a PyTorch/Lightning checkpoint ({type(err).__name__}: {err})") from err
    if not isinstance(ckpt, dict):
        raise ValueError(f"{path} is not a checkpoint: it holds a {type(ckpt).__name__}, expected a dict")
    return ckpt


def plain(value: Any) -> Any:
    """``value`` with only dict/list/tuple containers and tensor, str, int, float, bool or None leaves.

    Numpy arrays and scalars become lists and Python numbers, paths and other objects their ``str``; used by
    :func:`convert_trusted` and for the metadata every checkpoint carries.
    """
    if isinstance(value, (torch.Tensor, str, bool, int, float)) or value is None:
        return value
    if isinstance(value, dict):
        return {k if isinstance(k, (str, int, float, bool)) else str(k): plain(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return tuple(plain(v) for v in value)
    if isinstance(value, list):
        return [plain(v) for v in value]
    if hasattr(value, "tolist"):  # numpy arrays and scalars
        return plain(value.tolist())
    return str(value)


def convert_trusted(source: str | Path, target: str | Path) -> list[str]:
    """Rewrite a checkpoint the caller TRUSTS (it is unpickled with ``weights_only=False``: any code in it
    runs) into the plain form :func:`read_checkpoint` loads. Returns the top-level keys written.

    The result is written to a temporary file and renamed, so a failure leaves no ``target``.
    """
    source, target = Path(source), Path(target)
    if not source.is_file():
        raise FileNotFoundError(f"checkpoint {source} does not exist")
    ckpt = torch.load(source, map_location="cpu", weights_only=False)  # trusted by the caller, said explicitly
    if not isinstance(ckpt, dict):
        raise ValueError(f"{source} is not a checkpoint: it holds a {type(ckpt).__name__}, expected a dict")
    converted = plain(ckpt)
    tmp = target.with_name(target.name + ".partial")
    try:
        torch.save(converted, tmp)
        read_checkpoint(tmp)  # the converted file must load safely, or nothing is written
        tmp.replace(target)
    finally:
        tmp.unlink(missing_ok=True)
    return list(converted)
