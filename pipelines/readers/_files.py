"""File helpers shared by the readers: format sniffing, integrity checks, guarded opening.

:func:`open_data` is the one opener of a local input file or zarr store that the commands read (forecasts,
truths, prepared stores, canonical netCDF): a zero-byte file, a text file, a folder that is no zarr store or
an unreadable file is a one-line ``DataError`` naming it and the formats read. :func:`decoding_errors` turns
the codec error of a truncated zarr chunk, raised only when values are computed, into one naming the chunk.
"""

from __future__ import annotations

import contextlib
import glob
import os
import re
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

import xarray as xr

from pipelines.errors import DataError

PathLike = str | os.PathLike


SKIPPED_SUFFIXES = (".idx", ".tmp")  # cfgrib index files, interrupted downloads/writes


def resolve_sources(paths: PathLike | Sequence[PathLike], pattern: str = "*") -> list[Path]:
    """The one path helper: source(s) → list of existing files; ``DataError`` naming what is missing.

    ``paths``: one path, a sequence of paths, a glob (``*``, ``?``, ``[...]``) or a folder (its files
    matching ``pattern``, sorted). A path that exists is taken literally even when it holds glob
    characters (``run[1].grib``). cfgrib index files (``*.idx``) and hidden files are skipped in folders
    and globs. URLs are not files: pass them to the zarr reader.
    """
    items = [paths] if isinstance(paths, str | os.PathLike) else list(paths)
    if not items:
        raise DataError("no input files given; expected at least one path")
    out: list[Path] = []
    for item in items:
        path = Path(item)
        if path.is_dir():
            found = sorted(
                p
                for p in path.glob(pattern)
                if p.is_file() and not p.name.startswith(".") and not p.name.endswith(SKIPPED_SUFFIXES)
            )
            if not found:
                raise DataError(f"--source {path}: folder holds no file matching {pattern!r}")
            out.extend(found)
        elif path.exists():  # literal path first: '[' in a file name is not a glob
            out.append(path)
        elif any(c in str(item) for c in "*?["):
            found = sorted(
                Path(p) for p in glob.glob(str(item)) if not Path(p).name.endswith(SKIPPED_SUFFIXES)
            )
            found = [p for p in found if p.is_file()]
            if not found:
                raise DataError(f"--source {item}: no file matches this pattern (and no file has this name)")
            out.extend(found)
        else:
            raise DataError(f"{path}: file not found")
    return out


def file_format(head: bytes) -> str | None:
    """'grib' or 'netcdf' from a file's first 8 bytes, None for anything else."""
    if head[:4] == b"GRIB":
        return "grib"
    if head[:3] == b"CDF" or head[:8] == b"\x89HDF\r\n\x1a\n":
        return "netcdf"
    return None


def sniff_format(path: Path) -> str:
    """'grib' or 'netcdf' from the file's magic bytes; anything else raises ``DataError``."""
    with open(path, "rb") as f:
        head = f.read(8)
    kind = file_format(head)
    if kind is not None:
        return kind
    raise DataError(
        f"{path}: neither GRIB nor netCDF (first bytes {head!r}); expected a GRIB "
        "message ('GRIB') or a netCDF-3/4 header"
    )


def check_grib(path: Path) -> int:
    """Read every GRIB message with eccodes; return their number.

    cfgrib skips a truncated or corrupt message with a log line and fills its place with NaN, so a
    damaged download would otherwise pass unnoticed: here it raises ``DataError``.
    """
    import eccodes

    count = 0
    with open(path, "rb") as f:
        while True:
            try:
                handle = eccodes.codes_grib_new_from_file(f)
            except Exception as err:  # eccodes raises its own error classes (PrematureEndOfFile, …)
                raise DataError(
                    f"{path}: truncated or corrupt GRIB file (message {count + 1} "
                    f"unreadable: {err}); expected complete GRIB messages"
                ) from err
            if handle is None:
                break
            eccodes.codes_release(handle)
            count += 1
    if count == 0:
        raise DataError(f"{path}: no GRIB message found; expected a GRIB file")
    return count


def open_netcdf(path: Path, **kwargs: object) -> xr.Dataset:
    """``xr.open_dataset`` with a ``DataError`` naming the file when it is truncated or corrupt."""
    if sniff_format(Path(path)) == "grib":  # xarray would pick cfgrib and write an index beside the file
        raise DataError(
            f"{path}: a GRIB file where netCDF was expected; GRIB from the CDS or ENS-10 is read by "
            "`smoe data prepare era5 --format cds` or `smoe data prepare ens10`"
        )
    try:
        ds = xr.open_dataset(path, **kwargs)
    except (OSError, ValueError, RuntimeError) as err:
        raise DataError(
            f"{path}: cannot read netCDF (truncated or corrupt? {err}); expected a readable netCDF-3/4 file"
        ) from err
    return ds


def load_checked(ds: xr.Dataset, path: Path) -> xr.Dataset:
    """Load values now so that a file truncated after its header fails here, naming the file."""
    try:
        return ds.load()
    except (OSError, ValueError, RuntimeError, IndexError) as err:
        raise DataError(f"{path}: data unreadable (truncated or corrupt? {err})") from err


READ_FORMATS = "netCDF-3/4 (.nc), a zarr store (a folder such as STORE.zarr) or GRIB"
"""What :func:`open_data` reads, for its error messages."""


def open_data(path: PathLike, what: str = "", **kwargs: object) -> xr.Dataset:
    """``xr.open_zarr`` (a folder) or ``xr.open_dataset`` (a file) of a local input, lazily; ``kwargs`` go to
    the xarray opener. ``what`` names the input in messages (``"forecast"``, ``"--data"``). FileNotFoundError
    when it is missing; ``DataError`` naming it and :data:`READ_FORMATS` when it is empty, text, a folder that
    is no zarr store, or unreadable (xarray's "did not find a match in any of xarray's … IO backends")."""
    p = Path(path)
    label = f"{what} {p}" if what else str(p)
    if p.is_dir():
        try:
            return xr.open_zarr(p, **kwargs)  # type: ignore[arg-type]
        except (OSError, KeyError, ValueError, TypeError) as err:  # no zarr metadata in it, or unreadable metadata
            raise DataError(f"{label}: a folder that is not a readable zarr store ({_short(err)}); expected "
                            f"{READ_FORMATS}") from err
    if not p.exists():
        raise FileNotFoundError(f"{label} does not exist")
    with open(p, "rb") as f:
        head = f.read(8)
    if not head:
        raise DataError(f"{label} is empty (0 bytes; an interrupted download or copy?); expected {READ_FORMATS}")
    if file_format(head) is None:
        raise DataError(f"{label} is not a netCDF, zarr or GRIB file (it starts with {head!r}; a text file?); "
                        f"expected {READ_FORMATS}")
    try:
        return xr.open_dataset(p, **kwargs)  # type: ignore[arg-type]
    except (OSError, ValueError, RuntimeError, IndexError) as err:
        raise DataError(f"{label}: cannot read it (truncated or corrupt? {_short(err)}); expected a complete "
                        f"{READ_FORMATS}: write or download it again") from err


def _short(err: BaseException) -> str:
    return " ".join(str(err).split())[:200] or type(err).__name__


_DECODE_ERROR = re.compile(r"decompress|blosc|zstd|lz4|zlib|codec|buffer (?:is )?too small|incorrect header",
                           re.IGNORECASE)
_METADATA_FILES = {".zarray", ".zattrs", ".zgroup", ".zmetadata", "zarr.json"}


def guard_blosc_decode() -> None:
    """Make numcodecs' Blosc codec refuse a chunk shorter than its header says before c-blosc reads it.

    numcodecs 0.16 hands c-blosc the buffer without comparing it with the compressed size in the blosc header, so
    a truncated chunk file is read past its end: usually "error during blosc decompression: -1", but at a page
    boundary the process dies (a pytest worker crashed so). Here the header is read first and a short buffer
    raises that same RuntimeError, which :func:`decoding_errors` names. Installed once, at import."""
    try:
        from numcodecs.blosc import Blosc
        from numcodecs.compat import ensure_contiguous_ndarray
    except ImportError:  # no blosc: nothing to guard
        return
    decode = Blosc.decode
    if getattr(decode, "_checks_length", False):
        return

    def checked_decode(self: object, buf: object, out: object = None) -> object:
        raw = ensure_contiguous_ndarray(buf)  # a view, once per chunk: no copy on the decode path
        head, size = raw.view("u1")[:16].tobytes(), raw.nbytes
        if len(head) < 16 or (head[0] in (1, 2) and int.from_bytes(head[12:16], "little") > size):
            raise RuntimeError(f"error during blosc decompression: truncated chunk ({size} bytes, the header "
                               f"states {int.from_bytes(head[12:16], 'little') if len(head) >= 16 else 'more'})")
        return decode(self, buf, out)

    checked_decode._checks_length = True  # type: ignore[attr-defined]
    Blosc.decode = checked_decode  # type: ignore[method-assign]


guard_blosc_decode()


def is_decode_error(err: BaseException) -> bool:
    """Whether ``err`` is a codec failing on stored bytes (a truncated or corrupt zarr chunk): numcodecs'
    ``RuntimeError: error during blosc decompression``, zlib's ``error``, zstd's and others alike."""
    if not (isinstance(err, RuntimeError | ValueError | OSError) or type(err).__name__ == "error"):
        return False
    return bool(_DECODE_ERROR.search(f"{type(err).__module__} {err}"))


def truncated_chunk(store: Path, limit: int = 200_000) -> Path | None:
    """The first chunk file of the local zarr ``store`` whose blosc header states more (compressed) bytes
    than the file holds, or None (no blosc chunk is short, or more than ``limit`` files were looked at)."""
    for n, path in enumerate(sorted(p for p in store.rglob("*") if p.is_file() and p.name not in _METADATA_FILES)):
        if n >= limit:
            return None
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(16)
        if len(head) < 16:
            if 0 < size and head[:1] in (b"\x01", b"\x02"):  # shorter than a blosc header
                return path
            continue
        if head[0] in (1, 2) and int.from_bytes(head[12:16], "little") > size:  # blosc: version, ..., cbytes
            return path
    return None


@contextlib.contextmanager
def decoding_errors(sources: Iterable[object]) -> Iterator[None]:
    """Run a block that computes values read from ``sources`` (paths, URLs, lists of them); a codec error
    (:func:`is_decode_error`) becomes a one-line ``DataError`` naming the truncated chunk file when a local zarr
    store holds one (:func:`truncated_chunk`), else the stores and files it may come from."""
    try:
        yield
    except Exception as err:
        if not is_decode_error(err):
            raise
        names = [str(s) for s in _flat(sources)]
        stores = [Path(s) for s in names if "://" not in s and Path(s).is_dir()]
        for store in stores:
            bad = truncated_chunk(store)
            if bad is not None:
                raise DataError(f"{bad}: truncated zarr chunk ({_short(err)}); the store {store} is incomplete or "
                                "corrupt: copy or write it again") from err
        raise DataError(f"a stored chunk of {' or '.join(names) or 'an input'} cannot be decoded ({_short(err)}): "
                        "truncated or corrupt; copy or write it again") from err


def _flat(sources: Iterable[object]) -> Iterator[object]:
    for s in sources:
        if s is None:
            continue
        if isinstance(s, str | os.PathLike):
            yield s
        elif isinstance(s, dict):
            yield from _flat(s.values())
        else:
            yield from _flat(s)  # type: ignore[arg-type]
