"""Pack what the device call needs into ``.gpu/`` small enough for its 64 MiB transfer limit, and unpack it there.

``gcm OUT SRC [--until T]``: a GCM-world netCDF year (``../shared/data/gcm_world``) → a pack of its
geopotential and temperature (the gcm configs' variables), constants and coordinates, ~20.8 MB a year against
~23.9 MB for ``../shared/tools/gpu/pack_gcm.py``: the stored int16 values are differenced along time, level
and longitude (a Lorenzo predictor), zig-zag coded, split into high and low byte planes and compressed with
xz (lzma, preset 9e). Lossless: the round trip is checked when packing (values bit-identical).
``unpack PACK OUT.nc``: rebuild the netCDF (CF-packed int16 as stored) with xarray and h5netcdf (or netCDF4);
lzma from the standard library.
``site OUT.tar.xz WHEEL...``: the wheels unzipped into one tree (tests and the libraries' debug data dropped),
xz-compressed: ~2 MB against ~13 MB of wheels; on the device extracting it into /tmp/site installs them (pure
copies, no pip).
A pack is data: ``.npz`` arrays and JSON text, read with ``allow_pickle=False``.

    python -m benchmarks.gpu_pack gcm .gpu/gcm_year1.pack ../shared/data/gcm_world/gcm_5.625deg_year1.nc
    python -m benchmarks.gpu_pack unpack .gpu/gcm_year1.pack $SCRATCH/gcm_world/gcm_5.625deg_year1.nc
"""

from __future__ import annotations

import argparse
import io
import json
import lzma
import shutil
import subprocess
import tarfile
import tempfile
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

PACKED = ("geopotential", "temperature")
CONSTANTS = ("land_sea_mask", "geopotential_at_surface")
COORDS = ("time", "level", "latitude", "longitude")
XZ = 9 | lzma.PRESET_EXTREME
PACK_FORMAT = "smoeweather-gcm-pack-2"
DIFF_AXES = (0, 1, 3)  # time, level, longitude of (time, level, latitude, longitude)


def encode(values: np.ndarray) -> bytes:
    """int16 (T, L, Y, X) → xz bytes of the zig-zag coded Lorenzo residual, high then low byte plane."""
    r = values.astype(np.int32)
    for axis in DIFF_AXES:
        r = np.diff(r, axis=axis, prepend=0)
    r16 = r.astype(np.int16)
    if not np.array_equal(r16, r):
        raise ValueError("a Lorenzo residual does not fit int16: this data is not a GCM-world year")
    z = ((r16.astype(np.int32) << 1) ^ (r16.astype(np.int32) >> 31)).astype(np.uint16)
    planes = np.stack([(z >> 8).astype(np.uint8), (z & 0xFF).astype(np.uint8)])
    return lzma.compress(planes.tobytes(), preset=XZ)


def decode(payload: bytes, shape: tuple[int, ...]) -> np.ndarray:
    """Inverse of :func:`encode`: int16 of ``shape``."""
    planes = np.frombuffer(lzma.decompress(payload), np.uint8).reshape(2, *shape)
    z = (planes[0].astype(np.int32) << 8) | planes[1].astype(np.int32)
    r = (z >> 1) ^ -(z & 1)
    for axis in reversed(DIFF_AXES):
        r = np.cumsum(r, axis=axis, dtype=np.int32)
    return r.astype(np.int16)


def _attr_json(value: Any) -> Any:
    """An attribute as JSON: numpy scalars and arrays keep their dtype (``scale_factor`` float64, ``_FillValue``
    int16: CF decoding reads them), other values as they are."""
    if isinstance(value, (np.generic, np.ndarray)):
        return {"dtype": value.dtype.str, "value": np.asarray(value).tolist()}
    return value


def _attr_value(doc: Any) -> Any:
    """Inverse of :func:`_attr_json`."""
    if isinstance(doc, dict):
        value = np.asarray(doc["value"], dtype=np.dtype(doc["dtype"]))
        return value[()] if value.ndim == 0 else value
    return doc


def pack_gcm(out: Path, src: Path, until: str | None) -> float:
    """Write the pack of ``src`` (through ``until``, a time label) to ``out``, an ``.npz`` of plain arrays (the
    Lorenzo payloads as uint8) with the layout and attributes as JSON text; returns its size in MB."""
    import xarray as xr

    ds = xr.open_dataset(src, mask_and_scale=False)
    if until:
        ds = ds.sel(time=slice(None, until))
    missing = [v for v in PACKED + CONSTANTS if v not in ds]
    if missing:
        raise ValueError(f"{src}: no variables {missing}; expected a gcm_5.625deg_yearN.nc GCM-world file")
    layout: dict[str, Any] = {"format": PACK_FORMAT, "attrs": dict(ds.attrs), "coords": {}, "vars": {}}
    arrays: dict[str, np.ndarray] = {}
    for k in COORDS:
        layout["coords"][k] = {"dims": list(ds[k].dims), "attrs": {a: _attr_json(v) for a, v in ds[k].attrs.items()}}
        arrays[f"coord/{k}"] = ds[k].values
    for v in PACKED + CONSTANTS:
        raw = ds[v].values
        kind = "lorenzo" if v in PACKED else "raw"
        if kind == "lorenzo" and (ds[v].dims != COORDS or raw.dtype != np.int16):
            raise ValueError(f"{src}: {v} is {raw.dtype} {ds[v].dims}; expected int16 {COORDS} as stored")
        if kind == "lorenzo":
            payload = encode(raw)
            if not np.array_equal(decode(payload, raw.shape), raw):
                raise AssertionError(f"{src}: {v} does not round-trip")
            arrays[f"var/{v}"] = np.frombuffer(payload, np.uint8)
        else:
            arrays[f"var/{v}"] = raw
        layout["vars"][v] = {"kind": kind, "dims": list(ds[v].dims), "shape": list(raw.shape),
                             "attrs": {a: _attr_json(x) for a, x in ds[v].attrs.items()}}
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "wb") as f:  # a file object: np.savez would append ".npz" to the name
        np.savez(f, layout=np.array(json.dumps(layout)), **arrays)
    return out.stat().st_size / 1e6


def unpack_gcm(pack: Path, out: Path) -> dict[str, int]:
    """Rebuild the netCDF file of ``pack`` at ``out`` (CF-packed int16 as the source); returns its sizes. The pack
    is read as data (``allow_pickle=False``, JSON): nothing in it runs."""
    import xarray as xr

    with np.load(pack, allow_pickle=False) as z:
        layout = json.loads(str(z["layout"]))
        if layout.get("format") != PACK_FORMAT:
            raise ValueError(f"{pack}: not a {PACK_FORMAT} file; make it with `python -m benchmarks.gpu_pack gcm`")
        coords = {k: xr.Variable(c["dims"], z[f"coord/{k}"], {a: _attr_value(v) for a, v in c["attrs"].items()})
                  for k, c in layout["coords"].items()}
        data = {}
        for name, v in layout["vars"].items():
            values = z[f"var/{name}"]
            if v["kind"] == "lorenzo":
                values = decode(values.tobytes(), tuple(v["shape"]))
            data[name] = xr.Variable(v["dims"], values, {a: _attr_value(x) for a, x in v["attrs"].items()})
    ds = xr.decode_cf(xr.Dataset(data, coords=coords, attrs=layout["attrs"]))
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp.nc")
    try:  # h5netcdf where h5py is installed (the GPU image), else netCDF4
        import h5py  # noqa: F401
        engine = "h5netcdf"
    except ImportError:
        engine = "netcdf4"
    ds.to_netcdf(tmp, engine=engine)
    tmp.replace(out)
    return dict(ds.sizes)


def strip_debug(data: bytes) -> bytes:
    """An ELF shared library without its debug sections (``strip --strip-debug``: code and symbols kept), or as it
    is where binutils' ``strip`` is missing. The wheels' libraries carry DWARF data: numcodecs' blosc and zstd are
    14 and 11 MB with it; the whole site packs to ~2 MB instead of ~7.2 MB."""
    tool = shutil.which("strip")
    if tool is None or not data.startswith(b"\x7fELF"):
        return data
    with tempfile.TemporaryDirectory() as tmp:
        lib = Path(tmp) / "lib.so"
        lib.write_bytes(data)
        done = subprocess.run([tool, "--strip-debug", str(lib)], capture_output=True)
        # a strip that is not binutils' (macOS) refuses the option: the library stays as it was, only larger
        return lib.read_bytes() if done.returncode == 0 else data


def pack_site(out: Path, wheels: list[Path]) -> float:
    """Unzip ``wheels`` into one tree (dropping test folders, libraries stripped of debug data by
    :func:`strip_debug`) and write it xz-compressed to ``out`` (MB)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(out, "w:xz", preset=XZ) as tar:
        for wheel in sorted(wheels):
            with zipfile.ZipFile(wheel) as z:
                for info in z.infolist():
                    parts = Path(info.filename).parts
                    if info.is_dir() or "tests" in parts[1:] or parts[0].endswith(".data"):
                        continue
                    data = z.read(info)
                    library = ".so" in Path(info.filename).suffixes
                    if library:
                        data = strip_debug(data)
                    member = tarfile.TarInfo(info.filename)
                    member.size, member.mode = len(data), 0o755 if library else 0o644
                    tar.addfile(member, io.BytesIO(data))
    return out.stat().st_size / 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="verb", required=True)
    g = sub.add_parser("gcm", help="pack one GCM-world year")
    g.add_argument("out", type=Path)
    g.add_argument("src", type=Path)
    g.add_argument("--until", default=None, help="last time label to keep, e.g. 2002-08-31T18")
    u = sub.add_parser("unpack", help="rebuild a GCM-world netCDF from its pack")
    u.add_argument("pack", type=Path)
    u.add_argument("out", type=Path)
    s = sub.add_parser("site", help="wheels → one xz-compressed tree")
    s.add_argument("out", type=Path)
    s.add_argument("wheels", type=Path, nargs="+")
    args = parser.parse_args()
    if args.verb == "gcm":
        if not args.src.is_file():
            parser.error(f"gcm: {args.src} does not exist (the GCM world is in ../shared/data/gcm_world)")
        print(f"{args.out}: {pack_gcm(args.out, args.src, args.until):.2f} MB")
    elif args.verb == "unpack":
        if not args.pack.is_file():
            parser.error(f"unpack: {args.pack} does not exist; make it here with `python -m benchmarks.gpu_pack gcm` "
                         "and carry .gpu")
        print(f"{args.out}: {unpack_gcm(args.pack, args.out)}")
    else:
        print(f"{args.out}: {pack_site(args.out, args.wheels):.2f} MB")


if __name__ == "__main__":
    main()
